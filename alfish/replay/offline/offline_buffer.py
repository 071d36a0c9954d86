"""Offline data as a read-only ``ReplayBuffer`` (DESIGN.md §3.14: offline data is replay data).

``Steps`` become one ring per source, filled once and never written again: the storage is an ordinary ``RingBuffer``
whose leaves are the dataset's arrays (views of memory-mapped files where the data is mapped: nothing is copied and
pages are read as batches touch them), so the uniform and prioritized samplers, the transformers that read the buffer
(frame stacking, hindsight relabelling) and the staging to the training device all work on it unchanged. Sequences may
run across an episode boundary (LAST then FIRST) exactly as in the online rings; algorithms mask those transitions.
"""
from __future__ import annotations

import logging
import warnings
from typing import Optional, Sequence

import numpy as np
import torch
from torch.utils import _pytree as pytree

from alfish.data import nest
from alfish.data.types import Experience, StepType
from alfish.replay.offline.steps import Steps
from alfish.replay.replay_buffer import ReplayBuffer
from alfish.replay.ring_buffer import RingBuffer
from alfish.replay.samplers import Sampler


class OfflineReplayBuffer(ReplayBuffer):
    """A ``ReplayBuffer`` over offline data: sampled like any other, never added to nor cleared (``add`` raises).

    Its sampler's state (priorities) is checkpointed; the data itself is not (it is loaded again from its source)."""

    def add(self, exp: Experience) -> None:
        raise RuntimeError("the offline replay buffer is read-only: online steps go to the online buffer")

    def clear(self, keep_last: int = 0) -> None:
        raise RuntimeError("the offline replay buffer is read-only and cannot be cleared")

    def truncate_episodes(self, env_ids: Optional[torch.Tensor] = None) -> None:
        """Nothing to do: every stored episode is whole."""

    def state_dict(self) -> dict:
        self.sampler.flush(self.storage)
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict, example: Experience = None) -> None:
        self.sampler.load_state_dict(state["sampler"])


def concatenate(sources: Sequence[Steps]) -> Steps:
    """Several sources as one (episodes of each in turn); one source is returned as it is (still mapped)."""
    if len(sources) == 1:
        return sources[0]
    first = sources[0]

    def cat(get):
        parts = [get(s) for s in sources]
        if isinstance(parts[0], dict):
            return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        return np.concatenate(parts)

    logging.info("offline data: %d sources concatenated in memory", len(sources))
    return Steps(step_type=cat(lambda s: s.step_type), reward=cat(lambda s: s.reward),
                 discount=cat(lambda s: s.discount), observation=cat(lambda s: s.observation),
                 action=cat(lambda s: s.action), dropped=sum(s.dropped for s in sources),
                 num_episodes=sum(s.num_episodes for s in sources), observation_space=first.observation_space,
                 action_space=first.action_space, source=" + ".join(s.source for s in sources))


def offline_storage(steps: Steps, example: Experience, track_episode_ends: bool = False) -> RingBuffer:
    """One ring holding every step of ``steps``, with the structure and dtypes of ``example`` (an Experience as the
    online collector stores it: ``example_experience``). Fields whose dtype differs are cast (a copy, logged)."""
    if nest.flatten(example.rollout_info):
        raise ValueError("the algorithm stores rollout info with each step (e.g. PPO's log-probabilities), which "
                         "offline data does not have; train offline with an off-policy algorithm (SAC, TD3, DQN, "
                         "BC, IQL)")
    wanted = nest.replace_fields(example, env_id=(), rollout_info=(), untransformed=())
    observation = steps.observation
    data = Experience(step_type=steps.step_type, reward=steps.reward, discount=steps.discount,
                      observation=(dict(sorted(observation.items())) if isinstance(observation, dict)
                                   else observation),
                      action=steps.action, env_id=(), rollout_info=(), untransformed=())
    wanted_leaves, spec = pytree.tree_flatten(wanted)
    data_leaves, data_spec = pytree.tree_flatten(data)
    if data_spec != spec:
        raise ValueError(f"{steps.source}: the data's fields do not have the structure the algorithm stores")
    leaves = [_as_leaf(array, like, steps.source) for array, like in zip(data_leaves, wanted_leaves)]
    storage = RingBuffer(1, len(steps), "cpu", track_episode_ends)
    state = {"write_count": torch.tensor([len(steps)]), "oldest": torch.tensor([0]), "leaves": leaves}
    if track_episode_ends:
        state.update(episode_end=torch.from_numpy(episode_ends(steps.step_type))[None],
                     episode_begin=torch.tensor([int(np.flatnonzero(steps.step_type == StepType.FIRST)[-1])]))
    storage.load_state_dict(state, nest.replace_fields(example, rollout_info=(), untransformed=()))
    return storage


def offline_replay_buffer(steps: Steps, example: Experience, sampler: Sampler,
                          device: str | torch.device | None = None,
                          track_episode_ends: bool = False) -> OfflineReplayBuffer:
    """``OfflineReplayBuffer`` over ``steps`` (see ``offline_storage``), sampled by ``sampler`` (built for one env
    of ``len(steps)`` steps), handing batches to ``device``."""
    return OfflineReplayBuffer(offline_storage(steps, example, track_episode_ends), sampler, device=device)


def episode_ends(step_type: np.ndarray) -> np.ndarray:
    """For every step, the index of its episode's LAST step (int64 [T])."""
    last = np.flatnonzero(np.asarray(step_type) == StepType.LAST)
    return last[np.searchsorted(last, np.arange(len(step_type)))].astype(np.int64)


def _as_leaf(array: np.ndarray, like: torch.Tensor, source: str) -> torch.Tensor:
    """``array`` [T, ...] as a tensor [1, T, ...] of ``like``'s dtype: a view of it when the dtype already fits."""
    wanted = torch.empty((), dtype=like.dtype).numpy().dtype
    if tuple(array.shape[1:]) != tuple(like.shape[1:]):
        raise ValueError(f"{source}: a field has rows of shape {tuple(array.shape[1:])} where the algorithm stores "
                         f"{tuple(like.shape[1:])}")
    if array.dtype != wanted:
        if np.issubdtype(array.dtype, np.floating) and np.issubdtype(wanted, np.integer):
            raise ValueError(f"{source}: a field holds {array.dtype} where the env produces {wanted}; float data "
                             "cannot stand for integer observations or actions")
        logging.info("%s: casting a field from %s to %s (a copy in memory)", source, array.dtype, wanted)
        array = np.asarray(array, dtype=wanted)
    with warnings.catch_warnings():  # a read-only memory map: torch warns that writing to it would fail (we never do)
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array).unsqueeze(0)
