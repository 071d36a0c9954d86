"""One mixed-precision policy for the learner (DESIGN.md §3.9): autocast around the loss, a gradient scaler for fp16.

bf16 keeps float32's exponent range, so it needs no loss scaling; fp16 does (``torch.amp.GradScaler``). The scaler's
state (current scale, growth tracker) is checkpointed.
"""
from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import gin
import torch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@gin.configurable
class AmpPolicy:
    """What ``TrainerConfig.enable_amp`` turns on.

    dtype: ``'bfloat16'`` or ``'float16'``; ``None`` chooses bf16 on CPU and fp16 on CUDA. fp16 on CPU is refused
    (CPU autocast supports bf16).
    """

    def __init__(self, enabled: bool, device_type: str = "cpu", dtype: str | None = None):
        self.enabled, self.device_type = enabled, device_type
        dtype = dtype or ("float16" if device_type == "cuda" else "bfloat16")
        if dtype not in DTYPES:
            raise ValueError(f"AmpPolicy.dtype='{dtype}' must be one of {sorted(DTYPES)} or None (automatic)")
        if enabled and device_type == "cpu" and dtype == "float16":
            raise ValueError("AmpPolicy.dtype='float16' needs CUDA; on CPU use 'bfloat16' (or None)")
        self.dtype_name = dtype
        self.dtype = DTYPES[dtype]
        self.scaler = torch.amp.GradScaler(device_type, enabled=enabled and dtype == "float16")
        self.skipped_steps = 0

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

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Optimizer step (skipped by the scaler when fp16 gradients overflowed); returns whether it stepped."""
        if not self.scaler.is_enabled():
            optimizer.step()
            return True
        scale_before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        stepped = self.scaler.get_scale() >= scale_before  # the scale drops exactly when a step was skipped
        self.skipped_steps += int(not stepped)
        return stepped

    def summary(self) -> dict[str, float]:
        if not self.enabled:
            return {}
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else 1.0
        return {"loss_scale": float(scale), "skipped_steps": float(self.skipped_steps)}

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict(), "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
