"""Putting an env back where it was without pickling it (exact resume, DESIGN.md §3.12): how each episode began is
recorded, and the current episode's actions are kept, so the env can be re-created, started the same way and
stepped through the same actions.

How an episode begins: a reset with a seed (alfish's reset of the batch: env ``i`` gets ``seed + i``) is recorded as
that seed; a reset without one (gymnasium's autoreset) draws the new episode from the env's RNG as the previous
episode left it, so the state of that RNG (``env.unwrapped.np_random``'s bit generator) is recorded just before the
reset. The env's random streams are exactly what they would be without this wrapper.

``resume_state()`` (read through the vector env's ``call``, in its workers too) returns how the episode began, its
actions so far, its last observation and whether it has just ended. ``reset(seed=i, options={RESTORE: states})``
puts env ``i`` back: started as recorded (seeded, or its RNG set to the recorded state and reset), the actions
replayed, the last observation compared with the stored one (``restored_exactly()`` says whether it matched: an env
whose episodes draw from anything else than its ``np_random`` does not). An env restored right after its episode
ended resets itself at its next ``step`` (ignoring the action), as the vector env's next-step autoreset would have.
"""
from __future__ import annotations

import copy
from typing import Any, Optional

import gymnasium as gym
import numpy as np

#: The reset option that carries the states to restore, ``{env index: resume_state()}``.
RESTORE = "alfish_restore"
#: An episode longer than this many steps stops being logged (bounded memory for envs without a time limit): it
#: cannot be restored exactly, and a resume in its middle says so.
MAX_LOGGED_ACTIONS = 200_000


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return np.array_equal(np.asarray(a), np.asarray(b))


class EpisodeLog(gym.Wrapper):
    """Records how each episode began and logs its actions (module docstring)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.start: Optional[dict] = None  # {"seed": s} or {"rng": bit generator state}; None: not restorable
        self.actions: list[np.ndarray] = []
        self.last_observation: Any = None
        self.ended = False
        self.pending_reset = False
        self.matched = True

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[Any, dict]:
        if options and RESTORE in options:
            return self._restore(options[RESTORE][seed])
        self.start = {"seed": int(seed)} if seed is not None else self._rng_state()
        result = self.env.reset(seed=seed, options=options)
        self.actions, self.ended, self.pending_reset = [], False, False
        self.last_observation = result[0] if isinstance(result, tuple) else result
        return result

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
        if self.pending_reset:  # restored just after its episode ended: the autoreset the vector env would have done
            observation, info = self.reset()
            return observation, 0.0, False, False, info
        result = self.env.step(action)
        if len(self.actions) < MAX_LOGGED_ACTIONS:
            self.actions.append(np.array(action, copy=True))
        else:
            self.start = None  # too long to replay: this episode is not restorable
        if isinstance(result, tuple) and len(result) == 5:  # (the contract check outside names anything else)
            self.last_observation, self.ended = result[0], bool(result[2] or result[3])
        return result

    def resume_state(self) -> dict:
        """What ``reset(options={RESTORE: ...})`` needs to put this env back (numpy arrays, ints, strings)."""
        actions = np.stack(self.actions) if self.actions else np.zeros((0,) + np.shape(self.env.action_space.sample()))
        return dict(start=self.start, actions=actions, last_observation=self.last_observation, ended=self.ended)

    def restored_exactly(self) -> bool:
        """Whether the last restore reproduced the stored last observation."""
        return self.matched

    def _rng_state(self) -> Optional[dict]:
        generator = getattr(self.env.unwrapped, "_np_random", None)
        return {"rng": copy.deepcopy(generator.bit_generator.state)} if generator is not None else None

    def _restore(self, state: dict) -> tuple[Any, dict]:
        start = state["start"]
        if start is None:  # not restorable (see MAX_LOGGED_ACTIONS); reset anyhow so the env is usable
            observation, info = self.env.reset()
        elif "seed" in start:
            observation, info = self.env.reset(seed=int(start["seed"]))
        else:
            self.env.reset(seed=0)  # (np_random exists from here on)
            self.env.unwrapped.np_random.bit_generator.state = copy.deepcopy(start["rng"])
            observation, info = self.env.reset()
        actions = list(np.asarray(state["actions"]))
        for action in actions:
            observation, _, _, _, info = self.env.step(action)
        self.start, self.actions, self.last_observation = start, actions, observation
        self.ended = self.pending_reset = bool(state["ended"])
        self.matched = start is not None and _same(observation, state["last_observation"])
        return observation, info
