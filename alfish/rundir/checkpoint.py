"""Atomic checkpoints of one run: ``Checkpointer`` writes, rotates, scans and sets aside ``ckpt-<step>`` directories.

What one checkpoint directory holds and how it is verified and read is ``alfish.rundir.checkpoint_format``'s (its
error and result types are importable from here too). A checkpoint is written into
``ckpt_root/.tmp-ckpt-<step>-<pid>/``, every file is fsynced, the manifest is written last, and the directory is
renamed into place, so ``ckpt-<step>`` either exists complete or not at all.

A checkpoint directory is never deleted for failing verification: ``scan`` reports the damaged ones and
``set_aside`` moves them out of the way (``alfish.trainer.resume`` decides when).
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import operator
import os
import re
import shutil
from typing import Any, Optional

import torch

from alfish.console.printable import printable
from alfish.rundir.checkpoint_format import (
    MANIFEST,
    META,
    CheckpointError,
    CheckpointWriteError,
    LoadedCheckpoint,
    check_tensors,
    encode_manifest,
    encode_meta,
    read_verified,
    verify_manifest,
)
from alfish.rundir.checkpoint_meta import MAX_STEP, step_of_dir_name
from alfish.rundir.disk import disk_error_in, write_failure
from alfish.rundir.safe_paths import UnsafePathError, kind_in_root, list_dir_in_root

__all__ = ["CheckpointError", "CheckpointWriteError", "LoadedCheckpoint", "Checkpointer", "Scan", "MANIFEST", "META"]

logger = logging.getLogger(__name__)

_TMP_RE = re.compile(r"^\.tmp-(?:old-)?ckpt-(\d+)-(\d+)$")


@dataclasses.dataclass
class Scan:
    """What ``Checkpointer.scan`` found: the newest checkpoint that verifies (None if none does) and the newer ones
    that do not, newest first, each as ``(step, error)``."""

    latest: Optional[LoadedCheckpoint]
    damaged: list[tuple[int, CheckpointError]]


class _HashingWriter:
    """File-like sink for ``torch.save`` that writes to ``f`` and hashes/counts the bytes on the way."""

    def __init__(self, f) -> None:
        self._f = f
        self.sha256 = hashlib.sha256()
        self.nbytes = 0

    def write(self, data) -> int:
        n = self._f.write(data)
        self.sha256.update(data)
        self.nbytes += len(data)
        return n

    def flush(self) -> None:
        self._f.flush()


def _fsync_dir(path: str) -> None:
    """Make a rename/creation inside ``path`` durable (best effort where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our own leftover: this process is not writing it now
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # exists but not ours, or an unparsable pid: leave it alone
    except OSError:
        return False
    return True


class Checkpointer:
    """Writes and reads the checkpoints of one run under ``ckpt_root`` (one ``ckpt-<step>`` directory each).

    Args:
        ckpt_root: directory holding the checkpoints; created on the first save.
        max_to_keep: how many checkpoints to keep; after each successful save, once the new checkpoint verified
            (its files read back and hashed), the oldest (by step) beyond this many are deleted. ``None`` keeps all.
        root_dir: the results directory ``ckpt_root`` lies in, as the user typed it (it may be a symlink). Below it
            no symlink is followed and only regular files and directories are opened (``alfish.rundir.safe_paths``).
            ``None``: ``ckpt_root`` itself is the directory the user typed.

    Only one process may save into a ``ckpt_root`` at a time (in DDP: rank 0).
    """

    def __init__(self, ckpt_root: str, max_to_keep: int | None = None, root_dir: str | None = None) -> None:
        if max_to_keep is not None and (isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int)
                                        or max_to_keep < 1):
            raise ValueError(f"max_to_keep must be None (keep all) or an int >= 1, got {max_to_keep!r}")
        self.ckpt_root = os.path.abspath(os.fspath(ckpt_root))
        self.max_to_keep = max_to_keep
        self.root_dir = os.path.abspath(os.fspath(root_dir)) if root_dir is not None else self.ckpt_root

    # ------------------------------------------------------------------ paths

    def path_of(self, step: int) -> str:
        """The directory of the checkpoint at training iteration ``step``."""
        return os.path.join(self.ckpt_root, f"ckpt-{int(step)}")

    def steps(self) -> list[int]:
        """Steps (training iterations) of the checkpoint directories, ascending; contents not verified.

        Only finished checkpoints are ever renamed to ``ckpt-<step>``, so each such directory counts (loading then
        verifies it); temporary ``.tmp-*`` directories left by a killed process are ignored, and so are names that
        are not a real directory (a symlink is not followed) or whose step has more than 18 digits.

        Raises:
            CheckpointError: ``ckpt_root`` cannot be listed, or is reached through a link (one line).
        """
        try:
            names = list_dir_in_root(self.root_dir, self.ckpt_root)
            named = [(step_of_dir_name(name), name) for name in names]
            return sorted(step for step, name in named if step is not None
                          and kind_in_root(self.root_dir, os.path.join(self.ckpt_root, name)) == "dir")
        except UnsafePathError as e:
            raise CheckpointError(printable(str(e)), file=e.filename) from None
        except OSError as e:
            raise CheckpointError(f"cannot list checkpoint directory {self.ckpt_root}: {e.strerror or e}; "
                                  "check that it exists and is readable") from e

    # ------------------------------------------------------------------ saving

    def save(self, step: int, tensors: dict[str, Any], meta: dict) -> str:
        """Atomically write the checkpoint of training iteration ``step`` and return its directory.

        Args:
            step: training iteration (>= 0). A checkpoint already at this step is replaced.
            tensors: name -> a nest (dicts/lists/tuples) of tensors and python scalars, e.g. a module's or an
                optimizer's ``state_dict()``; each entry becomes ``<name>.pt``. Names are plain file names
                (letters, digits, ``_ . -``).
            meta: JSON-serializable metadata.

        Raises:
            CheckpointError: bad arguments, or the disk refused a write (full disk, quota, permissions). The
                temporary directory is removed and the checkpoints already saved are untouched.
        """
        step = self._check_step(step)
        check_tensors(tensors)
        meta_bytes = encode_meta(meta)

        final = self.path_of(step)
        try:
            os.makedirs(self.ckpt_root, exist_ok=True)
        except OSError as e:
            raise self._write_error(final, "", e) from e
        self._remove_stale_tmp_dirs()

        tmp = os.path.join(self.ckpt_root, f".tmp-ckpt-{step}-{os.getpid()}")
        current = tmp  # the file being written, for the error message
        try:
            if os.path.exists(tmp):
                shutil.rmtree(tmp)
            os.mkdir(tmp)
            files = {}
            for name, value in tensors.items():
                fname = f"{name}.pt"
                current = os.path.join(tmp, fname)
                with open(current, "wb") as f:
                    w = _HashingWriter(f)
                    torch.save(value, w)
                    f.flush()
                    os.fsync(f.fileno())
                files[fname] = {"sha256": w.sha256.hexdigest(), "bytes": w.nbytes}
            current = os.path.join(tmp, META)
            self._write_file(current, meta_bytes)
            files[META] = {"sha256": hashlib.sha256(meta_bytes).hexdigest(), "bytes": len(meta_bytes)}
            current = os.path.join(tmp, MANIFEST)
            self._write_file(current, encode_manifest(step, files))
            _fsync_dir(tmp)
            current = final
            self._move_into_place(tmp, final, step)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
            os_err = disk_error_in(e, errnos=None)  # torch wraps errors of the file it writes in a RuntimeError
            if os_err is not None and isinstance(e, (OSError, RuntimeError)):
                failed = os.path.basename(current) if os.path.dirname(current) == tmp else ""
                raise self._write_error(final, failed, os_err) from e
            raise
        if self.max_to_keep is not None:
            self._verify(final, step)  # older checkpoints are deleted only once the newest reads back intact
        self._prune(keep=step)
        return final

    @staticmethod
    def _write_file(path: str, data: bytes) -> None:
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def _move_into_place(self, tmp: str, final: str, step: int) -> None:
        """Rename the finished ``tmp`` to ``final``; an existing ``final`` is moved aside first, deleted after."""
        old = None
        if os.path.lexists(final):
            old = os.path.join(self.ckpt_root, f".tmp-old-ckpt-{step}-{os.getpid()}")
            if os.path.lexists(old):
                shutil.rmtree(old)
            os.rename(final, old)
        try:
            os.rename(tmp, final)
        except BaseException:
            if old is not None:
                try:
                    os.rename(old, final)  # put the previous checkpoint back
                except OSError:
                    logger.warning("could not move the previous checkpoint %s back to %s", old, final)
            raise
        _fsync_dir(self.ckpt_root)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def _write_error(self, final: str, failed_file: str, e: OSError) -> CheckpointWriteError:
        """One line: the checkpoint (and its file) that could not be written, why, what to free or change, and that
        the last checkpoint written before is untouched."""
        message = write_failure("checkpoint", final, e, file=failed_file)
        return CheckpointWriteError(f"{message}; {self.last_checkpoint_note()}", file=final)

    def last_checkpoint_note(self) -> str:
        """'the last checkpoint, <path>, is intact' (or that there is none), for messages about a failed write: a
        failed save leaves every checkpoint directory as it was."""
        try:
            written = self.steps()
        except CheckpointError:
            written = []
        return (f"the last checkpoint, {self.path_of(written[-1])}, is intact" if written
                else "no checkpoint was written before")

    def _remove_stale_tmp_dirs(self) -> None:
        """Delete ``.tmp-*`` directories left by killed saves (not those of a live process saving right now)."""
        try:
            names = os.listdir(self.ckpt_root)
        except OSError:
            return
        for name in names:
            m = _TMP_RE.match(name)
            if m and not _pid_alive(int(m.group(2))):
                logger.info("removing %s left by an interrupted checkpoint save", os.path.join(self.ckpt_root, name))
                shutil.rmtree(os.path.join(self.ckpt_root, name), ignore_errors=True)

    def _prune(self, keep: int) -> None:
        if self.max_to_keep is None:
            return
        steps = self.steps()
        excess = len(steps) - self.max_to_keep
        for s in steps:
            if excess <= 0:
                break
            if s == keep:
                continue
            shutil.rmtree(self.path_of(s), ignore_errors=True)
            excess -= 1

    # ------------------------------------------------------------------ loading

    def load_latest(self) -> LoadedCheckpoint | None:
        """The newest checkpoint that verifies, or None if there is none.

        Checkpoints that fail verification (a file changed, missing or truncated, an unreadable manifest) are skipped
        with one warning each naming the file, and the next older one is tried. Nothing is moved or deleted (see
        ``scan`` and ``set_aside``).
        """
        return self.scan().latest

    def scan(self) -> Scan:
        """Verify the checkpoints from the newest down until one loads: that one, and the newer ones that did not
        (each skipped with one warning naming the file)."""
        steps = self.steps()
        damaged: list[tuple[int, CheckpointError]] = []
        for i in range(len(steps) - 1, -1, -1):
            try:
                return Scan(self._load(steps[i]), damaged)
            except CheckpointError as e:
                damaged.append((steps[i], e))
                if i > 0:
                    logger.warning("%s; falling back to an older checkpoint (step %d)", printable(str(e)), steps[i - 1])
                else:
                    logger.warning("%s; no older checkpoint is left to fall back to", printable(str(e)))
        return Scan(None, damaged)

    def set_aside(self, steps: list[int], dest: str) -> list[str]:
        """Move the checkpoint directories of ``steps`` into the directory ``dest`` (created; it must not hold them
        yet), never deleting anything; returns their new paths. Used for checkpoints that did not verify, so that no
        later save replaces a file nobody could read."""
        os.makedirs(dest, exist_ok=True)
        moved = []
        for step in steps:
            target = os.path.join(dest, os.path.basename(self.path_of(step)))
            if os.path.lexists(target):
                raise CheckpointError(f"cannot move {self.path_of(step)} aside: {target} exists; move one of them "
                                      "elsewhere and rerun")
            os.rename(self.path_of(step), target)
            moved.append(target)
        _fsync_dir(self.ckpt_root)
        return moved

    def load(self, step: int) -> LoadedCheckpoint:
        """Load exactly the checkpoint of training iteration ``step``, after verifying it against its manifest.

        Raises:
            CheckpointError: it does not exist or does not verify.
        """
        step = self._check_step(step)
        try:
            return self._load(step)
        except CheckpointError as e:
            if self._kind(step) != "dir":
                raise  # the message already lists the steps there are, or says what is there instead
            raise CheckpointError(f"{e}; load another step (available: {self.steps()}) or move {self.path_of(step)} "
                                  "out of the checkpoints folder", file=e.file) from e

    def _kind(self, step: int) -> str:
        """What the directory of ``step`` is ('dir', 'missing', 'symlink', ...), not following links."""
        try:
            return kind_in_root(self.root_dir, self.path_of(step))
        except UnsafePathError as e:
            raise CheckpointError(printable(str(e)), file=e.filename) from None

    def _load(self, step: int) -> LoadedCheckpoint:
        path = self.path_of(step)
        kind = self._kind(step)
        if kind == "missing":
            raise CheckpointError(f"no checkpoint at step {step}: {path} does not exist "
                                  f"(available steps: {self.steps() or 'none'})", file=path)
        if kind != "dir":
            raise CheckpointError(f"checkpoint {path} is a {kind}, not a directory; alfish never follows links inside "
                                  "a results directory: replace it with a real directory or move it away", file=path)
        return read_verified(self.root_dir, path, step)

    def _verify(self, path: str, step: int) -> dict:
        """Check the directory ``path`` of ``step`` against its manifest and return the manifest; CheckpointError
        names the failing file."""
        return verify_manifest(self.root_dir, path, step)

    @staticmethod
    def _check_step(step: int) -> int:
        try:
            value = operator.index(step)  # int, numpy integer, 0-d integer tensor
        except TypeError:
            value = -1
        if isinstance(step, bool) or not 0 <= value <= MAX_STEP:
            raise CheckpointError(f"step must be an int >= 0 (the training iteration, at most {MAX_STEP}), got "
                                  f"{step!r}")
        return value
