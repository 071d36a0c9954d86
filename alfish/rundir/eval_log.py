"""``ROOT_DIR/eval_log.jsonl``: one JSON object a line per recorded evaluation, appended as each is recorded
(``alfish.evaluate.evaluator.write_evaluation`` says what a record holds: iteration, env steps, elapsed and evaluation
seconds, average return and episode length, episodes, the ``eval_uncertainty`` fields, ``"asynchronous"``).

A run killed while appending may leave its last line half-written; ``recorded_iterations`` skips such a line (and any
other that is not a record), so a resumed run evaluates that iteration again.
"""
from __future__ import annotations

import json
import os
from typing import Any

#: The file's name inside a results directory.
EVAL_LOG = "eval_log.jsonl"


def eval_log_path(root_dir: str) -> str:
    """Where ``root_dir``'s evaluation log is."""
    return os.path.join(root_dir, EVAL_LOG)


def append_record(root_dir: str, record: dict[str, Any]) -> None:
    """Append ``record`` (JSON-serializable) as one line to ``root_dir``'s evaluation log (created if missing)."""
    with open(eval_log_path(root_dir), "a") as f:
        f.write(json.dumps(record) + "\n")


def recorded_iterations(root_dir: str) -> set[int]:
    """The iterations ``root_dir/eval_log.jsonl`` has a record of (a half-written last line is skipped)."""
    try:
        with open(eval_log_path(root_dir)) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return set()
    recorded = set()
    for line in lines:
        try:
            recorded.add(int(json.loads(line)["iteration"]))
        except (ValueError, KeyError, TypeError):
            continue
    return recorded
