"""Progress-based schedules for any numeric hyperparameter (learning rates, epsilon, tau, PER alpha/beta, ...).

A schedule is a callable whose value is a function of the run's progress (`progress`: iterations, env steps or the
fraction of the run done). The trainer reports progress once per iteration and sets scheduled learning rates
(`learning_rates`); consumers read the current value when they need it (`schedules`); every live schedule is listed
under a readable name for TensorBoard (`registry`)::

    # in a conf
    SacAlgorithm.actor_lr = @actor/LinearScheduler()
    actor/LinearScheduler.progress_type = 'percent'
    actor/LinearScheduler.schedule = [(0, 1e-3), (1, 1e-4)]

    # an algorithm, for any hyperparameter that may be a number or a schedule
    self._tau = as_scheduler(target_update_tau)     # in __init__
    tau = self._tau()                               # when used: a Python float, no host sync
"""
from alfish.schedulers.learning_rates import split_lr_schedules, update_optimizer_lrs
from alfish.schedulers.progress import (
    PROGRESS_TYPES,
    TrainingProgress,
    get_progress,
    progress_record,
    reset_progress,
    update_progress,
)
from alfish.schedulers.registry import REGISTRY as _REGISTRY  # noqa: F401 (tests clear it)
from alfish.schedulers.registry import scheduler_summaries
from alfish.schedulers.schedules import (
    ConstantScheduler,
    CyclicalScheduler,
    ExponentialScheduler,
    LinearScheduler,
    Scheduler,
    StepScheduler,
    as_scheduler,
    current_value,
)
from alfish.schedulers.traced import TracedValue, traced_values
from alfish.schedulers.validation import ScheduleError

__all__ = [
    'PROGRESS_TYPES', 'ConstantScheduler', 'CyclicalScheduler', 'ExponentialScheduler', 'LinearScheduler',
    'ScheduleError', 'Scheduler', 'StepScheduler', 'TracedValue', 'TrainingProgress', 'as_scheduler', 'current_value',
    'get_progress', 'progress_record', 'reset_progress', 'scheduler_summaries', 'split_lr_schedules', 'traced_values',
    'update_optimizer_lrs', 'update_progress',
]
