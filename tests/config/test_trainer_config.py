"""TrainerConfig: ALF's parameters and defaults, gin binding, validation messages and the schedule helpers."""
import dataclasses
import inspect

import gin
import pytest

from alfish.config import TrainerConfig
from alfish.config.trainer_config import TrainerConfigError

# ALF's TrainerConfig parameters and defaults, in ALF's order (root_dir has none).
ALF_DEFAULTS = dict(
    conf_file='', ml_type='rl', algorithm_ctor=None, data_transformer_ctor=None, random_seed=None,
    num_iterations=1000, num_env_steps=0, unroll_length=8, unroll_with_grad=False, async_unroll=False,
    max_unroll_length=0, unroll_queue_size=200, unroll_step_interval=0, unroll_parameter_update_period=10,
    use_rollout_state=False, temporally_independent_train_step=None, num_checkpoints=10,
    confirm_checkpoint_upon_crash=True, no_thread_env_for_conf=False, evaluate=False, num_evals=None,
    eval_interval=10, epsilon_greedy=0., eval_uncertainty=False, num_eval_episodes=10, num_eval_environments=1,
    async_eval=True, ddp_paras_check_interval=0, num_summaries=None, summary_interval=50,
    summarize_first_interval=True, update_counter_every_mini_batch=False, summaries_flush_secs=1,
    summary_max_queue=10, metric_min_buffer_size=10, debug_summaries=False, profiling=False, enable_amp=False,
    code_snapshots=None, summarize_grads_and_vars=False, summarize_gradient_noise_scale=False,
    summarize_action_distributions=False, summarize_output=False, initial_collect_steps=0,
    num_updates_per_train_iter=4, mini_batch_length=None, mini_batch_size=None, whole_replay_buffer_training=True,
    replay_buffer_length=1024, priority_replay=False, priority_replay_alpha=0.7, priority_replay_beta=0.4,
    priority_replay_eps=1e-6, offline_buffer_dir=None, offline_buffer_length=None, rl_train_after_update_steps=0,
    rl_train_every_update_steps=1, empty_cache=False, normalize_importance_weights_by_max=False,
    clear_replay_buffer=True,
)

class _Algorithm:
    """Stands in for an algorithm constructor."""


def make(**overrides):
    """A valid TrainerConfig with `overrides` applied."""
    kwargs = dict(root_dir='/tmp/run', algorithm_ctor=_Algorithm)
    kwargs.update(overrides)
    return TrainerConfig(**kwargs)


def error_of(**overrides) -> str:
    """The validation message for a config with `overrides`; fails the test if none is raised."""
    with pytest.raises(ValueError) as info:
        make(**overrides)
    return str(info.value)


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def test_parameters_and_defaults_are_alfs():
    parameters = inspect.signature(TrainerConfig.__init__).parameters
    assert list(parameters)[1:] == ['root_dir'] + list(ALF_DEFAULTS)
    assert parameters['root_dir'].default is inspect.Parameter.empty
    assert {f.name: f.default for f in dataclasses.fields(TrainerConfig)[1:]} == ALF_DEFAULTS


def test_defaults_are_valid_and_frozen():
    config = make()
    assert config.num_iterations == 1000
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.num_iterations = 5  # type: ignore[misc]


def test_gin_binds_parameters():
    gin.parse_config(['TrainerConfig.num_iterations = 7', 'TrainerConfig.unroll_length = 2'])
    config = make()
    assert (config.num_iterations, config.unroll_length) == (7, 2)


def test_gin_rejects_misspelled_parameter_at_parse_time():
    with pytest.raises(ValueError, match="Configurable 'TrainerConfig' doesn't have a parameter named 'num_iteration'"):
        gin.parse_config('TrainerConfig.num_iteration = 7')


def test_every_parameter_is_documented_in_one_docstring_line():
    doc = TrainerConfig.__doc__
    for name in ['root_dir'] + list(ALF_DEFAULTS):
        assert f'\n        {name}: ' in doc, name


@pytest.mark.parametrize('overrides, message', [
    (dict(unroll_length=0),
     "TrainerConfig.unroll_length=0 must be > 0 (env steps per env per iteration; a fraction < 1 steps every "
     "1/unroll_length iterations; 0 only with async_unroll=True)"),
    (dict(async_unroll=True, unroll_length=0, num_iterations=0, num_env_steps=1000),
     "TrainerConfig.unroll_length=0 with async_unroll=True takes whatever has arrived each iteration, so the number "
     "of iterations is unknown in advance: set TrainerConfig.num_iterations > 0"),
    (dict(async_unroll=True, unroll_with_grad=True),
     "TrainerConfig.async_unroll=True unrolls in another process, so it cannot keep gradients: set "
     "TrainerConfig.unroll_with_grad=False"),
    (dict(async_unroll=True, unroll_length=0.5),
     "TrainerConfig.unroll_length=0.5 must be a whole number with async_unroll=True"),
    (dict(unroll_queue_size=0), "TrainerConfig.unroll_queue_size = 0: expected an int >= 1"),
    (dict(unroll_step_interval=-1),
     "TrainerConfig.unroll_step_interval = -1: expected a number >= 0 (seconds between env steps)"),
    (dict(unroll_parameter_update_period=0), "TrainerConfig.unroll_parameter_update_period = 0: expected an int >= 1"),
    (dict(max_unroll_length=-2), "TrainerConfig.max_unroll_length = -2: expected an int >= 0 (0: no limit)"),
])
def test_async_unroll_parameters_are_checked(overrides, message):
    assert error_of(**overrides) == message


def test_async_unroll_with_unroll_length_zero_counts_iterations():
    config = make(async_unroll=True, unroll_length=0, num_iterations=50, num_env_steps=10_000)
    assert config.expected_num_iterations(4) == 50


def test_ml_type_is_rl_or_sl():
    assert error_of(ml_type='gan') == ("TrainerConfig.ml_type='gan' must be 'rl' (reinforcement learning) or 'sl' "
                                       "(supervised learning)")
    assert error_of(ml_type='sl', evaluate=True).startswith(
        "TrainerConfig.ml_type='sl' trains a model on SupervisedData with no env")
    assert make(ml_type='sl', evaluate=False).ml_type == "sl"


def test_recurrent_training_parameters_are_accepted():
    # Whether they fit the algorithm is checked once it is built (Algorithm.configure_recurrence).
    assert make(temporally_independent_train_step=False).temporally_independent_train_step is False
    assert make(temporally_independent_train_step=True).temporally_independent_train_step is True
    assert make(use_rollout_state=True).use_rollout_state is True


@pytest.mark.parametrize('overrides, message', [
    (dict(num_iterations=0, num_env_steps=0),
     "TrainerConfig.num_iterations=0 and TrainerConfig.num_env_steps=0: set at least one of them > 0 "
     "(training stops at whichever is reached first)"),
    (dict(algorithm_ctor=None),
     "TrainerConfig.algorithm_ctor is not set; set it in the conf, e.g. TrainerConfig.algorithm_ctor=@SacAlgorithm"),
    (dict(num_checkpoints=-1), "TrainerConfig.num_checkpoints = -1: expected an int >= 0 (0: no checkpoints)"),
    (dict(initial_collect_steps=-5),
     "TrainerConfig.initial_collect_steps = -5: expected an int >= 0 (env steps before training)"),
    (dict(num_updates_per_train_iter=0), "TrainerConfig.num_updates_per_train_iter = 0: expected an int >= 1"),
    (dict(replay_buffer_length=0),  # Also too short for whole-buffer training: both are reported.
     "2 problems in TrainerConfig: [1] TrainerConfig.replay_buffer_length = 0: expected an int >= 1. "
     "[2] TrainerConfig.whole_replay_buffer_training=True needs TrainerConfig.replay_buffer_length (now 0) >= "
     "ceil(TrainerConfig.unroll_length)+1 = 9 (one unroll plus the step to bootstrap from)."),
    (dict(mini_batch_size=0), "TrainerConfig.mini_batch_size = 0: expected an int >= 1 or None"),
    (dict(mini_batch_length=0), "TrainerConfig.mini_batch_length = 0: expected an int >= 1 or None"),
    (dict(whole_replay_buffer_training=False, mini_batch_size=None, mini_batch_length=2),
     "TrainerConfig.whole_replay_buffer_training=False needs TrainerConfig.mini_batch_size (now None) and "
     "TrainerConfig.mini_batch_length (now 2) to be set"),
    (dict(unroll_length=8, replay_buffer_length=8),
     "TrainerConfig.whole_replay_buffer_training=True needs TrainerConfig.replay_buffer_length (now 8) >= "
     "ceil(TrainerConfig.unroll_length)+1 = 9 (one unroll plus the step to bootstrap from)"),
    (dict(unroll_length=2.5, replay_buffer_length=3),
     "TrainerConfig.whole_replay_buffer_training=True needs TrainerConfig.replay_buffer_length (now 3) >= "
     "ceil(TrainerConfig.unroll_length)+1 = 4 (one unroll plus the step to bootstrap from)"),
    (dict(mini_batch_length=2000),
     "TrainerConfig.mini_batch_length=2000 must be <= TrainerConfig.replay_buffer_length=1024"),
    (dict(evaluate=True, num_eval_environments=0),
     "TrainerConfig.num_eval_environments=0 must be >= 1 when TrainerConfig.evaluate=True"),
    (dict(evaluate=True, num_eval_episodes=0),
     "TrainerConfig.num_eval_episodes=0 must be >= 1 when TrainerConfig.evaluate=True"),
    (dict(evaluate=True, eval_interval=0),
     "TrainerConfig.eval_interval=0 must be >= 1 (iterations) when TrainerConfig.evaluate=True"),
    (dict(num_evals=0), "TrainerConfig.num_evals = 0: expected an int >= 1 or None"),
    (dict(num_summaries=0), "TrainerConfig.num_summaries = 0: expected an int >= 1 or None"),
    (dict(summary_interval=0), "TrainerConfig.summary_interval = 0: expected an int >= 1 (iterations)"),
    (dict(epsilon_greedy=-0.1), "TrainerConfig.epsilon_greedy = -0.1: expected a number in [0, 1]"),
    (dict(epsilon_greedy=1.5), "TrainerConfig.epsilon_greedy = 1.5: expected a number in [0, 1]"),
    (dict(summaries_flush_secs=0), "TrainerConfig.summaries_flush_secs = 0: expected a number > 0 (seconds)"),
    (dict(summary_max_queue=0), "TrainerConfig.summary_max_queue = 0: expected an int >= 1"),
    (dict(metric_min_buffer_size=0), "TrainerConfig.metric_min_buffer_size = 0: expected an int >= 1 (episodes)"),
    (dict(root_dir=''), "TrainerConfig.root_dir is empty; pass --root_dir to the train command"),
    (dict(num_iterations='10'),
     "TrainerConfig.num_iterations = '10': expected an int >= 0 (0: no limit from iterations)"),
    (dict(num_iterations=3.5),
     "TrainerConfig.num_iterations = 3.5: expected an int >= 0 (0: no limit from iterations)"),
    (dict(num_env_steps=-1), "TrainerConfig.num_env_steps = -1: expected an int >= 0 (0: no limit from env steps)"),
    (dict(unroll_length=True),
     "TrainerConfig.unroll_length = True: expected a number >= 0 (env steps per env per iteration)"),
    (dict(evaluate='yes'), "TrainerConfig.evaluate = 'yes': expected True or False"),
    (dict(priority_replay_alpha='fast'),
     "TrainerConfig.priority_replay_alpha = 'fast': expected a number >= 0 or a schedule (e.g. @LinearScheduler())"),
    (dict(priority_replay_eps=-1e-6), "TrainerConfig.priority_replay_eps = -1e-06: expected a number >= 0"),
    (dict(code_snapshots='a.py'), "TrainerConfig.code_snapshots = 'a.py': expected a list or tuple of strings or None"),
    (dict(algorithm_ctor=3), "TrainerConfig.algorithm_ctor = 3: expected a callable (e.g. @Name) or None"),
], ids=lambda v: ','.join(f'{k}={v[k]}' for k in v) if isinstance(v, dict) else None)
def test_range_and_cross_field_checks(overrides, message):
    assert error_of(**overrides) == message


@pytest.mark.parametrize('overrides', [
    dict(num_iterations=0, num_env_steps=100),
    dict(num_iterations=10, num_env_steps=0),
    dict(priority_replay_alpha=lambda: 0.5, priority_replay_beta=1),
    dict(unroll_length=0.25, replay_buffer_length=2),
    dict(whole_replay_buffer_training=False, mini_batch_size=4, mini_batch_length=2, replay_buffer_length=2),
    dict(evaluate=False, num_eval_environments=0, eval_interval=0),
    dict(epsilon_greedy=1.0, num_checkpoints=0, num_evals=1, num_summaries=1),
])
def test_boundary_values_are_valid(overrides):
    config = make(**overrides)
    assert all(getattr(config, k) == v for k, v in overrides.items())


def test_a_wrong_type_is_reported_alone():
    # Range and cross-field checks would compare the string with numbers; only the type is reported.
    assert error_of(num_iterations='10', summary_interval=0, mini_batch_length=5000) == (
        "TrainerConfig.num_iterations = '10': expected an int >= 0 (0: no limit from iterations)")


def test_whole_floats_are_stored_as_ints():
    # ALF confs write step counts such as 1e6; downstream code gets ints.
    config = make(num_iterations=0, num_env_steps=1e6, initial_collect_steps=1e3, mini_batch_size=64.0)
    assert (config.num_env_steps, config.initial_collect_steps, config.mini_batch_size) == (1000000, 1000, 64)
    assert all(type(v) is int for v in (config.num_env_steps, config.initial_collect_steps, config.mini_batch_size))
    assert type(make(unroll_length=2.0).unroll_length) is float  # a float parameter keeps its float


def test_several_problems_are_numbered_on_one_line():
    message = error_of(root_dir='', summary_interval=0, offline_buffer_length=5)
    assert message == (
        "3 problems in TrainerConfig: "
        "[1] TrainerConfig.root_dir is empty; pass --root_dir to the train command. "
        "[2] TrainerConfig.summary_interval = 0: expected an int >= 1 (iterations). "
        "[3] TrainerConfig.offline_buffer_length=5 limits the offline data, but TrainerConfig.offline_buffer_dir is "
        "not set; set it or remove offline_buffer_length.")


def test_error_from_gin_bound_value_stays_one_line():
    # gin re-raises errors from configurables with an extra "In call to configurable" line; ours must not get it.
    gin.parse_config('TrainerConfig.summary_interval = 0')
    with pytest.raises(TrainerConfigError) as info:
        make()
    assert isinstance(info.value, ValueError)
    assert str(info.value) == "TrainerConfig.summary_interval = 0: expected an int >= 1 (iterations)"


@pytest.mark.parametrize('num_iterations, num_env_steps, unroll_length, num_envs, expected', [
    (100, 0, 8, 4, 100),  # iterations only
    (0, 1000, 8, 4, 32),  # ceil(1000 / 32) = 31.25 -> 32
    (0, 1024, 8, 4, 32),  # exactly 32
    (100, 1000, 8, 4, 32),  # env steps reached first
    (20, 1000, 8, 4, 20),  # iterations reached first
    (0, 300, 0.1, 1, 3000),  # one step every 10 iterations
    (0, 30, 0.3, 1, 100),  # exact: the float 0.3 is a bit below 0.3, which must not cost an extra iteration
    (0, 10, 0.5, 3, 7),  # 1.5 steps per iteration: ceil(6.67) = 7
    (0, 1e6, 8, 1, 125000),  # ALF confs write float step counts
])
def test_expected_num_iterations(num_iterations, num_env_steps, unroll_length, num_envs, expected):
    config = make(num_iterations=num_iterations, num_env_steps=num_env_steps, unroll_length=unroll_length,
                  replay_buffer_length=16)
    assert config.expected_num_iterations(num_envs) == expected


def test_expected_num_iterations_needs_an_env():
    with pytest.raises(ValueError, match='num_envs=0 must be >= 1'):
        make().expected_num_iterations(0)


def test_resolved_intervals_use_fixed_intervals_by_default():
    config = make(summary_interval=25, eval_interval=7)
    assert (config.resolved_summary_interval(4), config.resolved_eval_interval(4)) == (25, 7)


def test_resolved_intervals_from_counts():
    config = make(num_iterations=1000, num_summaries=30, num_evals=7)
    assert config.resolved_summary_interval(1) == 33  # 1000 // 30
    assert config.resolved_eval_interval(1) == 142  # 1000 // 7


def test_resolved_intervals_from_counts_with_env_steps():
    config = make(num_iterations=0, num_env_steps=6400, unroll_length=8, num_summaries=10, num_evals=3)
    # 6400 / (8 * 2) = 400 iterations with 2 envs.
    assert config.resolved_summary_interval(2) == 40
    assert config.resolved_eval_interval(2) == 133


def test_resolved_interval_is_at_least_one():
    config = make(num_iterations=5, num_summaries=50, num_evals=6)
    assert config.resolved_summary_interval(1) == 1
    assert config.resolved_eval_interval(1) == 1


@pytest.mark.parametrize('num_iterations, num_checkpoints, expected', [
    (1000, 10, [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000]),
    (10, 3, [3, 6, 10]),
    (7, 1, [7]),
    (3, 10, [1, 2, 3]),  # fewer iterations than checkpoints: one per iteration
    (1000, 0, []),
])
def test_checkpoint_iterations(num_iterations, num_checkpoints, expected):
    config = make(num_iterations=num_iterations, num_checkpoints=num_checkpoints)
    assert config.checkpoint_iterations(num_envs=4) == expected


def test_checkpoint_iterations_with_env_steps():
    config = make(num_iterations=0, num_env_steps=100, unroll_length=8, num_checkpoints=2)
    assert config.checkpoint_iterations(num_envs=1) == [6, 13]  # ceil(100 / 8) = 13 iterations


@pytest.mark.parametrize('overrides, message', [
    (dict(offline_buffer_length=100),
     "TrainerConfig.offline_buffer_length=100 limits the offline data, but TrainerConfig.offline_buffer_dir is not "
     "set; set it or remove offline_buffer_length"),
    (dict(rl_train_every_update_steps=2),
     "TrainerConfig.rl_train_after_update_steps / rl_train_every_update_steps schedule the RL part of hybrid "
     "training, but TrainerConfig.offline_buffer_dir is not set; set it or remove them"),
    (dict(offline_buffer_dir='/data/x.npz'),
     "TrainerConfig.offline_buffer_dir trains from sampled mini-batches: set "
     "TrainerConfig.whole_replay_buffer_training=False (with mini_batch_size and mini_batch_length)"),
    (dict(offline_buffer_dir=[], whole_replay_buffer_training=False, mini_batch_size=4, mini_batch_length=2),
     "TrainerConfig.offline_buffer_dir=[] names no source; give one or more paths, or None"),
    (dict(offline_buffer_dir='/x', offline_buffer_length=1, whole_replay_buffer_training=False, mini_batch_size=4,
          mini_batch_length=2),
     "TrainerConfig.offline_buffer_length = 1: expected an int >= 2 or None (steps loaded from each offline "
     "source)"),
])
def test_offline_parameters_that_cannot_work_are_one_line_errors(overrides, message):
    assert error_of(**overrides).startswith(message)


def test_offline_buffer_dir_takes_one_source_or_a_list():
    base = dict(whole_replay_buffer_training=False, mini_batch_size=4, mini_batch_length=2)
    assert make(offline_buffer_dir='/a', **base).offline_buffer_dir == '/a'
    assert make(offline_buffer_dir=['/a', 'd4rl:/b.npz'], **base).offline_buffer_dir == ['/a', 'd4rl:/b.npz']
