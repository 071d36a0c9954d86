"""The hang guard of in-process envs (``vectorization='sync'`` or ``'envpool'``): a step or reset that takes longer than
``create_environment.step_timeout_s`` ends the process, as a hung env worker (``alfish.envs.workers``) ends the run.

An env stepped in this process cannot be stopped or interrupted from outside (its code may hold the main thread in a
loop, a sleep or a C call), so the watchdog thread (``alfish.console.watchdog``) ends the process instead: one line
on stderr naming the env, the call and the innermost frames of the stuck thread; the whole stack in the log file
(``ROOT_DIR/log.txt`` when training); exit code 1. No checkpoint is cut short (``alfish.console.hard_exit``): a step
never runs while a checkpoint is written, and checkpoints are renamed into place whole.

Cost per guarded call: two attribute writes and a clock read (measured in ``tests/envs/test_step_watch.py``).
"""
from __future__ import annotations

from alfish.console.hard_exit import exit_note, hard_exit, log_file_paths, thread_stack_note
from alfish.console.watchdog import Deadline

#: The exit code of a run ended by a hung in-process env (as for any failure during training).
HUNG_ENV_EXIT_CODE = 1


class StepWatch:
    """Guards one batched env's in-process calls: ``arm(doing)`` before, ``disarm()`` after; ``rearm()`` when a long
    call made progress (a replayed step of an exact resume)."""

    def __init__(self, env_name: str, vectorization: str, timeout_s: float) -> None:
        self.env_name, self.vectorization, self.timeout_s = env_name, vectorization, float(timeout_s)
        self._deadline = Deadline(f"env '{env_name}'", self._on_expire)

    def arm(self, doing: str) -> None:
        self._deadline.arm(self.timeout_s, doing)

    def rearm(self) -> None:
        self._deadline.rearm()

    def disarm(self) -> None:
        self._deadline.disarm()

    def _on_expire(self, deadline: Deadline, expires_at: float) -> None:
        where, stack = thread_stack_note(deadline.thread_id)
        if not deadline.still_armed(expires_at):
            return  # it returned while the stack was read
        files = log_file_paths()
        full = f"; its whole stack is in {files[0]}" if files else ""
        hard_exit(f"env '{self.env_name}' did not return from {deadline.doing} within create_environment."
                  f"step_timeout_s={self.timeout_s:g} s (vectorization='{self.vectorization}', in this process): it "
                  f"hung at {where}{full}; quitting ({exit_note()}); fix the env, or raise step_timeout_s if it is "
                  "only slow", HUNG_ENV_EXIT_CODE, f"the stack of the thread stepping env '{self.env_name}':\n{stack}")
