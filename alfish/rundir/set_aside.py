"""Moving a previous run's results aside inside its root_dir, never deleting them: ``--fresh`` (``start_over``) and
checkpoints that do not verify (``aside_path``) go to ``<root_dir>/<prefix>-<time>`` folders.

Every rename goes through ``alfish.rundir.safe_paths`` (DESIGN.md §3.13): no link is crossed on the way, and an entry
that is itself a symlink is moved as the link, its target never touched."""
from __future__ import annotations

import logging
import os
import time
from typing import Optional

from alfish.rundir.safe_paths import kind_in_root, make_dirs_in_root, rename_in_root

#: What a run leaves in its root_dir that a fresh start moves aside (the run record and config stay).
RUN_STATE = ("checkpoints", "tb", "eval_log.jsonl", "scalars.csv", "videos")


def aside_path(root_dir: str, prefix: str) -> str:
    """``<root_dir>/<prefix>-<YYYYmmdd-HHMMSS>``, or with ``-2``, ``-3``, ... if it exists (two set-asides within a
    second)."""
    path = os.path.join(root_dir, f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}")
    candidate, n = path, 1
    while kind_in_root(root_dir, candidate) != "missing":
        n += 1
        candidate = f"{path}-{n}"
    return candidate


def start_over(root_dir: str) -> Optional[str]:
    """Move the previous run's checkpoints, TensorBoard events and evaluation log (``RUN_STATE``) into
    ``<root_dir>/before-fresh-<time>/``; returns that folder, or None when there was nothing to move.

    Raises:
        UnsafePathError: the folder to move them into could not be made without crossing a link.
    """
    present = [name for name in RUN_STATE if kind_in_root(root_dir, name) != "missing"]
    if not present:
        return None
    dest = aside_path(root_dir, "before-fresh")
    make_dirs_in_root(root_dir, dest)
    for name in present:
        rename_in_root(root_dir, name, os.path.join(dest, name))
    logging.warning("--fresh: moved %s to %s (nothing was deleted); training starts from iteration 0",
                    ", ".join(present), dest)
    return dest
