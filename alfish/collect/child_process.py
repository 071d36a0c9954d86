"""How alfish's child processes end (the async unroll child, the async evaluator child): shared by both sides.

``finish_child`` is the child's last act: release its resources, make sure its traceback (if any) reached the parent,
and leave without interpreter teardown. ``reap_child`` is the parent's: terminate, then kill, each step bounded, then
close the queues without waiting on them.
"""
from __future__ import annotations

import os
from typing import Any, Iterable


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
