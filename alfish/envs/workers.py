"""Env worker processes (``vectorization='async'``) whose failures are errors within seconds, never hangs.

``EnvWorkers`` is gymnasium's ``AsyncVectorEnv`` (forkserver workers, shared-memory observations) with every wait
bounded and watched (DESIGN.md §3.7):

* a worker that dies (a signal, ``os._exit``, a crash in C code) is an ``EnvWorkerError`` naming the env index, pid
  and signal or exit code, as soon as its pipe or process sentinel says so;
* a Python exception in a worker is an ``EnvWorkerError`` whose first line names the worker and the exception and
  whose following lines are the worker's traceback (an ``EnvContractError`` stays the one line it is);
* a worker that does not reply within ``timeout_s`` (step, reset; start-up: at least ``STARTUP_TIMEOUT_S``, as a new
  worker first imports the trainer's main module) is an ``EnvWorkerError`` with the worker's Python stack, which the
  worker's ``faulthandler`` writes to a file when sent ``SIGUSR1``.

After any of these the workers are terminated (bounded joins, then SIGKILL) and the env can only be closed.
Each worker ignores SIGINT: Ctrl-C is the trainer's to handle (it stops and closes the envs).
"""
from __future__ import annotations

import faulthandler
import functools
import math
import multiprocessing.connection
import os
import queue
import select
import shutil
import signal
import sys
import tempfile
import time
import traceback
import weakref
from typing import Any, Callable, Iterable, Optional, Sequence

import gymnasium as gym
from gymnasium.vector.async_vector_env import AsyncState, _async_worker

from alfish.envs import contract
from alfish.envs.contract import EnvContractError

# How long a worker's stack dump may take to appear, how long terminate() may take before SIGKILL, and how long
# idle workers may take to close their envs before they are terminated.
STACK_DUMP_TIMEOUT_S = 2.0
JOIN_TIMEOUT_S = 2.0
CLOSE_TIMEOUT_S = 5.0
# The least time a worker has to start and make its env: multiprocessing imports the trainer's main module in each new
# worker first (seconds when that imports torch, more on a busy machine).
STARTUP_TIMEOUT_S = 60.0
# How long to wait for a worker's pid to be reaped, or its error report to arrive, once it is known to have failed.
FAILURE_DETAIL_TIMEOUT_S = 2.0
_MAX_STACKS = 3
_ONE_LINE_MARK = "alfish one-line error: "  # starts a worker's diagnostics file that holds one EnvContractError

_diagnostics_file = None  # the worker's faulthandler file, kept open for the worker's lifetime


class EnvWorkerError(RuntimeError):
    """An env worker died, raised, or hung. The first line says which and how; further lines are the worker's own
    traceback or stack."""


def _worker_main(diagnostics_dir: str, index: int, env_fn: Callable[[], gym.Env], *args: Any) -> None:
    """An env worker: gymnasium's worker loop, with ``faulthandler`` writing to ``<diagnostics_dir>/<index>.txt`` on a
    fatal signal or on SIGUSR1 (the parent's "where are you stuck?"); a failure to make the env goes there too.

    The file gets its name only once the SIGUSR1 handler is in place: SIGUSR1's default action ends the process, so
    the parent sends it only to a worker whose file exists."""
    global _diagnostics_file
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    contract.shared_warning_dir = diagnostics_dir  # the batch's workers give each contract warning once
    # (diagnostics_dir is this batch's private mkdtemp folder, not a results directory: plain open/rename are safe)
    path = os.path.join(diagnostics_dir, f"{index}.txt")
    _diagnostics_file = open(path + ".starting", "w")
    faulthandler.enable(file=_diagnostics_file, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=_diagnostics_file, all_threads=True)
    os.rename(path + ".starting", path)
    try:
        _async_worker(index, env_fn, *args)  # exceptions while stepping are sent to the parent by the loop itself
    except BaseException as err:  # noqa: BLE001  (making the env failed: the parent reads why from the file)
        one_line = isinstance(err, EnvContractError)  # e.g. an env id this worker does not know: no traceback needed
        _diagnostics_file.write(f"{_ONE_LINE_MARK}{err}" if one_line else traceback.format_exc())
        _diagnostics_file.flush()
        sys.exit(1)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _first_line(text: str) -> str:
    lines = [line for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


class EnvWorkers(gym.vector.AsyncVectorEnv):
    """``AsyncVectorEnv`` over forkserver workers whose deaths, exceptions and hangs are errors (module docstring).

    env_name: named in the errors.
    timeout_s: the longest a step, reset or the start-up may take (``create_environment.step_timeout_s``).
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], env_name: str, timeout_s: float,
                 **kwargs: Any) -> None:
        self._env_name = env_name
        self._timeout_s = float(timeout_s)
        self._doing = "start-up (making its env)"
        self._failure: Optional[str] = None
        self._diagnostics_dir = tempfile.mkdtemp(prefix="alfish-env-workers-")
        self._remove_diagnostics = weakref.finalize(self, shutil.rmtree, self._diagnostics_dir, True)
        try:
            super().__init__(env_fns, context="forkserver", worker=functools.partial(_worker_main,
                                                                                     self._diagnostics_dir), **kwargs)
        except BaseException:
            self._terminate_workers()
            self._remove_diagnostics()
            self.closed = True
            raise

    # ------------------------------------------------------------------------------------------------ gymnasium hooks
    def reset_async(self, *args: Any, **kwargs: Any) -> None:
        self._doing = "reset()"
        self._send(super().reset_async, *args, **kwargs)

    def reset_wait(self, *args: Any, **kwargs: Any) -> Any:
        return self._receive(super().reset_wait, *args, **kwargs)

    def step_async(self, actions: Any) -> None:
        self._doing = "step()"
        self._send(super().step_async, actions)

    def step_wait(self, *args: Any, **kwargs: Any) -> Any:
        return self._receive(super().step_wait, *args, **kwargs)

    def call_async(self, name: str, *args: Any, **kwargs: Any) -> None:
        self._doing = f"call('{name}')"
        self._send(super().call_async, name, *args, **kwargs)

    def call_wait(self, *args: Any, **kwargs: Any) -> Any:
        return self._receive(super().call_wait, *args, **kwargs)

    def _check_spaces(self) -> None:
        """gymnasium's start-up handshake; each reply is awaited like a step's, so a worker that dies or hangs while
        making its env is an error instead of a blocked ``recv``."""
        pipes = self.parent_pipes
        deadline = time.monotonic() + max(self._timeout_s, STARTUP_TIMEOUT_S)
        self.parent_pipes = [_AwaitedPipe(self, index, pipe, deadline) for index, pipe in enumerate(pipes)]
        try:
            super()._check_spaces()
        finally:
            self.parent_pipes = pipes
        self._doing = "nothing yet"

    def _poll_pipe_envs(self, timeout: Optional[float] = None) -> bool:
        """Waits until every worker has replied (True); a worker that died or did not reply in time raises."""
        self._assert_is_running()
        timeout = self._timeout_s if timeout is None else timeout
        self._await_replies(range(self.num_envs), time.monotonic() + timeout)
        return True

    def _raise_if_errors(self, successes: Iterable[bool]) -> None:
        """The exception a worker raised (gymnasium sends it to the error queue), with the worker's traceback."""
        failed = [index for index, ok in enumerate(successes) if not ok]
        if not failed:
            return
        reports = []
        for _ in failed:
            try:
                reports.append(self.error_queue.get(timeout=FAILURE_DETAIL_TIMEOUT_S))
            except queue.Empty:
                break
        if not reports:
            self._fail(f"{self._worker(failed[0])} failed during {self._doing}, but its error did not arrive")
        index, error_type, error, trace = min(reports, key=lambda report: report[0])
        if isinstance(error, EnvContractError):
            self._fail(str(error), EnvContractError)
        self._fail(f"{self._worker(index)} raised {error_type.__name__}: {_first_line(error)} during {self._doing}; "
                   f"its traceback follows\n{trace.rstrip()}")

    def _assert_is_running(self) -> None:
        if self._failure is not None:
            raise EnvWorkerError(f"the env workers of '{self._env_name}' were stopped after an earlier error: "
                                 f"{_first_line(self._failure)}")
        super()._assert_is_running()

    def close_extras(self, timeout: Optional[float] = None, terminate: bool = False) -> None:
        """Asks idle workers to close their envs (bounded); terminates them when that fails, or when a call is still
        pending or a worker failed. Never waits without a bound."""
        if self._failure is None and not terminate and self._state == AsyncState.DEFAULT:
            try:
                for pipe in self.parent_pipes:
                    pipe.send(("close", None))
                self._doing = "close()"
                deadline = time.monotonic() + (timeout or CLOSE_TIMEOUT_S)
                self._await_replies(range(self.num_envs), deadline, dump_stacks=False)
                for pipe in self.parent_pipes:
                    pipe.recv()  # ready: _await_replies returned only once every pipe had a reply (bounded wait)
                for process in self.processes:  # each exits right after its reply; let it, before terminating any
                    process.join(max(0.0, deadline - time.monotonic()))
            except (OSError, EOFError, EnvWorkerError, EnvContractError):
                pass  # those still running are terminated below
        self._terminate_workers()
        self._remove_diagnostics()

    # ------------------------------------------------------------------------------------------------------ internals
    def _send(self, send: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        try:
            send(*args, **kwargs)
        except OSError:  # a pipe whose worker is gone (killed while idle)
            self._fail_for_dead_worker()
            raise

    def _receive(self, wait: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return wait(*args, **kwargs)
        except (EOFError, OSError):  # a worker died after its pipe was polled ready: its end of the pipe closed
            self._fail_for_dead_worker()
            raise

    def _worker(self, index: int) -> str:
        return f"env worker {index} (pid {self.processes[index].pid}) of '{self._env_name}'"

    def _await_replies(self, indices: Iterable[int], deadline: float, dump_stacks: bool = True) -> None:
        """Returns when each worker in ``indices`` has its reply ready to read. Raises (via ``_fail``) as soon as one
        has died without replying, or when ``deadline`` passes with replies missing (with their stacks)."""
        pending = {self.parent_pipes[i].fileno(): i for i in indices}
        sentinels = {self.processes[i].sentinel: i for i in indices}
        poller = select.poll()  # poll, not select: fd numbers above 1023 are fine
        for fd in (*pending, *sentinels):
            poller.register(fd, select.POLLIN)
        while pending:
            remaining = deadline - time.monotonic()
            events = poller.poll(max(0, math.ceil(remaining * 1000)))
            for fd, _ in events:
                if fd in pending:  # a reply, or end-of-file from a dead worker (its sentinel tells)
                    del pending[fd]
                    poller.unregister(fd)
                elif fd in sentinels:
                    poller.unregister(fd)
                    self._check_exit(sentinels.pop(fd))
            if pending and not events and time.monotonic() >= deadline:
                self._fail_for_hung_workers(sorted(pending.values()), dump_stacks)

    def _check_exit(self, index: int) -> None:
        """A worker's process ended: fine if it exited 0 after sending its reply (gymnasium's worker does after
        reporting an exception); otherwise an error naming its signal or exit code."""
        process = self.processes[index]
        process.join(FAILURE_DETAIL_TIMEOUT_S)
        if process.exitcode != 0:
            self._fail_for_dead_worker([index])

    def _fail_for_dead_worker(self, candidates: Optional[list[int]] = None) -> None:
        """Raises for the first worker (of ``candidates``, default all) that is found dead within a short wait."""
        processes = [self.processes[i] for i in (range(self.num_envs) if candidates is None else candidates)]
        multiprocessing.connection.wait([p.sentinel for p in processes], timeout=FAILURE_DETAIL_TIMEOUT_S)
        for process in processes:
            if process.exitcode is not None:  # (forkserver: known once the sentinel is readable)
                index = self.processes.index(process)
                code = process.exitcode
                how = f"was killed by signal {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
                details = self._read_diagnostics(index, 0)
                if details.startswith(_ONE_LINE_MARK):
                    self._fail(details[len(_ONE_LINE_MARK):], EnvContractError)
                self._fail(f"{self._worker(index)} {how} during {self._doing}"
                           + (f"; its last words follow\n{details}" if details else ""))
        if candidates is not None:
            self._fail(f"{self._worker(candidates[0])} stopped during {self._doing} for an unknown reason")

    def _fail_for_hung_workers(self, indices: list[int], dump_stacks: bool) -> None:
        others = (f" (and env worker{'s' if len(indices) > 2 else ''} {', '.join(map(str, indices[1:]))} too)"
                  if len(indices) > 1 else "")
        message = (f"{self._worker(indices[0])} did not reply to {self._doing} within step_timeout_s="
                   f"{self._timeout_s:g} s: it hung{others}; raise create_environment.step_timeout_s if the env is "
                   "only slow")
        if dump_stacks:
            for index in indices[:_MAX_STACKS]:
                stack = self._dump_stack(index)
                message += f"\n--- the Python stack of env worker {index} (pid {self.processes[index].pid}) ---\n"
                message += stack or "(none came: the worker had not set up faulthandler yet, or did not answer)"
        self._fail(message)

    def _diagnostics_path(self, index: int) -> str:
        return os.path.join(self._diagnostics_dir, f"{index}.txt")

    def _read_diagnostics(self, index: int, start: int) -> str:
        try:
            with open(self._diagnostics_path(index)) as f:
                f.seek(start)
                return f.read().rstrip()
        except OSError:
            return ""

    def _dump_stack(self, index: int) -> str:
        """Sends SIGUSR1 to the worker, whose faulthandler writes its Python stack to its diagnostics file; returns
        that stack once the file stops growing (or what came within STACK_DUMP_TIMEOUT_S)."""
        path = self._diagnostics_path(index)
        try:
            start = os.path.getsize(path)  # no file yet: the worker has not set up faulthandler, SIGUSR1 would kill it
            os.kill(self.processes[index].pid, signal.SIGUSR1)
        except OSError:
            return ""
        deadline, size = time.monotonic() + STACK_DUMP_TIMEOUT_S, start
        while time.monotonic() < deadline:
            time.sleep(0.05)
            new_size = os.path.getsize(path)
            if new_size > start and new_size == size:
                break
            size = new_size
        return self._read_diagnostics(index, start)

    def _fail(self, message: str, error_type: type = EnvWorkerError) -> None:
        """Stops every worker, then raises ``error_type(message)``; later calls say that the env was stopped."""
        self._failure = message
        self._state = AsyncState.DEFAULT
        self._terminate_workers()
        raise error_type(message) from None

    def _terminate_workers(self) -> None:
        """terminate(), a bounded join, then SIGKILL for any worker still alive; closes the pipes."""
        # (a start-up that failed part-way leaves workers that were never started: nothing to stop or join there)
        processes = [p for p in getattr(self, "processes", []) if p.pid is not None]
        for process in processes:
            if process.is_alive():
                process.terminate()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join(JOIN_TIMEOUT_S)
        for pipe in getattr(self, "parent_pipes", []):
            if pipe is not None:
                pipe.close()


class _AwaitedPipe:
    """A parent pipe whose ``recv`` first waits, watched, for its worker's reply (used for the start-up handshake)."""

    def __init__(self, workers: EnvWorkers, index: int, pipe: multiprocessing.connection.Connection,
                 deadline: float) -> None:
        self._workers, self._index, self._pipe, self._deadline = workers, index, pipe, deadline

    def send(self, message: Any) -> None:
        self._pipe.send(message)

    def fileno(self) -> int:
        return self._pipe.fileno()

    def close(self) -> None:
        self._pipe.close()

    def recv(self) -> Any:
        self._workers._await_replies([self._index], self._deadline)  # bounded: fails the batch past the deadline
        try:
            return self._pipe.recv()  # ready once _await_replies returned
        except (EOFError, OSError):
            self._workers._fail_for_dead_worker([self._index])
            raise
