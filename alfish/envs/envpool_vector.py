"""EnvPool (``pip install envpool``) as a vector backend: ``create_environment.vectorization = 'envpool'``.

EnvPool steps a batch of envs in C++ threads, without a Python process per env; for Atari it is the fastest way to
feed a learner on a CPU. ``EnvpoolVectorEnv`` gives ``BatchedEnv`` the part of gymnasium's ``VectorEnv`` interface
it uses, so everything downstream (time steps, replay, transformers) is the same as with ``'sync'``/``'async'``:
  - EnvPool's autoreset is gymnasium's next-step autoreset (the step after a LAST returns the reset observation and
    ignores its action), the convention ``BatchedEnv`` expects;
  - ``ALE/<Game>-v5`` names get the same protocol as ``make_atari`` (sticky actions 0.25, frame skip 4, up to 30
    no-ops, 84x84 grey frames ``(1, 84, 84)`` uint8, whole games, no FIRE reset, no reward clipping, 27,000-step cap),
    its keyword names translated to EnvPool's; other names are passed to ``envpool.make_gymnasium`` as they are;
  - env ``i`` is seeded ``seed + i``; EnvPool fixes seeds when the pool is made, so a reset with other seeds makes a
    new pool (evaluations do that once each).
EnvPool's own frame processing (resize with INTER_AREA, its max-pooling) is not bit-identical to gymnasium's
``AtariPreprocessing``: a policy trained on one sees slightly different pixels on the other.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import gymnasium as gym
import numpy as np

from alfish.envs.atari import ATARI_PREFIX
from alfish.errors import OneLineValueError

MISSING = "vectorization='envpool' needs EnvPool: pip install envpool"
# make_atari's keyword -> EnvPool's (None: computed below)
_ATARI_KEYWORDS = {"repeat_action_probability": "repeat_action_probability", "frame_skip": "frame_skip",
                   "noop_max": "noop_max", "terminal_on_life_loss": "episodic_life",
                   "full_action_space": "full_action_space", "max_episode_steps": "max_episode_steps",
                   "screen_size": None}
_ATARI_DEFAULTS = dict(repeat_action_probability=0.25, frame_skip=4, noop_max=30, episodic_life=False,
                       full_action_space=False, max_episode_steps=27_000, img_height=84, img_width=84,
                       stack_num=1, gray_scale=True, reward_clip=False, use_fire_reset=False,
                       zero_discount_on_life_loss=False)


class EnvpoolMissingError(OneLineValueError, ImportError):
    """EnvPool is not installed."""


def envpool_task(env_name: str, env_kwargs: Optional[dict]) -> tuple[str, dict]:
    """EnvPool's task id and keywords for ``env_name`` with alfish's ``env_kwargs``."""
    kwargs = dict(env_kwargs or {})
    if not env_name.startswith(ATARI_PREFIX):
        return env_name, kwargs
    options = dict(_ATARI_DEFAULTS)
    for name, value in kwargs.items():
        if name not in _ATARI_KEYWORDS:
            raise ValueError(f"env_kwargs '{name}' is not an Atari setting alfish passes to EnvPool; use one of "
                             f"{sorted(_ATARI_KEYWORDS)}, or vectorization='sync'/'async' for other ale-py keywords")
        if name == "screen_size":
            options["img_height"] = options["img_width"] = int(value)
        elif name == "max_episode_steps" and value is None:
            options["max_episode_steps"] = 10 ** 9
        else:
            options[_ATARI_KEYWORDS[name]] = value
    return env_name[len(ATARI_PREFIX):], options


class EnvpoolVectorEnv:
    """``num_envs`` envs of one EnvPool pool, with the ``VectorEnv`` methods ``BatchedEnv`` calls."""

    def __init__(self, env_name: str, num_envs: int, seed: int, env_kwargs: Optional[dict] = None):
        try:
            import envpool
        except ImportError:
            raise EnvpoolMissingError(MISSING) from None
        self._envpool = envpool
        self.num_envs = num_envs
        self._task, self._options = envpool_task(env_name, env_kwargs)
        self._seeds: list[int] = []
        self._pool: Any = None
        self._make([seed + i for i in range(num_envs)])
        self.single_observation_space = self._pool.observation_space
        self.single_action_space = self._pool.action_space
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)

    def _make(self, seeds: Sequence[int]) -> None:
        if self._pool is not None:
            self._pool.close()
        try:
            self._pool = self._envpool.make_gymnasium(self._task, num_envs=self.num_envs, env_seed=list(seeds),
                                                      **self._options)
        except (ValueError, KeyError, TypeError, RuntimeError) as err:
            raise ValueError(f"EnvPool cannot make '{self._task}' with {self._options}: {err}") from None
        self._seeds = list(seeds)

    def reset(self, seed: Optional[Sequence[int]] = None) -> tuple[Any, dict]:
        if seed is not None and list(seed) != self._seeds:
            self._make(seed)
        return self._pool.reset()

    def step(self, actions: np.ndarray) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        return self._pool.step(actions)

    def render(self) -> Any:
        raise ValueError("vectorization='envpool' does not render; play and record with vectorization='sync'")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
