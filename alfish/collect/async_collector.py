"""Asynchronous collection: the training envs and copies of the rollout policy step in child processes (one by
default, ``Trainer.num_unroll_processes`` of them: ``unroll_processes.py``), each feeding a bounded queue of its own
that the trainer drains (DESIGN.md §3.7: a child gets a picklable spec; every wait has a timeout).

Trainer (``AsyncCollector``)                          Children (``async_child.child_main``, started with ``spawn``)
  __init__: spawn, wait for the EnvSpecs          <-  each builds its share of the envs (the only training instance)
  start(): parameter block + version 1, 'start'   ->  builds the policy from the spec, loads the parameters, resets
  collect(): steps from the queue, liveness       <-  runs the Unroller: one item per env step of its share (raw
             checks every 0.2 s                        Experience [B/N], numpy), the parameter version that acted,
                                                       the env step time, its index
  publish_parameters(): a new version             ->  each loads it before its next step when the version moved
  close(): stop flag, join with timeout, kill         exit on the stop flag, or when the trainer is gone

How an iteration takes steps (``receive``): with a count (``unroll_length > 0``, *synchronous*) it waits until every
process has delivered that many steps of its envs, or ``min_fraction`` of the processes have (the others' steps that
arrived meanwhile are taken too); a process's steps beyond the count wait in its queue for the next iteration (a full
queue pauses its child, so no child runs ahead of the others by more than its queue). Without a count
(``unroll_length == 0``, *asynchronous*) it takes what has arrived, at most ``max_unroll_length`` per process. With
``max_policy_lag``, a step acted by parameters more than that many versions older than the newest published is dropped
(counted) and does not count towards a process's share: the stored episode of its envs is cut there (the step before
the gap becomes LAST, as a time-limit truncation, the step after it FIRST), so no transition spans the gap.

Only the rollout policy's tensors cross (``Algorithm.rollout_module_names``) plus the data transformers' state, never
the optimizer. An exception in a child reaches the trainer with the child's traceback; a child killed by a signal is
reported with the signal and pid. Data transformer statistics (normalizers) are updated here from the received steps.
"""
from __future__ import annotations

import atexit
import collections
import dataclasses
import math
import multiprocessing.connection
import queue
import time
from typing import Any, Callable, Optional

import torch

from alfish.algorithms.base import Algorithm
from alfish.collect.async_child import UnrollSpec
from alfish.collect.collector import Collector, ProgressPoint, Sink
from alfish.collect.episode_stats import EpisodeStats
from alfish.collect.policy_lag import PolicyLag
from alfish.collect.restarts import RestartBudget
from alfish.collect.shared_params import POLL_S, AsyncUnrollError, ParamBlock, rollout_state
from alfish.collect.unroll_processes import UnrollChildFailed, UnrollProcesses
from alfish.collect.unroller import to_device
from alfish.data import nest
from alfish.data.types import Experience, StepType, TimeStep
from alfish.learn.device import CPU
from alfish.replay.replay_buffer import online_replay_of
from alfish.transforms.base import DataTransformer

__all__ = ["AsyncCollector", "AsyncUnrollError", "CollectionSettings", "PolicyLag", "ReceivedStep", "UnrollSpec",
           "rollout_state"]


@dataclasses.dataclass
class ReceivedStep:
    """One env step of one process's envs, as the trainer receives it."""

    experience: Experience  # [B/N, ...], raw (untransformed)
    version: int  # parameter version that chose the actions
    env_step_s: float  # wall-clock of the env.step call in the child
    process: int = 0  # which unroll process stepped it
    generation: int = 0  # which child of that process (a replacement after a crash is the next)
    after_gap: bool = False  # its envs' steps before it were dropped (too old a policy), or another child stepped them


@dataclasses.dataclass(frozen=True)
class CollectionSettings:
    """How iterations take the children's steps (``TrainerConfig``'s names in brackets).

    num_processes: unroll processes of this rank, each stepping an equal share of its envs [num_unroll_processes].
    min_fraction: synchronous collection: an iteration may start training once this fraction of the processes has
        delivered its share [unroll_min_fraction].
    max_policy_lag: steps acted by parameters more than this many published versions old are dropped; None: all are
        kept [max_policy_lag].
    restart_crashed: a child that fails, dies, hangs or is stopped is replaced instead of ending the run
        [restart_crashed_envs]; more than ``max_restarts_per_hour`` replacements within an hour is the error
        [max_env_restarts_per_hour].
    """

    num_processes: int = 1
    min_fraction: float = 1.0
    max_policy_lag: Optional[int] = None
    restart_crashed: bool = False
    max_restarts_per_hour: int = 10


STOPPED_GRACE_S = 5.0  # a stopped child is an error after this much silence (a brief Ctrl-Z/bg is forgiven)
STARTUP_TIMEOUT_S = 300.0  # a child may take this long to build its envs and report them


class AsyncCollector(Collector):
    """Starts the children, publishes parameters to them and collects their steps.

    queue_size: capacity of the step queue (items are one process's batched env step); when full the children wait.
    max_unroll_length: ``collect(0)`` takes what has arrived, at most this many steps per env (0: no limit).
    parameter_update_period: iterations between two publishes of the rollout parameters.
    stall_timeout_s: a blocking ``collect`` that receives nothing for this long is an error even if the children are
    alive (a hung env); ``build.py`` passes the env's ``create_environment.step_timeout_s``. A child that is stopped
    (SIGSTOP, a debugger) is an error after ``STOPPED_GRACE_S`` of silence. A child's start-up (building its envs)
    may take ``STARTUP_TIMEOUT_S``.
    device: the training device (the children act on ``spec.acting_device``: ``DevicePolicy.rollout_device``
    resolved here, the CPU by default).
    collection: how many processes and how an iteration takes their steps (``CollectionSettings``).
    """

    def __init__(self, spec: UnrollSpec, queue_size: int, max_unroll_length: int = 0,
                 parameter_update_period: int = 1, stall_timeout_s: float = 60.0, device: torch.device = CPU,
                 collection: CollectionSettings = CollectionSettings()):
        if not 0.0 < collection.min_fraction <= 1.0:
            raise ValueError(f"TrainerConfig.unroll_min_fraction={collection.min_fraction} must be in (0, 1]")
        self.max_unroll_length = max_unroll_length
        self.parameter_update_period = parameter_update_period
        self.stall_timeout_s = stall_timeout_s
        self.device = device  # the training device: the data transformers' statistics live there
        self.collection = collection
        self.block: Optional[ParamBlock] = None
        self.policy_lag = PolicyLag()
        self.dropped_env_steps = 0  # env steps dropped for too old a policy (max_policy_lag)
        self._iteration = 0
        self.processes: Optional[UnrollProcesses] = None
        self.processes = UnrollProcesses(spec, collection.num_processes, queue_size, self.close, STARTUP_TIMEOUT_S)
        n = self.processes.num_processes
        self._pending: list[collections.deque[ReceivedStep]] = [collections.deque() for _ in range(n)]
        self._gap = [False] * n  # a process's steps were dropped: its next kept step follows a gap
        self._generation = [0] * n  # the newest child of each process whose steps were taken
        self.restarts = RestartBudget(collection.max_restarts_per_hour)
        # collect_trajectory: each process's last row, the first of its next trajectory
        self._carried: list[Optional[Experience]] = [None] * n
        self.spec = self.processes.spec
        self.stats = EpisodeStats(self.spec.num_envs)

    @property
    def process(self) -> Optional[Any]:
        """The (first) child process; None once closed."""
        return self.processes.children[0].process if self.processes is not None and self.processes.children else None

    def start(self, algorithm: Algorithm, transformer: DataTransformer, sink: Optional[Sink],
              seed: Optional[int], progress: ProgressPoint,
              before_publish: Callable[[], None] = lambda: None, resume: Optional[dict] = None) -> None:
        self._algorithm, self._transformer, self._sink = algorithm, transformer, sink
        self._replay = online_replay_of(sink)
        self._before_publish = before_publish
        self._stats_view = transformer.rollout_view(update_stats=True)
        self.block = ParamBlock(self.processes.shared, rollout_state(algorithm, transformer))
        self._iteration = progress.iterations
        self.publish(progress)  # before the children act: their first action already uses the current policy
        self.processes.start(self.block.name, seed)

    def publish(self, progress: ProgressPoint) -> int:
        """Make the current rollout parameters the children's from their next step on; returns their version."""
        self._before_publish()
        state = rollout_state(self._algorithm, self._transformer)
        version = self.block.write(state, (progress.iterations, progress.env_steps, progress.fraction),
                                   keep_waiting=self._children_alive)
        self.policy_lag.published(version, self._iteration)
        return version

    def publish_parameters(self, iteration: int, progress: ProgressPoint) -> None:
        self._iteration = iteration
        if self._replay is not None:
            self._replay.set_current_iteration(iteration)
        if iteration % self.parameter_update_period == 0:
            self.publish(progress)

    # -------------------------------------------------------------------------------------------------- collecting --
    def collect(self, steps_per_env: int) -> float:
        """``steps_per_env`` steps of each process's envs (waiting for them: all processes, or ``min_fraction`` of
        them), or with 0 whatever has arrived (at most ``max_unroll_length`` per env), into the sink. Returns the env
        steps taken per env of the rank (a fraction when the processes delivered unequal shares)."""
        received = self.receive(steps_per_env or None, self.max_unroll_length)
        env_steps = 0
        for step in received:
            raw = as_time_step(step.experience)
            self._stats_view(to_device(raw, self.device))  # data transformer statistics live here, not in the child
            self.stats.observe(raw)
            experience = step.experience
            if step.after_gap:
                self._sink.truncate_episodes(experience.env_id)  # the last stored step before the gap ends its episode
                experience = restart_episodes(experience)
            if self._replay is not None:  # (the stored policy iteration: the one that published the acting version)
                self._replay.set_acting_iteration(self.policy_lag.published_iteration(step.version, self._iteration))
            self._sink.add(experience)
            env_steps += experience.step_type.shape[0]
        self.policy_lag.received(received, self._iteration)
        return env_steps / self.spec.num_envs

    def collect_trajectory(self, steps_per_env: int, with_grad: bool = True) -> Experience:
        """The transformed trajectory ``[steps_per_env + 1, B]`` the children acted, on the training device, with the
        rollout infos their policies computed (no gradients: ``with_grad`` must be False, and the algorithm
        recomputes them, keeping the acting policy's log-probabilities for its off-policy correction). Trajectories
        follow each other: the last row (it only bootstraps) is the next trajectory's first, so every step taken
        trains once. Every process delivers its share of each row (``min_fraction`` does not apply)."""
        if with_grad:
            raise ValueError("an asynchronous unroll cannot keep gradients: the algorithm must recompute its rollout "
                             "infos (OnPolicyAlgorithm.recomputes_rollout_info)")
        if steps_per_env < 1:
            raise ValueError("an on-policy algorithm trains on trajectories of TrainerConfig.unroll_length steps: set "
                             "it > 0 with async_unroll=True")
        n = self.processes.num_processes
        rows: list[list[Experience]] = [[] if self._carried[p] is None else [self._carried[p]] for p in range(n)]
        needed = [steps_per_env + 1 - len(rows[p]) for p in range(n)]
        received = self.receive(max(needed), every_process=True, per_process=needed)
        for step in received:
            raw = as_time_step(step.experience)
            seen = self._stats_view(to_device(raw, self.device))  # (its statistics updated, as collect's are)
            self.stats.observe(raw)
            action, info = to_device((step.experience.action, step.experience.rollout_info), self.device)
            row = Experience.from_time_step(seen, action, info)
            if step.after_gap:
                if rows[step.process]:
                    rows[step.process][-1] = truncate_episodes(rows[step.process][-1])
                row = restart_episodes(row)
            rows[step.process].append(row)
        self.policy_lag.received(received, self._iteration)
        self._carried = [process_rows[-1] for process_rows in rows]
        trajectories = [nest.stack(process_rows) for process_rows in rows]  # [T + 1, B/N] each, env ids ascending
        return trajectories[0] if n == 1 else nest.map_nest(lambda *xs: torch.cat(xs, dim=1), *trajectories)

    def summary(self) -> dict[str, float]:
        scalars = self.policy_lag.summary(self.queue_length())
        if self.collection.max_policy_lag is not None:
            scalars["dropped_env_steps"] = float(self.dropped_env_steps)
        if self.collection.restart_crashed:
            scalars["env_restarts"] = float(self.env_restarts)
        return {f"async/{k}": v for k, v in scalars.items()}

    def queue_length(self) -> int:
        try:
            return sum(self.processes.queue(p).qsize() for p in range(self.processes.num_processes))
        except NotImplementedError:  # macOS
            return -1

    # ---------------------------------------------------------------------------------------------------- receiving --
    def receive(self, num_steps: Optional[int], max_steps: int = 0, every_process: bool = False,
                per_process: Optional[list[int]] = None) -> list[ReceivedStep]:
        """Steps of the processes' envs, grouped by process, each process's in the order its envs stepped.

        ``num_steps`` (synchronous): waits (checking the children every 0.2 s) until ``num_steps`` steps of every
        process have been taken, or of ``min_fraction`` of them unless ``every_process`` (then the others' steps that
        have arrived are taken too, up to ``num_steps``); ``per_process`` may lower the count of some. ``None``
        (asynchronous): whatever has arrived, at most ``max_steps`` per process (0: no limit), without waiting. A
        process's steps beyond its count stay in its queue (which then pauses it) for the next call; steps too old
        for ``max_policy_lag`` are dropped."""
        n = self.processes.num_processes
        wanted = per_process or [num_steps or max_steps or 0] * n
        capped = num_steps is not None or max_steps > 0
        quorum = n if every_process or num_steps is None else max(1, math.ceil(self.collection.min_fraction * n - 1e-9))
        taken: list[list[ReceivedStep]] = [[] for _ in range(n)]

        def full(p: int) -> bool:
            return capped and len(taken[p]) >= wanted[p]

        last_arrival = [time.monotonic()] * n
        last_check = time.monotonic()
        while True:
            for p in range(n):  # what has arrived, each process up to its count
                self._take_arrived(p, taken, full, last_arrival)
            done = sum(full(p) for p in range(n))
            if num_steps is None or done >= quorum:
                break
            if not self._wait_for_steps([p for p in range(n) if not full(p)]):
                self._check_children(last_arrival, None)
            if time.monotonic() - last_check > POLL_S:  # (steps may keep arriving from the others meanwhile)
                last_check = time.monotonic()
                self._check_children(last_arrival, ([full(p) for p in range(n)], quorum))
        if num_steps is None:
            self._check_children(last_arrival, None)
        return [step for process_steps in taken for step in process_steps]

    def _take_arrived(self, p: int, taken: list[list[ReceivedStep]], full: Callable[[int], bool],
                      last_arrival: list[float]) -> None:
        """Process ``p``'s queued steps, until its count is reached or its queue is empty (no wait). Steps a replaced
        child left in its queue come first."""
        while self._pending[p] and not full(p):
            self._consider(self._pending[p].popleft(), taken)
        steps = self.processes.queue(p)
        while not full(p):
            try:
                exp_numpy, version, env_step_s, process, generation = steps.get_nowait()
            except queue.Empty:
                return
            last_arrival[p] = time.monotonic()
            self._consider(ReceivedStep(nest.map_nest(torch.from_numpy, exp_numpy), version, env_step_s, process,
                                        generation), taken)

    def _wait_for_steps(self, processes: list[int]) -> bool:
        """Wait at most ``POLL_S`` for a step in the queue of one of ``processes``; False when none arrived."""
        readers = [getattr(self.processes.queue(p), "_reader", None) for p in processes]
        if any(r is None for r in readers):  # (multiprocessing's Queue keeps its pipe there; without it, poll)
            time.sleep(0.001)
            return True
        return bool(multiprocessing.connection.wait(readers, timeout=POLL_S))

    def _check_children(self, last_arrival: list[float], round_state: Optional[tuple[list[bool], int]]) -> None:
        """Raise for a failed, dead, hung or stopped child (``round_state``: which processes are done and how many
        must be, for the silence checks), or with ``restart_crashed`` replace it and go on."""
        try:
            self.processes.check()
            if round_state is not None:
                self._check_silence(last_arrival, *round_state)
        except UnrollChildFailed as failure:
            if not self.collection.restart_crashed:
                raise
            self._restart(failure)
            last_arrival[failure.index] = time.monotonic()  # (the new child's start-up is not silence)

    def _restart(self, failure: UnrollChildFailed) -> None:
        """Replace the failed child (the steps it sent before failing are kept: whole transitions; its envs' episodes
        in flight are cut where its steps end, and never counted as finished), unless that makes more than
        ``max_restarts_per_hour`` replacements within the last hour."""
        index = failure.index
        first = self.processes.first_env_id(index)
        last = first + self.processes.num_envs_of(index) - 1
        self.restarts.spend(failure, f"replacing it: the episodes in flight in envs {first}..{last} are cut")
        leftover = self.processes.replace(index, failure.steps_whole)
        self._pending[index].extend(  # (whole steps it queued before failing: they come before its replacement's)
            ReceivedStep(nest.map_nest(torch.from_numpy, exp_numpy), version, env_step_s, process, generation)
            for exp_numpy, version, env_step_s, process, generation in leftover)

    @property
    def env_restarts(self) -> int:
        """Children replaced so far."""
        return self.restarts.count

    def _check_silence(self, last_arrival: list[float], full: list[bool], quorum: int) -> None:
        """The round cannot complete when fewer than ``quorum`` processes are done or still sending: raise for the
        silent ones, stopped (SIGSTOP, a debugger: after ``STOPPED_GRACE_S``) or hung (after ``stall_timeout_s``)."""
        now = time.monotonic()
        waiting = [p for p in range(len(full)) if not full[p]]
        stopped = [p for p in waiting
                   if now - last_arrival[p] > STOPPED_GRACE_S and self.processes.is_stopped(p)]
        hung = [p for p in waiting if now - last_arrival[p] > self.stall_timeout_s and p not in stopped]
        if len(full) - len(stopped) - len(hung) >= quorum:
            return
        if stopped:
            p = stopped[0]
            raise UnrollChildFailed(
                f"{self.processes.describe(p)} is stopped (SIGSTOP or a debugger) and sent no env step for "
                f"{now - last_arrival[p]:.0f} s; do not stop the child of a running job (re-run the same command to "
                "resume from the last checkpoint)", p)
        raise UnrollChildFailed(f"{self.processes.describe(hung[0])} is alive but sent no env step for "
                                f"{self.stall_timeout_s:.0f} s; is the environment hung?", hung[0])

    def _consider(self, step: ReceivedStep, taken: list[list[ReceivedStep]]) -> None:
        """Take ``step``, or drop it when its policy is too old (its episode statistics still count)."""
        limit = self.collection.max_policy_lag
        if limit is not None and self.policy_lag.version - step.version > limit:
            self.stats.observe(as_time_step(step.experience))  # the episode goes on in the env: its return counts
            self.dropped_env_steps += step.experience.step_type.shape[0]
            self._gap[step.process] = True
            return
        if step.generation != self._generation[step.process]:  # a replacement's first step: another child came before
            self._generation[step.process] = step.generation
            self._gap[step.process] = True
        if self._gap[step.process]:
            step.after_gap, self._gap[step.process] = True, False
        taken[step.process].append(step)

    # ------------------------------------------------------------------------------------------------- liveness --
    def _children_alive(self) -> bool:
        """True while the children run; raises ``check_child``'s error once one has died (e.g. SIGKILLed holding the
        parameter lock, which then stays locked)."""
        self.check_child()
        return True

    def check_child(self) -> None:
        """Raise ``AsyncUnrollError`` if a child reported an exception or is no longer running."""
        if self.processes is not None:
            self.processes.check()

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the children (flag, then terminate, then kill; each step waits at most ``timeout_s / 2``)."""
        if self.processes is None:
            return
        atexit.unregister(self.close)
        self.processes.close(timeout_s)
        self.processes = None
        if self.block is not None:
            self.block.close(unlink=True)
            self.block = None


def as_time_step(exp: Experience) -> TimeStep:
    """The TimeStep fields of a received step (``prev_action`` is not stored; the chosen action stands in for it:
    the trainer only uses this to update transformer statistics and episode metrics)."""
    return TimeStep(exp.step_type, exp.reward, exp.discount, exp.observation, exp.action, exp.env_id)


def _where_mid(step_type: torch.Tensor, value: torch.Tensor, replacement: float) -> torch.Tensor:
    mid = (step_type == StepType.MID).view(step_type.shape + (1,) * (value.dim() - step_type.dim()))
    return torch.where(mid, torch.as_tensor(replacement, dtype=value.dtype, device=value.device), value)


def restart_episodes(exp: Experience) -> Experience:
    """The first step kept after a gap: its MID steps become FIRST (reward 0, discount 1: nothing leads into them).
    A LAST stays LAST (no transition leaves it) and a FIRST stays FIRST."""
    step_type = exp.step_type
    first = torch.where(step_type == StepType.MID, torch.full_like(step_type, StepType.FIRST), step_type)
    return nest.replace_fields(exp, step_type=first, reward=_where_mid(step_type, exp.reward, 0.0),
                        discount=_where_mid(step_type, exp.discount, 1.0))


def truncate_episodes(exp: Experience) -> Experience:
    """The last step kept before a gap: LAST, keeping its reward and discount (a time-limit truncation, as
    ``RingBuffer.truncate_episodes`` marks a stored one)."""
    return nest.replace_fields(exp, step_type=torch.full_like(exp.step_type, StepType.LAST))
