"""Progress: a live tqdm line on a terminal, plain periodic log lines otherwise (batch jobs, pipes)."""
from __future__ import annotations

import logging
import math
import sys
import time
from typing import Optional

from tqdm import tqdm


class Progress:
    """Reports iteration, env steps, steps/s, recent return and ETA.

    total_iterations: the expected number of iterations (for the ETA); log_interval_s: seconds between plain log
    lines when stderr is not a terminal.
    """

    def __init__(self, total_iterations: int, start_iteration: int, log_interval_s: float = 10.0,
                 stream=None):
        self._stream = stream or sys.stderr
        self._total = total_iterations
        self._interval = log_interval_s
        self._start_time = time.monotonic()
        self._start_iteration = start_iteration
        self._last_log = self._start_time
        self._last_env_steps: Optional[int] = None
        self._last_rate_time = self._start_time
        self._rate = 0.0
        self._bar = None
        if self._stream.isatty():
            self._bar = tqdm(total=total_iterations, initial=start_iteration, file=self._stream, unit="it",
                             dynamic_ncols=True, leave=True)

    def update(self, iteration: int, env_steps: int, recent_return: float) -> None:
        now = time.monotonic()
        if self._last_env_steps is None:
            self._last_env_steps = env_steps
        elif now - self._last_rate_time >= 1.0:
            self._rate = (env_steps - self._last_env_steps) / (now - self._last_rate_time)
            self._last_env_steps, self._last_rate_time = env_steps, now
        ret = "n/a" if math.isnan(recent_return) else f"{recent_return:.1f}"
        if self._bar is not None:
            self._bar.n = iteration
            self._bar.set_postfix_str(f"env_steps={env_steps} steps/s={self._rate:.0f} return={ret}", refresh=False)
            self._bar.refresh()
        elif now - self._last_log >= self._interval:
            self._last_log = now
            done = iteration - self._start_iteration
            eta = (now - self._start_time) / done * (self._total - iteration) if done > 0 else float("nan")
            logging.info("iteration %d/%d  env_steps %d  steps/s %.0f  return %s  eta %s", iteration, self._total,
                         env_steps, self._rate, ret, "n/a" if math.isnan(eta) else f"{eta:.0f}s")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
