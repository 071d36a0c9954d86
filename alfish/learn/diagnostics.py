"""Summaries that need work inside an update, done only on the updates of summarized iterations (DESIGN.md §3.12).

- The gradient noise scale (``TrainerConfig.summarize_gradient_noise_scale``): McCandlish et al. 2018, "An
  Empirical Model of Large-Batch Training", appendix A.1. From the squared norms of the gradient of a small batch
  (``B_small`` samples) and of a big one (``B_big``)::

      |G|^2  ~  (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
      tr(S)  ~  (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)
      B_simple = tr(S) / |G|^2

  each estimate unbiased but noisy, so both are averaged (an exponential moving average) and ``B_simple`` is the
  ratio of the averages, as the paper recommends. The Learner measures once per summary, on the first update that
  falls in a summarized iteration: ``|G_small|^2`` is the mean over the two halves of its mini-batch (the even and
  the odd sequences, ``B_small = B / 2``; two extra backwards by ``torch.autograd.grad``, which leave the update's
  own gradients alone), as the paper's mean over devices; ``|G_big|^2`` is the update's gradient (``B_big = B x
  world_size``: under DDP the all-reduced one), before clipping. Averaging the two halves matters: the term of the
  small-batch estimate that grows with ``|G|`` cancels (single process: ``|G|^2`` becomes ``G_even . G_odd`` and
  ``tr(S)`` becomes ``B |G_even - G_odd|^2 / 4``), where one half alone leaves an estimate dominated by it.
- Network outputs (``TrainerConfig.summarize_output``): mean, std, min and max of the outputs of the algorithm's
  networks, from forward hooks registered for that one update's forward (for on-policy training: that iteration's
  unroll, which is its forward) and removed after it.

On every other update this costs the Learner one test of a Python flag and one call of ``due``: no op, no sync.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn

from alfish.data import nest

__all__ = ["Diagnostics", "GradientNoiseScale", "OutputStats", "gradient_noise_estimates"]


def gradient_noise_estimates(small_sq: torch.Tensor | float, big_sq: torch.Tensor | float, b_small: float,
                             b_big: float) -> tuple[Any, Any]:
    """McCandlish et al.'s unbiased estimates ``(|G|^2, tr(Sigma))`` from the squared gradient norms ``small_sq`` of
    a batch of ``b_small`` samples and ``big_sq`` of one of ``b_big > b_small`` samples (tensors or floats)."""
    if not 0 < b_small < b_big:
        raise ValueError(f"the gradient noise scale needs 0 < B_small < B_big, got {b_small} and {b_big}")
    grad_sq = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
    return grad_sq, trace


class GradientNoiseScale:
    """Exponential moving averages (``decay`` per measurement, bias-corrected) of the two estimates, as device
    tensors; a non-finite measurement (a NaN loss) is left out. ``summary`` gives ``gns/simple`` (the ratio of the
    averages), ``gns/grad_norm_sq`` (|G|^2), ``gns/noise_trace`` (tr(Sigma)) and the last measured squared norms
    ``gns/small_batch_grad_norm_sq``, ``gns/big_batch_grad_norm_sq``."""

    def __init__(self, decay: float = 0.9):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"the gradient noise scale's EMA decay must be in [0, 1), got {decay}")
        self.decay = decay
        self._ema: Optional[torch.Tensor] = None  # [3]: |G|^2, tr(Sigma), the weight (for the bias correction)
        self._last: Optional[torch.Tensor] = None  # [2]: |G_small|^2, |G_big|^2

    def update(self, small_sq: torch.Tensor, big_sq: torch.Tensor, b_small: int, b_big: int) -> None:
        """Fold in one measurement (0-d tensors on the device; no host sync)."""
        grad_sq, trace = gradient_noise_estimates(small_sq.float(), big_sq.float(), b_small, b_big)
        sample = torch.stack([grad_sq, trace, torch.ones_like(grad_sq)])
        if self._ema is None:
            self._ema = torch.zeros_like(sample)
        finite = torch.isfinite(sample).all()
        self._ema = torch.where(finite, self._ema * self.decay + sample * (1.0 - self.decay), self._ema)
        self._last = torch.stack([small_sq.float(), big_sq.float()])

    def summary(self) -> dict[str, torch.Tensor]:
        if self._ema is None:
            return {}
        grad_sq, trace = self._ema[0] / self._ema[2], self._ema[1] / self._ema[2]  # NaN until a finite measurement
        return {"gns/simple": trace / grad_sq, "gns/grad_norm_sq": grad_sq, "gns/noise_trace": trace,
                "gns/small_batch_grad_norm_sq": self._last[0], "gns/big_batch_grad_norm_sq": self._last[1]}


class OutputStats:
    """Mean, std, min and max of what the networks of ``algorithm`` return, recorded by forward hooks while
    ``capture()`` is open: every submodule with parameters is hooked, and a call is recorded when no other hooked
    module is running (the networks the algorithm calls itself, e.g. ``actor``, ``critics``, ``net.policy``; not their
    layers). Several calls of one network (SAC's actor on s and s') are pooled. Tags ``output/<module>.<stat>``
    (``output/<module>.<i>.<stat>`` for the i-th tensor of an output that has several)."""

    def __init__(self, algorithm: nn.Module):
        self.algorithm = algorithm
        self._calls: dict[str, list[tuple[torch.Tensor, int]]] = {}  # name -> [(sum, sum sq, min, max), count]
        self._depth = 0

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        self._calls, self._depth = {}, 0
        handles = []
        for name, module in self.algorithm.named_modules():
            if name and next(module.parameters(), None) is not None:
                handles.append(module.register_forward_pre_hook(self._enter))
                handles.append(module.register_forward_hook(self._recorder(name)))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _enter(self, module: nn.Module, args: Any) -> None:
        self._depth += 1

    def _recorder(self, name: str) -> Callable[..., None]:
        def record(module: nn.Module, args: Any, output: Any) -> None:
            self._depth -= 1
            if self._depth > 0:
                return
            leaves = [x for x in nest.flatten(output)
                      if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() > 0]
            for i, x in enumerate(leaves):
                x = x.detach().float()
                key = name if len(leaves) == 1 else f"{name}.{i}"
                stats = torch.stack([x.sum(), x.square().sum(), x.amin(), x.amax()])
                self._calls.setdefault(key, []).append((stats, x.numel()))

        return record

    def summary(self) -> dict[str, torch.Tensor]:
        """The statistics of the last capture (then forgotten: a summary without a new capture reports none)."""
        out = {}
        for name, calls in self._calls.items():
            stats = torch.stack([s for s, _ in calls])
            count = float(sum(n for _, n in calls))
            mean = stats[:, 0].sum() / count
            out[f"output/{name}.mean"] = mean
            out[f"output/{name}.std"] = (stats[:, 1].sum() / count - mean.square()).clamp(min=0.0).sqrt()
            out[f"output/{name}.min"] = stats[:, 2].amin()
            out[f"output/{name}.max"] = stats[:, 3].amax()
        self._calls = {}
        return out


class Diagnostics:
    """The Learner's summary-only measurements: the gradient noise scale and/or the output statistics.

    due(update): whether the ``update``-th optimizer step (1-based) falls in an iteration whose summary will be
    written (the trainer's ``Summaries.due_for_update``). The first due update after a summary is diagnosed; the
    next ``summary()`` (the summary being written) arms it again.
    """

    def __init__(self, algorithm: nn.Module, gradient_noise_scale: bool, outputs: bool,
                 due: Callable[[int], bool]):
        self.gns = GradientNoiseScale() if gradient_noise_scale else None
        self.outputs = OutputStats(algorithm) if outputs else None
        self.due = due
        self._pending = True  # nothing measured since the last summary

    def armed(self, update: int) -> bool:
        """Whether the ``update``-th step is diagnosed."""
        return self._pending and self.due(update)

    def capture_outputs(self, update: int) -> contextlib.AbstractContextManager:
        """The output hooks, when the ``update``-th step is diagnosed and outputs are summarized; else nothing."""
        if self.outputs is None or not self.armed(update):
            return contextlib.nullcontext()
        return self.outputs.capture()

    def measured(self) -> None:
        """The diagnosed update is done: nothing more until the next summary."""
        self._pending = False

    def summary(self) -> dict[str, torch.Tensor]:
        self._pending = True
        out = {}
        if self.gns is not None:
            out.update(self.gns.summary())
        if self.outputs is not None:
            out.update(self.outputs.summary())
        return out


def squared_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """``sum_i |g_i|^2`` over a list of gradients (0-d, float32, on their device; no host sync)."""
    return torch.stack([n.float() for n in torch._foreach_norm(grads)]).square().sum()
