"""`TracedValue`: a hyperparameter (a number or a schedule) that an algorithm's ``train_step``/``calc_loss`` reads, in a
form that compiled updates (``Learner.compile_mode``) can read without recompiling.

torch.compile (dynamo) treats a Python float it reads as a constant of the graph and guards on its value; a schedule's
float changes with progress, so every new value would recompile the update (after ``recompile_limit``, 8, dynamo
silently runs it eagerly). A 0-d tensor is a graph input instead: its value may change freely. So:

  - eager training (the default) reads the schedule's float, exactly as before: no tensor op, no cost;
  - compiled training: the Learner calls ``track(device)`` once, which gives each *scheduled* value a 0-d float32
    tensor, and ``refresh()`` before every update, which fills it in place (one small kernel, no host sync) when the
    progress has changed since. A constant keeps its float: it never changes, so dynamo's guard on it never fails.

The float32 tensor holds the float rounded to float32, which is what the ops it feeds compute with anyway.
"""
from __future__ import annotations

from typing import Iterator

import torch

from alfish.schedulers.progress import progress_record
from alfish.schedulers.schedules import Scheduler, as_scheduler
from alfish.schedulers.validation import Number

_PROGRESS = progress_record()


class TracedValue:
    """A number or a schedule read inside the loss; see the module docstring.

    ``value()`` is what ``train_step``/``calc_loss`` use (a float, or the tracked 0-d tensor); ``__call__`` is always
    the float, for code that runs eagerly and may need a number (acting, ``after_update``).
    """

    __slots__ = ("schedule", "tensor", "_version")

    def __init__(self, value: Number | Scheduler):
        self.schedule = as_scheduler(value)
        self.tensor: torch.Tensor | None = None  # set by track(): compiled training of a scheduled value
        self._version = -1

    def __call__(self) -> float:
        """The current value, a Python float."""
        return self.schedule()

    def value(self) -> float | torch.Tensor:
        """The current value as the loss reads it: the float, or (tracked) the 0-d float32 tensor that ``refresh``
        keeps equal to it."""
        return self.schedule() if self.tensor is None else self.tensor

    def tensor_value(self, device: torch.device) -> torch.Tensor:
        """A new 0-d float32 tensor of the current value on ``device``, e.g. for a summary term built in the loss."""
        if self.tensor is None:
            return torch.tensor(self.schedule(), dtype=torch.float32, device=device)
        return self.tensor.clone()  # a copy: the next refresh overwrites the tracked tensor in place

    def track(self, device: torch.device) -> None:
        """From now on ``value()`` is a 0-d float32 tensor on ``device`` (a scheduled value only; a constant stays a
        float)."""
        if not self.schedule.constant:
            self.tensor = torch.tensor(self.schedule(), dtype=torch.float32, device=device)
            self._version = _PROGRESS.version

    def refresh(self) -> None:
        """Set the tracked tensor to the current value, in place, if the progress changed since the last time."""
        if self.tensor is not None and self._version != _PROGRESS.version:
            self.tensor.fill_(self.schedule())
            self._version = _PROGRESS.version

    def __repr__(self) -> str:
        return f"TracedValue({self.schedule!r}{', tracked' if self.tensor is not None else ''})"


def traced_values(module: torch.nn.Module) -> Iterator[TracedValue]:
    """Every ``TracedValue`` held as an attribute by ``module`` or one of its submodules."""
    for sub in module.modules():
        for value in vars(sub).values():
            if isinstance(value, TracedValue):
                yield value
