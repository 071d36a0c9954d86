"""Signals as requests the training loop polls, and the crash-time "write a checkpoint?" question.

``SIGTERM``/``SIGINT`` ask the loop to stop after the current iteration (the trainer then checkpoints and exits with
``128 + signal``, the shell's convention); ``SIGUSR2`` asks for a checkpoint without stopping (e.g. before a cluster
preemption: ``kill -USR2 <pid>``). Handlers only set flags, arm a deadline and write one line to stderr with a raw
``os.write``: they never log (a handler runs between any two bytecodes of the main thread); the exit on a second
signal takes a log file's lock only with a timeout (``alfish.console.hard_exit``).

A stop always ends the process: when the current iteration has not ended ``stop_grace_s`` seconds after the signal
(an env step that never returns, a collective that waits forever), the watchdog thread ends it with ``128 + signal``
and one line saying where the main thread was stuck, without a checkpoint of the unfinished iteration (the last one
stays intact: ``alfish.console.hard_exit``). A second SIGTERM or SIGINT while a stop is pending ends it at once, the
same way. Neither prints a traceback.
"""
from __future__ import annotations

import logging
import math
import os
import select
import signal
import sys
import threading
import time
from typing import IO, Optional

from alfish.console.hard_exit import exit_note, hard_exit, thread_stack_note
from alfish.console.watchdog import Deadline

__all__ = ["SignalRequests", "confirm_checkpoint_on_crash", "stop_pending"]

logger = logging.getLogger(__name__)

_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT"))
_CHECKPOINT_SIGNALS = tuple(getattr(signal, name) for name in ("SIGUSR2",) if hasattr(signal, name))


_active: list["SignalRequests"] = []  # the instance entered now (at most one), for stop_pending()


def stop_pending() -> bool:
    """Whether a stop signal arrived and the training loop has not acted on it yet (long loops outside the trainer,
    e.g. an env replaying its logged actions on resume, poll it between steps and give up early)."""
    return bool(_active) and _active[0].stop_requested


def _say(text: str) -> None:
    """Write one line to stderr from a signal handler: a raw write, which cannot re-enter a buffered stream."""
    try:
        os.write(2, f"alfish: {text}\n".encode())
    except OSError:
        pass


class SignalRequests:
    """Context manager. Inside it SIGTERM and SIGINT set `stop_requested` (and record which signal), SIGUSR2 sets
    `checkpoint_requested`; the training loop polls these flags once per iteration. On exit the previous handlers are
    restored. A second SIGTERM or SIGINT while a stop is already pending ends the process at once (exit code
    ``128 + signal``, no traceback, no checkpoint). ``stop_grace_s``: when a stop was requested and the loop has not
    ended (left the ``with`` block) this many seconds later, the process ends the same way, naming where the main
    thread is stuck; ``extend_grace()`` grants the same time again (e.g. for the stop's own checkpoint). ``None``: no
    grace deadline. Only installs handlers in the main thread (otherwise it is a no-op with a debug log).

    A signal whose disposition is SIG_IGN on entry (e.g. SIGINT of a background job started by a non-interactive
    shell) stays ignored. Not reentrant: enter one instance at a time.

    Example::

        with SignalRequests() as sig:
            while not done:
                train_iter()
                if sig.checkpoint_requested:
                    sig.clear_checkpoint_request()  # before saving: a request arriving during the save is kept
                    save()
                if sig.stop_requested:
                    save(); break
        sys.exit(sig.exit_code())
    """

    def __init__(self, stop_grace_s: Optional[float] = None) -> None:
        if stop_grace_s is not None and not (isinstance(stop_grace_s, (int, float)) and math.isfinite(stop_grace_s)
                                             and stop_grace_s > 0):
            raise ValueError(f"stop_grace_s must be a finite number of seconds > 0 (or None), got {stop_grace_s!r}")
        self.stop_grace_s = stop_grace_s
        self._grace: Optional[Deadline] = None
        self.stop_requested: bool = False
        self.stop_signal: int | None = None
        self.checkpoint_requested: bool = False
        self._previous: dict[int, object] = {}
        self._entered = False

    def __enter__(self) -> "SignalRequests":
        if self._entered:
            raise RuntimeError("SignalRequests is already active; enter it once (it is not reentrant)")
        self._entered = True
        self.stop_requested, self.stop_signal, self.checkpoint_requested = False, None, False
        if threading.current_thread() is not threading.main_thread():
            logger.debug("SignalRequests entered outside the main thread; no signal handlers installed")
            return self
        if self.stop_grace_s is not None:
            self._grace = Deadline("the stop", self._on_grace_expired)  # (starts the watchdog thread once)
        try:
            for sig in _STOP_SIGNALS + _CHECKPOINT_SIGNALS:
                previous = signal.getsignal(sig)
                if previous == signal.SIG_IGN:
                    continue
                handler = self._on_stop if sig in _STOP_SIGNALS else self._on_checkpoint
                signal.signal(sig, handler)
                self._previous[sig] = previous
        except BaseException:
            self._restore()
            self._entered = False
            raise
        _active[:] = [self]
        return self

    def __exit__(self, *exc_info) -> None:
        self._restore()
        if self._grace is not None:
            self._grace.disarm()
        _active[:] = []
        self._entered = False

    def _restore(self) -> None:
        for sig, previous in self._previous.items():
            # getsignal returns None for a handler not installed from Python; the default is the best we can do.
            signal.signal(sig, signal.SIG_DFL if previous is None else previous)
        self._previous = {}

    def _on_stop(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.stop_requested:
            hard_exit(f"received {name} again while stopping; quitting now without a checkpoint of the unfinished "
                      f"iteration ({exit_note()})", 128 + signum)
            return  # (only while a checkpoint is being written: the exit follows right after it)
        self.stop_requested = True
        self.stop_signal = signum
        grace = f" (at most {self.stop_grace_s:g} s)" if self._grace is not None else ""
        _say(f"received {name}; stopping after the current iteration{grace}; send it again to quit now")
        if self._grace is not None:
            self._grace.arm(self.stop_grace_s, "the current iteration")

    def extend_grace(self, doing: str) -> None:
        """A pending stop's grace starts again, for ``doing`` (e.g. "writing the stop's checkpoint")."""
        if self._grace is not None and self.stop_requested:
            self._grace.arm(self.stop_grace_s, doing)

    def _on_grace_expired(self, deadline: Deadline, expires_at: float) -> None:
        """The watchdog thread's report: the main thread did not finish ``deadline.doing`` in time."""
        where, stack = thread_stack_note(threading.main_thread().ident)
        if not deadline.still_armed(expires_at):
            return
        name = signal.Signals(self.stop_signal).name if self.stop_signal is not None else "the stop signal"
        hard_exit(f"{deadline.doing} did not end within Trainer.stop_grace_s={self.stop_grace_s:g} s of {name}; "
                  f"quitting without a checkpoint of it ({exit_note()}); the main thread was at {where}",
                  self.exit_code() or 128 + int(signal.SIGTERM), f"the main thread's stack:\n{stack}")

    def _on_checkpoint(self, signum: int, frame) -> None:
        self.checkpoint_requested = True
        _say(f"received {signal.Signals(signum).name}; writing a checkpoint after the current iteration")

    def clear_checkpoint_request(self) -> None:
        """Acknowledge the checkpoint request; call it before writing the checkpoint, not after, so that a SIGUSR2
        arriving during the write is not lost."""
        self.checkpoint_requested = False

    def exit_code(self) -> int:
        """The process exit code: ``128 + signal number`` after a signal stop, else 0."""
        return 128 + int(self.stop_signal) if self.stop_signal is not None else 0


def confirm_checkpoint_on_crash(confirm: bool, stdin: IO | None = None, timeout_s: float = 60.0) -> bool:
    """Whether to write a checkpoint after a crash. If `confirm` is False -> True without asking. If True, it asks
    "Write a checkpoint before exiting? [Y/n]" ONLY when stdin is an interactive terminal, waiting at most timeout_s
    (select on stdin) and defaulting to yes; when stdin is not a TTY (batch job, pipe, /dev/null) it never reads
    stdin and returns True.

    Args:
        confirm: ask the user (ALF's ``confirm_checkpoint_upon_crash``).
        stdin: the stream to ask on; ``None`` means ``sys.stdin``.
        timeout_s: seconds to wait for an answer before writing the checkpoint anyway.

    Returns:
        False only when the user answers "n"/"no" (or presses Ctrl-C at the prompt); True otherwise.
    """
    if not confirm:
        return True
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s >= 0):
        raise ValueError(f"timeout_s must be a finite number of seconds >= 0, got {timeout_s!r}")
    stream = sys.stdin if stdin is None else stdin
    try:
        interactive = stream is not None and stream.isatty()
        fd = stream.fileno() if interactive else -1
    except (AttributeError, ValueError, OSError):  # no isatty/fileno, or a closed stream
        interactive = False
    if not interactive:
        logger.info("stdin is not a terminal; writing the checkpoint without asking")
        return True
    try:
        background = os.tcgetpgrp(fd) != os.getpgrp()
    except OSError:  # not our controlling terminal: reading it cannot stop us
        background = False
    if background:  # reading the terminal from a background job would stop the process (SIGTTIN)
        logger.info("running in the background of a terminal; writing the checkpoint without asking")
        return True

    try:
        sys.stderr.write("Write a checkpoint before exiting? [Y/n] ")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):  # no usable stderr: nobody would see the question
        return True
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                sys.stderr.write(f"\nno answer in {timeout_s:g} s; writing the checkpoint\n")
                return True
            try:
                ready, _, _ = select.select([fd], [], [], remaining)
            except (OSError, ValueError) as e:  # e.g. select unsupported on this stream
                logger.info("cannot wait on stdin (%s); writing the checkpoint", e)
                return True
            if ready:
                break
        answer = stream.readline()
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted; not writing a checkpoint\n")
        return False
    except (OSError, ValueError):
        return True
    if isinstance(answer, bytes):
        answer = answer.decode(errors="replace")
    return answer.strip().lower() not in ("n", "no")
