"""Compiled updates (``Learner.compile_mode``): ``torch.compile`` of the loss module, and the eager fallback when the
compiler fails.

The loss module's forward (``train_step`` + ``calc_loss``, its named terms included) is compiled by dynamo; its
backward by AOTAutograd, lazily, at the first backward of each graph, and with ``'reduce-overhead'`` the CUDA graphs
are recorded in those first updates too. So a compiler failure, or an out-of-memory while a graph is captured, can
come out of the forward (``CompiledLoss.__call__``) or out of the first backwards (the Learner's warm-up updates,
which redo the update eagerly). Either way the run trains on, eagerly, after one warning, and the compiled code and
the CUDA-graph memory are released (``release_compiled_code``). After the warm-up (``WARM_UP_UPDATES`` compiled
updates), a failure in a backward is a real error and is raised.

What the compiled region reads must not make dynamo recompile after the warm-up: it guards on every Python value the
forward reads. The algorithms keep what changes between updates as tensors (``alfish.schedulers.TracedValue``, filled
in place) or as a small flag with few values (TD3's ``actor_due``: two graphs), never as a counter or a float.
"""
from __future__ import annotations

import gc
import logging
from typing import Any, Callable, Optional

import torch
from torch import nn

from alfish.data import nest
from alfish.data.types import Experience, LossInfo
from alfish.errors import OneLineValueError
from alfish.learn.distributed import HybridBatch

#: Compiled updates during which a failure of the compiled backward falls back to eager updates: the backward of each
#: graph compiles at its first backward, and CUDA graphs are recorded at a graph's second run (its first is a warm-up
#: run), so TD3's two graphs (actor due / not due) are compiled and recorded within its first four updates.
WARM_UP_UPDATES = 10


def loss_terms(loss_info: LossInfo) -> dict[str, torch.Tensor | float]:
    """The named loss terms of ``loss_info.extra`` (a dict, or a zero-argument callable computing one lazily)."""
    extra = loss_info.extra
    return dict(extra() if callable(extra) else (extra or {}))


class CompiledBackwardError(RuntimeError):
    """A warm-up update's backward failed (its ``__cause__``): the Learner redoes the update eagerly."""


class LossWithTerms(nn.Module):
    """The loss module with its named terms evaluated inside: compiled, they are outputs of the same graph (with CUDA
    graphs, a closure evaluated later would read buffers that the next replay has overwritten)."""

    def __init__(self, loss_module: nn.Module):
        super().__init__()
        self.loss_module = loss_module

    def forward(self, batch: Experience) -> LossInfo:
        loss_info = self.loss_module(batch)
        return nest.replace_fields(loss_info, extra=loss_terms(loss_info))


class CompiledLoss:
    """``torch.compile`` of the loss module (its terms included), falling back to the eager module (once, with a
    warning) when compilation fails: a run must not die of an optimization.

    With ``'reduce-overhead'`` (CUDA graphs) the outputs live in the graph's static memory, which the next replay
    overwrites; they are cloned (the loss keeps its autograd graph through the clone), since the guard and the
    summaries keep them past the next update.

    Args:
        loss_module: the (DDP-wrapped) loss module, also the eager fallback.
        mode: the ``torch.compile`` mode (``'default'``: torch's default).
        backend: the ``torch.compile`` backend (a name, e.g. ``'inductor'`` or the cheap ``'aot_eager'``, or a
            callable).
        device: the training device (whose random-number state the warm-up updates keep, and whose cached memory a
            fallback releases).

    Attributes:
        compiled: the compiled module; ``None`` after a fallback.
        compiled_updates: forwards run through ``compiled``.
    """

    def __init__(self, loss_module: nn.Module, mode: str, backend: str | Callable = "inductor",
                 device: torch.device | str = "cpu"):
        self.eager, self.mode, self.device = loss_module, mode, torch.device(device)
        self.cuda_graphs = mode == "reduce-overhead"
        self.compiled_updates = 0
        self._random_state: Optional[tuple] = None  # before the forward of a warm-up update
        self._graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        self._limit_hits_before = recompile_limit_hits()
        self.compiled: Optional[nn.Module] = compile_checked(LossWithTerms(loss_module), mode, backend)

    def warms_up(self, batch: Experience | HybridBatch) -> bool:
        """Whether the update on ``batch`` is one of the first ``WARM_UP_UPDATES`` compiled ones."""
        return (self.compiled is not None and self.compiled_updates < WARM_UP_UPDATES
                and not isinstance(batch, HybridBatch))

    def __call__(self, batch: Experience | HybridBatch) -> LossInfo:
        # A HybridBatch (two forwards in one) runs eagerly, as a diagnosed update: compiled, it would be a second graph
        if self.compiled is None or isinstance(batch, HybridBatch):
            return self.eager(batch)
        # During the warm-up a fallback redoes the update eagerly from the random-number state of its start.
        self._random_state = random_state(self.device) if self.warms_up(batch) else None
        self.compiled_updates += 1
        try:
            return self._run_compiled(batch)
        except Exception as err:  # noqa: BLE001  (any compiler failure: train eagerly instead)
            reason = one_line(err)
        self.fall_back("torch.compile", reason)  # out of the except block: the failed frames are gone
        return self.eager(batch)

    def _run_compiled(self, batch: Experience) -> LossInfo:
        if not self.cuda_graphs:
            return self.compiled(batch)
        torch.compiler.cudagraph_mark_step_begin()  # a new update: the previous replay's outputs may be overwritten
        out = self.compiled(batch)
        return nest.map_nest(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, out)

    def fall_back(self, what: str, reason: str) -> None:
        """Train eagerly from now on: one warning (``what`` failed, ``reason``), the random-number state of the
        update's start restored (during the warm-up), the compiled code and its memory released."""
        logging.warning("Learner.compile_mode='%s': %s failed (%s); training eagerly", self.mode, what, reason)
        self.compiled = None
        if self._random_state is not None:
            set_random_state(self._random_state, self.device)
            self._random_state = None
        release_compiled_code(self.device)

    def stats(self) -> dict[str, Any]:
        """``{'compiled': still compiled (no fallback), 'compiled_updates': ..., 'graphs': graphs dynamo compiled
        since this was made (process-wide count), 'recompile_limit_hit': whether dynamo gave up recompiling some
        function and ran it eagerly}`` (for benchmarks: a compiled run must really be compiled)."""
        counters = torch._dynamo.utils.counters
        return dict(compiled=self.compiled is not None, compiled_updates=self.compiled_updates,
                    graphs=counters["stats"]["unique_graphs"] - self._graphs_before,
                    recompile_limit_hit=recompile_limit_hits() > self._limit_hits_before)


def compile_checked(fn: Callable, mode: str, backend: str | Callable) -> Callable:
    """``torch.compile(fn)`` at ``Learner.compile_mode`` (``'default'``: torch's) and backend; an unknown mode or
    backend is a conf error (``OneLineValueError``), not a compiler failure."""
    try:
        return torch.compile(fn, mode=None if mode == "default" else mode, backend=backend)
    except RuntimeError as err:
        setting = f"Learner.compile_mode='{mode}'"
        setting += "" if backend == "inductor" else f", compile_backend={backend!r}"
        raise OneLineValueError(f"{setting}: {str(err).splitlines()[0]} (or None: eager)") from None


def recompile_limit_hits() -> int:
    """How often dynamo gave up recompiling a function in this process (its counters outlive
    ``torch._dynamo.reset``: compare with a count taken earlier)."""
    return sum(n for key, n in torch._dynamo.utils.counters["unimplemented"].items()
               if "recompile limit" in key.lower())


def one_line(err: BaseException) -> str:
    """``Type: first line of the message``, of the backend's own error when the compiler wrapped it."""
    inner = getattr(err, "inner_exception", None)  # (torch._dynamo.exc.BackendCompilerFailed)
    if isinstance(inner, BaseException):
        err = inner
    text = str(err)
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def random_state(device: torch.device) -> tuple:
    """The state of torch's CPU generator and, on CUDA, of ``device``'s generator (no host sync)."""
    return torch.get_rng_state(), (torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def set_random_state(state: tuple, device: torch.device) -> None:
    """Restore what ``random_state`` returned."""
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def release_compiled_code(device: torch.device) -> None:
    """Free what compilation holds after a fallback to eager updates.

    Dropping the compiled module is not enough: dynamo caches the compiled code (and its guards) on the loss module's
    code objects, and CUDA graphs keep their memory pool in the process-wide cudagraph trees; ``torch.compiler.reset``
    is the public way to free both (it forgets every compiled function of the process; alfish compiles only the loss
    module). The failed update's autograd graph may sit in reference cycles (exception tracebacks): collect it first.
    On CUDA the freed memory then goes back to the driver, so the eager updates (and other processes) can use it.
    """
    gc.collect()
    torch.compiler.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()
