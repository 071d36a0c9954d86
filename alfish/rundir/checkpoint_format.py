"""What one checkpoint directory holds, and how it is verified and read back (never executing what it holds).

Layout of one checkpoint (``ckpt_root/ckpt-<step>/``)::

    <name>.pt       one per entry of ``tensors`` (``torch.save`` of a nest of tensors and python scalars)
    meta.json       JSON metadata (progress, RNG states, operative config, versions, ...)
    manifest.json   written last: {"format": 1, "step": step, "files": {filename: {"sha256": hex, "bytes": int}}}

Reading treats the directory as untrusted (DESIGN.md §3.13). Every file is opened below the results directory
without following a link, and only if it is a regular file (``alfish.rundir.safe_paths``: a FIFO never blocks), then
checked against the manifest on that one descriptor (size first, so nothing larger than the manifest says is read,
then sha256). The manifest and ``meta.json`` are JSON bounded in bytes, depth and values
(``alfish.rundir.bounded``), and meta's counters must be in range (``alfish.rundir.checkpoint_meta``). A tensor file
must be a zip whose entries are stored uncompressed (as ``torch.save`` writes them; a deflated entry could inflate to
gigabytes) and is loaded through the same descriptor with ``torch.load(weights_only=True, mmap=True)``: nothing from
the directory is unpickled as arbitrary objects or executed, and tensor data is mapped, not read into memory. Any
failure, a ``RecursionError`` or ``MemoryError`` included, is a one-line ``CheckpointError`` naming the file: the
checkpoint is damaged and ``Checkpointer.scan`` tries the next older one.

This module is the format: the names, the bounds, what may be saved, and the checks a directory must pass.
Writing, rotating and scanning the checkpoints of a run is ``alfish.rundir.checkpoint.Checkpointer``'s.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import pickle
import re
import sys
import zipfile
from collections import OrderedDict
from typing import IO, Any, Iterator, Optional

import torch

from alfish.rundir.bounded import RootDirContentError, loads_bounded
from alfish.rundir.checkpoint_meta import check_meta_numbers, meta_count, meta_real
from alfish.rundir.disk import DiskWriteError
from alfish.rundir.safe_paths import UnsafePathError, open_in_root, read_bytes_in_root

__all__ = ["CheckpointError", "CheckpointWriteError", "LoadedCheckpoint", "MANIFEST", "META", "FORMAT",
           "MAX_MANIFEST_BYTES", "MAX_MANIFEST_VALUES", "MAX_META_BYTES", "MAX_META_VALUES", "MAX_NEST_DEPTH",
           "CONTENT_ERRORS", "check_tensors", "encode_meta", "encode_manifest",
           "verify_manifest", "read_verified"]

MANIFEST = "manifest.json"
META = "meta.json"
FORMAT = 1

# A tensors entry becomes the file "<name>.pt": keep names to plain, portable file names.
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
# Leaf types that torch.load(weights_only=True) reads back.
_SCALARS = (bool, int, float, complex, str, bytes, type(None), torch.Size, torch.dtype, torch.device)
_HASH_CHUNK = 1 << 20  # bytes read at a time when hashing
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
# Bounds on what is read into memory from a checkpoint (tensor files are memory-mapped, not read): a manifest lists a
# handful of files; meta holds counters, RNG states and the operative config (alfish writes about 20 KB). The value
# counts bound the Python objects a JSON file becomes (~50-100 bytes each), not only the bytes read.
MAX_MANIFEST_BYTES = 1 << 20
MAX_MANIFEST_VALUES = 100_000
MAX_META_BYTES = 16 << 20
MAX_META_VALUES = 1_000_000
_MAX_FILE_BYTES = 1 << 50  # a size a manifest may state for one file (1 PiB)
# Loaded tensor nests: state dicts are a few containers deep; walking code (load_state_dict) recurses.
MAX_NEST_DEPTH = 64
_MAX_NEST_ITEMS = 10_000_000
_CONTAINERS = (dict, list, tuple)
# Reading through the open descriptor: Linux names it /proc/self/fd/N (elsewhere the path is reopened).
_PROC_FD = sys.platform.startswith("linux") and os.path.isdir("/proc/self/fd")
#: What content of a results directory can raise while a checkpoint is read: damage (``UnsafePathError`` is an
#: OSError, ``RootDirContentError`` a ValueError), never a traceback.
CONTENT_ERRORS = (OSError, ValueError, RecursionError, OverflowError, MemoryError, EOFError, zipfile.BadZipFile)


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

    def count(self, name: str, default: Any = None) -> int:
        """meta's whole number ``name`` (e.g. 'iteration', 'world_size'; ``default`` when absent), checked in the
        range ``alfish.rundir.checkpoint_meta.META_COUNTS`` gives it.

        Raises:
            CheckpointError: out of range, not a whole number, or absent without a default (one line).
        """
        return self._checked(meta_count, name, default)

    def real(self, name: str, default: Any = None) -> float:
        """meta's real number ``name`` (e.g. 'elapsed_s'), checked in its ``META_REALS`` range (as ``count``)."""
        return self._checked(meta_real, name, default)

    def _checked(self, getter: Any, name: str, default: Any) -> Any:
        what = f"checkpoint {os.path.join(self.path, META)}"
        try:
            return getter(self.meta, name, what, default)
        except RootDirContentError as e:
            raise CheckpointError(str(e), file=os.path.join(self.path, META)) from None


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
# Each file is opened once, below the root_dir without following a link (``alfish.rundir.safe_paths``); its size is
# checked against the manifest on the open descriptor, it is hashed through that descriptor, and a tensor file is
# checked as a zip and loaded through the same descriptor (``/proc/self/fd/N``), so what was verified is what is read.


def first_line(e: BaseException) -> str:
    """The first line of ``e``'s message (its type's name when it has none)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _bad(file: str, message: str) -> CheckpointError:
    return CheckpointError(f"checkpoint {file} {message}", file=file)


@contextlib.contextmanager
def _damage_in(file: str) -> Iterator[None]:
    """Whatever reading ``file`` raises (a link, a FIFO, an unreadable or malformed file, content out of bounds,
    a nest too deep for Python's recursion) becomes one CheckpointError naming it: the checkpoint is damaged."""
    try:
        yield
    except CheckpointError:
        raise
    except FileNotFoundError:
        raise _bad(file, "is missing (the directory was damaged or not written by alfish)" if file.endswith(MANIFEST)
                   else "is missing (listed in its manifest)") from None
    except (UnsafePathError, RootDirContentError) as e:  # their messages already name the file
        text = " ".join(str(e).split())
        raise CheckpointError(text if text.startswith("checkpoint ") else f"checkpoint {text}", file=file) from None
    except CONTENT_ERRORS as e:
        raise _bad(file, f"cannot be read ({type(e).__name__}: {first_line(e)[:200]})") from None


def _read_manifest(root: str, path: str, step: int) -> dict:
    """The manifest of the checkpoint directory ``path``, its structure checked (not yet the files it lists)."""
    mpath = os.path.join(path, MANIFEST)
    with _damage_in(mpath):
        raw = read_bytes_in_root(root, mpath, MAX_MANIFEST_BYTES)
        if len(raw) > MAX_MANIFEST_BYTES:
            raise _bad(mpath, f"is larger than the {MAX_MANIFEST_BYTES} bytes a manifest may have (it was not "
                              "written by alfish)")
        try:
            manifest = loads_bounded(raw, "it", MAX_MANIFEST_VALUES)
        except RootDirContentError as e:
            raise _bad(mpath, f"is not a valid manifest: {e}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise _bad(mpath, "is not a valid manifest (no 'files' table)")
    if manifest.get("format") != FORMAT:
        raise _bad(mpath, f"has format {repr(manifest.get('format'))[:40]}, this alfish reads format {FORMAT}")
    if manifest.get("step") != step or isinstance(manifest.get("step"), bool):
        raise _bad(mpath, f"records step {repr(manifest.get('step'))[:40]} but its directory says step {step}")
    files = manifest["files"]
    if META not in files:
        raise _bad(mpath, f"does not list {META}")
    for fname, rec in files.items():
        if not (fname == META or (fname.endswith(".pt") and _NAME_RE.match(fname[:-3]))):
            raise _bad(mpath, f"lists an invalid file name {fname[:80]!r}")
        nbytes = rec.get("bytes") if isinstance(rec, dict) else None
        if not isinstance(rec, dict) or not isinstance(rec.get("sha256"), str) or not _SHA256_RE.match(rec["sha256"]) \
                or isinstance(nbytes, bool) or not isinstance(nbytes, int) or not 0 <= nbytes <= _MAX_FILE_BYTES:
            raise _bad(mpath, f"has a malformed entry for {fname!r}")
        if fname == META and nbytes > MAX_META_BYTES:
            raise _bad(mpath, f"says {META} has {nbytes} bytes, more than the {MAX_META_BYTES} bytes alfish reads "
                              "(it was not written by alfish)")
    return manifest


def _listed_in_order(manifest: dict) -> list[tuple[str, dict]]:
    """The manifest's files, meta.json first (the small file decides before any tensor file is mapped)."""
    return sorted(manifest["files"].items(), key=lambda item: item[0] != META)


@contextlib.contextmanager
def _opened(root: str, fpath: str, rec: dict) -> Iterator[IO[bytes]]:
    """``fpath`` opened (regular file, no link on the way) once its size is the manifest's."""
    with open_in_root(root, fpath, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size != rec["bytes"]:
            raise _bad(fpath, f"does not match its manifest (size {size} bytes, manifest says {rec['bytes']})")
        yield f


def _check_digest(h: Any, fpath: str, rec: dict) -> None:
    digest = h.hexdigest()
    if digest != rec["sha256"]:
        raise _bad(fpath, f"does not match its manifest (sha256 {digest[:16]}..., manifest says "
                          f"{rec['sha256'][:16]}...)")


def _hash_file(f: IO[bytes]) -> Any:
    h = hashlib.sha256()
    f.seek(0)
    while chunk := f.read(_HASH_CHUNK):
        h.update(chunk)
    return h


def verify_manifest(root: str, path: str, step: int) -> dict:
    """Check the checkpoint directory ``path`` of ``step`` (inside the results directory ``root``) against its
    manifest and return the manifest.

    Raises:
        CheckpointError: naming the failing file (a missing, oversized or malformed manifest; a file missing, a link
            or not a regular file, or differing from the manifest in size or sha256).
    """
    manifest = _read_manifest(root, path, step)
    for fname, rec in _listed_in_order(manifest):
        fpath = os.path.join(path, fname)
        with _damage_in(fpath), _opened(root, fpath, rec) as f:
            _check_digest(_hash_file(f), fpath, rec)
    return manifest


def read_verified(root: str, path: str, step: int) -> LoadedCheckpoint:
    """The checkpoint in directory ``path`` of ``step`` (inside the results directory ``root``), every file verified
    against the manifest as it is read: its meta (bounded JSON, numbers in range) and its tensors (memory-mapped,
    ``weights_only``, from archives whose entries are stored uncompressed).

    Raises:
        CheckpointError: one line naming the damaged file (``verify_manifest``'s reasons, meta out of bounds, a tensor
            file that is not torch.save's zip archive or holds more than tensors and plain nests).
    """
    meta: Optional[dict] = None
    tensors: dict[str, Any] = {}
    for fname, rec in _listed_in_order(_read_manifest(root, path, step)):
        fpath = os.path.join(path, fname)
        with _damage_in(fpath), _opened(root, fpath, rec) as f:
            if fname == META:
                raw = f.read(MAX_META_BYTES + 1)
                _check_digest(hashlib.sha256(raw), fpath, rec)
                meta = _parse_meta(raw, fpath, step)
            else:
                _check_digest(_hash_file(f), fpath, rec)
                _check_archive(f, fpath, rec["bytes"])
                tensors[fname[:-3]] = _load_tensors(f, fpath)
    assert meta is not None  # (the manifest lists it: _read_manifest)
    return LoadedCheckpoint(step=step, path=path, tensors=tensors, meta=meta)


def _parse_meta(raw: bytes, fpath: str, step: int) -> dict:
    meta = loads_bounded(raw, f"checkpoint {fpath}", MAX_META_VALUES)
    if not isinstance(meta, dict):
        raise _bad(fpath, "does not hold a JSON object")
    check_meta_numbers(meta, f"checkpoint {fpath}", step)
    return meta


def _check_archive(f: IO[bytes], fpath: str, nbytes: int) -> None:
    """Raise unless ``f`` is a zip whose entries are all stored uncompressed (``torch.save`` never compresses) and
    hold at most ``nbytes`` (the file's size) in all: a deflated entry could inflate to gigabytes inside
    ``torch.load``. Only the zip's central directory is read (at most the file's size)."""
    try:
        with zipfile.ZipFile(f) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError):
        raise _bad(fpath, "is not a torch.save zip archive (it was not written by this alfish)") from None
    total = 0
    for entry in entries:
        if entry.compress_type != zipfile.ZIP_STORED or entry.compress_size != entry.file_size:
            raise _bad(fpath, f"holds the compressed entry {entry.filename[:80]!r} ({entry.compress_size} bytes "
                              f"that would inflate to {entry.file_size}); torch.save never compresses, so it was not "
                              "written by alfish (nothing was inflated)")
        total += entry.file_size
    if total > nbytes:
        raise _bad(fpath, f"has entries of {total} bytes in all, more than the archive's {nbytes} bytes (it was not "
                          "written by alfish)")


def _load_tensors(f: IO[bytes], fpath: str) -> Any:
    """``torch.load`` of the open, verified file ``f`` (weights only, memory-mapped), through its descriptor where
    the platform names one (``/proc/self/fd/N`` reopens that very file; elsewhere its path ``fpath``)."""
    source = f"/proc/self/fd/{f.fileno()}" if _PROC_FD else fpath
    try:
        # mmap: tensor data stays in the file (the page cache) until used; only the small pickle is read
        nest = torch.load(source, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # UnpicklingError for a disallowed global, RuntimeError for a bad archive, ...
        raise _load_error(fpath, e) from e
    _check_nest(nest, fpath)
    return nest


def _check_nest(nest: Any, fpath: str) -> None:
    """Raise unless the loaded ``nest`` is at most ``MAX_NEST_DEPTH`` containers deep and has at most
    ``_MAX_NEST_ITEMS`` items in all (counting a shared container each time it is reached): code that walks a nest
    (``load_state_dict``, an optimizer's state) recurses. Iterative, so a deep nest cannot overflow the check."""
    pending = [(nest, 1)]
    budget = _MAX_NEST_ITEMS
    while pending:
        node, depth = pending.pop()
        if not isinstance(node, _CONTAINERS):
            continue  # a tensor or a python scalar
        items = node.values() if isinstance(node, dict) else node
        if depth > MAX_NEST_DEPTH:
            raise _bad(fpath, f"holds a nest more than {MAX_NEST_DEPTH} containers deep (it was not written by "
                              "alfish)")
        budget -= len(items)
        if budget < 0:
            raise _bad(fpath, f"holds nests of more than {_MAX_NEST_ITEMS} items in all (it was not written by "
                              "alfish)")
        pending += [(child, depth + 1) for child in items if isinstance(child, _CONTAINERS)]


def _load_error(fpath: str, e: Exception) -> CheckpointError:
    """Why ``torch.load(fpath, weights_only=True, mmap=True)`` failed, in alfish's words: torch's own messages
    advise loading with ``weights_only=False`` (running whatever the file holds), which alfish never does."""
    if isinstance(e, pickle.UnpicklingError):
        found = re.search(r"GLOBAL (\S+) was not an allowed global", str(e))
        what = f" ({found.group(1)[:80]})" if found else ""
        return CheckpointError(
            f"checkpoint {fpath} contains Python objects other than tensors{what}; alfish never unpickles those (they "
            "could run code), so it was not written by alfish or was altered: use a checkpoint from a source you "
            "trust", file=fpath)
    detail = first_line(e)[:200]
    if "weights_only" in detail:  # torch's advice to load it unsafely: not ours to give
        detail = type(e).__name__
    return CheckpointError(f"checkpoint {fpath} cannot be read as tensors ({detail})", file=fpath)
