"""Progress-based schedules for any numeric hyperparameter (learning rates, epsilon, tau, PER alpha/beta, ...).

A schedule is a callable object whose value is a function of the run's progress. The trainer reports progress once
per iteration; consumers read the current value when they need it::

    # in a conf
    SacAlgorithm.actor_lr = @actor/LinearScheduler()
    actor/LinearScheduler.progress_type = 'percent'
    actor/LinearScheduler.schedule = [(0, 1e-3), (1, 1e-4)]

    # the trainer, when building the optimizer (torch needs numbers as learning rates)
    groups, self.lr_schedules = split_lr_schedules(self.algorithm.param_groups())
    # and once per iteration, before training on it
    update_progress(iterations=self.iteration, env_steps=self.env_steps, fraction=self.iteration / expected)
    update_optimizer_lrs(self.optimizer, self.lr_schedules)

    # an algorithm, for any hyperparameter that may be a number or a schedule
    self._tau = as_scheduler(target_update_tau)     # in __init__
    tau = self._tau()                               # in after_update: a Python float, no host sync

Progress measures (`PROGRESS_TYPES`): 'iterations' (training iterations completed), 'env_steps' (env steps taken,
summed over envs) and 'percent' (the fraction of the run done, in [0, 1]; the name is ALF's). Progress lives in one
process-wide `TrainingProgress` record (`update_progress`, `get_progress`, `reset_progress`). It is per process: a
child process (async unroller, env worker) sees progress 0 unless its parent sends the values and the child calls
`update_progress` itself.

Reading a schedule costs one integer comparison while progress has not changed: each schedule caches its value for
the progress record's current version.

Every schedule built is recorded (weakly) with a readable name, so `scheduler_summaries()` can list the live ones and
their values for TensorBoard. The name is, in order of preference: the `name` argument; the gin binding whose
reference built it (``SacAlgorithm.actor_lr``; a macro's name for ``lr = @LinearScheduler()``); or the class name with
a number (``LinearScheduler#0``). Duplicate names get ``#1``, ``#2``, ...
"""
from __future__ import annotations

import bisect
import math
import numbers
import sys
import threading
import weakref
from typing import Any, Mapping, Optional, Sequence, Union

import gin
from gin import config as gin_config
import torch

from alfish.errors import OneLineValueError

__all__ = [
    'PROGRESS_TYPES', 'ScheduleError', 'TrainingProgress', 'update_progress', 'get_progress', 'reset_progress',
    'progress_record', 'Scheduler', 'ConstantScheduler', 'StepScheduler', 'LinearScheduler', 'ExponentialScheduler',
    'CyclicalScheduler', 'as_scheduler', 'current_value', 'scheduler_summaries', 'split_lr_schedules',
    'update_optimizer_lrs',
]

PROGRESS_TYPES: tuple[str, ...] = ('percent', 'iterations', 'env_steps')
CYCLE_MODES: tuple[str, ...] = ('triangular', 'cosine', 'sawtooth')

Number = Union[int, float]


class ScheduleError(OneLineValueError):
    """A bad schedule or progress argument; its str() is always the one-line message (through gin too)."""


# ---------------------------------------------------------------------------------------------------------------------
# Progress


class TrainingProgress:
    """How far the run is: iterations, env steps and the fraction done ('percent').

    (Named apart from ``alfish.trainer.progress.Progress``, the progress bar.) One process-wide instance is returned
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
            self._values = dict(iterations=0, env_steps=0, percent=0.0)
            self._totals: dict[str, Number] = {}
            self._percent_known = False
            self.version = next(self._versions)

    def update(self, *, iterations: Optional[int] = None, env_steps: Optional[int] = None,
               fraction: Optional[float] = None, total_iterations: Optional[int] = None,
               total_env_steps: Optional[int] = None) -> None:
        """Sets the measures given (None: unchanged); see the class docstring for how 'percent' is derived.

        Raises:
            ScheduleError (a ValueError): a negative count or fraction, a NaN, or a total that is not positive.
        """
        for name, value in (('iterations', iterations), ('env_steps', env_steps), ('fraction', fraction)):
            if value is not None and not (_is_number(value) and value >= 0):
                raise ScheduleError(f"update_progress: {name}={value!r} must be a number >= 0")
        for name, value in (('total_iterations', total_iterations), ('total_env_steps', total_env_steps)):
            if value is not None and not (_is_number(value) and value > 0):
                raise ScheduleError(f"update_progress: {name}={value!r} must be a number > 0")
        with self._lock:
            if iterations is not None:
                self._values['iterations'] = iterations
            if env_steps is not None:
                self._values['env_steps'] = env_steps
            if total_iterations is not None:
                self._totals['iterations'] = total_iterations
            if total_env_steps is not None:
                self._totals['env_steps'] = total_env_steps
            if fraction is None and self._totals:
                fraction = max(self._values[measure] / total for measure, total in self._totals.items())
            if fraction is not None:
                self._values['percent'] = min(float(fraction), 1.0)
                self._percent_known = True
            self.version = next(self._versions)

    def get(self, measure: str) -> Number:
        """The current value of `measure` ('percent', 'iterations' or 'env_steps').

        Raises:
            ScheduleError (a ValueError): an unknown measure.
            RuntimeError: 'percent' asked after iterations or env steps were reported but never the run's length.
        """
        if measure not in PROGRESS_TYPES:
            raise ScheduleError(f"progress measure {measure!r} is unknown; use one of {_quoted(PROGRESS_TYPES)}")
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


def update_progress(*, iterations: Optional[int] = None, env_steps: Optional[int] = None,
                    fraction: Optional[float] = None, total_iterations: Optional[int] = None,
                    total_env_steps: Optional[int] = None) -> None:
    """Reports the run's progress (`TrainingProgress.update` on the process-wide record); None leaves a measure as is.

    The trainer calls it once per iteration, before training on that iteration, with the iterations completed so
    far, the env steps taken and the fraction of the run done (e.g. ``iteration / expected_num_iterations``).
    """
    _PROGRESS.update(iterations=iterations, env_steps=env_steps, fraction=fraction,
                     total_iterations=total_iterations, total_env_steps=total_env_steps)


def get_progress(measure: str) -> Number:
    """The current value of a progress measure ('percent', 'iterations' or 'env_steps')."""
    return _PROGRESS.get(measure)


def reset_progress() -> None:
    """Every measure back to 0 and the totals forgotten (the trainer calls it when a run starts; tests use it)."""
    _PROGRESS.reset()


# ---------------------------------------------------------------------------------------------------------------------
# Schedules


class _SchedulerMeta(type):
    """Records each schedule for `scheduler_summaries` once its constructor has finished (so a schedule whose
    arguments were rejected is never listed), and gives it its unique name."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        scheduler = super().__call__(*args, **kwargs)
        if scheduler._listed:
            scheduler.name = _REGISTRY.add(scheduler, scheduler._given_name)
        return scheduler


class Scheduler(metaclass=_SchedulerMeta):
    """A value that is a function of progress. Subclasses implement `value_at(progress)`.

    Calling the object (or `float()` of it) returns the value at the current progress of type `progress_type`.
    `name` is the unique name it has in `scheduler_summaries` (see the module docstring).
    """

    _listed = True  # recorded for scheduler_summaries()

    def __init__(self, progress_type: str, name: Optional[str] = None) -> None:
        cls = type(self).__name__
        if progress_type not in PROGRESS_TYPES:
            raise ScheduleError(f"{cls}.progress_type={progress_type!r} is unknown; use one of "
                                f"{_quoted(PROGRESS_TYPES)}")
        if name is not None and (not isinstance(name, str) or not name):
            raise ScheduleError(f"{cls}.name={name!r} must be a non-empty string or None")
        self.progress_type = progress_type
        self._cached_version = -1
        self._cached_value = 0.0
        self._given_name = name
        self.name = name or cls  # made unique by _SchedulerMeta once built

    def value_at(self, progress: float) -> float:
        """The value when the progress measure equals `progress`."""
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

    def __init__(self, value: float, name: Optional[str] = None) -> None:
        super().__init__('iterations', name)
        self.value = _number(f'{type(self).__name__}.value', value)

    def value_at(self, progress: float) -> float:
        return self.value

    def __call__(self) -> float:
        return self.value

    def _describe(self) -> str:
        return f'value={self.value!r}'


@gin.configurable
class ConstantScheduler(_Constant):
    """Always `value`; listed in `scheduler_summaries` (e.g. to see a hyperparameter in TensorBoard)."""

    _listed = True


@gin.configurable
class StepScheduler(Scheduler):
    """Piecewise constant: `v_k` once progress >= `p_k`, `start` before `p_0`.

    schedule: ``[(p_0, v_0), (p_1, v_1), ...]`` with strictly increasing progress points (in [0, 1] for 'percent').
    start: the value before `p_0`; required unless `p_0` is 0.
    """

    def __init__(self, progress_type: str, schedule: Sequence[tuple[Number, Number]],
                 start: Optional[float] = None, name: Optional[str] = None) -> None:
        super().__init__(progress_type, name)
        self.points, self.values = _check_schedule('StepScheduler', progress_type, schedule)
        if start is None and self.points[0] > 0:
            raise ScheduleError(f"StepScheduler.start is required: the first progress point is {self.points[0]!r}, "
                                f"so the value before it must be given")
        self.start = None if start is None else _number('StepScheduler.start', start)

    def value_at(self, progress: float) -> float:
        k = bisect.bisect_right(self.points, progress) - 1
        return self.start if k < 0 else self.values[k]

    def _describe(self) -> str:
        return f'{super()._describe()}, schedule={list(zip(self.points, self.values))!r}, start={self.start!r}'


@gin.configurable
class LinearScheduler(Scheduler):
    """Piecewise linear through ``[(p_0, v_0), (p_1, v_1), ...]``; `v_0` before `p_0` and the last value after the
    last point. Progress points are strictly increasing (in [0, 1] for 'percent'); use StepScheduler for jumps.
    """

    def __init__(self, progress_type: str, schedule: Sequence[tuple[Number, Number]],
                 name: Optional[str] = None) -> None:
        super().__init__(progress_type, name)
        self.points, self.values = _check_schedule('LinearScheduler', progress_type, schedule)

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


@gin.configurable
class ExponentialScheduler(Scheduler):
    """``initial_value * decay_rate ** (progress / decay_time)``: multiplied by `decay_rate` every `decay_time`.

    decay_rate: > 0 (below 1 decays, above 1 grows). decay_time: > 0, in units of the progress measure.
    """

    def __init__(self, progress_type: str, initial_value: float, decay_rate: float, decay_time: float,
                 name: Optional[str] = None) -> None:
        super().__init__(progress_type, name)
        self.initial_value = _number('ExponentialScheduler.initial_value', initial_value)
        self.decay_rate = _number('ExponentialScheduler.decay_rate', decay_rate, positive=True)
        self.decay_time = _number('ExponentialScheduler.decay_time', decay_time, positive=True)

    def value_at(self, progress: float) -> float:
        return self.initial_value * self.decay_rate ** (progress / self.decay_time)

    def _describe(self) -> str:
        return (f'{super()._describe()}, initial_value={self.initial_value!r}, decay_rate={self.decay_rate!r}, '
                f'decay_time={self.decay_time!r}')


@gin.configurable
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

    def __init__(self, progress_type: str, period: float, value_range: Optional[Sequence[Number]] = None,
                 base_schedule: Optional[Scheduler] = None, mode: str = 'triangular',
                 name: Optional[str] = None) -> None:
        super().__init__(progress_type, name)
        self.period = _number('CyclicalScheduler.period', period, positive=True)
        if (value_range is None) == (base_schedule is None):
            raise ScheduleError("CyclicalScheduler: give exactly one of value_range=(a, b) and base_schedule")
        if mode not in CYCLE_MODES:
            raise ScheduleError(f"CyclicalScheduler.mode={mode!r} is unknown; use one of {_quoted(CYCLE_MODES)}")
        if base_schedule is not None:
            if not isinstance(base_schedule, Scheduler):
                raise ScheduleError(f"CyclicalScheduler.base_schedule must be a schedule, got "
                                    f"{type(base_schedule).__name__}")
            if mode != 'triangular':
                raise ScheduleError(f"CyclicalScheduler.mode={mode!r} applies to value_range only; with a "
                                    f"base_schedule the cycle is that schedule's shape")
            _REGISTRY.remove(base_schedule)
            self.value_range = None
        else:
            if (isinstance(value_range, (str, bytes)) or not isinstance(value_range, Sequence)
                    or len(value_range) != 2 or not all(_is_number(v) for v in value_range)):
                raise ScheduleError(f"CyclicalScheduler.value_range={value_range!r} must be a pair of numbers (a, b)")
            self.value_range = (float(value_range[0]), float(value_range[1]))
        self.base_schedule = base_schedule
        self.mode = mode

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


def as_scheduler(value: Union[Number, Scheduler]) -> Scheduler:
    """`value` itself if it is a schedule; a number becomes a constant schedule (not listed in summaries).

    Lets a consumer accept both: ``self._epsilon = as_scheduler(epsilon)``, then ``self._epsilon()`` when needed.
    """
    if isinstance(value, Scheduler):
        return value
    if _is_number(value):
        return _Constant(value)
    raise TypeError(f"expected a number or a schedule, got {type(value).__name__}: {value!r}")


def current_value(value: Union[Number, Scheduler]) -> float:
    """The current value of a number or a schedule, as a float (use ``int(...)`` for counts such as periods)."""
    if isinstance(value, Scheduler):
        return value()
    if _is_number(value):
        return float(value)
    raise TypeError(f"expected a number or a schedule, got {type(value).__name__}: {value!r}")


def scheduler_summaries() -> dict[str, float]:
    """``{name: current value}`` of every live schedule built (in the order built), for the trainer's summaries,
    e.g. ``summaries.scalars('schedule', scheduler_summaries(), iteration)``."""
    return {scheduler.name: scheduler() for scheduler in _REGISTRY.live()}


# ---------------------------------------------------------------------------------------------------------------------
# Learning rates


def split_lr_schedules(param_groups: Sequence[Mapping[str, Any]]) -> tuple[list[dict], dict[str, Scheduler]]:
    """Optimizer-ready copies of `param_groups` and the learning-rate schedule of each scheduled group, by name.

    An algorithm's groups may give ``lr`` as a number or a schedule. torch's optimizers need a number, so each copy's
    ``lr`` is its current value; the schedules come back as ``{group name: schedule}`` for `update_optimizer_lrs`.

    Raises:
        ScheduleError (a ValueError): a scheduled group without a 'name', or two groups with the same name.
    """
    groups, schedules, names = [], {}, set()
    for group in param_groups:
        group = dict(group)
        name = group.get('name')
        if name is not None:
            if name in names:
                raise ScheduleError(f"split_lr_schedules: two parameter groups are named {name!r}")
            names.add(name)
        lr = group.get('lr')
        if isinstance(lr, Scheduler):
            if name is None:
                raise ScheduleError(f"split_lr_schedules: a parameter group with a scheduled lr ({lr.name}) needs a "
                                    f"'name'")
            schedules[name] = lr
            group['lr'] = lr()
        groups.append(group)
    return groups, schedules


def update_optimizer_lrs(optimizer: torch.optim.Optimizer,
                         lrs: Mapping[str, Union[Number, Scheduler]]) -> dict[str, float]:
    """Sets the learning rate of each named parameter group to the current value of ``lrs[name]``; returns them.

    Groups are matched by their 'name' entry; groups not named in `lrs` keep their rate. Call it once per iteration,
    after `update_progress`. A tensor ``lr`` (capturable optimizers) is filled in place.

    Raises:
        ScheduleError (a ValueError): a name with no group, or a negative learning rate.
    """
    groups = {group.get('name'): group for group in optimizer.param_groups}
    values = {}
    for name, lr in lrs.items():
        group = groups.get(name)
        if group is None:
            known = ', '.join(repr(n) for n in groups)
            raise ScheduleError(f"update_optimizer_lrs: the optimizer has no parameter group named {name!r}; its "
                                f"groups are: {known}")
        value = current_value(lr)
        if not value >= 0:
            raise ScheduleError(f"update_optimizer_lrs: the learning rate of group {name!r} is {value!r} "
                                f"({getattr(lr, 'name', 'constant')}); it must be >= 0")
        if isinstance(group['lr'], torch.Tensor):
            group['lr'].fill_(value)
        else:
            group['lr'] = value
        values[name] = value
    return values


# ---------------------------------------------------------------------------------------------------------------------
# The registry of schedules built (for summaries)


class _Registry:
    """Weak references to the schedules built, in order, with unique names."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._refs: list[weakref.ref] = []

    def add(self, scheduler: Scheduler, name: Optional[str]) -> str:
        """Records `scheduler`; returns its unique name (see the module docstring)."""
        base = name or _gin_binding_name(scheduler)
        with self._lock:
            taken = {s.name for s in self._live_locked()}
            if base is None:
                base = type(scheduler).__name__
                unique = next(f'{base}#{k}' for k in range(len(taken) + 1) if f'{base}#{k}' not in taken)
            else:
                unique = next(n for n in [base] + [f'{base}#{k}' for k in range(1, len(taken) + 2)]
                              if n not in taken)
            self._refs.append(weakref.ref(scheduler))
            return unique

    def remove(self, scheduler: Scheduler) -> None:
        with self._lock:
            self._refs = [ref for ref in self._refs if ref() is not None and ref() is not scheduler]

    def live(self) -> list[Scheduler]:
        with self._lock:
            return self._live_locked()

    def clear(self) -> None:
        """Forgets every schedule built so far (for tests)."""
        with self._lock:
            self._refs = []

    def _live_locked(self) -> list[Scheduler]:
        self._refs = [ref for ref in self._refs if ref() is not None]
        return [s for s in (ref() for ref in self._refs) if s is not None]


_REGISTRY = _Registry()

_DEEPCOPY_CODE = gin_config.ConfigurableReference.__deepcopy__.__code__
_MAX_FRAMES = 64


def _gin_binding_name(scheduler: Scheduler) -> Optional[str]:
    """The binding ('scope/Name.param', or a macro's name) whose `@Ref()` gin is evaluating to build `scheduler`.

    gin evaluates a reference in ``ConfigurableReference.__deepcopy__`` while building the consumer's arguments; the
    nearest such frame up the stack holds the reference. None when `scheduler` is not being built by gin.
    """
    try:
        frame = sys._getframe(1)
        for _ in range(_MAX_FRAMES):
            if frame is None:
                return None
            if frame.f_code is _DEEPCOPY_CODE:
                break
            frame = frame.f_back
        else:
            return None
        reference = frame.f_locals.get('self')
        wrapped = getattr(getattr(reference, 'configurable', None), 'wrapped', None)
        if not (isinstance(wrapped, type) and isinstance(scheduler, wrapped)):
            return None  # gin is building something else, which built this schedule in Python
        for (scope, selector), params in list(gin_config._CONFIG.items()):
            for arg, value in params.items():
                if any(found is reference for found in gin_config.iterate_references({arg: value})):
                    return _binding_name(scope, selector, arg)
    except Exception:  # naming is a convenience; never let it break construction
        return None
    return None


def _binding_name(scope: str, selector: str, arg: str) -> str:
    """How the binding is written in a conf: a macro's name, or 'scope/Name.param'."""
    configurable = gin_config._REGISTRY.get(selector)
    if configurable is not None and configurable.wrapped is gin_config.macro:
        return scope
    name = gin_config._REGISTRY.minimal_selector(selector)
    return f'{scope}/{name}.{arg}' if scope else f'{name}.{arg}'


# ---------------------------------------------------------------------------------------------------------------------
# Validation helpers


def _is_number(value: Any) -> bool:
    """A real number that is not a bool and not NaN."""
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and not (isinstance(value, float) and math.isnan(value)))


def _number(parameter: str, value: Any, positive: bool = False) -> float:
    """`value` as a float; ValueError naming `parameter` if it is not a finite number (or not > 0 when required)."""
    if not _is_number(value) or not math.isfinite(value):
        raise ScheduleError(f"{parameter}={value!r} must be a finite number")
    if positive and value <= 0:
        raise ScheduleError(f"{parameter}={value!r} must be > 0")
    return float(value)


def _check_schedule(cls: str, progress_type: str,
                    schedule: Sequence[tuple[Number, Number]]) -> tuple[list[float], list[float]]:
    """The progress points and values of a ``[(p, v), ...]`` schedule; ValueError naming `cls`.schedule if invalid."""
    where = f'{cls}.schedule'
    if isinstance(schedule, (str, bytes)) or not isinstance(schedule, Sequence) or not schedule:
        raise ScheduleError(f"{where}={schedule!r} must be a non-empty list of (progress, value) pairs")
    points, values = [], []
    for pair in schedule:
        if (isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2
                or not all(_is_number(x) and math.isfinite(x) for x in pair)):
            raise ScheduleError(f"{where}: {pair!r} is not a (progress, value) pair of finite numbers")
        points.append(float(pair[0]))
        values.append(float(pair[1]))
    for previous, point in zip(points, points[1:]):
        if point <= previous:
            raise ScheduleError(f"{where}: progress points must be strictly increasing, but {point:g} follows "
                                f"{previous:g}")
    if points[0] < 0:
        raise ScheduleError(f"{where}: progress point {points[0]:g} is negative")
    if progress_type == 'percent' and points[-1] > 1:
        raise ScheduleError(f"{where}: progress point {points[-1]:g} is above 1; 'percent' progress is the fraction "
                            f"of the run done, in [0, 1]")
    return points, values


def _quoted(names: Sequence[str]) -> str:
    return ', '.join(repr(n) for n in names)
