"""Atomic checkpoints of one run: ``Checkpointer`` writes, rotates, scans and sets aside ``ckpt-<step>`` directories.

What one checkpoint directory holds and how it is verified and read is ``alfish.rundir.checkpoint_format``'s (its
error and result types are importable from here too). A checkpoint is written into
``ckpt_root/.tmp-ckpt-<step>-<pid>/``, every file is fsynced, the manifest is written last, and the directory is
renamed into place, so ``ckpt-<step>`` either exists complete or not at all.

Every directory made, file written, rename and deletion goes through ``alfish.rundir.safe_paths`` relative to the
root_dir the user typed (DESIGN.md §3.13): nothing is written, renamed or deleted through a symlink. Rotation deletes
an old checkpoint only file by file, the names its manifest lists (and the manifest), never a whole tree; the
``.tmp-*`` directories alfish itself wrote are removed as trees (without crossing a link).

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
from typing import Any, Optional

import torch

from alfish.console.printable import printable
from alfish.rundir.bounded import loads_bounded
from alfish.rundir.checkpoint_format import (
    MANIFEST,
    MAX_MANIFEST_BYTES,
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
from alfish.rundir.safe_paths import (
    UnsafePathError,
    fsync_dir_in_root,
    kind_in_root,
    list_dir_in_root,
    make_dirs_in_root,
    open_in_root,
    read_bytes_in_root,
    remove_listed,
    remove_tree_in_root,
    rename_in_root,
    require_kind_in_root,
    unsafe_path_in,
)

__all__ = ["CheckpointError", "CheckpointWriteError", "LoadedCheckpoint", "Checkpointer", "Scan", "MANIFEST", "META"]

logger = logging.getLogger(__name__)

_TMP_RE = re.compile(r"^\.tmp-(?:old-)?ckpt-(\d+)-(\d+)$")
# A manifest lists a handful of files (one per tensors entry, meta.json): bound what rotation parses.
_MAX_MANIFEST_VALUES = 100_000


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
            CheckpointError: bad arguments, or the disk refused a write (full disk, quota, permissions), or a
                symlink (FIFO, ...) lies where the checkpoint is to be written (CheckpointWriteError whose message
                is the refusal's one line). The temporary directory is removed and the checkpoints already saved
                are untouched.
        """
        step = self._check_step(step)
        check_tensors(tensors)
        meta_bytes = encode_meta(meta)

        final = self.path_of(step)
        try:
            make_dirs_in_root(self.root_dir, self.ckpt_root)
            self._remove_stale_tmp_dirs()
        except OSError as e:
            raise self._write_error(final, "", e) from e

        tmp = os.path.join(self.ckpt_root, f".tmp-ckpt-{step}-{os.getpid()}")
        current = tmp  # the file being written, for the error message
        try:
            remove_tree_in_root(self.root_dir, tmp)
            make_dirs_in_root(self.root_dir, tmp)
            files = {}
            for name, value in tensors.items():
                current = os.path.join(tmp, f"{name}.pt")
                files[f"{name}.pt"] = self._write_file(current, lambda f, value=value: torch.save(value, f))
            current = os.path.join(tmp, META)
            files[META] = self._write_file(current, lambda f: f.write(meta_bytes))
            current = os.path.join(tmp, MANIFEST)
            self._write_file(current, lambda f: f.write(encode_manifest(step, files)))
            fsync_dir_in_root(self.root_dir, tmp)
            current = final
            self._move_into_place(tmp, final, step)
        except BaseException as e:
            self._remove_quietly(tmp)
            os_err = unsafe_path_in(e) or disk_error_in(e, errnos=None)  # torch wraps a failed write's error
            if os_err is not None and isinstance(e, (OSError, RuntimeError)):
                failed = os.path.basename(current) if os.path.dirname(current) == tmp else ""
                raise self._write_error(final, failed, os_err) from e
            raise
        if self.max_to_keep is not None:
            self._verify(final, step)  # older checkpoints are deleted only once the newest reads back intact
        self._prune(keep=step)
        return final

    def _write_file(self, path: str, write) -> dict:
        """Create the new file ``path`` (inside the root_dir, never through a link), call ``write(sink)`` with a
        file-like sink that hashes what it is given, fsync it; returns its manifest entry ``{"sha256", "bytes"}``."""
        with open_in_root(self.root_dir, path, "xb") as f:
            sink = _HashingWriter(f)
            write(sink)
            f.flush()
            os.fsync(f.fileno())
        return {"sha256": sink.sha256.hexdigest(), "bytes": sink.nbytes}

    def _move_into_place(self, tmp: str, final: str, step: int) -> None:
        """Rename the finished ``tmp`` to ``final``; an existing ``final`` is moved aside first, deleted after (file
        by file, as rotation deletes). A symlink (or anything but a directory) at ``final`` is refused."""
        old = None
        if require_kind_in_root(self.root_dir, final, "dir") == "dir":
            old = os.path.join(self.ckpt_root, f".tmp-old-ckpt-{step}-{os.getpid()}")
            remove_tree_in_root(self.root_dir, old)
            rename_in_root(self.root_dir, final, old)
        try:
            rename_in_root(self.root_dir, tmp, final)
        except BaseException:
            if old is not None:
                try:
                    rename_in_root(self.root_dir, old, final)  # put the previous checkpoint back
                except OSError:
                    logger.warning("could not move the previous checkpoint %s back to %s", old, final)
            raise
        fsync_dir_in_root(self.root_dir, self.ckpt_root)
        if old is not None:
            self._delete_checkpoint(old)

    def _write_error(self, final: str, failed_file: str, e: OSError) -> CheckpointWriteError:
        """One line: the checkpoint (and its file) that could not be written, why, what to free or change, and that
        the last checkpoint written before is untouched; a refused path (a symlink, ...) is its own line alone."""
        if isinstance(e, UnsafePathError):
            return CheckpointWriteError(str(e), file=e.filename or final)
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

    def _remove_quietly(self, tmp: str) -> None:
        """Delete alfish's own temporary directory ``tmp`` after a failed save (never crossing a link)."""
        try:
            remove_tree_in_root(self.root_dir, tmp)
        except OSError as e:
            logger.warning("could not remove the temporary checkpoint directory %s: %s", tmp, e)

    def _remove_stale_tmp_dirs(self) -> None:
        """Delete ``.tmp-*`` directories left by killed saves (not those of a live process saving right now); a
        symlink by such a name is removed itself, never what it points to."""
        for name in list_dir_in_root(self.root_dir, self.ckpt_root):
            m = _TMP_RE.match(name)
            if m and not _pid_alive(int(m.group(2))):
                logger.info("removing %s left by an interrupted checkpoint save", os.path.join(self.ckpt_root, name))
                self._remove_quietly(os.path.join(self.ckpt_root, name))

    def _prune(self, keep: int) -> None:
        """Delete the oldest checkpoints beyond ``max_to_keep`` (never ``keep``, the one just written)."""
        if self.max_to_keep is None:
            return
        steps = self.steps()
        excess = len(steps) - self.max_to_keep
        for s in steps:
            if excess <= 0:
                break
            if s == keep:
                continue
            self._delete_checkpoint(self.path_of(s))
            excess -= 1

    def _delete_checkpoint(self, path: str) -> None:
        """Delete the checkpoint directory ``path``: the files its manifest lists and the manifest, then the
        directory if nothing else is left in it. A link at ``path`` is not followed nor deleted through, and a
        directory whose manifest cannot be read is left as it is; either is one warning."""
        try:
            require_kind_in_root(self.root_dir, path, "dir")
            raw = read_bytes_in_root(self.root_dir, os.path.join(path, MANIFEST), MAX_MANIFEST_BYTES)
            if len(raw) > MAX_MANIFEST_BYTES:
                raise ValueError(f"{os.path.join(path, MANIFEST)} is larger than {MAX_MANIFEST_BYTES} bytes")
            listed = loads_bounded(raw, os.path.join(path, MANIFEST), _MAX_MANIFEST_VALUES)["files"]
            if not isinstance(listed, dict):
                raise TypeError(f"{os.path.join(path, MANIFEST)} has no table of files")
            names = [name for name in listed if isinstance(name, str)] + [MANIFEST]
            left = remove_listed(self.root_dir, path, names)
        except (OSError, ValueError, KeyError, TypeError) as e:
            logger.warning("left the old checkpoint %s in place (alfish deletes a checkpoint only by its manifest): "
                           "%s", path, " ".join(str(e).split()) or type(e).__name__)
            return
        if left:
            logger.warning("deleted the old checkpoint %s except what its manifest does not list: %s", path,
                           ", ".join(left))

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
        (each skipped with one warning naming the file). A ``ckpt-<step>`` that is not a real directory (a symlink)
        is never read; it is named in one warning."""
        steps = self.steps()
        self._warn_not_directories(steps)
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

    def _warn_not_directories(self, steps: list[int]) -> None:
        """One warning naming the ``ckpt-<step>`` entries that ``steps`` left out for not being real directories."""
        try:
            names = list_dir_in_root(self.root_dir, self.ckpt_root)
        except OSError:
            return
        ignored = sorted(name for name in names if step_of_dir_name(name) not in (None, *steps))
        if ignored:
            logger.warning("ignored %s in %s: not real directories (alfish never follows a link inside a results "
                           "directory)", printable(", ".join(ignored)), self.ckpt_root)

    def set_aside(self, steps: list[int], dest: str) -> list[str]:
        """Move the checkpoint directories of ``steps`` into the directory ``dest`` (created; it must not hold them
        yet), never deleting anything; returns their new paths. Used for checkpoints that did not verify, so that no
        later save replaces a file nobody could read. ``dest`` lies in the root_dir; a link on the way to it is
        refused, and a checkpoint entry that is a link is moved as the link itself."""
        make_dirs_in_root(self.root_dir, dest)
        moved = []
        for step in steps:
            target = os.path.join(dest, os.path.basename(self.path_of(step)))
            if kind_in_root(self.root_dir, target) != "missing":
                raise CheckpointError(f"cannot move {self.path_of(step)} aside: {target} exists; move one of them "
                                      "elsewhere and rerun")
            rename_in_root(self.root_dir, self.path_of(step), target)
            moved.append(target)
        fsync_dir_in_root(self.root_dir, self.ckpt_root)
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
