"""What one checkpoint directory holds, and how it is verified and read back (never executing what it holds).

Layout of one checkpoint (``ckpt_root/ckpt-<step>/``)::

    <name>.pt       one per entry of ``tensors`` (``torch.save`` of a nest of tensors and python scalars)
    meta.json       JSON metadata (progress, RNG states, operative config, versions, ...)
    manifest.json   written last: {"format": 1, "step": step, "files": {filename: {"sha256": hex, "bytes": int}}}

Reading checks every file against the manifest (sizes first, so nothing larger than the manifest says is read; the
manifest and ``meta.json`` themselves are size-bounded) and loads tensors with
``torch.load(weights_only=True, mmap=True)``: nothing from the directory is unpickled as arbitrary objects or
executed, and tensor data is mapped, not read into memory.

This module is the format: the names, the bounds, what may be saved, and the checks a directory must pass.
Writing, rotating and scanning the checkpoints of a run is ``alfish.rundir.checkpoint.Checkpointer``'s.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import re
import zipfile
from collections import OrderedDict
from typing import Any, Optional

import torch

from alfish.rundir.disk import DiskWriteError

__all__ = ["CheckpointError", "CheckpointWriteError", "LoadedCheckpoint", "MANIFEST", "META", "FORMAT",
           "MAX_MANIFEST_BYTES", "MAX_META_BYTES", "check_tensors", "encode_meta", "encode_manifest",
           "verify_manifest", "read_verified"]

MANIFEST = "manifest.json"
META = "meta.json"
FORMAT = 1

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


# ---------------------------------------------------------------------------------------------------- what is saved


def check_tensors(tensors: Any) -> None:
    """Raise CheckpointError unless ``tensors`` is a dict of plain file names -> nests ``torch.load(weights_only=True)``
    reads back (tensors, python scalars, dicts/lists/tuples of them)."""
    if not isinstance(tensors, dict):
        raise CheckpointError(f"tensors must be a dict name -> state dict, got {type(tensors).__name__}")
    for name, value in tensors.items():
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise CheckpointError(
                f"tensors name {name!r} cannot be a checkpoint file name; use letters, digits, '_', '.', '-' "
                "(not starting with '.' or '-')")
        _check_saveable(value, f"tensors[{name!r}]")


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


def encode_meta(meta: Any) -> bytes:
    """``meta.json``'s bytes: ``meta`` (a JSON-serializable dict) as indented UTF-8 JSON, at most MAX_META_BYTES."""
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
    return meta_bytes


def encode_manifest(step: int, files: dict[str, dict]) -> bytes:
    """``manifest.json``'s bytes; ``files``: file name -> ``{"sha256": hex, "bytes": int}``."""
    return json.dumps({"format": FORMAT, "step": step, "files": files}, indent=1).encode("utf-8")


# ---------------------------------------------------------------------------------------------------- reading back


def first_line(e: BaseException) -> str:
    """The first line of ``e``'s message (its type's name when it has none)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def verify_manifest(path: str, step: int) -> dict:
    """Check the checkpoint directory ``path`` of ``step`` against its manifest and return the manifest.

    Raises:
        CheckpointError: naming the failing file (a missing, oversized or malformed manifest, a file missing or
            differing from the manifest in size or sha256).
    """
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
        raise bad(f"is not a valid manifest ({type(e).__name__}: {first_line(e)})") from e
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


def read_verified(path: str, step: int, manifest: dict) -> LoadedCheckpoint:
    """The checkpoint in ``path`` whose ``manifest`` was verified (``verify_manifest``): its meta and its tensors
    (memory-mapped, ``weights_only``)."""
    mpath = os.path.join(path, META)
    try:
        with open(mpath, "rb") as f:
            meta = json.loads(f.read(MAX_META_BYTES + 1).decode("utf-8"))
    except (OSError, ValueError) as e:  # unreadable, bad UTF-8 or JSON
        raise CheckpointError(f"checkpoint {mpath} cannot be read ({first_line(e)})", file=mpath) from e
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
    detail = first_line(e)
    if "weights_only" in detail:  # torch's advice to load it unsafely: not ours to give
        detail = type(e).__name__
    return CheckpointError(f"checkpoint {fpath} cannot be read as tensors ({detail})", file=fpath)
