"""Progress: a live tqdm line on a terminal, plain periodic log lines otherwise (batch jobs, pipes)."""
from __future__ import annotations

import logging
import math
import sys
import time
from typing import Callable, Optional

from tqdm import tqdm

RATE_INTERVAL_S = 1.0  # the rate (and an offline run's loss, one host read) is refreshed at most this often


class Progress:
    """Reports iteration, env steps, steps/s, recent return and ETA; for pure offline training (``offline``: no env
    steps to count) gradient updates, updates/s and the last update's loss instead.

    total_iterations: the expected number of iterations (for the ETA); log_interval_s: seconds between plain log
    lines when stderr is not a terminal.
    """

    def __init__(self, total_iterations: int, start_iteration: int, log_interval_s: float = 10.0,
                 stream=None, offline: bool = False):
        self._stream = stream or sys.stderr
        self._total = total_iterations
        self._interval = log_interval_s
        self._offline = offline
        self._start_time = time.monotonic()
        self._start_iteration = start_iteration
        self._last_log = self._start_time
        self._last_count: Optional[int] = None  # env steps (online) or updates (offline) at the last rate update
        self._last_rate_time = self._start_time
        self._rate = 0.0
        self._loss_text = "n/a"
        self._bar = None
        if self._stream.isatty():
            self._bar = tqdm(total=total_iterations, initial=start_iteration, file=self._stream, unit="it",
                             dynamic_ncols=True, leave=True)

    def update(self, iteration: int, env_steps: int, recent_return: float, updates: int = 0,
               last_loss: Callable[[], Optional[float]] = lambda: None) -> None:
        """After iteration ``iteration``: ``env_steps`` so far and the recent episodes' mean return (NaN: none yet);
        offline: ``updates`` so far and ``last_loss`` (read only when the line shows it: a host sync)."""
        now = time.monotonic()
        count = updates if self._offline else env_steps
        refreshed = False
        if self._last_count is None:
            self._last_count = count
        elif now - self._last_rate_time >= RATE_INTERVAL_S:
            self._rate = (count - self._last_count) / (now - self._last_rate_time)
            self._last_count, self._last_rate_time, refreshed = count, now, True
        if self._bar is not None:
            self._bar.n = iteration
            self._bar.set_postfix_str(self._fields(env_steps, recent_return, updates, last_loss, refreshed, "="),
                                      refresh=False)
            self._bar.refresh()
        elif now - self._last_log >= self._interval:
            self._last_log = now
            done = iteration - self._start_iteration
            eta = (now - self._start_time) / done * (self._total - iteration) if done > 0 else float("nan")
            logging.info("iteration %d/%d  %s  eta %s", iteration, self._total,
                         self._fields(env_steps, recent_return, updates, last_loss, True, " "),
                         "n/a" if math.isnan(eta) else f"{eta:.0f}s")

    def _fields(self, env_steps: int, recent_return: float, updates: int, last_loss: Callable[[], Optional[float]],
                read_loss: bool, sep: str) -> str:
        """'env_steps N  steps/s R  return X' (online) or 'updates N  updates/s R  loss X' (offline)."""
        if self._offline:
            if read_loss:
                loss = last_loss()
                self._loss_text = "n/a" if loss is None else f"{loss:.4g}"
            fields = (("updates", str(updates)), ("updates/s", f"{self._rate:.0f}"), ("loss", self._loss_text))
        else:
            ret = "n/a" if math.isnan(recent_return) else f"{recent_return:.1f}"
            fields = (("env_steps", str(env_steps)), ("steps/s", f"{self._rate:.0f}"), ("return", ret))
        joiner = "  " if sep == " " else " "
        return joiner.join(f"{name}{sep}{value}" for name, value in fields)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
