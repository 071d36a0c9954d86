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

import dataclasses
from typing import Mapping

import numpy as np

from alfish.data.types import StepType

REQUIRED = ("observations", "actions", "rewards", "terminals")


@dataclasses.dataclass(frozen=True)
class Steps:
    """Steps ``[T]`` in alfish's convention (numpy arrays), episodes one after another; ``dropped``: transitions
    that could not be stored (no ``next_observations``)."""

    step_type: np.ndarray   # [T] int8, StepType
    reward: np.ndarray      # [T] float32, of the previous step's action
    discount: np.ndarray    # [T] float32, 0 only at a termination
    observation: np.ndarray  # [T, *obs]
    action: np.ndarray      # [T, *act] (zeros at LAST steps)
    dropped: int
    num_episodes: int


def _check(arrays: Mapping[str, np.ndarray], source: str) -> int:
    missing = [k for k in REQUIRED if k not in arrays]
    if missing:
        raise ValueError(f"{source}: missing field(s) {missing}; a D4RL-style dataset needs {list(REQUIRED)} "
                         "(and 'timeouts', 'next_observations' where it has them)")
    n = len(arrays["observations"])
    for key, value in arrays.items():
        if value.dtype == object:
            raise ValueError(f"{source}: field '{key}' has dtype object; store plain numeric arrays (objects would "
                             "need pickle, which alfish never loads)")
        if len(value) != n:
            raise ValueError(f"{source}: field '{key}' has {len(value)} rows but 'observations' has {n}; the file is "
                             "truncated or its fields do not belong together")
    if n == 0:
        raise ValueError(f"{source}: the dataset has no rows")
    return n


def d4rl_to_steps(arrays: Mapping[str, np.ndarray], source: str = "dataset") -> Steps:
    """The steps of D4RL-style ``arrays`` (see the module docstring); ``source`` names the data in errors."""
    n = _check(arrays, source)
    obs, actions = np.asarray(arrays["observations"]), np.asarray(arrays["actions"])
    rewards = np.asarray(arrays["rewards"], dtype=np.float32).reshape(n)
    terminals = np.asarray(arrays["terminals"]).reshape(n).astype(bool)
    timeouts = np.asarray(arrays.get("timeouts", np.zeros(n, bool))).reshape(n).astype(bool)
    next_obs = arrays.get("next_observations")
    ends = np.flatnonzero(terminals | timeouts)
    if len(ends) == 0 or ends[-1] != n - 1:
        ends = np.append(ends, n - 1)  # the data's cut end closes the last episode (truncated)
    starts = np.concatenate([[0], ends[:-1] + 1])

    index: list[np.ndarray] = []   # which row's observation each step shows (-1 - row: next_observations[row])
    kinds, rews, discounts, acts_from = [], [], [], []
    dropped = episodes = 0
    for s, e in zip(starts.tolist(), ends.tolist()):
        rows = np.arange(s, e + 1)
        if next_obs is None:
            if e == s:
                dropped += 1
                continue
            dropped += 1
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
    observation = np.empty((len(where),) + obs.shape[1:], dtype=obs.dtype)
    from_rows = where >= 0
    observation[from_rows] = obs[where[from_rows]]
    if next_obs is not None:
        observation[~from_rows] = np.asarray(next_obs)[-1 - where[~from_rows]]
    act_rows = np.concatenate(acts_from)
    action = np.zeros((len(act_rows),) + actions.shape[1:], dtype=actions.dtype)
    action[act_rows >= 0] = actions[act_rows[act_rows >= 0]]
    return Steps(np.concatenate(kinds).astype(np.int8), np.concatenate(rews).astype(np.float32),
                 np.concatenate(discounts).astype(np.float32), observation, action, dropped, episodes)
