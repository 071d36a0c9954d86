"""The learner's optimizer settings: one torch optimizer (Adam, AdamW, SGD or RMSprop) over the algorithm's parameter
groups, plus optional gradient clipping."""
from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

import gin
import torch

from alfish.errors import OneLineValueError

OPTIMIZERS = ("adam", "adamw", "sgd", "rmsprop")

# Each optimizer's hyperparameters besides the learning rate (which comes from the algorithm's groups), with torch's
# defaults: what a hyperparameter left at None gives.
DEFAULTS: dict[str, dict[str, Any]] = {
    "adam": {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0},
    "adamw": {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
    "sgd": {"momentum": 0.0, "dampening": 0.0, "nesterov": False, "weight_decay": 0.0},
    "rmsprop": {"alpha": 0.99, "eps": 1e-8, "momentum": 0.0, "centered": False, "weight_decay": 0.0},
}
_CLASSES: dict[str, type[torch.optim.Optimizer]] = {
    "adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD, "rmsprop": torch.optim.RMSprop}
# The optimizers torch has a fused kernel for (one kernel for all parameters); RMSprop has none, so ``fused=True``
# gives it torch's multi-tensor (foreach) implementation: torch's own choice on CUDA, and on CPU faster than its
# per-tensor loop (91 vs 133 us per step for A2C's two 64x64 MLPs, one thread).
_FUSED = frozenset({"adam", "adamw", "sgd"})


@gin.configurable
class OptimizerConfig:
    """The optimizer and the gradient clipping shared by every parameter group (learning rates, possibly scheduled,
    come from the algorithm's groups).

    name: ``'adam'`` (the default), ``'adamw'``, ``'sgd'`` or ``'rmsprop'``: torch's optimizer of that name.
    Hyperparameters of the optimizers (None: torch's default for the chosen one, see ``DEFAULTS``); giving one that
    the chosen optimizer does not take is an error:
        betas, eps: Adam's and AdamW's (eps also RMSprop's). weight_decay: every optimizer's (AdamW's decoupled,
        default 0.01; the others' an L2 term added to the gradient, default 0). momentum: SGD's and RMSprop's.
        nesterov, dampening: SGD's (nesterov needs momentum > 0 and dampening 0). alpha (the smoothing constant of
        the squared-gradient average), centered: RMSprop's. Stable-Baselines3's A2C uses RMSprop with alpha=0.99,
        eps=1e-5, no momentum, centered=False.
    max_grad_value: clamp every gradient element to ``[-max_grad_value, max_grad_value]`` (``None``: no clamping).
    max_grad_norm: scale all gradients down so that their global L2 norm is at most ``max_grad_norm`` (``None``: no
    norm clipping).
    fused: use torch's fused kernel (one kernel for all parameters; fastest on CPU and CUDA) for Adam, AdamW and SGD,
    and the multi-tensor (foreach) one for RMSprop, which has no fused kernel. False: torch's default implementation.
    Only a fused optimizer skips a non-finite update on the device (see ``Learner``).

    Both clips act on the true (unscaled) gradients, after the DDP all-reduce and before the optimizer step; the value
    clip comes first, then the norm clip, so the gradients that reach the optimizer respect both bounds. (ALF has no
    value clip: its ``gradient_clipping`` is a norm clip, global or per tensor; Keras refuses to combine the two.)
    """

    def __init__(self, betas: Sequence[float] | None = None, eps: float | None = None,
                 weight_decay: float | None = None, max_grad_norm: float | None = None, fused: bool = True,
                 max_grad_value: float | None = None, name: str = "adam", momentum: float | None = None,
                 nesterov: bool | None = None, dampening: float | None = None, alpha: float | None = None,
                 centered: bool | None = None):
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise OneLineValueError(f"OptimizerConfig.max_grad_norm={max_grad_norm} must be positive or None")
        if max_grad_value is not None and not max_grad_value > 0:
            raise OneLineValueError(f"OptimizerConfig.max_grad_value={max_grad_value} must be positive or None")
        if name not in OPTIMIZERS:
            close = difflib.get_close_matches(str(name).lower(), OPTIMIZERS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise OneLineValueError(f"OptimizerConfig.name={name!r} must be one of {', '.join(map(repr, OPTIMIZERS))}"
                                    + hint)
        given = {"betas": betas, "eps": eps, "weight_decay": weight_decay, "momentum": momentum, "nesterov": nesterov,
                 "dampening": dampening, "alpha": alpha, "centered": centered}
        given = {k: v for k, v in given.items() if v is not None}
        for key, value in given.items():
            if key not in DEFAULTS[name]:
                takers = ", ".join(repr(n) for n in OPTIMIZERS if key in DEFAULTS[n])
                raise OneLineValueError(f"OptimizerConfig.{key}={value!r} does not apply to OptimizerConfig.name="
                                        f"{name!r} ({key} is a hyperparameter of {takers}); remove the binding or "
                                        f"choose one of those optimizers")
        if "betas" in given:
            given["betas"] = tuple(given["betas"])
            if len(given["betas"]) != 2:
                raise OneLineValueError(f"OptimizerConfig.betas={given['betas']!r} must be a pair (beta1, beta2)")
        self.name = name
        self.hyperparameters: dict[str, Any] = {**DEFAULTS[name], **given}  # what the torch optimizer receives
        hp = self.hyperparameters
        if hp.get("nesterov") and (hp["momentum"] <= 0 or hp["dampening"] != 0):
            raise OneLineValueError(f"OptimizerConfig.nesterov=True needs momentum > 0 and dampening = 0 (torch's "
                                    f"rule), got momentum={hp['momentum']}, dampening={hp['dampening']}")
        try:  # torch's own range checks (e.g. betas in [0, 1)), now rather than when the Learner is built
            _CLASSES[name]([torch.zeros(1)], **hp)
        except ValueError as err:
            raise OneLineValueError(f"OptimizerConfig(name={name!r}): {str(err).splitlines()[0]}") from None
        self.betas, self.eps, self.weight_decay = hp.get("betas"), hp.get("eps"), hp["weight_decay"]
        self.max_grad_norm, self.max_grad_value, self.fused = max_grad_norm, max_grad_value, fused

    def build(self, param_groups: list[dict]) -> torch.optim.Optimizer:
        """The chosen torch optimizer over copies of ``param_groups`` (each ``{'params': [...], 'lr': float, 'name':
        str}``; a group without a name is called ``'default'``; a group's own hyperparameters, if any, win)."""
        groups = [dict(g) for g in param_groups]
        for g in groups:
            g.setdefault("name", "default")
        # fused=False: torch picks foreach (CUDA) or its per-tensor loop (CPU), as Adam always did
        implementation = {"fused": self.fused} if self.name in _FUSED else {"foreach": True} if self.fused else {}
        return _CLASSES[self.name](groups, **self.hyperparameters, **implementation)

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
