"""``NullEvaluator``: the evaluator part of a process that does not evaluate (``TrainerConfig.evaluate=False``, or a
DDP rank other than 0: rank 0 alone evaluates). It stands where the evaluator would be, so the loop calls it as any
``EvaluatorPart`` and nothing happens: no env is built, nothing is recorded, nothing is pending."""
from __future__ import annotations

from typing import Any

from alfish.algorithms.base import Algorithm
from alfish.evaluate.evaluator import Evaluation


class NullEvaluator:
    """Evaluates nothing (``EvaluatorPart``'s calls as no-ops)."""

    def __init__(self) -> None:
        self.num_evaluations = 0
        self.keep_snapshots = False

    def record(self, algorithm: Algorithm, summaries: Any, root_dir: str, counters: Any) -> None:
        """Records nothing."""

    def check(self) -> None:
        """Nothing can have gone wrong."""

    def completed(self) -> list[Evaluation]:
        return []

    def stop_recording(self) -> None:
        """Nothing to stop."""

    def pending(self) -> list[dict]:
        return []

    def resubmit(self, pending: list[dict], summaries: Any, root_dir: str) -> None:
        """Evaluates nothing (a checkpoint's pending evaluations belong to the rank that evaluates)."""

    def wait(self) -> None:
        """Nothing to wait for."""

    def close(self) -> None:
        """No env to release."""
