"""The trainer's optimizer: one Adam over the algorithm's parameter groups, plus optional gradient clipping."""
from __future__ import annotations

from typing import Optional, Sequence

import gin
import torch


@gin.configurable
class OptimizerConfig:
    """Settings shared by every parameter group (learning rates come from the algorithm's groups).

    betas, eps, weight_decay: Adam's. max_grad_norm: clip the global gradient norm (``None``: no clipping).
    fused: use the fused Adam kernel (one kernel for all parameters; fastest on CPU and CUDA).
    """

    def __init__(self, betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 max_grad_norm: Optional[float] = None, fused: bool = True):
        if max_grad_norm is not None and max_grad_norm <= 0:
            raise ValueError(f"OptimizerConfig.max_grad_norm={max_grad_norm} must be positive or None")
        self.betas, self.eps, self.weight_decay = tuple(betas), eps, weight_decay
        self.max_grad_norm, self.fused = max_grad_norm, fused

    def build(self, param_groups: list[dict]) -> torch.optim.Optimizer:
        groups = [dict(g) for g in param_groups]
        for g in groups:
            g.setdefault("name", "default")
        return torch.optim.Adam(groups, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay,
                                fused=self.fused)

    def clip(self, params: list[torch.nn.Parameter]) -> Optional[torch.Tensor]:
        """Clip the global gradient norm in place; returns the norm before clipping (None without clipping).

        Same result as ``torch.nn.utils.clip_grad_norm_`` for parameters on one device, in five foreach ops without
        its per-call grouping (which costs more than the arithmetic for small networks).
        """
        if self.max_grad_norm is None:
            return None
        grads = [p.grad for p in params if p.grad is not None]
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        torch._foreach_mul_(grads, torch.clamp(self.max_grad_norm / (total + 1e-6), max=1.0))
        return total
