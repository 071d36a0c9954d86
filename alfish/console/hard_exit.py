"""Ending the process at once, from a watchdog thread or a signal handler, when the main thread cannot be trusted to
end it (it is stuck in an env's code, or the user asked twice).

``hard_exit(line, code, details)`` writes ``line`` to stderr as one raw ``os.write`` (no lock of a buffered stream
is taken: the stuck main thread may hold one), hands ``line`` and ``details`` (e.g. a full stack) to the log FILE
handlers only (each handler's lock is taken with a timeout), asks the child processes to terminate (SIGTERM, not
awaited: env workers, the unroll or evaluation child), and ends the process with ``os._exit(code)``: no ``finally``
blocks, no ``atexit`` handlers, no interpreter shutdown that could wait on the stuck thread.

Why this never leaves a half-written checkpoint: a checkpoint is written into a temporary directory and renamed into
place (``alfish.rundir.checkpoint``), so a process that ends during a write leaves that temporary directory (removed
by the next save) and every ``ckpt-<step>`` complete. The one window where a rename could be cut in two (a step saved
twice: the old directory is moved aside, then the new one moved in) is covered by ``critical_section()``: the trainer
writes checkpoints inside it, and an exit requested meanwhile waits for it to end (at most ``CRITICAL_WAIT_S``; from
a signal handler, which runs in the main thread that is writing, it happens right after the section ends).
"""
from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import sys
import threading
import time
import traceback
from typing import Iterator, Optional

__all__ = ["CRITICAL_WAIT_S", "critical_section", "exit_note", "hard_exit", "log_file_paths", "set_exit_note",
           "thread_stack_note"]

#: The longest an exit requested from another thread waits for a checkpoint being written (seconds).
CRITICAL_WAIT_S = 30.0
#: The longest the exit waits for a log handler's lock (held by the stuck main thread, it would never be released).
_LOG_LOCK_WAIT_S = 1.0

_state = {"critical": 0, "pending": None, "note": "no checkpoint of this run was written yet"}


def set_exit_note(note: str) -> None:
    """What a hard exit's line ends with, e.g. "the last checkpoint, .../ckpt-00000040, is intact" (the trainer sets
    it after each checkpoint)."""
    _state["note"] = note


def exit_note() -> str:
    return _state["note"]


@contextlib.contextmanager
def critical_section() -> Iterator[None]:
    """A block (writing a checkpoint) that a hard exit does not cut short; main thread only."""
    _state["critical"] += 1
    try:
        yield
    finally:
        _state["critical"] -= 1
        pending = _state["pending"]
        if _state["critical"] == 0 and pending is not None:
            _exit_now(*pending)


def hard_exit(line: str, code: int, details: str = "") -> None:
    """End the process with ``code`` after one ``line`` on stderr (module docstring). Returns only when called in
    the main thread inside a ``critical_section`` (a signal handler): the exit then happens when the section ends."""
    if _state["critical"]:
        if threading.current_thread() is threading.main_thread():
            _state["pending"] = (line, code, details)
            return
        deadline = time.monotonic() + CRITICAL_WAIT_S
        while _state["critical"] and time.monotonic() < deadline:
            time.sleep(0.01)
    _exit_now(line, code, details)


def _exit_now(line: str, code: int, details: str) -> None:
    try:
        os.write(2, f"alfish: {line}\n".encode(errors="replace"))
    except OSError:
        pass
    _log_to_files(line, details)
    _terminate_children()
    os._exit(code)


def _file_handlers() -> list[logging.FileHandler]:
    return [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]


def log_file_paths() -> list[str]:
    """The files the root logger writes to (where ``hard_exit`` puts its details)."""
    return [h.baseFilename for h in _file_handlers()]


def _log_to_files(line: str, details: str) -> None:
    """``line`` (and ``details`` below it) as an ERROR record in each log file; stderr got the line already."""
    record = logging.makeLogRecord({"levelno": logging.ERROR, "levelname": "ERROR", "name": "alfish",
                                    "msg": "%s", "args": (line + (f"\n{details}" if details else ""),)})
    for handler in _file_handlers():
        if not handler.lock or not handler.lock.acquire(timeout=_LOG_LOCK_WAIT_S):
            continue  # the stuck thread holds it: the line on stderr has to do
        try:
            handler.emit(record)
            handler.flush()
        except Exception:  # noqa: BLE001  (a log file that cannot be written must not stop the exit)
            pass
        finally:
            handler.lock.release()


def _terminate_children() -> None:
    """SIGTERM to every child process multiprocessing started (not awaited: each ends on its own, or is orphaned
    and notices its closed pipes)."""
    try:
        children = multiprocessing.active_children()
    except Exception:  # noqa: BLE001
        return
    for child in children:
        try:
            child.terminate()
        except Exception:  # noqa: BLE001
            pass


def thread_stack_note(thread_id: Optional[int] = None, innermost: int = 3) -> tuple[str, str]:
    """``(where, full)``: the innermost ``innermost`` frames of a thread's Python stack (default: the main thread's)
    as one line, innermost first (``file.py:LINE in func: `source` <- file.py:LINE in caller ...``), and the whole
    stack as text."""
    ident = threading.main_thread().ident if thread_id is None else thread_id
    frame = sys._current_frames().get(ident)
    if frame is None:
        return "(its stack is not available)", ""
    frames = traceback.extract_stack(frame)
    parts = []
    for summary in reversed(frames[-innermost:]):
        source = f": `{summary.line.strip()}`" if summary.line and not parts else ""
        parts.append(f"{_short_path(summary.filename)}:{summary.lineno} in {summary.name}{source}")
    return " <- ".join(parts), "".join(traceback.format_list(frames)).rstrip()


def _short_path(path: str) -> str:
    """``path`` from its package folder on (``alfish/envs/latency.py``, ``gymnasium/vector/...``) or as it is."""
    parts = path.replace(os.sep, "/").split("/")
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1:])
    if "alfish" in parts:
        return "/".join(parts[len(parts) - 1 - parts[::-1].index("alfish"):])
    return path
