"""The async unroll's child processes of one rank: ``N`` children (``Trainer.num_unroll_processes``), each stepping
its equal share of the rank's envs with its own copy of the rollout policy into its own bounded queue, all reading
ONE shared parameter block (written once per publish, read by each child before its next step).

One queue per child, not one shared by all: a child whose queue is full waits, so a fast child cannot run ahead of a
slow one by more than its queue (the policy lag stays bounded per child, and nothing piles up in the trainer while it
waits for the slow one); and a child that dies in the middle of a write damages only its own queue, which its
replacement does not inherit.

Child ``p`` of ``N`` steps envs ``[p B/N, (p + 1) B/N)`` of the rank's ``B``: the same env ids and env seeds as one
child stepping all ``B`` (``EnvSettings.share``), so the replay buffer's rings, the episodes and the seeds do not
depend on ``N``. Its reset seed is the trainer's plus ``p B/N`` and its action-sampling stream starts from that plus
``CHILD_SEED_OFFSET``: distinct for every child of every rank (``alfish/seeding.py``). Every item a child puts on the
item carries its index. Each child has its own step, command, error and reply queues (a failure names the child), and
all share the stop flag: closing stops them together, each wait bounded.
"""
from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import queue
import signal
import time
from typing import Any, Callable, Optional

import psutil

from alfish.collect.async_child import UnrollSpec, child_main
from alfish.collect.child_process import ChildChannels, reap_child, spawn_child, wake_child, without_rank_variables
from alfish.collect.shared_params import POLL_S, AsyncUnrollError, SharedParams
from alfish.envs.spec import EnvSpec

JOIN_TIMEOUT_S = 2.5  # a replaced child's terminate, then kill, each waited on this long


def _is_stopped(pid: int) -> bool:
    """True when process ``pid`` is stopped (SIGSTOP/SIGTSTP, or traced by a debugger)."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False  # gone: check reports it


@dataclasses.dataclass
class _Child:
    spec: UnrollSpec  # its share of the envs and its index
    process: Any
    channels: ChildChannels
    start_seed: Optional[int] = None  # the reset seed it was started with (None: its env settings' own)
    restarts: int = 0  # how often this share's child was replaced


class UnrollChildFailed(AsyncUnrollError):
    """One unroll child failed, died, stalled or was stopped; ``index`` says which (``UnrollProcesses.replace``).
    ``steps_whole``: the child reported an exception after writing every step it had queued into its queue's pipe, so
    its queue may be read; a child that died, hung or was stopped may have been cut off in the middle of a write."""

    def __init__(self, message: str, index: int, steps_whole: bool = False):
        super().__init__(message)
        self.index = index
        self.steps_whole = steps_whole


class UnrollProcesses:
    """Starts ``num_processes`` unroll children from ``spec`` (its env settings are the whole rank's batch), waits
    for their env specs, starts them acting, checks them, replaces a failed one, and stops them.

    Child ``p`` puts its items on ``queue(p)`` (at most ``queue_size``): ``(experience numpy [B/N], version,
    env_step_s, index, generation)``.
    ``spec`` (after construction): the rank's ``EnvSpec``, ``num_envs = B``.
    """

    def __init__(self, spec: UnrollSpec, num_processes: int, queue_size: int, close: Callable[[], None],
                 startup_timeout_s: float = 300.0):
        if num_processes < 1:
            raise ValueError(f"Trainer.num_unroll_processes={num_processes} must be >= 1")
        self._ctx = mp.get_context("spawn")  # a fresh interpreter: no inherited threads, locks or signal handlers
        with without_rank_variables():  # (the first lock may start multiprocessing's resource tracker process)
            self.shared = SharedParams(self._ctx)
        self.stop = self._ctx.RawValue("b", 0)  # a flag, not an Event (child_process.py)
        self.startup_timeout_s = startup_timeout_s
        self.queue_size = queue_size
        self._close = close  # the owner's close, run at exit (spawn_child registers it)
        self._block_name: Optional[str] = None
        self.children: list[_Child] = []
        shares = [spec.env_settings.share(p, num_processes) for p in range(num_processes)]
        try:
            for index, settings in enumerate(shares):
                self.children.append(self._spawn(dataclasses.replace(spec, env_settings=settings,
                                                                     process_index=index), num_processes))
            specs = [self._receive_spec(index) for index in range(num_processes)]
        except BaseException:
            self.close()
            raise
        self.spec = dataclasses.replace(specs[0], num_envs=spec.env_settings.num_parallel_environments)

    @property
    def num_processes(self) -> int:
        return len(self.children)

    @property
    def pids(self) -> list[int]:
        return [c.process.pid for c in self.children]

    def _spawn(self, spec: UnrollSpec, num_processes: int) -> _Child:
        settings, index = spec.env_settings, spec.process_index
        with without_rank_variables():
            channels = ChildChannels(results=self._ctx.Queue(maxsize=self.queue_size), errors=self._ctx.Queue(),
                                     commands=self._ctx.Queue(), stop=self.stop, replies=self._ctx.Queue())
        name = "alfish-async-unroll" + (f"-{index}" if num_processes > 1 else "")
        process = spawn_child(self._ctx, child_main, name, (spec, self.shared, channels), self._close)
        logging.info("async unroll: child process %d started (envs %d..%d)", process.pid, settings.first_env_id,
                     settings.first_env_id + settings.num_parallel_environments - 1)
        return _Child(spec, process, channels)

    def _receive_spec(self, index: int) -> EnvSpec:
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            try:
                return self.children[index].channels.replies.get(timeout=POLL_S)
            except queue.Empty:
                self.check(only=index)
                if time.monotonic() > deadline:
                    raise UnrollChildFailed(f"{self.describe(index)} did not report its envs within "
                                            f"{self.startup_timeout_s:.0f} s; is creating the environment hung?",
                                            index) from None

    def start(self, block_name: str, seed: Optional[int]) -> None:
        """Every child: load the parameter block ``block_name`` and reset its envs, child ``p`` with ``seed`` plus
        its first env id (env ``i`` of the rank gets ``seed + i``)."""
        self._block_name = block_name
        for child in self.children:
            child.start_seed = None if seed is None else seed + child.spec.env_settings.first_env_id
            child.channels.commands.put(("start", block_name, child.start_seed))

    def queue(self, index: int) -> Any:
        """Child ``index``'s step queue."""
        return self.children[index].channels.results

    def replace(self, index: int, steps_whole: bool = False) -> list[Any]:
        """Replace child ``index`` (failed, dead, hung or stopped) by a new one stepping the same envs: the old one is
        terminated (then killed; bounded), the new one builds its envs, reports them and starts acting with the
        published parameters, its envs reset with the ``k``-th reseed of the share's seed (``seeding.reseed``: not the
        episodes that failed again). Returns the items the old one had queued when ``steps_whole``
        (``UnrollChildFailed.steps_whole``: it reported a Python exception after writing all of them, whether or not it
        has exited yet); a child killed by a signal, hung or stopped may have been cut off in the middle of a write, so
        its queue is not read. Raises ``UnrollChildFailed`` when the new one fails to start."""
        from alfish.seeding import reseed

        old = self.children[index]
        leftover = _drain(old.channels.results) if steps_whole else []
        reap_child(old.process, (old.channels.results, old.channels.errors, old.channels.replies,
                                 old.channels.commands), JOIN_TIMEOUT_S * 2)
        child = self._spawn(dataclasses.replace(old.spec, generation=old.spec.generation + 1), self.num_processes)
        child.restarts = old.restarts + 1
        self.children[index] = child
        self._receive_spec(index)
        base = old.start_seed if old.start_seed is not None else old.spec.env_settings.seed
        child.start_seed = reseed(base, child.restarts)
        child.channels.commands.put(("start", self._block_name, child.start_seed))
        return leftover

    def describe(self, index: int) -> str:
        """'the async unroll child (pid P)', with its index when there are several."""
        which = f" {index} of {self.num_processes}" if self.num_processes > 1 else ""
        return f"the async unroll child{which} (pid {self.children[index].process.pid})"

    def first_env_id(self, index: int) -> int:
        return self.children[index].spec.env_settings.first_env_id

    def num_envs_of(self, index: int) -> int:
        return self.children[index].spec.env_settings.num_parallel_environments

    def check(self, only: Optional[int] = None) -> None:
        """Raise ``UnrollChildFailed`` if a child (or child ``only``) reported an exception or is no longer running."""
        for index, child in enumerate(self.children):
            if only is not None and index != only:
                continue
            try:
                child_traceback, steps_whole = child.channels.errors.get_nowait()
            except queue.Empty:
                child_traceback, steps_whole = None, False
            if child_traceback is not None:
                raise UnrollChildFailed(f"{self.describe(index)} failed:\n{child_traceback}", index, steps_whole)
            process = child.process
            if process is not None and not process.is_alive():
                code = process.exitcode
                if code is not None and code < 0:
                    raise UnrollChildFailed(f"{self.describe(index)} was killed by signal "
                                            f"{signal.Signals(-code).name}", index)
                raise UnrollChildFailed(f"{self.describe(index)} exited with code {code}", index)

    def is_stopped(self, index: int) -> bool:
        """Whether child ``index`` is stopped (SIGSTOP/SIGTSTP, or traced by a debugger)."""
        return _is_stopped(self.children[index].process.pid)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop every child (flag, then terminate, then kill; each step waits at most ``timeout_s / 2``)."""
        if not self.children:
            return
        self.stop.value = 1
        for child in self.children:
            wake_child(child.process)  # a stopped child would see the flag only after every timeout
        deadline = time.monotonic() + timeout_s / 2
        while any(c.process.is_alive() for c in self.children) and time.monotonic() < deadline:
            for child in self.children:
                if child.process.exitcode is None:  # (a child that ended may have been cut off mid-write)
                    _drain(child.channels.results)  # a child blocked on a full queue sees the stop flag sooner
                child.process.join(timeout=0.05 / len(self.children))
        for child in self.children:
            if child.process.is_alive():
                child.process.terminate()
        for child in self.children:
            channels = child.channels
            reap_child(child.process, (channels.results, channels.errors, channels.replies, channels.commands),
                       timeout_s)
        self.children = []


def _drain(steps: Any) -> list[Any]:
    """The items ``steps`` holds now (without waiting)."""
    items = []
    try:
        while True:
            items.append(steps.get_nowait())
    except (queue.Empty, OSError, ValueError):
        pass
    return items
