"""Asynchronous unroll: the environments and a copy of the rollout policy step in a child process, feeding a bounded
queue that the trainer drains (DESIGN.md §3.7: the child gets a picklable spec; every wait has a timeout).

Parent                                            Child (``_child_main``, started with ``spawn``)
  publish(): rollout params + transformer state  ->  shared bytes + version (under a lock)
             + schedule progress                      loaded before the next step when the version moved
  collect(): steps from the queue, with             <-  one item per env step: the raw Experience ``[B]`` (numpy),
             liveness checks every 0.2 s                 the parameter version that chose the actions, env step time
  close(): stop event, join with timeout, kill      exits on the stop event, or when the parent is gone

Only the rollout policy's tensors cross (``Algorithm.rollout_module_names``) plus the data transformers' state, never
the optimizer. An exception in the child reaches the trainer with the child's traceback; a child killed by a signal
is reported with the signal and pid.
"""
from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import os
import queue
import signal
import time
import traceback
from typing import Any, Callable, Optional

import numpy as np
import torch

from alfish.data import nest
from alfish.data.types import Experience, TimeStep

POLL_S = 0.2  # how often a waiting side re-checks that its peer is alive
LOCK_TIMEOUT_S = 10.0


class AsyncUnrollError(RuntimeError):
    """The unroll child failed, died or stalled."""


def rollout_state(algorithm: torch.nn.Module, transformer: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a rollout policy needs, by name: the algorithm's rollout modules (all of it when it names none)
    and the data transformers' state (normalizer statistics)."""
    names = getattr(algorithm, "rollout_module_names", None)
    state = {}
    for key, value in algorithm.state_dict().items():
        if names is None or any(key == n or key.startswith(n + ".") for n in names):
            state["algorithm." + key] = value
    for key, value in transformer.state_dict().items():
        state["transformer." + key] = value
    return state


class SharedState:
    """Named tensors as one shared byte buffer with a version counter: the parent writes, the child reads.

    ``layout``: ``[(name, offset, nbytes)]`` in a fixed order; both sides compute it from same-shaped tensors.
    """

    def __init__(self, ctx: Any, tensors: dict[str, torch.Tensor]):
        self.layout, offset = [], 0
        for name, tensor in tensors.items():
            nbytes = tensor.numel() * tensor.element_size()
            self.layout.append((name, offset, nbytes))
            offset += nbytes
        self.buffer = ctx.RawArray("B", max(1, offset))
        self.version = ctx.RawValue("q", 0)
        self.progress = ctx.RawArray("d", 3)  # iterations, env steps, fraction of the run (schedules in the child)
        self.lock = ctx.Lock()

    def _view(self) -> np.ndarray:
        return np.frombuffer(self.buffer, dtype=np.uint8)

    def write(self, tensors: dict[str, torch.Tensor], progress: tuple[float, float, float]) -> int:
        view = self._view()
        if not self.lock.acquire(timeout=LOCK_TIMEOUT_S):
            raise AsyncUnrollError(f"could not publish parameters: the shared lock was held for {LOCK_TIMEOUT_S} s")
        try:
            for name, offset, nbytes in self.layout:
                raw = tensors[name].detach().contiguous().reshape(-1).view(torch.uint8).numpy()
                view[offset:offset + nbytes] = raw
            self.progress[:] = list(progress)
            self.version.value += 1
            return self.version.value
        finally:
            self.lock.release()

    def read_into(self, tensors: dict[str, torch.Tensor],
                  keep_waiting: Callable[[], bool] = lambda: True) -> Optional[tuple[int, tuple[float, ...]]]:
        """Copy the shared bytes into ``tensors`` (same names and shapes); returns the version and progress, or
        ``None`` when ``keep_waiting()`` turned False while the lock was held (e.g. a writer killed holding it)."""
        view = self._view()
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while not self.lock.acquire(timeout=POLL_S):
            if not keep_waiting():
                return None
            if time.monotonic() > deadline:
                raise AsyncUnrollError(f"could not read parameters: the shared lock was held for {LOCK_TIMEOUT_S} s")
        try:
            for name, offset, nbytes in self.layout:
                target = tensors[name]
                flat = torch.from_numpy(view[offset:offset + nbytes].copy()).view(target.dtype)
                target.copy_(flat.reshape(target.shape))
            return self.version.value, tuple(self.progress[:])
        finally:
            self.lock.release()


@dataclasses.dataclass
class UnrollSpec:
    """Everything the child needs, picklable: the gin config text (parsed there), the env seed and pacing."""

    config_text: str
    root_dir: str
    seed: int
    step_interval_s: float
    parent_pid: int


@dataclasses.dataclass
class ReceivedStep:
    """One env step of every env, as the trainer receives it."""

    experience: Experience  # [B, ...], raw (untransformed)
    version: int  # parameter version that chose the actions
    env_step_s: float  # wall-clock of the env.step call in the child


class AsyncUnroller:
    """Starts the child, publishes parameters to it and collects its steps.

    queue_size: capacity of the step queue (items are whole batched env steps); when full the child waits.
    stall_timeout_s: a blocking ``collect`` that receives nothing for this long is an error even if the child is
    alive (a hung env).
    """

    def __init__(self, spec: UnrollSpec, initial_state: dict[str, torch.Tensor], queue_size: int,
                 stall_timeout_s: float = 300.0):
        self._ctx = mp.get_context("spawn")  # a fresh interpreter: no inherited threads, locks or signal handlers
        self.shared = SharedState(self._ctx, initial_state)
        self._steps = self._ctx.Queue(maxsize=queue_size)
        self._errors = self._ctx.Queue()
        self._stop = self._ctx.Event()
        self._spec = spec
        self.stall_timeout_s = stall_timeout_s
        self.process: Optional[mp.process.BaseProcess] = None

    def start(self) -> None:
        self.process = self._ctx.Process(target=_child_main, name="alfish-async-unroll", daemon=True,
                                         args=(self._spec, self.shared, self._steps, self._errors, self._stop))
        self.process.start()
        logging.info("async unroll: child process %d started", self.process.pid)

    def publish(self, state: dict[str, torch.Tensor], progress: tuple[float, float, float]) -> int:
        """Make ``state`` the child's rollout policy from its next step on; returns the new version."""
        return self.shared.write(state, progress)

    def queue_length(self) -> int:
        try:
            return self._steps.qsize()
        except NotImplementedError:  # macOS
            return -1

    def collect(self, num_steps: Optional[int], max_steps: int = 0) -> list[ReceivedStep]:
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
                if time.monotonic() - last_arrival > self.stall_timeout_s:
                    raise AsyncUnrollError(f"the async unroll child (pid {self.process.pid}) is alive but sent no "
                                           f"env step for {self.stall_timeout_s:.0f} s; is the environment hung?")
                continue
            last_arrival = time.monotonic()
            exp_numpy, version, env_step_s = item
            received.append(ReceivedStep(nest.map_nest(torch.from_numpy, exp_numpy), version, env_step_s))
        return received

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
        """Stop the child (event, then terminate, then kill; each step waits at most ``timeout_s / 2``)."""
        if self.process is None:
            return
        self._stop.set()
        deadline = time.monotonic() + timeout_s / 2
        while self.process.is_alive() and time.monotonic() < deadline:
            self._drain()  # a child blocked on a full queue sees the stop event sooner
            self.process.join(timeout=0.05)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=timeout_s / 2)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=timeout_s / 2)
        self._drain()
        for q in (self._steps, self._errors):
            q.cancel_join_thread()
            q.close()
        if self.process.exitcode is not None:
            self.process.close()
        self.process = None

    def _drain(self) -> None:
        try:
            while True:
                self._steps.get_nowait()
        except (queue.Empty, OSError, ValueError):
            pass


# ------------------------------------------------------------------------------------------------- the child ----
def _child_main(spec: UnrollSpec, shared: SharedState, steps: Any, errors: Any, stop: Any) -> None:
    """Build env, transformers and algorithm from the spec; step until told to stop or the parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it then stops us
    env = None
    try:
        torch.set_num_threads(1)
        env, algorithm, transformer = _build(spec)
        tensors = rollout_state(algorithm, transformer)
        parent_alive = _parent_watch(spec.parent_pid)
        version = _load_parameters(shared, tensors, 0, parent_alive)
        view = transformer.rollout_view(update_stats=False)
        time_step = env.reset()
        next_tick = time.monotonic()
        with torch.inference_mode():
            while not stop.is_set() and parent_alive():
                version = _load_parameters(shared, tensors, version, parent_alive)
                alg_step = algorithm.rollout_step(view(time_step))
                exp = Experience.from_time_step(time_step, alg_step.output, alg_step.info)
                if spec.step_interval_s > 0:
                    next_tick = _pace(next_tick, spec.step_interval_s)
                start = time.monotonic()
                time_step = env.step(alg_step.output)
                item = (nest.map_nest(lambda x: x.numpy(), exp), version, time.monotonic() - start)
                if not _put(steps, item, stop, parent_alive):
                    break
    except BaseException:  # noqa: BLE001  (everything, including KeyboardInterrupt, goes to the parent)
        errors.put(traceback.format_exc())
        exit_code = 1
    else:
        exit_code = 0
    steps.cancel_join_thread()  # never block exit on a queue nobody reads any more
    if env is not None:
        try:
            env.close()
        except Exception:  # noqa: BLE001  (exiting anyway)
            pass
    errors.close()
    errors.join_thread()  # the traceback must reach the pipe before we exit
    # Skip interpreter teardown: C++ thread pools torn down at exit can abort ("terminate called without an active
    # exception") and turn a clean exit into SIGABRT.
    os._exit(exit_code)


def _build(spec: UnrollSpec) -> tuple[Any, Any, Any]:
    import gin

    from alfish.config.loading import register_configurables
    from alfish.config.trainer_config import TrainerConfig
    from alfish.envs.batched_env import create_environment
    from alfish.trainer.trainer import build_algorithm, seed_everything
    from alfish.transforms.base import build_transformers

    register_configurables()
    gin.parse_config(spec.config_text)
    config = TrainerConfig(root_dir=spec.root_dir)
    seed_everything(spec.seed + 104_729)  # action sampling in the child: its own stream
    env = create_environment(seed=spec.seed)
    transformer = build_transformers(config.data_transformer_ctor, env.observation_space)
    algorithm = build_algorithm(config, env, transformer)
    return env, algorithm, transformer


def _load_parameters(shared: SharedState, tensors: dict[str, torch.Tensor], have: int,
                     parent_alive: Callable[[], bool]) -> int:
    """Load the published parameters if their version moved; also sets the schedules' progress. Gives up (keeping
    the old parameters) when the parent dies while holding the lock: the main loop then exits."""
    if shared.version.value == have:
        return have
    from alfish.schedulers import update_progress

    with torch.inference_mode(False), torch.no_grad():
        read = shared.read_into(tensors, keep_waiting=parent_alive)
    if read is None:
        return have
    version, (iterations, env_steps, fraction) = read
    update_progress(iterations=int(iterations), env_steps=int(env_steps), fraction=fraction)
    return version


def _parent_watch(parent_pid: int) -> Callable[[], bool]:
    """A cheap check that the trainer still exists (a SIGKILLed parent cannot stop us)."""
    return lambda: os.getppid() == parent_pid


def _pace(next_tick: float, interval_s: float) -> float:
    """Sleep until ``next_tick``; returns the next one. Late steps do not cause a burst of catch-up steps."""
    now = time.monotonic()
    if next_tick > now:
        time.sleep(next_tick - now)
        now = next_tick
    return now + interval_s


def _put(steps: Any, item: Any, stop: Any, parent_alive: Callable[[], bool]) -> bool:
    """Put with a timeout, re-checking the stop event and the parent; False when we should exit instead."""
    while not stop.is_set() and parent_alive():
        try:
            steps.put(item, timeout=POLL_S)
            return True
        except queue.Full:
            continue
    return False


def as_time_step(exp: Experience) -> TimeStep:
    """The TimeStep fields of a received step (``prev_action`` is not stored; the chosen action stands in for it:
    the parent only uses this to update transformer statistics and episode metrics)."""
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
