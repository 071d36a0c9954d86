"""Typed, ranged config values: a bad value bound to an alfish configurable fails when the conf is loaded, in one line
naming the file and line, the binding, the value given and what is expected; no shipped conf is refused."""
import inspect
import os
import pathlib
import subprocess
import sys
import time
import typing

import gin
import gymnasium
import pytest
from gin import config as gin_config

from alfish.config import (
    ConfError,
    binding_checks,
    load_conf,
    load_config_text,
    registration,
    value_checks,
    value_rules,
)

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFS = sorted((REPO / 'confs').glob('*.gin'))

# Lines above the bad binding in each conf of the table, so the reported line number is not trivially 1.
PREAMBLE = "# a conf\ncreate_environment.env_name = 'Pendulum-v1'\n\n"
LINE = 4

SCHEDULE = "a number > 0 or a schedule (e.g. @LinearScheduler())"

# (bad binding, the message after 'x.gin:4: <binding> = <value>: expected ').
BAD_VALUES = [
    # Wrong types.
    ("SacAlgorithm.actor_lr = 'fast'", SCHEDULE),
    ("TrainerConfig.num_iterations = 3.5", "an int >= 0 (0: no limit from iterations)"),
    ("TrainerConfig.num_iterations = True", "an int >= 0 (0: no limit from iterations)"),
    ("TrainerConfig.evaluate = 'yes'", "True or False"),
    ("TrainerConfig.evaluate = 1", "True or False"),
    ("DqnAlgorithm.gamma = '0.99'", "a number in (0, 1]"),
    ("TrainerConfig.random_seed = 1.5", "an int or None"),
    ("create_environment.env_name = 3", "a string"),
    ("create_environment.env_kwargs = [1, 2]", "a dict or None"),
    ("TrainerConfig.algorithm_ctor = 3", "a callable (e.g. @Name) or None"),
    ("TrainerConfig.code_snapshots = 'a.py'", "a list or tuple of strings or None"),
    ("PpoAlgorithm.clip_range = @MLP()", SCHEDULE),  # a called reference to a class that is not a schedule
    # Out of range.
    ("SacAlgorithm.gamma = 1.5", "a number in (0, 1]"),
    ("SacAlgorithm.gamma = 0", "a number in (0, 1]"),
    ("DqnAlgorithm.lr = 0", SCHEDULE),
    ("DqnAlgorithm.epsilon_greedy = -0.1", "a number in [0, 1] or a schedule (e.g. @LinearScheduler())"),
    ("TrainerConfig.mini_batch_size = 0", "an int >= 1 or None"),
    ("TrainerConfig.num_env_steps = -1", "an int >= 0 (0: no limit from env steps)"),
    ("TrainerConfig.priority_replay_alpha = -0.5", "a number >= 0 or a schedule (e.g. @LinearScheduler())"),
    ("create_environment.num_parallel_environments = 0", "an int >= 1"),
    ("HindsightExperienceTransformer.her_proportion = 1.2", "a number in [0, 1]"),
    ("OptimizerConfig.betas = (0.9, 1.0)", "a list or tuple of numbers in [0, 1) or None"),
    ("Trainer.num_threads = 0", "an int >= 1, 'auto' or None"),
    ("Trainer.stop_grace_s = 0", "a number > 0 (seconds after SIGTERM before the process ends anyway)"),
    # Misspelled strings from a fixed set: the closest valid one is suggested.
    ("create_environment.vectorization = 'asyn'", "one of 'sync', 'async', 'envpool'; did you mean 'async'?"),
    ("PpoAlgorithm.activation = 'Tanh'",
     "one of 'relu', 'tanh', 'elu', 'gelu', 'silu', 'leaky_relu'; did you mean 'tanh'?"),
    ("DevicePolicy.device = 'cpuu'", "one of 'auto', 'cpu', 'cuda', 'cuda:N'; did you mean 'cpu'?"),
    ("Trainer.num_threads = 'atuo'", "an int >= 1, 'auto' or None; did you mean 'auto'?"),
    ("LinearScheduler.progress_type = 'percnt'",
     "one of 'percent', 'iterations', 'env_steps'; did you mean 'percent'?"),
    ("AmpPolicy.dtype = 'bf16'", "one of 'bfloat16', 'float16' or None; did you mean 'bfloat16'?"),
    # One valid element where a list of them is expected.
    ("Trainer.trackers = 'wandb'", "a list or tuple of one of 'wandb', 'mlflow'; write ['wandb']: a list, even of one"),
    ("Trainer.trackers = 'wandbb'", "a list or tuple of one of 'wandb', 'mlflow'; did you mean 'wandb'?"),
    # Wrong tuple shapes and contents.
    ("SacAlgorithm.hidden_sizes = 'abc'", "a list or tuple of ints >= 1, e.g. (256, 256)"),
    ("SacAlgorithm.hidden_sizes = 256", "a list or tuple of ints >= 1, e.g. (256, 256)"),
    ("SacAlgorithm.hidden_sizes = (256, 0)", "a list or tuple of ints >= 1, e.g. (256, 256)"),
    ("A2cAlgorithm.hidden_sizes = (64.5, 64)", "a list or tuple of ints >= 1, e.g. (64, 64)"),
    ("LinearScheduler.schedule = [(0, 1.0, 2)]", "a list or tuple of (number, number) pairs"),
    ("LinearScheduler.schedule = (0, 1.0)", "a list or tuple of (number, number) pairs"),
    # A reference to a class where an instance is meant.
    ("DqnAlgorithm.epsilon_greedy = @LinearScheduler",
     "a number in [0, 1] or a schedule (e.g. @LinearScheduler()); @LinearScheduler is the class itself: "
     "write @LinearScheduler() to make one"),
]


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Each test in an empty cwd with a clean gin config (alfish's configurables registered as the train command
    registers them)."""
    monkeypatch.chdir(tmp_path)
    gin.clear_config()
    yield
    gin.clear_config()


def write(path: str, text: str) -> str:
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    pathlib.Path(path).write_text(text)
    return path


def conf_error(conf_file, conf_params=()) -> str:
    """The one-line ConfError message load_conf raises (the test fails if none is raised)."""
    with pytest.raises(ConfError) as info:
        load_conf(conf_file, conf_params)
    message = str(info.value)
    assert '\n' not in message
    return message


def expected_message(binding: str, expectation: str) -> str:
    name, value = (part.strip() for part in binding.split('=', 1))
    return f"x.gin:{LINE}: {name} = {value}: expected {expectation}"


@pytest.mark.parametrize('binding, expectation', BAD_VALUES, ids=[b for b, _ in BAD_VALUES])
def test_bad_value_is_one_line_naming_file_line_binding_and_expectation(binding, expectation):
    write('x.gin', PREAMBLE + binding + '\nTrainerConfig.unroll_length = 1\n')
    assert conf_error('x.gin') == expected_message(binding, expectation)


def test_whole_table_in_under_5_s_and_before_any_env_is_created(monkeypatch):
    registration.register_configurables()  # the one-time import of alfish (torch included) is not part of the check
    made = []
    monkeypatch.setattr(gymnasium, 'make', lambda *args, **kwargs: made.append(args))
    start = time.perf_counter()
    for binding, expectation in BAD_VALUES:
        write('x.gin', PREAMBLE + binding + '\n')
        assert conf_error('x.gin') == expected_message(binding, expectation)
    elapsed = time.perf_counter() - start
    assert elapsed < 5, f'{len(BAD_VALUES)} bad confs took {elapsed:.1f} s'
    assert made == []


@pytest.mark.parametrize('conf', CONFS, ids=[c.name for c in CONFS])
def test_every_shipped_conf_loads_without_a_false_positive(conf, monkeypatch):
    monkeypatch.chdir(REPO)  # as the train command is run
    load_conf(str(conf.relative_to(REPO)))
    assert binding_checks.binding_problems() == []
    assert gin_config._CONFIG  # the conf did bind values, so there was something to check


def test_every_default_fits_its_own_annotation_and_rules():
    # An operative config records the defaults a run used; reloading it (play, resume) must not be refused.
    registration.register_configurables()
    checked = 0
    for selector, configurable in gin_config._REGISTRY.items():
        if not selector.startswith('alfish.'):
            continue
        for name, parameter in value_checks.parameters_of(configurable.wrapped, selector.split('.')[-1]).items():
            default = _default(configurable.wrapped, name)
            if default is not _NO_DEFAULT:
                assert parameter.problem(default) is None, f'{selector}.{name} = {default!r}'
                checked += 1
    assert checked > 150


def test_every_rule_names_a_real_parameter():
    registration.register_configurables()
    parameters = {(selector.split('.')[-1], name)
                  for selector, configurable in gin_config._REGISTRY.items() if selector.startswith('alfish.')
                  for name in value_checks.parameters_of(configurable.wrapped, selector.split('.')[-1])}
    for key in value_rules.RULES:
        owner, name = key.split('.')
        assert (any(n == name for _, n in parameters) if owner == '*' else (owner, name) in parameters), key
    for rule in value_rules.RULES.values():
        for one_of in (r for r in (rule if isinstance(rule, tuple) else (rule,)) if isinstance(r, value_rules.OneOf)):
            assert one_of.values()  # a 'module:NAME' that resolves to the strings the code checks against


_NO_DEFAULT = object()


def _default(fn, name):
    target = gin_config._find_class_construction_fn(fn) if inspect.isclass(fn) else fn
    default = inspect.signature(inspect.unwrap(target)).parameters[name].default
    return _NO_DEFAULT if default is inspect.Parameter.empty else default


def test_literal_annotations_are_checked_with_a_suggestion():
    # BcAlgorithm.policy is a Literal; a configurable that declares one gets the same check.
    def fn(mode: typing.Optional[typing.Literal['fast', 'exact']] = 'fast', sizes: tuple[int, ...] = (1,)):
        return mode, sizes
    parameters = value_checks.parameters_of(fn, 'fn')
    assert parameters['mode'].problem('exact') is None and parameters['mode'].problem(None) is None
    problem = parameters['mode'].problem('fats')
    assert problem.message('fn.mode', "'fats'") == (
        "fn.mode = 'fats': expected one of 'fast', 'exact' or None; did you mean 'fast'?")
    assert parameters['sizes'].problem((1, 2, 3)) is None
    assert parameters['sizes'].problem((1, 'a')).expected == 'a list or tuple of ints, e.g. (1,)'


# ---------------------------------------------------------------------------------------------------------------------
# Where the value comes from: macros, references, scopes, includes, --conf_param, stored configs


def test_macro_value_names_the_binding_and_where_the_macro_is_set():
    write('x.gin', "rate = 'fast'\n\nSacAlgorithm.actor_lr = %rate\n")
    assert conf_error('x.gin') == (
        f"x.gin:3: SacAlgorithm.actor_lr = %rate = 'fast': expected {SCHEDULE}; %rate is set at x.gin:1")


def test_macros_inside_a_tuple_are_resolved():
    write('x.gin', "width = 64.5\nSacAlgorithm.hidden_sizes = (%width, %width)\n")
    assert conf_error('x.gin') == (
        "x.gin:2: SacAlgorithm.hidden_sizes = (%width, %width) = (64.5, 64.5): expected a list or tuple of ints >= 1, "
        "e.g. (256, 256)")


def test_good_macros_and_references_pass():
    load_conf(None, ['rate = 1e-3', 'SacAlgorithm.actor_lr = %rate', 'SacAlgorithm.critic_lr = @LinearScheduler()',
                     'SacAlgorithm.alpha_lr = @ConstantScheduler()', 'TrainerConfig.algorithm_ctor = @SacAlgorithm',
                     'width = 32', 'SacAlgorithm.hidden_sizes = [%width, %width]',
                     'TrainerConfig.num_env_steps = 1e6',  # ALF confs write step counts as floats
                     'TrainerConfig.mini_batch_size = None', "Trainer.num_threads = 'auto'",
                     "DevicePolicy.device = 'cuda:1'", "create_environment.env_kwargs = {'num_bits': 4}",
                     'TrainerConfig.data_transformer_ctor = [@HindsightExperienceTransformer]'])
    assert gin.query_parameter('SacAlgorithm.actor_lr') is not None


def test_scoped_binding_is_named_with_its_scope():
    write('x.gin', "actor/MLP.hidden_sizes = (64, -1)\n")
    assert conf_error('x.gin') == (
        "x.gin:1: actor/MLP.hidden_sizes = (64, -1): expected a list or tuple of ints >= 1, e.g. (256, 256)")


def test_block_binding_names_its_own_line():
    write('x.gin', "SacAlgorithm:\n    gamma = 0.99\n    target_update_tau = 2\n")
    assert conf_error('x.gin') == (
        "x.gin:3: SacAlgorithm.target_update_tau = 2: expected a number in (0, 1] or a schedule "
        "(e.g. @LinearScheduler())")


def test_value_in_included_file_names_that_file_and_the_include():
    write('confs/base.gin', "# base\nTrainerConfig.num_iterations = 2.5\n")
    write('confs/main.gin', "create_environment.env_name = 'CartPole-v1'\ninclude 'base.gin'\n")
    assert conf_error('confs/main.gin') == (
        "confs/base.gin:2 (included from confs/main.gin:2): TrainerConfig.num_iterations = 2.5: expected an int >= 0 "
        "(0: no limit from iterations)")


def test_last_binding_wins_and_is_the_one_located():
    # The conf's good value is overridden by a bad --conf_param: the --conf_param is named, not the file.
    write('x.gin', "SacAlgorithm.gamma = 0.99\n")
    assert conf_error('x.gin', ['SacAlgorithm.gamma = 2']) == (
        "--conf_param 'SacAlgorithm.gamma = 2': SacAlgorithm.gamma = 2: expected a number in (0, 1]")
    write('y.gin', "SacAlgorithm.gamma = 2\n")
    load_conf('y.gin', ['SacAlgorithm.gamma = 0.5'])  # and a bad value overridden by a good one is fine


def test_several_bad_values_report_the_first_and_list_the_others():
    write('x.gin', "SacAlgorithm.gamma = 2\nSacAlgorithm.actor_lr = -1\nTrainerConfig.num_iterations = 0.5\n")
    assert conf_error('x.gin') == (
        "x.gin:1: SacAlgorithm.gamma = 2: expected a number in (0, 1] (and 2 more bad values: x.gin:2, x.gin:3)")


def test_stored_config_value_names_the_stored_file():
    with pytest.raises(ConfError) as info:
        load_config_text("import alfish.config\nTrainerConfig.num_iterations = 3.5\n", 'runs/a/config/operative.gin')
    assert str(info.value) == ("runs/a/config/operative.gin:2: TrainerConfig.num_iterations = 3.5: expected an int "
                               ">= 0 (0: no limit from iterations)")


@gin.configurable
def valuetest_user_configurable(rate: float = 0.1):
    return rate


def test_configurables_outside_alfish_are_not_checked():
    # Their annotations are their authors' business; alfish enforces only its own.
    load_conf(None, ["valuetest_user_configurable.rate = 'fast'"])
    assert valuetest_user_configurable() == 'fast'


# ---------------------------------------------------------------------------------------------------------------------
# The train command


def test_train_with_a_bad_value_exits_2_with_one_line_and_writes_nothing(tmp_path):
    conf = write(str(tmp_path / 'bad.gin'), "include 'confs/sac_pendulum.gin'\n\nSacAlgorithm.actor_lr = 'fast'\n")
    root = tmp_path / 'run'
    env = dict(os.environ, OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, '-m', 'alfish.bin.train', '--conf', conf, '--root_dir', str(root)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: {conf}:3: SacAlgorithm.actor_lr = 'fast': expected {SCHEDULE}"], proc.stderr
    assert not (root / 'checkpoints').exists()
    # Nothing of a run was written (today the conf is refused before the run directory is even made).
    assert not root.exists() or not [p for p in root.rglob('*') if p.name != 'log.txt']
