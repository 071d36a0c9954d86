"""Data-parallel training across processes launched by ``torchrun`` (DESIGN.md §3.8).

``torchrun`` sets ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK`` and the rendezvous address; ``init_distributed`` joins the
process group from them (``env://``), so multi-node works as torchrun does. Each rank runs its own envs (seeded per
rank) and its own replay buffer; gradients are averaged across ranks once per update, so all ranks keep identical
parameters. As in ALF, ``num_parallel_environments`` and ``mini_batch_size`` are per rank, while ``num_env_steps`` and
``initial_collect_steps`` count env steps over the whole job.
"""
from __future__ import annotations

import dataclasses
import datetime
import logging
import os
from collections.abc import Sequence

import gin
import torch
import torch.distributed as dist
from torch import nn

from alfish.data.types import Experience, LossInfo
from alfish.learn.device import CPU

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DistContext:
    """Where this process sits in the job. ``world_size == 1``: a plain single-process run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes summaries, checkpoints and evaluations."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


@gin.configurable(denylist=["device"])
def init_distributed(device: torch.device = CPU, backend: str | None = None,
                     timeout_s: float = 30.0) -> DistContext:
    """Join the torchrun job described by the environment, or return a single-process context.

    device: this rank's training device (``DevicePolicy.training_device``).
    backend: ``None`` chooses nccl for a CUDA device, else gloo; ``'gloo'`` or ``'nccl'`` override.
    timeout_s: how long a collective may wait for the other ranks before it fails (a dead or hung rank must end the
    job quickly, not after torch's default of 30 minutes).
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistContext()
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"init_distributed.backend='{backend}' must be 'gloo', 'nccl' or None (automatic)")
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    logger.info("distributed: rank %d of %d (local rank %d), backend %s, collective timeout %.0f s", rank,
                 world_size, local_rank, backend, timeout_s)
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, backend=backend)


def log_job_totals(ctx: DistContext, envs_per_rank: int, mini_batch_size: int | None) -> None:
    """Log what the per-rank settings add up to over the job (a torchrun user should see the effective totals)."""
    if not ctx.enabled:
        return
    logger.info("per rank: %d envs, mini_batch_size %s; over the %d ranks: %d envs, mini-batches of %s",
                envs_per_rank, mini_batch_size, ctx.world_size, envs_per_rank * ctx.world_size,
                None if mini_batch_size is None else mini_batch_size * ctx.world_size)


class LossModule(nn.Module):
    """The module DDP wraps: its forward computes an algorithm's loss on a time-major batch, so the backward of that
    loss all-reduces the gradients (once per update)."""

    def __init__(self, algorithm: nn.Module):
        super().__init__()
        self.algorithm = algorithm

    def forward(self, exp: Experience) -> LossInfo:
        train_info = self.algorithm.train_step(exp).info
        return self.algorithm.calc_loss(exp, train_info)


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
                                                forward_sync_buffers=False)


def allreduce_gradients(params: Sequence[torch.Tensor], ctx: DistContext) -> None:
    """Average the gradients of ``params`` over the ranks (for the on-policy path, whose loss is built during the
    unroll rather than in a DDP forward). One flattened all-reduce."""
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


def check_parameters_equal(module: nn.Module, ctx: DistContext) -> None:
    """Compare per-parameter checksums across ranks; a mismatch is an error naming the first differing parameter."""
    if not ctx.enabled:
        return
    names, sums = [], []
    for name, p in module.named_parameters():
        names.append(name)
        sums.append(p.detach().double().sum() + p.detach().double().abs().sum() * 1e-3)
    local = torch.stack(sums)
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


def any_rank(flags: Sequence[bool], ctx: DistContext) -> list[bool]:
    """Each flag True on every rank when it is True on any (a stop signal must stop all ranks at the same
    iteration); one small all-reduce for all of them."""
    if not ctx.enabled:
        return list(flags)
    values = torch.tensor([int(f) for f in flags])
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return [bool(v) for v in values.tolist()]


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
    nobody to wait for."""
    if ctx.enabled and dist.is_initialized():
        if synchronize:
            dist.barrier()
        dist.destroy_process_group()
