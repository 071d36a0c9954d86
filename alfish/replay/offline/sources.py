"""One loader for every source of offline data: ``load_offline_data("kind:path" or "path") -> Steps``.

Kinds (detected from the path, or named with a ``kind:`` prefix):

* ``alfish``: an alfish dataset directory (``dataset.json`` + ``.npy`` files; see ``alfish_format.py``), memory-mapped.
* ``alfish_run``: an alfish results directory or one of its checkpoint directories: its saved replay buffer
  (``from_run.py``).
* ``minari``: a local Minari dataset directory (``data/main_data.hdf5`` + ``data/metadata.json``), read through the
  ``minari`` package (``pip install alfish[offline]``).
* ``d4rl``: D4RL-style transition arrays (``observations, actions, rewards, terminals``, optional ``timeouts``,
  ``next_observations``) in an ``.npz`` file, an HDF5 file (``.hdf5``/``.h5``, through h5py) or a directory of
  ``.npy`` files. They are converted to steps (``d4rl.py``): in memory when the result fits under
  ``in_memory_limit_bytes``, else chunk by chunk into an alfish dataset in ``cache_dir`` (once; later loads map it).

Larger than memory: ``.npy`` files and the members of an uncompressed ``.npz`` are memory-mapped (numpy ignores
``mmap_mode`` for ``.npz``, so each member is mapped at its data offset inside the zip file); HDF5 is read in slabs; a
compressed ``.npz`` is loaded only if it fits in the memory available. Nothing is ever unpickled
(``allow_pickle=False``; checkpoints with ``weights_only=True``).
"""
from __future__ import annotations

import hashlib
import logging
import os
import zipfile
from pathlib import Path
from typing import Mapping, Optional

import numpy as np
import psutil

from alfish.replay.offline.alfish_format import DatasetWriter, is_alfish_dataset, read_dataset
from alfish.replay.offline.d4rl import d4rl_to_steps
from alfish.replay.offline.from_run import is_alfish_run, read_run
from alfish.replay.offline.steps import Steps, check_steps

KINDS = ("alfish", "alfish_run", "minari", "d4rl")
D4RL_FILE_SUFFIXES = (".npz", ".hdf5", ".h5")
OFFLINE_EXTRA = "pip install 'alfish[offline]'"


def split_kind(spec: str) -> tuple[Optional[str], str]:
    """``'minari:/data/x'`` -> ``('minari', '/data/x')``; a plain path -> ``(None, path)``."""
    head, sep, rest = str(spec).partition(":")
    if sep and head in KINDS:
        return head, rest
    return None, str(spec)


def detect_kind(path: str | os.PathLike) -> str:
    """The kind of offline data at ``path`` (see the module docstring), or a one-line ValueError."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"offline data {str(path)!r} does not exist; give a dataset directory or file "
                         f"(optionally prefixed by its kind: {', '.join(k + ':' for k in KINDS)})")
    if p.is_file():
        if p.suffix.lower() in D4RL_FILE_SUFFIXES:
            return "d4rl"
        raise ValueError(f"offline data {str(path)!r}: unknown file type {p.suffix!r}; D4RL-style arrays come as "
                         f"{'/'.join(D4RL_FILE_SUFFIXES)}, other sources as directories")
    if is_alfish_dataset(p):
        return "alfish"
    if is_alfish_run(p):
        return "alfish_run"
    if (p / "data" / "main_data.hdf5").is_file() or (p / "data" / "metadata.json").is_file():
        return "minari"
    if (p / "observations.npy").is_file():
        return "d4rl"
    raise ValueError(f"offline data {str(path)!r}: not an alfish dataset (dataset.json), an alfish results or "
                     "checkpoint directory, a Minari dataset (data/main_data.hdf5) nor a directory of D4RL .npy "
                     "arrays (observations.npy, ...); name the kind with a prefix such as 'd4rl:PATH'")


def load_offline_data(spec: str, cache_dir: Optional[str | os.PathLike] = None,
                      in_memory_limit_bytes: Optional[int] = None) -> Steps:
    """The steps of offline source ``spec`` (``[kind:]path``), checked (see ``steps.check_steps``).

    cache_dir: where D4RL data too large for memory is converted to (default: a folder beside the source).
    in_memory_limit_bytes: largest converted dataset kept in memory (default: half the memory available now).
    """
    kind, path = split_kind(spec)
    kind = kind or detect_kind(path)
    if kind != "d4rl" and not Path(path).exists():
        raise ValueError(f"offline data {path!r} ({kind}) does not exist")
    if kind == "alfish":
        steps = read_dataset(path)
    elif kind == "alfish_run":
        steps = read_run(path)
    elif kind == "minari":
        from alfish.replay.offline.minari_format import read_minari  # (the optional minari package)

        steps = read_minari(path)
    else:
        steps = _load_d4rl(path, cache_dir, in_memory_limit_bytes)
    check_steps(steps)
    if steps.dropped:
        logging.warning("%s: no next_observations, so the last transition of each episode was dropped (%d of them)",
                        path, steps.dropped)
    return steps


# ------------------------------------------------------------------------------------------------------- D4RL ----
def _load_d4rl(path: str, cache_dir: Optional[str | os.PathLike], in_memory_limit_bytes: Optional[int]) -> Steps:
    p = Path(path)
    if not p.exists():
        raise ValueError(f"offline data {path!r} (d4rl) does not exist")
    handle = None
    if p.is_dir():
        arrays = _npy_directory(p)
    elif p.suffix.lower() == ".npz":
        arrays = _npz_arrays(p)
    else:
        handle, arrays = _hdf5_arrays(p)
    try:
        limit = in_memory_limit_bytes if in_memory_limit_bytes is not None else psutil.virtual_memory().available // 2
        if _converted_bytes(arrays) <= limit:
            return d4rl_to_steps(arrays, str(p))
        target = Path(cache_dir or p.parent / ".alfish_offline_cache") / _cache_name(p)
        if not (target / "dataset.json").is_file():
            logging.info("%s: converting to alfish steps in %s (larger than the %d MB kept in memory; done once)",
                         p, target, limit >> 20)
            writer = DatasetWriter(target)
            try:
                steps = d4rl_to_steps(arrays, str(p), allocate=writer.allocate)
                writer.finish(steps)
            except BaseException:
                writer.abort()
                raise
        return read_dataset(target)
    finally:
        if handle is not None:
            handle.close()


def _converted_bytes(arrays: Mapping[str, np.ndarray]) -> int:
    rows = len(arrays["observations"])
    per_row = sum(int(np.prod(arrays[k].shape[1:], dtype=np.int64)) * 4 for k in ("observations", "actions"))
    return rows * (per_row + 9)


def _cache_name(path: Path) -> str:
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()
    return f"{path.stem}-{hashlib.sha256(key).hexdigest()[:12]}"


def _npy_directory(path: Path) -> dict[str, np.ndarray]:
    arrays = {}
    for file in sorted(path.glob("*.npy")):
        try:
            arrays[file.stem] = np.load(file, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as err:
            raise ValueError(f"{file}: cannot read ({str(err).splitlines()[0]}); the file is truncated or not a "
                             "plain .npy array") from None
    return arrays


def _npz_arrays(path: Path) -> dict[str, np.ndarray]:
    """The members of ``path``: memory-mapped at their offsets when stored uncompressed, else loaded (if they fit)."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            if all(m.compress_type == zipfile.ZIP_STORED for m in members):
                return {Path(m.filename).stem: _map_npz_member(path, archive, m) for m in members
                        if m.filename.endswith(".npy")}
            size = sum(m.file_size for m in members)
    except zipfile.BadZipFile as err:
        raise ValueError(f"{path}: not a readable .npz ({err}); the file is truncated or corrupt") from None
    available = psutil.virtual_memory().available
    if size > available // 2:
        raise ValueError(f"{path}: a compressed .npz of {size >> 20} MB does not fit in the {available >> 20} MB "
                         "available; save it uncompressed (np.savez) or as a directory of .npy files, which are "
                         "memory-mapped")
    logging.info("%s: compressed .npz, loaded into memory (%d MB); an uncompressed one would be memory-mapped",
                 path, size >> 20)
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        raise ValueError(f"{path}: cannot read ({str(err).splitlines()[0]}); the file is truncated, corrupt or "
                         "holds pickled objects") from None


def _map_npz_member(path: Path, archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> np.ndarray:
    """A read-only memory map of one uncompressed ``.npy`` member, at its data's offset inside the zip file."""
    with open(path, "rb") as f:
        f.seek(member.header_offset)
        local = f.read(30)
        if len(local) < 30 or local[:4] != b"PK\x03\x04":
            raise ValueError(f"{path}: member {member.filename} has a broken zip header; the file is corrupt")
        name_len, extra_len = int.from_bytes(local[26:28], "little"), int.from_bytes(local[28:30], "little")
        start = member.header_offset + 30 + name_len + extra_len
        f.seek(start)
        try:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(f)  # (numpy's own header parser: no eval of untrusted text)
        except ValueError as err:
            raise ValueError(f"{path}: member {member.filename} is not a plain .npy array ({err})") from None
        if dtype.hasobject:
            raise ValueError(f"{path}: member {member.filename} has dtype object; alfish never loads pickled data")
        data_start = f.tell()
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if data_start - start + nbytes > member.file_size:
        raise ValueError(f"{path}: member {member.filename} is truncated ({member.file_size} bytes, its header "
                         f"announces {nbytes} of data)")
    if nbytes == 0:
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=data_start, shape=shape, order="F" if fortran else "C")


def _hdf5_arrays(path: Path):
    try:
        import h5py
    except ImportError:
        raise ImportError(f"reading {path} needs h5py: {OFFLINE_EXTRA}") from None
    try:
        handle = h5py.File(path, "r")
    except OSError as err:
        raise ValueError(f"{path}: not a readable HDF5 file ({str(err).splitlines()[0]})") from None
    arrays = {}
    for key, value in handle.items():
        if isinstance(value, h5py.Dataset):
            if value.dtype.kind == "O":
                handle.close()
                raise ValueError(f"{path}: field '{key}' has dtype object; store plain numeric arrays")
            arrays[key] = value
    return handle, arrays
