"""Atomic, verifiable training checkpoints: a directory of tensor state dicts plus JSON, sealed by a manifest.

Layout of one checkpoint (``ckpt_root/ckpt-<step>/``)::

    <name>.pt       one per entry of ``tensors`` (``torch.save`` of a nest of tensors and python scalars)
    meta.json       JSON metadata (progress, RNG states, operative config, versions, ...)
    manifest.json   written last: {"format": 1, "step": step, "files": {filename: {"sha256": hex, "bytes": int}}}

A checkpoint is written into ``ckpt_root/.tmp-ckpt-<step>-<pid>/``, every file is fsynced, the manifest is written
last, and the directory is renamed into place, so ``ckpt-<step>`` either exists complete or not at all. Loading checks
every file against the manifest (sizes first, so nothing larger than the manifest says is read; the manifest and
``meta.json`` themselves are size-bounded) and loads tensors with ``torch.load(weights_only=True, mmap=True)``: nothing
from the directory is unpickled as arbitrary objects or executed, and tensor data is mapped, not read into memory.

A checkpoint directory is never deleted for failing verification: ``scan`` reports the damaged ones and
``set_aside`` moves them out of the way (``alfish.trainer.resume`` decides when).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import operator
import os
import pickle
import re
import shutil
import zipfile
from collections import OrderedDict
from typing import Any, Optional

import torch

from alfish.rundir.disk import DiskWriteError, write_failure

__all__ = ["CheckpointError", "CheckpointWriteError", "LoadedCheckpoint", "Checkpointer", "Scan"]

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
META = "meta.json"
FORMAT = 1

_CKPT_RE = re.compile(r"^ckpt-(\d+)$")
_TMP_RE = re.compile(r"^\.tmp-(?:old-)?ckpt-(\d+)-(\d+)$")
# A tensors entry becomes the file "<name>.pt": keep names to plain, portable file names.
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
# Leaf types that torch.load(weights_only=True) reads back.
_SCALARS = (bool, int, float, complex, str, bytes, type(None), torch.Size, torch.dtype, torch.device)
_HASH_CHUNK = 1 << 20  # bytes read at a time when hashing
# Bounds on what is read into memory from a checkpoint (tensor files are memory-mapped, not read): a manifest lists a
# handful of files; meta holds counters, RNG states and the operative config (kilobytes).
MAX_MANIFEST_BYTES = 1 << 20
MAX_META_BYTES = 64 << 20


class CheckpointError(Exception):
    """A checkpoint could not be written or read; the message is one line saying what is wrong and how to fix it.

    ``file``: the file (or checkpoint directory) to blame, when there is one.
    """

    def __init__(self, message: str, file: Optional[str] = None) -> None:
        super().__init__(message)
        self.file = file


class CheckpointWriteError(CheckpointError, DiskWriteError):
    """The file system refused a checkpoint write (full disk, quota, read-only, permissions); the checkpoints already
    written are untouched, and writing another one (e.g. after the crash this causes) would fail the same way."""


@dataclasses.dataclass
class Scan:
    """What ``Checkpointer.scan`` found: the newest checkpoint that verifies (None if none does) and the newer ones
    that do not, newest first, each as ``(step, error)``."""

    latest: Optional["LoadedCheckpoint"]
    damaged: list[tuple[int, CheckpointError]]


@dataclasses.dataclass
class LoadedCheckpoint:
    """One verified checkpoint.

    Attributes:
        step: training iteration at which it was written.
        path: the checkpoint directory.
        tensors: name -> the nest that was saved under that name (tensors are on the CPU).
        meta: the JSON metadata.
    """

    step: int
    path: str
    tensors: dict[str, Any]
    meta: dict


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


def _os_error_in(exc: BaseException) -> OSError | None:
    """The OSError that caused ``exc`` (torch wraps errors of the file it writes to in a RuntimeError)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


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


def _check_saveable(obj: Any, where: str) -> None:
    """Raise CheckpointError if ``obj`` holds anything ``torch.load(weights_only=True)`` would refuse."""
    if isinstance(obj, torch.Tensor) or isinstance(obj, _SCALARS):
        return
    if isinstance(obj, (dict, OrderedDict)):
        for k, v in obj.items():
            if not isinstance(k, (str, int, float, bool, type(None))):
                raise CheckpointError(
                    f"{where} has a key of type {type(k).__name__}; checkpoint nests may only use str/int keys, "
                    "convert the key before saving")
            _check_saveable(v, f"{where}[{k!r}]")
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for i, v in enumerate(obj):
            _check_saveable(v, f"{where}[{i}]")
        return
    raise CheckpointError(
        f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}; checkpoints hold only tensors, python scalars "
        "and dicts/lists of them (they are loaded with torch.load(weights_only=True)), convert it (e.g. "
        "torch.as_tensor for arrays, .state_dict() for modules) or put it in meta")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _load_error(fpath: str, e: Exception) -> CheckpointError:
    """Why ``torch.load(fpath, weights_only=True, mmap=True)`` failed, in alfish's words: torch's own messages
    advise loading with ``weights_only=False`` (running whatever the file holds), which alfish never does."""
    if isinstance(e, pickle.UnpicklingError):
        found = re.search(r"GLOBAL (\S+) was not an allowed global", str(e))
        what = f" ({found.group(1)})" if found else ""
        return CheckpointError(
            f"checkpoint {fpath} contains Python objects other than tensors{what}; alfish never unpickles those (they "
            "could run code), so it was not written by alfish or was altered: use a checkpoint from a source you "
            "trust", file=fpath)
    if not zipfile.is_zipfile(fpath):
        return CheckpointError(f"checkpoint {fpath} is not a torch.save zip archive (it was not written by this "
                               "alfish)", file=fpath)
    detail = _first_line(e)
    if "weights_only" in detail:  # torch's advice to load it unsafely: not ours to give
        detail = type(e).__name__
    return CheckpointError(f"checkpoint {fpath} cannot be read as tensors ({detail})", file=fpath)


def _sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


class Checkpointer:
    """Writes and reads the checkpoints of one run under ``ckpt_root`` (one ``ckpt-<step>`` directory each).

    Args:
        ckpt_root: directory holding the checkpoints; created on the first save.
        max_to_keep: how many checkpoints to keep; after each successful save, once the new checkpoint verified
            (its files read back and hashed), the oldest (by step) beyond this many are deleted. ``None`` keeps all.

    Only one process may save into a ``ckpt_root`` at a time (in DDP: rank 0).
    """

    def __init__(self, ckpt_root: str, max_to_keep: int | None = None) -> None:
        if max_to_keep is not None and (isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int)
                                        or max_to_keep < 1):
            raise ValueError(f"max_to_keep must be None (keep all) or an int >= 1, got {max_to_keep!r}")
        self.ckpt_root = os.path.abspath(os.fspath(ckpt_root))
        self.max_to_keep = max_to_keep

    # ------------------------------------------------------------------ paths

    def path_of(self, step: int) -> str:
        """The directory of the checkpoint at training iteration ``step``."""
        return os.path.join(self.ckpt_root, f"ckpt-{int(step)}")

    def steps(self) -> list[int]:
        """Steps (training iterations) of the checkpoint directories, ascending; contents not verified.

        Only finished checkpoints are ever renamed to ``ckpt-<step>``, so each such directory counts (loading then
        verifies it); temporary ``.tmp-*`` directories left by a killed process are ignored.
        """
        try:
            names = os.listdir(self.ckpt_root)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise CheckpointError(f"cannot list checkpoint directory {self.ckpt_root}: {e.strerror or e}; "
                                  "check that it exists and is readable") from e
        steps = []
        for name in names:
            m = _CKPT_RE.match(name)
            if m and os.path.isdir(os.path.join(self.ckpt_root, name)):
                steps.append(int(m.group(1)))
        return sorted(steps)

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
        if not isinstance(tensors, dict):
            raise CheckpointError(f"tensors must be a dict name -> state dict, got {type(tensors).__name__}")
        for name, value in tensors.items():
            if not isinstance(name, str) or not _NAME_RE.match(name):
                raise CheckpointError(
                    f"tensors name {name!r} cannot be a checkpoint file name; use letters, digits, '_', '.', '-' "
                    "(not starting with '.' or '-')")
            _check_saveable(value, f"tensors[{name!r}]")
        if not isinstance(meta, dict):
            raise CheckpointError(f"meta must be a dict, got {type(meta).__name__}")
        try:
            meta_bytes = json.dumps(meta, indent=1, allow_nan=True).encode("utf-8")
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"meta is not JSON-serializable ({e}); store plain dicts/lists/str/numbers in meta "
                                  "and tensors in `tensors`") from e
        if len(meta_bytes) > MAX_META_BYTES:
            raise CheckpointError(f"meta is {len(meta_bytes)} bytes as JSON, more than the {MAX_META_BYTES} bytes a "
                                  "checkpoint's meta.json may hold; put large data in `tensors`")

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
            manifest = {"format": FORMAT, "step": step, "files": files}
            current = os.path.join(tmp, MANIFEST)
            self._write_file(current, json.dumps(manifest, indent=1).encode("utf-8"))
            _fsync_dir(tmp)
            current = final
            self._move_into_place(tmp, final, step)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
            os_err = _os_error_in(e)
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
                    logger.warning("%s; falling back to an older checkpoint (step %d)", e, steps[i - 1])
                else:
                    logger.warning("%s; no older checkpoint is left to fall back to", e)
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
            if not os.path.isdir(self.path_of(step)):
                raise  # the message already lists the steps there are
            raise CheckpointError(f"{e}; load another step (available: {self.steps()}) or move {self.path_of(step)} "
                                  "out of the checkpoints folder", file=e.file) from e

    def _load(self, step: int) -> LoadedCheckpoint:
        path = self.path_of(step)
        if not os.path.isdir(path):
            raise CheckpointError(f"no checkpoint at step {step}: {path} does not exist "
                                  f"(available steps: {self.steps() or 'none'})", file=path)
        manifest = self._verify(path, step)
        mpath = os.path.join(path, META)
        try:
            with open(mpath, "rb") as f:
                meta = json.loads(f.read(MAX_META_BYTES + 1).decode("utf-8"))
        except (OSError, ValueError) as e:  # unreadable, bad UTF-8 or JSON
            raise CheckpointError(f"checkpoint {mpath} cannot be read ({_first_line(e)})", file=mpath) from e
        if not isinstance(meta, dict):
            raise CheckpointError(f"checkpoint {mpath} does not hold a JSON object", file=mpath)
        tensors = {}
        for fname in manifest["files"]:
            if not fname.endswith(".pt"):
                continue
            fpath = os.path.join(path, fname)
            try:
                # mmap: tensor data stays in the file (the page cache) until used; only the small pickle is read
                tensors[fname[:-3]] = torch.load(fpath, map_location="cpu", weights_only=True, mmap=True)
            except Exception as e:  # UnpicklingError for a disallowed global, RuntimeError for a bad archive, ...
                raise _load_error(fpath, e) from e
        return LoadedCheckpoint(step=step, path=path, tensors=tensors, meta=meta)

    @staticmethod
    def _verify(path: str, step: int) -> dict:
        """Check ``path`` against its manifest and return the manifest; CheckpointError names the failing file."""
        mpath = os.path.join(path, MANIFEST)

        def bad(message: str, file: str = mpath) -> CheckpointError:
            return CheckpointError(f"checkpoint {file} {message}", file=file)

        try:
            with open(mpath, "rb") as f:
                raw = f.read(MAX_MANIFEST_BYTES + 1)
            if len(raw) > MAX_MANIFEST_BYTES:
                raise bad(f"is larger than the {MAX_MANIFEST_BYTES} bytes a manifest may have (it was not written by "
                          "alfish)")
            manifest = json.loads(raw.decode("utf-8"))
        except FileNotFoundError:
            raise bad("is missing (the directory was damaged or not written by alfish)") from None
        except (OSError, ValueError) as e:
            raise bad(f"is not a valid manifest ({type(e).__name__}: {_first_line(e)})") from e
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
            raise bad("is not a valid manifest (no 'files' table)")
        if manifest.get("format") != FORMAT:
            raise bad(f"has format {manifest.get('format')!r}, this alfish reads format {FORMAT}")
        if manifest.get("step") != step:
            raise bad(f"records step {manifest.get('step')!r} but its directory says step {step}")
        files = manifest["files"]
        if META not in files:
            raise bad(f"does not list {META}")
        for fname, rec in files.items():
            if not (fname == META or (fname.endswith(".pt") and _NAME_RE.match(fname[:-3]))):
                raise bad(f"lists an invalid file name {fname!r}")
            fpath = os.path.join(path, fname)
            if not isinstance(rec, dict) or not isinstance(rec.get("sha256"), str) or \
                    isinstance(rec.get("bytes"), bool) or not isinstance(rec.get("bytes"), int):
                raise bad(f"has a malformed entry for {fname!r}")
            if fname == META and rec["bytes"] > MAX_META_BYTES:
                raise bad(f"says {META} has {rec['bytes']} bytes, more than the {MAX_META_BYTES} bytes alfish "
                          "reads (it was not written by alfish)")
            try:
                size = os.path.getsize(fpath)
            except FileNotFoundError:
                raise bad("is missing (listed in its manifest)", fpath) from None
            if size != rec["bytes"]:
                raise bad(f"does not match its manifest (size {size} bytes, manifest says {rec['bytes']})", fpath)
            digest = _sha256_of(fpath)
            if digest != rec["sha256"]:
                raise bad(f"does not match its manifest (sha256 {digest[:16]}..., manifest says "
                          f"{rec['sha256'][:16]}...)", fpath)
        return manifest

    @staticmethod
    def _check_step(step: int) -> int:
        try:
            value = operator.index(step)  # int, numpy integer, 0-d integer tensor
        except TypeError:
            value = -1
        if isinstance(step, bool) or value < 0:
            raise CheckpointError(f"step must be an int >= 0 (the training iteration), got {step!r}")
        return value
