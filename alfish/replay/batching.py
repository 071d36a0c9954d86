"""Turning batch-major replay data ``[B, L]`` into time-major batches ``[L, B]`` (the only place it happens)."""
from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils import _pytree as pytree

from alfish.data import nest
from alfish.data.types import Experience
from alfish.replay.transfer import host_to_device


def to_time_major(exp: Experience) -> Experience:
    """``[B, L, ...] -> [L, B, ...]`` for every leaf."""
    return nest.map_nest(lambda x: x.transpose(0, 1), exp)


class WholeBufferBatches:
    """Epochs over experience ``[B, T]`` as shuffled time-major mini-batches ``[length, batch_size]``.

    The ``T`` steps of each env are cut into ``T // length`` sequences (a remainder of ``T % length`` steps is left
    out); ``batch_size=None`` means all sequences in one batch. The last batch of an epoch may be smaller. The sequences
    are laid out once; when one batch holds everything (PPO with one mini-batch per epoch) every epoch reuses it, as
    the order of samples inside a full batch does not change its gradient.
    """

    def __init__(self, exp: Experience, length: int, batch_size: int | None,
                 generator: torch.Generator | None = None):
        num_envs, steps = exp.step_type.shape[:2]
        per_env = steps // length
        self.total = num_envs * per_env
        self.batch_size = min(batch_size or self.total, self.total)
        self._generator = generator
        leaves, self._spec = pytree.tree_flatten(exp)
        # [B, T, ...] -> [B * per_env, length, ...]
        self._sequences = [x[:, :per_env * length].reshape((self.total, length) + tuple(x.shape[2:]))
                           for x in leaves]
        self._full_batch: Experience | None = None
        if self.total and self.batch_size == self.total:
            self._full_batch = self._batch(slice(None))

    def _batch(self, idx: torch.Tensor | slice) -> Experience:
        return pytree.tree_unflatten([x[idx].transpose(0, 1) for x in self._sequences], self._spec)

    def epoch(self) -> Iterator[Experience]:
        if self.total == 0:
            return
        if self._full_batch is not None:
            yield self._full_batch
            return
        # Drawn on the host (the seeded generator's stream), sent to the data's device once per epoch without waiting:
        # indexing device data with a host index tensor would copy (and wait) once per mini-batch.
        order = torch.randperm(self.total, generator=self._generator)
        if self._sequences:
            order = host_to_device(order, self._sequences[0].device)
        for start in range(0, self.total, self.batch_size):
            yield self._batch(order[start:start + self.batch_size])


def whole_buffer_minibatches(exp: Experience, length: int, batch_size: int | None,
                             generator: torch.Generator | None = None) -> Iterator[Experience]:
    """One epoch of ``WholeBufferBatches`` (see there)."""
    return WholeBufferBatches(exp, length, batch_size, generator).epoch()
