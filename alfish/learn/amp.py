"""One mixed-precision policy for the learner (DESIGN.md §3.9): autocast around the loss, a gradient scaler for fp16.

bf16 keeps float32's exponent range, so it needs no loss scaling; fp16 does (``torch.amp.GradScaler``). The scaler's
state (current scale, growth tracker) is checkpointed.

No host synchronization per step: ``GradScaler.step`` hands its ``found_inf`` to a fused optimizer (which skips the
update on the device) but reads it with ``.item()`` for any other optimizer, so fp16 wants
``OptimizerConfig.fused=True`` (the default; a non-fused optimizer costs one sync per update and is logged once).
Skipped steps are counted in device tensors; the scale is read only when a summary is written; ``check`` (called with
the learner's non-finite check) makes a long run of consecutive skipped steps an error.
"""
from __future__ import annotations

import contextlib
import logging
from contextlib import AbstractContextManager

import gin
import torch

from alfish.errors import OneLineValueError

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@gin.configurable
class AmpPolicy:
    """What ``TrainerConfig.enable_amp`` turns on.

    dtype: ``'bfloat16'`` or ``'float16'``; ``None`` chooses bf16 on CPU and fp16 on CUDA. fp16 on CPU is refused
    (CPU autocast supports bf16).
    max_consecutive_skips: with fp16, this many optimizer steps in a row skipped for overflowing gradients is an
    error (the scale has then fallen by ``2 ** max_consecutive_skips``: the loss itself is out of fp16's range).
    """

    def __init__(self, enabled: bool, device_type: str = "cpu", dtype: str | None = None,
                 max_consecutive_skips: int = 20):
        self.enabled, self.device_type = enabled, device_type
        dtype = dtype or ("float16" if device_type == "cuda" else "bfloat16")
        if dtype not in DTYPES:
            raise ValueError(f"AmpPolicy.dtype='{dtype}' must be one of {sorted(DTYPES)} or None (automatic)")
        if enabled and device_type == "cpu" and dtype == "float16":
            raise ValueError("AmpPolicy.dtype='float16' needs CUDA; on CPU use 'bfloat16' (or None)")
        self.dtype_name = dtype
        self.dtype = DTYPES[dtype]
        self.scaler = torch.amp.GradScaler(device_type, enabled=enabled and dtype == "float16")
        self.max_consecutive_skips = max_consecutive_skips
        # Device counters (0-d int64), created at the first scaled step on the scaler's device.
        self._skipped: torch.Tensor | None = None      # skipped steps in the run
        self._consecutive: torch.Tensor | None = None  # skipped steps in a row now
        self._longest: torch.Tensor | None = None      # the longest run of skipped steps since the last check
        self._skipped_before = 0  # restored from a checkpoint
        self._warned_non_fused = False

    def autocast(self) -> AbstractContextManager:
        """The context the loss is computed in."""
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients back to their true scale before clipping (no-op without fp16)."""
        if self.scaler.is_enabled():
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, skip: torch.Tensor | None = None) -> None:
        """Optimizer step, skipped on the device when fp16 gradients overflowed or when ``skip`` (a 0-d float, 1.0
        to skip: the learner's non-finite loss) says so. ``skip`` is honoured by fused optimizers (their
        ``found_inf``); other optimizers step regardless (the learner's check then stops the run)."""
        fused = bool(optimizer.defaults.get("fused"))
        if not self.scaler.is_enabled():
            if skip is not None and fused:
                optimizer.found_inf = skip
                try:
                    optimizer.step()
                finally:
                    del optimizer.found_inf
            else:
                optimizer.step()
            return
        if not fused and not self._warned_non_fused:
            logging.info("fp16 with a non-fused optimizer: GradScaler reads found_inf with .item(), one host sync per "
                         "update (OptimizerConfig.fused=True avoids it)")
            self._warned_non_fused = True
        self.scaler.step(optimizer)
        # The scaler's per-device overflow flags (device tensors) live until update(); GradScaler has no public
        # accessor that does not read them back to the host.
        found_inf = sum(self.scaler._found_inf_per_device(optimizer).values())
        self.scaler.update()
        self._count_skip((found_inf > 0).to(torch.int64))

    def _count_skip(self, skipped: torch.Tensor) -> None:
        if self._skipped is None:
            self._skipped = torch.zeros((), dtype=torch.int64, device=skipped.device)
            self._consecutive = torch.zeros_like(self._skipped)
            self._longest = torch.zeros_like(self._skipped)
        self._skipped += skipped
        self._consecutive = (self._consecutive + 1) * skipped
        self._longest = torch.maximum(self._longest, self._consecutive)

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped by the scaler in this run, earlier runs included (a host sync)."""
        return self._skipped_before + (int(self._skipped) if self._skipped is not None else 0)

    def check(self) -> None:
        """Raise if ``max_consecutive_skips`` steps in a row were skipped since the last check (a host sync)."""
        if self._longest is None:
            return
        longest = int(self._longest)
        self._longest.zero_()
        if longest >= self.max_consecutive_skips:
            raise OneLineValueError(
                f"fp16 loss scaling skipped {longest} optimizer steps in a row (gradients overflowed even at scale "
                f"{self.scaler.get_scale():g}); train with AmpPolicy.dtype='bfloat16' or without AMP "
                "(TrainerConfig.enable_amp=False), or lower the learning rates")

    def summary(self) -> dict[str, float]:
        """``loss_scale`` and ``skipped_steps`` (read from the device: call when a summary is due)."""
        if not self.enabled:
            return {}
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else 1.0
        return {"loss_scale": float(scale), "skipped_steps": float(self.skipped_steps)}

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict(), "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self._skipped_before, self._skipped = int(state.get("skipped_steps", 0)), None
