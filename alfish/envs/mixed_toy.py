"""A toy env with a mixed action (one Discrete and one Box part) and a known optimum, for learning tests.

Registered as ``alfish/MatchChoiceAndValue-v0`` (a ``Tuple((Discrete(k), Box(-1, 1, (1,))))`` action) and
``alfish/MatchChoiceAndValueDict-v0`` (the same as a ``Dict({'choice': Discrete(k), 'value': Box})``).
"""
from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class MatchChoiceAndValue(gym.Env):
    """Each step shows a target: a class out of ``k`` (one-hot) and a value in [-1, 1]; the action answers both.

    Observation: float32 ``[k + 1]``, the one-hot class then the value. Action: ``(choice, value)``, a Discrete(k) and
    a Box(-1, 1, (1,)) (as a Tuple, or a Dict with keys ``'choice'`` and ``'value'`` when ``dict_actions``). Reward:
    ``1`` if the choice is the class, minus ``|value - target value|`` (so at most 1 a step, reached only by answering
    both exactly). A new target is drawn after every step (the targets do not depend on the actions: a contextual
    bandit); the episode terminates after ``episode_steps`` steps. Optimal return: ``episode_steps`` (3 by default);
    a uniformly random policy averages ``episode_steps * (1/k - 2/3)`` (-1.0 for k = 3: E|U - V| = 2/3 for two
    independent uniforms on [-1, 1]).
    """

    metadata = {"render_modes": []}
    OPTIMAL_RETURN = 3.0

    def __init__(self, num_choices: int = 3, episode_steps: int = 3, dict_actions: bool = False,
                 render_mode: str | None = None):
        self.num_choices, self.episode_steps = num_choices, episode_steps
        choice, value = gym.spaces.Discrete(num_choices), gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.action_space = (gym.spaces.Dict({"choice": choice, "value": value}) if dict_actions
                             else gym.spaces.Tuple((choice, value)))
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(num_choices + 1,), dtype=np.float32)
        self.render_mode = render_mode
        self._class, self._value, self._t = 0, 0.0, 0

    def _draw(self) -> np.ndarray:
        self._class = int(self.np_random.integers(self.num_choices))
        self._value = float(self.np_random.uniform(-1.0, 1.0))
        obs = np.zeros(self.num_choices + 1, dtype=np.float32)
        obs[self._class], obs[-1] = 1.0, self._value
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._t = 0
        return self._draw(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        choice, value = (action["choice"], action["value"]) if isinstance(action, dict) else action
        value = float(np.clip(np.asarray(value, dtype=np.float64).reshape(-1)[0], -1.0, 1.0))
        reward = float(int(choice) == self._class) - abs(value - self._value)
        self._t += 1
        return self._draw(), reward, self._t >= self.episode_steps, False, {}


for _env_id, _kwargs in (("alfish/MatchChoiceAndValue-v0", {}),
                         ("alfish/MatchChoiceAndValueDict-v0", {"dict_actions": True})):
    if _env_id not in gym.registry:
        gym.register(id=_env_id, entry_point=MatchChoiceAndValue, max_episode_steps=10, kwargs=_kwargs)
