"""alfish's own dataset format: a directory of ``.npy`` files (one per field) plus ``dataset.json``.

    DIR/dataset.json          {"format": "alfish-steps", "version": 1, "num_steps", "num_episodes", "dropped",
                               "fields": {name: {"file", "dtype", "shape"}}, "observation_space", "action_space",
                               "source"}
    DIR/step_type.npy         int8 [T]
    DIR/reward.npy            float32 [T]
    DIR/discount.npy          float32 [T]
    DIR/observation.npy       [T, *obs]   (a dict observation: observation.<key>.npy per key)
    DIR/action.npy            [T, *act]

Plain ``.npy`` files are what numpy memory-maps (``mmap_mode='r'``): a dataset larger than memory is read page by page
as batches touch it. Loading never unpickles (``allow_pickle=False``), and the JSON is data only. A dataset is written
into a temporary sibling directory and renamed into place, so a crash never leaves a half-written one behind.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from alfish.replay.offline.steps import Steps, check_steps, space_from_json, space_to_json

FORMAT = "alfish-steps"
VERSION = 1
META = "dataset.json"
_SCALAR_FIELDS = ("step_type", "reward", "discount", "action")


def is_alfish_dataset(path: str | os.PathLike) -> bool:
    return (Path(path) / META).is_file()


class DatasetWriter:
    """Writes a dataset field by field into a temporary directory, then ``finish`` renames it to ``out_dir``.

    ``allocate(name, shape, dtype)`` returns a writable memory map of the field's ``.npy`` file, so a converter fills
    data larger than memory chunk by chunk (``d4rl_to_steps(..., allocate=writer.allocate)``).
    """

    def __init__(self, out_dir: str | os.PathLike):
        self.out_dir = Path(out_dir)
        if self.out_dir.exists():
            raise FileExistsError(f"{self.out_dir} already exists; choose a new directory for the dataset")
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out_dir.name}.", dir=self.out_dir.parent))

    def allocate(self, name: str, shape: tuple, dtype: np.dtype) -> np.ndarray:
        return np.lib.format.open_memmap(self.tmp / f"{name}.npy", mode="w+", dtype=dtype, shape=shape)

    def finish(self, steps: Steps) -> Path:
        """Write every field of ``steps`` not written through ``allocate`` yet, then the metadata; rename in place."""
        try:
            fields = {}
            for name, array in steps.arrays().items():
                path = self.tmp / f"{name}.npy"
                if isinstance(array, np.memmap) and Path(array.filename or "") == path:
                    array.flush()  # filled through allocate()
                else:
                    np.save(path, np.ascontiguousarray(array), allow_pickle=False)
                fields[name] = {"file": path.name, "dtype": np.dtype(array.dtype).name,
                                "shape": list(array.shape)}
            meta = {"format": FORMAT, "version": VERSION, "num_steps": len(steps),
                    "num_episodes": int(steps.num_episodes), "dropped": int(steps.dropped), "fields": fields,
                    "observation_space": (space_to_json(steps.observation_space)
                                          if steps.observation_space is not None else None),
                    "action_space": space_to_json(steps.action_space) if steps.action_space is not None else None,
                    "source": steps.source}
            (self.tmp / META).write_text(json.dumps(meta, indent=1))
            # out_dir is the --out the user typed (trusted as typed, DESIGN.md §3.13), not a path inside a root_dir
            os.rename(self.tmp, self.out_dir)
        except BaseException:
            self.abort()
            raise
        return self.out_dir

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def write_dataset(steps: Steps, out_dir: str | os.PathLike) -> Path:
    """Write ``steps`` (checked first) as an alfish dataset directory; returns its path."""
    check_steps(steps)
    return DatasetWriter(out_dir).finish(steps)


def read_dataset(path: str | os.PathLike, mmap: bool = True) -> Steps:
    """The dataset at ``path``, its arrays memory-mapped read-only (``mmap=False``: loaded into memory).

    Raises a one-line ValueError for a malformed dataset: bad metadata, a missing or truncated file, a field whose
    dtype or shape differs from the metadata, object arrays.
    """
    path = Path(path)
    meta_path = path / META
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{meta_path}: unreadable dataset metadata ({err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise ValueError(f"{meta_path}: not an alfish dataset (format {found!r}, expected {FORMAT!r})")
    if int(meta.get("version", 0)) > VERSION:
        raise ValueError(f"{meta_path}: dataset version {meta['version']} is newer than this alfish reads "
                         f"({VERSION}); upgrade alfish")
    fields = meta.get("fields")
    if not isinstance(fields, dict) or any(f not in fields for f in _SCALAR_FIELDS):
        raise ValueError(f"{meta_path}: 'fields' must describe {list(_SCALAR_FIELDS)} and the observation")
    arrays = {name: _load_field(path, name, spec, mmap) for name, spec in fields.items()}
    obs_keys = sorted(k[len("observation."):] for k in arrays if k.startswith("observation."))
    observation = ({k: arrays[f"observation.{k}"] for k in obs_keys} if obs_keys
                   else arrays.get("observation"))
    if observation is None:
        raise ValueError(f"{meta_path}: no observation field")
    where = str(meta_path)
    steps = Steps(step_type=arrays["step_type"], reward=arrays["reward"], discount=arrays["discount"],
                  observation=observation, action=arrays["action"], dropped=int(meta.get("dropped", 0)),
                  num_episodes=int(meta.get("num_episodes", 0)),
                  observation_space=(space_from_json(meta["observation_space"], where)
                                     if meta.get("observation_space") else None),
                  action_space=space_from_json(meta["action_space"], where) if meta.get("action_space") else None,
                  source=str(path))
    check_steps(steps)
    return steps


def _load_field(path: Path, name: str, spec: dict, mmap: bool) -> np.ndarray:
    try:
        file = path / str(spec["file"])
        dtype, shape = np.dtype(str(spec["dtype"])), tuple(int(s) for s in spec["shape"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path / META}: field '{name}' is badly described ({err})") from None
    if file.parent != path:
        raise ValueError(f"{path / META}: field '{name}' names a file outside the dataset directory")
    try:
        array = np.load(file, mmap_mode="r" if mmap else None, allow_pickle=False)
    except FileNotFoundError:
        raise ValueError(f"{path}: the file of field '{name}' ({file.name}) is missing") from None
    except (ValueError, OSError, EOFError) as err:  # numpy: truncated file, pickled objects
        raise ValueError(f"{file}: cannot read field '{name}' ({str(err).splitlines()[0]}); the file is truncated "
                         "or not a plain .npy array") from None
    if array.dtype != dtype or tuple(array.shape) != shape:
        raise ValueError(f"{file}: holds {array.dtype}{list(array.shape)} but {META} says {dtype}{list(shape)}; "
                         "the file is truncated or was replaced")
    return array

