"""Moving a previous run's results aside inside its root_dir, never deleting them: ``--fresh`` (``start_over``) and
checkpoints that do not verify (``aside_path``) go to ``<root_dir>/<prefix>-<time>`` folders."""
from __future__ import annotations

import logging
import os
import time
from typing import Optional

#: What a run leaves in its root_dir that a fresh start moves aside (the run record and config stay).
RUN_STATE = ("checkpoints", "tb", "eval_log.jsonl", "scalars.csv", "videos")


def aside_path(root_dir: str, prefix: str) -> str:
    """``<root_dir>/<prefix>-<YYYYmmdd-HHMMSS>``, or with ``-2``, ``-3``, ... if it exists (two set-asides within a
    second)."""
    path = os.path.join(root_dir, f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}")
    candidate, n = path, 1
    while os.path.lexists(candidate):
        n += 1
        candidate = f"{path}-{n}"
    return candidate


def start_over(root_dir: str) -> Optional[str]:
    """Move the previous run's checkpoints, TensorBoard events and evaluation log (``RUN_STATE``) into
    ``<root_dir>/before-fresh-<time>/``; returns that folder, or None when there was nothing to move."""
    present = [name for name in RUN_STATE if os.path.lexists(os.path.join(root_dir, name))]
    if not present:
        return None
    dest = aside_path(root_dir, "before-fresh")
    os.makedirs(dest)
    for name in present:
        os.rename(os.path.join(root_dir, name), os.path.join(dest, name))
    logging.warning("--fresh: moved %s to %s (nothing was deleted); training starts from iteration 0",
                    ", ".join(present), dest)
    return dest
