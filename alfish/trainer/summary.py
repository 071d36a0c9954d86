"""TensorBoard summaries via ``torch.utils.tensorboard``, written under ``root_dir/tb``.

Host syncs (``.item()``) happen only here, and only on iterations where a summary is due.
"""
from __future__ import annotations

import math
import os
from typing import Mapping

import torch
from torch.utils.tensorboard import SummaryWriter


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

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass
