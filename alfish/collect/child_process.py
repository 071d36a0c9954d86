"""How alfish's child processes start, fail and end (the async unroll child, the async evaluator child): the parts
both children and both parents share.

``without_rank_variables`` is how both are started: the child gets the trainer's environment minus torchrun's rank
variables (it is not a rank of the job, and tools that find a job's ranks by them must not take it for one).
``resolved_acting_device`` is where a child's policy copy acts (``DevicePolicy.rollout_device``), resolved in the
trainer with its ``LOCAL_RANK`` and sent in the child's spec; ``build_acting_policy`` builds that copy in the child,
on exactly that device. ``ChildChannels`` are the queues and the stop flag a child shares with its trainer.
``start_child`` is the child's first act: ignore Ctrl-C (the trainer's to handle; it then stops the child), one torch
thread, the trainer's gin config parsed here (with the ``gin.constant`` values it names, ``gin_constants``), and a
check that the trainer still lives (``parent_watch``). ``finish_child`` is the child's last act: release its
resources, make sure its traceback (if any) reached the parent, and leave without interpreter teardown. ``reap_child``
is the parent's: terminate, then kill, each step bounded, then close the queues without waiting on them.
``ChildProcessFailed`` is what the parent raises when a child failed, died, stalled or hung.

Both children are non-daemonic, so that their envs may be subprocesses (``vectorization='async'``), which a daemonic
process cannot have; their parents register ``close`` with ``atexit`` so that the interpreter's exit, which joins
non-daemonic children, cannot wait on one. Both are stopped by a shared flag (``RawValue``), not an ``Event``:
``Event.set()`` waits without a timeout for the waiters it wakes, and a waiter that was SIGKILLed never wakes.
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import multiprocessing.util
import os
import pickle
import signal
from typing import Any, Callable, Iterable, Iterator, Optional, Protocol

import torch

#: torchrun's per-process identity; a child of a rank is not a rank of the job.
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE",
                  "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_ERROR_FILE")


def resolved_acting_device() -> torch.device:
    """``DevicePolicy.rollout_device`` resolved here, in the trainer, where torchrun's ``LOCAL_RANK`` is set: 'cuda'
    is this rank's GPU, ``cuda:(LOCAL_RANK % device_count())``. A child gets no rank variables, so it must not resolve
    it again (it would pick ``cuda:0`` on every rank); its spec carries this device instead."""
    from alfish.learn.device import DevicePolicy

    return DevicePolicy().acting_device()


def build_acting_policy(config: Any, env_spec: Any, device: torch.device) -> tuple[Any, Any]:
    """``(transformer, algorithm)``: the policy copy of a child, built from the trainer's ``config`` and the training
    envs' ``env_spec`` as the trainer built its own, then moved to ``device`` (its spec's ``acting_device``), which is
    also made CUDA's current device there (streams, events and the CUDA context then belong to that GPU alone)."""
    from alfish.algorithms.build import build_policy

    if device.type == "cuda":
        torch.cuda.set_device(device)
    transformer, algorithm = build_policy(config, env_spec)
    return transformer.to(device), algorithm.to(device)


class ChildProcessFailed(RuntimeError):
    """An alfish child process (the async unroller, the async evaluator) failed, died, stalled or hung; the message
    says which child, what happened and, for an exception, carries the child's traceback."""


@dataclasses.dataclass(frozen=True)
class ChildChannels:
    """What a child and its trainer share besides the parameters, passed to the child at spawn.

    results: child -> trainer, the child's output (the unroll child's env steps, the evaluator's results).
    errors: child -> trainer, a failure with its traceback.
    commands: trainer -> child.
    stop: a shared flag (``RawValue('b')``) the trainer sets to stop the child (a flag, not an ``Event``: see above).
    replies: child -> trainer, the unroll child's EnvSpec (None for the evaluator).
    """

    results: Any
    errors: Any
    commands: Any
    stop: Any
    replies: Any = None


class ChildSpec(Protocol):
    """The fields of a child's spec (``UnrollSpec``, ``EvalSpec``) that ``start_child`` reads."""

    config_text: str  # the trainer's operative gin config
    root_dir: str
    gin_constants: dict[str, Any]  # the trainer's gin.constant values (``gin_constants()``)
    parent_pid: int


def start_child(spec: ChildSpec) -> tuple[Any, Callable[[], bool]]:
    """The first acts of a child, inside its ``try`` (a failure goes to the trainer): Ctrl-C ignored, one torch
    thread, ``spec``'s config parsed (``parse_config``). Returns the ``TrainerConfig`` and ``parent_watch``'s check."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it then stops us
    torch.set_num_threads(1)
    config = parse_config(spec.config_text, spec.root_dir, spec.gin_constants)
    return config, parent_watch(spec.parent_pid)


def parent_watch(parent_pid: int) -> Callable[[], bool]:
    """A cheap check that the trainer still exists (a SIGKILLed parent cannot stop us)."""
    return lambda: os.getppid() == parent_pid


def gin_constants() -> dict[str, Any]:
    """The ``gin.constant`` values registered in this process that can be pickled. A config text refers to a constant
    by name (``%NAME``); a child parsing it has only the constants its own imports register."""
    from gin import config as gin_config

    constants = {}
    for name, value in gin_config._CONSTANTS.items():  # (gin has no public accessor)
        try:
            pickle.dumps(value)
        except Exception:  # noqa: BLE001  (not shippable: the child then reports the unknown constant)
            continue
        constants[name] = value
    return constants


def parse_config(config_text: str, root_dir: str, constants: Optional[dict[str, Any]] = None) -> Any:
    """Parse the trainer's config text in a child: alfish's configurables, the modules the text imports (they may
    register constants), then the trainer's ``constants`` not registered yet, then the text. Returns the
    ``TrainerConfig`` it describes."""
    import gin
    from gin import config as gin_config

    from alfish.config.registration import register_configurables
    from alfish.config.trainer_config import TrainerConfig

    register_configurables()
    _import_modules_of(config_text)
    for name, value in (constants or {}).items():
        if not gin_config._CONSTANTS.matching_selectors(name):
            gin.constant(name, value)
    gin.parse_config(config_text)
    return TrainerConfig(root_dir=root_dir)


def _import_modules_of(config_text: str) -> None:
    """Import the modules ``config_text``'s import statements name (a failure is left for the parse to report)."""
    import importlib

    from gin import config_parser

    class NoValues(config_parser.ParserDelegate):
        def configurable_reference(self, scoped_name: str, evaluate: bool) -> None:
            return None

        def macro(self, scoped_name: str) -> None:
            return None

    for statement in config_parser.ConfigParser(config_text, NoValues()):
        if isinstance(statement, config_parser.ImportStatement):
            try:
                importlib.import_module(statement.module)
            except ImportError:
                pass


@contextlib.contextmanager
def without_rank_variables() -> Iterator[None]:
    """``os.environ`` without torchrun's rank variables while a child is spawned (spawn passes the environment as it
    is then; so does the start of multiprocessing's resource tracker, which the first shared lock may cause);
    restored afterwards."""
    saved = {name: os.environ.pop(name) for name in RANK_VARIABLES if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def spawn_child(ctx: Any, target: Callable[..., None], name: str, args: tuple, close: Callable[[], None]) -> Any:
    """Start ``target(*args)`` as the non-daemonic child process ``name`` of the spawn context ``ctx``, without the
    rank variables, and register the parent's ``close`` to run at exit. Not a daemon, so that the child's envs may be
    subprocesses (``vectorization='async'``), which a daemon cannot have; and since the interpreter's exit joins
    non-daemonic children, ``close`` (which stops and reaps it, bounded) runs at exit too, registered after
    multiprocessing's own exit hook so it runs before it. Returns the started process."""
    process = ctx.Process(target=target, name=name, daemon=False, args=args)
    with without_rank_variables():
        process.start()
    atexit.register(close)
    return process


def flush_queue(items: Any, timeout_s: float) -> bool:
    """Close the multiprocessing queue ``items`` and wait at most ``timeout_s`` for its feeder thread to write every
    item put on it into the pipe. True when all were written: the pipe then holds only whole items, and the parent may
    read them after this process is gone. False when the pipe stayed full (nobody read it): the feeder may be cut off
    in the middle of an item when the process exits, so the parent must not read the queue."""
    import threading

    items.close()
    writer = threading.Thread(target=items.join_thread, name="alfish-flush", daemon=True)
    writer.start()
    writer.join(timeout_s)
    return not writer.is_alive()


def finish_child(resources: Iterable[Any], results: Any, errors: Any, exit_code: int) -> None:
    """Close ``resources`` (the ``None`` ones skipped, failures ignored: exiting anyway), never block on ``results`` (a
    queue nobody may read any more), flush ``errors`` (the traceback must reach the pipe), then ``os._exit``: C++ thread
    pools torn down at exit can abort ("terminate called without an active exception") and turn a clean exit into
    SIGABRT."""
    results.cancel_join_thread()
    for resource in resources:
        if resource is not None:
            try:
                resource.close()
            except Exception:  # noqa: BLE001  (exiting anyway)
                pass
    errors.close()
    errors.join_thread()
    # What multiprocessing's own exit hook does first: the finalizers of priority >= 0 (unlink the semaphores of the
    # queues our env workers used, close queues), none of which waits; os._exit skips them, and the resource tracker
    # would then warn of "leaked semaphore objects" at the end of the run.
    multiprocessing.util._run_finalizers(0)
    os._exit(exit_code)


def wake_child(process: Any) -> None:
    """Continue ``process`` if it is stopped (SIGSTOP, a debugger, Ctrl-Z): a stopped process acts on neither a stop
    flag nor SIGTERM until it runs again, so closing it would wait out every timeout before SIGKILL. SIGCONT does
    nothing to a running process."""
    if process.pid is not None and process.is_alive():
        try:
            os.kill(process.pid, signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            pass


def reap_child(process: Any, queues: Iterable[Any], timeout_s: float) -> None:
    """After the child was asked to stop and given time: terminate it, then kill it (each waited on at most
    ``timeout_s / 2``), close ``queues`` without joining their feeder threads, and release the process object."""
    if process.is_alive():
        wake_child(process)
        process.terminate()
        process.join(timeout=timeout_s / 2)
    if process.is_alive():
        process.kill()
        process.join(timeout=timeout_s / 2)
    for q in queues:
        q.cancel_join_thread()
        q.close()
    if process.exitcode is not None:
        process.close()
