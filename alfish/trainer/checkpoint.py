"""Atomic, verifiable training checkpoints: a directory of tensor state dicts plus JSON, sealed by a manifest.

Layout of one checkpoint (``ckpt_root/ckpt-<step>/``)::

    <name>.pt       one per entry of ``tensors`` (``torch.save`` of a nest of tensors and python scalars)
    meta.json       JSON metadata (progress, RNG states, operative config, versions, ...)
    manifest.json   written last: {"format": 1, "step": step, "files": {filename: {"sha256": hex, "bytes": int}}}

A checkpoint is written into ``ckpt_root/.tmp-ckpt-<step>-<pid>/``, every file is fsynced, the manifest is written
last, and the directory is renamed into place, so ``ckpt-<step>`` either exists complete or not at all. Loading checks
every file against the manifest and loads tensors with ``torch.load(weights_only=True)``: nothing from the directory
is unpickled as arbitrary objects or executed.
"""
from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import logging
import operator
import os
import re
import shutil
from collections import OrderedDict
from typing import Any

import torch

__all__ = ["CheckpointError", "LoadedCheckpoint", "Checkpointer"]

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


class CheckpointError(Exception):
    """A checkpoint could not be written or read; the message is one line saying what is wrong and how to fix it."""


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
        max_to_keep: how many checkpoints to keep; after each successful save the oldest (by step) beyond this many
            are deleted. ``None`` keeps all.

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

        try:
            os.makedirs(self.ckpt_root, exist_ok=True)
        except OSError as e:
            raise self._write_error(self.ckpt_root, e) from e
        self._remove_stale_tmp_dirs()

        final = self.path_of(step)
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
                raise self._write_error(current, os_err) from e
            raise
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

    def _write_error(self, path: str, e: OSError) -> CheckpointError:
        reason = e.strerror or str(e)
        code = errno.errorcode.get(e.errno, "") if e.errno else ""
        hint = {errno.ENOSPC: " (free some disk space)",
                getattr(errno, "EDQUOT", errno.ENOSPC): " (free some space or raise the disk quota)",
                errno.EFBIG: " (the file size limit was reached: check `ulimit -f`)",
                errno.EACCES: " (check the directory's permissions)", errno.EROFS: " (the file system is read-only)",
                }.get(e.errno, "")
        return CheckpointError(
            f"could not write checkpoint {path}: {reason}{' [' + code + ']' if code else ''}{hint}; "
            f"the previous checkpoints in {self.ckpt_root} are intact")

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
        with one warning each naming the file, and the next older one is tried.
        """
        steps = self.steps()
        for i in range(len(steps) - 1, -1, -1):
            try:
                return self._load(steps[i])
            except CheckpointError as e:
                if i > 0:
                    logger.warning("%s; falling back to an older checkpoint (step %d)", e, steps[i - 1])
                else:
                    logger.warning("%s; no older checkpoint is left to fall back to", e)
        return None

    def load(self, step: int) -> LoadedCheckpoint:
        """Load exactly the checkpoint of training iteration ``step``, after verifying it against its manifest.

        Raises:
            CheckpointError: it does not exist or does not verify.
        """
        step = self._check_step(step)
        try:
            return self._load(step)
        except CheckpointError as e:
            raise CheckpointError(f"{e}; delete {self.path_of(step)} or load another step") from e

    def _load(self, step: int) -> LoadedCheckpoint:
        path = self.path_of(step)
        if not os.path.isdir(path):
            raise CheckpointError(f"no checkpoint at step {step}: {path} does not exist "
                                  f"(available steps: {self.steps() or 'none'})")
        manifest = self._verify(path, step)
        mpath = os.path.join(path, META)
        try:
            with open(mpath, "rb") as f:
                meta = json.loads(f.read().decode("utf-8"))
        except (OSError, ValueError) as e:  # unreadable, bad UTF-8 or JSON
            raise CheckpointError(f"checkpoint {mpath} cannot be read ({_first_line(e)})") from e
        if not isinstance(meta, dict):
            raise CheckpointError(f"checkpoint {mpath} does not hold a JSON object")
        tensors = {}
        for fname in manifest["files"]:
            if not fname.endswith(".pt"):
                continue
            fpath = os.path.join(path, fname)
            try:
                tensors[fname[:-3]] = torch.load(fpath, map_location="cpu", weights_only=True)
            except Exception as e:  # UnpicklingError for a disallowed global, RuntimeError for a bad archive, ...
                raise CheckpointError(f"checkpoint {fpath} cannot be loaded with torch.load(weights_only=True) "
                                      f"({_first_line(e)})") from e
        return LoadedCheckpoint(step=step, path=path, tensors=tensors, meta=meta)

    @staticmethod
    def _verify(path: str, step: int) -> dict:
        """Check ``path`` against its manifest and return the manifest; CheckpointError names the failing file."""
        mpath = os.path.join(path, MANIFEST)
        try:
            with open(mpath, "rb") as f:
                manifest = json.loads(f.read().decode("utf-8"))
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint {mpath} is missing (the directory was damaged or not written by "
                                  "alfish)") from None
        except (OSError, ValueError) as e:
            raise CheckpointError(f"checkpoint {mpath} is not a valid manifest ({type(e).__name__}: "
                                  f"{_first_line(e)})") from e
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
            raise CheckpointError(f"checkpoint {mpath} is not a valid manifest (no 'files' table)")
        if manifest.get("format") != FORMAT:
            raise CheckpointError(f"checkpoint {mpath} has format {manifest.get('format')!r}, this alfish reads "
                                  f"format {FORMAT}")
        if manifest.get("step") != step:
            raise CheckpointError(f"checkpoint {mpath} records step {manifest.get('step')!r} but its directory "
                                  f"says step {step}")
        files = manifest["files"]
        if META not in files:
            raise CheckpointError(f"checkpoint {mpath} does not list {META}")
        for fname, rec in files.items():
            if not (fname == META or (fname.endswith(".pt") and _NAME_RE.match(fname[:-3]))):
                raise CheckpointError(f"checkpoint {mpath} lists an invalid file name {fname!r}")
            fpath = os.path.join(path, fname)
            if not isinstance(rec, dict) or not isinstance(rec.get("sha256"), str) or \
                    not isinstance(rec.get("bytes"), int):
                raise CheckpointError(f"checkpoint {mpath} has a malformed entry for {fname!r}")
            try:
                size = os.path.getsize(fpath)
            except FileNotFoundError:
                raise CheckpointError(f"checkpoint {fpath} is missing (listed in its manifest)") from None
            if size != rec["bytes"]:
                raise CheckpointError(f"checkpoint {fpath} does not match its manifest (size {size} bytes, "
                                      f"manifest says {rec['bytes']})")
            digest = _sha256_of(fpath)
            if digest != rec["sha256"]:
                raise CheckpointError(f"checkpoint {fpath} does not match its manifest (sha256 {digest[:16]}..., "
                                      f"manifest says {rec['sha256'][:16]}...)")
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
