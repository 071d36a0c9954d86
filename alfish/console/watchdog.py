"""Deadlines watched by one daemon thread: the guard against a main thread that never comes back (a hung in-process
env step, an iteration that outlives the grace period after SIGTERM).

A ``Deadline`` is armed before the guarded call and disarmed after it. Arming and disarming are two attribute
writes (no lock, no thread started, no syscall besides reading the monotonic clock: well under a microsecond), so a
``Deadline`` can guard every env step, and it can be armed from a signal handler. The watchdog thread (one per
process, started with the first ``Deadline``) wakes at the soonest armed deadline, or every ``IDLE_WAKE_S`` seconds,
and calls ``on_expire(deadline)`` for each deadline that passed while armed: a deadline is only late by at most
``IDLE_WAKE_S`` (the thread may have gone to sleep just before it was armed).

``on_expire`` runs in the watchdog thread; it typically reports where the guarded thread is stuck
(``alfish.console.hard_exit.thread_stack_note(deadline.thread_id)``) and ends the process (``hard_exit``). It should
check ``deadline.still_armed(expires_at)`` last: the guarded call may have returned meanwhile.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Callable, Optional

__all__ = ["Deadline", "IDLE_WAKE_S"]

#: The longest the watchdog thread sleeps when nothing is armed, i.e. the most a deadline may be late (seconds).
IDLE_WAKE_S = 0.5

logger = logging.getLogger(__name__)


class Deadline:
    """One guarded call at a time (module docstring).

    what: what is guarded, for ``on_expire`` (e.g. "env 'CartPole-v1'").
    on_expire: ``on_expire(deadline, expires_at)``, called in the watchdog thread once a deadline passed armed.
    """

    __slots__ = ("what", "on_expire", "timeout_s", "doing", "thread_id", "expires_at", "__weakref__")

    def __init__(self, what: str, on_expire: Callable[["Deadline", float], None]) -> None:
        self.what, self.on_expire = what, on_expire
        self.timeout_s = 0.0
        self.doing = ""
        self.thread_id: Optional[int] = None
        self.expires_at: Optional[float] = None
        _watchdog().add(self)

    def arm(self, timeout_s: float, doing: str) -> None:
        """Start guarding the calling thread's next ``timeout_s`` seconds; ``doing`` says what it does ("step()")."""
        self.timeout_s, self.doing, self.thread_id = timeout_s, doing, threading.get_ident()
        self.expires_at = time.monotonic() + timeout_s  # last: the watchdog reads the fields above once it is set

    def rearm(self) -> None:
        """Guard another ``timeout_s`` seconds of the same thing (progress was made, e.g. one replayed step)."""
        if self.expires_at is not None:
            self.expires_at = time.monotonic() + self.timeout_s

    def disarm(self) -> None:
        self.expires_at = None

    def still_armed(self, expires_at: float) -> bool:
        """Whether the arming that set ``expires_at`` is still the current one (its call has not returned)."""
        return self.expires_at is expires_at


class _Watchdog:
    """The process's watchdog thread and the deadlines it watches (weakly: a deadline nobody holds is forgotten)."""

    def __init__(self) -> None:
        self._deadlines: "weakref.WeakSet[Deadline]" = weakref.WeakSet()
        self._lock = threading.Lock()  # guards the set against the thread iterating it; never taken when arming
        self._thread: Optional[threading.Thread] = None

    def add(self, deadline: Deadline) -> None:
        with self._lock:
            self._deadlines.add(deadline)
            if self._thread is None or not self._thread.is_alive():  # (a fork leaves the child without the thread)
                self._thread = threading.Thread(target=self._run, name="alfish-watchdog", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            now = time.monotonic()
            wake = now + IDLE_WAKE_S
            with self._lock:
                deadlines = list(self._deadlines)
            for deadline in deadlines:
                expires_at = deadline.expires_at
                if expires_at is None:
                    continue
                if now < expires_at:
                    wake = min(wake, expires_at)
                    continue
                try:
                    deadline.on_expire(deadline, expires_at)
                except Exception:  # noqa: BLE001  (the watchdog must outlive a failing report)
                    logger.exception("the watchdog's report for %s failed", deadline.what)
                    deadline.disarm()
            del deadlines
            time.sleep(max(0.0, wake - time.monotonic()) + 0.001)


_WATCHDOG = _Watchdog()


def _watchdog() -> _Watchdog:
    return _WATCHDOG
