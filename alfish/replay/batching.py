"""Turning batch-major replay data ``[B, L]`` into time-major training batches ``[L, B]`` (the only place it happens)."""
from __future__ import annotations

from typing import Iterator, Optional

import torch

from alfish.data import nest
from alfish.data.types import Experience


def to_time_major(exp: Experience) -> Experience:
    """``[B, L, ...] -> [L, B, ...]`` for every leaf."""
    return nest.map_nest(lambda x: x.transpose(0, 1), exp)


def whole_buffer_minibatches(exp: Experience, length: int, batch_size: Optional[int],
                             generator: Optional[torch.Generator] = None) -> Iterator[Experience]:
    """One epoch over ``exp`` ``[B, T]`` as shuffled time-major mini-batches ``[length, batch_size]``.

    The ``T`` steps of each env are cut into ``T // length`` sequences (a remainder of ``T % length`` steps is left
    out); ``batch_size=None`` means all sequences in one batch. The last batch may be smaller.
    """
    num_envs, steps = exp.step_type.shape[:2]
    per_env = steps // length
    if per_env == 0:
        return
    sequences = nest.map_nest(
        lambda x: x[:, :per_env * length].reshape((num_envs * per_env, length) + tuple(x.shape[2:])), exp)
    total = num_envs * per_env
    order = torch.randperm(total, generator=generator)
    batch_size = batch_size or total
    for start in range(0, total, batch_size):
        idx = order[start:start + batch_size]
        yield to_time_major(nest.map_nest(lambda x: x[idx], sequences))
