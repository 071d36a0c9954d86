"""``MappedRingBuffer``: a ``RingBuffer`` whose leaves are memory-mapped files (host replay larger than RAM wants).

Each storage leaf is one file, ``<scratch_dir>/alfish-replay-XXXXXXXX/leaf<k>.bin``, mapped with
``torch.from_file(shared=True)``: the kernel pages it in and out, so the buffer may exceed physical memory (it is as
fast as RAM while it fits in the page cache). The files are scratch space, not a checkpoint: ``state_dict`` returns
the contents as ordinary CPU tensors as for any ``RingBuffer`` (a checkpoint holds the data, and a resumed run writes
them into fresh files of its own), and ``load_state_dict`` copies a checkpoint's leaves into new files. The folder is
removed by ``close()``, when the buffer is garbage-collected, or at interpreter exit; a killed process leaves it behind
(delete stale ``alfish-replay-*`` folders by hand). Put ``scratch_dir`` on a local disk, not on a tmpfs (which is RAM).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from pathlib import Path

import torch

from alfish.data.types import Experience
from alfish.replay.ring_buffer import RingBuffer


class MappedRingBuffer(RingBuffer):
    """A host ``RingBuffer`` whose storage leaves live in memory-mapped files under ``scratch_dir`` (see the module
    docstring for their lifetime).

    Args:
        num_envs, capacity, track_episode_ends: as ``RingBuffer``.
        scratch_dir: an existing folder; a private subfolder is made in it at the first allocation.
    """

    def __init__(self, num_envs: int, capacity: int, scratch_dir: str | os.PathLike, track_episode_ends: bool = False):
        super().__init__(num_envs, capacity, device="cpu", track_episode_ends=track_episode_ends)
        if not Path(scratch_dir).is_dir():
            raise ValueError(f"the replay scratch_dir {str(scratch_dir)!r} is not a folder: create it, or choose "
                             "another for the memory-mapped replay files")
        self.scratch_dir = Path(scratch_dir)
        self._folder: Path | None = None
        self._files: list[Path] = []  # the files of the current leaves
        self._num_files = 0  # files ever made (names are never reused, so a stale mapping never sees new data)
        self._finalizer: weakref.finalize | None = None

    @property
    def folder(self) -> Path | None:
        """The private folder of this buffer's files (``None`` before the first allocation)."""
        return self._folder

    def _allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A new file of ``prod(shape)`` elements, zero-filled (a new file is sparse: zero pages cost no disk)."""
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="alfish-replay-", dir=self.scratch_dir))
            # rmtree holds no reference to self, so the buffer can still be collected.
            self._finalizer = weakref.finalize(self, shutil.rmtree, self._folder, True)
        path = self._folder / f"leaf{self._num_files}.bin"
        self._num_files += 1
        numel = 1
        for n in shape:
            numel *= n
        leaf = torch.from_file(str(path), shared=True, size=numel, dtype=dtype).view(shape)
        self._files.append(path)
        return leaf

    def _adopt(self, leaf: torch.Tensor) -> torch.Tensor:
        return self._allocate(tuple(leaf.shape), leaf.dtype).copy_(leaf)

    def load_state_dict(self, state: dict, example: Experience) -> None:
        """As ``RingBuffer.load_state_dict``; the checkpoint's leaves are copied into new files, the old ones
        deleted."""
        old_storage, old_files, self._files = self._storage, self._files, []
        try:
            super().load_state_dict(state, example)
        finally:  # keep the files of whichever leaves the buffer holds now
            replaced = self._storage is not old_storage
            stale, self._files = (old_files, self._files) if replaced else (self._files, old_files)
            for path in stale:  # (a mapping outlives its file on POSIX: old leaves still referenced stay readable)
                path.unlink(missing_ok=True)

    def close(self) -> None:
        """Delete the files now (the buffer must not be used afterwards)."""
        self._storage = None
        self._files = []
        if self._finalizer is not None:
            self._finalizer()
