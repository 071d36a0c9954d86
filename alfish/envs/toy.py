"""Tiny deterministic environments with a known optimal return, for learning tests and quick checks.

They are registered as gymnasium ids ``alfish/PointGoal-v0`` (continuous), ``alfish/Chain-v0`` (discrete) and
``alfish/MemoryCue-v0`` (discrete, needs memory: a recurrent policy) with its continuous-action variant
``alfish/MemoryCueContinuous-v0``, and ``alfish/MatchSubActions-v0`` (MultiDiscrete) with its MultiBinary variant
``alfish/MatchBits-v0``; ``alfish/MatchChoiceAndValue-v0`` (a mixed action: Discrete and Box, ``mixed_toy.py``).
"""
from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class PointGoal(gym.Env):
    """A point on a line starting at x=0.8 must reach 0 and stay there.

    Action ``a`` in [-1, 1] moves ``x += 0.25 * a``; the reward is ``-|x|`` after the move. Episodes are truncated after
    10 steps (a time limit, so bootstrapping matters). Optimal return: -(0.55 + 0.30 + 0.05) = -0.9; a random policy
    gets about -6.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}
    OPTIMAL_RETURN = -0.9

    def __init__(self, render_mode: str | None = None):
        self.observation_space = gym.spaces.Box(-2.0, 2.0, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.render_mode = render_mode
        self._x = 0.8

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._x = 0.8
        return np.array([self._x], dtype=np.float32), {}

    def step(self, action: Any):
        a = float(np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[0], -1.0, 1.0))
        self._x = float(np.clip(self._x + 0.25 * a, -2.0, 2.0))
        return np.array([self._x], dtype=np.float32), -abs(self._x), False, False, {}

    def render(self) -> np.ndarray:
        frame = np.full((32, 64, 3), 255, dtype=np.uint8)
        col = int(np.clip((self._x + 2.0) / 4.0 * 63, 0, 63))
        frame[:, 31, :] = 0  # the goal
        frame[8:24, col, :] = (200, 0, 0)
        return frame


class Chain(gym.Env):
    """Five cells in a row; start in cell 0, the goal is cell 4. Actions: 0 = left, 1 = right.

    Reward -0.1 per step, +1 on reaching the goal (which terminates). Truncated after 10 steps.
    Observation: one-hot cell. Optimal return: 3 * -0.1 + 1 = 0.7; a random policy averages below 0.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}
    OPTIMAL_RETURN = 0.7
    N = 5

    def __init__(self, render_mode: str | None = None):
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(self.N,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.render_mode = render_mode
        self._pos = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.N, dtype=np.float32)
        obs[self._pos] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._pos = 0
        return self._obs(), {}

    def step(self, action: Any):
        self._pos = int(np.clip(self._pos + (1 if int(action) == 1 else -1), 0, self.N - 1))
        at_goal = self._pos == self.N - 1
        return self._obs(), (1.0 if at_goal else -0.1), at_goal, False, {}

    def render(self) -> np.ndarray:
        frame = np.full((16, 16 * self.N, 3), 255, dtype=np.uint8)
        frame[:, 16 * (self.N - 1):, 1] = 180
        frame[4:12, 16 * self._pos + 4:16 * self._pos + 12, :] = (200, 0, 0)
        return frame


class MemoryCue(gym.Env):
    """Remember a cue: the first observation shows a cue (+1 or -1, drawn at random), then ``delay`` blank steps
    follow, then a query; the action taken at the query must match the cue (action 1 for +1, 0 for -1).

    Observation ``[cue, query]``: ``[+-1, 0]`` at the first step, ``[0, 0]`` at the blank steps, ``[0, 1]`` at the
    query. Actions before the query are ignored (reward 0). At the query: reward +1 if right, -1 if wrong, and the
    episode terminates (``delay + 2`` actions in all). Optimal return 1; any memoryless policy sees the same query
    observation whatever the cue, so it averages 0.

    ``continuous=True`` (``alfish/MemoryCueContinuous-v0``): the action is a Box(-1, 1, (1,)) and the query's reward is
    ``cue * clip(action, -1, 1)``, graded rather than +-1, so that a critic has a slope to follow: optimum 1 (the
    action at the cue's sign, at the bound), and still 0 on average for any memoryless policy (its query action does
    not depend on the cue, which is +-1 with equal odds).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}
    OPTIMAL_RETURN = 1.0

    def __init__(self, delay: int = 4, render_mode: str | None = None, continuous: bool = False):
        if delay < 0:
            raise ValueError(f"MemoryCue delay={delay} must be >= 0")
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.continuous = continuous
        self.action_space = (gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32) if continuous else
                             gym.spaces.Discrete(2))
        self.render_mode = render_mode
        self.delay = delay
        self._cue, self._t = 1, 0

    def _obs(self) -> np.ndarray:
        if self._t == 0:
            return np.array([self._cue, 0.0], dtype=np.float32)
        return np.array([0.0, 1.0 if self._t == self.delay + 1 else 0.0], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._cue, self._t = (1 if self.np_random.integers(2) else -1), 0
        return self._obs(), {}

    def step(self, action: Any):
        if self._t == self.delay + 1:  # the query
            if self.continuous:
                answer = float(np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[0], -1.0, 1.0))
                return self._obs(), self._cue * answer, True, False, {}
            right = (int(np.asarray(action).reshape(-1)[0]) == 1) == (self._cue == 1)
            return self._obs(), (1.0 if right else -1.0), True, False, {}
        self._t += 1
        return self._obs(), 0.0, False, False, {}

    def render(self) -> np.ndarray:
        frame = np.full((16, 16, 3), 255, dtype=np.uint8)
        if self._t == 0:
            frame[4:12, 4:12, :] = (0, 160, 0) if self._cue == 1 else (200, 0, 0)
        elif self._t == self.delay + 1:
            frame[4:12, 4:12, :] = 0
        return frame


class MatchSubActions(gym.Env):
    """Several choices per step: the observation shows the right sub-action of each dimension, the reward is the
    fraction of dimensions answered right, and the episode ends after that one step (a contextual bandit).

    MultiDiscrete(``nvec``) (default ``(3, 2, 4)``, uneven on purpose): the observation is the concatenation of one
    one-hot of the target per dimension (``sum(nvec)`` floats). ``binary=True`` (``alfish/MatchBits-v0``):
    MultiBinary(``len(nvec)``) and the observation is the target bits themselves (``nvec`` is then only read for its
    length). Targets are drawn uniformly at each reset. Optimal return 1; a uniformly random policy averages
    ``mean(1 / n_i)`` (0.36 for ``(3, 2, 4)``, 0.5 for bits).
    """

    metadata = {"render_modes": []}
    OPTIMAL_RETURN = 1.0

    def __init__(self, nvec: tuple[int, ...] = (3, 2, 4), binary: bool = False, render_mode: str | None = None):
        self.nvec = np.asarray((2,) * len(nvec) if binary else nvec, dtype=np.int64)
        self.binary = binary
        self.action_space = (gym.spaces.MultiBinary(len(nvec)) if binary else gym.spaces.MultiDiscrete(self.nvec))
        size = len(nvec) if binary else int(self.nvec.sum())
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(size,), dtype=np.float32)
        self.render_mode = render_mode
        self._target = np.zeros(len(nvec), dtype=np.int64)

    def _obs(self) -> np.ndarray:
        if self.binary:
            return self._target.astype(np.float32)
        obs = np.zeros(self.observation_space.shape, dtype=np.float32)
        obs[np.concatenate([[0], np.cumsum(self.nvec)[:-1]]) + self._target] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._target = self.np_random.integers(self.nvec)
        return self._obs(), {}

    def step(self, action: Any):
        right = np.asarray(action).reshape(-1).astype(np.int64) == self._target
        return self._obs(), float(right.mean()), True, False, {}


def register_toy_envs() -> None:
    """Register the toy envs with gymnasium (idempotent)."""
    for env_id, entry, kwargs in (("alfish/PointGoal-v0", PointGoal, {}), ("alfish/Chain-v0", Chain, {}),
                                  ("alfish/MemoryCue-v0", MemoryCue, {}),
                                  ("alfish/MemoryCueContinuous-v0", MemoryCue, {"continuous": True}),
                                  ("alfish/MatchSubActions-v0", MatchSubActions, {}),
                                  ("alfish/MatchBits-v0", MatchSubActions, {"binary": True})):
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry, max_episode_steps=10, kwargs=kwargs)


register_toy_envs()

import alfish.envs.bit_flipping  # noqa: E402,F401  (registers alfish/BitFlipping-v0 with the other toys)
import alfish.envs.latency  # noqa: E402,F401  (registers alfish/Latency-v0)
import alfish.envs.masked  # noqa: E402,F401  (registers alfish/CartPoleNoVelocity-v1)
import alfish.envs.mixed_toy  # noqa: E402,F401  (registers alfish/MatchChoiceAndValue-v0 and its Dict variant)
import alfish.envs.pixel  # noqa: E402,F401  (registers alfish/PixelCorridor-v0 and alfish/DictCorridor-v0)
