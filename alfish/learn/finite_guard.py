"""The non-finite-loss guard, read lazily (DESIGN.md §3.12): no host synchronization per update.

Every update ``observe``s its weighted loss on the device: the index and value of the *first* non-finite update since
the last check are latched with ``torch.where``, and ``skip`` (a 0-d float, 1.0 for a non-finite loss) tells a fused
optimizer to leave the parameters and its state alone (``optimizer.found_inf``), as ``GradScaler`` does for overflowing
fp16 gradients. ``check`` reads the latch (one host sync) and raises ``NonFiniteLossError`` naming the first bad update
and its loss terms; the Learner calls it every ``check_interval`` updates, and the trainer before every summary,
checkpoint, parameter publish and evaluation, so no NaN model is ever saved, shipped or scored.

The loss infos of the updates since the last check are kept (references only; with ``check_interval`` 100 a few
hundred small tensors) so the message can name the terms of the first bad update rather than the latest.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from alfish.data.types import LossInfo
from alfish.errors import NonFiniteLossError

TermsOf = Callable[[LossInfo], dict]


class NonFiniteGuard:
    """Latches the first non-finite loss on the device; ``check`` turns it into an error.

    check_interval: updates between reads of the latch (the Learner's automatic checks). A non-finite loss is reported
        at most ``check_interval - 1`` updates after it happened; with a fused optimizer those updates left the
        parameters unchanged, so only their compute is wasted.
    """

    def __init__(self, check_interval: int, terms_of: TermsOf):
        if check_interval < 1:
            raise ValueError(f"check_interval={check_interval} must be >= 1")
        self.check_interval = check_interval
        self._terms_of = terms_of
        self._first_bad: torch.Tensor | None = None  # int64 0-d: update index of the first bad loss, -1 if none
        self._first_loss: torch.Tensor | None = None  # float 0-d: its loss
        self._pending: list[tuple[int, LossInfo, torch.Tensor | None]] = []  # since the last check
        self._base = 0  # update index of _pending[0]

    def observe(self, loss: torch.Tensor, loss_info: LossInfo, weights: torch.Tensor | None,
                update_index: int) -> torch.Tensor:
        """Record update ``update_index``'s weighted loss (0-d). Returns ``skip``: 1.0 if it is non-finite, else 0.0
        (float32, on the loss's device)."""
        bad = ~torch.isfinite(loss.detach())
        if self._first_bad is None:
            self._first_bad = torch.full((), -1, dtype=torch.int64, device=loss.device)
            self._first_loss = torch.zeros((), dtype=torch.float32, device=loss.device)
        latch = bad & (self._first_bad < 0)
        self._first_bad = torch.where(latch, update_index, self._first_bad)
        self._first_loss = torch.where(latch, loss.detach().float(), self._first_loss)
        self._pending.append((update_index, loss_info, weights))
        return bad.to(torch.float32)

    def forget(self, update_index: int) -> None:
        """Drop the loss info kept of update ``update_index``, which is being redone (the Learner's eager retry of a
        compiled update whose backward failed), so its autograd graph can be freed; the latch is left as it is."""
        self._pending = [entry for entry in self._pending if entry[0] != update_index]

    def check_value(self, loss: float, loss_info: LossInfo, weights: torch.Tensor | None, update_index: int) -> None:
        """The check of a loss already read on the host (the CPU path with ``check_interval`` 1, where reading
        costs nothing and the latch's tensor ops would cost more): raise ``NonFiniteLossError`` if it is not finite,
        before the update changes anything."""
        if not math.isfinite(loss):
            raise NonFiniteLossError(self._message(update_index, loss, loss_info, weights))

    def check(self) -> None:
        """Raise ``NonFiniteLossError`` if any update since the last check had a non-finite loss (one host sync);
        otherwise forget them."""
        if self._first_bad is None:
            return
        first = int(self._first_bad)
        pending, self._pending = self._pending, []
        if first < 0:
            return
        self._first_bad.fill_(-1)
        loss_value = float(self._first_loss)
        for index, loss_info, weights in pending:
            if index == first:
                raise NonFiniteLossError(self._message(first, loss_value, loss_info, weights))
        raise NonFiniteLossError(self._message(first, loss_value, None, None))

    def _message(self, index: int, loss: float, loss_info: LossInfo | None, weights: torch.Tensor | None) -> str:
        """One line naming the non-finite loss term(s), all terms, and what to try. "update N": the N-th update
        counted from 0."""
        values, bad = {}, []
        for name, value in (self._terms_of(loss_info) if loss_info is not None else {}).items():
            t = torch.as_tensor(value).detach().float().cpu()
            values[name] = float(t) if t.numel() == 1 else t.tolist()
            if not bool(torch.isfinite(t).all()):
                bad.append(f"{name} ({values[name]})")
        bad_weights = weights is not None and not bool(torch.isfinite(weights).all())
        parts = [f"loss is {loss} at update {index}"]
        if bad:
            parts.append("non-finite loss terms: " + ", ".join(bad))
        elif values:
            parts.append("non-finite loss terms: none of the named terms"
                         + ("" if bad_weights else " (the per-sample loss itself is non-finite)"))
        if bad_weights:
            parts.append("the importance weights contain NaN/inf")
        parts.append(f"all terms: {values}")
        parts.append("lower the learning rates or check the env's rewards/observations for NaN/inf")
        return "; ".join(parts)
