"""Choosing the process group's backend, refusing NCCL ranks that share a GPU, and refusing to resume a checkpoint
with another world size, without starting processes (the CUDA layouts run in tests/gpu/test_ddp_cuda.py, a real
2-rank checkpoint refused by one process in test_torchrun_confs.py)."""
import pytest
import torch

from alfish.errors import OneLineValueError
from alfish.learn.distributed import DistContext, check_distinct_gpus, choose_backend, init_distributed
from alfish.rundir.checkpoint import CheckpointError, LoadedCheckpoint
from alfish.trainer.resume import CHECKPOINT_LAYOUT, check_resumable

CUDA0 = torch.device("cuda", 0)
CPU = torch.device("cpu")


def test_the_backend_follows_the_device_unless_overridden():
    assert choose_backend(CPU, None) == "gloo"
    assert choose_backend(CUDA0, None) == "nccl"  # NCCL for CUDA tensors, gloo for the CPU control traffic
    assert choose_backend(CUDA0, "gloo") == "gloo"  # ranks sharing a GPU
    with pytest.raises(OneLineValueError, match=r"^init_distributed.backend='nccl' needs a CUDA training device but "
                                                r"this rank trains on cpu; use 'gloo'"):
        choose_backend(CPU, "nccl")
    with pytest.raises(OneLineValueError, match=r"^init_distributed.backend='mpi' must be 'gloo', 'nccl' or None"):
        choose_backend(CPU, "mpi")


def test_two_ranks_on_one_gpu_are_a_one_line_error_naming_the_fix():
    check_distinct_gpus([("node1/GPU-a", "cuda:0"), ("node1/GPU-b", "cuda:1"), ("node2/GPU-a", "cuda:0")])
    with pytest.raises(OneLineValueError) as err:
        check_distinct_gpus([("node1/GPU-a", "cuda:0"), ("node1/GPU-b", "cuda:1"), ("node1/GPU-a", "cuda:0")])
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("ranks 0 and 2 both train on cuda:0 of host node1, but NCCL needs one GPU per rank")
    assert message.endswith("set init_distributed.backend = 'gloo' to share GPUs, or start fewer processes per node "
                            "(--nproc_per_node)")


def test_outside_torchrun_there_is_no_process_group(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert init_distributed(CPU) == DistContext()
    monkeypatch.setenv("WORLD_SIZE", "1")  # torchrun --nproc_per_node=1: a plain single-process run
    assert init_distributed(CUDA0) == DistContext()


def checkpoint(**meta):
    return LoadedCheckpoint(step=3, path="/runs/x/checkpoints/ckpt-3", tensors={},
                            meta=dict(layout=CHECKPOINT_LAYOUT, **meta))


def test_a_checkpoint_resumes_only_with_the_world_size_that_wrote_it():
    check_resumable(checkpoint(world_size=2), 2)
    check_resumable(checkpoint(world_size=2))  # restore() checks the layout only
    with pytest.raises(CheckpointError) as err:
        check_resumable(checkpoint(world_size=2), 4)
    assert str(err.value) == ("checkpoint /runs/x/checkpoints/ckpt-3 was written by a 2-rank job and this job has 4; "
                              "resume it with 2 ranks (e.g. torchrun --nproc_per_node=2) (replay buffers and env "
                              "seeds are per rank), or train into a new root_dir")


def test_a_checkpoint_from_before_the_world_size_was_recorded_counts_as_one_rank():
    check_resumable(checkpoint(), 1)
    with pytest.raises(CheckpointError, match=r"written by a 1-rank job and this job has 2; resume it with a single "
                                              r"process \(python -m alfish.bin.train, without torchrun\)"):
        check_resumable(checkpoint(), 2)
