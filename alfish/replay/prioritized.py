"""Prioritized sampling of sequence starts (Schaul et al. 2016) from a ``RingBuffer``.

The sampler keeps one priority per ring slot, for the sequence that *starts* there; leaf ``env_id * capacity + slot``
of a ``SumTree`` (and of a ``MinTree`` when weights are normalized by the buffer's max). It never touches the ring's
data and keeps no copy of its counters: the ``ReplayBuffer`` that owns both calls ``on_add`` after every add and
``on_clear`` after every clear, and passes the ring to every call; write counts and oldest indices are read from it.

Drawable starts. A sequence of ``L = sequence_length`` steps starting at absolute index ``p`` of env ``e`` can be drawn
iff ``oldest(e) <= p <= write_count(e) - L``: all its steps are readable (``oldest`` is ``RingBuffer.oldest_index``,
which moves on overwrite and on ``clear``) and it does not run past the newest step. Every slot has an *assigned*
priority (``self._assigned``), and the one rule is: a tree leaf holds its slot's assigned priority while the start
written there last is drawable, else 0 (``+inf`` in the min tree). So the trees only ever see drawable starts.
A leaf is refreshed by that rule (from the ring's write counts and oldest indices at the time of the refresh) whenever
its drawability or priority may have changed, which happens in three places only:

* ``on_add`` (step ``w`` of env ``e`` written): slot ``w`` gets the max priority seen so far as its assigned priority
  and is not drawable yet (unless ``L == 1``); the same write makes start ``w - L + 1`` drawable. Slot ``w`` was the
  slot of ``w - capacity``, which is gone (the ring wrapped): refreshing slot ``w`` covers that too. So each add dirties
  2 leaves per env. They are refreshed in one batch at the next ``sample`` / ``update_priorities`` (a tree update
  costs about the same for 2 leaves as for a few hundred: it is a fixed number of torch calls per level, so adds
  between two samples share one). As the rule reads the ring's state when it runs, a late refresh is still exact.
* ``on_clear`` (after ``RingBuffer.clear``): the starts in ``[oldest before, oldest after)`` are refreshed (to 0).
* ``update_priorities``: changes the assigned priority of starts still in the ring.

Stored priority: ``(priority + eps) ** alpha`` (ALF stores ``priority ** alpha + eps``; both keep every leaf positive).
New starts get the largest stored priority seen so far (at least ``initial_priority``); ALF gives them the largest
priority currently in its max-tree (at least its ``initial_priority``), which can decrease.

Importance weights, with ``N`` the number of drawable starts and ``P(i) = p_i / sum_j p_j``:
``w_i = (N * P(i)) ** -beta``, i.e. ``(p_i / mean p) ** -beta``. This is exactly ALF: its ``BatchInfo`` carries
``p_i * nnz / total`` and its algorithm raises it to ``-beta``, then, only if
``TrainerConfig.normalize_importance_weights_by_max``, divides by the max *of the batch* (``masks / masks.max()``).
With the flag off (ALF's default) ALF does not normalize further: the weights are relative to the mean priority.
Here ``normalize_by_max`` has the same meaning, and ``max_over="buffer"`` selects the paper's normalization instead:
divide by the max weight over all drawable starts, ``(N * p_min / total) ** -beta``, read from the ``MinTree``.

Memory, per slot (``num_envs * capacity`` slots rounded up to ``P``, a power of two, for the trees): the sum tree keeps
2 float64 nodes per leaf (16 B), the min tree (only with ``max_over="buffer"``) 2 float32 (8 B), and the assigned
priorities 1 float32 (4 B): 20 to 28 B per slot, e.g. 21 MB (29 MB) for 1M slots.

Devices and host syncs. The ring's counters are CPU tensors; the trees and the assigned priorities live on
``device``. In the steady state ``sample`` and ``update_priorities`` never read a tensor back to the host: "enough
steps stored?" is the ring's ``holds_sequence`` (Python ints), the draws come from a CPU generator and travel to the
device (and the counters with them) in non-blocking copies, the "last write wins" of duplicate starts and the skipping
of starts overwritten since they were sampled are masks (no ``nonzero``), and priorities are not validated on the host
(``validate``). Which placement to use:

* trees on the host (``device='cpu'``, the default) fit every storage location: indices are drawn and returned on
  the host, as the transformers that read the buffer at sample time (frame stacking, hindsight) need. Priorities
  computed on a CUDA device are copied back without waiting and applied one update late (``update_priorities``).
* trees on the device fit a storage on that device: indices come out on the device and nothing crosses to the host.
  Transformers that read the buffer at sample time need host indices: use host trees with them. (With a host
  storage the gather would read the device indices back: a sync per sample.)

Host trees run on numpy. With the trees on the CPU, ``sample``, ``update_priorities``, ``on_add`` and the refresh of
dirty leaves work on numpy arrays that share memory with the tensors (the trees' nodes, ``_assigned``, the max
priority; see ``segment_tree``'s module docstring), and convert the tensors they are given to numpy views
(``segment_tree.host_view``: CPU tensors only, so never a device sync). The reason is call overhead: on the CPU a
torch call costs a few microseconds whatever its size at these sizes, a numpy call about a third of that, and an
operation on 256 sequences is tens of calls, so this makes ``sample`` and ``update_priorities`` several times faster
(``tools/bench/bench_prioritized.py``). The arithmetic is that of the torch path, step for step, so a seeded run draws
exactly the same batches and stores exactly the same priorities on either: the draws are the same generator call
(``torch.rand`` into a buffer numpy reads), and the powers (``** alpha``, ``** -beta``) stay torch calls on buffers
shared with numpy, because torch's vectorized ``pow`` and numpy's do not round alike. What the state is does not
change: ``state_dict`` / ``load_state_dict`` read and write the same tensors, the count of invalid priorities is a
Python int read back as a 0-d tensor, and a sampler on any other device (CUDA, meta) runs the torch code.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from alfish.data.types import BatchInfo
from alfish.replay.deferred_priorities import DeferredPriorities
from alfish.replay.ring_buffer import RingBuffer
from alfish.replay.samplers import Sampler, check_length, too_few_steps
from alfish.replay.segment_tree import MinTree, SumTree, host_array, host_view
from alfish.replay.transfer import canonical_device, host_to_device

Schedule = float | Callable[[], float]  # a number, or a schedule (alfish.schedulers) called for its value


def _value(schedule: Schedule) -> float:
    """A float, or the current value of a schedule (``alfish.schedulers``: a zero-argument callable)."""
    return schedule() if callable(schedule) else schedule


class _HostBuffers:
    """Buffers of the host path for batches of ``num`` entries. The ``*_t`` tensors share memory with the numpy
    arrays of the same name: torch calls (the generator's draws, ``pow``) write into or read from them and numpy
    reads or writes the other side, without a conversion per call."""

    def __init__(self, num: int):
        self.strata = np.arange(num, dtype=np.float64)  # the index of each draw's segment of [0, total)
        self.rank_bits = num.bit_length()  # ranks 0..num fit in this many low bits of a sort key
        self.ranks = np.arange(1, num + 1, dtype=np.int64)  # entry number + 1 (see ``_apply_host``)
        self.targets = np.empty(num, dtype=np.float64)
        self.draws = np.empty(num, dtype=np.float64)  # uniform draws in [0, 1)
        self.ratios = np.empty(num, dtype=np.float64)  # bases of the importance weights' power
        self.weights = np.empty(num, dtype=np.float64)
        self.bases = np.empty(num, dtype=np.float32)  # priority + eps
        self.stored = np.empty(num, dtype=np.float32)  # (priority + eps) ** alpha
        self.draws_t, self.ratios_t, self.weights_t, self.bases_t, self.stored_t = (
            torch.from_numpy(x) for x in (self.draws, self.ratios, self.weights, self.bases, self.stored))


class PrioritizedSampler(Sampler):
    """Priorities of the sequence starts of a ``RingBuffer(num_envs, capacity)``.

    Args:
        num_envs, capacity: those of the ring.
        sequence_length: ``L``, the length of every sampled sequence (fixed: it decides which starts are drawable).
        alpha: exponent of the stored priority, a float or a zero-argument callable (a schedule) read at each update.
        beta: exponent of the importance weights, a float or a schedule read at each ``sample``.
        eps: added to a priority before the exponent, so no start ever gets probability 0.
        normalize_by_max: divide the importance weights by their max (see ``max_over``); False (ALF's default) keeps
            ``(N * P(i)) ** -beta``.
        max_over: ``"batch"`` (ALF's ``normalize_importance_weights_by_max``) or ``"buffer"`` (Schaul et al.: the max
            over all drawable starts; keeps a ``MinTree``).
        initial_priority: lower bound of the priority given to new starts (stored scale).
        device: of the trees, the weights and (for a device other than the CPU) the returned indices; see the module
            docstring for which placement fits which storage.
        generator: a CPU generator for the draws (public attribute ``generator``, so it can be reseeded); ``None``
            uses torch's global generator.
        validate: check every priority update on the host and raise on a priority that is not finite and >= 0 (a
            host sync per update: for debugging). Off, such priorities are replaced by 0 (stored ``eps ** alpha``)
            and counted in ``invalid_priorities`` (a tensor, read when a summary is due).
    """

    def __init__(self, num_envs: int, capacity: int, sequence_length: int = 1, alpha: Schedule = 0.7,
                 beta: Schedule = 0.4, eps: float = 1e-6, normalize_by_max: bool = False, max_over: str = "batch",
                 initial_priority: float = 1.0, device: str | torch.device = "cpu",
                 generator: torch.Generator | None = None, validate: bool = False):
        if not 1 <= sequence_length <= capacity:
            raise ValueError(f"sequence_length must lie in [1, capacity={capacity}], got {sequence_length}")
        if max_over not in ("batch", "buffer"):
            raise ValueError(f"max_over must be 'batch' or 'buffer', got {max_over!r}")
        self.num_envs = num_envs
        self.capacity = capacity
        self.sequence_length = sequence_length
        self.alpha = alpha
        self.beta = beta
        self.eps = eps
        self.normalize_by_max = normalize_by_max
        self.max_over = max_over
        self.device = canonical_device(device)
        self.generator = generator
        self.validate = validate
        # With eps > 0 and a positive initial priority every drawable start has a positive priority, so the total is
        # positive whenever a start is drawable; otherwise sample checks it (a host sync).
        self._may_total_zero = eps <= 0 or initial_priority <= 0
        size = num_envs * capacity
        self._sum = SumTree(size, device=self.device)
        self._min = MinTree(size, device=self.device) if normalize_by_max and max_over == "buffer" else None
        self._assigned = torch.zeros(size, dtype=torch.float32, device=self.device)
        # CPU leaves whose tree values await a refresh (from on_add): tensors, numpy arrays for host trees.
        self._dirty: list[torch.Tensor] | list[np.ndarray] = []
        self._deferred = DeferredPriorities()  # device priorities on their way to host trees
        # Priorities seen by updates, and those finite and >= 0 among them (see ``invalid_priorities``).
        self._num_seen = 0
        self._on_host = self._sum.on_host  # numpy hot paths: the trees are on the CPU (see the module docstring)
        if self._on_host:
            self._assigned_np = host_view(self._assigned)  # the same memory
            self._max_np = np.array(float(initial_priority), dtype=np.float32)  # 0-d, updated in place
            self._max_priority = torch.from_numpy(self._max_np)  # the same memory
            self._num_ok_host = 0
            self._host_buffers: dict[int, _HostBuffers] = {}
            self._ring_tensors: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)  # see ``_ring_views``
            self._ring_arrays: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        else:
            self._max_priority = torch.tensor(float(initial_priority), dtype=torch.float32, device=self.device)
            self._num_ok = torch.zeros((), dtype=torch.int64, device=self.device)
            self._rank_cache = torch.zeros(0, dtype=torch.int64, device=self.device)

    # ----------------------------------------------------------------------------------------------- bookkeeping --
    def _leaves(self, env_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return env_ids * self.capacity + torch.remainder(positions, self.capacity)

    def _counters(self, storage: RingBuffer) -> tuple[torch.Tensor, torch.Tensor]:
        """The ring's ``write_count`` and ``oldest_index`` ``[num_envs]`` on ``device`` (one non-blocking copy)."""
        write_count, oldest = storage.write_count(), storage.oldest_index()
        if self.device.type == "cpu":
            return write_count, oldest
        both = host_to_device(torch.stack([write_count, oldest]), self.device)
        return both[0], both[1]

    def _positions(self, leaves: torch.Tensor, write_count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(env, absolute index of the step written last at the leaf's slot) for ``leaves``, given the ring's
        ``write_count`` ``[num_envs]`` (both on one device)."""
        env_ids = leaves // self.capacity
        last = write_count[env_ids] - 1  # the newest index of the env; its slot is last % capacity
        return env_ids, last - torch.remainder(last - leaves, self.capacity)  # in (last - capacity, last]

    def _refresh(self, write_count: torch.Tensor, oldest: torch.Tensor, *leaves: torch.Tensor) -> None:
        """Apply the rule to ``leaves`` (CPU or ``device``) and the dirty ones: assigned priority if drawable, else
        0 / +inf.

        ``write_count`` and ``oldest`` ``[num_envs]`` are the ring's now, on ``device`` (``_counters``). Duplicates are
        harmless: every copy of a leaf gets the same value (so their order does not matter either).
        """
        if self._on_host:
            self._refresh_host(host_array(write_count, torch.int64), host_array(oldest, torch.int64),
                               *(host_array(x, torch.int64) for x in leaves))
            return
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

    def _num_drawable(self, write_count: torch.Tensor, oldest: torch.Tensor) -> torch.Tensor:
        return (write_count - self.sequence_length + 1 - oldest).clamp(min=0).sum()

    # ------------------------------------------------------------------------- bookkeeping, host trees (numpy) --
    def _ring_views(self, storage: RingBuffer) -> tuple[np.ndarray, np.ndarray]:
        """Numpy views of the ring's own CPU counters ``_write_count`` and ``_floor`` ``[num_envs]`` (no copy; live:
        the ring updates them in place), remade only when the ring replaces a counter tensor (``clear``, load)."""
        write_count, floor = storage._write_count, storage._floor
        if write_count is not self._ring_tensors[0] or floor is not self._ring_tensors[1]:
            self._ring_tensors = (write_count, floor)  # (held, so that their ids are not reused)
            self._ring_arrays = (host_view(write_count), host_view(floor))
        return self._ring_arrays

    def _counters_host(self, storage: RingBuffer) -> tuple[np.ndarray, np.ndarray]:
        """The ring's write counts and oldest indices ``[num_envs]``, numpy int64, for host trees.

        From the ring's own counters (``_ring_views``): ``write_count()`` clones and ``oldest_index()`` computes, three
        torch calls, as long as a quarter of a host ``sample``. The write counts are the live view (valid until the
        next add); ``oldest`` is ``RingBuffer.oldest_index``'s formula (``test_host_counters_match_the_ring`` holds the
        two together).
        """
        write_count, floor = self._ring_views(storage)
        return write_count, np.maximum(write_count - self.capacity, floor)

    def _one_env_counters(self, storage: RingBuffer) -> tuple[int, int]:
        """``_counters_host`` of a one-env ring as ints: (write count, oldest index)."""
        write_count, floor = self._ring_views(storage)
        count = int(write_count[0])
        return count, max(count - self.capacity, int(floor[0]))

    def _buffers(self, num: int) -> _HostBuffers:
        buffers = self._host_buffers.get(num)
        if buffers is None:
            if len(self._host_buffers) >= 4:  # (the batch size rarely changes)
                self._host_buffers.clear()
            buffers = self._host_buffers[num] = _HostBuffers(num)
        return buffers

    def _positions_host(self, leaves: np.ndarray, write_count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``_positions`` on numpy arrays."""
        env_ids = leaves // self.capacity
        last = write_count[env_ids] - 1
        return env_ids, last - (last - leaves) % self.capacity  # (``%`` of a positive divisor is >= 0, as remainder)

    def _refresh_host(self, write_count: np.ndarray, oldest: np.ndarray, *leaves: np.ndarray) -> None:
        """``_refresh`` of host trees: numpy int64 ``write_count``, ``oldest`` ``[num_envs]`` and ``leaves``."""
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
        positions = last - (last - leaves) % self.capacity  # as ``_positions_host``
        drawable = positions >= first
        drawable &= positions <= count - self.sequence_length
        values = self._assigned_np[leaves]
        self._sum.update_host(leaves, np.where(drawable, values, 0.0), validate=False)
        if self._min is not None:
            self._min.update_host(leaves, np.where(drawable, values, np.inf), validate=False)

    def num_drawable(self, storage: RingBuffer) -> torch.Tensor:
        """Number of drawable starts of ``storage``, summed over envs (0-dim int64, CPU)."""
        return self._num_drawable(storage.write_count(), storage.oldest_index())

    def attach(self, storage: RingBuffer) -> None:
        """Check the ring's size; steps it already holds (a pre-filled storage) get the initial priority."""
        if (storage.num_envs, storage.capacity) != (self.num_envs, self.capacity):
            raise ValueError(f"the prioritized sampler was built for {self.num_envs} envs x {self.capacity} steps, "
                             f"the storage holds {storage.num_envs} x {storage.capacity}")
        if storage.total_stored() > 0:
            all_leaves = torch.arange(self.num_envs * self.capacity)
            self._assigned.fill_(self._max_priority)
            self._refresh(*self._counters(storage), all_leaves)

    def on_add(self, storage: RingBuffer, env_ids: torch.Tensor, write_counts_before: torch.Tensor) -> None:
        """``storage.add`` wrote one step to each of ``env_ids`` ``[B]`` (unique) at the absolute indices
        ``write_counts_before`` ``[B]``: the new slots get the max priority; their leaves (and those of the starts
        that the add made drawable) are refreshed at the next sample or update."""
        if self._on_host:
            self._on_add_host(storage, host_array(env_ids, torch.int64), host_array(write_counts_before, torch.int64))
            return
        env = env_ids.to("cpu", torch.int64)
        w = write_counts_before.to("cpu", torch.int64)
        new = self._leaves(env, w)
        self._assigned[host_to_device(new, self.device)] = self._max_priority
        self._dirty.append(new)
        if self.sequence_length > 1:  # the start that now ends at the newest step (a negative one is no start)
            self._dirty.append(self._leaves(env, w - (self.sequence_length - 1)))
        if len(self._dirty) >= 512:  # a long collection without sampling: keep the backlog bounded
            self._refresh(*self._counters(storage))

    def _on_add_host(self, storage: RingBuffer, env: np.ndarray, w: np.ndarray) -> None:
        """``on_add`` of host trees (numpy int64 ``env``, ``w``)."""
        new = env * self.capacity + w % self.capacity
        self._assigned_np[new] = self._max_np
        self._dirty.append(new)
        if self.sequence_length > 1:  # the start that now ends at the newest step (a negative one is no start)
            self._dirty.append(env * self.capacity + (w - (self.sequence_length - 1)) % self.capacity)
        if len(self._dirty) >= 512:  # a long collection without sampling: keep the backlog bounded
            self._refresh_host(*self._counters_host(storage))

    def on_clear(self, storage: RingBuffer, oldest_before: torch.Tensor) -> None:
        """``storage.clear`` moved the oldest indices from ``oldest_before`` ``[num_envs]``: the starts it made
        unreadable get leaf 0 now (a one-off refresh, possibly large: a bulk tree rebuild)."""
        oldest, write_count = storage.oldest_index(), storage.write_count()
        # Starts in [oldest_before, oldest) are gone; only those that could have been drawable (<= write_count - L)
        # matter, the others are 0 already.
        stop = torch.minimum(oldest, write_count - self.sequence_length + 1)
        counts = (stop - oldest_before).clamp(min=0)
        total = int(counts.sum())
        if total == 0:
            return
        env = torch.repeat_interleave(torch.arange(self.num_envs), counts)
        first = torch.repeat_interleave(oldest_before - (torch.cumsum(counts, 0) - counts), counts)
        self._refresh(*self._counters(storage), self._leaves(env, first + torch.arange(total)))

    # ------------------------------------------------------------------------------------------------- sampling --
    def sample(self, storage: RingBuffer, batch_size: int, length: int) -> BatchInfo:
        """``batch_size`` sequence starts, drawn with probability proportional to their stored priority.

        Stratified: ``[0, total)`` is split into ``batch_size`` equal segments and one uniform target is drawn in each
        (ALF's sampling without replacement).

        Priority updates still in flight from the device (see ``update_priorities``) that were queued before the
        previous sample are applied first. No host sync once enough steps are stored (see the module docstring).

        Returns ``BatchInfo``: ``env_ids``, ``positions`` int64 ``[batch_size]`` (on ``device``: the CPU for host
        trees), absolute start indices as ``RingBuffer.gather`` expects; ``importance_weights`` float32
        ``[batch_size]`` on ``device`` (see the module docstring).
        """
        check_length(length)
        if length != self.sequence_length:
            raise ValueError(f"this prioritized sampler draws sequences of sequence_length={self.sequence_length} "
                             f"(fixed at construction), asked for length={length}")
        if len(self._deferred):
            for batch_info, priorities in self._deferred.take_ready():
                self._apply(storage, batch_info, priorities)
        if self._on_host:
            return self._sample_host(storage, batch_size, length)
        write_count, oldest = self._counters(storage)
        self._refresh(write_count, oldest)
        if not storage.holds_sequence(length):  # Python ints once enough is stored: no tensor is read
            raise too_few_steps(storage.num_stored(), length)
        total = self._sum.total()
        if self._may_total_zero and not bool(total > 0):  # (a sync, only with eps = 0 or initial_priority = 0)
            raise RuntimeError("every drawable start has priority 0 (eps=0 and zero priorities): nothing to sample")
        n = self._num_drawable(write_count, oldest)
        u = host_to_device(torch.rand(batch_size, generator=self.generator, dtype=torch.float64), self.device)
        targets = (torch.arange(batch_size, dtype=torch.float64, device=self.device) + u) * (total / batch_size)
        leaves = self._sum.find_prefix_sum(targets)
        p = self._sum.get(leaves)
        env_ids, positions = self._positions(leaves, write_count)

        beta = _value(self.beta)
        weights = (n * p / total).pow(-beta)
        if self.normalize_by_max:
            if self.max_over == "batch":
                weights = weights / weights.max()
            else:
                weights = (p / self._min.min()).pow(-beta)  # == weights / (N * p_min / total) ** -beta
        return BatchInfo(env_ids=env_ids, positions=positions, importance_weights=weights.float())

    def _sample_host(self, storage: RingBuffer, batch_size: int, length: int) -> BatchInfo:
        """``sample`` of host trees: the steps of the torch path above on numpy arrays, with the same values."""
        if self._dirty:
            self._refresh_host(*self._counters_host(storage))
        if not storage.holds_sequence(length):
            raise too_few_steps(storage.num_stored(), length)
        tree = self._sum
        total = tree.total_host()
        if self._may_total_zero and not total > 0:
            raise RuntimeError("every drawable start has priority 0 (eps=0 and zero priorities): nothing to sample")
        buf = self._buffers(batch_size)
        torch.rand(batch_size, generator=self.generator, dtype=torch.float64, out=buf.draws_t)
        targets = np.add(buf.strata, buf.draws, out=buf.targets)
        targets *= total / batch_size  # (i + u) * (total / B)
        leaves = tree.find_prefix_sum_host(targets, ascending=True)
        p = tree.get_host(leaves)
        if self.num_envs == 1:  # (one env: leaf = slot, its counters as ints)
            count, oldest = self._one_env_counters(storage)
            n = max(count - (self.sequence_length - 1) - oldest, 0)  # drawable starts
            env_ids = np.zeros(batch_size, dtype=np.int64)
            positions = (count - 1) - leaves  # as ``_positions_host``: last - (last - leaf) % capacity
            positions %= self.capacity
            np.subtract(count - 1, positions, out=positions)
        else:
            write_count, oldest = self._counters_host(storage)
            n = int(np.maximum(write_count - (self.sequence_length - 1) - oldest, 0).sum())  # drawable starts
            env_ids, positions = self._positions_host(leaves, write_count)

        beta = _value(self.beta)
        if self.normalize_by_max and self.max_over == "buffer":
            np.divide(p, self._min.min_host(), out=buf.ratios)  # weights / (N * p_min / total) ** -beta
        else:
            np.multiply(p, n, out=buf.ratios)
            buf.ratios /= total  # (n * p) / total, as the torch path
        torch.pow(buf.ratios_t, -beta, out=buf.weights_t)  # (torch: its pow rounds unlike numpy's)
        weights = buf.weights
        if self.normalize_by_max and self.max_over == "batch":
            weights = weights / weights.max()
        return BatchInfo(env_ids=torch.from_numpy(env_ids), positions=torch.from_numpy(positions),
                         importance_weights=torch.from_numpy(weights.astype(np.float32)))

    # ------------------------------------------------------------------------------------------------- updating --
    def update_priorities(self, storage: RingBuffer, batch_info: BatchInfo, priorities: torch.Tensor) -> None:
        """Set the priority of the starts of ``batch_info`` (as returned by ``sample``) to ``priorities`` ``[B]``.

        Stored: ``(priority + eps) ** alpha``; the max stored priority (given to new starts) is updated. Starts that
        were overwritten or cleared since they were sampled (``position < oldest index`` of their env, read from
        ``storage`` when the update is applied) are ignored, so a slow update never gives an old priority to a new
        step. Duplicate starts: the last one wins. A priority that is not finite and >= 0 is replaced by 0 and
        counted in ``invalid_priorities`` (or, with ``validate=True``, raises ``ValueError`` here: a host sync).

        When: at once, except for priorities on a CUDA device with trees on the host: those are copied to pinned host
        memory without waiting and applied by the second next ``sample`` (``DeferredPriorities``), so sampling
        overlaps the device's update and priorities land one update late. ``ReplayBuffer.state_dict`` applies
        whatever is still queued (``flush``).
        """
        num = batch_info.env_ids.numel()
        if priorities.numel() != num:
            raise ValueError(f"update_priorities got {priorities.numel()} priorities for {num} sampled "
                             "sequences; give one per sequence ([B])")
        if self._on_host and not self.validate and priorities.device.type == "cpu":
            self._apply_host(storage, batch_info, priorities)  # (the common case, straight to numpy)
            return
        priorities = priorities.detach().reshape(-1)
        if self.validate:
            low, high = (float(x) for x in torch.aminmax(priorities.float()))
            if not (low >= 0 and high < math.inf):  # (NaN fails both)
                raise ValueError(f"priorities must be finite and non-negative, got {priorities.tolist()}")
        if priorities.device.type == "cuda" and self.device.type == "cpu":
            self._deferred.push(batch_info, priorities)
            return
        self._apply(storage, batch_info, priorities)

    def _apply(self, storage: RingBuffer, batch_info: BatchInfo, priorities: torch.Tensor) -> None:
        """``update_priorities`` now, without a host sync: validity and "last write wins" are masks, so every entry
        is written (an ignored one writes back the priority its leaf already has)."""
        if self._on_host:
            self._apply_host(storage, batch_info, priorities)
            return
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
        stored = (priorities[winner] + self.eps).pow(_value(self.alpha))
        values = torch.where(valid[winner], stored, self._assigned[leaves])  # no valid entry: keep the priority
        self._assigned.index_copy_(0, leaves, values)
        self._refresh(write_count, oldest, leaves)
        # (A kept priority is <= the max priority, which never decreases: the max over ``values`` is the max over the
        # new priorities.)
        self._max_priority = torch.maximum(self._max_priority, values.max())

    def _apply_host(self, storage: RingBuffer, batch_info: BatchInfo, priorities: torch.Tensor) -> None:
        """``_apply`` of host trees: the same rules and the same values, on numpy arrays (``priorities`` on the CPU).

        The stored priorities are computed over the same ``[B]`` array as in ``_apply``, in the same order (entries
        sorted by leaf, each carrying its leaf's winner): torch's ``pow`` rounds differently in its vectorized body
        and in its scalar tail, so the layout of that array decides the last bit of the results. The usual case
        (every priority valid, every start still in the ring and drawable: always so for a batch just sampled, unless
        it was overwritten or cleared since) is checked with two min/max reductions each and skips the masks.
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
        self._num_ok_host += num_ok
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
        # For each distinct leaf its last valid entry wins, as in ``_apply``: sort by (leaf, rank), rank = entry
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
        torch.pow(buf.bases_t, _value(self.alpha), out=buf.stored_t)
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
            self._refresh_host(*self._counters_host(storage))
        # (A kept priority is <= the max priority, which never decreases: the max over the new priorities will do.)
        if values.size:
            np.maximum(self._max_np, values.max(), out=self._max_np)

    def _ranks(self, num: int) -> torch.Tensor:
        """``1, ..., num`` on ``device`` (cached: the batch size rarely changes)."""
        if self._rank_cache.numel() != num:
            self._rank_cache = torch.arange(1, num + 1, device=self.device)
        return self._rank_cache

    @property
    def invalid_priorities(self) -> torch.Tensor:
        """Priorities replaced by 0 since construction because they were NaN, infinite or negative: 0-dim int64 on
        ``device`` (reading its value is a host sync: read it when a summary is written)."""
        if self._on_host:
            return torch.tensor(self._num_seen - self._num_ok_host)
        return self._num_seen - self._num_ok

    def flush(self, storage: RingBuffer) -> None:
        """Apply the priority updates still in flight from the device, waiting for them (before a checkpoint)."""
        for batch_info, priorities in self._deferred.take_all():
            self._apply(storage, batch_info, priorities)

    # ---------------------------------------------------------------------------------------------- checkpointing --
    def state_dict(self) -> dict:
        """Tensors only: the trees, the assigned priorities, the max priority and the leaves awaiting a refresh (the
        write counts and oldest indices are the storage's, restored with it). Updates still in flight from the device
        are not included: ``flush`` first (``ReplayBuffer.state_dict`` does)."""
        if not self._dirty:
            dirty = torch.zeros(0, dtype=torch.int64)
        elif self._on_host:
            dirty = torch.from_numpy(np.concatenate(self._dirty))  # (a copy)
        else:
            dirty = torch.cat(self._dirty)
        state = {"sum_tree": self._sum.state_dict()["values"], "assigned": self._assigned.clone(),
                 "max_priority": self._max_priority.clone(), "dirty": dirty}
        if self._min is not None:
            state["min_tree"] = self._min.state_dict()["values"]
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore from ``state_dict``, after the storage was restored (its counters decide what is drawable)."""
        if "assigned" not in state:
            raise ValueError("the checkpoint's replay buffer has no priorities (it was sampled uniformly); resume it "
                             "with TrainerConfig.priority_replay=False, or start a new root_dir")
        if state["assigned"].numel() != self._assigned.numel():
            raise ValueError(f"the checkpoint's prioritized sampler has {state['assigned'].numel()} slots, this one "
                             f"{self._assigned.numel()} ({self.num_envs} envs x {self.capacity} steps): it was saved "
                             "with another num_envs or replay_buffer_length")
        self._deferred.clear()  # (updates computed for the priorities being replaced)
        self._sum.load_state_dict({"values": state["sum_tree"]})
        if self._min is not None:
            if "min_tree" in state:
                self._min.load_state_dict({"values": state["min_tree"]})
            else:  # saved without one: rebuild it from the assigned priorities of the drawable leaves
                drawable = self._sum.leaves() > 0
                leaves = torch.where(drawable, state["assigned"].to(self.device), float("inf"))
                self._min.update(torch.arange(leaves.numel(), device=self.device), leaves)
        self._assigned.copy_(state["assigned"])
        if self._on_host:
            self._max_priority.copy_(state["max_priority"])  # in place: ``_max_np`` is its memory
        else:
            self._max_priority = state["max_priority"].to(device=self.device, dtype=torch.float32).clone()
        # (A state from before "dirty" was saved had refreshed every leaf first.)
        dirty = state.get("dirty")
        if dirty is None or not dirty.numel():
            self._dirty = []
        elif self._on_host:
            self._dirty = [host_array(dirty, torch.int64).copy()]
        else:
            self._dirty = [dirty.to("cpu", torch.int64).clone()]
