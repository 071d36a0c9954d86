"""The schedules: values that are functions of the run's progress (`Scheduler` and its gin-configurable kinds), and
`as_scheduler` / `current_value` for consumers that accept a number or a schedule.

A schedule registers itself for `scheduler_summaries` explicitly, with ``self._register()`` as the last line of its
class's constructor, so a schedule whose arguments were rejected is never listed.
"""
from __future__ import annotations

import bisect
import inspect
import itertools
import math
from collections.abc import Sequence
from typing import Any

import gin

from alfish.schedulers.progress import PROGRESS_TYPES, progress_record
from alfish.schedulers.registry import register, unregister
from alfish.schedulers.validation import Number, ScheduleError, is_number, quoted

CYCLE_MODES: tuple[str, ...] = ('triangular', 'cosine', 'sawtooth')

_PROGRESS = progress_record()
# gin selectors stay 'alfish.schedulers.<Name>', as when the schedules lived in one module.
_configurable = gin.configurable(module='alfish.schedulers')


class Scheduler:
    """A value that is a function of progress. Subclasses implement `value_at(progress)`.

    Calling the object (or `float()` of it) returns the value at the current progress of type `progress_type`.
    `name` is the unique name it has in `scheduler_summaries` (see `alfish.schedulers.registry`).

    A subclass with a constructor of its own ends it with ``self._register()``; one without is registered here.
    """

    _listed = True  # recorded for scheduler_summaries()
    #: Whether the value never changes (a number given where a schedule may be; ``ConstantScheduler``).
    constant = False

    def __init__(self, progress_type: str, name: str | None = None) -> None:
        cls = type(self).__name__
        if progress_type not in PROGRESS_TYPES:
            raise ScheduleError(f"{cls}.progress_type={progress_type!r} is unknown; use one of "
                                f"{quoted(PROGRESS_TYPES)}")
        if name is not None and (not isinstance(name, str) or not name):
            raise ScheduleError(f"{cls}.name={name!r} must be a non-empty string or None")
        self.progress_type = progress_type
        self._cached_version = -1
        self._cached_value = 0.0
        self._given_name = name
        self.name = name or cls  # made unique by _register
        if inspect.unwrap(type(self).__init__) is Scheduler.__init__:  # unwrap: gin wraps a configurable's __init__
            self._register()

    def _register(self) -> None:
        """Records this schedule for `scheduler_summaries` under a unique name, unless its class sets `_listed` False.

        The last line of every concrete constructor, once every argument has been accepted.
        """
        if self._listed:
            self.name = register(self, self._given_name)

    def value_at(self, progress: float) -> float:
        """The value when the progress measure equals `progress` (a fraction for 'percent', else a count)."""
        raise NotImplementedError

    def __call__(self) -> float:
        """The value at the current progress (cached until progress changes)."""
        version = _PROGRESS.version
        if version != self._cached_version:
            self._cached_value = float(self.value_at(_PROGRESS.get(self.progress_type)))
            self._cached_version = version
        return self._cached_value

    def __float__(self) -> float:
        return self()

    def __repr__(self) -> str:
        return f'{type(self).__name__}({self._describe()}, name={self.name!r})'

    def _describe(self) -> str:
        return f'progress_type={self.progress_type!r}'


class _Constant(Scheduler):
    """A fixed value, not listed in `scheduler_summaries` (what `as_scheduler` makes of a number)."""

    _listed = False
    constant = True

    def __init__(self, value: float, name: str | None = None) -> None:
        super().__init__('iterations', name)
        self.value = finite_number(f'{type(self).__name__}.value', value)
        self._register()

    def value_at(self, progress: float) -> float:
        return self.value

    def __call__(self) -> float:
        return self.value

    def _describe(self) -> str:
        return f'value={self.value!r}'


@_configurable
class ConstantScheduler(_Constant):
    """Always `value`; listed in `scheduler_summaries` (e.g. to see a hyperparameter in TensorBoard)."""

    _listed = True


@_configurable
class StepScheduler(Scheduler):
    """Piecewise constant: `v_k` once progress >= `p_k`, `start` before `p_0`.

    schedule: ``[(p_0, v_0), (p_1, v_1), ...]`` with strictly increasing progress points (in [0, 1] for 'percent',
        else counts of iterations or env steps).
    start: the value before `p_0`; required unless `p_0` is 0.
    """

    def __init__(self, progress_type: str, schedule: Sequence[tuple[Number, Number]],
                 start: float | None = None, name: str | None = None) -> None:
        super().__init__(progress_type, name)
        self.points, self.values = check_schedule('StepScheduler', progress_type, schedule)
        if start is None and self.points[0] > 0:
            raise ScheduleError(f"StepScheduler.start is required: the first progress point is {self.points[0]!r}, "
                                f"so the value before it must be given")
        self.start = None if start is None else finite_number('StepScheduler.start', start)
        self._register()

    def value_at(self, progress: float) -> float:
        k = bisect.bisect_right(self.points, progress) - 1
        return self.start if k < 0 else self.values[k]

    def _describe(self) -> str:
        return f'{super()._describe()}, schedule={list(zip(self.points, self.values))!r}, start={self.start!r}'


@_configurable
class LinearScheduler(Scheduler):
    """Piecewise linear through ``[(p_0, v_0), (p_1, v_1), ...]``; `v_0` before `p_0` and the last value after the
    last point. Progress points are strictly increasing (in [0, 1] for 'percent', else counts of iterations or env
    steps); use StepScheduler for jumps.
    """

    def __init__(self, progress_type: str, schedule: Sequence[tuple[Number, Number]],
                 name: str | None = None) -> None:
        super().__init__(progress_type, name)
        self.points, self.values = check_schedule('LinearScheduler', progress_type, schedule)
        self._register()

    def value_at(self, progress: float) -> float:
        points, values = self.points, self.values
        k = bisect.bisect_right(points, progress)
        if k == 0:
            return values[0]
        if k == len(points):
            return values[-1]
        weight = (progress - points[k - 1]) / (points[k] - points[k - 1])
        return values[k - 1] + weight * (values[k] - values[k - 1])

    def _describe(self) -> str:
        return f'{super()._describe()}, schedule={list(zip(self.points, self.values))!r}'


@_configurable
class ExponentialScheduler(Scheduler):
    """``initial_value * decay_rate ** (progress / decay_time)``: multiplied by `decay_rate` every `decay_time`.

    decay_rate: > 0 (below 1 decays, above 1 grows). decay_time: > 0, in units of the progress measure.
    """

    def __init__(self, progress_type: str, initial_value: float, decay_rate: float, decay_time: float,
                 name: str | None = None) -> None:
        super().__init__(progress_type, name)
        self.initial_value = finite_number('ExponentialScheduler.initial_value', initial_value)
        self.decay_rate = finite_number('ExponentialScheduler.decay_rate', decay_rate, positive=True)
        self.decay_time = finite_number('ExponentialScheduler.decay_time', decay_time, positive=True)
        self._register()

    def value_at(self, progress: float) -> float:
        return self.initial_value * self.decay_rate ** (progress / self.decay_time)

    def _describe(self) -> str:
        return (f'{super()._describe()}, initial_value={self.initial_value!r}, decay_rate={self.decay_rate!r}, '
                f'decay_time={self.decay_time!r}')


@_configurable
class CyclicalScheduler(Scheduler):
    """Repeats a cycle of length `period` (in units of the progress measure); give `value_range` or `base_schedule`.

    value_range: ``(a, b)``; the cycle starts at `a` and, by `mode`:
        'triangular': goes linearly to `b` at half the period and back to `a` at its end;
        'cosine': the same path along half a cosine wave each way (smooth at both ends);
        'sawtooth': goes linearly from `a` to `b` over the period, then jumps back to `a`.
      (`a` > `b` starts the cycle at the top.)
    base_schedule: any schedule, evaluated at ``progress % period`` (its own progress_type is ignored, and it is not
        listed in `scheduler_summaries` on its own); `mode` must then be left at its default.
    """

    def __init__(self, progress_type: str, period: float, value_range: Sequence[Number] | None = None,
                 base_schedule: Scheduler | None = None, mode: str = 'triangular',
                 name: str | None = None) -> None:
        super().__init__(progress_type, name)
        self.period = finite_number('CyclicalScheduler.period', period, positive=True)
        if (value_range is None) == (base_schedule is None):
            raise ScheduleError("CyclicalScheduler: give exactly one of value_range=(a, b) and base_schedule")
        if mode not in CYCLE_MODES:
            raise ScheduleError(f"CyclicalScheduler.mode={mode!r} is unknown; use one of {quoted(CYCLE_MODES)}")
        if base_schedule is not None:
            if not isinstance(base_schedule, Scheduler):
                raise ScheduleError(f"CyclicalScheduler.base_schedule must be a schedule, got "
                                    f"{type(base_schedule).__name__}")
            if mode != 'triangular':
                raise ScheduleError(f"CyclicalScheduler.mode={mode!r} applies to value_range only; with a "
                                    f"base_schedule the cycle is that schedule's shape")
            unregister(base_schedule)
            self.value_range = None
        else:
            if not (is_pair(value_range) and all(is_number(v) for v in value_range)):
                raise ScheduleError(f"CyclicalScheduler.value_range={value_range!r} must be a pair of numbers (a, b)")
            self.value_range = (float(value_range[0]), float(value_range[1]))
        self.base_schedule = base_schedule
        self.mode = mode
        self._register()

    def value_at(self, progress: float) -> float:
        phase = math.fmod(progress, self.period)
        if self.base_schedule is not None:
            return float(self.base_schedule.value_at(phase))
        a, b = self.value_range
        t = phase / self.period  # in [0, 1)
        if self.mode == 'sawtooth':
            height = t
        elif self.mode == 'triangular':
            height = 1.0 - abs(1.0 - 2.0 * t)
        else:  # cosine
            height = 0.5 * (1.0 - math.cos(2.0 * math.pi * t))
        return a + (b - a) * height

    def _describe(self) -> str:
        shape = (f'base_schedule={self.base_schedule!r}' if self.base_schedule is not None
                 else f'value_range={self.value_range!r}, mode={self.mode!r}')
        return f'{super()._describe()}, period={self.period!r}, {shape}'


def as_scheduler(value: Number | Scheduler) -> Scheduler:
    """`value` itself if it is a schedule; a number becomes a constant schedule (not listed in summaries).

    Lets a consumer accept both: ``self._epsilon = as_scheduler(epsilon)``, then ``self._epsilon()`` when needed.
    """
    if isinstance(value, Scheduler):
        return value
    if is_number(value):
        return _Constant(value)
    raise TypeError(f"expected a number or a schedule, got {type(value).__name__}: {value!r}")


def current_value(value: Number | Scheduler) -> float:
    """The current value of a number or a schedule, as a float in the hyperparameter's own units (use ``int(...)``
    for counts such as periods)."""
    if isinstance(value, Scheduler):
        return value()
    if is_number(value):
        return float(value)
    raise TypeError(f"expected a number or a schedule, got {type(value).__name__}: {value!r}")


def finite_number(parameter: str, value: Any, positive: bool = False) -> float:
    """`value` as a float; ScheduleError naming `parameter` if it is not a finite number (or not > 0 when required)."""
    if not is_number(value) or not math.isfinite(value):
        raise ScheduleError(f"{parameter}={value!r} must be a finite number")
    if positive and value <= 0:
        raise ScheduleError(f"{parameter}={value!r} must be > 0")
    return float(value)


def is_pair(value: Any) -> bool:
    """A sequence of exactly two items that is not a string."""
    return not isinstance(value, (str, bytes)) and isinstance(value, Sequence) and len(value) == 2


def check_schedule(cls: str, progress_type: str,
                   schedule: Sequence[tuple[Number, Number]]) -> tuple[list[float], list[float]]:
    """The progress points and values of a ``[(p, v), ...]`` schedule; ScheduleError naming `cls`.schedule if not
    valid (points strictly increasing, >= 0, and <= 1 for 'percent' progress)."""
    where = f'{cls}.schedule'
    if isinstance(schedule, (str, bytes)) or not isinstance(schedule, Sequence) or not schedule:
        raise ScheduleError(f"{where}={schedule!r} must be a non-empty list of (progress, value) pairs")
    for pair in schedule:
        if not (is_pair(pair) and all(is_number(x) and math.isfinite(x) for x in pair)):
            raise ScheduleError(f"{where}: {pair!r} is not a (progress, value) pair of finite numbers")
    points, values = [float(p) for p, _ in schedule], [float(v) for _, v in schedule]
    for previous, point in itertools.pairwise(points):
        if point <= previous:
            raise ScheduleError(f"{where}: progress points must be strictly increasing, but {point:g} follows "
                                f"{previous:g}")
    if points[0] < 0:
        raise ScheduleError(f"{where}: progress point {points[0]:g} is negative")
    if progress_type == 'percent' and points[-1] > 1:
        raise ScheduleError(f"{where}: progress point {points[-1]:g} is above 1; 'percent' progress is the fraction "
                            f"of the run done, in [0, 1]")
    return points, values
