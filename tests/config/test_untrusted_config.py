"""A config stored in a results directory is parsed in a restricted mode (alfish.config.untrusted): it can reach only
the registered configurables of alfish and of the modules the user trusts with --allow_import, and it cannot make gin
or gymnasium import or call anything else. Every refusal is one line naming the line and the flag that trusts it."""
import pathlib
import sys

import gin
import gymnasium as gym
import pytest
from gin import config as gin_config
from gin.selector_map import SelectorMap

from alfish.config import ConfError, TrainerConfig, load_conf, load_config_text
from alfish.config.untrusted import MAX_STORED_CONFIG_BYTES, check_env_names
from alfish.trainer.build import build_trainer
from tests.shipped_confs import BOX2D_CONFS, MUJOCO_CONFS, data_params, skip_unless_installed

CONFS = pathlib.Path(__file__).resolve().parents[2] / 'confs'
STORED = 'runs/a/meta.json[operative_config]'
TRUST_ROOT_DIR = "if you trust this root_dir completely, pass --allow_import '*'"
# A module that writes a marker file when imported: what a 'module:EnvId' env name would make gymnasium import.
MARKER_MODULE = 'untrusted_test_marker'
NOT_REGISTERED = ("is not a registered configurable; a stored config may name only the configurables of alfish and of "
                  "modules trusted with --allow_import, never a function reached through a module's attributes; "
                  + TRUST_ROOT_DIR)


@gin.configurable
def untrusted_test_helper(x=1):
    """A configurable of this (test) module: registered, but not trusted unless the test module is allowed."""
    return x


gin.constant('untrusted_test.ENTROPY', 0.01)


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """An empty cwd and a clean gin config for each test."""
    monkeypatch.chdir(tmp_path)
    gin.clear_config()
    yield
    gin.clear_config()


@pytest.fixture
def marker(tmp_path, monkeypatch) -> pathlib.Path:
    """The file MARKER_MODULE writes when it is imported; the module is importable from sys.path and from the cwd."""
    path = tmp_path / 'imported'
    (tmp_path / f'{MARKER_MODULE}.py').write_text(f"open({str(path)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, MARKER_MODULE, raising=False)
    return path


def refusal(text: str, allowed=('alfish',)) -> str:
    """The one-line ConfError load_config_text raises for `text`; nothing may have been bound."""
    with pytest.raises(ConfError) as info:
        load_config_text(text, STORED, allowed)
    message = str(info.value)
    assert '\n' not in message
    assert gin_config._CONFIG == {}
    return message


# ----------------------------------------------------------------------------------------------------------------
# Code execution through gin


DYNAMIC_REGISTRATION_PAYLOAD = """\
from __gin__ import dynamic_registration
import alfish.rundir.checkpoint
import alfish.config.trainer_config
alfish.rundir.checkpoint.os.system.command = 'touch {marker}'
alfish.config.trainer_config.TrainerConfig.random_seed = @alfish.rundir.checkpoint.os.system()
"""


def test_dynamic_registration_payload_is_refused(tmp_path):
    marker = tmp_path / 'pwned'
    assert refusal(DYNAMIC_REGISTRATION_PAYLOAD.format(marker=marker)) == (
        f"{STORED}:1: 'from __gin__ import dynamic_registration' is not allowed in a stored config (it makes any "
        f"function reachable from an imported module callable); {TRUST_ROOT_DIR}")
    assert not marker.exists()


@pytest.fixture
def scratch_registry(monkeypatch):
    """gin's registry as a copy for one test: what dynamic registration adds to it is dropped after the test."""
    registry = SelectorMap()
    for selector, configurable in gin_config._REGISTRY.items():
        registry[selector] = configurable
    monkeypatch.setattr(gin_config, '_REGISTRY', registry)
    monkeypatch.setattr(gin_config, '_INVERSE_REGISTRY', dict(gin_config._INVERSE_REGISTRY))


def test_dynamic_registration_payload_runs_a_shell_command_when_the_root_dir_is_trusted(tmp_path, scratch_registry):
    # What the refusal above prevents: with '*' the config is parsed as a conf the user wrote, and building the
    # TrainerConfig (as play does) runs the command.
    marker = tmp_path / 'pwned'
    load_config_text(DYNAMIC_REGISTRATION_PAYLOAD.format(marker=marker), STORED, ('*',))
    with pytest.raises(ValueError, match='algorithm_ctor is not set'):
        TrainerConfig(root_dir=str(tmp_path))
    assert marker.exists()
    # os.system is in gin's registry now, under alfish's module path; a restricted parse still refuses it.
    gin.clear_config()
    assert gin_config._REGISTRY.get_match('alfish.rundir.checkpoint.os.system') is not None
    assert refusal("alfish.rundir.checkpoint.os.system.command = 'touch x'\n") == (
        f"{STORED}:1: 'alfish.rundir.checkpoint.os.system' {NOT_REGISTERED}")


def test_gin_directives_are_refused_even_for_an_allowed_gin_prefix():
    assert refusal("from __gin__ import dynamic_registration\n", ('alfish', '__gin__')).startswith(
        f"{STORED}:1: 'from __gin__ import dynamic_registration' is not allowed in a stored config")


@pytest.mark.parametrize('text, name', [
    ("TrainerConfig.algorithm_ctor = @alfish.envs.batched_env.os.system()\n", '@alfish.envs.batched_env.os.system'),
    ("TrainerConfig.algorithm_ctor = @os.system\n", '@os.system'),
    ("alfish.rundir.checkpoint.os.system.command = 'touch x'\n", 'alfish.rundir.checkpoint.os.system'),
    ("scope/alfish.rundir.checkpoint.os.system.command = 'touch x'\n", 'alfish.rundir.checkpoint.os.system'),
    ("alfish.rundir.checkpoint.os.system:\n    command = 'touch x'\n", 'alfish.rundir.checkpoint.os.system'),
    ("TrainerConfig.data_transformer_ctor = [@ObservationNormalizer, @os.system()]\n", '@os.system'),
    ("create_environment.env_kwargs = {'x': @scope/os.system()}\n", '@os.system'),
    ("RUN = @os.system()\n", '@os.system'),
])
def test_attribute_chains_are_refused(text, name):
    assert refusal("# stored\n" + text) == f"{STORED}:2: '{name}' {NOT_REGISTERED}"


@pytest.mark.parametrize('statement, module', [
    ('import os', 'os'), ('from os import system', 'os.system'), ('import alfishx', 'alfishx'),
    ('import os.path as alfish', 'os.path'),
])
def test_imports_outside_trusted_prefixes_are_refused(statement, module):
    assert refusal(f"{statement}\n") == (
        f"{STORED}:1: import of module '{module}' is not allowed in a stored config (trusted: 'alfish'); "
        f"if you trust that module, pass --allow_import {module}")


def test_an_untrusted_import_is_refused_before_it_runs(marker):
    assert 'is not allowed in a stored config' in refusal(f"TrainerConfig.random_seed = 1\nimport {MARKER_MODULE}\n")
    assert not marker.exists()
    load_config_text(f"import {MARKER_MODULE}\n", STORED, ('alfish', MARKER_MODULE))
    assert marker.exists()  # trusted: imported, as the conf given to train imported it


def test_alfish_imports_are_allowed_and_missing_modules_named():
    load_config_text("import alfish.envs.toy\nimport alfish.config.trainer_config as tc\n", STORED)
    assert refusal("import alfish.no_such_module\n") == (
        f"{STORED}:1: cannot import module: no module named 'alfish.no_such_module'")


def test_include_is_refused():
    (pathlib.Path('base.gin')).write_text("TrainerConfig.random_seed = 3\n")
    assert refusal("# stored\ninclude 'base.gin'\n") == (
        f"{STORED}:2: include 'base.gin' is not allowed in a stored config (it would read another file); "
        f"{TRUST_ROOT_DIR}")


def test_configurables_of_untrusted_modules_are_refused_and_trusted_with_their_module():
    module = untrusted_test_helper.__module__
    assert refusal("untrusted_test_helper.x = 2\n") == (
        f"{STORED}:1: configurable 'untrusted_test_helper' is defined in module '{module}', which a stored config "
        f"may not use; if you trust that module, pass --allow_import {module}")
    assert refusal("TrainerConfig.algorithm_ctor = @untrusted_test_helper\n").startswith(
        f"{STORED}:1: configurable '@untrusted_test_helper' is defined in module '{module}'")
    load_config_text("untrusted_test_helper.x = 2\n", STORED, ('alfish', module))
    assert untrusted_test_helper() == 2


def test_misspelled_configurable_is_suggested_from_trusted_ones_only():
    assert refusal("SacAlgorthm.gamma = 0.5\n") == f"{STORED}:1: unknown configurable 'SacAlgorthm'; did you mean " \
                                                   f"'SacAlgorithm'?"
    assert "did you mean" not in refusal("untrusted_test_helpr.x = 1\n")  # its module is not trusted


def test_prefixes_must_be_module_names():
    with pytest.raises(ConfError) as info:
        load_config_text("TrainerConfig.random_seed = 1\n", STORED, ('alfish', 'my-envs'))
    assert str(info.value) == ("--allow_import 'my-envs' is not a module name: give a module or package prefix such "
                               "as 'my_envs' or 'my_pkg.envs', or '*' to trust the root_dir completely")


def test_trust_all_parses_like_a_conf_the_user_wrote():
    load_config_text("import os.path\ninclude_me = 1\n", STORED, ('*',))
    assert gin.query_parameter('%include_me') == 1


# ----------------------------------------------------------------------------------------------------------------
# 'module:EnvId' env names


def env_refusal(line: int, binding: str, value: str) -> str:
    return (f"{STORED}:{line}: {binding} names env {value!r}, and gymnasium would import module '{MARKER_MODULE}' "
            f"to make it; a stored config may not import modules: if you trust that module, pass --allow_import "
            f"{MARKER_MODULE}")


ENV = f'{MARKER_MODULE}:Evil-v0'


@pytest.mark.parametrize('text, line, binding', [
    (f"create_environment.env_name = '{ENV}'\n", 1, 'create_environment.env_name'),
    (f"eval/create_environment.env_name = '{ENV}'\n", 1, 'eval/create_environment.env_name'),
    (f"create_environment:\n    num_parallel_environments = 1\n    env_name = '{ENV}'\n", 3,
     'create_environment.env_name'),
    (f"create_environment.env_name = %ENV\nENV = '{ENV}'\n", 1, 'create_environment.env_name'),
    (f"create_environment.env_name = 'alfish/Latency-v0'\ncreate_environment.env_kwargs = {{'env_name': '{ENV}'}}\n",
     2, 'create_environment.env_kwargs'),
])
def test_module_env_names_are_refused(marker, text, line, binding):
    assert refusal(text) == env_refusal(line, binding, ENV)
    assert not marker.exists()


def test_module_env_name_payload_imports_the_module_when_trusted(marker):
    # What the refusal prevents: gymnasium imports the module of 'module:EnvId' before it looks the id up.
    load_config_text(f"create_environment.env_name = '{ENV}'\n", STORED, ('alfish', MARKER_MODULE))
    with pytest.raises(gym.error.Error, match="Environment `Evil` doesn't exist"):
        gym.make(gin.query_parameter('create_environment.env_name'))
    assert marker.exists()


def test_registered_env_ids_and_other_colons_are_fine():
    load_config_text("create_environment.env_name = 'alfish/BitFlipping-v0'\n"
                     "create_environment.env_kwargs = {'env_name': 'alfish.envs.toy:alfish/PointGoal-v0'}\n"
                     "DevicePolicy.device = 'cuda:0'\n", STORED)
    assert gin.query_parameter('DevicePolicy.device') == 'cuda:0'


def test_check_env_names_on_resolved_values():
    # play checks the values the env will be made from (macros and references evaluated) before gymnasium sees them.
    check_env_names({'create_environment.env_name': 'CartPole-v1', 'create_environment.env_kwargs': None}, ('alfish',))
    with pytest.raises(ConfError) as info:
        check_env_names({'create_environment.env_kwargs': {'wrapped': [f'{MARKER_MODULE}.sub:E-v0']}}, ('alfish',))
    assert str(info.value) == (
        f"create_environment.env_kwargs names env '{MARKER_MODULE}.sub:E-v0', and gymnasium would import module "
        f"'{MARKER_MODULE}.sub' to make it; a stored config may not import modules: if you trust that module, pass "
        f"--allow_import {MARKER_MODULE}.sub")
    check_env_names({'create_environment.env_name': f'{MARKER_MODULE}.sub:E-v0'}, ('alfish', MARKER_MODULE))


# ----------------------------------------------------------------------------------------------------------------
# Size


def test_stored_config_over_one_megabyte_is_refused():
    load_config_text('#' * (MAX_STORED_CONFIG_BYTES - 1) + '\n', STORED)  # exactly the limit
    over = (f"{STORED}: the stored config is over the limit of {MAX_STORED_CONFIG_BYTES} bytes (alfish writes a few "
            f"KB), so this root_dir is not as alfish wrote it: check where it came from")
    assert refusal('#' * MAX_STORED_CONFIG_BYTES + '\n') == over
    assert refusal('# ' + '\u00e9' * (MAX_STORED_CONFIG_BYTES // 2)) == over  # counted in bytes, not characters
    assert refusal('#' * MAX_STORED_CONFIG_BYTES + '\n', ('*',)) == over  # memory is bounded even when trusted


# ----------------------------------------------------------------------------------------------------------------
# What alfish writes loads unchanged


def operative_config_of(conf_file, params, root_dir) -> str:
    """The operative config a run of `conf_file` records: the trainer is built, which calls every configurable."""
    load_conf(str(conf_file), params)
    trainer = build_trainer(TrainerConfig(root_dir=str(root_dir)))
    try:
        return gin.operative_config_str()
    finally:
        trainer.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize('conf', sorted(p.name for p in CONFS.glob('*.gin')))
def test_operative_config_of_every_shipped_conf_round_trips(tmp_path, conf):
    skip_unless_installed(conf)
    # Async unroll and async evaluation would each start a child process (seconds of imports) at every build; the
    # operative config is the same but for those flags, which round-trip like any other binding.
    params = ['TrainerConfig.async_eval = False']
    params += ['TrainerConfig.async_unroll = False'] if 'realtime' in conf else []
    params += data_params(conf, tmp_path / 'data')
    if conf in MUJOCO_CONFS + BOX2D_CONFS and not conf.startswith('ppo_'):
        params.append('TrainerConfig.replay_buffer_length = 1000')  # not the 1M-step buffer, built twice per conf
    text = operative_config_of(CONFS / conf, params, tmp_path / 'a')
    load_config_text(text, STORED)
    trainer = build_trainer(TrainerConfig(root_dir=str(tmp_path / 'b')))  # as play builds from it
    try:
        assert gin.operative_config_str() == text
    finally:
        trainer.close()


def test_macros_constants_singletons_and_scoped_references_round_trip(tmp_path):
    params = ['TrainerConfig.async_eval = False',
              'GAMMA = 0.98', 'A2cAlgorithm.gamma = %GAMMA', 'A2cAlgorithm.entropy_coef = %untrusted_test.ENTROPY',
              'A2cAlgorithm.lr = @lr/gin.singleton()', 'lr/gin.singleton.constructor = @lr_value/gin.macro',
              'lr_value = 0.002', 'TrainerConfig.priority_replay_beta = @beta/LinearScheduler()',
              "beta/LinearScheduler.progress_type = 'percent'", 'beta/LinearScheduler.schedule = [(0, 0.4), (1, 1.0)]']
    text = operative_config_of(CONFS / 'a2c_cartpole.gin', params, tmp_path / 'a')
    for written in ('GAMMA = 0.98', '%untrusted_test.ENTROPY', '@lr/gin.singleton()', 'lr/singleton.constructor',
                    '@beta/LinearScheduler()'):
        assert written in text
    load_config_text(text, STORED)
    trainer = build_trainer(TrainerConfig(root_dir=str(tmp_path / 'b')))
    try:
        assert gin.operative_config_str() == text
        assert (trainer.algorithm.gamma, trainer.algorithm.lr) == (0.98, 0.002)
    finally:
        trainer.close()
