"""Rollout parameters shared with the async unroll child: named tensors as one shared-memory byte block with a
version number. The trainer writes a new version; the child copies it in before its next step when it moved.

The block is created once the trainer has built the algorithm (its size is known only then) and is found by the child
by name; the version counter, the progress values and the lock exist from the child's start.
"""
from __future__ import annotations

import time
from multiprocessing import shared_memory
from typing import Any, Callable, Optional

import numpy as np
import torch

from alfish.collect.child_process import ChildProcessFailed

POLL_S = 0.2  # how often a waiting side re-checks that its peer is alive
LOCK_TIMEOUT_S = 10.0


class AsyncUnrollError(ChildProcessFailed):
    """The unroll child failed, died or stalled (or the shared parameter block failed either child)."""


def rollout_state(algorithm: torch.nn.Module, transformer: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a rollout policy needs, by name: the algorithm's rollout modules (all of it when it names none)
    and the data transformers' state (normalizer statistics)."""
    names = getattr(algorithm, "rollout_module_names", None)
    state = {}
    for key, value in algorithm.state_dict().items():
        if names is None or any(key == n or key.startswith(n + ".") for n in names):
            state["algorithm." + key] = value
    for key, value in transformer.state_dict().items():
        state["transformer." + key] = value
    return state


def layout_of(tensors: dict[str, torch.Tensor]) -> tuple[list[tuple[str, int, int]], int]:
    """``[(name, offset, nbytes)]`` in the dict's order and the total size in bytes; both sides compute it from
    same-shaped tensors."""
    layout, offset = [], 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        layout.append((name, offset, nbytes))
        offset += nbytes
    return layout, offset


def byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bytes as a flat uint8 tensor on its device (a view when it is contiguous; no gradient)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def pack(flats: list[torch.Tensor]) -> torch.Tensor:
    """The byte vectors ``flats`` (``byte_view``s, in the layout's order) as one uint8 vector on the device of the
    first that is not on the host: the block's bytes, ready for one copy to the host. Any dtype mix packs alike."""
    device = next((f.device for f in flats if f.device.type != "cpu"), torch.device("cpu"))
    return torch.cat([f.to(device) for f in flats])


class SharedParams:
    """The pieces that exist before the block: version, progress (iterations, env steps, fraction of the run) and the
    lock. Passed to the child at spawn."""

    def __init__(self, ctx: Any):
        self.version = ctx.RawValue("q", 0)
        self.progress = ctx.RawArray("d", 3)
        self.lock = ctx.Lock()


class ParamBlock:
    """One side's view of the shared byte block of ``tensors``' layout (``create`` on the trainer's side)."""

    def __init__(self, shared: SharedParams, tensors: dict[str, torch.Tensor], name: Optional[str] = None):
        self.shared = shared
        self.layout, size = layout_of(tensors)
        if name is None:
            self.memory = shared_memory.SharedMemory(create=True, size=max(1, size))
        else:
            # Attaching registers the name with the resource tracker again (bpo-39959); the spawned child shares the
            # trainer's tracker, whose record is a set, so the trainer's unlink clears it once for both.
            self.memory = shared_memory.SharedMemory(name=name)
            if self.memory.size < size:
                raise AsyncUnrollError(f"the shared parameter block holds {self.memory.size} bytes, the child's "
                                       f"rollout policy needs {size}: the two sides built different algorithms")
        self.name = self.memory.name
        self._staging: Optional[torch.Tensor] = None  # pinned host bytes of a publish from CUDA (see _to_host)

    def _view(self) -> np.ndarray:
        return np.ndarray((self.memory.size,), dtype=np.uint8, buffer=self.memory.buf)

    def write(self, tensors: dict[str, torch.Tensor], progress: tuple[float, float, float],
              keep_waiting: Callable[[], bool] = lambda: True) -> int:
        """Publish ``tensors`` as the next version; returns it. While the lock is held by the reader, ``keep_waiting``
        is asked every ``POLL_S`` (it may raise: a reader killed while holding the lock never releases it).

        Host tensors are copied straight into the block, one ``memcpy`` each. Tensors on a device (the trainer's GPU)
        are packed there into one byte vector and cross to the host in ONE copy, before the lock is taken (the copy
        waits for the device's queued work; the reader need not wait with it)."""
        source = [tensors[name] for name, _, _ in self.layout]
        packed = None if all(t.is_cpu for t in source) else self._to_host(pack([byte_view(t) for t in source]))
        view = self._view()
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while not self.shared.lock.acquire(timeout=POLL_S):
            if not keep_waiting() or time.monotonic() > deadline:
                raise AsyncUnrollError(f"could not publish parameters: the shared lock was held for "
                                       f"{LOCK_TIMEOUT_S} s")
        try:
            if packed is None:
                for (_, offset, nbytes), tensor in zip(self.layout, source):
                    view[offset:offset + nbytes] = byte_view(tensor).numpy()
            else:
                view[:packed.numel()] = packed.numpy()
            self.shared.progress[:] = list(progress)
            self.shared.version.value += 1
            return self.shared.version.value
        finally:
            self.shared.lock.release()

    def _to_host(self, packed: torch.Tensor) -> torch.Tensor:
        """``packed`` (uint8 ``[size]`` on a device) in host memory, in one device-to-host copy: into a pinned staging
        buffer from CUDA (a direct DMA, kept for the next publish), else with ``.cpu()``."""
        if packed.device.type != "cuda":
            return packed.cpu()
        if self._staging is None or self._staging.numel() != packed.numel():
            self._staging = torch.empty(packed.numel(), dtype=torch.uint8, pin_memory=True)
        return self._staging.copy_(packed)  # blocking: the bytes are there when it returns

    def read_into(self, tensors: dict[str, torch.Tensor],
                  keep_waiting: Callable[[], bool] = lambda: True) -> Optional[tuple[int, tuple[float, ...]]]:
        """Copy the block into ``tensors`` (same names and shapes); returns the version and progress, or ``None`` when
        ``keep_waiting()`` turned False while the lock was held (e.g. a writer killed holding it)."""
        view = self._view()
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while not self.shared.lock.acquire(timeout=POLL_S):
            if not keep_waiting():
                return None
            if time.monotonic() > deadline:
                raise AsyncUnrollError(f"could not read parameters: the shared lock was held for {LOCK_TIMEOUT_S} s")
        try:
            for name, offset, nbytes in self.layout:
                target = tensors[name]
                flat = torch.from_numpy(view[offset:offset + nbytes].copy()).view(target.dtype)
                target.copy_(flat.reshape(target.shape))
            return self.shared.version.value, tuple(self.shared.progress[:])
        finally:
            self.shared.lock.release()

    def close(self, unlink: bool = False) -> None:
        self.memory.close()
        if unlink:
            self.memory.unlink()
