"""An iteration's K updates as one compiled call (``Learner.scan_updates``): the whole update of
``alfish.learn.whole_update`` run K times inside ``torch._higher_order_ops.scan``.

Why: a compiled whole update is one call per update, and dynamo's and AOTAutograd's wrappers around each call (guard
checks, version counters, the runtime wrapper) plus the Learner's per-update Python were ~20% of a compiled DQN
update on a CPU (tools/bench/README.md). SBX's DQN runs an iteration's 128 gradient steps as one XLA call
(``jax.lax.scan``); this is the torch equivalent. The parameters and the Adam moments are the scan's carry, the
gradients come from ``torch.func.grad`` over ``torch.func.functional_call`` of the loss module, and the K mini-batches
(and importance weights) are the scanned inputs; each update's loss, gradient norm, loss terms and priorities are
its outputs.

Same updates as K calls of the whole update (tested to be bit-identical on DQN): the loss and its terms, the
importance-weighted mean, the gradient-norm/value clipping, torch's Adam/AdamW arithmetic. Two conditions make that
so, and the Learner checks both before each scan (else it updates one by one, as without this):
  * the algorithm's ``fixed_updates_ahead()`` covers the K updates: their losses read only the batch, the
    parameters the optimizer trains and values fixed over the K (DQN: its target network until the next period);
    every trained parameter is reached by every loss (``torch.func.grad`` gives 0, not None, for an unreached one,
    and Adam would then still step it), and no random numbers are drawn;
  * no summary diagnostics fall inside (they hook one update's backward).
A non-finite loss: that update and every later one of the scan change nothing (a carried flag), so the state is the
one the Learner had when K single updates would have raised at that update; the Learner then raises as usual.

Compiling the scan needs ``torch._dynamo.config.capture_scalar_outputs``: inductor lowers the scan to a while loop
that reads its index with ``.item()``. The flag is set around each call (one per iteration), not for the process.
If compiling fails, one warning, and the Learner updates one by one from then on.
"""
from __future__ import annotations

import logging
from typing import Callable, NamedTuple, Optional

import torch
from torch._higher_order_ops.scan import scan

from alfish.algorithms.base import Algorithm
from alfish.data import nest
from alfish.data.types import Experience, LossInfo
from alfish.learn.compiled import compile_checked, loss_terms, one_line, random_state, set_random_state
from alfish.learn.whole_update import WholeUpdate, adam_values, clip_gradients, weighted_mean


class ScanOutputs(NamedTuple):
    """What the K updates of one scan give, each stacked ``[K, ...]``."""
    loss_info: LossInfo                 # detached, ``extra`` the evaluated terms (a dict of [K] tensors); fields
                                        # that were not tensors (``priority`` EMPTY) are left at their defaults
    loss: torch.Tensor                  # [K]: each update's weighted mean
    grad_norm: Optional[torch.Tensor]   # [K] before norm clipping, or None without it
    finite: torch.Tensor                # [K] bool: False from the first non-finite loss on (those changed nothing)
    weights: Optional[torch.Tensor]     # [K, B]: the importance weights each update had, or None


def scan_refusal(whole_update: bool, algorithm: Algorithm) -> Optional[str]:
    """Why ``Learner.scan_updates=True`` cannot run (``whole_update``: the Learner compiles the whole update), or
    None when it can."""
    if not whole_update:
        return ("it runs the compiled whole update K times in one call: it needs Learner.compile_mode set (e.g. "
                "'default') with the whole update compiled (compile_scope 'update', or None on the CPU; not under DDP "
                "or AMP)")
    if type(algorithm).fixed_updates_ahead is Algorithm.fixed_updates_ahead:
        return (f"{type(algorithm).__name__}'s losses read values that change from one update to the next (or draw "
                "random numbers), so its updates cannot run as one scan; leave scan_updates False")
    return None


class ScannedUpdates:
    """``torch.compile`` of K whole updates in one scan (module docstring), with the fallback: if compiling fails,
    one warning, and ``__call__`` returns None from then on.

    Args:
        whole: the Learner's compiled whole update, whose parameters, optimizer groups, clipping settings and
            learning-rate tensors the scan shares (each parameter with its Adam state: ``whole.ensure_state``).
        backend: the ``torch.compile`` backend (the mode is the whole update's).

    Attributes:
        scans: scans run compiled.
    """

    def __init__(self, whole: WholeUpdate, backend: str | Callable = "inductor"):
        self.whole, self.loss_module, self.optimizer = whole, whole.loss_module, whole.optimizer
        names = {id(p): name for name, p in self.loss_module.named_parameters()}
        self.names = [names[id(p)] for p in whole.params]  # functional_call's keys, in the optimizer's order
        self.scans = 0
        self._warned_unscannable = False
        self.compiled: Optional[Callable] = compile_checked(self._scan, whole.mode, backend)

    def ready(self, algorithm: Algorithm, num_updates: int) -> bool:
        """Whether the coming ``num_updates`` updates can run as one scan: not fallen back, and the algorithm's
        ``fixed_updates_ahead`` covers them (when it does not, one warning, the first time)."""
        if self.compiled is None or num_updates < 2:
            return False
        if algorithm.fixed_updates_ahead() >= num_updates:
            return True
        if not self._warned_unscannable:
            self._warned_unscannable = True
            logging.warning("Learner.scan_updates=True: an iteration's %d updates span a change of what %s's losses "
                            "read (e.g. a target network update); such iterations update one by one (a "
                            "target_update_period that is a multiple of the updates per iteration avoids them)",
                            num_updates, type(algorithm).__name__)
        return False

    def __call__(self, batch: Experience, weights: Optional[torch.Tensor], num_updates: int,
                 states: list[dict[str, torch.Tensor]]) -> Optional[ScanOutputs]:
        """K = ``num_updates`` updates on the consecutive mini-batches of ``batch`` ``[L, K * B, ...]`` (importance
        ``weights`` ``[K * B]`` or None), the parameters and ``states`` (each parameter's Adam state) written in
        place; None when it has fallen back (nothing changed)."""
        if self.compiled is None:
            return None
        batches = nest.map_nest(lambda x: x.unflatten(1, (num_updates, -1)).movedim(1, 0), batch)  # [K, L, B, ...]
        params, device = self.whole.params, self.whole.params[0].device
        if weights is not None:
            weights = weights.to(device, non_blocking=True).view(num_updates, -1)
        for lr, group in zip(self.whole.lrs, self.optimizer.param_groups):
            lr.fill_(group["lr"])
        carry = ([p.detach() for p in params], [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                 [s["step"] for s in states], torch.ones((), dtype=torch.bool, device=device))
        before = random_state(device) if self.scans == 0 else None
        try:
            with torch._dynamo.config.patch(capture_scalar_outputs=True):
                (new_params, avgs, sqs, steps, _), stacked = self.compiled(carry, batches, weights)
        except Exception as err:  # noqa: BLE001  (any compiler failure: update one by one instead)
            if before is not None:
                set_random_state(before, device)
            self.fall_back(one_line(err))
            return None
        with torch.no_grad():
            for p, s, new in zip(params, states, zip(new_params, avgs, sqs, steps)):
                for target, value in zip((p, s["exp_avg"], s["exp_avg_sq"], s["step"]), new):
                    target.copy_(value)
        self.scans += 1
        return self.outputs_of(stacked, weights)

    def _scan(self, carry: tuple, batches: Experience, weights: Optional[torch.Tensor]) -> tuple:
        xs = (batches,) if weights is None else (batches, weights)
        return scan(self._update, carry, xs)

    def _update(self, carry: tuple, xs: tuple) -> tuple:
        """One update inside the scan: ``(new carry, this update's outputs as a flat dict: see ``outputs_of``)``."""
        params, avgs, sqs, steps, ok = carry
        batch, weights = xs if len(xs) == 2 else (xs[0], None)

        def loss_of(values: list[torch.Tensor]) -> tuple[torch.Tensor, tuple]:
            loss_info = torch.func.functional_call(self.loss_module, dict(zip(self.names, values)), (batch,))
            loss_info = nest.replace_fields(loss_info, extra=loss_terms(loss_info))
            loss = weighted_mean(loss_info.loss, weights)
            return loss, (loss.detach(), nest.map_nest(lambda x: x.detach() if isinstance(x, torch.Tensor) else x,
                                                       loss_info))

        grads, (loss, loss_info) = torch.func.grad(loss_of, has_aux=True)(params)
        apply = ok & torch.isfinite(loss)
        whole = self.whole
        clipped, grad_norm = clip_gradients(list(grads), whole.config)
        new = [adam_values(p, g, (m, v, s), whole.lrs[whole.group_of[i]],
                           self.optimizer.param_groups[whole.group_of[i]], whole.decoupled, apply)
               for i, (p, g, m, v, s) in enumerate(zip(params, clipped, avgs, sqs, steps))]
        carry = tuple(list(values) for values in zip(*new)) + (apply,)
        # A scan's outputs are tensors in plain containers (no NamedTuple, no None): a dict of what is there. None
        # may alias another output or an input (the carried flag, a scheduled value read as a term): small copies.
        outputs = dict(loss=loss, finite=apply.clone(), **{f"info.{k}": v for k, v in loss_info._asdict().items()
                                                            if k != "extra" and isinstance(v, torch.Tensor)},
                       **{f"term.{k}": torch.as_tensor(v).clone() for k, v in loss_info.extra.items()})
        if grad_norm is not None:
            outputs["grad_norm"] = grad_norm
        return carry, outputs

    @staticmethod
    def outputs_of(stacked: dict[str, torch.Tensor], weights: Optional[torch.Tensor]) -> ScanOutputs:
        """The ``ScanOutputs`` of the scan's stacked output dict."""
        info = {k[len("info."):]: v for k, v in stacked.items() if k.startswith("info.")}
        terms = {k[len("term."):]: v for k, v in stacked.items() if k.startswith("term.")}
        return ScanOutputs(LossInfo(extra=terms, **info), stacked["loss"], stacked.get("grad_norm"), stacked["finite"],
                           weights)

    def fall_back(self, reason: str) -> None:
        """Update one by one from now on: one warning."""
        logging.warning("Learner.scan_updates=True: compiling the iteration's updates as one scan failed (%s); "
                        "updating one by one", reason)
        self.compiled = None
