"""``BatchStager``: sampled batches from host replay to the training device through pinned staging buffers.

Why staging: a ``non_blocking`` copy to a GPU only overlaps with the host when it reads pinned (page-locked) memory.
Pinning the whole replay buffer would lock gigabytes for pixel replay, and indexing a pinned tensor gives an unpinned
one; so each batch is gathered straight into small preallocated pinned buffers (``index_select(..., out=)``), then
copied with one ``non_blocking`` copy per leaf.

Two sets of buffers are used in turn, so the host fills one while the copies of the other may still run; a set is
reused only after the CUDA event recorded behind its copies has passed (a wait on the copies of the batch before the
previous one, normally long done). Buffers are allocated on first use with the batch's shapes (and again if a shape
changes).

Where it plugs in (``ReplayBuffer``): ``sample`` gathers into the next set, and returns that host batch, so that the
transformers that read the replay buffer at sample time (hindsight relabelling, frame stacking) run on the host with
host indices, as before; then ``to_device(exp, batch_info)`` copies the result and the batch's info (indices and
importance weights: the learner gets everything on its device; the sampler keeps its own copy of the info for
``update_priorities``). A leaf the transformers left as
gathered is copied from its staging buffer directly; a leaf they replaced is first copied into a pinned buffer of the
same set (one host memcpy). So the host batch that ``sample`` returns is valid until the second next ``sample``
(its leaves are the staging buffers); copy it to keep it longer.

Identity where there is nothing to stage: for a CPU (or meta) training device, or a storage already on the device,
``gather`` is the storage's own and ``to_device`` returns its inputs unchanged (only small leaves still on the host,
such as a host sampler's indices and importance weights, are copied, through the same pinned path).
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from alfish.data import nest
from alfish.data.types import BatchInfo, Experience
from alfish.replay.ring_buffer import RingBuffer
from alfish.replay.transfer import canonical_device


class _StagingSet:
    """One set of pinned buffers and the event behind the copies last made from them."""

    def __init__(self) -> None:
        self.buffers: dict[Any, torch.Tensor] = {}
        self.gathered: list[torch.Tensor] = []  # the leaves the last gather returned (views of buffers)
        self.event: Any = None  # torch.cuda.Event once copies were made from this set

    def buffer(self, key: Any, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The pinned buffer ``key``, (re)allocated if it does not have this shape and dtype."""
        buf = self.buffers.get(key)
        if buf is None or tuple(buf.shape) != tuple(shape) or buf.dtype != dtype:
            buf = self.buffers[key] = torch.empty(shape, dtype=dtype, pin_memory=True)
        return buf

    def owns(self, x: torch.Tensor) -> bool:
        """Whether ``x`` is a leaf the last gather into this set returned (so already pinned)."""
        return any(x is g for g in self.gathered)


class BatchStager:
    """Host batches to ``device`` (see the module docstring). Active only for a CUDA ``device``.

    Args:
        device: the training device.
    """

    def __init__(self, device: str | torch.device):
        self.device = canonical_device(device)
        self.active = self.device.type == "cuda"
        self._sets = (_StagingSet(), _StagingSet())
        self._turn = 0
        self._claimed: _StagingSet | None = None  # the set the last gather filled, until to_device copies it

    def _claim(self) -> _StagingSet:
        """The next set, once the copies last made from it have completed."""
        staging = self._sets[self._turn]
        self._turn = 1 - self._turn
        if staging.event is not None:
            if not staging.event.query():  # (query first: a wait only when the copies still run)
                staging.event.synchronize()
            staging.event = None
        staging.gathered = []
        return staging

    def gather(self, storage: RingBuffer, env_ids: torch.Tensor, index: torch.Tensor) -> Experience:
        """``storage.gather_at(env_ids, index)`` ``[N, M]``: into the next set's pinned buffers when the storage is on
        the host and the training device is CUDA, else the storage's own gather."""
        layout = storage.leaf_layout()
        if not self.active or storage.device.type != "cpu" or not layout:
            return storage.gather_at(env_ids, index)
        staging = self._claimed = self._claim()
        rows = index.numel()
        out = [staging.buffer(("gather", i), (rows,) + shape, dtype) for i, (shape, dtype) in enumerate(layout)]
        exp = storage.gather_at(env_ids, index, out=out)
        staging.gathered = nest.flatten(nest.replace_fields(exp, env_id=()))  # (env_id is computed, not gathered)
        return exp

    def to_device(self, exp: Experience, batch_info: BatchInfo) -> tuple[Experience, BatchInfo]:
        """``exp`` (any nest of tensors) and ``batch_info`` (indices and importance weights) on ``device``: what the
        learner is handed. The ``batch_info`` given is not changed: it stays where the sampler put it, for
        ``update_priorities``. Returns the inputs themselves when everything already is on ``device``."""
        leaves = nest.flatten(exp)  # (pytree's order; the structure is built only when something moved)
        info = list(batch_info)  # env_ids, positions, importance_weights
        moved = self._move(leaves + info)
        if moved is None:
            return exp, batch_info
        return pytree.tree_unflatten(moved[:len(leaves)], pytree.tree_structure(exp)), BatchInfo(*moved[len(leaves):])

    def stage(self, tree: Any) -> Any:
        """``tree`` (any nest of tensors, e.g. a batch just gathered) on ``device``, as ``to_device`` moves a batch;
        ``tree`` itself when everything already is there."""
        leaves = nest.flatten(tree)
        moved = self._move(leaves)
        return tree if moved is None else pytree.tree_unflatten(moved, pytree.tree_structure(tree))

    def _move(self, values: list) -> list | None:
        """``values`` (tensors, or anything else, kept as it is) on ``device``; ``None`` when none had to move. Host
        tensors go through the pinned buffers of the set ``gather`` filled (or the next one), one ``non_blocking``
        copy each, and an event is recorded behind the copies."""
        staging, self._claimed = self._claimed, None
        copied = False
        moved = []
        device = self.device
        for i, x in enumerate(values):
            if not isinstance(x, torch.Tensor) or x.device == device:
                moved.append(x)
                continue
            if self.active and x.device.type == "cpu":
                if staging is None:
                    staging = self._claim()
                if not staging.owns(x):  # replaced by a transformer (or never staged): one host copy into pinned
                    x = staging.buffer(("leaf", i), tuple(x.shape), x.dtype).copy_(x)
                moved.append(x.to(self.device, non_blocking=True))
                copied = True
            else:
                moved.append(x.to(self.device))
        if copied:
            staging.event = torch.cuda.Event()
            staging.event.record(torch.cuda.current_stream(self.device))
        if all(m is x for m, x in zip(moved, values)):
            return None
        return moved
