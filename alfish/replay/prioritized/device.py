"""``PrioritizedSampler`` with its trees on a device (CUDA, meta): torch code, no host sync in the steady state.

Indices, weights, trees and assigned priorities stay on ``device``; the ring's CPU counters and the generator's CPU
draws travel there in non-blocking copies (``transfer.host_to_device``), and every data-dependent choice is a mask
(see ``base``'s module docstring). The count of invalid priorities is a device tensor. The same code runs on CPU
tensors when tests switch numpy off (``segment_tree.NUMPY_ON_CPU = False``) to compare it with
``HostPrioritizedSampler`` bit for bit.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from alfish.data.types import BatchInfo
from alfish.replay.prioritized.base import PrioritizedSampler, value_of
from alfish.replay.ring_buffer import RingBuffer
from alfish.replay.transfer import host_to_device


class DevicePrioritizedSampler(PrioritizedSampler):
    """``PrioritizedSampler`` for a ``device`` other than the CPU (see the module docstring)."""

    on_host = False

    def __init__(self, num_envs: int, capacity: int, sequence_length: int = 1, **kwargs: Any):
        super().__init__(num_envs, capacity, sequence_length, **kwargs)
        self._num_ok = torch.zeros((), dtype=torch.int64, device=self.device)  # priorities seen finite and >= 0
        self._rank_cache = torch.zeros(0, dtype=torch.int64, device=self.device)

    # ----------------------------------------------------------------------------------------------- bookkeeping --
    def _positions(self, leaves: torch.Tensor, write_count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(env, absolute index of the step written last at the leaf's slot) for ``leaves``, given the ring's
        ``write_count`` ``[num_envs]`` (both on one device)."""
        env_ids = leaves // self.capacity
        last = write_count[env_ids] - 1  # the newest index of the env; its slot is last % capacity
        return env_ids, last - torch.remainder(last - leaves, self.capacity)  # in (last - capacity, last]

    def _refresh(self, write_count: torch.Tensor, oldest: torch.Tensor, *leaves: torch.Tensor) -> None:
        pending, self._dirty = self._dirty + list(leaves), []
        if not pending:
            return
        on_host = [x for x in pending if x.device.type == "cpu"]
        parts = [x for x in pending if x.device.type != "cpu"]
        if on_host:  # one copy for all of them (none on a CPU device)
            parts.append(host_to_device(torch.cat(on_host) if len(on_host) > 1 else on_host[0], self.device))
        leaves = torch.cat(parts) if len(parts) > 1 else parts[0]
        env_ids, positions = self._positions(leaves, write_count)
        drawable = (positions >= oldest[env_ids]) & (positions <= write_count[env_ids] - self.sequence_length)
        values = self._assigned[leaves]
        self._sum.update(leaves, torch.where(drawable, values, 0.0), validate=False)
        if self._min is not None:
            self._min.update(leaves, torch.where(drawable, values, float("inf")), validate=False)

    def on_add(self, storage: RingBuffer, env_ids: torch.Tensor, write_counts_before: torch.Tensor) -> None:
        """``storage.add`` wrote one step to each of ``env_ids`` ``[N]`` at the absolute indices
        ``write_counts_before`` ``[N]`` (distinct pairs; an env may recur: ``ReplayBuffer.add_steps``): the new slots
        get the max priority; their leaves (and those of the starts that the add made drawable) are refreshed at the
        next sample or update."""
        env = env_ids.to("cpu", torch.int64)
        w = write_counts_before.to("cpu", torch.int64)
        new = self._leaves(env, w)
        self._assigned[host_to_device(new, self.device)] = self._max_priority
        self._dirty.append(new)
        if self.sequence_length > 1:  # the start that now ends at the newest step (a negative one is no start)
            self._dirty.append(self._leaves(env, w - (self.sequence_length - 1)))
        if len(self._dirty) >= 512:  # a long collection without sampling: keep the backlog bounded
            self._refresh(*self._counters(storage))

    def _dirty_leaves(self) -> torch.Tensor:
        return torch.cat(self._dirty)

    def _restore_dirty(self, dirty: torch.Tensor) -> None:
        self._dirty = [dirty.to("cpu", torch.int64).clone()]

    @property
    def invalid_priorities(self) -> torch.Tensor:
        return self._num_seen - self._num_ok

    # ------------------------------------------------------------------------------------------------- sampling --
    def _sample(self, storage: RingBuffer, batch_size: int, num_batches: int = 1) -> BatchInfo:
        write_count, oldest = self._counters(storage)
        self._refresh(write_count, oldest)
        self._check_drawable(storage)
        total = self._sum.total()
        self._check_total(total)
        n = self._num_drawable(write_count, oldest)
        num = batch_size * num_batches
        u = host_to_device(torch.rand(num, generator=self.generator, dtype=torch.float64), self.device)
        strata = torch.arange(num, dtype=torch.float64, device=self.device)
        if num_batches > 1:
            strata = strata.remainder(batch_size)  # each block stratified on its own
        targets = (strata + u) * (total / batch_size)
        leaves = self._sum.find_prefix_sum(targets)
        p = self._sum.get(leaves)
        env_ids, positions = self._positions(leaves, write_count)

        beta = value_of(self.beta)
        weights = (n * p / total).pow(-beta)
        if self.normalize_by_max:
            if self.max_over == "batch":  # each mini-batch by its own max
                weights = weights.view(num_batches, batch_size)
                weights = (weights / weights.amax(1, keepdim=True)).view(num)
            else:
                weights = (p / self._min.min()).pow(-beta)  # == weights / (N * p_min / total) ** -beta
        return BatchInfo(env_ids=env_ids, positions=positions, importance_weights=weights.float())

    # ------------------------------------------------------------------------------------------------- updating --
    def _apply(self, storage: RingBuffer, batch_info: BatchInfo, priorities: torch.Tensor) -> None:
        """Every entry is written (an ignored one writes back the priority its leaf already has)."""
        priorities = priorities.detach().reshape(-1)
        num = priorities.numel()
        if num == 0:
            return
        write_count, oldest = self._counters(storage)
        env = host_to_device(batch_info.env_ids.reshape(-1), self.device).to(torch.int64)
        pos = host_to_device(batch_info.positions.reshape(-1), self.device).to(torch.int64)
        priorities = host_to_device(priorities, self.device).to(torch.float32)
        ok = (priorities >= 0) & (priorities < math.inf)  # (NaN fails both)
        self._num_ok += ok.sum()
        self._num_seen += num
        priorities = torch.where(ok, priorities, 0.0)
        valid = (pos >= oldest[env]) & (pos < write_count[env])  # still in the ring
        # For each distinct leaf, its last valid entry wins: sort by (leaf, rank), rank = entry number + 1 if valid,
        # else 0; the last entry of a leaf's run then has the highest rank.
        leaves = self._leaves(env, pos)
        order = torch.argsort(torch.add(torch.where(valid, self._ranks(num), 0), leaves, alpha=num + 1))
        leaves = leaves[order]  # sorted, duplicates adjacent
        winner = order[torch.searchsorted(leaves, leaves, right=True) - 1]  # [B]: the entry each leaf takes
        stored = (priorities[winner] + self.eps).pow(value_of(self.alpha))
        values = torch.where(valid[winner], stored, self._assigned[leaves])  # no valid entry: keep the priority
        self._assigned.index_copy_(0, leaves, values)
        self._refresh(write_count, oldest, leaves)
        # (A kept priority is <= the max priority, which never decreases: the max over ``values`` is the max over the
        # new priorities.)
        self._max_priority = torch.maximum(self._max_priority, values.max())

    def _ranks(self, num: int) -> torch.Tensor:
        """``1, ..., num`` on ``device`` (cached: the batch size rarely changes)."""
        if self._rank_cache.numel() != num:
            self._rank_cache = torch.arange(1, num + 1, device=self.device)
        return self._rank_cache
