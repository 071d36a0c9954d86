"""One trial of ``alfish.tools.search`` as a process: ``python -m alfish.bin.train`` in its own session, its
evaluations read from its eval log as they arrive, a clean stop (SIGTERM: the trainer checkpoints and exits), and the
last lines of its log when it fails.

The eval log is read as untrusted data (``alfish.tools.runs.read_eval_log``: bounded, no link followed); a record
whose ``iteration`` is not a count or whose ``average_return`` is not a finite number fails the trial.
"""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from typing import Optional, Sequence

import psutil

from alfish.tools.cli import ToolError
from alfish.tools.runs import read_eval_log

#: Seconds a stopped trial gets to checkpoint and exit before its session is killed: the trainer's own
#: Trainer.stop_grace_s (30 s by default) for the iteration, as much again for the checkpoint, and a margin.
STOP_GRACE_S = 90.0
#: The trial's stderr (the trainer logs there, and tracebacks go there), inside its root_dir.
STDERR_FILE = "search_stderr.txt"
#: How much of the end of STDERR_FILE a failure reports.
ERROR_LINES = 5
_TAIL_BYTES = 16 << 10


def train_command(conf: str, root_dir: str, conf_params: Sequence[str]) -> list[str]:
    """The command that trains one trial."""
    command = [sys.executable, "-m", "alfish.bin.train", "--conf", conf, "--root_dir", root_dir]
    for param in conf_params:
        command += ["--conf_param", param]
    return command


class TrialProcess:
    """``python -m alfish.bin.train`` for one trial, started in a session of its own (so a Ctrl-C on the search
    reaches the search alone, which stops each trial cleanly, and whatever a trial leaves behind can be killed as a
    group)."""

    def __init__(self, command: Sequence[str], root_dir: str, threads: int) -> None:
        os.makedirs(root_dir, exist_ok=True)
        self.root_dir = root_dir
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
        with open(os.path.join(root_dir, STDERR_FILE), "a") as err:
            self.proc = subprocess.Popen(list(command), stdout=subprocess.DEVNULL, stderr=err, env=env,
                                         start_new_session=True)
        self.started = time.time()
        self._stop_deadline: Optional[float] = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def create_time(self) -> float:
        """When the OS started the process (with the pid, it identifies the process to a later search: 0.0 if it is
        already gone)."""
        try:
            return psutil.Process(self.proc.pid).create_time()
        except psutil.Error:
            return 0.0

    def poll(self) -> Optional[int]:
        """The exit status once the process has ended (what it left in its session killed then), else None; a
        process stopped with ``stop`` that outlives ``STOP_GRACE_S`` is killed with its session."""
        code = self.proc.poll()
        if code is None:
            if self._stop_deadline is not None and time.monotonic() > self._stop_deadline:
                _signal_group(self.proc.pid, signal.SIGKILL)
            return None
        _signal_group(self.proc.pid, signal.SIGKILL)  # stragglers (env workers, an async evaluator) of a dead trainer
        return code

    def stop(self) -> None:
        """SIGTERM to the trainer: it ends its iteration, checkpoints and exits with 128 + 15 (``poll`` kills it
        after ``STOP_GRACE_S``)."""
        if self._stop_deadline is None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self._stop_deadline = time.monotonic() + STOP_GRACE_S

    @property
    def stopping(self) -> bool:
        return self._stop_deadline is not None

    def wait(self) -> int:
        """Wait for the exit (after ``stop``, at most ``STOP_GRACE_S``, then the session is killed)."""
        while True:
            code = self.poll()
            if code is not None:
                return code
            time.sleep(0.1)

    def evaluations(self) -> list[tuple[int, float]]:
        """``(iteration, average_return)`` of each evaluation recorded so far, in file order (see the module
        docstring; ToolError for a record that is not one)."""
        return read_evaluations(self.root_dir)

    def error(self, code: int) -> str:
        """What a failure reports: the exit status and the last lines of the trial's stderr, on one line."""
        return failure_text(self.root_dir, code)


def read_evaluations(root_dir: str) -> list[tuple[int, float]]:
    """``(iteration, average_return)`` of each record of ``root_dir/eval_log.jsonl`` (none yet: empty)."""
    path = os.path.join(root_dir, "eval_log.jsonl")

    def point(record: dict, number: int) -> tuple[int, float]:
        iteration, value = record.get("iteration"), record.get("average_return")
        if not isinstance(iteration, int) or isinstance(iteration, bool) or iteration < 0:
            raise ToolError(f"{path}: record {number} has no iteration count (got {iteration!r})")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise ToolError(f"{path}: record {number}'s average_return is not a finite number (got {value!r})")
        return iteration, float(value)

    if not os.path.isdir(root_dir):
        return []
    return read_eval_log(root_dir, point, missing_ok=True)


def failure_text(root_dir: str, code: int) -> str:
    """``exit 2: <last lines of the trial's stderr, joined with ' | '>`` (bounded: the file's last 16 KB)."""
    status = f"stopped by signal {-code}" if code < 0 else f"exit {code}"
    try:
        with open(os.path.join(root_dir, STDERR_FILE), "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - _TAIL_BYTES))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        text = ""
    lines = [line.strip() for line in text.splitlines() if line.strip()][-ERROR_LINES:]
    return f"{status}: {' | '.join(lines) or '(no output)'}"


def stop_leftover(pid: int, create_time: float, root_dir: str) -> bool:
    """Stop the trainer of ``root_dir`` that a killed search left running (pid ``pid``, started at ``create_time``;
    a pid reused by another process is left alone): SIGTERM, then its session killed after ``STOP_GRACE_S``. True if
    it was still there."""
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - create_time) > 0.01 or root_dir not in proc.cmdline():
            return False
        proc.terminate()
        proc.wait(STOP_GRACE_S)
    except psutil.TimeoutExpired:
        pass
    except psutil.Error:
        return False
    _signal_group(pid, signal.SIGKILL)
    return True


def _signal_group(pgid: int, sig: int) -> None:
    """``sig`` to the process group ``pgid`` (a trial's session) if any process is left in it."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
