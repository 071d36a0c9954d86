"""Envs that break one part of their contract each, for tests/envs/test_env_contract.py and test_env_workers.py.

Registered on import; env workers (forkserver children) import this module through the ``module:EnvId`` form of the
id, e.g. ``f"{misbehaving_envs.__name__}:alfish-test/Scripted-v0"`` (``ids`` below builds them).
"""
from __future__ import annotations

import os
import signal
import time
from typing import Any, Optional

import gymnasium as gym
import numpy as np

BOX3 = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
TWO = gym.spaces.Discrete(2)
_GOOD = object()  # "return a valid value"


class Scripted(gym.Env):
    """Returns from ``reset()`` and ``step()`` what its arguments say; by default a valid float32 ``[3]``
    observation, reward 0 and not done, so each test breaks exactly one thing.

    The ``*_obs`` arguments are observations (or the sentinel default); ``reset_result``/``step_result`` replace the
    whole return value; ``bad_from_step``: the step number (from 1) from which ``step_obs``/``reward``/``terminated``
    are returned, valid values before it (to break the contract after the first, fully checked, step).
    """

    metadata = {"render_modes": []}

    def __init__(self, observation_space: gym.Space = BOX3, action_space: gym.Space = TWO,
                 reset_obs: Any = _GOOD, step_obs: Any = _GOOD, reward: Any = 0.0, terminated: Any = False,
                 truncated: Any = False, reset_result: Any = _GOOD, step_result: Any = _GOOD, bad_from_step: int = 1,
                 render_mode: Optional[str] = None):
        self.observation_space, self.action_space = observation_space, action_space
        self.render_mode = render_mode
        self._reset_obs, self._step_obs, self._reward = reset_obs, step_obs, reward
        self._terminated, self._truncated = terminated, truncated
        self._reset_result, self._step_result, self._bad_from = reset_result, step_result, bad_from_step
        self._steps = 0

    def _valid_obs(self) -> Any:
        space = self.observation_space
        if isinstance(space, gym.spaces.Dict):
            return {key: np.zeros(leaf.shape, leaf.dtype) for key, leaf in space.spaces.items()}
        return np.zeros(space.shape, space.dtype)

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> Any:
        super().reset(seed=seed)
        self._steps = 0
        if self._reset_result is not _GOOD:
            return self._reset_result
        return (self._valid_obs() if self._reset_obs is _GOOD else self._reset_obs), {}

    def step(self, action: Any) -> Any:
        self._steps += 1
        if self._step_result is not _GOOD:
            return self._step_result
        if self._steps < self._bad_from:
            return self._valid_obs(), 0.0, False, False, {}
        obs = self._valid_obs() if self._step_obs is _GOOD else self._step_obs
        return obs, self._reward, self._terminated, self._truncated, {}


class Faulty(gym.Env):
    """A valid env until step number ``at_step`` (from 1; 0: never) or its ``reset`` number ``at_reset`` (from 1),
    where it does ``fault``: 'hang' (sleeps in ``hang_here_forever``), 'raise' (ZeroDivisionError in ``divide``),
    'segfault' (reads address 0) or 'exit' (``os._exit(3)``)."""

    metadata = {"render_modes": []}
    observation_space = BOX3
    action_space = TWO

    def __init__(self, fault: str = "hang", at_step: int = 0, at_reset: int = 0, render_mode: Optional[str] = None):
        self.fault, self.at_step, self.at_reset, self.render_mode = fault, at_step, at_reset, render_mode
        self._steps = self._resets = 0

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> Any:
        super().reset(seed=seed)
        self._resets += 1
        if self._resets == self.at_reset:
            self._fail()
        return np.zeros(3, np.float32), {}

    def step(self, action: Any) -> Any:
        self._steps += 1
        if self._steps == self.at_step:
            self._fail()
        return np.zeros(3, np.float32), 1.0, False, False, {}

    def _fail(self) -> None:
        if self.fault == "hang":
            hang_here_forever()
        elif self.fault == "raise":
            divide(1, 0)
        elif self.fault == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)  # as a crash in C code would (faulthandler prints the stack)
        elif self.fault == "exit":
            os._exit(3)
        raise AssertionError(f"unknown fault {self.fault!r}")


def hang_here_forever() -> None:
    while True:
        time.sleep(0.05)


def divide(a: float, b: float) -> float:
    return a / b


def ids(name: str) -> str:
    """The ``module:EnvId`` form of an id registered here, which env workers can import."""
    return f"{__name__}:{name}"


for _id, _entry in (("alfish-test/Scripted-v0", Scripted), ("alfish-test/Faulty-v0", Faulty)):
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_entry)
