"""How many times crashed envs may be replaced (``Trainer.restart_crashed_envs``, ``max_env_restarts_per_hour``):
one budget per collector, a sliding hour. A replacement is one warning line; one more than the budget is the error."""
from __future__ import annotations

import logging
import time

from alfish.collect.shared_params import AsyncUnrollError

HOUR_S = 3600.0


def one_line(failure: BaseException) -> str:
    """A failure's first line, joined with its last one where a traceback follows (the exception itself)."""
    lines = [line.strip() for line in str(failure).splitlines() if line.strip()]
    if not lines:
        return type(failure).__name__
    return lines[0] if len(lines) == 1 else f"{lines[0].rstrip(':')}: {lines[-1]}"


class RestartBudget:
    """Counts replacements (``count``, for TensorBoard) and allows ``max_per_hour`` within any hour."""

    def __init__(self, max_per_hour: int):
        self.max_per_hour = max_per_hour
        self.count = 0
        self._times: list[float] = []  # monotonic times of the replacements within the last hour

    def spend(self, failure: BaseException, what: str, error: type[Exception] = AsyncUnrollError) -> None:
        """Account one replacement after ``failure``; ``what`` ends the warning (what is replaced and what is lost).
        Raises ``error`` (from ``failure``) when it is one more than the budget allows within the last hour."""
        now = time.monotonic()
        self._times = [t for t in self._times if now - t < HOUR_S] + [now]
        line = one_line(failure)
        if len(self._times) > self.max_per_hour:
            raise error(f"{line} (crashed envs were replaced {len(self._times) - 1} times within the last hour, "
                        f"Trainer.max_env_restarts_per_hour={self.max_per_hour}: the env keeps failing; the last "
                        f"failure follows)\n{failure}") from failure
        logging.warning("%s; %s (restart %d within the last hour, at most %d)", line, what, len(self._times),
                        self.max_per_hour)
        self.count += 1
