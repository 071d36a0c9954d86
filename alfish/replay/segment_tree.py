"""Segment trees over a flat tensor: batched leaf updates, sum / min summaries and prefix-sum search.

Layout: one tensor of ``2 * P`` nodes, ``P`` the smallest power of two ``>= capacity`` (heap order: the children of
node ``i`` are ``2i`` and ``2i + 1``; level ``d`` holds nodes ``[2**d, 2**(d+1))``; leaf ``j`` is node ``P + j``).
Leaves ``[capacity, P)`` and all nodes start at the operation's neutral element (0 for a sum, ``+inf`` for a min), so
they never change a summary.

What is kept up to date: the levels from the leaves (level ``depth = log2(P)``) up to level ``top = min(TOP_LEVEL,
depth)``, each node ``op(left child, right child)``. The root and the levels above ``top`` are not maintained: the
summary (``total`` / ``min``) is one reduction over the at most ``2**TOP_LEVEL`` nodes of level ``top``, and
prefix-sum search starts with one search over that level. On CPU every torch call costs a few microseconds whatever
its size up to a few thousand elements, so the number of calls is what counts: this saves one call per level above
``top`` on every update (12 of 20 levels for 1M leaves) without costing any on a read. Nodes ``[1, 2**top)`` are
unused (at most 4,095 entries).

Updates recompute the parents level by level from the two children (never patched by a delta), so a sum tree does not
drift however many updates it sees; float64 keeps sums exact to ~1e-16 relative over millions of leaves. Nothing loops
over the entries of a batch in Python, and nothing reads a value back to the host (except the bounds check of
``update`` on CPU, where reading is free).
"""
from __future__ import annotations

import torch

TOP_LEVEL = 12  # the highest maintained level: 4,096 nodes, searched and reduced whole (fastest measured on CPU)
DESCENT_LEVELS = 5  # below it, prefix-sum search descends 5 levels per step (32 nodes per fetch; fastest measured)


def last_write_wins(indices: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Resolve duplicate ``indices`` ``[N]``: every copy of an index carries the value of its last occurrence.

    Returns the indices sorted and the matching values, so a scatter gives the same result whichever copy the backend
    writes last (``index_copy_`` and ``index_put_`` leave that order unspecified). Costs a sort and a search; no sync.
    """
    if indices.numel() <= 1:
        return indices, values
    indices, order = torch.sort(indices, stable=True)
    last = torch.searchsorted(indices, indices, right=True) - 1  # the last entry of each run of equal indices
    return indices, values[order[last]]


class SegmentTree:
    """A binary tree over ``capacity`` leaves whose node ``i`` holds ``op(node 2i, node 2i+1)`` (see the module
    docstring for which levels are kept); the leaves are set with ``update``.

    Args:
        capacity: number of leaves that can be set (indices ``[0, capacity)``).
        neutral: the value of an unset leaf (``op(x, neutral) == x``).
        dtype, device: of the node tensor.
    """

    def __init__(self, capacity: int, neutral: float, dtype: torch.dtype, device: str | torch.device = "cpu"):
        if capacity < 1:
            raise ValueError(f"a segment tree needs capacity >= 1, got {capacity}")
        self.capacity = capacity
        self.num_leaves = 1 << (capacity - 1).bit_length()  # P, a power of two >= capacity
        self.depth = self.num_leaves.bit_length() - 1  # log2(P): the level of the leaves (the root is level 0)
        self.top = min(TOP_LEVEL, self.depth)  # the highest maintained level
        self.neutral = neutral
        self.device = torch.device(device)
        self._values = torch.full((2 * self.num_leaves,), neutral, dtype=dtype, device=self.device)
        self._top_nodes = self._values[1 << self.top:2 << self.top]  # a view of level ``top``
        self._shifts = torch.arange(0, self.depth - self.top + 1, device=self.device).unsqueeze(1)

    @property
    def dtype(self) -> torch.dtype:
        return self._values.dtype

    def _op(self, left: torch.Tensor, right: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The value of a parent from its two children (elementwise)."""
        raise NotImplementedError

    def _reduce(self, nodes: torch.Tensor) -> torch.Tensor:
        """``op`` over a 1-D tensor of nodes."""
        raise NotImplementedError

    def update(self, indices: torch.Tensor, values: torch.Tensor, validate: bool = True) -> None:
        """Set leaves ``indices`` ``[N]`` to ``values`` ``[N]`` and recompute their ancestors up to level ``top``.

        Duplicate indices in one call: the last write wins (the values are resolved before anything is written, so the
        result does not depend on the order in which the backend scatters).

        ``validate=False`` skips the bounds check and the duplicate resolution, for callers that guarantee indices in
        range whose duplicates (if any) carry equal values (e.g. after ``last_write_wins``).
        """
        nodes = indices.reshape(-1).to(device=self.device, dtype=torch.int64)
        values = values.reshape(-1).to(device=self.device, dtype=self.dtype)
        if nodes.shape != values.shape:
            raise ValueError(f"indices and values must have the same number of elements, got {tuple(nodes.shape)} "
                             f"and {tuple(values.shape)}")
        if nodes.numel() == 0:
            return
        if validate:
            if self.device.type == "cpu":
                low, high = (int(x) for x in torch.aminmax(nodes))
                if low < 0 or high >= self.capacity:
                    raise IndexError(f"leaf indices must lie in [0, {self.capacity}), got [{low}, {high}]")
            nodes, values = last_write_wins(nodes, values)
        if nodes.numel() * self.depth > self.num_leaves:
            # A bulk write (e.g. forgetting a cleared buffer): cheaper to recompute every level than to walk the paths.
            self._values[self.num_leaves:].index_copy_(0, nodes, values)
            self.rebuild()
            return
        nodes = nodes + self.num_leaves
        self._values.index_copy_(0, nodes, values)
        # The path of every touched leaf up to level ``top``, all levels at once: row d holds the nodes d levels up,
        # and the left / right children of row d + 1 (row d with its lowest bit cleared / set). Repeated parents are
        # harmless (every copy writes the same recomputed value) and cheaper than a unique per level, which would sort.
        path = nodes.unsqueeze(0) >> self._shifts  # [depth - top + 1, N]
        lefts, rights = path[:-1] & -2, path[:-1] | 1
        v = self._values
        for parents, left, right in zip(path[1:], lefts, rights):  # bottom-up, one level per step
            v.index_copy_(0, parents, self._op(v.index_select(0, left), v.index_select(0, right)))

    def rebuild(self) -> None:
        """Recompute the maintained internal levels from the leaves, one vectorized op per level."""
        v = self._values
        for level in range(self.depth - 1, self.top - 1, -1):
            lo = 1 << level
            self._op(v[2 * lo:4 * lo:2], v[2 * lo + 1:4 * lo:2], out=v[lo:2 * lo])

    def get(self, indices: torch.Tensor) -> torch.Tensor:
        """Values of leaves ``indices`` (any shape)."""
        return self._values[indices.to(device=self.device, dtype=torch.int64) + self.num_leaves]

    def leaves(self) -> torch.Tensor:
        """All ``capacity`` leaf values (a view)."""
        return self._values[self.num_leaves:self.num_leaves + self.capacity]

    def summary(self) -> torch.Tensor:
        """``op`` over all leaves: a 0-dim tensor, reduced from level ``top`` (no host sync)."""
        return self._reduce(self._top_nodes)

    def state_dict(self) -> dict:
        return {"values": self._values.clone()}

    def load_state_dict(self, state: dict) -> None:
        values = state["values"]
        if values.shape != self._values.shape:
            raise ValueError(f"segment tree state has {values.shape[0]} nodes, this tree has {self._values.shape[0]} "
                             f"(capacity {self.capacity})")
        self._values.copy_(values)


class SumTree(SegmentTree):
    """Sum over the leaves (float64 by default) and prefix-sum search: the sampling structure of prioritized replay.

    Leaves must be non-negative (not checked in the hot path).
    """

    def __init__(self, capacity: int, dtype: torch.dtype = torch.float64, device: str | torch.device = "cpu"):
        super().__init__(capacity, 0.0, dtype, device)
        below = self.depth - self.top
        k, r = DESCENT_LEVELS, below % DESCENT_LEVELS
        self._descent_steps = ([r] if r else []) + [k] * (below // k)  # levels per step under ``top``, top first
        # The direction for nextafter, made once: torch.tensor(-1.0, device=cuda) would be a blocking copy per search.
        self._below = torch.full((), -1.0, dtype=dtype, device=self.device)

    def _op(self, left: torch.Tensor, right: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return torch.add(left, right, out=out)

    def _reduce(self, nodes: torch.Tensor) -> torch.Tensor:
        return nodes.sum()

    def total(self) -> torch.Tensor:
        """Sum of all leaves (0-dim)."""
        return self.summary()

    def find_prefix_sum(self, targets: torch.Tensor) -> torch.Tensor:
        """For each target in ``[0, total)``, the smallest leaf ``i`` with ``leaf[0] + ... + leaf[i] > target``.

        All targets descend together: first one search over the cumulative sums of level ``top``, then steps of ``k``
        levels (``k = DESCENT_LEVELS``, the first step takes the remainder): the ``2**k`` descendants of a node ``k``
        levels down are contiguous in the heap layout, so one ``index_select`` fetches them, their cumulative sums
        locate the child the target falls in, and the sum left of it is subtracted. That is the binary descent (go
        left if the target is below the left child's sum, else go right and subtract), ``k`` levels per torch call.

        A target never enters a subtree whose sum is 0: it is kept below each step's total, so the returned leaf is
        always positive even when rounding puts a target on a boundary. Targets below 0 are treated as 0 and targets
        ``>= total`` return the last positive leaf. The tree must have a positive total.

        Args:
            targets: ``[N]`` floats (converted to the tree's dtype).
        Returns:
            int64 leaf indices, shaped like ``targets``.
        """
        t = targets.reshape(-1, 1).to(device=self.device, dtype=self.dtype).clamp(min=0)  # [N, 1]
        below = self._below  # direction for nextafter
        # Level ``top`` as one wide node: the same rule as the steps below.
        level = self._top_nodes
        cum = level.cumsum(0)
        t = torch.minimum(t, torch.nextafter(cum[-1], below))
        j = torch.searchsorted(cum, t, right=True)  # [N, 1]
        t = (t - cum[j] + level[j]).clamp(min=0)
        nodes = j.squeeze(1) + (1 << self.top)
        for k in self._descent_steps:
            width = 1 << k
            sums = self._values.view(-1, width).index_select(0, nodes)  # [N, 2**k]: the nodes k levels below
            cum = sums.cumsum(1)
            t = torch.minimum(t, torch.nextafter(cum[:, -1:], below))  # strictly below this subtree's sum
            # The first j with cum[j] > t: sums[j] > 0 (cum[j - 1] <= t < cum[j]), so a zero subtree is never entered.
            j = torch.searchsorted(cum, t, right=True)  # [N, 1]
            t = (t - cum.gather(1, j) + sums.gather(1, j)).clamp(min=0)  # minus the sum left of child j
            nodes = torch.add(j.squeeze(1), nodes, alpha=width)  # width * node + j
        return (nodes - self.num_leaves).reshape(targets.shape)


class MinTree(SegmentTree):
    """Minimum over the leaves (float32 by default); unset leaves are ``+inf``."""

    def __init__(self, capacity: int, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        super().__init__(capacity, float("inf"), dtype, device)

    def _op(self, left: torch.Tensor, right: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return torch.minimum(left, right, out=out)

    def _reduce(self, nodes: torch.Tensor) -> torch.Tensor:
        return nodes.amin()

    def min(self) -> torch.Tensor:
        """Minimum of all leaves (0-dim; ``+inf`` when no leaf is set)."""
        return self.summary()
