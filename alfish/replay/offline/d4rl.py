"""D4RL-style transition arrays -> alfish steps (DESIGN.md §3.5, §3.14).

D4RL stores transitions: row ``t`` is ``(observations[t], actions[t], rewards[t], terminals[t], timeouts[t])`` with
optional ``next_observations[t]``. alfish stores steps, whose reward belongs to the previous action and whose next
observation is the next step (no duplicated next observation). The mapping, per episode of rows ``s .. e`` (an episode
ends at a row with ``terminals`` or ``timeouts`` set, or at the last row):
  - row ``t`` becomes step ``t - s``: observation ``o_t``, action ``a_t``; the first step is FIRST with reward 0 and
    discount 1, the others MID with reward ``r_{t-1}`` and discount 1;
  - one extra LAST step holds ``next_observations[e]``, reward ``r_e``, discount 0 if ``terminals[e]`` (a
    termination) and 1 otherwise (a time-out or the cut end of the data: bootstrapped), and a zero action (the action
    of a LAST step is never trained on);
  - without ``next_observations`` the last transition of each episode cannot be stored: row ``e`` becomes the LAST
    step itself (reward ``r_{e-1}``, discount 1) and the transition out of it is dropped, counted in ``dropped``. An
    episode of one row then has no transition left and is dropped whole.
Nothing here executes code from the data: the arrays come from ``numpy.load(..., allow_pickle=False)`` or h5py, and
object dtypes are refused.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional

import numpy as np

from alfish.data.types import StepType
from alfish.replay.offline.steps import Steps, check_fields

REQUIRED = ("observations", "actions", "rewards", "terminals")


def _check(arrays: Mapping[str, np.ndarray], source: str) -> int:
    missing = [k for k in REQUIRED if k not in arrays]
    if missing:
        raise ValueError(f"{source}: missing field(s) {missing}; a D4RL-style dataset needs {list(REQUIRED)} "
                         "(and 'timeouts', 'next_observations' where it has them)")
    n = check_fields(dict(arrays), "observations", source)
    if n == 0:
        raise ValueError(f"{source}: the dataset has no rows")
    return n


Allocate = Callable[[str, tuple, np.dtype], np.ndarray]
CHUNK_ROWS = 65536  # rows gathered at a time: memory-mapped and HDF5 inputs are read slab by slab


def d4rl_to_steps(arrays: Mapping[str, np.ndarray], source: str = "dataset",
                  allocate: Optional[Allocate] = None) -> Steps:
    """The steps of D4RL-style ``arrays`` (see the module docstring); ``source`` names the data in errors.

    ``arrays`` may be numpy arrays, memory maps or h5py datasets: observations and actions are read in slabs of
    ``CHUNK_ROWS`` rows. ``allocate(name, shape, dtype)`` makes each output array (default ``np.empty``; give one that
    returns ``np.lib.format.open_memmap`` arrays to convert data larger than memory into files). Float observations
    and actions become float32, integer actions int64 (what alfish's envs produce); integer observations (images)
    keep their dtype.
    """
    n = _check(arrays, source)
    allocate = allocate or (lambda name, shape, dtype: np.empty(shape, dtype))
    rewards = np.asarray(arrays["rewards"], dtype=np.float32).reshape(n)
    terminals = np.asarray(arrays["terminals"]).reshape(n).astype(bool)
    timeouts = np.asarray(arrays["timeouts"]).reshape(n).astype(bool) if "timeouts" in arrays else np.zeros(n, bool)
    has_next = "next_observations" in arrays
    ends = np.flatnonzero(terminals | timeouts)
    if len(ends) == 0 or ends[-1] != n - 1:
        ends = np.append(ends, n - 1)  # the data's cut end closes the last episode (truncated)
    starts = np.concatenate([[0], ends[:-1] + 1])

    index: list[np.ndarray] = []   # which row's observation each step shows (-1 - row: next_observations[row])
    kinds, rews, discounts, acts_from = [], [], [], []
    dropped = episodes = 0
    for s, e in zip(starts.tolist(), ends.tolist()):
        rows = np.arange(s, e + 1)
        if not has_next:
            dropped += 1
            if e == s:
                continue
            body, last_obs, last_reward, last_discount = rows[:-1], e, rewards[e - 1], 1.0
        else:
            body, last_obs, last_reward = rows, -1 - e, rewards[e]
            last_discount = 0.0 if terminals[e] else 1.0
        episodes += 1
        count = len(body)
        index.append(np.append(body, last_obs))
        kinds.append(np.concatenate([[StepType.FIRST], np.full(count - 1, StepType.MID), [StepType.LAST]]))
        rews.append(np.concatenate([[0.0], rewards[body[:-1]], [last_reward]]))
        discounts.append(np.concatenate([np.ones(count), [last_discount]]))
        acts_from.append(np.append(body, -1))  # the LAST step's action: zeros
    if not index:
        raise ValueError(f"{source}: every episode has a single row and there are no next_observations, so no "
                         "transition can be stored")
    where = np.concatenate(index)
    obs, actions = arrays["observations"], arrays["actions"]
    observation = _gather("observation", obs, arrays.get("next_observations"), where, allocate,
                          _stored_dtype(obs.dtype, is_action=False))
    action = _gather("action", actions, None, np.concatenate(acts_from), allocate,
                     _stored_dtype(actions.dtype, is_action=True))
    return Steps(np.concatenate(kinds).astype(np.int8), np.concatenate(rews).astype(np.float32),
                 np.concatenate(discounts).astype(np.float32), observation, action, dropped, episodes,
                 source=source)


def _stored_dtype(dtype: np.dtype, is_action: bool) -> np.dtype:
    if np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.bool_):
        return np.dtype(np.float32)
    return np.dtype(np.int64) if is_action else np.dtype(dtype)


def _gather(name: str, rows_from, next_rows_from, where: np.ndarray, allocate: Allocate,
            dtype: np.dtype) -> np.ndarray:
    """``out[i] = rows_from[where[i]]`` for ``where[i] >= 0``, ``next_rows_from[-1 - where[i]]`` for negative ones and
    zeros where there is no ``next_rows_from``; read slab by slab (each chunk's rows span a short contiguous range)."""
    out = allocate(name, (len(where),) + tuple(rows_from.shape[1:]), dtype)
    for lo in range(0, len(where), CHUNK_ROWS):
        part = where[lo:lo + CHUNK_ROWS]
        chunk = np.zeros((len(part),) + tuple(rows_from.shape[1:]), dtype)
        for source, mask, rows in ((rows_from, part >= 0, part), (next_rows_from, part < 0, -1 - part)):
            if source is None or not mask.any():
                continue
            wanted = rows[mask]
            first, last = int(wanted.min()), int(wanted.max())
            slab = np.asarray(source[first:last + 1])
            chunk[mask] = slab[wanted - first]
        out[lo:lo + len(part)] = chunk
    return out
