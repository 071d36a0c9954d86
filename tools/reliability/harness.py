"""What the battery's scenarios share: tiny confs, real ``alfish.bin.train`` / ``play`` / ``torchrun`` subprocesses in
their own process group (so a scenario can always take the whole tree down), waits that all have a timeout, and the
table row each scenario returns."""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Callable, Optional

import psutil

REPO = pathlib.Path(__file__).resolve().parents[2]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]

# A2C on the 2-env discrete toy chain: ~3-6 s to start, a checkpoint after each of 3 iterations.
A2C_CHAIN = """
create_environment.env_name = 'alfish/Chain-v0'
create_environment.num_parallel_environments = 2
A2cAlgorithm.hidden_sizes = (8,)
TrainerConfig.algorithm_ctor = @A2cAlgorithm
Trainer.num_threads = 1
TrainerConfig.random_seed = 0
TrainerConfig.num_iterations = 3
TrainerConfig.unroll_length = 4
TrainerConfig.evaluate = False
TrainerConfig.num_checkpoints = 3
TrainerConfig.summary_interval = 1
"""
# The same on a slowed-down chain (10 ms per step): a run that lasts until the battery stops it.
A2C_SLOW = A2C_CHAIN.replace("'alfish/Chain-v0'", "'alfish/Latency-v0'") + """
create_environment.env_kwargs = {'env_name': 'alfish/Chain-v0', 'latency_s': 0.01}
TrainerConfig.num_iterations = 100000
TrainerConfig.num_checkpoints = 0
TrainerConfig.summary_interval = 50
"""
# A slow SAC on the continuous toy (the async unroll and the 2-rank jobs need an off-policy algorithm).
SAC_SLOW = """
create_environment.env_name = 'alfish/Latency-v0'
create_environment.env_kwargs = {'env_name': 'alfish/PointGoal-v0', 'latency_s': 0.01}
create_environment.num_parallel_environments = 1
SacAlgorithm.hidden_sizes = (16,)
TrainerConfig.algorithm_ctor = @SacAlgorithm
Trainer.num_threads = 1
TrainerConfig.random_seed = 1
TrainerConfig.num_iterations = 100000
TrainerConfig.unroll_length = 1
TrainerConfig.initial_collect_steps = 20
TrainerConfig.whole_replay_buffer_training = False
TrainerConfig.replay_buffer_length = 1000
TrainerConfig.mini_batch_size = 8
TrainerConfig.mini_batch_length = 2
TrainerConfig.summary_interval = 50
TrainerConfig.evaluate = False
TrainerConfig.num_checkpoints = 1
"""


@dataclasses.dataclass
class Row:
    """One line of the table: PASS when ``ok``; ``figure`` is the measured result in words."""
    scenario: str
    trials: int
    ok: Optional[bool]  # None: skipped
    figure: str
    details: str = ""  # a scenario's own table (one line per case), printed after the battery's table

    @property
    def result(self) -> str:
        return "skipped" if self.ok is None else ("PASS" if self.ok else "FAIL")


class Proc:
    """A subprocess in its own session; stdout+stderr go to a file so a long run never blocks on a full pipe."""

    def __init__(self, args: list[str], log: pathlib.Path, cwd: pathlib.Path = REPO) -> None:
        self.log = log
        self._out = open(log, "w")
        self.popen = subprocess.Popen(args, cwd=cwd, env=ENV, stdout=self._out, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        self.pid = self.popen.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout_s: float) -> Optional[int]:
        """The exit status, or None if it is still running after ``timeout_s``."""
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return []

    def kill_group(self) -> None:
        """SIGKILL every process of the session (stopped ones too: SIGKILL ends them) and reap the leader."""
        pids = [p.pid for p in self.descendants()]
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in pids:  # children that left the group (torchrun's workers start their own)
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.wait(10)
        self._out.close()


def train(conf: pathlib.Path, root: pathlib.Path, log: pathlib.Path, *extra: str) -> Proc:
    return Proc([sys.executable, "-m", "alfish.bin.train", "--conf", str(conf), "--root_dir", str(root), *extra], log)


def run(args: list[str], timeout_s: float = 120, cwd: pathlib.Path = REPO) -> subprocess.CompletedProcess:
    """A subprocess run to its end (killed with its group after ``timeout_s``)."""
    proc = subprocess.Popen(args, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n[battery: killed after {timeout_s} s]"
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def train_to_end(conf: pathlib.Path, root: pathlib.Path, *extra: str, timeout_s: float = 120
                 ) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "alfish.bin.train", "--conf", str(conf), "--root_dir", str(root), *extra],
               timeout_s)


def wait_for(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return predicate()


def problem_lines(stderr: str) -> list[str]:
    """stderr without INFO progress lines and blank lines: what a user reads about a failure."""
    return [line for line in stderr.splitlines() if line.strip() and line.split(" ", 2)[1:2] != ["INFO"]]


def reseal(ckpt_dir: pathlib.Path, name: str) -> None:
    """Recompute ``name``'s entry in the checkpoint's manifest, as someone who controls the directory would."""
    import hashlib

    manifest_path = ckpt_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    data = (ckpt_dir / name).read_bytes()
    manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    manifest_path.write_text(json.dumps(manifest))


def tree_rss_fds(pid: int) -> tuple[int, int]:
    """Summed RSS (bytes) and open fds of ``pid`` and its descendants."""
    rss = fds = 0
    try:
        procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return 0, 0
    for p in procs:
        try:
            rss += p.memory_info().rss
            fds += p.num_fds()
        except psutil.Error:
            pass
    return rss, fds


def shm_bytes() -> int:
    total = 0
    if os.path.isdir("/dev/shm"):
        for entry in os.scandir("/dev/shm"):
            try:
                total += entry.stat(follow_symlinks=False).st_blocks * 512
            except OSError:
                pass
    return total
