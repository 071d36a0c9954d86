"""Where replay lives: ``make_storage(location, ...)`` builds the ``RingBuffer`` for one of ``STORAGE_LOCATIONS``.

* ``'cpu'`` (default): ordinary host memory. Batches are gathered on the host and, when training runs on a GPU,
  staged through pinned buffers and copied ``non_blocking`` (``ReplayBuffer(device=...)``, ``staging.py``).
* ``'mmap'``: host memory backed by files under ``scratch_dir`` (``MappedRingBuffer``), for buffers larger than RAM;
  otherwise as ``'cpu'``. The files are scratch space: checkpoints hold the contents, as for ``'cpu'``.
* ``'device'``: the training device itself (for buffers that fit in its memory): batches are gathered there and
  nothing is copied per batch but the indices.

In every case the counters (write counts, oldest indices, the number stored) stay on the CPU, so the host reads them
without waiting for the device.
"""
from __future__ import annotations

import os

import torch

from alfish.replay.mapped_ring_buffer import MappedRingBuffer
from alfish.replay.ring_buffer import RingBuffer

STORAGE_LOCATIONS = ("cpu", "mmap", "device")


def make_storage(location: str, num_envs: int, capacity: int, device: str | torch.device = "cpu",
                 track_episode_ends: bool = False, scratch_dir: str | os.PathLike | None = None) -> RingBuffer:
    """The rings of ``num_envs`` x ``capacity`` steps at ``location`` (one of ``STORAGE_LOCATIONS``).

    Args:
        location: ``'cpu'``, ``'mmap'`` or ``'device'`` (see the module docstring).
        device: the training device; used only by ``'device'``.
        track_episode_ends: as ``RingBuffer`` (hindsight relabelling needs it).
        scratch_dir: an existing folder for the files of ``'mmap'`` (ignored otherwise).
    """
    if location == "cpu":
        return RingBuffer(num_envs, capacity, "cpu", track_episode_ends)
    if location == "device":
        return RingBuffer(num_envs, capacity, device, track_episode_ends)
    if location == "mmap":
        if scratch_dir is None:
            raise ValueError("replay storage 'mmap' needs a scratch_dir for its files: give a folder on a local disk")
        return MappedRingBuffer(num_envs, capacity, scratch_dir, track_episode_ends)
    raise ValueError(f"replay storage location must be one of {', '.join(map(repr, STORAGE_LOCATIONS))}; "
                     f"got {location!r}")
