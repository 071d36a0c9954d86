"""Data-parallel training on CUDA under torchrun (``python -m pytest -m cuda tests``); each test skips, saying why,
when the GPUs it needs are not visible. ``ALFISH_TEST_DEVICE=cpu`` runs the gloo layouts on the CPU (the bodies'
own check without a GPU).

Layouts: two ranks on two GPUs over NCCL (gloo for the CPU control traffic, in the same process group); two ranks
sharing one GPU over gloo (``init_distributed.backend = 'gloo'``, CUDA tensors); a 1-rank torchrun job. What is
checked: the gradients of one DDP update equal one process's on the concatenated batch; ranks hold identical
parameters after several updates and after a whole training run; normalizer statistics merge identically; NCCL with
two ranks on one GPU is a one-line error naming the fix.
"""
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from alfish.data import nest
from tests.trainer.ddp_batches import build_algorithm_and_batch, normalizer_batches

from .helpers import DEVICE, ON_CUDA

REPO = pathlib.Path(__file__).resolve().parents[2]
WORKER = str(REPO / "tests" / "trainer" / "ddp_worker.py")
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
DEVICE_NAME = "cuda" if ON_CUDA else str(DEVICE)  # 'cuda': each rank its local rank's GPU (of those visible)
REFERENCE_DEVICE = torch.device("cuda", 0) if ON_CUDA else DEVICE

pytestmark = [pytest.mark.cuda, pytest.mark.distributed, pytest.mark.timeout(300)]


def needs_gpus(n: int, on_cpu_too: bool = False) -> pytest.MarkDecorator:
    """Skip unless ``n`` GPUs are visible; ``on_cpu_too``: the layout also runs (on the CPU) with
    ALFISH_TEST_DEVICE=cpu."""
    if not ON_CUDA:
        return pytest.mark.skipif(not on_cpu_too, reason=f"needs {n} CUDA GPU(s); these tests run on {DEVICE} "
                                                         "(ALFISH_TEST_DEVICE)")
    return pytest.mark.skipif(GPUS < n, reason=f"needs {n} CUDA GPU(s); {GPUS} visible "
                                               f"(torch {torch.__version__}, CUDA build: {torch.version.cuda})")


def first_gpu() -> str:
    """The first visible GPU, as CUDA_VISIBLE_DEVICES names it."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return visible.split(",")[0] if visible else "0"


# (backend, visible GPUs for the job): NCCL with one GPU per rank; gloo with both ranks on the same GPU.
LAYOUTS = [pytest.param("nccl", None, marks=needs_gpus(2), id="nccl-two-gpus"),
           pytest.param("gloo", "first", marks=needs_gpus(1, on_cpu_too=True), id="gloo-one-shared-gpu")]


def torchrun(args: list[str], visible: str | None = None, nproc: int = 2,
             timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if visible == "first" and ON_CUDA:
        env["CUDA_VISIBLE_DEVICES"] = first_gpu()  # both ranks resolve 'cuda' to this one GPU
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] + args
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def check_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"


@pytest.mark.parametrize("backend, visible", LAYOUTS)
@pytest.mark.parametrize("algo", ["dqn", "ddpg"])
def test_one_cuda_ddp_update_gives_the_gradients_of_one_process_on_the_concatenated_batch(tmp_path, algo, backend,
                                                                                         visible):
    check_ok(torchrun([WORKER, "grads", str(tmp_path), algo, DEVICE_NAME, backend], visible))
    algorithm, batch = build_algorithm_and_batch(algo)
    device = REFERENCE_DEVICE
    algorithm.to(device)
    batch = nest.map_nest(lambda x: x.to(device), batch)
    algorithm.calc_loss(batch, algorithm.train_step(batch).info).loss.mean().backward()
    expected = {n: p.grad.cpu() for n, p in algorithm.named_parameters() if p.grad is not None}
    assert expected
    for rank in (0, 1):
        got = torch.load(tmp_path / f"grads-rank{rank}.pt", weights_only=True)
        assert set(got) == set(expected)
        for name, grad in expected.items():
            # float32 sums in another order (and possibly other GPU kernels): equal to rounding
            torch.testing.assert_close(got[name], grad, atol=1e-5, rtol=1e-4, msg=f"rank {rank}: {name}")


@pytest.mark.parametrize("backend, visible", LAYOUTS)
def test_ranks_on_cuda_keep_identical_parameters_over_updates_on_different_batches(tmp_path, backend, visible):
    check_ok(torchrun([WORKER, "updates", str(tmp_path), "ddpg", DEVICE_NAME, backend], visible))
    params = [torch.load(tmp_path / f"params-rank{r}.pt", weights_only=True) for r in (0, 1)]
    initial, _ = build_algorithm_and_batch("ddpg")
    assert params[0].keys() == params[1].keys() == dict(initial.named_parameters()).keys()
    for name in params[0]:
        assert torch.equal(params[0][name], params[1][name]), name
    assert any(not torch.equal(params[0][n], v.detach()) for n, v in initial.named_parameters())  # it trained


@pytest.mark.parametrize("backend, visible", LAYOUTS)
def test_normalizer_statistics_on_cuda_merge_to_the_same_numbers_on_every_rank(tmp_path, backend, visible):
    from alfish.transforms import RunningMeanStd

    check_ok(torchrun([WORKER, "normalizer", str(tmp_path), DEVICE_NAME, backend], visible))
    got = [torch.load(tmp_path / f"stats-rank{r}.pt", weights_only=True) for r in (0, 1)]
    reference = RunningMeanStd((3,))
    for merge_round in range(2):
        for rank in (0, 1):
            for obs, _ in normalizer_batches(rank, merge_round):
                reference.update(obs)
        merged = [got[r][merge_round]["merged"] for r in (0, 1)]
        for key in merged[0]:
            assert torch.equal(merged[0][key], merged[1][key]), key
        for name in ("count", "mean", "m2"):
            torch.testing.assert_close(merged[0][f"transformers.0.stats.{name}"], getattr(reference, name),
                                       rtol=1e-12, atol=1e-9)
        assert torch.equal(got[0][merge_round]["probe"], got[1][merge_round]["probe"])


@needs_gpus(1)
def test_nccl_with_two_ranks_on_one_gpu_is_a_one_line_error_naming_gloo(tmp_path):
    proc = torchrun([WORKER, "grads", str(tmp_path), "dqn", "cuda:0", "nccl"])
    assert proc.returncode != 0
    assert "both train on cuda:0 of host" in proc.stderr, proc.stderr[-3000:]
    assert "NCCL needs one GPU per rank" in proc.stderr and "init_distributed.backend = 'gloo'" in proc.stderr


@pytest.mark.parametrize("backend, visible", LAYOUTS)
@pytest.mark.parametrize("conf", ["sac_pendulum.gin", "ppo_cartpole_normalized.gin"])
def test_a_whole_cuda_training_run_ends_with_identical_parameters_on_both_ranks(tmp_path, conf, backend, visible):
    bindings = [f"DevicePolicy.device = '{DEVICE_NAME}'", f"init_distributed.backend = '{backend}'",
                "TrainerConfig.num_iterations = 4", "TrainerConfig.ddp_paras_check_interval = 1",
                "Trainer.num_threads = 1"]
    check_ok(torchrun([WORKER, "train", str(tmp_path), str(REPO / "confs" / conf), str(tmp_path / "root")]
                      + bindings, visible))
    params = [torch.load(tmp_path / f"params-rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert params[0].keys() == params[1].keys()
    for name in params[0]:
        assert torch.equal(params[0][name], params[1][name]), name


@needs_gpus(1, on_cpu_too=True)
def test_a_one_rank_torchrun_job_trains_on_cuda(tmp_path):
    proc = torchrun(["-m", "alfish.bin.train", "--conf", str(REPO / "confs" / "sac_pendulum.gin"), "--root_dir",
                     str(tmp_path / "root"), "--conf_param", f"DevicePolicy.device='{DEVICE_NAME}'", "--conf_param",
                     "TrainerConfig.num_iterations=3"], nproc=1)
    check_ok(proc)
    assert "training finished: 3 iterations" in proc.stderr
