"""Asynchronous evaluation (``TrainerConfig.async_eval=True``): the evaluation envs and a copy of the policy live in
a child process, which evaluates the parameters the trainer sends at each due evaluation while training goes on
(DESIGN.md §3.7: the child gets a picklable spec; every wait has a timeout and checks the peer).

Trainer (``AsyncEvaluator``)                          Child (``eval_child.eval_child_main``, started with ``spawn``)
  __init__: spawn, wait until it is ready         <-  builds the eval envs and the policy copy, sets ``ready``
            (a failure there is a build error)
  record(): (after the previous result) parameters ->  evaluates the new version with ``Evaluator.evaluate``
            and the request as a new version
  watcher thread: records each result as it        <-  (version, EvalResult, seconds); a heartbeat counts env steps
            arrives; checks the child every 0.2 s
  wait(): until every request is recorded
  close(): stop flag, join with timeout, kill          exits on the stop flag, or when the trainer is gone

A result is recorded exactly as a synchronous one (``write_evaluation``), against the iteration and env steps whose
parameters it evaluated, with ``"asynchronous": true`` in its ``eval_log.jsonl`` line.

Overlap: at most one evaluation is outstanding. An evaluation falling due while the previous one still runs waits
for it (bounded, as every wait here) before its parameters are sent: every due evaluation is recorded, as with
synchronous evaluation, and training waits only when an evaluation takes longer than ``eval_interval`` iterations
of training (the end of the run logs how long it waited in all; a larger ``eval_interval`` or fewer
``num_eval_episodes`` avoid it). ``wait`` (the end of a run) waits for the final evaluation.

Failures: building the eval envs or the policy copy fails in the constructor, with the child's exception (as the
synchronous evaluator would when building its envs: a bad ``eval/create_environment`` binding is a build error).
Later, an exception in the child (with its traceback), the child's death (with its signal) or a hang (a request
outstanding and no env step for ``stall_timeout_s``) is noticed by the watcher thread within ``POLL_S``, logged at
once, and raised as ``AsyncEvalError`` in the training thread by ``check``, which the Trainer calls after every
iteration (or by the next ``record`` or ``wait``).

The child (and multiprocessing's resource tracker, if this starts it) gets the trainer's environment minus torchrun's
rank variables (``RANK``, ``LOCAL_RANK``, ...): it is not a rank of the job, and tools that find a job's ranks by
them must not take it for one.
"""
from __future__ import annotations

import atexit
import dataclasses
import logging
import multiprocessing as mp
import queue
import signal
import threading
import time
from typing import Any, Optional

from alfish.algorithms.base import Algorithm
from alfish.collect.child_process import (
    ChildChannels,
    ChildProcessFailed,
    gin_constants,
    reap_child,
    spawn_child,
    wake_child,
    without_rank_variables,
)
from alfish.collect.shared_params import POLL_S, ParamBlock
from alfish.evaluate.eval_child import EvalShared, EvalSpec, eval_child_main, eval_state
from alfish.evaluate.evaluator import EvalResult, Evaluation, RecordedAt, policy_snapshot, write_evaluation
from alfish.transforms.base import DataTransformer

__all__ = ["AsyncEvalError", "AsyncEvaluator", "EvalSpec", "gin_constants"]


class AsyncEvalError(ChildProcessFailed):
    """The async evaluator child failed, died or hung. (A ``ChildProcessFailed``, as ``AsyncUnrollError``: the command
    line reports every child failure by its message alone.)"""


@dataclasses.dataclass
class _Request:
    iteration: int
    env_steps: int
    elapsed_s: float
    summaries: Any
    root_dir: str
    snapshot: Optional[dict[str, Any]] = None  # the evaluated parameters (keep_snapshots)
    index: int = 0  # the evaluation's k (its envs reset with reseed(seed, k))
    eval_state: Optional[dict[str, Any]] = None  # what the child evaluates (CPU copies): kept for a checkpoint


class AsyncEvaluator:
    """The Trainer's evaluator part (``EvaluatorPart``) for ``async_eval=True``.

    transformer: the trainer's data transformers (their statistics are sent with the parameters).
    stall_timeout_s: an evaluation that takes no env step for this long is a hang (``build.py`` passes the eval
        env's ``create_environment.step_timeout_s``). startup_timeout_s: how long building the eval envs and the policy
        copy in the child may take.
    """

    def __init__(self, spec: EvalSpec, transformer: DataTransformer, stall_timeout_s: float = 60.0,
                 startup_timeout_s: float = 300.0):
        self._ctx = mp.get_context("spawn")  # a fresh interpreter: no inherited threads, locks or signal handlers
        with without_rank_variables():  # (the first lock may start multiprocessing's resource tracker process)
            self.shared = EvalShared(self._ctx)
            self._results = self._ctx.Queue()  # at most one item per request
            self._errors = self._ctx.Queue()
            self._commands = self._ctx.Queue()  # trainer -> child: the block's name, then a wake-up per request
        # A flag, not an Event (child_process.py); nothing here blocks on a lock the child could die holding, except
        # the parameter lock, whose waits poll the child.
        self._stop = self._ctx.RawValue("b", 0)
        channels = ChildChannels(results=self._results, errors=self._errors, commands=self._commands, stop=self._stop)
        self.transformer = transformer
        self.uncertainty = spec.uncertainty
        self.stall_timeout_s = stall_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.num_evaluations = 0
        self.keep_snapshots = False  # set by the trainer when a callback needs the evaluated parameters
        self._completed: list[Evaluation] = []  # recorded by the watcher, handed to the training thread
        self.waits, self.waited_s = 0, 0.0  # how often, and how long, training waited for a running evaluation
        self.block: Optional[ParamBlock] = None
        self._pending: dict[int, _Request] = {}  # version -> request, until recorded (at most one)
        self._cond = threading.Condition()
        self._failure: Optional[BaseException] = None
        self._closing = False
        self.process: Optional[mp.process.BaseProcess] = spawn_child(
            self._ctx, eval_child_main, "alfish-async-eval", (spec, self.shared, channels), self.close)
        self.pid = self.process.pid
        self._watcher = threading.Thread(target=self._watch, name="alfish-async-eval-watcher", daemon=True)
        try:
            self._wait_until_ready()
        except BaseException:
            self.close()
            raise
        self._beat_at, self._beat = time.monotonic(), 0
        self._watcher.start()

    def _wait_until_ready(self) -> None:
        """Until the child built its envs and policy copy (polling it every ``POLL_S``); raises the child's own
        exception if building failed there."""
        start = time.monotonic()
        while not self.shared.ready.value:
            try:
                phase, error, child_traceback = self._errors.get(timeout=POLL_S)
            except queue.Empty:
                if not self.process.is_alive():
                    self.check_child()
                if time.monotonic() - start > self.startup_timeout_s:
                    raise AsyncEvalError(f"the async evaluator child (pid {self.pid}) did not build its evaluation "
                                         f"envs within {self.startup_timeout_s:.0f} s; is creating the environment "
                                         "hung?") from None
                continue
            if phase == "startup" and error is not None:
                error.add_note(f"(raised in the async evaluator child, pid {self.pid}, building its evaluation envs "
                               f"and policy copy:\n{child_traceback})")
                raise error
            raise AsyncEvalError(f"the async evaluator child (pid {self.pid}) failed:\n{child_traceback}")
        logging.info("async eval: child process %d ready (%.1f s)", self.pid, time.monotonic() - start)

    # --- the Trainer's part -----------------------------------------------------------------------------------------
    def record(self, algorithm: Algorithm, summaries: Any, root_dir: str, counters: Any) -> None:
        """Send a copy of the current parameters (and transformer statistics) to the child and return; the result is
        recorded against ``counters``' iteration and env steps when it arrives."""
        state = eval_state(algorithm, self.transformer, self.uncertainty)
        index = self.num_evaluations
        self.num_evaluations += 1
        request = _Request(counters.iteration, counters.env_steps, counters.elapsed_s(), summaries, root_dir,
                           policy_snapshot(algorithm, self.transformer) if self.keep_snapshots else None, index,
                           {k: v.detach().to("cpu", copy=True) for k, v in state.items()})
        self._submit(state, request)

    def stop_recording(self) -> None:
        """Record no more results (a stop: the checkpoint about to be written keeps what is pending, to be re-run
        after the resume, so a result arriving now must not be recorded twice). Waits for a record being written."""
        with self._cond:
            self._closing = True
        if self._watcher.is_alive():
            self._watcher.join(timeout=2 * POLL_S + 5.0)

    def pending(self) -> list[dict]:
        """The evaluations sent and not yet recorded, for a checkpoint (``resubmit`` re-runs them after a resume):
        their counters, index and evaluated state (tensors)."""
        with self._cond:
            return [dict(iteration=r.iteration, env_steps=r.env_steps, elapsed_s=r.elapsed_s, index=r.index,
                         state=r.eval_state, snapshot=r.snapshot) for r in self._pending.values()]

    def resubmit(self, pending: list[dict], summaries: Any, root_dir: str) -> None:
        """Evaluate again what ``pending`` (from a checkpoint) describes: the evaluations a stop interrupted, on the
        parameters they were sent with, recorded against their own iteration and env steps."""
        for item in pending:
            logging.info("re-running the asynchronous evaluation of iteration %d that the stop interrupted",
                         item["iteration"])
            request = _Request(int(item["iteration"]), int(item["env_steps"]), float(item["elapsed_s"]), summaries,
                               root_dir, item.get("snapshot"), int(item["index"]), item["state"])
            self._submit(item["state"], request)

    def _submit(self, state: dict[str, Any], request: _Request) -> None:
        self._wait_for_results(busy=True)
        if self.block is None:
            self.block = ParamBlock(self.shared, state)
            self._commands.put(("block", self.block.name))
        with self._cond:  # registered before its result can be looked up
            version = self.block.write(state, (request.iteration, request.env_steps, request.elapsed_s,
                                               request.index),
                                       keep_waiting=self._child_alive)
            if not self._pending:
                self._beat_at = time.monotonic()  # the hang clock runs while a request is outstanding
            self._pending[version] = request
        self._commands.put(("evaluate", version))  # (never blocks: the queue is unbounded, one item per request)

    def check(self) -> None:
        """Raise the failure the watcher found (the child's exception, death or hang), if any; never waits."""
        self._raise_failure()

    def completed(self) -> list[Evaluation]:
        with self._cond:
            done, self._completed = self._completed, []
        return done

    def wait(self) -> None:
        """Return once every request is recorded (the end of a run)."""
        with self._cond:
            if self._pending and self._failure is None:
                logging.info("waiting for the asynchronous evaluation of iteration %d",
                             max(r.iteration for r in self._pending.values()))
        self._wait_for_results(busy=False)
        if self.waits:
            logging.info("async eval: training waited %.1f s in all (%d times) for an evaluation still running when "
                         "the next fell due", self.waited_s, self.waits)

    def _wait_for_results(self, busy: bool) -> None:
        """Until no request is outstanding; bounded: the watcher fails a dead child within ``POLL_S``, a hung one
        within ``stall_timeout_s``. ``busy``: count the wait (training waited for an evaluation)."""
        start = time.monotonic()
        with self._cond:
            waited = bool(self._pending)
            while self._pending and self._failure is None:
                if not self._watcher.is_alive():
                    self._failure = AsyncEvalError(f"the async evaluator's watcher thread ended with evaluations "
                                                   f"outstanding (child pid {self.pid})")
                    break
                self._cond.wait(POLL_S)
        self._raise_failure()
        if busy and waited:
            self.waits += 1
            self.waited_s += time.monotonic() - start

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the watcher, then the child (flag, then terminate, then kill; each step waits at most
        ``timeout_s / 2``). Requests not yet recorded are dropped. Never raises."""
        if self.process is None:
            return
        atexit.unregister(self.close)
        with self._cond:
            self._closing = True
        if self._watcher.is_alive():  # it polls every POLL_S; it must not write once the summaries are closed
            self._watcher.join(timeout=timeout_s / 2)
        self._stop.value = 1
        wake_child(self.process)  # a stopped child would see the flag only after every timeout
        self.process.join(timeout=timeout_s / 2)
        reap_child(self.process, (self._results, self._errors, self._commands), timeout_s)
        self.process = None
        if self.block is not None:
            self.block.close(unlink=True)
            self.block = None

    # --- the watcher thread -------------------------------------------------------------------------------------------
    def _watch(self) -> None:
        """Record results as they arrive; between them, check the child. A failure is kept for the training thread."""
        while True:
            with self._cond:
                if self._closing:
                    return
            try:
                try:
                    item = self._results.get(timeout=POLL_S)
                except queue.Empty:
                    self.check_child()
                    continue
                self._record(*item)
            except BaseException as err:  # noqa: BLE001  (raised in the training thread by the next record or wait)
                with self._cond:
                    closing = self._closing
                    self._failure = err
                    self._cond.notify_all()
                if not closing:
                    logging.error("asynchronous evaluation failed (the run stops after this iteration): %s", err)
                return

    def _record(self, version: int, result: EvalResult, eval_s: float) -> None:
        with self._cond:
            request = self._pending[version]
        write_evaluation(result, request.summaries, request.root_dir,
                         RecordedAt(request.iteration, request.env_steps, request.elapsed_s), eval_s, asynchronous=True)
        with self._cond:  # outstanding until written: wait() returns only after the record is
            self._completed.append(Evaluation(request.iteration, request.env_steps, result, request.snapshot))
            del self._pending[version]
            self._beat_at = time.monotonic()
            self._cond.notify_all()

    def check_child(self) -> None:
        """Raise ``AsyncEvalError`` if the child reported an exception, is gone, or took no env step for
        ``stall_timeout_s`` with a request outstanding."""
        alive = self.process.is_alive()
        try:  # a child that just died may have sent its traceback last: give it a moment to arrive
            _, _, child_traceback = self._errors.get(timeout=0.5) if not alive else self._errors.get_nowait()
        except queue.Empty:
            child_traceback = None
        if child_traceback is not None:
            raise AsyncEvalError(f"the async evaluator child (pid {self.pid}) failed:\n{child_traceback}")
        if not alive:
            self.process.join(timeout=POLL_S)  # (its exit code)
            code = self.process.exitcode
            if code is not None and code < 0:
                raise AsyncEvalError(f"the async evaluator child (pid {self.pid}) was killed by signal "
                                     f"{signal.Signals(-code).name}")
            raise AsyncEvalError(f"the async evaluator child (pid {self.pid}) exited with code {code}")
        now = time.monotonic()
        with self._cond:
            beat = self.shared.heartbeat.value
            if beat != self._beat:
                self._beat, self._beat_at = beat, now
            outstanding, silent_s = bool(self._pending), now - self._beat_at
        if outstanding and silent_s > self.stall_timeout_s:
            raise AsyncEvalError(f"the async evaluator child (pid {self.pid}) is alive but took no evaluation env "
                                 f"step for {silent_s:.0f} s; is the evaluation environment hung (or the child "
                                 "stopped)?")

    def _child_alive(self) -> bool:
        """For the parameter lock's wait: True while the child runs; raises once it has died (a child SIGKILLed
        holding the lock never releases it)."""
        if not self.process.is_alive():
            self.check_child()
        return True

    def _raise_failure(self) -> None:
        with self._cond:
            failure = self._failure
        if failure is not None:
            raise failure

