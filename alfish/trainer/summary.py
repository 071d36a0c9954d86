"""TensorBoard summaries via ``torch.utils.tensorboard``, written under ``root_dir/tb``.

Host syncs (``.item()``) happen only here, and only on iterations where a summary is due.
"""
from __future__ import annotations

import math
import os
import time
from typing import Mapping

import torch
from torch.utils.tensorboard import SummaryWriter

from alfish.collect.episode_stats import EpisodeStats


class Summaries:
    """Decides when a summary is due and writes scalars.

    interval: iterations between summaries; first_interval: also summarize every iteration before the first
    ``interval`` (ALF's ``summarize_first_interval``).
    """

    def __init__(self, root_dir: str, interval: int, first_interval: bool, flush_secs: float, max_queue: int):
        self.interval = interval
        self.first_interval = first_interval
        self.writer = SummaryWriter(log_dir=os.path.join(root_dir, "tb"), flush_secs=flush_secs, max_queue=max_queue)

    def is_due(self, iteration: int) -> bool:
        """``iteration`` counts completed iterations (1 after the first)."""
        return iteration % self.interval == 0 or (self.first_interval and iteration < self.interval)

    def scalar(self, tag: str, value: float | torch.Tensor, step: int) -> None:
        if isinstance(value, torch.Tensor):
            value = float(value.detach())
        if not math.isnan(value):
            self.writer.add_scalar(tag, value, step)

    def scalars(self, prefix: str, values: Mapping[str, float | torch.Tensor], step: int) -> None:
        for name, value in values.items():
            self.scalar(f"{prefix}/{name}", value, step)

    def write(self, scalars: Mapping[str, float | torch.Tensor], step: int) -> None:
        """Scalars by their full tag (``loss/total``, ``async/queue_length``, ...)."""
        for tag, value in scalars.items():
            self.scalar(tag, value, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class NullSummaries:
    """What ranks other than 0 get: never due, writes nothing."""

    def is_due(self, iteration: int) -> bool:
        return False

    def scalar(self, tag: str, value: float | torch.Tensor, step: int) -> None:
        pass

    def scalars(self, prefix: str, values: Mapping[str, float | torch.Tensor], step: int) -> None:
        pass

    def write(self, scalars: Mapping[str, float | torch.Tensor], step: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class Throughput:
    """Env steps and iterations per second between two summaries."""

    def __init__(self) -> None:
        self._last: tuple[float, int, int] | None = None  # (time, env steps, iteration)

    def rates(self, env_steps: int, iteration: int) -> dict[str, float]:
        now = time.monotonic()
        rates = {}
        if self._last is not None and now > self._last[0]:
            seconds = now - self._last[0]
            rates = {"time/env_steps_per_s": (env_steps - self._last[1]) / seconds,
                     "time/iterations_per_s": (iteration - self._last[2]) / seconds}
        self._last = (now, env_steps, iteration)
        return rates


def episode_scalars(stats: EpisodeStats, min_episodes: int) -> dict[str, float]:
    """Average training return and length once ``min_episodes`` episodes (at most the window) have ended."""
    if len(stats.returns) < min(min_episodes, stats.returns.maxlen):
        return {}
    return {"train/episode_return": stats.average_return(), "train/episode_length": stats.average_length()}


def parameter_norms(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``vars/<name>.norm`` of every parameter and ``grads/<name>.norm`` of every gradient."""
    norms = {}
    for name, p in module.named_parameters():
        norms[f"vars/{name}.norm"] = p.detach().norm()
        if p.grad is not None:
            norms[f"grads/{name}.norm"] = p.grad.norm()
    return norms
