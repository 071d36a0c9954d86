"""Data transformers: functions of the data applied on the way into the algorithm (DESIGN.md §1, §3.4).

The replay buffer stores raw steps; transformers run on the rollout view (each ``TimeStep`` before ``rollout_step``,
``predict_step`` in evaluation and play) and on the experience view (each replay sample before ``train_step``).
Transformers that read the buffer (frame stacking, hindsight relabelling) must come first; the order is checked when
the transformers are built.
"""
from __future__ import annotations

from typing import Callable, Sequence, Union

import gymnasium as gym
from torch import nn

from alfish.data.types import Experience, TimeStep


class DataTransformer(nn.Module):
    """Base class. State (e.g. running statistics) lives in registered buffers, so it is checkpointed.

    ``reads_buffer``: True for transformers that need neighbouring stored steps (they must come first).
    """

    reads_buffer: bool = False

    def transform_timestep(self, time_step: TimeStep, update_stats: bool) -> TimeStep:
        """Rollout view, ``[B, ...]``; ``update_stats`` is True while collecting training data (not in evaluation)."""
        return time_step

    def transform_experience(self, exp: Experience) -> Experience:
        """Experience view, ``[L, B, ...]`` (time-major) or ``[B, T, ...]`` (whole buffer): leaf-wise, shape-free."""
        return exp


class SequentialDataTransformer(DataTransformer):
    """Transformers applied in order; validates that buffer-reading ones come first."""

    def __init__(self, transformers: Sequence[DataTransformer]):
        super().__init__()
        check_order(transformers)
        self.transformers = nn.ModuleList(transformers)

    def transform_timestep(self, time_step: TimeStep, update_stats: bool) -> TimeStep:
        for t in self.transformers:
            time_step = t.transform_timestep(time_step, update_stats)
        return time_step

    def transform_experience(self, exp: Experience) -> Experience:
        for t in self.transformers:
            exp = t.transform_experience(exp)
        return exp


def check_order(transformers: Sequence[DataTransformer]) -> None:
    """A buffer-reading transformer after one that does not is an error naming both."""
    for i, later in enumerate(transformers):
        if not later.reads_buffer:
            continue
        for earlier in transformers[:i]:
            if not earlier.reads_buffer:
                raise ValueError(f"data transformer {type(later).__name__} reads the replay buffer, so it must come "
                                 f"before {type(earlier).__name__}; reorder TrainerConfig.data_transformer_ctor")


TransformerCtor = Callable[..., DataTransformer]


def build_transformers(ctors: Union[None, TransformerCtor, Sequence[TransformerCtor]],
                       observation_space: gym.spaces.Box) -> SequentialDataTransformer:
    """``TrainerConfig.data_transformer_ctor`` (None, one constructor or a list) -> one sequential transformer."""
    if ctors is None:
        ctors = []
    elif callable(ctors):
        ctors = [ctors]
    return SequentialDataTransformer([ctor(observation_space=observation_space) for ctor in ctors])
