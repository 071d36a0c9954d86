"""The shipped confs under ``torchrun --nproc_per_node=2`` (CPU, gloo), unchanged but for the number of iterations:
they train and record the world size in their checkpoints; such a checkpoint is refused by a job of another size; a
rank that fails puts alfish's one-line error under torchrun's "Root Cause"."""
import json
import os
import pathlib
import subprocess
import sys
import types

import gin
import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from alfish.bin import train
from alfish.learn.distributed import failed_because_a_peer_did
from tests.shipped_confs import data_params, skip_unless_installed

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFS = sorted(p.name for p in (REPO / "confs").glob("*.gin"))
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
ITERATIONS = 3


def train_command(conf: str, root: pathlib.Path, *params: str, launcher=tuple(TORCHRUN)) -> list[str]:
    cmd = list(launcher) + ["-m", "alfish.bin.train", "--conf", str(REPO / "confs" / conf), "--root_dir", str(root)]
    for param in (f"TrainerConfig.num_iterations={ITERATIONS}",) + params:
        cmd += ["--conf_param", param]
    return cmd


def run(cmd: list[str], timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)


def check_trains_on_two_ranks(conf: str, root: pathlib.Path) -> None:
    proc = run(train_command(conf, root, *data_params(conf, root.parent / "data")))
    assert proc.returncode == 0, f"{conf}: exit {proc.returncode}\n{proc.stderr[-4000:]}"
    for rank in (0, 1):
        assert f"[rank {rank}] INFO training finished: {ITERATIONS} iterations" in proc.stderr, proc.stderr[-3000:]
    newest = sorted((root / "checkpoints").glob("ckpt-*"), key=lambda p: int(p.name.split("-")[1]))[-1]
    assert json.loads((newest / "meta.json").read_text())["world_size"] == 2


@pytest.mark.slow  # 15 s; the PPO conf on two ranks stays in the default run
@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_sac_conf_runs_unchanged_on_two_ranks_and_its_checkpoint_refuses_one_process(tmp_path):
    check_trains_on_two_ranks("sac_pendulum.gin", tmp_path / "root")
    proc = run(train_command("sac_pendulum.gin", tmp_path / "root", launcher=(sys.executable,)), timeout=60)
    assert proc.returncode == 2
    assert ("was written by a 2-rank job and this job has 1; resume it with 2 ranks (e.g. torchrun "
            "--nproc_per_node=2) (replay buffers and env seeds are per rank)") in proc.stderr, proc.stderr[-2000:]


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_ppo_conf_runs_unchanged_on_two_ranks(tmp_path):
    check_trains_on_two_ranks("ppo_cartpole.gin", tmp_path / "root")


IN_CI = ("sac_pendulum.gin", "ppo_cartpole.gin")  # run by the two tests above


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_every_rank_has_its_own_unroll_processes(tmp_path):
    proc = run(train_command("ppo_cartpole.gin", tmp_path / "root", "TrainerConfig.async_unroll=True",
                             "PpoAlgorithm.off_policy_correction='vtrace'", "Trainer.num_unroll_processes=2",
                             "TrainerConfig.unroll_parameter_update_period=1", "TrainerConfig.evaluate=False"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    for rank in (0, 1):
        assert f"[rank {rank}] INFO training finished: {ITERATIONS} iterations" in proc.stderr, proc.stderr[-3000:]
        for envs in ("0..3", "4..7"):  # each rank's 8 envs (the conf's), stepped by two children of its own
            assert f"[rank {rank}] INFO async unroll: child process" in proc.stderr
            assert proc.stderr.count(f"started (envs {envs})") == 2, proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(180)
@pytest.mark.parametrize("conf", [c for c in CONFS if c not in IN_CI])
def test_every_other_shipped_conf_runs_unchanged_on_two_ranks(tmp_path, conf):
    skip_unless_installed(conf)
    check_trains_on_two_ranks(conf, tmp_path / "root")


def root_cause_section(stderr: str) -> str:
    assert "Root Cause (first observed failure):" in stderr, stderr[-3000:]
    return stderr.split("Root Cause (first observed failure):")[1]


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_a_failing_rank_puts_alfishs_one_line_error_under_root_cause(tmp_path):
    # Rank 0 alone builds the evaluation envs: it fails, rank 1 is stopped by torchrun.
    proc = run(train_command("sac_pendulum.gin", tmp_path / "root", "eval/create_environment.env_name='NoSuchEnv-v0'"))
    assert proc.returncode != 0
    cause = root_cause_section(proc.stderr)
    assert "rank      : 0 (local_rank: 0)" in cause, cause
    assert ("traceback : could not build the experiment: cannot make gymnasium env 'NoSuchEnv-v0'"
            in cause), cause


def test_an_error_during_training_is_written_for_torchrun_as_one_line(tmp_path, monkeypatch):
    class FailingTrainer:
        def run(self):
            raise RuntimeError("the simulator went away;\n   restart it")

    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setattr("alfish.trainer.build.build_trainer", lambda config, **kwargs: FailingTrainer())
    monkeypatch.setattr(train, "setup_logging", lambda root_dir: None)
    try:
        with pytest.raises(RuntimeError, match="the simulator went away"):  # still raised: the traceback is printed
            train.main(["--conf", str(REPO / "confs" / "sac_pendulum.gin"), "--root_dir", str(tmp_path / "root")])
    finally:
        gin.clear_config()
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(error_file))  # as torchrun reads it
    expected = "RuntimeError: the simulator went away; restart it"
    assert failure.message["message"] == expected
    assert failure.message["extraInfo"]["py_callstack"] == expected
    assert failure.timestamp > 0


GLOO_PEER_GONE = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
                              "closed by peer [127.0.0.1]:48348. This is typically caused by a remote worker crashing.")


def test_a_rank_failing_because_its_peer_went_away_is_not_named_the_root_cause_within_the_same_second(
        tmp_path, monkeypatch):
    # The cause (rank 0's build error) and its consequence (rank 1's collective, the peer gone) within one second,
    # rank 1 noticed exiting first: torchrun compares whole-second timestamps and then takes the first noticed.
    monkeypatch.setattr(train, "time", types.SimpleNamespace(time=lambda: 1_000_000.25))
    files = {rank: tmp_path / f"error-{rank}.json" for rank in (0, 1)}
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(files[0]))
    train.record_error_for_torchrun("could not build the experiment: cannot make gymnasium env 'NoSuchEnv-v0'")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(files[1]))
    train.record_error_for_torchrun(f"RuntimeError: {GLOO_PEER_GONE}",
                                    consequence=failed_because_a_peer_did(GLOO_PEER_GONE))
    failures = {1: ProcessFailure(local_rank=1, pid=2, exitcode=-6, error_file=str(files[1])),
                0: ProcessFailure(local_rank=0, pid=1, exitcode=2, error_file=str(files[0]))}
    rank, failure = ChildFailedError("train", failures).get_first_failure()
    assert rank == 0 and failure.message["message"].startswith("could not build the experiment"), failure.message
    assert (failures[0].timestamp, failures[1].timestamp) == (1_000_000, 1_000_001)


def test_only_a_collective_whose_peer_went_away_counts_as_a_consequence():
    assert failed_because_a_peer_did(GLOO_PEER_GONE)
    try:  # found through the exception chain too (alfish's own error raised from the collective's)
        raise ValueError("could not build the experiment") from GLOO_PEER_GONE
    except ValueError as err:
        assert failed_because_a_peer_did(err)
    assert failed_because_a_peer_did(RuntimeError("NCCL error: remote process exited or there was a network error"))
    assert not failed_because_a_peer_did(RuntimeError("cannot make gymnasium env 'NoSuchEnv-v0'"))
    assert not failed_because_a_peer_did(TimeoutError("Timed out waiting 10000ms for recv operation to complete"))


def test_outside_torchrun_no_error_file_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    train.record_error_for_torchrun("error: something")
    assert list(tmp_path.iterdir()) == []
