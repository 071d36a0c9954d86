"""The learner's optimizer settings: one Adam over the algorithm's parameter groups, plus optional gradient clipping."""
from __future__ import annotations

from collections.abc import Sequence

import gin
import torch

from alfish.errors import OneLineValueError


@gin.configurable
class OptimizerConfig:
    """Settings shared by every parameter group (learning rates come from the algorithm's groups).

    betas, eps, weight_decay: Adam's.
    max_grad_value: clamp every gradient element to ``[-max_grad_value, max_grad_value]`` (``None``: no clamping).
    max_grad_norm: scale all gradients down so that their global L2 norm is at most ``max_grad_norm`` (``None``: no
    norm clipping).
    fused: use the fused Adam kernel (one kernel for all parameters; fastest on CPU and CUDA).

    Both clips act on the true (unscaled) gradients, after the DDP all-reduce and before the optimizer step; the value
    clip comes first, then the norm clip, so the gradients that reach Adam respect both bounds. (ALF has no value clip:
    its ``gradient_clipping`` is a norm clip, global or per tensor; Keras refuses to combine the two.)
    """

    def __init__(self, betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 max_grad_norm: float | None = None, fused: bool = True, max_grad_value: float | None = None):
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise OneLineValueError(f"OptimizerConfig.max_grad_norm={max_grad_norm} must be positive or None")
        if max_grad_value is not None and not max_grad_value > 0:
            raise OneLineValueError(f"OptimizerConfig.max_grad_value={max_grad_value} must be positive or None")
        self.betas, self.eps, self.weight_decay = tuple(betas), eps, weight_decay
        self.max_grad_norm, self.max_grad_value, self.fused = max_grad_norm, max_grad_value, fused

    def build(self, param_groups: list[dict]) -> torch.optim.Optimizer:
        """Adam over copies of ``param_groups`` (each ``{'params': [...], 'lr': float, 'name': str}``; a group
        without a name is called ``'default'``)."""
        groups = [dict(g) for g in param_groups]
        for g in groups:
            g.setdefault("name", "default")
        return torch.optim.Adam(groups, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay,
                                fused=self.fused)

    def clip(self, params: list[torch.nn.Parameter]) -> torch.Tensor | None:
        """Clip the gradients of ``params`` in place: by value, then by global norm (each when configured).

        Returns the global norm the norm clip saw (a 0-d tensor: after the value clip, before the norm clip), or
        None without norm clipping. The norm clip gives the same result as ``torch.nn.utils.clip_grad_norm_`` for
        parameters on one device, in five foreach ops without its per-call grouping (which costs more than the
        arithmetic for small networks). No host synchronization.
        """
        if self.max_grad_value is None and self.max_grad_norm is None:
            return None
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return None
        if self.max_grad_value is not None:
            torch._foreach_clamp_min_(grads, -self.max_grad_value)
            torch._foreach_clamp_max_(grads, self.max_grad_value)
        if self.max_grad_norm is None:
            return None
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        torch._foreach_mul_(grads, torch.clamp(self.max_grad_norm / (total + 1e-6), max=1.0))
        return total
