"""Moving small host tensors (indices, counters, random draws) to the device without stalling the host.

A plain ``cpu_tensor.to("cuda")`` copies from pageable memory and then waits for the stream (PyTorch's blocking
host-to-device copy synchronizes the stream, so the host waits for every kernel queued before it). Copying from pinned
memory with ``non_blocking=True`` only enqueues the copy. ``x.pin_memory()`` makes a fresh pinned copy from PyTorch's
caching host allocator, which records an event at the copy and does not hand the block out again before the copy is
done, so the caller may change ``x`` right after this returns.
"""
from __future__ import annotations

import torch


def canonical_device(device: str | torch.device) -> torch.device:
    """``device`` with its index filled in (``'cuda'`` -> ``cuda:<current>``), so it compares equal to a tensor's."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def host_to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``x`` on ``device``: unchanged if already there; from the CPU to CUDA through pinned memory, ``non_blocking``
    (no host sync); any other move with a plain ``.to`` (CPU, meta: nothing to wait for)."""
    if x.device == device:
        return x
    if device.type == "cuda" and x.device.type == "cpu":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)
