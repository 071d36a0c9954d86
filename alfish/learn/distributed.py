"""Data-parallel training across processes launched by ``torchrun`` (DESIGN.md §3.8).

``torchrun`` sets ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK`` and the rendezvous address; ``init_distributed`` joins the
process group from them (``env://``), so multi-node works as torchrun does. Each rank runs its own envs (seeded per
rank) and its own replay buffer; gradients are averaged across ranks once per update, so all ranks keep identical
parameters. As in ALF, ``num_parallel_environments`` and ``mini_batch_size`` are per rank, while ``num_env_steps`` and
``initial_collect_steps`` count env steps over the whole job.

Two kinds of traffic cross the ranks:

- training traffic, on the training device: gradients (DDP's all-reduce, ``allreduce_gradients``) and the normalizer
  statistics (``merge_statistics_across_ranks``);
- control traffic, small CPU tensors and pickled objects: the stop/checkpoint flags (``any_rank``, every iteration),
  ``broadcast_object``, the parameter checksums (``check_parameters_equal``, gathered on the CPU because the
  comparison reads them there anyway) and the barrier in ``shutdown``.

Waits for rank 0's checkpoints, and the end-of-run barrier, go through a gloo group of their own whose timeout is
``checkpoint_timeout_s`` (``DistContext.checkpoint_group``), so a long write is not taken for a hung rank: see
``alfish.learn.checkpoint_barrier``.

NCCL refuses CPU tensors, so a CUDA job joins one default group with two backends, ``'cpu:gloo,cuda:nccl'``: torch
routes each collective by the device of its tensors (CPU -> gloo, CUDA -> NCCL), object collectives and the barrier
go through gloo, and both share the group's timeout. This was chosen over a second, gloo-only group for the control
traffic because nothing here has to pass a group around and the default group serves both kinds. The NCCL
communicator is *not* bound eagerly (no ``device_id`` in ``init_process_group``): ``init_distributed`` first checks
over gloo that no two ranks of a node train on the same GPU (NCCL cannot share one; its own failure is a hang or a
multi-line "Duplicate GPU" error), then the communicator forms at the first CUDA collective (DDP's initial
broadcast, a moment later in ``build_trainer``). ``init_distributed.backend = 'gloo'`` keeps everything on gloo, which
also handles CUDA tensors for the collectives used here (all-reduce, broadcast, all-gather): the way to let several
ranks share one GPU.
"""
from __future__ import annotations

import dataclasses
import datetime
import inspect
import logging
import os
import socket
from collections.abc import Sequence
from typing import NamedTuple

import gin
import torch
import torch.distributed as dist
from torch import nn

from alfish.data.types import Experience, LossInfo
from alfish.errors import OneLineValueError
from alfish.learn import heartbeat
from alfish.learn.device import CPU
from alfish.transforms.normalizers import RunningMeanStd

logger = logging.getLogger(__name__)


#: ``init_distributed.checkpoint_timeout_s``'s default: 30 minutes (torch's own default collective timeout), enough for
#: tens of GB on a slow network file system.
DEFAULT_CHECKPOINT_TIMEOUT_S = 1800.0


@dataclasses.dataclass(frozen=True)
class DistContext:
    """Where this process sits in the job. ``world_size == 1``: a plain single-process run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    checkpoint_timeout_s: float = DEFAULT_CHECKPOINT_TIMEOUT_S
    # a gloo group of every rank whose barrier waits checkpoint_timeout_s (None in a single process)
    checkpoint_group: object = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes summaries, checkpoints and evaluations."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


BACKENDS = ("gloo", "nccl")
# NCCL for the training tensors on CUDA, gloo for the control traffic on the CPU (see the module docstring).
NCCL_WITH_CPU_CONTROL = "cpu:gloo,cuda:nccl"


@gin.configurable(denylist=["device"])
def init_distributed(device: torch.device = CPU, backend: str | None = None, timeout_s: float = 30.0,
                     checkpoint_timeout_s: float = DEFAULT_CHECKPOINT_TIMEOUT_S) -> DistContext:
    """Join the torchrun job described by the environment, or return a single-process context.

    device: this rank's training device (``DevicePolicy.training_device``).
    backend: ``None`` chooses nccl for a CUDA device, else gloo; ``'gloo'`` or ``'nccl'`` override. ``'nccl'`` means
    NCCL for CUDA tensors and gloo for the CPU control traffic (``'cpu:gloo,cuda:nccl'``); ``'gloo'`` on CUDA lets
    several ranks share a GPU.
    timeout_s: how long a collective may wait for the other ranks before it fails (a dead or hung rank must end the
    job quickly, not after torch's default of 30 minutes).
    checkpoint_timeout_s: how long the other ranks wait for rank 0 to write a checkpoint (with the replay buffer by
    default: gigabytes at scale), and for each other at the end of the run (``alfish.learn.checkpoint_barrier``); a
    write that takes longer ends the job with a one-line error saying so.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistContext()
    backend = choose_backend(device, backend)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        dist.init_process_group(backend=NCCL_WITH_CPU_CONTROL if backend == "nccl" else backend,
                                init_method="env://", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    # (every rank makes the group, right after joining: groups must be made in the same order on all ranks)
    checkpoint_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=checkpoint_timeout_s))
    ctx = DistContext(rank=rank, world_size=world_size, local_rank=local_rank, backend=backend,
                      checkpoint_timeout_s=checkpoint_timeout_s, checkpoint_group=checkpoint_group)
    if backend == "nccl":
        check_one_rank_per_gpu(device, ctx)  # over gloo, before NCCL is touched
    logger.info("distributed: rank %d of %d (local rank %d) on %s, backend %s, collective timeout %.0f s, checkpoint "
                "timeout %.0f s", rank, world_size, local_rank, device, backend, timeout_s, checkpoint_timeout_s)
    return ctx


def choose_backend(device: torch.device, backend: str | None) -> str:
    """``'gloo'`` or ``'nccl'`` for a rank training on ``device`` (``backend``: the user's override or None)."""
    if backend is None:
        return "nccl" if device.type == "cuda" else "gloo"
    if backend not in BACKENDS:
        raise OneLineValueError(f"init_distributed.backend='{backend}' must be 'gloo', 'nccl' or None (automatic)")
    if backend == "nccl" and device.type != "cuda":
        raise OneLineValueError(f"init_distributed.backend='nccl' needs a CUDA training device but this rank trains "
                                f"on {device}; use 'gloo' (or None) or set DevicePolicy.device = 'cuda'")
    return backend


def device_identity(device: torch.device) -> str:
    """``host/GPU-uuid`` (the physical GPU, whatever ``CUDA_VISIBLE_DEVICES`` each rank was given)."""
    try:
        gpu = str(torch.cuda.get_device_properties(device).uuid)
    except (AttributeError, RuntimeError):  # an older driver or build without uuids: the visible index
        gpu = str(device)
    return f"{socket.gethostname()}/{gpu}"


def check_one_rank_per_gpu(device: torch.device, ctx: DistContext) -> None:
    """A one-line error on every rank when two ranks train on the same GPU with NCCL (which cannot share one).

    One small all-gather of ``(host/GPU, device name)`` over gloo, at start only; every rank then judges the same
    list, so all raise alike."""
    identities: list = [None] * ctx.world_size
    dist.all_gather_object(identities, (device_identity(device), str(device)))
    check_distinct_gpus(identities)


def check_distinct_gpus(identities: Sequence[tuple[str, str]]) -> None:
    """``identities[rank] = (host/GPU, device name)``; a one-line error naming the first two ranks sharing a GPU."""
    first_rank: dict[str, int] = {}
    for rank, (identity, name) in enumerate(identities):
        if identity in first_rank:
            host = identity.split("/")[0]
            visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
            raise OneLineValueError(
                f"ranks {first_rank[identity]} and {rank} both train on {name} of host {host}, but NCCL needs one "
                f"GPU per rank ({visible} visible here); set init_distributed.backend = 'gloo' to share GPUs, or "
                "start fewer processes per node (--nproc_per_node)")
        first_rank[identity] = rank


def log_job_totals(ctx: DistContext, envs_per_rank: int, mini_batch_size: int | None) -> None:
    """Log what the per-rank settings add up to over the job (a torchrun user should see the effective totals)."""
    if not ctx.enabled:
        return
    logger.info("per rank: %d envs, mini_batch_size %s; over the %d ranks: %d envs, mini-batches of %s",
                envs_per_rank, mini_batch_size, ctx.world_size, envs_per_rank * ctx.world_size,
                None if mini_batch_size is None else mini_batch_size * ctx.world_size)


class HybridBatch(NamedTuple):
    """Two batches trained as one loss (ALF's hybrid training): ``mean(loss of offline) + mean(loss of online)``, in
    one forward (``sum_losses``). The ``BatchInfo`` an update gets with it describes both, ``offline``'s rows first."""

    offline: Experience  # [L, B1]
    online: Experience  # [L, B2]


class LossModule(nn.Module):
    """The module DDP wraps: its forward computes an algorithm's loss on a time-major batch, so the backward of that
    loss all-reduces the gradients (once per update)."""

    def __init__(self, algorithm: nn.Module):
        super().__init__()
        self.algorithm = algorithm

    def forward(self, batch: Experience | HybridBatch) -> LossInfo:
        """The loss of ``batch``; of a ``HybridBatch``, the sum of its two losses' means, in one graph."""
        if isinstance(batch, HybridBatch):
            return sum_losses(self._loss(batch.offline), self._loss(batch.online))
        return self._loss(batch)

    def _loss(self, exp: Experience) -> LossInfo:
        train_info = self.algorithm.train_step(exp).info
        return self.algorithm.calc_loss(exp, train_info)


def sum_losses(first: LossInfo, second: LossInfo) -> LossInfo:
    """One LossInfo whose weighted mean is ``mean(first) + mean(second)`` (each weighted by its own importance
    weights when the batch infos are concatenated in the same order): the per-sample losses ``[..., B1]`` and
    ``[..., B2]`` are concatenated along the batch, each scaled by ``(n1 + n2) / n_i``. Named terms of ``second`` keep
    their names; those of ``first`` get the prefix ``offline/``. Priorities ``[B1 + B2]``."""
    a, b = first.loss, second.loss
    if a.dim() == 0 or b.dim() == 0:
        loss = a.mean() + b.mean()
    else:
        total = a.numel() + b.numel()
        loss = torch.cat([a * (total / a.numel()), b * (total / b.numel())], dim=-1)

    def extra() -> dict:
        out = {f"offline/{k}": v for k, v in _terms(first).items()}
        out.update(_terms(second))
        return out

    has_priority = isinstance(first.priority, torch.Tensor) and isinstance(second.priority, torch.Tensor)
    priority = torch.cat([first.priority, second.priority]) if has_priority else ()
    return LossInfo(loss=loss, extra=extra, priority=priority)


def _terms(loss_info: LossInfo) -> dict:
    extra = loss_info.extra
    return dict(extra() if callable(extra) else (extra or {}))


def wrap_for_ddp(algorithm: nn.Module, ctx: DistContext, device: torch.device = CPU) -> nn.Module:
    """``LossModule(algorithm)``, wrapped in DDP when the job has several ranks.

    DDP broadcasts rank 0's parameters and buffers at construction, so all ranks start equal. Algorithms whose some
    updates leave parameters out of the loss (TD3's delayed actor) make DDP search the graph for them each update.
    """
    module = LossModule(algorithm)
    if not ctx.enabled:
        return module
    find_unused = bool(getattr(algorithm, "skips_parameters_in_some_updates", False))
    device_ids = [device] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(module, device_ids=device_ids, find_unused_parameters=find_unused,
                                                **_buffers_synced_once(module))


def _buffers_synced_once(module: nn.Module) -> dict:
    """DDP's keyword for buffers that are rank 0's after construction and never broadcast again at a forward (the
    normalizer statistics are merged across ranks instead, ``merge_statistics_across_ranks``): torch >= 2.13's
    ``forward_sync_buffers=False``. Older releases (the floor is in ``alfish.TORCH_FLOOR``) have only
    ``broadcast_buffers=False``, which also leaves the buffers out of the construction's broadcast, so the buffers are
    broadcast here first, once (as DDP's construction does with the parameters)."""
    if "forward_sync_buffers" in inspect.signature(nn.parallel.DistributedDataParallel.__init__).parameters:
        return dict(forward_sync_buffers=False)
    for buffer in module.buffers():
        dist.broadcast(buffer, src=0)
    return dict(broadcast_buffers=False)


def allreduce_gradients(params: Sequence[torch.Tensor], ctx: DistContext) -> None:
    """Average the gradients of ``params`` over the ranks (for the on-policy path, whose loss is built during the
    unroll rather than in a DDP forward). One flattened all-reduce on the parameters' device (NCCL on CUDA, or gloo,
    which handles CUDA tensors too)."""
    if not ctx.enabled:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= ctx.world_size
    offset = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[offset:offset + n].view_as(p).clone()
        offset += n


def parameter_checksums(module: nn.Module) -> tuple[list[str], torch.Tensor]:
    """``(names, checksums [P] float64 on the CPU)``: one number per parameter (sum plus 1e-3 x sum of absolute
    values, in float64 on the parameters' device), copied to the host once."""
    names, sums = [], []
    for name, p in module.named_parameters():
        names.append(name)
        sums.append(p.detach().double().sum() + p.detach().double().abs().sum() * 1e-3)
    return names, torch.stack(sums).cpu()


def check_parameters_equal(module: nn.Module, ctx: DistContext) -> None:
    """Compare per-parameter checksums across ranks; a mismatch is an error naming the first differing parameter.

    The checksums are computed on the training device and gathered on the CPU (control traffic, gloo): the comparison
    reads them on the host anyway, and every ``ddp_paras_check_interval`` iterations is rare enough for that sync."""
    if not ctx.enabled:
        return
    names, local = parameter_checksums(module)
    gathered = [torch.zeros_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, local)
    for other_rank, other in enumerate(gathered):
        differs = (other != gathered[0]).nonzero()
        if len(differs):
            name = names[int(differs[0])]
            raise RuntimeError(f"DDP ranks hold different parameters: '{name}' differs between rank 0 and rank "
                               f"{other_rank} (checksums {float(gathered[0][differs[0]])} vs "
                               f"{float(other[differs[0]])}); were the ranks built from different confs, or did "
                               "something update parameters outside the optimizer?")


def merge_statistics_across_ranks(module: nn.Module, ctx: DistContext) -> None:
    """Give every rank the same normalizer statistics: those of one process that saw every rank's data.

    Each ``RunningMeanStd`` in ``module`` (e.g. the data transformers) keeps the statistics of the values its rank saw
    since the last merge (count, mean, M2); one all-gather of all of them, flattened (``world_size x sum(1 + 2 x
    values per statistic)`` float64 on the statistics' device), and every rank folds the deltas into the last merged
    statistics in rank order (Chan et al.'s parallel update), so the ranks end bit-identical.

    Cadence: once per training iteration, on every rank, right after the iteration's collection and before its
    training step (then a training step normalizes every rank's batches with the same statistics). The cost is one
    small collective (a few hundred bytes for a 10-dim observation) and a few tiny ops per statistic, with no host sync
    on CUDA. No-op in a single process (the statistics are exactly the plain running ones) and when ``module`` holds no
    statistics (every rank builds the same transformers, so every rank skips alike).
    """
    if not ctx.enabled:
        return
    stats = [m for m in module.modules() if isinstance(m, RunningMeanStd)]
    if not stats:
        return
    untracked = [name or "RunningMeanStd" for name, m in module.named_modules()
                 if isinstance(m, RunningMeanStd) and not m.tracks_rank_deltas]
    if untracked:
        raise RuntimeError(f"normalizer statistics {untracked} were built before init_distributed, so they do not "
                           "keep per-rank deltas; build the data transformers after joining the process group")
    local = torch.cat([s.delta_vector() for s in stats])
    gathered = [torch.empty_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, local)
    offset = 0
    for s in stats:
        size = 1 + 2 * s.mean.numel()  # delta_vector's layout
        s.fold_rank_deltas([g[offset:offset + size] for g in gathered])
        offset += size


def any_rank(flags: Sequence[bool], ctx: DistContext, iteration: int | None = None) -> list[bool]:
    """Each flag True on every rank when it is True on any (a stop signal must stop all ranks at the same
    iteration); one small all-reduce for all of them. Called once per iteration, it also records this rank's progress
    (``heartbeat.beat``), so a collective timeout can name the rank that stopped."""
    if not ctx.enabled:
        return list(flags)
    _AnyRankCalls.count += 1
    heartbeat.beat(_AnyRankCalls.count if iteration is None else iteration, ctx.rank)
    values = torch.tensor([int(f) for f in flags])
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return [bool(v) for v in values.tolist()]


class _AnyRankCalls:
    count = 0  # the progress recorded when the caller gives no iteration


def broadcast_object(obj: object, ctx: DistContext) -> object:
    """Rank 0's ``obj`` on every rank (e.g. the run's seed)."""
    if not ctx.enabled:
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def shutdown(ctx: DistContext, synchronize: bool = False) -> None:
    """Leave the process group. ``synchronize`` (after a normal end) first waits for every rank to get here, so no
    rank tears its connections down while another still finishes its last collective; after an error there may be
    nobody to wait for. The wait is in the checkpoint group (``checkpoint_timeout_s``): rank 0 may still be writing
    the final checkpoint, evaluation and summaries."""
    if ctx.enabled and dist.is_initialized():
        if synchronize:
            dist.barrier(group=ctx.checkpoint_group)
        dist.destroy_process_group()


#: What a collective's error says when the rank on the other end went away (exited or crashed): gloo's TCP pair, NCCL.
PEER_GONE_MARKERS = ("Connection closed by peer", "Connection reset by peer", "remote process exited",
                     "ncclRemoteError")


def failed_because_a_peer_did(error: BaseException) -> bool:
    """Whether ``error`` (or an exception it was raised from) is a collective failing because another rank went
    away: a consequence of that rank's failure, not a root cause of its own."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if any(marker in str(error) for marker in PEER_GONE_MARKERS):
            return True
        error = error.__cause__ or error.__context__
    return False


class RankStoppedError(RuntimeError):
    """A collective timed out because another rank stopped making progress; the message names that rank."""


def explain_collective_timeout(error: BaseException, ctx: DistContext) -> BaseException:
    """``error`` itself, or a ``RankStoppedError`` naming the rank(s) that stopped when ``error`` is a collective
    timeout that a hung peer caused (``heartbeat.diagnose_timeout``; waits up to ``heartbeat.GRACE_S``). Call it while
    the process group is still up, and raise the result ``from error``."""
    if not ctx.enabled or isinstance(error, RankStoppedError) or not heartbeat.is_timeout(error):
        return error  # (a RankStoppedError names the rank already, e.g. a checkpoint wait that timed out)
    line = heartbeat.diagnose_timeout(ctx.rank, ctx.world_size)
    return error if line is None else RankStoppedError(line)
