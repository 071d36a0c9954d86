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

The states come from a checkpoint, i.e. from a results directory (untrusted, DESIGN.md §3.13). A state whose action
log is damaged (more actions than ``MAX_LOGGED_ACTIONS``, a broadcast (stride-0) or non-contiguous array, an action
or observation of another shape than the env's spaces) is not replayed: that env restarts, as one whose episode was
too long to log (``check_resume_states`` says which, in one warning). The replay re-arms the in-process hang guard
after each step (``RESTORE_HEARTBEAT``: each step may take ``step_timeout_s``, not the whole replay) and gives up,
inexactly, when a stop signal is pending (``alfish.console.signals.stop_pending``).
"""
from __future__ import annotations

import copy
import logging
from typing import Any, Callable, Optional

import gymnasium as gym
import numpy as np

from alfish.console.signals import stop_pending

#: The reset option that carries the states to restore, ``{env index: resume_state()}``.
RESTORE = "alfish_restore"
#: An episode longer than this many steps stops being logged (bounded memory for envs without a time limit): it
#: cannot be restored exactly, and a resume in its middle says so.
MAX_LOGGED_ACTIONS = 200_000
#: The reset option (in-process envs only) that carries a callable to call after each replayed step.
RESTORE_HEARTBEAT = "alfish_restore_heartbeat"
_NOT_RESTORABLE = dict(start=None, actions=np.zeros((0,)), last_observation=None, ended=False)


def _broadcast(array: np.ndarray) -> bool:
    """Whether ``array`` repeats memory along a dimension (a stride-0 view: it claims more elements than it holds). An
    empty array claims none (numpy gives ``zeros((0, 3))`` strides ``(0, 0)``: the log of an episode just begun)."""
    return array.size > 0 and any(stride == 0 and size > 1 for stride, size in zip(array.strides, array.shape))


def action_log_problem(state: Any, max_actions: int = MAX_LOGGED_ACTIONS) -> Optional[str]:
    """What is wrong with a ``resume_state()`` read back from a checkpoint (None: nothing). Only the cheap facts:
    the number of actions, the actions' layout and dtype, broadcast arrays; shapes are checked by the env itself."""
    if not isinstance(state, dict) or not {"start", "actions", "last_observation", "ended"} <= state.keys():
        return "not a recorded env state"
    actions = state["actions"]
    if not isinstance(actions, np.ndarray) or actions.ndim < 1 or actions.dtype.kind not in "biuf":
        return "its actions are not a numeric array of at least one dimension"
    if len(actions) > max_actions:
        return f"it claims {len(actions)} actions, more than the {max_actions} an episode log may hold"
    if not actions.flags.c_contiguous or _broadcast(actions):
        return f"its actions array is not contiguous (strides {list(actions.strides)} for shape {list(actions.shape)})"
    leaves = state["last_observation"].values() if isinstance(state["last_observation"], dict) else [
        state["last_observation"]]
    if any(isinstance(leaf, np.ndarray) and _broadcast(leaf) for leaf in leaves):
        return "its last observation is a broadcast (stride-0) array"
    return None


def check_resume_states(states: list, env_name: str, max_actions: int = MAX_LOGGED_ACTIONS) -> list:
    """``states`` with each damaged one (``action_log_problem``) replaced by a state that is not restorable (that env
    restarts, and the restore says it was not exact); one warning names the envs and the first problem."""
    problems = {i: p for i, p in enumerate(action_log_problem(s, max_actions) for s in states) if p is not None}
    if problems:
        first = next(iter(problems))
        logging.warning("exact resume: the recorded episode of env(s) %s of '%s' is damaged (env %d: %s); those envs "
                        "restart instead of replaying it", sorted(problems), env_name, first, problems[first])
    return [dict(_NOT_RESTORABLE) if i in problems else s for i, s in enumerate(states)]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return np.array_equal(np.asarray(a), np.asarray(b))


def _shaped_like(value: Any, space: gym.Space) -> bool:
    """Whether ``value`` has the shape(s) of an observation of ``space`` (a Box or a Dict of Boxes)."""
    if isinstance(space, gym.spaces.Dict):
        return isinstance(value, dict) and value.keys() == space.spaces.keys() and all(
            _shaped_like(value[key], leaf) for key, leaf in space.spaces.items())
    return np.shape(value) == tuple(space.shape or ())


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
            return self._restore(options[RESTORE][seed], options.get(RESTORE_HEARTBEAT) or (lambda: None))
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

    def _restore(self, state: dict, heartbeat: Callable[[], None]) -> tuple[Any, dict]:
        start = state["start"] if self._replayable(state) else None
        if start is None:  # not restorable (see MAX_LOGGED_ACTIONS); reset anyhow so the env is usable
            observation, info = self.env.reset()
        elif "seed" in start:
            observation, info = self.env.reset(seed=int(start["seed"]))
        else:
            self.env.reset(seed=0)  # (np_random exists from here on)
            self.env.unwrapped.np_random.bit_generator.state = copy.deepcopy(start["rng"])
            observation, info = self.env.reset()
        actions = list(state["actions"]) if start is not None else []
        for action in actions:
            if stop_pending():  # a SIGTERM: the run is ending, the rest of the replay would be wasted
                start, actions = None, []
                break
            observation, _, _, _, info = self.env.step(action)
            heartbeat()
        self.start, self.actions, self.last_observation = start, actions, observation
        self.ended = self.pending_reset = bool(state["ended"])
        self.matched = start is not None and _same(observation, state["last_observation"])
        return observation, info

    def _replayable(self, state: dict) -> bool:
        """Whether ``state``'s log may be replayed: ``action_log_problem`` finds nothing, and the actions and the last
        observation have this env's shapes (bounded work and memory whatever the checkpoint claims)."""
        if state.get("start") is None or action_log_problem(state) is not None:
            return False
        action_shape = np.shape(self.env.action_space.sample())
        return state["actions"].shape[1:] == action_shape and _shaped_like(state["last_observation"],
                                                                           self.env.observation_space)
