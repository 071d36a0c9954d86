"""Schedules and the progress record: values at chosen progress points computed by hand, validation messages to the
letter, gin usage (scoped and macro bindings), summaries and optimizer learning rates."""
import gc
import math

import gin
import pytest
import torch

from alfish import schedulers
from alfish.schedulers import (
    ConstantScheduler,
    CyclicalScheduler,
    ExponentialScheduler,
    LinearScheduler,
    ScheduleError,
    Scheduler,
    StepScheduler,
    as_scheduler,
    current_value,
    get_progress,
    progress_record,
    reset_progress,
    scheduler_summaries,
    split_lr_schedules,
    update_optimizer_lrs,
    update_progress,
)


@gin.configurable
class ScheduleTestConsumer:
    """Stands in for an algorithm taking scheduled hyperparameters."""

    def __init__(self, lr=1.0, epsilon=0.0, others=()):
        self.lr, self.epsilon, self.others = lr, epsilon, others


@gin.configurable
class ScheduleTestBuilder:
    """Builds a schedule in Python inside its (gin-called) constructor."""

    def __init__(self, scale=1.0):
        self.schedule = LinearScheduler('iterations', [(0, scale), (10, 0)])


@pytest.fixture(autouse=True)
def _fresh_state():
    reset_progress()
    schedulers._REGISTRY.clear()
    gin.clear_config()
    yield
    gin.clear_config()
    reset_progress()
    schedulers._REGISTRY.clear()


def at(scheduler, progress):
    """The value via the progress record (not value_at), to exercise the cached path."""
    update_progress(**{scheduler.progress_type if scheduler.progress_type != 'percent' else 'fraction': progress})
    return scheduler()


# ---------------------------------------------------------------------------------------------------------------------
# Progress


def test_progress_starts_at_zero_and_records_counts():
    assert {m: get_progress(m) for m in schedulers.PROGRESS_TYPES} == dict(percent=0.0, iterations=0, env_steps=0)
    update_progress(iterations=3, env_steps=48, fraction=0.03)
    assert (get_progress('iterations'), get_progress('env_steps'), get_progress('percent')) == (3, 48, 0.03)
    update_progress(iterations=4)  # the others are kept
    assert (get_progress('iterations'), get_progress('env_steps'), get_progress('percent')) == (4, 48, 0.03)


def test_percent_from_totals_is_the_measure_that_ends_the_run_first():
    update_progress(iterations=25, total_iterations=100)
    assert get_progress('percent') == 0.25  # 25 / 100
    update_progress(env_steps=500, total_env_steps=1000)
    assert get_progress('percent') == 0.5  # max(25 / 100, 500 / 1000)
    update_progress(iterations=80)  # totals are remembered
    assert get_progress('percent') == 0.8  # max(80 / 100, 500 / 1000)
    update_progress(iterations=90, fraction=0.7)  # a fraction given wins over the totals
    assert get_progress('percent') == 0.7
    update_progress(iterations=130)
    assert get_progress('percent') == 1.0  # 130 / 100 clamped


def test_fraction_above_one_is_clamped():
    update_progress(fraction=1.02)
    assert get_progress('percent') == 1.0


def test_percent_without_the_runs_length_is_an_error_once_progress_moved():
    assert get_progress('percent') == 0.0  # before training, schedules read their start value
    update_progress(iterations=1)
    with pytest.raises(RuntimeError, match=r"^a 'percent' schedule needs the run's length, but progress was updated "
                                           r"without it: pass update_progress\(fraction=...\) or "
                                           r"total_iterations/total_env_steps$"):
        get_progress('percent')


@pytest.mark.parametrize('kwargs, message', [
    (dict(iterations=-1), "update_progress: iterations=-1 must be a number >= 0"),
    (dict(env_steps='3'), "update_progress: env_steps='3' must be a number >= 0"),
    (dict(fraction=float('nan')), "update_progress: fraction=nan must be a number >= 0"),
    (dict(total_iterations=0), "update_progress: total_iterations=0 must be a number > 0"),
    (dict(total_env_steps=-5), "update_progress: total_env_steps=-5 must be a number > 0"),
])
def test_update_progress_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError) as error:
        update_progress(**kwargs)
    assert str(error.value) == message


def test_unknown_measure_is_an_error():
    with pytest.raises(ValueError) as error:
        get_progress('steps')
    assert str(error.value) == ("progress measure 'steps' is unknown; use one of 'percent', 'iterations', "
                                "'env_steps'")


def test_reset_progress_forgets_counts_and_totals():
    update_progress(iterations=5, env_steps=50, total_iterations=10)
    version = progress_record().version
    reset_progress()
    assert progress_record().as_dict() == dict(iterations=0, env_steps=0, percent=0.0)
    assert progress_record().version > version
    update_progress(iterations=1)  # no totals any more
    with pytest.raises(RuntimeError):
        get_progress('percent')


# ---------------------------------------------------------------------------------------------------------------------
# Values at chosen progress points


def test_constant_scheduler():
    s = ConstantScheduler(0.25)
    update_progress(iterations=1000, fraction=0.9)
    assert s() == 0.25 and float(s) == 0.25 and s.value_at(123.0) == 0.25


def test_step_scheduler_values():
    s = StepScheduler('iterations', schedule=[(20, 2.0), (50, 3.0)], start=1.0)
    # start before the first point; v_k once progress >= p_k.
    assert [at(s, p) for p in (0, 19, 20, 49, 50, 1000)] == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]


def test_step_scheduler_starting_at_zero_needs_no_start():
    s = StepScheduler('percent', schedule=[(0, 0.1), (0.5, 0.01)])
    assert [at(s, p) for p in (0.0, 0.49, 0.5, 1.0)] == [0.1, 0.1, 0.01, 0.01]


def test_linear_scheduler_values():
    s = LinearScheduler('iterations', schedule=[(10, 1.0), (20, 0.0), (40, 0.5)])
    assert at(s, 0) == 1.0  # before the first point: v_0
    assert at(s, 15) == pytest.approx(0.5)  # 1 + (15 - 10) / (20 - 10) * (0 - 1)
    assert at(s, 20) == 0.0
    assert at(s, 30) == pytest.approx(0.25)  # 0 + (30 - 20) / (40 - 20) * (0.5 - 0)
    assert at(s, 40) == 0.5
    assert at(s, 100) == 0.5  # after the last point: the last value


def test_linear_scheduler_on_percent():
    s = LinearScheduler('percent', schedule=[(0, 1e-3), (1, 0)])
    assert at(s, 0.0) == pytest.approx(1e-3)
    assert at(s, 0.25) == pytest.approx(7.5e-4)  # 1e-3 + 0.25 * (0 - 1e-3)
    assert at(s, 1.0) == 0.0


def test_linear_scheduler_with_a_single_point_is_constant():
    s = LinearScheduler('env_steps', schedule=[(100, 0.3)])
    assert [at(s, p) for p in (0, 100, 10**6)] == [0.3, 0.3, 0.3]


def test_exponential_scheduler_values():
    s = ExponentialScheduler('env_steps', initial_value=1.0, decay_rate=0.5, decay_time=10)
    assert at(s, 0) == 1.0  # 1 * 0.5 ** 0
    assert at(s, 10) == 0.5  # 1 * 0.5 ** 1
    assert at(s, 25) == pytest.approx(1 / (4 * math.sqrt(2)))  # 0.5 ** 2.5 = 0.5 ** 2 * 0.5 ** 0.5
    g = ExponentialScheduler('iterations', initial_value=2.0, decay_rate=3.0, decay_time=2)
    assert at(g, 4) == pytest.approx(18.0)  # 2 * 3 ** (4 / 2)


def test_cyclical_scheduler_triangular():
    s = CyclicalScheduler('iterations', period=4, value_range=(0.0, 1.0))
    # a -> b at half the period -> a at its end, then again.
    assert [at(s, p) for p in (0, 1, 2, 3, 4, 5, 6, 8)] == [0.0, 0.5, 1.0, 0.5, 0.0, 0.5, 1.0, 0.0]


def test_cyclical_scheduler_starting_at_the_top():
    s = CyclicalScheduler('iterations', period=10, value_range=(1.0, 0.2))
    assert at(s, 0) == 1.0
    assert at(s, 5) == pytest.approx(0.2)
    assert at(s, 7.5) == pytest.approx(0.6)  # 1 + (0.2 - 1) * (1 - |1 - 2 * 0.75|) = 1 - 0.8 * 0.5


def test_cyclical_scheduler_cosine_and_sawtooth():
    cosine = CyclicalScheduler('iterations', period=4, value_range=(0.0, 1.0), mode='cosine')
    assert at(cosine, 0) == 0.0
    assert at(cosine, 0.5) == pytest.approx((1 - math.sqrt(0.5)) / 2)  # (1 - cos(2 pi * 0.5 / 4)) / 2, cos(pi/4)
    assert at(cosine, 1) == pytest.approx(0.5)  # (1 - cos(pi / 2)) / 2
    assert at(cosine, 2) == pytest.approx(1.0)  # (1 - cos(pi)) / 2
    assert at(cosine, 4) == pytest.approx(0.0)
    sawtooth = CyclicalScheduler('iterations', period=4, value_range=(2.0, 4.0), mode='sawtooth')
    assert [at(sawtooth, p) for p in (0, 1, 3, 4, 6)] == [2.0, 2.5, 3.5, 2.0, 3.0]  # 2 + 2 * (p % 4) / 4


def test_cyclical_scheduler_repeats_a_base_schedule():
    base = StepScheduler('iterations', schedule=[(0, 1.0), (3, 5.0)], name='base')
    s = CyclicalScheduler('env_steps', period=5, base_schedule=base)
    # base evaluated at env_steps % 5: 0, 2 -> 1; 3, 4 -> 5; 7 -> 2 -> 1; 13 -> 3 -> 5.
    assert [at(s, p) for p in (0, 2, 3, 4, 5, 7, 13)] == [1.0, 1.0, 5.0, 5.0, 1.0, 1.0, 5.0]
    assert list(scheduler_summaries()) == ['CyclicalScheduler#0']  # the base is not listed on its own


def test_value_is_cached_until_progress_changes():
    class Counting(Scheduler):
        calls = 0

        def value_at(self, progress):
            Counting.calls += 1
            return progress * 2

    s = Counting('iterations')
    update_progress(iterations=3)
    assert (s(), s(), float(s)) == (6.0, 6.0, 6.0)
    assert Counting.calls == 1
    update_progress(iterations=4)
    assert s() == 8.0 and Counting.calls == 2
    reset_progress()
    assert s() == 0.0 and Counting.calls == 3


# ---------------------------------------------------------------------------------------------------------------------
# Validation


@pytest.mark.parametrize('build, message', [
    (lambda: LinearScheduler('steps', [(0, 1)]),
     "LinearScheduler.progress_type='steps' is unknown; use one of 'percent', 'iterations', 'env_steps'"),
    (lambda: LinearScheduler('iterations', []),
     "LinearScheduler.schedule=[] must be a non-empty list of (progress, value) pairs"),
    (lambda: LinearScheduler('iterations', 0.5),
     "LinearScheduler.schedule=0.5 must be a non-empty list of (progress, value) pairs"),
    (lambda: LinearScheduler('iterations', [(0, 1), (5,)]),
     "LinearScheduler.schedule: (5,) is not a (progress, value) pair of finite numbers"),
    (lambda: LinearScheduler('iterations', [(0, 1), (5, 'a')]),
     "LinearScheduler.schedule: (5, 'a') is not a (progress, value) pair of finite numbers"),
    (lambda: LinearScheduler('iterations', [(0, 1), (10, 2), (10, 3)]),
     "LinearScheduler.schedule: progress points must be strictly increasing, but 10 follows 10"),
    (lambda: StepScheduler('iterations', [(5, 1), (2, 3)], start=0),
     "StepScheduler.schedule: progress points must be strictly increasing, but 2 follows 5"),
    (lambda: StepScheduler('iterations', [(-1, 1)], start=0),
     "StepScheduler.schedule: progress point -1 is negative"),
    (lambda: LinearScheduler('percent', [(0, 1), (100, 0)]),
     "LinearScheduler.schedule: progress point 100 is above 1; 'percent' progress is the fraction of the run "
     "done, in [0, 1]"),
    (lambda: StepScheduler('percent', [(0.5, 1)]),
     "StepScheduler.start is required: the first progress point is 0.5, so the value before it must be given"),
    (lambda: ExponentialScheduler('iterations', 1.0, decay_rate=0, decay_time=10),
     "ExponentialScheduler.decay_rate=0 must be > 0"),
    (lambda: ExponentialScheduler('iterations', 1.0, decay_rate=0.5, decay_time=-1),
     "ExponentialScheduler.decay_time=-1 must be > 0"),
    (lambda: ExponentialScheduler('iterations', float('inf'), decay_rate=0.5, decay_time=1),
     "ExponentialScheduler.initial_value=inf must be a finite number"),
    (lambda: CyclicalScheduler('iterations', period=0, value_range=(0, 1)),
     "CyclicalScheduler.period=0 must be > 0"),
    (lambda: CyclicalScheduler('iterations', period=2),
     "CyclicalScheduler: give exactly one of value_range=(a, b) and base_schedule"),
    (lambda: CyclicalScheduler('iterations', period=2, value_range=(0, 1, 2)),
     "CyclicalScheduler.value_range=(0, 1, 2) must be a pair of numbers (a, b)"),
    (lambda: CyclicalScheduler('iterations', period=2, value_range=(0, 1), mode='square'),
     "CyclicalScheduler.mode='square' is unknown; use one of 'triangular', 'cosine', 'sawtooth'"),
    (lambda: CyclicalScheduler('iterations', period=2, base_schedule=ConstantScheduler(1), mode='cosine'),
     "CyclicalScheduler.mode='cosine' applies to value_range only; with a base_schedule the cycle is that "
     "schedule's shape"),
    (lambda: ConstantScheduler('0.1'), "ConstantScheduler.value='0.1' must be a finite number"),
    (lambda: ConstantScheduler(0.1, name=''), "ConstantScheduler.name='' must be a non-empty string or None"),
])
def test_invalid_arguments_fail_with_one_line_naming_the_parameter(build, message):
    with pytest.raises(ValueError) as error:
        build()
    assert str(error.value) == message


# ---------------------------------------------------------------------------------------------------------------------
# Numbers or schedules


def test_as_scheduler_and_current_value():
    s = LinearScheduler('iterations', [(0, 1.0), (10, 0.0)])
    assert as_scheduler(s) is s
    constant = as_scheduler(3)
    assert isinstance(constant, Scheduler) and constant() == 3.0 and isinstance(constant(), float)
    assert 'ConstantScheduler#0' not in scheduler_summaries() and len(scheduler_summaries()) == 1  # not listed
    update_progress(iterations=5)
    assert current_value(s) == 0.5 and current_value(2) == 2.0 and isinstance(current_value(2), float)
    assert current_value(0.1) == 0.1


@pytest.mark.parametrize('function', [as_scheduler, current_value])
@pytest.mark.parametrize('value, message', [
    ('0.1', "expected a number or a schedule, got str: '0.1'"),
    (True, "expected a number or a schedule, got bool: True"),
])
def test_as_scheduler_and_current_value_reject_non_numbers(function, value, message):
    with pytest.raises(TypeError) as error:
        function(value)
    assert str(error.value) == message


# ---------------------------------------------------------------------------------------------------------------------
# Summaries


def test_scheduler_summaries_name_and_value_every_live_schedule():
    a = LinearScheduler('iterations', [(0, 1.0), (10, 0.0)])
    b = LinearScheduler('iterations', [(0, 2.0), (10, 0.0)])
    c = ExponentialScheduler('iterations', 1.0, 0.5, 10, name='epsilon')
    d = ConstantScheduler(7, name='epsilon')
    assert (a.name, b.name, c.name, d.name) == ('LinearScheduler#0', 'LinearScheduler#1', 'epsilon', 'epsilon#1')
    update_progress(iterations=5)
    # 1 - 5 / 10, 2 - 2 * 5 / 10, 0.5 ** (5 / 10)
    assert scheduler_summaries() == {'LinearScheduler#0': 0.5, 'LinearScheduler#1': 1.0,
                                     'epsilon': pytest.approx(0.7071067812), 'epsilon#1': 7.0}
    del a, d
    gc.collect()
    assert list(scheduler_summaries()) == ['LinearScheduler#1', 'epsilon']  # dropped when no longer used
    e = LinearScheduler('iterations', [(0, 1.0)])
    assert e.name == 'LinearScheduler#0'  # the name of a dead schedule is free again


def test_rejected_schedule_is_never_listed():
    with pytest.raises(ScheduleError) as error:
        LinearScheduler('iterations', [(0, 1), (0, 2)])
    assert error.traceback  # the traceback (which holds the half-built object) is still alive here
    assert scheduler_summaries() == {}


# ---------------------------------------------------------------------------------------------------------------------
# gin


def test_gin_scoped_schedules_follow_progress_and_are_named_by_their_binding():
    gin.parse_config("""
        ScheduleTestConsumer.lr = @actor/LinearScheduler()
        actor/LinearScheduler.progress_type = 'percent'
        actor/LinearScheduler.schedule = [(0, 1e-3), (1, 0)]
        ScheduleTestConsumer.epsilon = @eps/LinearScheduler()
        eps/LinearScheduler.progress_type = 'iterations'
        eps/LinearScheduler.schedule = [(0, 1.0), (100, 0.1)]
    """)
    consumer = ScheduleTestConsumer()
    assert isinstance(consumer.lr, LinearScheduler) and isinstance(consumer.epsilon, LinearScheduler)
    assert (consumer.lr(), consumer.epsilon()) == (1e-3, 1.0)
    update_progress(iterations=50, fraction=0.5)
    assert consumer.lr() == pytest.approx(5e-4)  # 1e-3 + 0.5 * (0 - 1e-3)
    assert consumer.epsilon() == pytest.approx(0.55)  # 1 + 50 / 100 * (0.1 - 1)
    assert scheduler_summaries() == {'ScheduleTestConsumer.lr': pytest.approx(5e-4),
                                     'ScheduleTestConsumer.epsilon': pytest.approx(0.55)}


def test_gin_unscoped_macro_and_nested_schedules():
    gin.parse_config("""
        EPSILON = @ExponentialScheduler()
        ExponentialScheduler.progress_type = 'env_steps'
        ExponentialScheduler.initial_value = 1.0
        ExponentialScheduler.decay_rate = 0.1
        ExponentialScheduler.decay_time = 1000
        ScheduleTestConsumer.epsilon = %EPSILON
        ScheduleTestConsumer.others = [@ConstantScheduler(), @a/CyclicalScheduler()]
        ConstantScheduler.value = 3
        a/CyclicalScheduler.progress_type = 'iterations'
        a/CyclicalScheduler.period = 10
        a/CyclicalScheduler.value_range = (0, 1)
    """)
    consumer = ScheduleTestConsumer()
    update_progress(iterations=5, env_steps=2000)
    assert consumer.epsilon() == pytest.approx(0.01)  # 1 * 0.1 ** (2000 / 1000)
    assert [s() for s in consumer.others] == [3.0, 1.0]  # the cycle is at its top at half the period
    assert scheduler_summaries() == {'EPSILON': pytest.approx(0.01), 'ScheduleTestConsumer.others': 3.0,
                                     'ScheduleTestConsumer.others#1': 1.0}


def test_schedule_built_in_python_inside_a_gin_call_is_not_named_after_a_binding():
    gin.parse_config("""
        ScheduleTestConsumer.others = [@ScheduleTestBuilder()]
        ScheduleTestBuilder.scale = 2.0
    """)
    consumer = ScheduleTestConsumer()
    assert consumer.others[0].schedule.name == 'LinearScheduler#0'
    assert consumer.others[0].schedule() == 2.0


def test_bad_schedule_built_by_gin_is_still_a_one_line_error():
    gin.parse_config("""
        ScheduleTestConsumer.lr = @actor/LinearScheduler()
        actor/LinearScheduler.progress_type = 'percent'
        actor/LinearScheduler.schedule = [(0, 1e-3), (0, 0)]
    """)
    with pytest.raises(ScheduleError) as error:  # gin wraps it twice (scheduler, consumer); the text stays one line
        ScheduleTestConsumer()
    assert str(error.value) == "LinearScheduler.schedule: progress points must be strictly increasing, but 0 follows 0"
    assert isinstance(error.value, ValueError)


def test_conf_typo_in_a_schedule_parameter_names_the_closest(tmp_path):
    from alfish.config.loading import ConfError, load_conf
    conf = tmp_path / 'schedule.gin'
    conf.write_text("ScheduleTestConsumer.lr = @LinearScheduler()\nLinearScheduler.shedule = [(0, 1)]\n")
    with pytest.raises(ConfError) as error:
        load_conf(str(conf))
    assert str(error.value) == f"{conf}:2: 'LinearScheduler' has no parameter 'shedule'; did you mean 'schedule'?"


# ---------------------------------------------------------------------------------------------------------------------
# Optimizer learning rates


def _params(n):
    return [torch.nn.Parameter(torch.zeros(2)) for _ in range(n)]


def test_scheduled_learning_rates_reach_the_optimizer():
    actor_lr = LinearScheduler('percent', [(0, 1e-3), (1, 0)])
    groups = [dict(name='actor', params=_params(1), lr=actor_lr), dict(name='critic', params=_params(1), lr=3e-4)]
    ready, schedules = split_lr_schedules(groups)
    assert schedules == {'actor': actor_lr}
    assert [g['lr'] for g in ready] == [1e-3, 3e-4]
    assert groups[0]['lr'] is actor_lr  # the algorithm's groups are not modified
    optimizer = torch.optim.Adam(ready)
    update_progress(iterations=3, fraction=0.75)
    assert update_optimizer_lrs(optimizer, schedules) == {'actor': pytest.approx(2.5e-4)}  # 1e-3 * (1 - 0.75)
    assert [g['lr'] for g in optimizer.param_groups] == [pytest.approx(2.5e-4), 3e-4]
    update_optimizer_lrs(optimizer, {'critic': 1e-5})  # numbers work too
    assert optimizer.param_groups[1]['lr'] == 1e-5


def test_tensor_learning_rates_are_filled_in_place():
    optimizer = torch.optim.Adam([dict(name='q', params=_params(1), lr=torch.tensor(0.1))])
    lr_tensor = optimizer.param_groups[0]['lr']
    update_optimizer_lrs(optimizer, {'q': ConstantScheduler(0.05)})
    assert optimizer.param_groups[0]['lr'] is lr_tensor and float(lr_tensor) == pytest.approx(0.05)


def test_learning_rate_errors():
    optimizer = torch.optim.Adam([dict(name='actor', params=_params(1), lr=1e-3),
                                  dict(name='critic', params=_params(1), lr=1e-3)])
    with pytest.raises(ValueError) as error:
        update_optimizer_lrs(optimizer, {'alpha': 1e-3})
    assert str(error.value) == ("update_optimizer_lrs: the optimizer has no parameter group named 'alpha'; its "
                                "groups are: 'actor', 'critic'")
    falling = LinearScheduler('iterations', [(0, 1e-3), (10, -1e-3)], name='actor_lr')
    update_progress(iterations=10)
    with pytest.raises(ValueError) as error:
        update_optimizer_lrs(optimizer, {'actor': falling})
    assert str(error.value) == ("update_optimizer_lrs: the learning rate of group 'actor' is -0.001 (actor_lr); "
                                "it must be >= 0")
    with pytest.raises(ValueError) as error:
        split_lr_schedules([dict(params=_params(1), lr=falling)])
    assert str(error.value) == "split_lr_schedules: a parameter group with a scheduled lr (actor_lr) needs a 'name'"
    with pytest.raises(ValueError) as error:
        split_lr_schedules([dict(name='a', params=_params(1)), dict(name='a', params=_params(1))])
    assert str(error.value) == "split_lr_schedules: two parameter groups are named 'a'"

