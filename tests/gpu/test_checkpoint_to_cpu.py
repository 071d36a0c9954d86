"""A results directory written by a GPU run is usable on a machine without one: ``alfish.bin.play`` plays it and
``alfish.bin.train`` resumes it with ``DevicePolicy.device='cpu'``, both in processes that see no GPU
(``CUDA_VISIBLE_DEVICES=''``), so every tensor must come back through ``map_location`` and nothing may ask for CUDA.

The run saves its replay buffer (``Trainer.save_replay_buffer``), from host or device storage, and with fp16 its
gradient scaler's state, which the CPU run (bf16 there: fp16 autocast needs CUDA) must accept.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from tests.integration.inprocess import run_trainer_from_text
from tests.integration.test_learning import SAC_POINT_GOAL

from .helpers import REPO, cuda_only, device_bindings

SHORT = """
TrainerConfig.num_env_steps = 300
TrainerConfig.evaluate = False
TrainerConfig.num_checkpoints = 2
Trainer.save_replay_buffer = True
"""
NO_GPU = dict(os.environ, CUDA_VISIBLE_DEVICES="")


def checkpoint_iterations(root: pathlib.Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (root / "checkpoints").glob("ckpt-*"))


def run_without_gpu(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=NO_GPU, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.cli
@pytest.mark.timeout(600)
@pytest.mark.parametrize("precision, storage", [("fp32", "cpu"),
                                                pytest.param("fp16", "device", marks=cuda_only("fp16 autocast"))],
                         ids=["fp32-host-replay", "fp16-device-replay"])
def test_a_gpu_checkpoint_plays_and_resumes_on_the_cpu(tmp_path, precision, storage):
    conf = SAC_POINT_GOAL + device_bindings(precision, replay_storage=storage) + SHORT
    root = run_trainer_from_text(tmp_path, conf)
    trained = checkpoint_iterations(root)
    assert trained, "the GPU run wrote no checkpoint"

    played = run_without_gpu("alfish.bin.play", "--root_dir", str(root), "--num_episodes", "2")
    assert played.returncode == 0, played.stderr[-3000:]
    assert "average return over 2 episodes" in played.stdout, played.stdout

    cpu = ["DevicePolicy.device = 'cpu'", "DevicePolicy.replay_storage = 'cpu'", "TrainerConfig.num_env_steps = 400"]
    if precision == "fp16":
        cpu.append("AmpPolicy.dtype = 'bfloat16'")
    params = [arg for binding in cpu for arg in ("--conf_param", binding)]
    resumed = run_without_gpu("alfish.bin.train", "--conf", str(tmp_path / "run.gin"), "--root_dir", str(root),
                              *params)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {root / 'checkpoints' / f'ckpt-{trained[-1]}'}" in resumed.stderr, resumed.stderr[-3000:]
    assert checkpoint_iterations(root)[-1] > trained[-1]  # it trained on and checkpointed on the CPU
