"""The whole update as one compiled function (``Learner.compile_scope='update'``): the loss, its gradients, the
non-finite skip, clipping and the Adam step, traced by dynamo into one graph that inductor turns into one program.

Why: at the sizes RL trains on a CPU (a batch of 64-256, 256x256 layers) an eager update costs the dispatch of its
many small ops about as much as its arithmetic. Compiling the loss module alone (``compile_scope='loss'``) leaves
the autograd engine's backward walk, the clipping and the optimizer step eager. Here the gradients come from
``torch.autograd.grad`` inside the traced function (dynamo traces it with ``trace_autograd_ops``), and the optimizer
step is written with tensor ops (``adam_step``), so one call runs the update as JAX's ``jit`` of a whole train step
does (SBX, LeanRL).

What stays the same as the eager update (``Learner._step``):
  * the loss: ``train_step`` + ``calc_loss`` of the loss module, its named terms evaluated inside, the importance-
    weighted mean;
  * the gradients of exactly the parameters the loss reaches: a parameter it does not reach (TD3's actor on the
    updates its policy delay skips) gets no step, its Adam moments and step count untouched, as torch skips a
    parameter whose ``.grad`` is None (``allow_unused``: known when the graph is traced, so each such variant is
    its own graph, as TD3's two);
  * clipping as ``OptimizerConfig.clip`` (the total norm over the gradients, or each value);
  * torch's Adam/AdamW arithmetic (``torch.optim.Adam(fused=True)``'s order of operations; equal to it within
    float rounding) on the optimizer's own state tensors (``state[p]['step' | 'exp_avg' | 'exp_avg_sq']``), so
    checkpoints, resume and a switch between scopes see one optimizer;
  * a non-finite loss changes nothing: every write is ``torch.where(finite, new, old)``, as the fused optimizer's
    ``found_inf`` skip; the Learner then raises ``NonFiniteLossError`` as usual.
Learning rates are 0-d tensors refilled from the optimizer's groups before each call (a schedule recompiles nothing);
``.grad`` is never set (nothing reads it outside a diagnosed update, which runs eagerly).

Where it does not apply (``unsupported_reason``: DDP's all-reduce between backward and step, AMP's autocast and
gradient scaler, another optimizer than Adam/AdamW or an option of theirs it does not write, a torch whose dynamo
cannot trace ``torch.autograd.grad``) the Learner compiles the loss only, after one warning saying why.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional

import torch
from torch import nn

from alfish.data import nest
from alfish.data.types import Experience
from alfish.learn.compiled import (
    WARM_UP_UPDATES,
    compile_checked,
    loss_terms,
    one_line,
    random_state,
    recompile_limit_hits,
    release_compiled_code,
    set_random_state,
)
from alfish.learn.optim import OptimizerConfig

#: The optimizers ``adam_step`` writes (AdamW: decoupled weight decay).
SUPPORTED_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW)


def dynamo_traces_gradients() -> bool:
    """Whether this torch's dynamo can trace ``torch.autograd.grad`` inside compiled code (``trace_autograd_ops``:
    ``alfish.DETECTED_TORCH_FEATURES``)."""
    return hasattr(torch._dynamo.config, "trace_autograd_ops")


def unsupported_reason(optimizer: torch.optim.Optimizer, ddp: bool, amp: bool) -> Optional[str]:
    """Why the whole update cannot be one compiled function here, or None when it can."""
    if not dynamo_traces_gradients():
        return f"torch {torch.__version__}'s dynamo cannot trace torch.autograd.grad (trace_autograd_ops)"
    if ddp:
        return "under DDP the gradients are all-reduced between the backward and the step"
    if amp:
        return "AMP's autocast and gradient scaler wrap the loss and the step"
    if not isinstance(optimizer, SUPPORTED_OPTIMIZERS):
        return f"it writes the Adam and AdamW steps only, not {type(optimizer).__name__}'s"
    for group in optimizer.param_groups:
        for option in ("amsgrad", "maximize", "differentiable"):
            if group.get(option):
                return f"it does not write Adam's {option}=True"
    return None


def weighted_mean(per_sample: torch.Tensor, weights: Optional[torch.Tensor]) -> torch.Tensor:
    """``mean(per_sample [..., B] * weights [B])``, or the plain mean (shapes checked by the Learner first)."""
    return per_sample.mean() if weights is None else (per_sample * weights).mean()


def clip_gradients(grads: list[torch.Tensor], config: OptimizerConfig) -> tuple[list[torch.Tensor],
                                                                                 Optional[torch.Tensor]]:
    """``OptimizerConfig.clip`` on a list of gradients, returning new ones: each value to ``[-max_grad_value,
    max_grad_value]``, then scaled so that the total norm is at most ``max_grad_norm``. Returns the clipped gradients
    and the total norm before norm clipping (None without it)."""
    if config.max_grad_value is not None:
        grads = [g.clamp(-config.max_grad_value, config.max_grad_value) for g in grads]
    if config.max_grad_norm is None:
        return grads, None
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    scale = torch.clamp(config.max_grad_norm / (total + 1e-6), max=1.0)
    return [g * scale for g in grads], total


def adam_values(param: torch.Tensor, grad: torch.Tensor, moments: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                lr: torch.Tensor, group: dict[str, Any], decoupled: bool,
                apply: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One Adam (AdamW when ``decoupled``) step as values, in the order of operations of torch's fused kernel: from
    ``moments`` ``(exp_avg, exp_avg_sq, step)``, the new ``(param, exp_avg, exp_avg_sq, step)``, each its old value
    where ``apply`` (0-d bool) is False."""
    exp_avg, exp_avg_sq, step = moments
    beta1, beta2 = group["betas"]
    eps, weight_decay = group["eps"], group["weight_decay"]
    new_step = step + 1
    value = param
    if weight_decay != 0:
        if decoupled:
            value = value * (1 - lr * weight_decay)
        else:
            grad = grad + weight_decay * param
    new_avg = torch.lerp(exp_avg, grad, 1 - beta1)
    new_sq = exp_avg_sq * beta2 + (1 - beta2) * grad * grad
    denom = new_sq.sqrt() / (1 - beta2 ** new_step).sqrt() + eps
    value = value - (lr / (1 - beta1 ** new_step)) * new_avg / denom
    return tuple(torch.where(apply, new, old) for new, old in ((value, param), (new_avg, exp_avg),
                                                               (new_sq, exp_avg_sq), (new_step, step)))


def adam_step(param: torch.Tensor, grad: torch.Tensor, state: dict[str, torch.Tensor], lr: torch.Tensor,
              group: dict[str, Any], decoupled: bool, finite: torch.Tensor) -> None:
    """``adam_values`` written in place into ``param`` and its ``state``; nothing changes when ``finite`` (a 0-d
    bool) is False."""
    keys = ("exp_avg", "exp_avg_sq", "step")
    new = adam_values(param, grad, tuple(state[k] for k in keys), lr, group, decoupled, finite)
    for target, value in zip((param, *(state[k] for k in keys)), new):
        target.copy_(value)


class WholeUpdate:
    """``torch.compile`` of one whole update (module docstring), with the eager fallback: if compiling fails, one
    warning, and ``__call__`` returns None from then on (the Learner updates without it).

    Args:
        loss_module: the algorithm (its forward: the ``LossInfo`` of a batch).
        optimizer: the Learner's Adam or AdamW (``unsupported_reason`` is None for it); its state is created here
            for every parameter, as its first step would.
        optimizer_config: the clipping settings.
        mode, backend: the ``torch.compile`` mode (``'default'``: torch's) and backend.

    Attributes:
        compiled_updates: updates run compiled.
    """

    def __init__(self, loss_module: nn.Module, optimizer: torch.optim.Optimizer, optimizer_config: OptimizerConfig,
                 mode: str, backend: str | Callable = "inductor"):
        self.loss_module, self.optimizer, self.config, self.mode = loss_module, optimizer, optimizer_config, mode
        self.decoupled = isinstance(optimizer, torch.optim.AdamW) or any(
            g.get("decoupled_weight_decay") for g in optimizer.param_groups)
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.group_of = [i for i, g in enumerate(optimizer.param_groups) for _ in g["params"]]
        device = self.params[0].device
        self.lrs = [torch.zeros((), device=device) for _ in optimizer.param_groups]
        self.compiled_updates = 0
        self._graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        self._limit_hits_before = recompile_limit_hits()
        # dynamo traces torch.autograd.grad only with this flag, read whenever it traces (the first call, a second
        # graph such as TD3's). Set for the process once: entering config.patch around every call cost ~170 us per
        # update here, more than a tenth of a compiled DQN update. It changes nothing for code that computes no
        # gradients inside a compiled region (alfish's loss-only scope does not).
        torch._dynamo.config.trace_autograd_ops = True
        self.compiled: Optional[Callable] = compile_checked(self._update, mode, backend)

    def ensure_state(self) -> list[dict[str, torch.Tensor]]:
        """Each parameter's Adam state (made as torch's first step makes it where missing: a fresh optimizer, or one
        loaded from a checkpoint saved before its first step)."""
        states = []
        for p in self.params:
            state = self.optimizer.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            states.append(state)
        return states

    def __call__(self, batch: Experience, weights: Optional[torch.Tensor]) -> Optional[tuple]:
        """One compiled update: ``(loss_info (detached, terms evaluated), loss (0-d), grad_norm or None)``; None when
        it has fallen back to eager updates (this update then still to be done)."""
        if self.compiled is None:
            return None
        states = self.ensure_state()
        for lr, group in zip(self.lrs, self.optimizer.param_groups):
            lr.fill_(group["lr"])
        # The first updates compile: a failure there leaves the update to be done without it, from the random-number
        # state of its start (so it is the update an eager Learner makes).
        before = random_state(self.params[0].device) if self.compiled_updates < WARM_UP_UPDATES else None
        try:
            out = self.compiled(batch, weights, states)
        except Exception as err:  # noqa: BLE001  (any compiler failure: train without it)
            reason = one_line(err)
        else:
            self.compiled_updates += 1
            return out
        if before is not None:
            set_random_state(before, self.params[0].device)
        self.fall_back(reason)
        return None

    def _update(self, batch: Experience, weights: Optional[torch.Tensor],
                states: list[dict[str, torch.Tensor]]) -> tuple:
        loss_info = self.loss_module(batch)
        loss_info = nest.replace_fields(loss_info, extra=loss_terms(loss_info))
        loss = weighted_mean(loss_info.loss, weights)
        grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        finite = torch.isfinite(loss)
        reached = [i for i, g in enumerate(grads) if g is not None]
        with torch.no_grad():
            clipped, grad_norm = clip_gradients([grads[i] for i in reached], self.config)
            for i, grad in zip(reached, clipped):
                group_index = self.group_of[i]
                adam_step(self.params[i], grad, states[i], self.lrs[group_index],
                          self.optimizer.param_groups[group_index], self.decoupled, finite)
        detached = nest.map_nest(lambda x: x.detach() if isinstance(x, torch.Tensor) else x, loss_info)
        return detached, loss.detach(), grad_norm

    def fall_back(self, reason: str) -> None:
        """Update without the compiled function from now on: one warning, the compiled code released."""
        logging.warning("Learner.compile_mode='%s', compile_scope='update': compiling the whole update failed (%s); "
                        "training without it", self.mode, reason)
        self.compiled = None
        release_compiled_code(self.params[0].device)

    def stats(self) -> dict[str, Any]:
        """As ``CompiledLoss.stats``: still compiled, updates run compiled, graphs compiled since this was made,
        whether dynamo hit its recompile limit."""
        counters = torch._dynamo.utils.counters
        return dict(compiled=self.compiled is not None, compiled_updates=self.compiled_updates,
                    graphs=counters["stats"]["unique_graphs"] - self._graphs_before,
                    recompile_limit_hit=recompile_limit_hits() > self._limit_hits_before)
