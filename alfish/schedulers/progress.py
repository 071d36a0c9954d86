"""How far the run is: the process-wide `TrainingProgress` record that schedules read, and the functions acting on it.

It is per process: a child process (async unroller, env worker) sees progress 0 unless its parent sends the values
and the child calls `update_progress` itself.
"""
from __future__ import annotations

import sys
import threading

from alfish.schedulers.validation import Number, ScheduleError, is_number, quoted

# 'iterations': training iterations completed; 'env_steps': env steps taken, summed over envs; 'percent': the fraction
# of the run done, in [0, 1] (the name is ALF's).
PROGRESS_TYPES: tuple[str, ...] = ('percent', 'iterations', 'env_steps')


class TrainingProgress:
    """How far the run is: iterations, env steps and the fraction done ('percent').

    (Named apart from ``alfish.console.progress.Progress``, the progress bar.) One process-wide instance is returned
    by `progress_record()`; the module functions `update_progress`, `get_progress` and `reset_progress` act on it.

    'percent' is the last `fraction` given; when an update gives no fraction but a total is known (given in this or
    an earlier update), it is recomputed as ``max(iterations / total_iterations, env_steps / total_env_steps)`` over
    the totals known (a run bounded by both ends at whichever comes first). Fractions are clamped to [0, 1].

    `version` increases on every update and reset, so schedules can cache their value between updates.
    """

    _versions = iter(range(1, sys.maxsize))  # process-wide, so a reset never repeats a version a schedule cached

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Back to the start: every measure 0, no totals, 'percent' unknown."""
        with self._lock:
            self._values: dict[str, Number] = {'iterations': 0, 'env_steps': 0, 'percent': 0.0}
            self._totals: dict[str, Number] = {}
            self._percent_known = False
            self.version = next(self._versions)

    def update(self, *, iterations: int | None = None, env_steps: int | None = None,
               fraction: float | None = None, total_iterations: int | None = None,
               total_env_steps: int | None = None) -> None:
        """Sets the measures given (None: unchanged): counts of iterations completed and env steps taken (summed over
        envs), the fraction of the run done, and the run's length in iterations or env steps (see the class docstring).

        Raises:
            ScheduleError (a ValueError): a negative count or fraction, a NaN, or a total that is not positive.
        """
        for name, value in (('iterations', iterations), ('env_steps', env_steps), ('fraction', fraction)):
            if value is not None and not (is_number(value) and value >= 0):
                raise ScheduleError(f"update_progress: {name}={value!r} must be a number >= 0")
        for name, value in (('total_iterations', total_iterations), ('total_env_steps', total_env_steps)):
            if value is not None and not (is_number(value) and value > 0):
                raise ScheduleError(f"update_progress: {name}={value!r} must be a number > 0")
        with self._lock:
            for measure, value in (('iterations', iterations), ('env_steps', env_steps)):
                if value is not None:
                    self._values[measure] = value
            for measure, total in (('iterations', total_iterations), ('env_steps', total_env_steps)):
                if total is not None:
                    self._totals[measure] = total
            if fraction is None and self._totals:
                fraction = max(self._values[measure] / total for measure, total in self._totals.items())
            if fraction is not None:
                self._values['percent'] = min(float(fraction), 1.0)
                self._percent_known = True
            self.version = next(self._versions)

    def get(self, measure: str) -> Number:
        """The current value of `measure` ('percent': a fraction in [0, 1]; 'iterations' or 'env_steps': counts).

        Raises:
            ScheduleError (a ValueError): an unknown measure.
            RuntimeError: 'percent' asked after iterations or env steps were reported but never the run's length.
        """
        if measure not in PROGRESS_TYPES:
            raise ScheduleError(f"progress measure {measure!r} is unknown; use one of {quoted(PROGRESS_TYPES)}")
        values = self._values
        if measure == 'percent' and not self._percent_known and (values['iterations'] or values['env_steps']):
            raise RuntimeError("a 'percent' schedule needs the run's length, but progress was updated without it: "
                               "pass update_progress(fraction=...) or total_iterations/total_env_steps")
        return values[measure]

    def as_dict(self) -> dict[str, Number]:
        """Every measure's current value (with 'percent' as stored, even if never set)."""
        return dict(self._values)


_PROGRESS = TrainingProgress()


def progress_record() -> TrainingProgress:
    """The process-wide progress record."""
    return _PROGRESS


# The process-wide record's methods: the trainer calls `reset_progress()` when a run starts and, once per iteration
# before training on it, ``update_progress(iterations=..., env_steps=..., fraction=iteration / expected_iterations)``.
update_progress = _PROGRESS.update
get_progress = _PROGRESS.get
reset_progress = _PROGRESS.reset
