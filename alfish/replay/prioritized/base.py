"""Prioritized sampling of sequence starts (Schaul et al. 2016) from a ``RingBuffer``: the contract and the shared part.

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
  costs about the same for 2 leaves as for a few hundred: it is a fixed number of calls per level, so adds between
  two samples share one). As the rule reads the ring's state when it runs, a late refresh is still exact.
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

Two implementations, one state. ``PrioritizedSampler(...)`` builds the one for its ``device``
(``segment_tree.runs_on_numpy``): ``HostPrioritizedSampler`` (``host.py``) for trees on the CPU, whose hot paths run on
numpy, and ``DevicePrioritizedSampler`` (``device.py``) for trees on any other device (CUDA, meta), which runs torch
code. Both compute the same float operations in the same order: a seeded run draws exactly the same batches and stores
exactly the same priorities on either, and their ``state_dict`` is the same (the tests run the torch code on the CPU,
``segment_tree.NUMPY_ON_CPU = False``, and compare the two bit for bit). This class holds what does not depend on the
implementation: the arguments and their checks, the trees and assigned priorities, the order of the checks of
``sample`` and ``update_priorities``, the deferral of device priorities, ``attach`` / ``on_clear`` and the checkpoint.

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
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from alfish.data.types import BatchInfo
from alfish.replay.deferred_priorities import DeferredPriorities
from alfish.replay.ring_buffer import RingBuffer
from alfish.replay.samplers import Sampler, check_length, too_few_steps
from alfish.replay.segment_tree import MinTree, SumTree, runs_on_numpy
from alfish.replay.transfer import canonical_device, host_to_device

Schedule = float | Callable[[], float]  # a number, or a schedule (alfish.schedulers) called for its value


def value_of(schedule: Schedule) -> float:
    """A float, or the current value of a schedule (``alfish.schedulers``: a zero-argument callable)."""
    return schedule() if callable(schedule) else schedule


@dataclass(frozen=True)
class PriorityOptions:
    """The keyword options of ``PrioritizedSampler`` (documented there), with their defaults; an unknown name raises
    ``TypeError`` as it would for a plain signature."""

    alpha: Schedule = 0.7
    beta: Schedule = 0.4
    eps: float = 1e-6
    normalize_by_max: bool = False
    max_over: str = "batch"
    initial_priority: float = 1.0
    validate: bool = False


class PrioritizedSampler(Sampler):
    """Priorities of the sequence starts of a ``RingBuffer(num_envs, capacity)``.

    ``PrioritizedSampler(...)`` returns the implementation for ``device``: a ``HostPrioritizedSampler`` for the CPU,
    a ``DevicePrioritizedSampler`` otherwise (see the module docstring); both are ``PrioritizedSampler``s.

    Args:
        num_envs, capacity: those of the ring.
        sequence_length: ``L``, the length of every sampled sequence (fixed: it decides which starts are drawable).
        device: of the trees, the weights and (for a device other than the CPU) the returned indices; see the module
            docstring for which placement fits which storage.
        generator: a CPU generator for the draws (public attribute ``generator``, so it can be reseeded); ``None``
            uses torch's global generator.
        **options: ``PriorityOptions``, each kept as a public attribute of the same name (``alpha``, ``beta`` and
            ``validate`` may be changed later):

            * alpha: exponent of the stored priority, a float or a zero-argument callable (a schedule) read at each
              update.
            * beta: exponent of the importance weights, a float or a schedule read at each ``sample``.
            * eps: added to a priority before the exponent, so no start ever gets probability 0.
            * normalize_by_max: divide the importance weights by their max (see ``max_over``); False (ALF's default)
              keeps ``(N * P(i)) ** -beta``.
            * max_over: ``"batch"`` (ALF's ``normalize_importance_weights_by_max``) or ``"buffer"`` (Schaul et al.:
              the max over all drawable starts; keeps a ``MinTree``).
            * initial_priority: lower bound of the priority given to new starts (stored scale).
            * validate: check every priority update on the host and raise on a priority that is not finite and >= 0
              (a host sync per update: for debugging). Off, such priorities are replaced by 0 (stored
              ``eps ** alpha``) and counted in ``invalid_priorities`` (a tensor, read when a summary is due).
    """

    on_host: bool  # set by each implementation: True for the one whose trees run on numpy (see ``__new__``)

    def __new__(cls, *args: Any, device: str | torch.device = "cpu", **kwargs: Any) -> PrioritizedSampler:
        """Called on this class, pick the implementation for ``device`` (by the trees' own rule,
        ``runs_on_numpy``); called on an implementation (or a subclass of one), build that."""
        if cls is PrioritizedSampler:
            on_host = runs_on_numpy(canonical_device(device))
            cls = next(impl for impl in PrioritizedSampler.__subclasses__()
                       if getattr(impl, "on_host", None) is on_host)
        return super().__new__(cls)

    def __init__(self, num_envs: int, capacity: int, sequence_length: int = 1, *,
                 device: str | torch.device = "cpu", generator: torch.Generator | None = None, **options: Any):
        opts = PriorityOptions(**options)
        if not 1 <= sequence_length <= capacity:
            raise ValueError(f"sequence_length must lie in [1, capacity={capacity}], got {sequence_length}")
        if opts.max_over not in ("batch", "buffer"):
            raise ValueError(f"max_over must be 'batch' or 'buffer', got {opts.max_over!r}")
        self.num_envs = num_envs
        self.capacity = capacity
        self.sequence_length = sequence_length
        self.alpha = opts.alpha
        self.beta = opts.beta
        self.eps = opts.eps
        self.normalize_by_max = opts.normalize_by_max
        self.max_over = opts.max_over
        self.device = canonical_device(device)
        self.generator = generator
        self.validate = opts.validate
        # With eps > 0 and a positive initial priority every drawable start has a positive priority, so the total is
        # positive whenever a start is drawable; otherwise sample checks it (a host sync).
        self._may_total_zero = opts.eps <= 0 or opts.initial_priority <= 0
        size = num_envs * capacity
        self._sum = SumTree(size, device=self.device)
        self._min = MinTree(size, device=self.device) if opts.normalize_by_max and opts.max_over == "buffer" else None
        self._assigned = torch.zeros(size, dtype=torch.float32, device=self.device)
        # The max stored priority, given to new starts (0-dim; the host implementation updates it in place).
        self._max_priority = torch.tensor(float(opts.initial_priority), dtype=torch.float32, device=self.device)
        # CPU leaves whose tree values await a refresh (from on_add): tensors, or numpy arrays for host trees.
        self._dirty: list = []
        self._deferred = DeferredPriorities()  # device priorities on their way to host trees
        self._num_seen = 0  # priorities seen by updates (see ``invalid_priorities``)

    # ----------------------------------------------------------------------------------- what each one implements --
    def _refresh(self, write_count: torch.Tensor, oldest: torch.Tensor, *leaves: torch.Tensor) -> None:
        """Apply the rule to ``leaves`` (CPU or ``device``) and the dirty ones: assigned priority if drawable, else
        0 / +inf. ``write_count`` and ``oldest`` ``[num_envs]`` are the ring's now, on ``device`` (``_counters``).
        Duplicates are harmless: every copy of a leaf gets the same value (so their order does not matter either)."""
        raise NotImplementedError

    def _sample(self, storage: RingBuffer, batch_size: int, num_batches: int = 1) -> BatchInfo:
        """``sample`` once its arguments are checked and the deferred updates applied."""
        raise NotImplementedError

    def _apply(self, storage: RingBuffer, batch_info: BatchInfo, priorities: torch.Tensor) -> None:
        """``update_priorities`` now (``priorities`` ``[B]`` of any shape with ``B`` entries, any device), without a
        host sync: validity and "last write wins" are masks."""
        raise NotImplementedError

    def _dirty_leaves(self) -> torch.Tensor:
        """The leaves awaiting a refresh, one CPU int64 tensor (a copy; the ``_dirty`` list is not empty)."""
        raise NotImplementedError

    def _restore_dirty(self, dirty: torch.Tensor) -> None:
        """``_dirty`` from a checkpoint's non-empty CPU int64 ``dirty`` (copied: the state is not shared)."""
        raise NotImplementedError

    @property
    def invalid_priorities(self) -> torch.Tensor:
        """Priorities replaced by 0 since construction because they were NaN, infinite or negative: 0-dim int64 on
        ``device`` (reading its value is a host sync: read it when a summary is written)."""
        raise NotImplementedError

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

    def _num_drawable(self, write_count: torch.Tensor, oldest: torch.Tensor) -> torch.Tensor:
        return (write_count - self.sequence_length + 1 - oldest).clamp(min=0).sum()

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
    def sample(self, storage: RingBuffer, batch_size: int, length: int, num_batches: int = 1) -> BatchInfo:
        """``batch_size`` sequence starts, drawn with probability proportional to their stored priority.

        Stratified: ``[0, total)`` is split into ``batch_size`` equal segments and one uniform target is drawn in each
        (ALF's sampling without replacement): ``batch_size`` float64 draws from ``generator``, one call per sample.
        ``num_batches`` mini-batches at once: each block of ``batch_size`` stratified on its own, the importance
        weights of each normalized on their own (``max_over='batch'``); the same priorities serve every block.

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
        return self._sample(storage, batch_size, num_batches)

    def _check_drawable(self, storage: RingBuffer) -> None:
        """Raise unless ``storage`` holds a sequence (Python ints once enough is stored: no tensor is read)."""
        if not storage.holds_sequence(self.sequence_length):
            raise too_few_steps(storage.num_stored(), self.sequence_length)

    def _check_total(self, total: torch.Tensor | float) -> None:
        """Raise if every drawable start has priority 0 (a host sync for a device total, only with eps = 0 or
        initial_priority = 0)."""
        if self._may_total_zero and not total > 0:
            raise RuntimeError("every drawable start has priority 0 (eps=0 and zero priorities): nothing to sample")

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
        if self.validate:
            low, high = (float(x) for x in torch.aminmax(priorities.detach().float()))
            if not (low >= 0 and high < math.inf):  # (NaN fails both)
                raise ValueError(f"priorities must be finite and non-negative, got {priorities.reshape(-1).tolist()}")
        if priorities.device.type == "cuda" and self.device.type == "cpu":
            self._deferred.push(batch_info, priorities.detach().reshape(-1))
            return
        self._apply(storage, batch_info, priorities)

    def flush(self, storage: RingBuffer) -> None:
        """Apply the priority updates still in flight from the device, waiting for them (before a checkpoint)."""
        for batch_info, priorities in self._deferred.take_all():
            self._apply(storage, batch_info, priorities)

    # ---------------------------------------------------------------------------------------------- checkpointing --
    def state_dict(self) -> dict:
        """Tensors only: the trees, the assigned priorities, the max priority and the leaves awaiting a refresh (the
        write counts and oldest indices are the storage's, restored with it). Updates still in flight from the device
        are not included: ``flush`` first (``ReplayBuffer.state_dict`` does)."""
        dirty = self._dirty_leaves() if self._dirty else torch.zeros(0, dtype=torch.int64)
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
        self._max_priority.copy_(state["max_priority"])  # in place: the host implementation reads its memory
        # (A state from before "dirty" was saved had refreshed every leaf first.)
        dirty = state.get("dirty")
        if dirty is None or not dirty.numel():
            self._dirty = []
        else:
            self._restore_dirty(dirty)
