"""``ROOT_DIR/trackers.json``: the run id each tracker's run has, so a resumed training run logs to the same tracker
run (``{"wandb": {"run_id": "..."}, "mlflow": {"run_id": "..."}}``).

Written atomically (``alfish.rundir.atomic_text``) and read as untrusted data (DESIGN.md §3.13): through the safe
paths, at most ``MAX_BYTES``, JSON of a bounded size, each id a short string of letters, digits, ``-`` and ``_``
(what W&B and MLflow ids are made of). A file that is not that is reported in one warning and ignored: the trackers
then start new runs, and training is not held up by its tracker's bookkeeping.
"""
from __future__ import annotations

import json
import logging
import re

from alfish.rundir.atomic_text import write_text_atomic
from alfish.rundir.bounded import loads_bounded
from alfish.rundir.safe_paths import kind_in_root, read_bytes_in_root
from alfish.rundir.trackers.names import TRACKERS

#: The file's name inside a results directory.
RUN_IDS_FILE = "trackers.json"
MAX_BYTES = 64 << 10  # two ids are under 200 bytes
_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def read_run_ids(root_dir: str) -> dict[str, str]:
    """``{tracker name: run id}`` stored in ``root_dir`` (empty when there is no file; with one warning when the file
    is not a valid record: it is then ignored)."""
    try:
        if kind_in_root(root_dir, RUN_IDS_FILE) == "missing":
            return {}
        raw = read_bytes_in_root(root_dir, RUN_IDS_FILE, MAX_BYTES)
        if len(raw) > MAX_BYTES:
            raise ValueError(f"larger than {MAX_BYTES} bytes")
        return parse_run_ids(loads_bounded(raw, RUN_IDS_FILE, max_values=100))
    except (OSError, ValueError) as err:  # (UnsafePathError is an OSError, RootDirContentError a ValueError)
        logging.warning("ignoring %s/%s (%s); the trackers start new runs", root_dir, RUN_IDS_FILE,
                        " ".join(str(err).split()))
        return {}


def parse_run_ids(data: object) -> dict[str, str]:
    """The ids of a parsed ``trackers.json``; a ValueError (one line) when it is not ``{name: {"run_id": id}}`` with
    known tracker names and valid ids."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    ids = {}
    for name, entry in data.items():
        if name not in TRACKERS:
            raise ValueError(f"unknown tracker {name!r}")
        run_id = entry.get("run_id") if isinstance(entry, dict) else None
        if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
            raise ValueError(f"{name}: run_id must be 1-128 letters, digits, '-' or '_'")
        ids[name] = run_id
    return ids


def write_run_ids(root_dir: str, ids: dict[str, str]) -> None:
    """Replace ``root_dir/trackers.json`` with ``ids`` (atomically). Raises: OSError (the disk, an unsafe path)."""
    data = {name: {"run_id": ids[name]} for name in TRACKERS if name in ids}
    write_text_atomic(root_dir, RUN_IDS_FILE, json.dumps(data, indent=1) + "\n")
