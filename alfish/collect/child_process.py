"""How alfish's child processes end (the async unroll child, the async evaluator child): shared by both sides.

``without_rank_variables`` is how both are started: the child gets the trainer's environment minus torchrun's rank
variables (it is not a rank of the job, and tools that find a job's ranks by them must not take it for one).
``finish_child`` is the child's last act: release its resources, make sure its traceback (if any) reached the parent,
and leave without interpreter teardown. ``reap_child`` is the parent's: terminate, then kill, each step bounded, then
close the queues without waiting on them.

Both children are non-daemonic, so that their envs may be subprocesses (``vectorization='async'``), which a daemonic
process cannot have; their parents register ``close`` with ``atexit`` so that the interpreter's exit, which joins
non-daemonic children, cannot wait on one. Both are stopped by a shared flag (``RawValue``), not an ``Event``:
``Event.set()`` waits without a timeout for the waiters it wakes, and a waiter that was SIGKILLed never wakes.
"""
from __future__ import annotations

import contextlib
import multiprocessing.util
import os
from typing import Any, Iterable, Iterator

#: torchrun's per-process identity; a child of a rank is not a rank of the job.
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE",
                  "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_ERROR_FILE")


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


def reap_child(process: Any, queues: Iterable[Any], timeout_s: float) -> None:
    """After the child was asked to stop and given time: terminate it, then kill it (each waited on at most
    ``timeout_s / 2``), close ``queues`` without joining their feeder threads, and release the process object."""
    if process.is_alive():
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
