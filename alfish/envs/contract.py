"""What alfish requires of a gymnasium env, checked where the env's outputs enter alfish.

An env that breaks its own contract (an observation whose shape or dtype its observation_space does not allow, a NaN
reward, a ``terminated`` that is not a bool, an action space alfish cannot drive) would otherwise fail later with a raw
numpy or gymnasium traceback, or not fail at all: gymnasium's batching silently casts a float observation into a uint8
buffer. Each problem here is one ``EnvContractError`` line naming the env, the field, what was expected and what came.

Spaces are checked once, when the batched env is built (``check_spaces``). Outputs are checked by ``ContractCheck``, a
wrapper around each env of the batch (in the env worker under ``vectorization='async'``, so the check sees what the env
returned before gymnasium's shared-memory batching casts it). Every reset and step takes a fast path of a few type,
shape and dtype comparisons (a fraction of a microsecond per env, in place of gymnasium's own ``PassiveEnvChecker``
layer, which ``make`` then leaves out); only when that path fails does the full check run, which either names the
problem or accepts the value (e.g. a float64 observation from a float32 space).

Dtype rule: the observation's dtype must be of the space's kind (float for a float Box, integer for an integer Box,
unsigned for an unsigned one, bool for a bool Box); another width of that kind is cast to the space's dtype by the
batching (numpy's 'same_kind' casting, which gymnasium's batching applies), with ONE warning per env id and pair of
dtypes for the whole batch (float64 from float32 math is common and harmless; the warning says how to silence it, as
gymnasium's env checker does). An integer of a wider type than the space's is cast only when its values fit: a value
out of the space dtype's range is an error (the cast would wrap it), checked on every observation of such an env (the
only dtype whose check costs a pass over the values). An integer observation from a float Box, or a float or signed
one from a uint8 image Box, is an error: it means the space or the env is wrong. Values outside the space's bounds
are not checked: that would cost a pass over every observation, and many envs overshoot their bounds harmlessly.
"""
from __future__ import annotations

import hashlib
import logging
import os
from math import isfinite
from typing import Any, Optional

import gymnasium as gym
import numpy as np

from alfish.envs.mixed_actions import MIXED_ACTION_SPACES, SUPPORTED_MIXED, mixed_parts
from alfish.errors import OneLineValueError

# Reward and flag types that pass without a closer look (the types real envs return); others go to the full check.
_PLAIN_REWARD_TYPES = frozenset({float, int, np.float64, np.float32, np.int64, np.int32})
_BOOL_TYPES = frozenset({bool, np.bool_})
_STEP_FIELDS = "(observation, reward, terminated, truncated, info)"
_MAX_REPR = 40


class EnvContractError(OneLineValueError):
    """An env returned something its spaces do not allow, or has a space alfish cannot drive. One line."""


# ---------------------------------------------------------------------------------------------------------------------
# Spaces


def check_spaces(env_name: str, observation_space: gym.Space, action_space: gym.Space) -> None:
    """``EnvContractError`` unless the observation space is a Box or a Dict of Boxes and the action space a Box of
    floats with finite bounds (actions are scaled into them), a Discrete starting at 0, or a one-dimensional
    MultiDiscrete (starting at 0) or MultiBinary, or a mixed action (``alfish.envs.mixed_actions``) of such a Discrete
    and such a Box."""
    space = observation_space
    leaves = list(space.spaces.values()) if isinstance(space, gym.spaces.Dict) else [space]
    if not all(isinstance(leaf, gym.spaces.Box) for leaf in leaves):
        raise EnvContractError(f"env '{env_name}' has observation space {space}; alfish supports Box observations and "
                               "Dicts of Boxes (wrap the env, e.g. gymnasium.wrappers.FlattenObservation)")
    if isinstance(action_space, MIXED_ACTION_SPACES):
        _check_mixed_action_space(env_name, observation_space, action_space)
        return
    action = action_space
    if isinstance(action, gym.spaces.Discrete):
        if int(action.start) != 0:
            raise EnvContractError(f"env '{env_name}' has action space {action}; alfish's discrete actions are "
                                   f"0..n-1: give the env's action_space start=0 (a gymnasium.ActionWrapper that adds "
                                   f"{int(action.start)} to the action does it)")
    elif isinstance(action, gym.spaces.Box):
        if not np.issubdtype(action.dtype, np.floating):
            raise EnvContractError(f"env '{env_name}' has action space {action} of dtype {action.dtype}; alfish drives "
                                   "Box actions as floats: give the env a float Box (or a Discrete for a few choices)")
        if not (np.isfinite(action.low).all() and np.isfinite(action.high).all()):
            raise EnvContractError(f"env '{env_name}' has action space {action} with infinite bounds; alfish scales "
                                   "continuous actions into the bounds, so they must be finite: give the env's "
                                   "action_space the finite low/high its actions really have (a "
                                   "gymnasium.ActionWrapper can; gymnasium.wrappers.RescaleAction and ClipAction keep "
                                   "infinite bounds)")
    elif isinstance(action, (gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        _check_multi_action_space(env_name, action)
    else:
        raise _unsupported_action_space(env_name, action)


def _unsupported_action_space(env_name: str, action: gym.Space) -> EnvContractError:
    """The one line for an action space alfish cannot drive."""
    return EnvContractError(f"env '{env_name}' has action space {one_line(action)}; alfish supports Box, Discrete, "
                            "MultiDiscrete and MultiBinary actions (wrap the env in a gymnasium.ActionWrapper whose "
                            f"action_space is one of them), and mixed ones: {SUPPORTED_MIXED}")


def _check_mixed_action_space(env_name: str, observation_space: gym.Space, action: gym.Space) -> None:
    """A mixed action space (``alfish.envs.mixed_actions``): one Discrete and one Box part, each as a lone one."""
    try:
        discrete_key, box_key = mixed_parts(action)
    except ValueError:
        raise _unsupported_action_space(env_name, action) from None
    for key in (discrete_key, box_key):
        check_spaces(env_name, observation_space, action[key])


def one_line(space: gym.Space) -> str:
    """``str(space)`` on one line (a 2-D MultiDiscrete prints its ``nvec`` over several)."""
    return " ".join(str(space).split())


def _check_multi_action_space(env_name: str, action: gym.Space) -> None:
    """A MultiDiscrete or MultiBinary action space must be one-dimensional (``k`` sub-actions, a ``[B, k]`` action);
    a MultiDiscrete's sub-actions start at 0, as a Discrete's."""
    if len(action.shape) != 1:
        raise EnvContractError(f"env '{env_name}' has action space {one_line(action)} of shape {action.shape}; alfish "
                               f"drives {type(action).__name__} actions as one vector of sub-actions: give it a 1-D "
                               "shape (a gymnasium.ActionWrapper that reshapes the action does it)")
    if isinstance(action, gym.spaces.MultiDiscrete) and np.any(action.start != 0):
        raise EnvContractError(f"env '{env_name}' has action space {one_line(action)} with "
                               f"start={action.start.tolist()}; alfish's discrete sub-actions are 0..n-1: give the "
                               "action_space start=0 (a gymnasium.ActionWrapper that adds the start to the action "
                               "does it)")


# ---------------------------------------------------------------------------------------------------------------------
# Outputs


def _kind(dtype: np.dtype) -> str:
    """The dtype's kind as the contract compares it: 'float', 'integer', 'bool' or 'other'."""
    return {"f": "float", "i": "integer", "u": "integer", "b": "bool"}.get(dtype.kind, "other")


def _castable(dtype: np.dtype, space_dtype: np.dtype) -> bool:
    """Whether an observation of ``dtype`` may stand for one of ``space_dtype`` (module docstring: dtype rule)."""
    return _kind(dtype) == _kind(space_dtype) and np.can_cast(dtype, space_dtype, casting="same_kind")


_ALSO_ACCEPTED = {"f": " (or another float dtype)", "i": " (or another integer dtype)",
                  "u": " (or another unsigned integer dtype)", "b": ""}


#: Set in env worker processes (``alfish.envs.workers``): a folder the workers of one batch share, where the first
#: worker to give a warning leaves a mark, so that the batch gives it once (in-process envs share ``_warned``).
shared_warning_dir: Optional[str] = None
_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    """Log ``message`` as a warning unless this process, or another worker of the batch, gave it already."""
    if key in _warned:
        return
    _warned.add(key)
    if shared_warning_dir is not None:
        mark = os.path.join(shared_warning_dir, "warned-" + hashlib.sha1(key.encode()).hexdigest()[:16])
        try:
            os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            return
        except OSError:
            pass  # no mark: warn anyway
    logging.getLogger(__name__).warning("%s", message)


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_REPR else text[:_MAX_REPR - 3] + "..."


class _BoxContract:
    """The observation contract of one Box (the whole observation, or one key of a Dict)."""

    def __init__(self, env_name: str, space: gym.spaces.Box, what: str, space_name: str) -> None:
        self.env_name, self.space, self.what, self.space_name = env_name, space, what, space_name
        self.shape = tuple(space.shape)
        self.ok_dtypes: tuple[np.dtype, ...] = (space.dtype,)  # grows by the other widths the full check accepted

    def check(self, value: Any, call: str) -> None:
        if type(value) is np.ndarray and value.shape == self.shape and value.dtype in self.ok_dtypes:
            return
        self._full(value, call)

    def _error(self, got: str, expected: str, call: str) -> EnvContractError:
        return EnvContractError(f"env '{self.env_name}' returned {self.what} {got} from {call}, expected {expected} "
                                f"(its {self.space_name} is {self.space}); fix the env's observation_space or its "
                                f"{call}")

    def _full(self, value: Any, call: str) -> None:
        expected_type = f"a numpy array of dtype {self.space.dtype} and shape {list(self.shape)}"
        if isinstance(value, (dict, str, bytes)) or value is None:
            raise self._error(f"of type {type(value).__name__}", expected_type, call)
        try:
            array = np.asarray(value)
        except (ValueError, TypeError):  # ragged nested lists and the like
            raise self._error(f"of type {type(value).__name__}", expected_type, call) from None
        if _kind(array.dtype) == "other":
            raise self._error(f"of type {type(value).__name__} (dtype {array.dtype})", expected_type, call)
        if array.shape != self.shape:
            raise self._error(f"of shape {list(array.shape)}", f"shape {list(self.shape)}", call)
        if not _castable(array.dtype, self.space.dtype):
            also = _ALSO_ACCEPTED.get(self.space.dtype.kind, "")
            raise self._error(f"of dtype {array.dtype}", f"{self.space.dtype}{also}", call)
        if array.dtype == self.space.dtype:
            return
        wraps = _kind(array.dtype) == "integer" and not np.can_cast(array.dtype, self.space.dtype, casting="safe")
        if wraps:
            self._check_range(array, call)
        _warn_once(f"{self.env_name}|{self.what}|{array.dtype}|{self.space.dtype}",
                   f"env '{self.env_name}' returns {self.what} of dtype {array.dtype} from {call} but its "
                   f"{self.space_name} is {self.space}: alfish casts it to {self.space.dtype} (warned once for all "
                   f"its envs); return {self.space.dtype} arrays, or declare the space's dtype as {array.dtype}")
        if type(value) is np.ndarray and not wraps:  # (a narrowing integer type is range-checked every time)
            self.ok_dtypes += (array.dtype,)

    def _check_range(self, array: np.ndarray, call: str) -> None:
        """An error unless every value of the integer ``array`` fits the space's integer dtype."""
        if array.size == 0:
            return
        low, high, info = array.min(), array.max(), np.iinfo(self.space.dtype)
        if low < info.min or high > info.max:
            raise self._error(f"of dtype {array.dtype} with values in [{low}, {high}]",
                              f"values that fit {self.space.dtype} ([{info.min}, {info.max}]: a cast would wrap them)",
                              call)


class _DictContract:
    """The observation contract of a Dict of Boxes: exactly the space's keys, each by its Box's contract."""

    def __init__(self, env_name: str, space: gym.spaces.Dict) -> None:
        self.env_name, self.space = env_name, space
        self.keys = frozenset(space.spaces)
        self.leaves = [(key, _BoxContract(env_name, leaf, f"observation['{key}']", f"observation_space['{key}']"))
                       for key, leaf in space.spaces.items()]

    def check(self, value: Any, call: str) -> None:
        if not isinstance(value, dict):
            raise EnvContractError(f"env '{self.env_name}' returned observation of type {type(value).__name__} from "
                                   f"{call}, expected a dict with keys {sorted(self.keys)} (its observation_space is "
                                   f"{self.space}); fix the env's observation_space or its {call}")
        if value.keys() != self.keys:
            missing, extra = sorted(self.keys - value.keys()), sorted(value.keys() - self.keys, key=str)
            problems = "; ".join(p for p in (f"missing {missing}" if missing else "",
                                             f"unexpected {extra}" if extra else "") if p)
            raise EnvContractError(f"env '{self.env_name}' returned observation with keys {sorted(value, key=str)} "
                                   f"from {call} ({problems}), expected exactly {sorted(self.keys)} (its "
                                   f"observation_space is {self.space}); fix the env's observation_space or its {call}")
        for key, leaf in self.leaves:
            leaf.check(value[key], call)


def observation_contract(env_name: str, space: gym.Space) -> Any:
    """The checker of observations from ``space`` (a Box or a Dict of Boxes, see ``check_spaces``): ``.check(obs,
    call)`` raises ``EnvContractError`` or returns."""
    if isinstance(space, gym.spaces.Dict):
        return _DictContract(env_name, space)
    return _BoxContract(env_name, space, "observation", "observation_space")


def check_reward(env_name: str, reward: Any) -> None:
    """``EnvContractError`` unless ``reward`` is a finite real number (a Python or numpy scalar, or a 0-d array)."""
    scalar = isinstance(reward, (int, float, np.integer, np.floating)) or (
        isinstance(reward, np.ndarray) and reward.ndim == 0 and _kind(reward.dtype) in ("float", "integer", "bool"))
    if not scalar:
        shape = f", shape {list(reward.shape)}" if isinstance(reward, np.ndarray) else ""
        raise EnvContractError(f"env '{env_name}' returned reward {_short_repr(reward)} (type "
                               f"{type(reward).__name__}{shape}) from step(), expected a number (a Python or numpy "
                               "scalar); fix the env's step()")
    if not isfinite(float(reward)):
        raise EnvContractError(f"env '{env_name}' returned reward {float(reward)} from step(), expected a finite "
                               "number (one NaN or infinite reward poisons every value estimate); fix the env's step()")


def check_flag(env_name: str, name: str, value: Any) -> None:
    """``EnvContractError`` unless ``value`` (``terminated`` or ``truncated``) is a Python or numpy bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise EnvContractError(f"env '{env_name}' returned {name} {_short_repr(value)} (type {type(value).__name__}) "
                               "from step(), expected a bool; fix the env's step()")


class ContractCheck(gym.Wrapper):
    """Checks every reset and step of the wrapped env against its spaces (module docstring): a fast path of type,
    shape and dtype comparisons, and the full check with its one-line error only when that path fails."""

    def __init__(self, env: gym.Env, env_name: str) -> None:
        super().__init__(env)
        check_spaces(env_name, env.observation_space, env.action_space)
        self._env_name = env_name
        self._observation = observation_contract(env_name, env.observation_space)
        self._box = self._observation if isinstance(self._observation, _BoxContract) else None

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[Any, dict]:
        result = self.env.reset(seed=seed, options=options)
        if type(result) is not tuple or len(result) != 2:
            raise EnvContractError(f"env '{self._env_name}' returned {_short_repr(result)} from reset(), expected a "
                                   "tuple (observation, info) as gymnasium >= 0.26 requires; fix the env's reset()")
        self._observation.check(result[0], "reset()")
        return result

    def step(self, action: Any) -> tuple[Any, Any, Any, Any, dict]:
        result = self.env.step(action)
        try:
            observation, reward, terminated, truncated, _ = result
        except (TypeError, ValueError):
            count = f"{len(result)} values" if isinstance(result, tuple) else _short_repr(result)
            raise EnvContractError(f"env '{self._env_name}' returned {count} from step(), expected the 5 values "
                                   f"{_STEP_FIELDS} gymnasium >= 0.26 requires; fix the env's step()") from None
        # the fast path, inlined (this runs for every env on every step): exact types, shapes and dtypes seen before
        box = self._box
        if (box is None or type(observation) is not np.ndarray or observation.shape != box.shape
                or observation.dtype not in box.ok_dtypes):
            self._observation.check(observation, "step()")
        if type(reward) not in _PLAIN_REWARD_TYPES or not isfinite(reward):
            check_reward(self._env_name, reward)
        if type(terminated) not in _BOOL_TYPES or type(truncated) not in _BOOL_TYPES:
            check_flag(self._env_name, "terminated", terminated)
            check_flag(self._env_name, "truncated", truncated)
        return result
