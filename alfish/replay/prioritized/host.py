"""``PrioritizedSampler`` with its trees on the CPU: the hot paths on numpy.

``sample``, ``update_priorities``, ``on_add`` and the refresh of dirty leaves work on numpy arrays that share memory
with the tensors (the trees' nodes, ``_assigned``, the max priority; see ``segment_tree``'s module docstring), and
convert the tensors they are given to numpy views (``segment_tree.host_view``: CPU tensors only, so never a device
sync). The reason is call overhead: on the CPU a torch call costs a few microseconds whatever its size at these sizes,
a numpy call about a third of that, and an operation on 256 sequences is tens of calls, so this makes ``sample`` and
``update_priorities`` several times faster than the torch code of ``DevicePrioritizedSampler``
(``tools/bench/bench_prioritized.py``).

The arithmetic is that of the torch code, step for step, so a seeded run draws exactly the same batches and stores
exactly the same priorities on either: the draws are the same generator call (``torch.rand`` into a buffer numpy
reads), and the powers (``** alpha``, ``** -beta``) stay torch calls on buffers shared with numpy, because torch's
vectorized ``pow`` and numpy's do not round alike. The state is the base class's tensors (``state_dict`` reads them);
the count of invalid priorities is a Python int, returned as a 0-d tensor.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
import torch

from alfish.data.types import BatchInfo
from alfish.replay.prioritized.base import PrioritizedSampler, value_of
from alfish.replay.ring_buffer import RingBuffer
from alfish.replay.segment_tree import host_array, host_view


class _HostBuffers:
    """Buffers for batches of ``num`` entries. The ``*_t`` tensors share memory with the numpy arrays of the same
    name: torch calls (the generator's draws, ``pow``) write into or read from them and numpy reads or writes the
    other side, without a conversion per call."""

    def __init__(self, num: int, batch_size: Optional[int] = None):
        # the index of each draw's segment of [0, total), per mini-batch of ``batch_size`` (None: one of ``num``)
        self.strata = np.arange(num, dtype=np.float64) % (batch_size or num)
        self.rank_bits = num.bit_length()  # ranks 0..num fit in this many low bits of a sort key
        self.ranks = np.arange(1, num + 1, dtype=np.int64)  # entry number + 1 (see ``_apply``)
        self.targets = np.empty(num, dtype=np.float64)
        self.draws = np.empty(num, dtype=np.float64)  # uniform draws in [0, 1)
        self.ratios = np.empty(num, dtype=np.float64)  # bases of the importance weights' power
        self.weights = np.empty(num, dtype=np.float64)
        self.bases = np.empty(num, dtype=np.float32)  # priority + eps
        self.stored = np.empty(num, dtype=np.float32)  # (priority + eps) ** alpha
        self.draws_t, self.ratios_t, self.weights_t, self.bases_t, self.stored_t = (
            torch.from_numpy(x) for x in (self.draws, self.ratios, self.weights, self.bases, self.stored))


class HostPrioritizedSampler(PrioritizedSampler):
    """``PrioritizedSampler`` for ``device='cpu'`` (see the module docstring): indices and weights on the CPU."""

    on_host = True

    def __init__(self, num_envs: int, capacity: int, sequence_length: int = 1, **kwargs: Any):
        super().__init__(num_envs, capacity, sequence_length, **kwargs)
        if not self._sum.on_host:
            raise ValueError(f"HostPrioritizedSampler keeps its trees on the CPU, got device={self.device}; "
                             "PrioritizedSampler(...) picks the implementation for a device")
        self._assigned_np = host_view(self._assigned)  # the same memory
        self._max_np = host_view(self._max_priority)  # 0-d, the same memory, updated in place
        self._num_ok = 0  # priorities seen by updates that were finite and >= 0
        self._host_buffers: dict[int, _HostBuffers] = {}
        self._ring_tensors: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)  # see ``_ring_views``
        self._ring_arrays: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), np.zeros(0, np.int64))

    # ----------------------------------------------------------------------------------------------- bookkeeping --
    def _ring_views(self, storage: RingBuffer) -> tuple[np.ndarray, np.ndarray]:
        """Numpy views of the ring's own CPU counters ``_write_count`` and ``_floor`` ``[num_envs]`` (no copy; live:
        the ring updates them in place), remade only when the ring replaces a counter tensor (``clear``, load)."""
        write_count, floor = storage._write_count, storage._floor
        if write_count is not self._ring_tensors[0] or floor is not self._ring_tensors[1]:
            self._ring_tensors = (write_count, floor)  # (held, so that their ids are not reused)
            self._ring_arrays = (host_view(write_count), host_view(floor))
        return self._ring_arrays

    def _counters_host(self, storage: RingBuffer) -> tuple[np.ndarray, np.ndarray]:
        """The ring's write counts and oldest indices ``[num_envs]``, numpy int64.

        From the ring's own counters (``_ring_views``): ``write_count()`` clones and ``oldest_index()`` computes, three
        torch calls, as long as a quarter of a ``sample``. The write counts are the live view (valid until the next
        add); ``oldest`` is ``RingBuffer.oldest_index``'s formula (``test_host_counters_match_the_ring`` holds the two
        together).
        """
        write_count, floor = self._ring_views(storage)
        return write_count, np.maximum(write_count - self.capacity, floor)

    def _one_env_counters(self, storage: RingBuffer) -> tuple[int, int]:
        """``_counters_host`` of a one-env ring as ints: (write count, oldest index)."""
        write_count, floor = self._ring_views(storage)
        count = int(write_count[0])
        return count, max(count - self.capacity, int(floor[0]))

    def _buffers(self, num: int, batch_size: Optional[int] = None) -> _HostBuffers:
        key = (num, batch_size or num)
        buffers = self._host_buffers.get(key)
        if buffers is None:
            if len(self._host_buffers) >= 4:  # (the batch size rarely changes)
                self._host_buffers.clear()
            buffers = self._host_buffers[key] = _HostBuffers(num, batch_size)
        return buffers

    def _positions(self, leaves: np.ndarray, write_count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(env, absolute index of the step written last at the leaf's slot) for ``leaves``, given the ring's
        ``write_count`` ``[num_envs]``; as ``DevicePrioritizedSampler._positions``."""
        env_ids = leaves // self.capacity
        last = write_count[env_ids] - 1
        return env_ids, last - (last - leaves) % self.capacity  # (``%`` of a positive divisor is >= 0, as remainder)

    def _refresh(self, write_count: torch.Tensor, oldest: torch.Tensor, *leaves: torch.Tensor) -> None:
        self._refresh_arrays(host_array(write_count, torch.int64), host_array(oldest, torch.int64),
                             *(host_array(x, torch.int64) for x in leaves))

    def _refresh_arrays(self, write_count: np.ndarray, oldest: np.ndarray, *leaves: np.ndarray) -> None:
        """``_refresh`` of numpy int64 ``write_count``, ``oldest`` ``[num_envs]`` and ``leaves``."""
        pending, self._dirty = self._dirty + list(leaves), []
        if not pending:
            return
        leaves = np.concatenate(pending) if len(pending) > 1 else pending[0]
        if self.num_envs == 1:  # (one env: its counters as ints)
            count, first = int(write_count[0]), int(oldest[0])
        else:
            env_ids = leaves // self.capacity
            count, first = write_count[env_ids], oldest[env_ids]
        last = count - 1
        positions = last - (last - leaves) % self.capacity  # as ``_positions``
        drawable = positions >= first
        drawable &= positions <= count - self.sequence_length
        values = self._assigned_np[leaves]
        self._sum.update_host(leaves, np.where(drawable, values, 0.0), validate=False)
        if self._min is not None:
            self._min.update_host(leaves, np.where(drawable, values, np.inf), validate=False)

    def on_add(self, storage: RingBuffer, env_ids: torch.Tensor, write_counts_before: torch.Tensor) -> None:
        """``storage.add`` wrote one step to each of ``env_ids`` ``[N]`` at the absolute indices
        ``write_counts_before`` ``[N]`` (distinct pairs; an env may recur: ``ReplayBuffer.add_steps``): the new slots
        get the max priority; their leaves (and those of the starts that the add made drawable) are refreshed at the
        next sample or update."""
        env, w = host_array(env_ids, torch.int64), host_array(write_counts_before, torch.int64)
        new = env * self.capacity + w % self.capacity
        self._assigned_np[new] = self._max_np
        self._dirty.append(new)
        if self.sequence_length > 1:  # the start that now ends at the newest step (a negative one is no start)
            self._dirty.append(env * self.capacity + (w - (self.sequence_length - 1)) % self.capacity)
        if len(self._dirty) >= 512:  # a long collection without sampling: keep the backlog bounded
            self._refresh_arrays(*self._counters_host(storage))

    def _dirty_leaves(self) -> torch.Tensor:
        return torch.from_numpy(np.concatenate(self._dirty))  # (a copy)

    def _restore_dirty(self, dirty: torch.Tensor) -> None:
        self._dirty = [host_array(dirty, torch.int64).copy()]

    @property
    def invalid_priorities(self) -> torch.Tensor:
        return torch.tensor(self._num_seen - self._num_ok)

    # ------------------------------------------------------------------------------------------------- sampling --
    def _sample(self, storage: RingBuffer, batch_size: int, num_batches: int = 1) -> BatchInfo:
        """The steps of ``DevicePrioritizedSampler._sample`` on numpy arrays, with the same values."""
        per_batch, batch_size = batch_size, batch_size * num_batches  # (below: batch_size = every draw)
        if self._dirty:
            self._refresh_arrays(*self._counters_host(storage))
        self._check_drawable(storage)
        tree = self._sum
        total = tree.total_host()
        self._check_total(total)
        buf = self._buffers(batch_size, per_batch)
        torch.rand(batch_size, generator=self.generator, dtype=torch.float64, out=buf.draws_t)
        targets = np.add(buf.strata, buf.draws, out=buf.targets)
        targets *= total / per_batch  # (i + u) * (total / B)
        leaves = tree.find_prefix_sum_host(targets, ascending=True)
        p = tree.get_host(leaves)
        if self.num_envs == 1:  # (one env: leaf = slot, its counters as ints)
            count, oldest = self._one_env_counters(storage)
            n = max(count - (self.sequence_length - 1) - oldest, 0)  # drawable starts
            env_ids = np.zeros(batch_size, dtype=np.int64)
            positions = (count - 1) - leaves  # as ``_positions``: last - (last - leaf) % capacity
            positions %= self.capacity
            np.subtract(count - 1, positions, out=positions)
        else:
            write_count, oldest = self._counters_host(storage)
            n = int(np.maximum(write_count - (self.sequence_length - 1) - oldest, 0).sum())  # drawable starts
            env_ids, positions = self._positions(leaves, write_count)

        beta = value_of(self.beta)
        if self.normalize_by_max and self.max_over == "buffer":
            np.divide(p, self._min.min_host(), out=buf.ratios)  # weights / (N * p_min / total) ** -beta
        else:
            np.multiply(p, n, out=buf.ratios)
            buf.ratios /= total  # (n * p) / total, as the torch code
        torch.pow(buf.ratios_t, -beta, out=buf.weights_t)  # (torch: its pow rounds unlike numpy's)
        weights = buf.weights
        if self.normalize_by_max and self.max_over == "batch":  # each mini-batch by its own max
            blocks = weights.reshape(num_batches, per_batch)
            weights = (blocks / blocks.max(axis=1, keepdims=True)).reshape(batch_size)
        return BatchInfo(env_ids=torch.from_numpy(env_ids), positions=torch.from_numpy(positions),
                         importance_weights=torch.from_numpy(weights.astype(np.float32)))

    # ------------------------------------------------------------------------------------------------- updating --
    def _apply(self, storage: RingBuffer, batch_info: BatchInfo, priorities: torch.Tensor) -> None:
        """The rules and values of ``DevicePrioritizedSampler._apply``, on numpy arrays (``priorities`` are read on
        the CPU).

        The stored priorities are computed over the same ``[B]`` array as there, in the same order (entries sorted by
        leaf, each carrying its leaf's winner): torch's ``pow`` rounds differently in its vectorized body and in its
        scalar tail, so the layout of that array decides the last bit of the results. The usual case (every priority
        valid, every start still in the ring and drawable: always so for a batch just sampled, unless it was
        overwritten or cleared since) is checked with two min/max reductions each and skips the masks.
        """
        pos = host_array(batch_info.positions, torch.int64)
        priorities = host_array(priorities, torch.float32)
        num = priorities.size
        if num == 0:
            return
        if priorities.min() >= 0 and priorities.max() < math.inf:  # (NaN fails both)
            num_ok = num
        else:
            ok = priorities >= 0
            ok &= priorities < math.inf
            num_ok = int(np.count_nonzero(ok))
            priorities = np.where(ok, priorities, np.float32(0.0))
        self._num_ok += num_ok
        self._num_seen += num
        capacity, length = self.capacity, self.sequence_length
        valid = drawable = None  # None: all True
        if self.num_envs == 1:  # (one env: leaf = slot, its counters as ints)
            count, oldest = self._one_env_counters(storage)
            leaves = pos % capacity
            if not (pos.min() >= oldest and pos.max() <= count - length):
                valid = pos >= oldest
                valid &= pos < count  # still in the ring
                drawable = pos <= count - length  # (of a valid entry: ``>= oldest`` holds)
        else:
            env = host_array(batch_info.env_ids, torch.int64)
            write_count, oldest_all = self._counters_host(storage)
            count = write_count[env]
            leaves = env * capacity
            leaves += pos % capacity
            valid = pos >= oldest_all[env]
            valid &= pos < count  # still in the ring
            drawable = pos <= count - length  # (of a valid entry: ``>= oldest`` holds)
            if np.count_nonzero(valid) == num and np.count_nonzero(drawable) == num:
                valid = drawable = None
        num_valid = num if valid is None else int(np.count_nonzero(valid))
        buf = self._buffers(num)
        # For each distinct leaf its last valid entry wins, as in the torch code: sort by (leaf, rank), rank = entry
        # number + 1 if valid, else 0, packed into one int64 key (rank in the low ``rank_bits`` bits) so that a plain
        # sort does it. Equal keys (invalid copies of one leaf) are alike: such a run has no valid entry.
        bits = buf.rank_bits
        key = leaves << bits
        key |= buf.ranks if num_valid == num else np.where(valid, buf.ranks, 0)
        key.sort()
        leaves = key >> bits  # sorted, duplicates adjacent
        rank = key & ((1 << bits) - 1)  # each entry's
        if np.count_nonzero(leaves[1:] == leaves[:-1]):  # duplicates: each entry takes the last rank of its run
            rank = rank[np.searchsorted(leaves, leaves, side="right") - 1]
        winner = rank - 1  # [B]: the entry each leaf takes (-1, i.e. any entry: no valid one)
        np.add(priorities[winner], self.eps, out=buf.bases, dtype=np.float32)  # in float32, as torch adds a scalar
        torch.pow(buf.bases_t, value_of(self.alpha), out=buf.stored_t)
        values = buf.stored
        has_valid = None
        if num_valid < num:
            has_valid = rank > 0
            values = np.where(has_valid, values, self._assigned_np[leaves])  # no valid entry: keep the priority
        self._assigned_np[leaves] = values
        # The tree leaves, by the rule (``_refresh``): a leaf whose winner is valid holds the start ``pos[winner]``
        # (the step written last at its slot, as it is still in the ring), drawable iff ``pos <= write_count - L``
        # (``>= oldest`` holds). A leaf without a valid entry keeps its priority, so its tree values are already
        # right (the rule holds for every leaf but the dirty ones, refreshed below) and it is left out.
        if drawable is None:  # (every entry valid and drawable)
            self._sum.update_host(leaves, values, validate=False)
            if self._min is not None:
                self._min.update_host(leaves, values, validate=False)
        else:
            drawable = drawable[winner]
            if has_valid is not None:
                leaves, values, drawable = leaves[has_valid], values[has_valid], drawable[has_valid]
            self._sum.update_host(leaves, np.where(drawable, values, 0.0), validate=False)
            if self._min is not None:
                self._min.update_host(leaves, np.where(drawable, values, np.inf), validate=False)
        if self._dirty:
            self._refresh_arrays(*self._counters_host(storage))
        # (A kept priority is <= the max priority, which never decreases: the max over the new priorities will do.)
        if values.size:
            np.maximum(self._max_np, values.max(), out=self._max_np)
