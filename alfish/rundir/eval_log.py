"""``ROOT_DIR/eval_log.jsonl``: one JSON object a line per recorded evaluation, appended as each is recorded
(``alfish.evaluate.evaluator.write_evaluation`` says what a record holds: iteration, env steps, elapsed and evaluation
seconds, average return and episode length, episodes, the ``eval_uncertainty`` fields, ``"asynchronous"``).

A run killed while appending may leave its last line half-written; ``recorded_iterations`` skips such a line (and any
other that is not a record), so a resumed run evaluates that iteration again.

The file is opened through ``alfish.rundir.safe_paths`` (never through a symlink, only a regular file, not a hard
link when appending) and read line by line within bounds (``MAX_LINE_BYTES``, ``MAX_TOTAL_BYTES``).
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any

from alfish.rundir.bounded import RootDirContentError, bounded_lines, checked_count, loads_bounded
from alfish.rundir.safe_paths import open_in_root

#: The file's name inside a results directory.
EVAL_LOG = "eval_log.jsonl"
#: A record is a few hundred bytes and a few dozen values; a run of a million evaluations stays under the total.
MAX_LINE_BYTES = 64 << 10
MAX_TOTAL_BYTES = 256 << 20
_MAX_RECORD_VALUES = 10_000


def eval_log_path(root_dir: str) -> str:
    """Where ``root_dir``'s evaluation log is."""
    return os.path.join(root_dir, EVAL_LOG)


def append_record(root_dir: str, record: dict[str, Any]) -> None:
    """Append ``record`` (JSON-serializable) as one line to ``root_dir``'s evaluation log (created if missing).

    Raises:
        UnsafePathError: the log is a symlink, FIFO, hard link, ... (one line); OSError: the disk refused.
    """
    with open_in_root(root_dir, EVAL_LOG, "a") as f:
        f.write(json.dumps(record) + "\n")


def recorded_iterations(root_dir: str) -> set[int]:
    """The iterations ``root_dir/eval_log.jsonl`` has a record of (a half-written last line is skipped, and so is
    any line that is not a record). A log beyond the bounds is read up to there, with one warning: what is missed
    is only evaluated again.

    Raises:
        UnsafePathError: the log is a symlink, FIFO, device, ... (one line naming it).
    """
    path = eval_log_path(root_dir)
    recorded: set[int] = set()
    try:
        with open_in_root(root_dir, EVAL_LOG, "rb") as f:
            for line in bounded_lines(f, path, MAX_LINE_BYTES, MAX_TOTAL_BYTES):
                try:
                    record = loads_bounded(line, path, _MAX_RECORD_VALUES)
                    recorded.add(checked_count(record["iteration"], f"{path}: iteration"))
                except (ValueError, KeyError, TypeError):
                    continue
    except FileNotFoundError:
        return set()
    except RootDirContentError as e:
        logging.warning("%s; evaluations after the part read are evaluated again if they were pending", e)
    return recorded
