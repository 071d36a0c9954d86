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

Trees on the CPU: numpy. At these sizes (a few hundred indices, a few thousand nodes) the fixed cost of a call is the
whole cost of an operation, and a numpy call costs about a third of a torch call (no dispatcher, no TensorIterator
set-up, no autograd checks). So a tree on the CPU keeps its nodes in a tensor and a numpy array that share one buffer,
and runs the hot operations on the array: the path updates (``update_host``), ``get_host`` and prefix-sum search
(``find_prefix_sum_host``), which take and return numpy arrays (``HostPrioritizedSampler`` calls them directly; the
torch-facing ``update`` / ``get`` / ``find_prefix_sum`` convert and call them). The tensor stays the tree's state:
``state_dict``, ``load_state_dict`` (in place), ``rebuild``, ``leaves`` and ``summary`` are the same code on every
device, and so is a tree on any other device (CUDA, meta), which runs the torch code below. The two paths compute the
same float operations in the same order, so they give bit-identical nodes, totals and searched leaves. Two steps stay
torch calls on the host for that reason (writing into buffers that numpy reads, so no conversion per call): the
reduction of ``summary`` (torch's vectorized sum does not round like numpy's pairwise sum) and the cumulative sums of
prefix-sum search (both libraries add sequentially there, but torch's CPU ``cumsum`` is 2-4x faster than numpy's).
"""
from __future__ import annotations

import numpy as np
import torch

TOP_LEVEL = 12  # the highest maintained level: 4,096 nodes, searched and reduced whole (fastest measured on CPU)
# Host trees (``update_host``): one step up a path (a random read and write of the tree, often a cache miss) costs
# about as much as this many node updates of ``rebuild`` (a sequential pass). Measured on this CPU, 2**14 to 2**22
# leaves: e.g. 2**20 leaves (8 walked levels), rebuild 0.64 ms, the paths of 16k sorted leaves 0.46 ms, of 32k 0.89 ms;
# the crossover lies near num * walked levels * 5 = leaves.
HOST_PATH_STEP_COST = 5
DESCENT_LEVELS = 5  # below it, prefix-sum search descends 5 levels per step (32 nodes per fetch; fastest measured)
_MAX_SEARCH_BUFFERS = 4  # batch sizes whose search buffers a host SumTree keeps (the batch size rarely changes)
# Trees on the CPU run the numpy paths (read at construction; tests set it False to run the torch code on CPU tensors
# and compare the two paths bit for bit).
NUMPY_ON_CPU = True


def runs_on_numpy(device: torch.device) -> bool:
    """Whether a tree on ``device`` runs its hot paths on numpy: on the CPU, unless tests switched it off
    (``NUMPY_ON_CPU``, read at each call). ``PrioritizedSampler`` picks its implementation by the same rule."""
    return NUMPY_ON_CPU and device.type == "cpu"


def host_view(x: torch.Tensor) -> np.ndarray:
    """The numpy array over the memory of CPU tensor ``x`` (no copy; a tensor that requires grad is detached).

    Only for tensors on the CPU, where reading costs nothing and never waits for a device: a tensor on any other
    device raises ``ValueError``. That is also why it runs with torch function dispatch disabled when a torch function
    mode is active, so that ``alfish.learn.sync_debug.SyncCounter`` does not record it as a ``numpy`` read: the
    counter flags ``.numpy()`` because the same code on a GPU run would read a device tensor, and the host paths that
    call this one only ever get CPU tensors (host trees, CPU counters, CPU indices), on a GPU run too.
    """
    if not x.is_cpu:
        raise ValueError(f"host_view needs a CPU tensor, got one on {x.device}")
    if x.requires_grad:
        x = x.detach()
    if torch._C._is_torch_function_mode_enabled():
        with torch._C.DisableTorchFunction():
            return x.numpy()
    return x.numpy()


def host_array(x: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """``x`` as a 1-D numpy array of ``dtype``: a view for a CPU tensor of that dtype (the usual case), else a copy
    made by torch (``x.to``, so the conversion rounds as the torch path does; from another device it is a blocking
    copy, as the ``.to('cpu')`` of the torch path is). ``host_view``'s rules, inlined (it runs on every call)."""
    if x.dtype is not dtype or not x.is_cpu:
        x = x.detach().to("cpu", dtype)
    elif x.requires_grad:
        x = x.detach()
    if torch._C._is_torch_function_mode_enabled():
        with torch._C.DisableTorchFunction():
            a = x.numpy()
    else:
        a = x.numpy()
    return a if a.ndim == 1 else a.reshape(-1)


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


def last_write_wins_host(indices: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``last_write_wins`` on numpy arrays (numpy's fancy assignment does not specify which duplicate wins either)."""
    if indices.size <= 1:
        return indices, values
    order = np.argsort(indices, kind="stable")
    indices = indices[order]
    last = np.searchsorted(indices, indices, side="right") - 1  # the last entry of each run of equal indices
    return indices, values[order[last]]


class SegmentTree:
    """A binary tree over ``capacity`` leaves whose node ``i`` holds ``op(node 2i, node 2i+1)`` (see the module
    docstring for which levels are kept); the leaves are set with ``update``.

    Args:
        capacity: number of leaves that can be set (indices ``[0, capacity)``).
        neutral: the value of an unset leaf (``op(x, neutral) == x``).
        dtype, device: of the node tensor. On the CPU the tree also runs its hot paths on a numpy view of it (see the
            module docstring).
    """

    _np_op: np.ufunc  # ``op`` as a numpy ufunc (the host path)

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
        self.on_host = runs_on_numpy(self.device)  # numpy hot paths (see the module docstring)
        if self.on_host:
            self._np = host_view(self._values)  # the same memory: every write through either is seen by the other
            self._np_shifts = np.arange(0, self.depth - self.top + 1).reshape(-1, 1)  # as ``_shifts``
            # ``summary`` reduces into this 0-d tensor, read by ``summary_host`` through its numpy view.
            self._summary_np = np.zeros((), dtype=self._np.dtype)
            self._summary_out = torch.from_numpy(self._summary_np)

    @property
    def dtype(self) -> torch.dtype:
        return self._values.dtype

    def _op(self, left: torch.Tensor, right: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The value of a parent from its two children (elementwise)."""
        raise NotImplementedError

    def _reduce(self, nodes: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``op`` over a 1-D tensor of nodes (into the 0-d ``out`` if given)."""
        raise NotImplementedError

    def update(self, indices: torch.Tensor, values: torch.Tensor, validate: bool = True) -> None:
        """Set leaves ``indices`` ``[N]`` to ``values`` ``[N]`` and recompute their ancestors up to level ``top``.

        Duplicate indices in one call: the last write wins (the values are resolved before anything is written, so the
        result does not depend on the order in which the backend scatters).

        ``validate=False`` skips the bounds check and the duplicate resolution, for callers that guarantee indices in
        range whose duplicates (if any) carry equal values (e.g. after ``last_write_wins``).

        A tree on the CPU converts the tensors (a view when they are CPU tensors of the right dtypes) and runs
        ``update_host``.
        """
        if self.on_host:
            nodes, values_np = host_array(indices, torch.int64), host_array(values, self.dtype)
            if nodes.shape != values_np.shape:
                raise ValueError(f"indices and values must have the same number of elements, got {nodes.shape} "
                                 f"and {values_np.shape}")
            self.update_host(nodes, values_np, validate)
            return
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

    def update_host(self, indices: np.ndarray, values: np.ndarray, validate: bool = True) -> None:
        """``update`` of a tree on the CPU, on numpy arrays: ``indices`` int64 ``[N]``, ``values`` ``[N]`` (cast to the
        tree's dtype as written). Same rules, same arithmetic, so the same nodes as the torch path."""
        num = indices.size
        if values.size != num:
            raise ValueError(f"indices and values must have the same number of elements, got {indices.shape} "
                             f"and {values.shape}")
        if num == 0:
            return
        if validate:
            low, high = int(indices.min()), int(indices.max())
            if low < 0 or high >= self.capacity:
                raise IndexError(f"leaf indices must lie in [0, {self.capacity}), got [{low}, {high}]")
            indices, values = last_write_wins_host(indices, values)
        v = self._np
        if num * (self.depth - self.top) * HOST_PATH_STEP_COST > self.num_leaves:  # a bulk write: recompute the
            # maintained levels (see ``update``); here the cheaper side of the measured crossover
            v[self.num_leaves + indices] = values
            self.rebuild()
            return
        nodes = indices + self.num_leaves
        v[nodes] = values  # duplicates carry equal values (resolved above, or the caller's guarantee)
        if self.depth == self.top:
            return
        # ``path[d]``: the ancestors d levels above the leaves (``node >> d``), as in the torch path. Walking up, each
        # entry carries the value of its own node (``own``, at first the leaf's value as stored) and combines it with
        # its node's sibling (``node ^ 1``, read from the tree), which is ``op(left, right)`` because both ops are
        # commutative (IEEE addition and minimum are, bit for bit): the same parent values as the torch path. The
        # siblings of level d are read after every parent of level d was written (previous step), so a sibling on
        # another entry's path is read with its new value; entries that share a parent compute the same value.
        # Two numpy calls per level and the write.
        path = nodes >> self._np_shifts  # [depth - top + 1, N]
        siblings = path[:-1] ^ 1
        own = values.astype(v.dtype)  # (a copy, of the tree's dtype)
        op = self._np_op
        for parents, sibling in zip(path[1:], siblings):  # bottom-up, one level per step
            op(own, v[sibling], out=own)
            v[parents] = own

    def rebuild(self) -> None:
        """Recompute the maintained internal levels from the leaves, one vectorized op per level."""
        v = self._values
        for level in range(self.depth - 1, self.top - 1, -1):
            lo = 1 << level
            self._op(v[2 * lo:4 * lo:2], v[2 * lo + 1:4 * lo:2], out=v[lo:2 * lo])

    def get(self, indices: torch.Tensor) -> torch.Tensor:
        """Values of leaves ``indices`` (any shape)."""
        if self.on_host:
            return torch.from_numpy(self.get_host(host_array(indices, torch.int64))).reshape(indices.shape)
        return self._values[indices.to(device=self.device, dtype=torch.int64) + self.num_leaves]

    def get_host(self, indices: np.ndarray) -> np.ndarray:
        """Values of leaves ``indices`` (numpy int64, any shape) of a tree on the CPU: a new numpy array."""
        return self._np.take(indices + self.num_leaves)

    def leaves(self) -> torch.Tensor:
        """All ``capacity`` leaf values (a view)."""
        return self._values[self.num_leaves:self.num_leaves + self.capacity]

    def summary(self) -> torch.Tensor:
        """``op`` over all leaves: a 0-dim tensor, reduced from level ``top`` (no host sync)."""
        return self._reduce(self._top_nodes)

    def summary_host(self) -> float:
        """``summary`` of a tree on the CPU as a Python float (the same torch reduction, into a buffer read by
        numpy: bit-identical to ``summary``)."""
        self._reduce(self._top_nodes, out=self._summary_out)
        return float(self._summary_np)

    def state_dict(self) -> dict:
        return {"values": self._values.clone()}

    def load_state_dict(self, state: dict) -> None:
        values = state["values"]
        if values.shape != self._values.shape:
            raise ValueError(f"segment tree state has {values.shape[0]} nodes, this tree has {self._values.shape[0]} "
                             f"(capacity {self.capacity})")
        self._values.copy_(values)  # in place: the numpy view of a host tree stays valid


class _SearchBuffers:
    """Buffers for ``SumTree.find_prefix_sum_host`` with ``num`` targets. ``sums`` / ``cums`` are numpy arrays with a
    tensor over the same memory each (``torch.from_numpy``), so torch's ``cumsum`` reads and writes where numpy
    works, with no conversion per call."""

    def __init__(self, num: int, steps: list[int], dtype: np.dtype):
        self.sums: dict[int, np.ndarray] = {}  # [num, 2**k]: the nodes k levels below each target's node
        self.cums: dict[int, np.ndarray] = {}  # their cumulative sums along each row
        self.sums_t: dict[int, torch.Tensor] = {}  # the same memory as ``sums``
        self.cums_t: dict[int, torch.Tensor] = {}  # the same memory as ``cums``
        self.row_starts: dict[int, np.ndarray] = {}  # [num]: 2**k * row, the flat index of each row's first entry
        for k in set(steps):
            self.sums[k] = np.empty((num, 1 << k), dtype=dtype)
            self.cums[k] = np.empty((num, 1 << k), dtype=dtype)
            self.sums_t[k] = torch.from_numpy(self.sums[k])
            self.cums_t[k] = torch.from_numpy(self.cums[k])
            self.row_starts[k] = np.arange(num, dtype=np.int64) << k
        self.targets = np.empty(num, dtype=dtype)  # the running targets
        self.targets_col = self.targets.reshape(-1, 1)  # [num, 1] (a view)


class SumTree(SegmentTree):
    """Sum over the leaves (float64 by default) and prefix-sum search: the sampling structure of prioritized replay.

    Leaves must be non-negative (not checked in the hot path).
    """

    _np_op = np.add

    def __init__(self, capacity: int, dtype: torch.dtype = torch.float64, device: str | torch.device = "cpu"):
        super().__init__(capacity, 0.0, dtype, device)
        below = self.depth - self.top
        k, r = DESCENT_LEVELS, below % DESCENT_LEVELS
        self._descent_steps = ([r] if r else []) + [k] * (below // k)  # levels per step under ``top``, top first
        # The direction for nextafter, made once: torch.tensor(-1.0, device=cuda) would be a blocking copy per search.
        self._below = torch.full((), -1.0, dtype=dtype, device=self.device)
        if self.on_host:
            self._top_np = self._np[1 << self.top:2 << self.top]  # level ``top`` (a view)
            # [-1, 2**k] views of the nodes: row i holds the 2**k nodes k levels below node i (contiguous in the heap)
            self._rows_np = {k: self._np.reshape(-1, 1 << k) for k in set(self._descent_steps)}
            self._top_cum_np = np.empty(1 << self.top, dtype=self._np.dtype)  # cumsum of level ``top``, by torch
            self._top_cum_out = torch.from_numpy(self._top_cum_np)
            self._search_buffers: dict[int, _SearchBuffers] = {}

    def _op(self, left: torch.Tensor, right: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return torch.add(left, right, out=out)

    def _reduce(self, nodes: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return nodes.sum() if out is None else torch.sum(nodes, 0, out=out)

    def total(self) -> torch.Tensor:
        """Sum of all leaves (0-dim)."""
        return self.summary()

    def total_host(self) -> float:
        """``total`` of a tree on the CPU, as a Python float (bit-identical to ``total``)."""
        return self.summary_host()

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

        A tree on the CPU runs ``find_prefix_sum_host`` (the same arithmetic: the same leaves).

        Args:
            targets: ``[N]`` floats (converted to the tree's dtype).
        Returns:
            int64 leaf indices, shaped like ``targets``.
        """
        if self.on_host:
            leaves = self.find_prefix_sum_host(host_array(targets, self.dtype))
            return torch.from_numpy(leaves).reshape(targets.shape)
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

    def _buffers(self, num: int) -> _SearchBuffers:
        buffers = self._search_buffers.get(num)
        if buffers is None:
            if len(self._search_buffers) >= _MAX_SEARCH_BUFFERS:
                self._search_buffers.clear()
            buffers = self._search_buffers[num] = _SearchBuffers(num, self._descent_steps, self._np.dtype)
        return buffers

    def find_prefix_sum_host(self, targets: np.ndarray, ascending: bool = False) -> np.ndarray:
        """``find_prefix_sum`` of a tree on the CPU: ``targets`` a numpy array ``[N]`` of the tree's dtype, returns the
        int64 leaves ``[N]`` (a new array). ``ascending=True``: the caller guarantees non-decreasing targets (saves a
        reduction).

        The same steps and float operations as the torch path, in the same order, so the same leaves: the cumulative
        sums are torch's ``cumsum`` (sequential on the CPU, exactly like numpy's, and faster) into buffers that numpy
        reads; the rest (the search in each row, fetching the rows, clamping, subtracting the sum left of the child,
        the next node indices) is numpy.
        """
        num = targets.size
        buf = self._buffers(num)
        t = buf.targets
        np.maximum(targets, 0, out=t)
        # Level ``top`` as one wide node: the same rule as the steps below.
        level, cum = self._top_np, self._top_cum_np
        torch.cumsum(self._top_nodes, 0, out=self._top_cum_out)
        j = np.searchsorted(cum, t, side="right")  # the first j with cum[j] > t
        # The torch path first lowers t to strictly below the level's total, nextafter(cum[-1], -1). That changes t
        # only where t >= cum[-1], i.e. where the search ran off the end (j == len): only then is it done (and the
        # search repeated), here and in the steps below; the result is the same.
        if (j[-1] if ascending else j.max()) == cum.size:  # (ascending targets: the last j is the largest)
            np.minimum(t, np.nextafter(cum[-1], -1), out=t)
            j = np.searchsorted(cum, t, side="right")
        nodes = j + (1 << self.top)
        steps = self._descent_steps
        if steps:
            t -= cum[j]
            t += level[j]  # (t - cum[j]) + level[j]: the order of the torch path
            np.maximum(t, 0, out=t)
        for i, k in enumerate(steps):
            sums, cum = buf.sums[k], buf.cums[k]
            self._rows_np[k].take(nodes, axis=0, out=sums, mode="clip")  # [N, 2**k]: the nodes k levels below
            torch.cumsum(buf.sums_t[k], 1, out=buf.cums_t[k])  # (clip: in range, and no buffering of "raise")
            # The first j with cum[j] > t in each row (sums[j] > 0: a zero subtree is never entered): argmax finds
            # the first True. A row without one (t >= its total, see above) is lowered below its total first.
            above = cum > buf.targets_col
            if np.count_nonzero(above[:, -1]) < num:
                np.minimum(t, np.nextafter(cum[:, -1], -1), out=t)
                above = cum > buf.targets_col
            j = above.argmax(1)
            if i + 1 < len(steps):  # (the last step needs no remainder)
                flat = buf.row_starts[k] + j  # the flat index of entry j of each row
                t -= cum.reshape(-1).take(flat)
                t += sums.reshape(-1).take(flat)  # (t - cum[j]) + sums[j]: minus the sum left of child j
                np.maximum(t, 0, out=t)
            nodes <<= k
            nodes += j  # 2**k * node + j
        nodes -= self.num_leaves
        return nodes


class MinTree(SegmentTree):
    """Minimum over the leaves (float32 by default); unset leaves are ``+inf``."""

    _np_op = np.minimum

    def __init__(self, capacity: int, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        super().__init__(capacity, float("inf"), dtype, device)

    def _op(self, left: torch.Tensor, right: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return torch.minimum(left, right, out=out)

    def _reduce(self, nodes: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return nodes.amin() if out is None else torch.amin(nodes, 0, out=out)

    def min(self) -> torch.Tensor:
        """Minimum of all leaves (0-dim; ``+inf`` when no leaf is set)."""
        return self.summary()

    def min_host(self) -> float:
        """``min`` of a tree on the CPU, as a Python float."""
        return self.summary_host()
