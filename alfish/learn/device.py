"""The device policy (DESIGN.md §3.12): where training, acting and replay live, decided in one place.

    DevicePolicy.device = 'auto'          # training: 'auto' | 'cpu' | 'cuda' | 'cuda:N'
    DevicePolicy.rollout_device = 'cpu'   # the async unroll child's and the evaluator's policy copy
    DevicePolicy.replay_storage = 'cpu'   # 'cpu' | 'mmap' (host memory) | 'device' (buffers that fit)
    DevicePolicy.matmul_precision = 'highest'  # float32 matmuls: 'highest' | 'high' (TF32) | 'medium'

Under torchrun each rank trains on ``cuda:(LOCAL_RANK % device_count())`` (one GPU per task under SLURM gives
``LOCAL_RANK % 1 == 0``). The trainer's own process acts with the algorithm itself, so a synchronous unroll acts on the
training device: observations cross to it once per env step, actions back once.
"""
from __future__ import annotations

import dataclasses
import os

import gin
import torch

from alfish.errors import OneLineValueError

REPLAY_STORAGES = ("cpu", "mmap", "device")
MATMUL_PRECISIONS = ("highest", "high", "medium")  # torch.set_float32_matmul_precision's values
CPU = torch.device("cpu")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class DevicePolicy:
    """Where things live. ``device``: training (modules, optimizer state, target networks, normalizer statistics,
    the AMP scaler). ``rollout_device``: policy copies acting in other processes (async unroll child) and the
    evaluator. ``replay_storage``: the replay buffer's memory.

    ``matmul_precision``: the internal precision of float32 matmuls and convolutions in the training process
    (``torch.set_float32_matmul_precision``, set with the training device): ``'highest'`` (full float32), ``'high'``
    (TF32 tensor cores on Ampere and newer GPUs: several times the fp32 rate, 10-bit mantissa products, float32
    accumulation) or ``'medium'`` (bf16 products where the hardware has them). Always applied, so the conf (and
    the operative config it records) says what precision a run trained in, whatever the process had set before.
    The async unroll and evaluation children act in full precision: their matmuls are a policy at the batch of a
    few envs, too small for TF32 to matter."""

    device: str = "auto"
    rollout_device: str = "cpu"
    replay_storage: str = "cpu"
    matmul_precision: str = "highest"

    def __post_init__(self) -> None:
        if self.replay_storage not in REPLAY_STORAGES:
            raise OneLineValueError(f"DevicePolicy.replay_storage='{self.replay_storage}' must be one of "
                                    f"{list(REPLAY_STORAGES)}")
        if self.matmul_precision not in MATMUL_PRECISIONS:
            raise OneLineValueError(f"DevicePolicy.matmul_precision={self.matmul_precision!r} must be one of "
                                    f"{list(MATMUL_PRECISIONS)} ('high': TF32 on Ampere+ GPUs)")

    def training_device(self, local_rank: int | None = None) -> torch.device:
        """The training device of this process (``local_rank``: its rank on the node under torchrun; ``None`` reads
        ``LOCAL_RANK`` when torchrun set it). Makes it CUDA's current device and applies ``matmul_precision``."""
        if local_rank is None and "LOCAL_RANK" in os.environ:
            local_rank = int(os.environ["LOCAL_RANK"])
        device = resolve_device(self.device, local_rank, "DevicePolicy.device")
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL and the caching allocator use the current device
        torch.set_float32_matmul_precision(self.matmul_precision)
        return device

    def acting_device(self, local_rank: int | None = None) -> torch.device:
        """Where the async unroll child's and the evaluator's policy copies act (``local_rank`` as for
        ``training_device``: 'cuda' under torchrun is ``cuda:(LOCAL_RANK % device_count())``). Resolved in the
        trainer's process and sent to the children in their spec: a child has no rank variables
        (``alfish.collect.child_process.without_rank_variables``), so it must not resolve it again."""
        if local_rank is None and "LOCAL_RANK" in os.environ:
            local_rank = int(os.environ["LOCAL_RANK"])
        return resolve_device(self.rollout_device, local_rank, "DevicePolicy.rollout_device")


def resolve_device(name: str, local_rank: int | None = None, what: str = "device") -> torch.device:
    """``'auto'`` (CUDA when available, else CPU), ``'cpu'``, ``'cuda'`` (under torchrun: the local rank's GPU) or
    ``'cuda:N'``. A device that is not there is a one-line error saying what is there."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise OneLineValueError(f"{what}='{name}' is not a device; use 'auto', 'cpu', 'cuda' or 'cuda:N'") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise OneLineValueError(f"{what}='{name}': alfish trains on 'cpu' or 'cuda' devices ('auto' picks one)")
    if not torch.cuda.is_available():
        raise OneLineValueError(f"{what}='{name}' but this machine has no usable CUDA device (torch "
                                f"{torch.__version__}, CUDA build: {torch.version.cuda is not None}); use 'cpu' or "
                                "'auto'")
    count = torch.cuda.device_count()
    if device.index is None:
        return torch.device("cuda", (local_rank or 0) % count)
    if device.index >= count:
        raise OneLineValueError(f"{what}='{name}' but only {count} CUDA device(s) are visible (cuda:0 to "
                                f"cuda:{count - 1})")
    return device
