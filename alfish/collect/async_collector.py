"""Asynchronous collection: the training envs and a copy of the rollout policy step in a child process, feeding a
bounded queue that the trainer drains (DESIGN.md §3.7: the child gets a picklable spec; every wait has a timeout).

Trainer (``AsyncCollector``)                          Child (``async_child.child_main``, started with ``spawn``)
  __init__: spawn, wait for the EnvSpec           <-  builds the envs (the only training instance), reports their spec
  start(): parameter block + version 1, 'start'   ->  builds the policy from the spec, loads the parameters, resets
  collect(): steps from the queue, liveness       <-  runs the Unroller: one item per env step (raw Experience [B],
             checks every 0.2 s                        numpy), the parameter version that acted, the env step time
  publish_parameters(): a new version             ->  loaded before the next step when the version moved
  close(): stop event, join with timeout, kill        exits on the stop event, or when the trainer is gone

Only the rollout policy's tensors cross (``Algorithm.rollout_module_names``) plus the data transformers' state, never
the optimizer. An exception in the child reaches the trainer with the child's traceback; a child killed by a signal is
reported with the signal and pid. Data transformer statistics (normalizers) are updated here from the received steps.
"""
from __future__ import annotations

import atexit
import dataclasses
import logging
import multiprocessing as mp
import queue
import signal
import time
from typing import Any, Callable, Optional

import psutil
import torch

from alfish.algorithms.base import Algorithm
from alfish.collect.async_child import UnrollSpec, child_main
from alfish.collect.child_process import ChildChannels, reap_child, spawn_child, wake_child, without_rank_variables
from alfish.collect.collector import Collector, ProgressPoint, Sink
from alfish.collect.episode_stats import EpisodeStats
from alfish.collect.shared_params import POLL_S, AsyncUnrollError, ParamBlock, SharedParams, rollout_state
from alfish.collect.unroller import to_device
from alfish.data import nest
from alfish.data.types import Experience, TimeStep
from alfish.learn.device import CPU
from alfish.transforms.base import DataTransformer

__all__ = ["AsyncCollector", "AsyncUnrollError", "PolicyLag", "ReceivedStep", "UnrollSpec", "rollout_state"]


@dataclasses.dataclass
class ReceivedStep:
    """One env step of every env, as the trainer receives it."""

    experience: Experience  # [B, ...], raw (untransformed)
    version: int  # parameter version that chose the actions
    env_step_s: float  # wall-clock of the env.step call in the child


STOPPED_GRACE_S = 5.0  # a stopped child is an error after this much silence (a brief Ctrl-Z/bg is forgiven)


def _is_stopped(pid: int) -> bool:
    """True when process ``pid`` is stopped (SIGSTOP/SIGTSTP, or traced by a debugger)."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False  # gone: check_child reports it


class AsyncCollector(Collector):
    """Starts the child, publishes parameters to it and collects its steps.

    queue_size: capacity of the step queue (items are whole batched env steps); when full the child waits.
    max_unroll_length: ``collect(0)`` takes what has arrived, at most this many steps per env (0: no limit).
    parameter_update_period: iterations between two publishes of the rollout parameters.
    stall_timeout_s: a blocking ``collect`` that receives nothing for this long is an error even if the child is
    alive (a hung env); ``build.py`` passes the env's ``create_environment.step_timeout_s``. A child that is stopped
    (SIGSTOP, a debugger) is an error after ``STOPPED_GRACE_S`` of silence. The child's start-up (building its envs)
    may take ``startup_timeout_s``.
    device: the training device (the child acts on ``spec.acting_device``: ``DevicePolicy.rollout_device``
    resolved here, the CPU by default).
    """

    def __init__(self, spec: UnrollSpec, queue_size: int, max_unroll_length: int = 0,
                 parameter_update_period: int = 1, stall_timeout_s: float = 60.0, device: torch.device = CPU,
                 startup_timeout_s: float = 300.0):
        self._ctx = mp.get_context("spawn")  # a fresh interpreter: no inherited threads, locks or signal handlers
        with without_rank_variables():  # (the first lock may start multiprocessing's resource tracker process)
            self.shared = SharedParams(self._ctx)
            self._steps = self._ctx.Queue(maxsize=queue_size)
            self._errors = self._ctx.Queue()
            self._replies = self._ctx.Queue()  # child -> trainer: its EnvSpec
            self._commands = self._ctx.Queue()  # trainer -> child: 'start'
        self._stop = self._ctx.RawValue("b", 0)  # a flag, not an Event (child_process.py)
        channels = ChildChannels(results=self._steps, errors=self._errors, commands=self._commands, stop=self._stop,
                                 replies=self._replies)
        self.max_unroll_length = max_unroll_length
        self.parameter_update_period = parameter_update_period
        self.stall_timeout_s = stall_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.device = device  # the training device: the data transformers' statistics live there
        self.block: Optional[ParamBlock] = None
        self.policy_lag = PolicyLag()
        self._iteration = 0
        self._carried: Optional[Experience] = None  # collect_trajectory: the last row, the next trajectory's first
        self.process: Optional[mp.process.BaseProcess] = spawn_child(
            self._ctx, child_main, "alfish-async-unroll", (spec, self.shared, channels), self.close)
        logging.info("async unroll: child process %d started", self.process.pid)
        try:
            self.spec = self._receive_spec()
        except BaseException:
            self.close()
            raise
        self.stats = EpisodeStats(self.spec.num_envs)

    def _receive_spec(self) -> Any:
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            try:
                return self._replies.get(timeout=POLL_S)
            except queue.Empty:
                self.check_child()
                if time.monotonic() > deadline:
                    raise AsyncUnrollError(f"the async unroll child (pid {self.process.pid}) did not report its envs "
                                           f"within {self.startup_timeout_s:.0f} s; is creating the environment hung?"
                                           ) from None

    def start(self, algorithm: Algorithm, transformer: DataTransformer, sink: Optional[Sink],
              seed: Optional[int], progress: ProgressPoint,
              before_publish: Callable[[], None] = lambda: None, resume: Optional[dict] = None) -> None:
        self._algorithm, self._transformer, self._sink = algorithm, transformer, sink
        self._before_publish = before_publish
        self._stats_view = transformer.rollout_view(update_stats=True)
        self.block = ParamBlock(self.shared, rollout_state(algorithm, transformer))
        self._iteration = progress.iterations
        self.publish(progress)  # before the child acts: its first action already uses the current policy
        self._commands.put(("start", self.block.name, seed))

    def publish(self, progress: ProgressPoint) -> int:
        """Make the current rollout parameters the child's from its next step on; returns their version."""
        self._before_publish()
        state = rollout_state(self._algorithm, self._transformer)
        version = self.block.write(state, (progress.iterations, progress.env_steps, progress.fraction),
                                   keep_waiting=self._child_alive)
        self.policy_lag.published(version, self._iteration)
        return version

    def publish_parameters(self, iteration: int, progress: ProgressPoint) -> None:
        self._iteration = iteration
        if iteration % self.parameter_update_period == 0:
            self.publish(progress)

    def collect(self, steps_per_env: int) -> int:
        """``steps_per_env`` steps (waiting for them), or with 0 whatever has arrived (at most
        ``max_unroll_length``), into the sink."""
        received = self.receive(steps_per_env or None, self.max_unroll_length)
        for step in received:
            raw = as_time_step(step.experience)
            self._stats_view(to_device(raw, self.device))  # data transformer statistics live here, not in the child
            self.stats.observe(raw)
            self._sink.add(step.experience)
        self.policy_lag.received(received, self._iteration)
        return len(received)

    def collect_trajectory(self, steps_per_env: int, with_grad: bool = True) -> Experience:
        """The transformed trajectory ``[steps_per_env + 1, B]`` the child acted, on the training device, with the
        rollout infos its policy computed (no gradients: ``with_grad`` must be False, and the algorithm recomputes
        them, keeping the acting policy's log-probabilities for its off-policy correction). Trajectories follow each
        other: the last row (it only bootstraps) is the next trajectory's first, so every step taken trains once."""
        if with_grad:
            raise ValueError("an asynchronous unroll cannot keep gradients: the algorithm must recompute its rollout "
                             "infos (OnPolicyAlgorithm.recomputes_rollout_info)")
        received = self.receive(steps_per_env + (1 if self._carried is None else 0))
        rows = [] if self._carried is None else [self._carried]
        for step in received:
            raw = as_time_step(step.experience)
            seen = self._stats_view(to_device(raw, self.device))  # (its statistics updated, as collect's are)
            self.stats.observe(raw)
            action, info = to_device((step.experience.action, step.experience.rollout_info), self.device)
            rows.append(Experience.from_time_step(seen, action, info))
        self.policy_lag.received(received, self._iteration)
        self._carried = rows[-1]
        return nest.stack(rows)

    def summary(self) -> dict[str, float]:
        return {f"async/{k}": v for k, v in self.policy_lag.summary(self.queue_length()).items()}

    def queue_length(self) -> int:
        try:
            return self._steps.qsize()
        except NotImplementedError:  # macOS
            return -1

    def receive(self, num_steps: Optional[int], max_steps: int = 0) -> list[ReceivedStep]:
        """``num_steps`` env steps (waiting for them, checking the child every 0.2 s), or with ``None`` whatever has
        arrived, at most ``max_steps`` (0: no limit), without waiting."""
        received: list[ReceivedStep] = []
        last_arrival = time.monotonic()
        while num_steps is None or len(received) < num_steps:
            if num_steps is None and max_steps and len(received) >= max_steps:
                break
            try:
                item = self._steps.get(timeout=POLL_S) if num_steps is not None else self._steps.get_nowait()
            except queue.Empty:
                self.check_child()
                if num_steps is None:
                    break
                silent_s = time.monotonic() - last_arrival
                if silent_s > STOPPED_GRACE_S and _is_stopped(self.process.pid):
                    raise AsyncUnrollError(
                        f"the async unroll child (pid {self.process.pid}) is stopped (SIGSTOP or a debugger) and sent "
                        f"no env step for {silent_s:.0f} s; do not stop the child of a running job (re-run the same "
                        "command to resume from the last checkpoint)") from None
                if silent_s > self.stall_timeout_s:
                    raise AsyncUnrollError(f"the async unroll child (pid {self.process.pid}) is alive but sent no "
                                           f"env step for {self.stall_timeout_s:.0f} s; is the environment hung?"
                                           ) from None
                continue
            last_arrival = time.monotonic()
            exp_numpy, version, env_step_s = item
            received.append(ReceivedStep(nest.map_nest(torch.from_numpy, exp_numpy), version, env_step_s))
        return received

    def _child_alive(self) -> bool:
        """True while the child runs; raises ``check_child``'s error once it has died (e.g. SIGKILLed holding the
        parameter lock, which then stays locked)."""
        self.check_child()
        return True

    def check_child(self) -> None:
        """Raise ``AsyncUnrollError`` if the child reported an exception or is no longer running."""
        try:
            child_traceback = self._errors.get_nowait()
        except queue.Empty:
            child_traceback = None
        if child_traceback is not None:
            raise AsyncUnrollError(f"the async unroll child (pid {self.process.pid}) failed:\n{child_traceback}")
        if self.process is not None and not self.process.is_alive():
            code = self.process.exitcode
            if code is not None and code < 0:
                raise AsyncUnrollError(f"the async unroll child (pid {self.process.pid}) was killed by signal "
                                       f"{signal.Signals(-code).name}")
            raise AsyncUnrollError(f"the async unroll child (pid {self.process.pid}) exited with code {code}")

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the child (flag, then terminate, then kill; each step waits at most ``timeout_s / 2``)."""
        if self.process is None:
            return
        atexit.unregister(self.close)
        self._stop.value = 1
        wake_child(self.process)  # a stopped child would see the flag only after every timeout
        deadline = time.monotonic() + timeout_s / 2
        while self.process.is_alive() and time.monotonic() < deadline:
            self._drain()  # a child blocked on a full queue sees the stop flag sooner
            self.process.join(timeout=0.05)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=timeout_s / 2)
        self._drain()
        reap_child(self.process, (self._steps, self._errors, self._replies, self._commands), timeout_s)
        self.process = None
        if self.block is not None:
            self.block.close(unlink=True)
            self.block = None

    def _drain(self) -> None:
        try:
            while True:
                self._steps.get_nowait()
        except (queue.Empty, OSError, ValueError):
            pass


def as_time_step(exp: Experience) -> TimeStep:
    """The TimeStep fields of a received step (``prev_action`` is not stored; the chosen action stands in for it:
    the trainer only uses this to update transformer statistics and episode metrics)."""
    return TimeStep(exp.step_type, exp.reward, exp.discount, exp.observation, exp.action, exp.env_id)


class PolicyLag:
    """How stale the policy that collected the received steps was, and how fast steps arrive.

    Version lag: parameter versions published since the one that chose the actions. Iteration lag: iterations since
    that version was published.
    """

    def __init__(self) -> None:
        self._published_at: dict[int, int] = {}
        self.version = 0
        self._last: dict[str, float] = {}

    def published(self, version: int, iteration: int) -> None:
        self.version = version
        self._published_at[version] = iteration
        for old in [v for v in self._published_at if v < version - 10_000]:  # bounded memory on long runs
            del self._published_at[old]

    def received(self, steps: list[ReceivedStep], iteration: int) -> None:
        if not steps:
            self._last = dict(steps_received=0.0)
            return
        versions = [s.version for s in steps]
        self._last = dict(
            steps_received=float(len(steps)),
            policy_lag_versions=sum(self.version - v for v in versions) / len(versions),
            policy_lag_versions_max=float(max(self.version - v for v in versions)),
            policy_lag_iterations=sum(iteration - self._published_at.get(v, iteration) for v in versions)
            / len(versions),
            env_step_ms=1000.0 * sum(s.env_step_s for s in steps) / len(steps),
        )

    def summary(self, queue_length: int) -> dict[str, float]:
        """Scalars of the last iteration's collection, for TensorBoard's ``async/``."""
        return dict(self._last, queue_length=float(queue_length), parameter_version=float(self.version))
