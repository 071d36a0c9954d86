"""Prioritized sampling of sequence starts (Schaul et al. 2016) next to a ``RingBuffer``.

The sampler keeps one priority per ring slot, for the sequence that *starts* there; leaf ``env_id * capacity + slot``
of a ``SumTree`` (and of a ``MinTree`` when weights are normalized by the buffer's max). It never touches the ring: the
owner calls ``on_add`` for every ``RingBuffer.add`` and passes the ring to ``sample``.

Drawable starts. A sequence of ``L = sequence_length`` steps starting at absolute index ``p`` of env ``e`` can be drawn
iff ``oldest(e) <= p <= write_count(e) - L``: all its steps are readable (``oldest`` is ``RingBuffer.oldest_index``,
which moves on overwrite and on ``clear``) and it does not run past the newest step. Every slot has an *assigned*
priority (``self._assigned``), and the one rule is: a tree leaf holds its slot's assigned priority while the start
written there last is drawable, else 0 (``+inf`` in the min tree). So the trees only ever see drawable starts.
A leaf is refreshed by that rule (from the write counts and oldest indices) whenever its drawability or priority may
have changed, which happens in three places only:

* ``on_add`` (step ``w`` of env ``e`` written): slot ``w`` gets the max priority seen so far as its assigned priority
  and is not drawable yet (unless ``L == 1``); the same write makes start ``w - L + 1`` drawable. Slot ``w`` was the
  slot of ``w - capacity``, which is gone. So each add dirties 2 leaves per env. They are refreshed in one batch at the
  next ``sample`` / ``update_priorities`` (a tree update costs about the same for 2 leaves as for a few hundred: it is
  a fixed number of torch calls per level, so adds between two samples share one).
* ``sync`` (run by ``sample``): starts below the ring's oldest index after ``RingBuffer.clear`` are refreshed (to 0).
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
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Union

import torch

from alfish.data.types import BatchInfo, Experience
from alfish.replay.ring_buffer import RingBuffer
from alfish.replay.segment_tree import MinTree, SumTree, last_write_wins

Schedule = Union[float, Callable[[], float]]


class PrioritizedSampler:
    """Priorities of the sequence starts of a ``RingBuffer(num_envs, capacity)``.

    Args:
        num_envs, capacity: those of the ring.
        sequence_length: ``L``, the length of every sampled sequence (fixed: it decides which starts are drawable).
        alpha: exponent of the stored priority, a float or a zero-argument callable (a schedule) read at each update.
        eps: added to a priority before the exponent, so no start ever gets probability 0.
        initial_priority: lower bound of the priority given to new starts (stored scale).
        normalize_by_max: divide the importance weights by their max (see ``max_over``); False (ALF's default) keeps
            ``(N * P(i)) ** -beta``.
        max_over: ``"batch"`` (ALF's ``normalize_importance_weights_by_max``) or ``"buffer"`` (Schaul et al.: the max
            over all drawable starts; keeps a ``MinTree``).
        device: of the trees and the weights. Bookkeeping (write counts) and the returned indices stay on the CPU,
            like the ring's counters.
    """

    def __init__(self, num_envs: int, capacity: int, sequence_length: int = 1, alpha: Schedule = 0.7,
                 eps: float = 1e-6, initial_priority: float = 1.0, normalize_by_max: bool = False,
                 max_over: str = "batch", device: str | torch.device = "cpu"):
        if not 1 <= sequence_length <= capacity:
            raise ValueError(f"sequence_length must lie in [1, capacity={capacity}], got {sequence_length}")
        if max_over not in ("batch", "buffer"):
            raise ValueError(f"max_over must be 'batch' or 'buffer', got {max_over!r}")
        self.num_envs = num_envs
        self.capacity = capacity
        self.sequence_length = sequence_length
        self.alpha = alpha
        self.eps = eps
        self.normalize_by_max = normalize_by_max
        self.max_over = max_over
        self.device = torch.device(device)
        size = num_envs * capacity
        self._sum = SumTree(size, device=self.device)
        self._min = MinTree(size, device=self.device) if normalize_by_max and max_over == "buffer" else None
        self._assigned = torch.zeros(size, dtype=torch.float32, device=self.device)
        self._max_priority = torch.tensor(float(initial_priority), dtype=torch.float32, device=self.device)
        self._write_count = torch.zeros(num_envs, dtype=torch.int64)  # as the ring's, from on_add
        self._floor = torch.zeros(num_envs, dtype=torch.int64)  # the ring's oldest index as of the last sync
        self._dirty: list[torch.Tensor] = []  # CPU leaves whose tree values await a refresh (from on_add)

    # ----------------------------------------------------------------------------------------------- bookkeeping --
    def _oldest(self) -> torch.Tensor:
        return torch.maximum(self._write_count - self.capacity, self._floor)

    def _leaves(self, env_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return env_ids * self.capacity + torch.remainder(positions, self.capacity)

    def _positions(self, leaves: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(env, absolute index of the step written last at the leaf's slot) for CPU ``leaves``."""
        env_ids = leaves // self.capacity
        last = self._write_count[env_ids] - 1  # the newest index of the env; its slot is last % capacity
        return env_ids, last - torch.remainder(last - leaves, self.capacity)  # in (last - capacity, last]

    def _refresh(self, *leaves: torch.Tensor) -> None:
        """Apply the rule to CPU ``leaves`` and the dirty ones: assigned priority if drawable, else 0 / +inf.

        Duplicates are harmless: every copy of a leaf gets the same value.
        """
        pending, self._dirty = self._dirty + list(leaves), []
        if not pending:
            return
        leaves = torch.cat(pending) if len(pending) > 1 else pending[0]
        env_ids, positions = self._positions(leaves)
        drawable = (positions >= self._oldest()[env_ids]) & (
            positions <= self._write_count[env_ids] - self.sequence_length)
        leaves, drawable = leaves.to(self.device), drawable.to(self.device)
        values = self._assigned[leaves]
        self._sum.update(leaves, torch.where(drawable, values, 0.0), validate=False)
        if self._min is not None:
            self._min.update(leaves, torch.where(drawable, values, float("inf")), validate=False)

    def num_drawable(self) -> torch.Tensor:
        """Number of drawable starts, summed over envs (0-dim int64, CPU)."""
        return (self._write_count - self.sequence_length + 1 - self._oldest()).clamp(min=0).sum()

    def on_add(self, env_ids: torch.Tensor, write_counts_before: Optional[torch.Tensor] = None) -> None:
        """Record that ``RingBuffer.add`` wrote one step to each of ``env_ids`` ``[B]`` (unique), at the absolute
        indices ``write_counts_before`` ``[B]`` (the ring's write counts of those envs before the add; by default the
        sampler's own count, which ``sample`` checks against the ring)."""
        env = env_ids.to("cpu", torch.int64)
        w = self._write_count[env] if write_counts_before is None else write_counts_before.to("cpu", torch.int64)
        self._write_count[env] = w + 1
        new = self._leaves(env, w)
        self._assigned[new.to(self.device)] = self._max_priority
        self._dirty.append(new)
        if self.sequence_length > 1:  # the start that now ends at the newest step (a negative one is no start)
            self._dirty.append(self._leaves(env, w - (self.sequence_length - 1)))
        if len(self._dirty) >= 512:  # a long collection without sampling: keep the backlog bounded
            self._refresh()

    def sync(self, ring: RingBuffer) -> None:
        """Refresh the leaves dirtied by ``on_add`` and follow ``ring.clear`` (starts below the ring's oldest index
        are no longer drawable).

        Also checks that ``on_add`` saw every add (the write counts agree). ``sample`` calls it; call it directly to do
        the (one-off, possibly large) work right after a clear.
        """
        oldest = ring.oldest_index()
        mine = self._oldest()
        if torch.equal(oldest, mine) and torch.equal(ring.num_stored(), self._write_count - oldest):
            self._refresh()  # the usual case: no clear, no missed add
            return
        if not torch.equal(oldest + ring.num_stored(), self._write_count):
            raise RuntimeError(f"the prioritized sampler saw {self._write_count.tolist()} writes per env, the ring "
                               f"holds {(oldest + ring.num_stored()).tolist()}: call on_add for every RingBuffer.add")
        if bool((oldest < mine).any()):
            raise RuntimeError(f"the ring's oldest indices {oldest.tolist()} are below the sampler's {mine.tolist()}: "
                               f"restore the sampler together with the ring")
        # Starts in [mine, oldest) are gone; only those that could have been drawable (<= write_count - L) matter.
        stop = torch.minimum(oldest, self._write_count - self.sequence_length + 1)
        counts = (stop - mine).clamp(min=0)
        self._floor = oldest
        total = int(counts.sum())
        if total > 0:
            env = torch.repeat_interleave(torch.arange(self.num_envs), counts)
            first = torch.repeat_interleave(mine - (torch.cumsum(counts, 0) - counts), counts)
            self._refresh(self._leaves(env, first + torch.arange(total)))
        else:
            self._refresh()

    # ------------------------------------------------------------------------------------------------- sampling --
    def sample(self, batch_size: int, length: int, ring: RingBuffer, beta: Schedule,
               generator: Optional[torch.Generator] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``batch_size`` sequence starts, drawn with probability proportional to their stored priority.

        Stratified: ``[0, total)`` is split into ``batch_size`` equal segments and one uniform target is drawn in each
        (ALF's sampling without replacement). ``generator`` (a CPU generator) makes the draws reproducible.

        Returns:
            env_ids, positions: int64 ``[batch_size]`` (CPU), absolute start indices as ``RingBuffer.gather`` expects.
            importance_weights: float32 ``[batch_size]``, see the module docstring.
        """
        if length != self.sequence_length:
            raise ValueError(f"this prioritized sampler draws sequences of sequence_length={self.sequence_length} "
                             f"(fixed at construction), asked for length={length}")
        self.sync(ring)
        n = self.num_drawable()
        if int(n) == 0:
            raise RuntimeError(f"the replay buffer holds {ring.num_stored().tolist()} steps per env, too few for "
                               f"sequences of mini_batch_length={length}; collect more (initial_collect_steps)")
        total = self._sum.total()
        if not bool(total > 0):
            raise RuntimeError("every drawable start has priority 0 (eps=0 and zero priorities): nothing to sample")
        u = torch.rand(batch_size, generator=generator, dtype=torch.float64).to(self.device)
        targets = (torch.arange(batch_size, dtype=torch.float64, device=self.device) + u) * (total / batch_size)
        leaves = self._sum.find_prefix_sum(targets)
        p = self._sum.get(leaves)
        env_ids, positions = self._positions(leaves.cpu())

        beta = beta() if callable(beta) else beta
        weights = (n.to(self.device) * p / total).pow(-beta)
        if self.normalize_by_max:
            if self.max_over == "batch":
                weights = weights / weights.max()
            else:
                weights = (p / self._min.min()).pow(-beta)  # == weights / (N * p_min / total) ** -beta
        return env_ids, positions, weights.float()

    def sample_batch(self, ring: RingBuffer, batch_size: int, beta: Schedule,
                     generator: Optional[torch.Generator] = None) -> tuple[Experience, BatchInfo]:
        """``sample`` + ``ring.gather``: sequences ``[batch_size, sequence_length]`` and their ``BatchInfo``."""
        env_ids, positions, weights = self.sample(batch_size, self.sequence_length, ring, beta, generator)
        exp = ring.gather(env_ids, positions, self.sequence_length)
        return exp, BatchInfo(env_ids=env_ids, positions=positions, importance_weights=weights)

    # ------------------------------------------------------------------------------------------------- updating --
    def update_priorities(self, env_ids: torch.Tensor, positions: torch.Tensor, priorities: torch.Tensor,
                          ring: Optional[RingBuffer] = None) -> None:
        """Set the priority of the starts ``(env_ids, positions)`` (as returned by ``sample``) to ``priorities``.

        Stored: ``(priority + eps) ** alpha``; the max stored priority (given to new starts) is updated. Starts that
        were overwritten since they were sampled (``position < oldest index`` of their env) are ignored, so a slow
        update never gives an old priority to a new step. The oldest indices are the ones of the last ``sync``
        (every ``sample``); pass ``ring`` to sync first. Duplicate starts: the last one wins.
        Priorities must be finite and >= 0 (checked on CPU).
        """
        env = env_ids.to("cpu", torch.int64).reshape(-1)
        pos = positions.to("cpu", torch.int64).reshape(-1)
        if ring is not None:
            self.sync(ring)
        valid = (pos >= self._oldest()[env]) & (pos < self._write_count[env])
        keep = valid.nonzero().squeeze(1)
        if keep.numel() == 0:
            return
        if keep.numel() < env.numel():
            env, pos = env[keep], pos[keep]
        # Resolve duplicates on the CPU: for each distinct leaf (sorted), the entry of its last occurrence.
        leaves, keep = last_write_wins(self._leaves(env, pos), keep)
        priorities = priorities.detach().reshape(-1).to(device=self.device, dtype=torch.float32)
        if self.device.type == "cpu":
            low, high = (float(x) for x in torch.aminmax(priorities))
            if not (low >= 0 and high < math.inf):  # (NaN fails both)
                raise ValueError(f"priorities must be finite and non-negative, got {priorities.tolist()}")
        alpha = self.alpha() if callable(self.alpha) else self.alpha
        stored = (priorities[keep.to(self.device)] + self.eps).pow(alpha)
        self._assigned.index_copy_(0, leaves.to(self.device), stored)  # copies of a leaf carry the same value
        self._refresh(leaves)
        self._max_priority = torch.maximum(self._max_priority, stored.max())

    # ---------------------------------------------------------------------------------------------- checkpointing --
    def state_dict(self) -> dict:
        """Tensors only: the trees, the assigned priorities, the max priority and the write counters."""
        self._refresh()
        state = {"sum_tree": self._sum.state_dict()["values"], "assigned": self._assigned.clone(),
                 "max_priority": self._max_priority.clone(), "write_count": self._write_count.clone(),
                 "floor": self._floor.clone()}
        if self._min is not None:
            state["min_tree"] = self._min.state_dict()["values"]
        return state

    def load_state_dict(self, state: dict) -> None:
        self._sum.load_state_dict({"values": state["sum_tree"]})
        if self._min is not None:
            if "min_tree" in state:
                self._min.load_state_dict({"values": state["min_tree"]})
            else:  # saved without one: rebuild it from the assigned priorities of the drawable leaves
                drawable = self._sum.leaves() > 0
                leaves = torch.where(drawable, state["assigned"].to(self.device), float("inf"))
                self._min.update(torch.arange(leaves.numel(), device=self.device), leaves)
        self._assigned.copy_(state["assigned"])
        self._max_priority = state["max_priority"].to(device=self.device, dtype=torch.float32).clone()
        self._write_count = state["write_count"].to("cpu", torch.int64).clone()
        self._floor = state["floor"].to("cpu", torch.int64).clone()
        self._dirty = []
