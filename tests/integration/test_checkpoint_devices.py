"""A checkpoint written by a GPU run plays and resumes on a CPU-only machine.

Without a GPU we make a run whose saved tensors *claim* to live on ``cuda:0``: a serialization tagger registered
ahead of torch's own labels every CPU storage ``cuda:0`` while the run saves. Such files cannot be loaded here without
``map_location`` (asserted, so the test proves the files really claim CUDA); play and resume must load them anyway.
"""
import os

import gin
import pytest
import torch
import torch.serialization as serialization

from alfish.bin import play
from alfish.config import TrainerConfig, load_conf
from alfish.rundir.checkpoint import Checkpointer

from .test_learning import SAC_POINT_GOAL

TINY = ["SacAlgorithm.hidden_sizes = (8,)", "TrainerConfig.mini_batch_size = 4", "TrainerConfig.evaluate = False",
        "TrainerConfig.summary_interval = 1000", "TrainerConfig.initial_collect_steps = 10",
        "TrainerConfig.num_checkpoints = 1", "DevicePolicy.device = 'cpu'"]


def _claim_cuda(obj):
    if getattr(obj, "device", None) is not None and obj.device.type == "cpu":
        return "cuda:0"
    return None


class StoragesClaimCuda:
    """While active, ``torch.save`` labels CPU storages as ``cuda:0`` (what a GPU run writes)."""

    def __enter__(self):
        serialization.register_package(1, _claim_cuda, lambda obj, location: None)

    def __exit__(self, *exc):
        serialization._package_registry[:] = [e for e in serialization._package_registry if e[1] is not _claim_cuda]


def train(tmp_path, steps: int) -> str:
    from alfish.trainer.build import build_trainer

    conf = tmp_path / "sac.gin"
    conf.write_text(SAC_POINT_GOAL)
    load_conf(str(conf), TINY + [f"TrainerConfig.num_env_steps = {steps}"])
    try:
        root = str(tmp_path / "root")
        assert build_trainer(TrainerConfig(root_dir=root)).run() == 0
        return root
    finally:
        gin.clear_config()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA to prove map_location")
@pytest.mark.timeout(120)
def test_a_checkpoint_whose_tensors_claim_cuda_plays_and_resumes_on_the_cpu(tmp_path):
    with StoragesClaimCuda():
        root = train(tmp_path, 20)
    checkpoints = os.path.join(root, "checkpoints")
    algorithm_file = os.path.join(checkpoints, sorted(os.listdir(checkpoints))[-1], "algorithm.pt")
    with pytest.raises(RuntimeError, match="Attempting to deserialize object on a CUDA device"):
        torch.load(algorithm_file, weights_only=True)  # the file really says cuda:0
    assert play.main(["--root_dir", root, "--num_episodes", "1"]) == 0
    train(tmp_path, 30)  # resumes from the "GPU" checkpoint and goes on
    assert Checkpointer(os.path.join(root, "checkpoints")).load_latest().meta["iteration"] > 10
