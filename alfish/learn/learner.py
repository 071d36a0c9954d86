"""The Learner: turns an algorithm's losses into parameter updates (DESIGN.md §1, §3.2, §3.8, §3.9, §3.11).

Everything between a ``LossInfo`` and changed parameters lives here: the training device, importance weighting, the
one mean, the non-finite guard, backward under the AMP policy, the gradient all-reduce (DDP), clipping, the optimizer
step with its scheduled learning rates, ``after_update`` and the update counter. The trainer decides *when* to update
and *on what*; the Learner decides *how*.

An update makes no host synchronization (DESIGN.md §3.12): the non-finite guard latches on the device and is read
every ``finite_check_interval`` updates and by ``check_finite`` (the trainer calls it before summaries, checkpoints,
parameter publishes and evaluations); summaries are device tensors read by the writer.

Two entry points, one shared step:

    learner.update(batch [L, B], batch_info)      # off-policy: train_step + calc_loss in the (DDP) loss module
                                                  # (a HybridBatch: offline + online losses summed in that forward)
    with learner.loss_context():                  # on-policy: the loss was built during the unroll, outside DDP
        loss_info = algorithm.calc_loss(trajectory, None)
    learner.apply(loss_info)
"""
from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Callable, Optional

import gin
import torch
from torch import nn

from alfish.algorithms.base import Algorithm
from alfish.data import nest
from alfish.data.types import BatchInfo, Experience, LossInfo
from alfish.errors import NonFiniteLossError, OneLineValueError
from alfish.learn.amp import AmpPolicy
from alfish.learn.compiled import CompiledBackwardError, CompiledLoss, loss_terms, one_line
from alfish.learn.diagnostics import Diagnostics, squared_norm
from alfish.learn.distributed import DistContext, HybridBatch, allreduce_gradients, wrap_for_ddp
from alfish.learn.finite_guard import NonFiniteGuard
from alfish.learn.optim import OptimizerConfig
from alfish.learn.scanned_updates import ScannedUpdates, scan_refusal
from alfish.learn.whole_update import WholeUpdate, unsupported_reason
from alfish.schedulers import split_lr_schedules, traced_values, update_optimizer_lrs

__all__ = ["CompiledLoss", "Learner", "NonFiniteLossError", "loss_terms"]


@gin.configurable(denylist=["algorithm", "optimizer_config", "amp", "dist", "device"])
class Learner:
    """Turns an algorithm's losses into parameter updates.

    Args:
        algorithm: the algorithm whose ``param_groups()`` are optimized (each group's ``lr`` a number or a
            ``Scheduler``) and whose ``train_step``/``calc_loss`` give the loss of a batch. Moved to ``device``.
        optimizer_config: the optimizer and clipping settings (``None``: ``OptimizerConfig()`` as gin binds it).
        amp: the mixed-precision policy (``None``: disabled).
        dist: this process's place in a torchrun job (``None``: a single process).
        device: the training device (``None``: where the algorithm's parameters are). Batches given to ``update``
            must be there.
        finite_check_interval: updates between reads of the non-finite-loss flag (each read is one host sync).
            ``None``: 1 on CPU (a read costs nothing there, and the error comes before the bad update changes
            anything), 100 elsewhere. A non-finite loss is then reported at most ``finite_check_interval - 1``
            updates late; a fused optimizer skips such updates on the device, so they change no parameter.
        compile_mode: ``None`` (eager) or a ``torch.compile`` mode (``'default'``, ``'reduce-overhead'`` = CUDA graphs
            on a GPU, ``'max-autotune'``, ...) for the loss module: the forward (``train_step`` + ``calc_loss``) and,
            through AOTAutograd, its backward. The optimizer step stays eager (a fused step is one kernel) and
            reads the learning rates as numbers, so a scheduled change recompiles nothing; scheduled values the loss
            reads are 0-d tensors filled before each update (``alfish.schedulers.TracedValue``). If compilation
            fails, in the forward or in a backward of the first ``WARM_UP_UPDATES`` compiled updates (where the
            backward compiles and CUDA graphs record), the update is redone eagerly and training goes on eagerly
            after a one-line warning. Not for on-policy algorithms (A2C), whose loss is built during the unroll.
        compile_backend: the ``torch.compile`` backend, with ``compile_mode='default'`` only (the modes are
            inductor's): ``None`` (inductor), or e.g. ``'aot_eager'`` (no code generation: checks the graphs
            cheaply) or a callable backend.
        compile_scope: what ``compile_mode`` compiles: ``'update'``, the whole update as one function (loss,
            gradients, clipping, the Adam step: ``alfish.learn.whole_update``), or ``'loss'``, the loss module only
            (described above). ``None`` (default): ``'update'`` when training on the CPU, ``'loss'`` on a GPU (where
            the compiled loss with CUDA graphs is the path proven by ``gpu_check``; the whole update there has not
            run on a GPU yet). Where the whole update cannot be compiled (DDP, AMP, an optimizer other than
            Adam/AdamW), ``None`` on the CPU trains eagerly (the loss compiled alone measured 0.86-1.01x eager
            there: ``tools/bench/bench_compiled_update.py``) and ``'update'`` compiles the loss only, each after
            one warning saying why. If compiling the whole update fails, training goes on eagerly after one
            warning.

    Attributes:
        optimizer: what ``optimizer_config.build`` made (``OptimizerConfig.name``) from the algorithm's groups
            (numeric learning rates).
        params: every parameter the optimizer updates, in group order.
        loss_module: ``LossModule(algorithm)``, wrapped in DDP when the job has several ranks.
        amp: the AMP policy.
        lr_schedules: ``{group name: Scheduler}`` for the groups whose learning rate is scheduled.
        num_updates: optimizer steps taken (restored from checkpoints).
        diagnostics: the summary-only measurements inside updates (gradient noise scale, network outputs), set at
            assembly when a summary asks for them; ``None``: none (an update then does nothing for them).
    """

    def __init__(self, algorithm: Algorithm, optimizer_config: OptimizerConfig | None = None,
                 amp: AmpPolicy | None = None, dist: DistContext | None = None,
                 device: Optional[torch.device] = None, finite_check_interval: Optional[int] = None,
                 compile_mode: Optional[str] = None, compile_backend: Optional[str | Callable] = None,
                 compile_scope: Optional[str] = None, scan_updates: bool = False):
        if device is None:
            device = next(iter(algorithm.parameters())).device
        self.device = torch.device(device)
        self.algorithm = algorithm.to(self.device)  # before the optimizer: its state follows the parameters
        self.optimizer_config = optimizer_config if optimizer_config is not None else OptimizerConfig()
        self.amp = amp if amp is not None else AmpPolicy(False)
        self.dist = dist if dist is not None else DistContext()
        # torch needs numbers as learning rates; scheduled ones are set by update_learning_rates once per iteration.
        groups, self.lr_schedules = split_lr_schedules(algorithm.param_groups())
        self.optimizer = self.optimizer_config.build(groups)
        self.params: list[nn.Parameter] = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.loss_module = wrap_for_ddp(algorithm, self.dist, self.device)  # forward = the loss of a batch
        self.compile_mode = compile_mode
        self._whole: Optional[WholeUpdate] = None
        self._compiled = self._compile(compile_mode, compile_backend, compile_scope)
        self._compute_loss = self.loss_module if self._compiled is None else self._compiled
        self.scan_updates = scan_updates
        self._scan = self._scanned_updates(compile_backend) if scan_updates else None
        # What the compiled loss reads of the schedules: 0-d tensors, refreshed before each update (else none).
        compiled = self._compiled is not None or self._whole is not None
        self._traced_values = list(traced_values(algorithm)) if compiled else []
        for value in self._traced_values:
            value.track(self.device)
        self.num_updates = 0
        if finite_check_interval is None:
            finite_check_interval = 1 if self.device.type == "cpu" else 100
        self.finite_guard = NonFiniteGuard(finite_check_interval, loss_terms)
        # On a single-process CPU run checked every update, reading the loss costs one float() where the device latch
        # costs ~8 tensor ops per update. (Under DDP all ranks must skip a bad update together: the latch path.)
        self._read_loss_every_update = (finite_check_interval == 1 and self.device.type == "cpu"
                                        and not self.dist.enabled)
        self._last_loss: LossInfo | None = None  # with .loss the detached weighted mean (0-d)
        self._last_grad_norm: torch.Tensor | None = None
        self.diagnostics: Diagnostics | None = None

    # ---------------------------------------------------------------------------------------------- schedules ----
    def update_learning_rates(self) -> None:
        """Set the scheduled learning rates from the current progress (call once per iteration, after
        ``alfish.schedulers.update_progress``). Groups with a constant rate are left alone."""
        if self.lr_schedules:
            update_optimizer_lrs(self.optimizer, self.lr_schedules)

    # ----------------------------------------------------------------------------------------------- updating ----
    def loss_context(self) -> AbstractContextManager:
        """The context a loss computed outside ``update`` is built in (the AMP policy's autocast), e.g. an on-policy
        ``calc_loss`` on the unroll, which is then handed to ``apply``."""
        return self.amp.autocast()

    def update(self, batch: Experience | HybridBatch, batch_info: BatchInfo | None = None) -> LossInfo:
        """One gradient step on a time-major batch ``[L, B, ...]``: ``train_step`` + ``calc_loss`` in the loss module
        under autocast (under DDP its backward all-reduces the gradients), then the shared step.

        batch: one ``Experience``, or a ``HybridBatch`` whose two losses the loss module sums (ALF's hybrid training;
        ``batch_info`` then describes both, offline rows first).
        batch_info: where the batch came from; its ``importance_weights [B]`` (prioritized replay) weight the
        per-sample loss. Returns ``calc_loss``'s LossInfo (per-sample loss, new priorities ``[B]`` if any).

        Raises:
            NonFiniteLossError: when a read of the guard is due (see ``finite_check_interval``) and this or an
                earlier update since the last read had a NaN/inf loss; this update changed nothing.
        """
        for value in self._traced_values:  # (compiled updates only) the schedules the loss reads, as tensors
            value.refresh()
        self.algorithm.before_update(batch)  # (eager: what the update keeps is allocated out of compiled code)
        # A diagnosed update runs eagerly: compiled code would recompile for the hooks and the second backward.
        if self._diagnosed():
            return self._forward_step(self.loss_module, batch, batch_info)
        if self._whole is not None and not isinstance(batch, HybridBatch):
            loss_info = self._whole_update(batch, batch_info)
            if loss_info is not None:
                return loss_info
        if self._compiled is not None and self._compiled.warms_up(batch):
            return self._warm_up_update(batch, batch_info)
        return self._forward_step(self._compute_loss, batch, batch_info)

    def _forward_step(self, compute: Callable[[Any], LossInfo], batch: Experience | HybridBatch,
                      batch_info: BatchInfo | None, guard_backward: bool = False) -> LossInfo:
        """``compute(batch)`` under autocast (and the output capture of a diagnosed update), then the shared step."""
        with self.amp.autocast(), self.capturing_outputs():
            loss_info = compute(batch)
        return self._step(loss_info, batch_info, allreduce=False, guard_backward=guard_backward)

    def _warm_up_update(self, batch: Experience | HybridBatch, batch_info: BatchInfo | None) -> LossInfo:
        """A compiled update of the warm-up, where the backward compiles and CUDA graphs record: if its backward fails
        (a compiler error, an out-of-memory during a capture), the update is redone eagerly on the same batch and
        from the same random-number state (so it is the update an eager Learner would make), and training goes on
        eagerly after one warning."""
        try:
            return self._forward_step(self._compiled, batch, batch_info, guard_backward=True)
        except CompiledBackwardError as failure:
            reason = one_line(failure.__cause__)
        # Out of the except block, the failed update's frames (and the compiled graph they held) are gone; the guard
        # forgets its loss, the parameters its gradients; then the compiled code and its memory are released.
        self.finite_guard.forget(self.num_updates)
        self.optimizer.zero_grad(set_to_none=True)
        self._compiled.fall_back("the compiled backward", reason)
        return self._forward_step(self.loss_module, batch, batch_info)

    def _whole_update(self, batch: Experience, batch_info: BatchInfo | None) -> LossInfo | None:
        """The update as one compiled function (``WholeUpdate``), then what ``_step`` does after the optimizer step;
        None when the whole update has fallen back (the caller updates without it)."""
        weights = batch_info.importance_weights if batch_info is not None else None
        if weights is not None and weights.device != self.device:
            weights = weights.to(self.device, non_blocking=True)
        out = self._whole(batch, weights)
        if out is None:
            return None
        loss_info, loss, grad_norm = out
        if weights is not None:
            self._check_weights(loss_info.loss, weights)
        # The update skipped itself on a non-finite loss (nothing changed); the guard reports it as after _step.
        if self._read_loss_every_update:
            self.finite_guard.check_value(float(loss), loss_info, weights, self.num_updates)
        else:
            self.finite_guard.observe(loss, loss_info, weights, self.num_updates)
            if (self.num_updates + 1) % self.finite_guard.check_interval == 0:
                self.check_finite()
        self.algorithm.after_update()
        self.num_updates += 1
        self._last_loss = nest.replace_fields(loss_info, loss=loss)
        self._last_grad_norm = grad_norm
        return loss_info

    def _compile(self, mode: Optional[str], backend: Optional[str | Callable],
                 scope: str) -> Optional[CompiledLoss]:
        """The compiled loss module for ``Learner.compile_mode`` (``None``: eager), or None with ``self._whole`` set
        (``compile_scope='update'`` where it applies), after checking the settings."""
        if scope not in (None, "update", "loss"):
            raise OneLineValueError(f"Learner.compile_scope={scope!r}: use 'update' (the whole update compiled), "
                                    "'loss' (the loss module only) or None (by device)")
        if mode is None:
            if backend is not None:
                raise OneLineValueError(f"Learner.compile_backend={backend!r} is set but compile_mode is None (eager "
                                        "updates): set compile_mode='default' too, or leave compile_backend unset")
            if scope is not None:
                raise OneLineValueError(f"Learner.compile_scope={scope!r} is set but compile_mode is None (eager "
                                        "updates): set compile_mode='default' too, or leave compile_scope unset")
            return None
        if self.algorithm.on_policy:
            raise OneLineValueError(f"Learner.compile_mode={mode!r} compiles train_step + calc_loss on a sampled "
                                    f"batch, which {type(self.algorithm).__name__} (on-policy: its loss is built "
                                    "while unrolling) never runs; leave compile_mode None")
        if mode == "reduce-overhead" and self.device.type != "cuda":
            raise OneLineValueError(f"Learner.compile_mode='reduce-overhead' captures CUDA graphs, but training runs "
                                    f"on {self.device}; use 'default' (or None) there")
        if backend not in (None, "inductor") and mode != "default":
            raise OneLineValueError(f"Learner.compile_mode={mode!r} is a mode of the inductor backend, which "
                                    f"compile_backend={backend!r} would ignore: use compile_mode='default' with it")
        by_device = scope is None
        if by_device:
            scope = "update" if self.device.type == "cpu" else "loss"
        if scope == "update":
            reason = unsupported_reason(self.optimizer, self.dist.enabled, self.amp.enabled)
            if reason is None:
                self._whole = WholeUpdate(self.loss_module, self.optimizer, self.optimizer_config, mode,
                                          backend or "inductor")
                return None
            if by_device:  # the CPU's choice: the loss module alone compiled is no faster there than eager
                logging.warning("Learner.compile_mode=%r cannot compile the whole update here (%s), and on the CPU "
                                "the loss module compiled alone is no faster than eager "
                                "(tools/bench/bench_compiled_update.py): eager updates (compile_scope='loss' "
                                "compiles it anyway)", mode, reason)
                return None
            logging.warning("Learner.compile_scope='update' cannot compile the whole update here (%s): compiling "
                            "the loss module only (compile_scope='loss')", reason)
        return CompiledLoss(self.loss_module, mode, backend or "inductor", self.device)

    def _scanned_updates(self, backend: Optional[str | Callable]) -> ScannedUpdates:
        """``scan_updates=True``'s compiled scan, after checking that it can run here."""
        reason = scan_refusal(self._whole is not None, self.algorithm)
        if reason is not None:
            raise OneLineValueError(f"Learner.scan_updates=True: {reason}")
        self._whole.ensure_state()
        return ScannedUpdates(self._whole, backend or "inductor")

    def update_scanned(self, batch: Experience, batch_info: BatchInfo | None, num_updates: int) -> LossInfo | None:
        """``num_updates`` updates on the consecutive mini-batches of ``batch`` ``[L, num_updates * B]`` (as
        ``sample_batch(..., num_batches=num_updates)`` draws them) in one compiled call, the updates ``update`` makes
        on each in turn. Returns the last update's LossInfo, its ``priority`` the updates' in update order
        ``[num_updates * B]``; None when they cannot run as one scan now (``ScannedUpdates.ready``; a diagnosed
        update among them): the caller then updates on each. Raises ``NonFiniteLossError`` at the first update with
        a NaN/inf loss, the updates before it made (as single updates that read each loss would leave it)."""
        if self._scan is None or not self._scan.ready(self.algorithm, num_updates) or (
                self.diagnostics is not None and any(self.diagnostics.armed(self.num_updates + k)
                                                     for k in range(1, num_updates + 1))):
            return None
        for value in self._traced_values:
            value.refresh()
        weights = batch_info.importance_weights if batch_info is not None else None
        out = self._scan(batch, weights, num_updates, self._whole.ensure_state())
        if out is None:
            return None
        finite = out.finite.tolist()  # (one host read for the K updates)
        made = finite.index(False) if not all(finite) else num_updates
        for _ in range(made):
            self.algorithm.after_update()
        self.num_updates += made
        if made < num_updates:  # update `made` had a non-finite loss: it and the later ones changed nothing
            self.finite_guard.check_value(float(out.loss[made]), nest.map_nest(lambda x: x[made], out.loss_info),
                                          None if out.weights is None else out.weights[made], self.num_updates)
        last = nest.map_nest(lambda x: x[-1], out.loss_info)
        self._last_loss = nest.replace_fields(last, loss=out.loss[-1])
        self._last_grad_norm = None if out.grad_norm is None else out.grad_norm[-1]
        priority = out.loss_info.priority
        if isinstance(priority, torch.Tensor):
            priority = priority.reshape(-1)
        return nest.replace_fields(last, priority=priority)

    def apply(self, loss_info: LossInfo, batch_info: BatchInfo | None = None) -> LossInfo:
        """One gradient step on a loss built outside the loss module (the on-policy path: ``calc_loss`` on the unroll,
        in ``loss_context()``). The same step as ``update``, plus one explicit flattened all-reduce of the gradients
        across ranks, since DDP's backward hooks only fire for losses computed in its forward. Returns ``loss_info``.

        Raises:
            NonFiniteLossError: when a read of the guard is due (see ``finite_check_interval``) and this or an
                earlier update since the last read had a NaN/inf loss; this update changed nothing.
        """
        return self._step(loss_info, batch_info, allreduce=True)

    def _diagnosed(self) -> bool:
        """Whether the coming update is the one a due summary measures (``diagnostics``); a Python test."""
        return self.diagnostics is not None and self.diagnostics.armed(self.num_updates + 1)

    def capturing_outputs(self) -> AbstractContextManager:
        """The context the coming update's forward runs in: hooks recording the networks' outputs when that update
        is diagnosed and ``TrainerConfig.summarize_output`` is on, else nothing. ``update`` enters it itself; the
        on-policy training step unrolls in it (the unroll is its forward)."""
        if self.diagnostics is None:
            return nullcontext()
        return self.diagnostics.capture_outputs(self.num_updates + 1)

    def _step(self, loss_info: LossInfo, batch_info: BatchInfo | None, allreduce: bool,
              guard_backward: bool = False) -> LossInfo:
        """Weighted mean of the per-sample loss ``[..., B]``, guard, backward, (all-reduce), clip, step.
        ``guard_backward``: a failing backward raises ``CompiledBackwardError`` (a compiled warm-up update)."""
        weights = batch_info.importance_weights if batch_info is not None else None
        loss = self._weighted_mean(loss_info.loss, weights)
        if self._read_loss_every_update:  # the CPU default: read the loss itself (free there), no latch to keep
            self.finite_guard.check_value(float(loss.detach()), loss_info, weights, self.num_updates)
            skip = None
        else:
            skip = self.finite_guard.observe(loss, loss_info, weights, self.num_updates)
            if (self.num_updates + 1) % self.finite_guard.check_interval == 0:
                self.check_finite()  # a read due now comes before this update changes anything
        diagnosed = self._diagnosed()
        small = self._small_batch_gradient(loss_info.loss, weights) if diagnosed else None
        self.optimizer.zero_grad(set_to_none=True)
        if guard_backward:
            self._guarded_backward(loss)
        else:
            self.amp.backward(loss)
        if allreduce:
            allreduce_gradients(self.params, self.dist)
        if self.dist.enabled:  # one rank's NaN reaches every rank through the all-reduce: all must skip together
            skip = torch.maximum(skip, non_finite_gradients(self.params))
        self.amp.unscale(self.optimizer)
        if small is not None:  # the gradient noise scale: this update's gradient (all-reduced), before clipping
            grads = [p.grad for p in self.params if p.grad is not None]
            self.diagnostics.gns.update(small[0], squared_norm(grads), small[1], small[2])
        grad_norm = self.optimizer_config.clip(self.params)
        self.amp.step(self.optimizer, skip)  # a fused optimizer skips a non-finite update on the device
        self.algorithm.after_update()
        self.num_updates += 1
        self._last_loss = nest.replace_fields(loss_info, loss=loss.detach())
        self._last_grad_norm = grad_norm
        if diagnosed:
            self.diagnostics.measured()
        return loss_info

    def _guarded_backward(self, loss: torch.Tensor) -> None:
        """The backward of a compiled warm-up update: any failure becomes a ``CompiledBackwardError``."""
        try:
            self.amp.backward(loss)
        except Exception as err:  # noqa: BLE001  (the compiler's, or an out-of-memory in a CUDA-graph capture)
            raise CompiledBackwardError("the compiled backward failed") from err

    def _small_batch_gradient(self, per_sample: torch.Tensor,
                              weights: torch.Tensor | None) -> tuple[torch.Tensor, float, int] | None:
        """For the gradient noise scale: ``(|G_small|^2, B_small, B_big)``. The batch's sequences (``per_sample
        [..., B]``) are split in two halves (the even and the odd ones); ``|G_small|^2`` is the mean of the squared
        norms of the two halves' gradients (two extra backwards that leave ``.grad`` alone; the mean over halves, as
        the paper's mean over devices, cancels the term of the small-batch estimate that grows with |G|),
        ``B_small`` their size (the harmonic mean of the two), and ``B_big = B x world_size``: the update's gradient
        is averaged over the ranks. ``None`` when not measured (a batch of one; no gradient noise scale summary)."""
        if self.diagnostics.gns is None or per_sample.dim() == 0 or per_sample.shape[-1] < 2:
            return None
        params = [p for p in self.params if p.requires_grad]
        scaler = self.amp.scaler  # scaled as the update's own backward (fp16's range), unscaled below
        squares, inverse_sizes = [], []
        for half in (slice(0, None, 2), slice(1, None, 2)):
            loss = self._weighted_mean(per_sample[..., half], weights[half] if weights is not None else None)
            if not loss.requires_grad or not params:
                return None
            grads = torch.autograd.grad(scaler.scale(loss), params, retain_graph=True, allow_unused=True)
            grads = [g for g in grads if g is not None]
            if not grads:
                return None
            squares.append(squared_norm(grads))
            inverse_sizes.append(1.0 / per_sample[..., half].shape[-1])
        small_sq = (squares[0] + squares[1]) * 0.5
        if scaler.is_enabled():
            small_sq = small_sq / scaler.scale(torch.ones((), device=small_sq.device)).float().square()
        return small_sq, 2.0 / sum(inverse_sizes), per_sample.shape[-1] * self.dist.world_size

    def check_finite(self) -> None:
        """Raise ``NonFiniteLossError`` if an update since the last check had a non-finite loss, or the AMP error
        if fp16 skipped too many steps in a row (one host sync). Call before the parameters are saved, published or
        scored."""
        self.finite_guard.check()
        self.amp.check()

    def _weighted_mean(self, per_sample: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
        """``mean(per_sample [..., B] * weights [B])`` (weights broadcast over the leading dims), or the plain mean.

        Entries the algorithm zeroed (masks) add nothing to the sum but count in the mean, as every algorithm's
        per-sample loss assumes.
        """
        if weights is None:
            return per_sample.mean()
        self._check_weights(per_sample, weights)
        if weights.device != per_sample.device:  # the replay's stager normally delivered them on the device
            weights = weights.to(per_sample.device, non_blocking=True)
        return (per_sample * weights).mean()

    def _check_weights(self, per_sample: torch.Tensor, weights: torch.Tensor) -> None:
        """A one-line error unless ``weights`` ``[B]`` fit the per-sample loss ``[..., B]``."""
        name = type(self.algorithm).__name__
        if per_sample.dim() == 0:
            raise ValueError(f"{name}.calc_loss returned a scalar loss, but the batch has importance weights [B]; "
                             "return the per-sample loss [..., B] so each sample can be weighted")
        if weights.dim() != 1 or per_sample.shape[-1] != weights.shape[0]:
            raise ValueError(f"importance weights of shape {tuple(weights.shape)} do not fit {name}'s per-sample "
                             f"loss of shape {tuple(per_sample.shape)}: its last dimension must be the batch B")


    # ---------------------------------------------------------------------------------------------- summaries ----
    def compile_stats(self) -> dict[str, Any] | None:
        """How the compiled updates went (``CompiledLoss.stats``: still compiled, graphs, recompile limit hit; with
        ``scan_updates``, ``scans``: iterations whose updates ran as one scan); ``None`` for eager updates."""
        compiled = self._whole if self._whole is not None else self._compiled
        if compiled is None:
            return None
        return compiled.stats() if self._scan is None else dict(compiled.stats(), scans=self._scan.scans)

    @property
    def last_loss(self) -> LossInfo | None:
        """The LossInfo of the last update, its ``loss`` the detached weighted mean (0-d); None before any."""
        return self._last_loss

    def summary(self) -> dict[str, float | torch.Tensor]:
        """TensorBoard scalars of the last update, by tag: ``loss/total``, ``loss/<term>`` (the named terms, computed
        here, lazily; ``debug/<x>`` for the algorithm's debug statistics), ``loss/grad_norm`` (with norm clipping),
        ``optimizer/lr.<group>``, ``amp/<key>`` (when AMP is enabled), and the diagnostics' ``gns/...`` and
        ``output/...`` (of the update they measured since the last summary). Values may be 0-d tensors on the device:
        reading them is the writer's (host-syncing) business. Arms the diagnostics for the next summary."""
        out: dict[str, float | torch.Tensor] = {}
        if self._last_loss is not None:
            out["loss/total"] = self._last_loss.loss
            for name, value in loss_terms(self._last_loss).items():
                out[term_tag(name)] = value
            if self._last_grad_norm is not None:
                out["loss/grad_norm"] = self._last_grad_norm
        for group in self.optimizer.param_groups:
            out[f"optimizer/lr.{group['name']}"] = group["lr"]
        for key, value in self.amp.summary().items():
            out[f"amp/{key}"] = value
        if self.diagnostics is not None:
            out.update(self.diagnostics.summary())
        return out

    # ------------------------------------------------------------------------------------------- checkpoints ----
    def state_dict(self) -> dict:
        """``{'optimizer': ..., 'amp': ..., 'num_updates': int}``: tensors and python scalars only (checkpoints load
        with ``torch.load(weights_only=True)``)."""
        return {"optimizer": self.optimizer.state_dict(), "amp": self.amp.state_dict(), "num_updates": self.num_updates}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned (the algorithm's own parameters are restored separately)."""
        self.optimizer.load_state_dict(state["optimizer"])
        if "amp" in state:
            self.amp.load_state_dict(state["amp"])
        self.num_updates = int(state.get("num_updates", 0))


def term_tag(name: str) -> str:
    """The TensorBoard tag of a named loss term: ``loss/<name>``, except the debug statistics (``debug/<x>``, or
    ``<part>/debug/<x>`` from a hybrid loss's parts), which go under ``debug/`` (``debug/<part>/<x>``)."""
    head, found, tail = name.partition("debug/")
    if found and (not head or head.endswith("/")):
        return f"debug/{head}{tail}"
    return f"loss/{name}"


def non_finite_gradients(params: list[nn.Parameter]) -> torch.Tensor:
    """1.0 (a 0-d float32 on the parameters' device) if any gradient holds NaN/inf, else 0.0; no host sync."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=params[0].device)
    return (~torch.isfinite(torch.stack(torch._foreach_norm(grads)).sum())).to(torch.float32)
