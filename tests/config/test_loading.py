"""Loading confs: one-line errors naming file:line and the closest name; stored configs; the config record."""
import logging
import os
import sys
import textwrap

import gin
import pytest
from gin import config as gin_config

from alfish.config import ConfError, load_conf, load_config_text, registration
from alfish.rundir.config_files import write_config_record


# Configurables for these tests. Names start with "CfgTest"/"cfgtest_" so they cannot collide with (and become
# ambiguous with) configurables registered by the rest of alfish in the same test session.
@gin.configurable
class CfgTestAlgorithm:
    def __init__(self, lr=1e-3, gamma=0.99, network=None):
        self.lr, self.gamma, self.network = lr, gamma, network


@gin.configurable
def cfgtest_network(hidden=(64,), activation='relu'):
    return dict(hidden=hidden, activation=activation)


@gin.configurable
def cfgtest_never_called(x=1):
    return x


@gin.configurable
def cfgtest_two_rates(lr_a=1, lr_b=2):
    return lr_a, lr_b


@gin.configurable(module='cfgtest_a')
def cfgtest_twin(x=1):
    return x


@gin.configurable('cfgtest_twin', module='cfgtest_b')
def _cfgtest_twin_b(x=1):
    return x


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Runs each test in an empty cwd with a clean gin config, registering only this module's configurables."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(registration, 'CONFIGURABLE_PACKAGES', ())
    gin.clear_config()
    yield
    gin.clear_config()


def write(path: str, text: str) -> str:
    """Writes dedented `text` to `path` (relative to the cwd), creating folders; returns `path`."""
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    with open(path, 'w') as stream:
        stream.write(textwrap.dedent(text).lstrip('\n'))
    return path


def conf_error(conf_file, conf_params=()) -> str:
    """The ConfError message load_conf raises; fails the test if none is raised or it is not one line."""
    with pytest.raises(ConfError) as info:
        load_conf(conf_file, conf_params)
    message = str(info.value)
    assert '\n' not in message
    return message


# ----------------------------------------------------------------------------------------------------------------
# load_conf: working confs


def test_conf_file_and_conf_params_are_bound_last_wins():
    write('confs/x.gin', """
        # An experiment.
        CfgTestAlgorithm.lr = 0.1
        CfgTestAlgorithm.gamma = 0.9
        CfgTestAlgorithm.network = @cfgtest_network()
        cfgtest_network.hidden = (32, 32)
    """)
    load_conf('confs/x.gin', ['CfgTestAlgorithm.gamma = 0.5', "cfgtest_network.activation = 'tanh'"])
    algorithm = CfgTestAlgorithm()
    assert (algorithm.lr, algorithm.gamma) == (0.1, 0.5)
    assert algorithm.network == dict(hidden=(32, 32), activation='tanh')


def test_load_conf_clears_previous_bindings():
    load_conf(None, ['CfgTestAlgorithm.lr = 0.5'])
    load_conf(None, ['CfgTestAlgorithm.gamma = 0.5'])
    assert CfgTestAlgorithm().lr == 1e-3


def test_include_is_found_next_to_the_conf_and_search_path_is_restored():
    prefixes_before = list(gin_config._LOCATION_PREFIXES)
    write('include_test_confs/base.gin', "CfgTestAlgorithm.lr = 0.25\n")
    write('include_test_confs/main.gin', """
        include 'base.gin'
        CfgTestAlgorithm.gamma = 0.5
    """)
    load_conf('include_test_confs/main.gin')
    assert (CfgTestAlgorithm().lr, CfgTestAlgorithm().gamma) == (0.25, 0.5)
    assert gin_config._LOCATION_PREFIXES == prefixes_before


# ----------------------------------------------------------------------------------------------------------------
# load_conf: errors


def test_missing_conf_file(tmp_path):
    assert conf_error('confs/nope.gin') == f"conf file 'confs/nope.gin' not found (cwd: {tmp_path})"


def test_unknown_configurable_names_line_and_closest_name():
    write('confs/x.gin', """
        # comment
        CfgTestAlgorithm.lr = 0.1

        CfgTestAlgorthm.gamma = 0.9
    """)
    assert conf_error('confs/x.gin') == (
        "confs/x.gin:4: unknown configurable 'CfgTestAlgorthm'; did you mean 'CfgTestAlgorithm'?")


def test_unknown_configurable_is_case_insensitive_in_suggestions():
    write('x.gin', "cfgtestalgorithm.lr = 0.1\n")
    assert conf_error('x.gin') == "x.gin:1: unknown configurable 'cfgtestalgorithm'; did you mean 'CfgTestAlgorithm'?"


def test_unknown_configurable_in_scoped_binding():
    write('x.gin', "train/CfgTestAlgorthm.lr = 0.1\n")
    assert conf_error('x.gin') == "x.gin:1: unknown configurable 'CfgTestAlgorthm'; did you mean 'CfgTestAlgorithm'?"


def test_unknown_module_qualified_configurable_suggests_qualified_name():
    write('x.gin', f"{__name__}.CfgTestAlgorthm.lr = 0.1\n")
    assert conf_error('x.gin') == (f"x.gin:1: unknown configurable '{__name__}.CfgTestAlgorthm'; "
                                   f"did you mean '{__name__}.CfgTestAlgorithm'?")


def test_unknown_configurable_without_similar_name():
    write('x.gin', "Zyxwvut.lr = 0.1\n")
    assert conf_error('x.gin') == ("x.gin:1: unknown configurable 'Zyxwvut'; no registered configurable has a "
                                   "similar name (is the module that defines it imported?)")


def test_misspelled_parameter():
    write('confs/x.gin', """
        CfgTestAlgorithm.lr = 0.1
        CfgTestAlgorithm.gama = 0.9
    """)
    assert conf_error('confs/x.gin') == (
        "confs/x.gin:2: 'CfgTestAlgorithm' has no parameter 'gama'; did you mean 'gamma'?")


def test_misspelled_parameter_of_trainer_config():
    write('confs/x.gin', "TrainerConfig.unroll_length = 4\nTrainerConfig.num_iteration = 3\n")
    assert conf_error('confs/x.gin') == (
        "confs/x.gin:2: 'TrainerConfig' has no parameter 'num_iteration'; did you mean 'num_iterations'?")


def test_equally_close_names_are_all_suggested():
    assert conf_error(None, ['cfgtest_two_rates.lr_ = 3']) == (
        "--conf_param 'cfgtest_two_rates.lr_ = 3': 'cfgtest_two_rates' has no parameter 'lr_'; "
        "did you mean 'lr_a' or 'lr_b'?")


def test_unknown_parameter_without_similar_name_lists_parameters():
    write('x.gin', "CfgTestAlgorithm.zzz = 1\n")
    assert conf_error('x.gin') == (
        "x.gin:1: 'CfgTestAlgorithm' has no parameter 'zzz'; its parameters are: lr, gamma, network")


def test_misspelled_parameter_in_block_statement():
    write('x.gin', """
        CfgTestAlgorithm:
            lr = 0.1
            gama = 0.9
    """)
    assert conf_error('x.gin') == "x.gin:3: 'CfgTestAlgorithm' has no parameter 'gama'; did you mean 'gamma'?"


def test_unknown_reference_on_its_own_line():
    write('x.gin', """
        CfgTestAlgorithm.lr = 0.1
        CfgTestAlgorithm.network = [
            @cfgtest_network,
            @cfgtest_netwrk(),
        ]
    """)
    assert conf_error('x.gin') == "x.gin:4: unknown configurable 'cfgtest_netwrk'; did you mean 'cfgtest_network'?"


def test_unknown_scoped_reference():
    write('x.gin', "CfgTestAlgorithm.network = @actor/cfgtest_netwrk()\n")
    assert conf_error('x.gin') == "x.gin:1: unknown configurable 'cfgtest_netwrk'; did you mean 'cfgtest_network'?"


def test_syntax_error():
    write('x.gin', "CfgTestAlgorithm.lr = 0.1\n\n\nCfgTestAlgorithm.gamma 0.9\n")
    assert conf_error('x.gin') == "x.gin:4: gin syntax error: Couldn't parse statement, expected ':' or '='."


def test_unclosed_bracket_is_reported_where_the_statement_starts():
    write('x.gin', "CfgTestAlgorithm.lr = 0.1\ncfgtest_network.hidden = (64,\n    64\n")
    assert conf_error('x.gin') == (
        "x.gin:2: gin syntax error: EOF in multi-line statement (a bracket or string is never closed)")


def test_unclosed_bracket_before_the_next_statement_is_reported_where_it_opens():
    # gin reads the next statement as part of the open tuple and fails there, one line after the real mistake.
    write('x.gin', "CfgTestAlgorithm.lr = 0.1\ncfgtest_network.hidden = (64, 64\nCfgTestAlgorithm.gamma = 0.9\n")
    assert conf_error('x.gin') == (
        "x.gin:2: gin syntax error: '(' is never closed (line 3 was read as part of it); add the missing ')'")


def test_unclosed_reference_call_in_block_and_list():
    write('x.gin', "CfgTestAlgorithm.network = @cfgtest_network(\n\n# a comment\nCfgTestAlgorithm.lr = 0.1\n")
    assert conf_error('x.gin') == (
        "x.gin:1: gin syntax error: '(' is never closed (line 4 was read as part of it); add the missing ')'")
    write('y.gin', "CfgTestAlgorithm.network = [\n    (1, 2,\n    (3, 4),\n]\n")
    assert conf_error('y.gin') == (
        "y.gin:2: gin syntax error: '(' is never closed (']' on line 4 closes the '[' of line 1); "
        "add the missing ')'")


def test_unclosed_bracket_in_included_file_before_the_next_statement():
    write('confs/base.gin', "cfgtest_network.hidden = [64,\ncfgtest_network.activation = 'tanh'\n")
    write('confs/main.gin', "CfgTestAlgorithm.lr = 0.1\ninclude 'base.gin'\n")
    assert conf_error('confs/main.gin') == (
        "confs/base.gin:1: gin syntax error: '[' is never closed (line 2 was read as part of it); add the missing ']'")


def test_syntax_error_inside_a_multi_line_value_keeps_its_line():
    write('x.gin', "cfgtest_network.hidden = [\n    64,\n    64 64,\n]\n")
    assert conf_error('x.gin') == "x.gin:3: gin syntax error: Expected ',' or ']'."


def test_undefined_macro():
    write('x.gin', """
        learning_rate = 0.1
        # %learning_rat in a comment is not a use
        CfgTestAlgorithm.lr = %learning_rat
    """)
    assert conf_error('x.gin') == (
        "x.gin:3: undefined macro '%learning_rat' (used by 'CfgTestAlgorithm.lr'); did you mean 'learning_rate'?")


def test_macro_defined_after_use_is_fine():
    load_conf(None, ['CfgTestAlgorithm.lr = %rate', 'rate = 0.5'])
    assert CfgTestAlgorithm().lr == 0.5


def test_ambiguous_name_lists_full_names():
    assert conf_error(None, ['cfgtest_twin.x = 2']) == (
        "--conf_param 'cfgtest_twin.x = 2': configurable name 'cfgtest_twin' is ambiguous: it matches "
        "'cfgtest_a.cfgtest_twin', 'cfgtest_b.cfgtest_twin'; write enough of the module path to pick one")


def test_import_of_missing_module():
    write('x.gin', "CfgTestAlgorithm.lr = 0.1\nimport cfgtest_no_such_module\n")
    assert conf_error('x.gin') == "x.gin:2: cannot import module: no module named 'cfgtest_no_such_module'"


@pytest.mark.parametrize('param, message', [
    ('CfgTestAlgorithm.gama=3', "'CfgTestAlgorithm' has no parameter 'gama'; did you mean 'gamma'?"),
    ('CfgTestAlgorthm.lr=3', "unknown configurable 'CfgTestAlgorthm'; did you mean 'CfgTestAlgorithm'?"),
    ('CfgTestAlgorithm.network=@cfgtest_netwrk',
     "unknown configurable 'cfgtest_netwrk'; did you mean 'cfgtest_network'?"),
    ('CfgTestAlgorithm.lr 3', "gin syntax error: Couldn't parse statement, expected ':' or '='."),
    ('CfgTestAlgorithm.lr=(3', "gin syntax error: EOF in multi-line statement (a bracket or string is never closed)"),
])
def test_conf_param_errors_quote_the_param(param, message):
    assert conf_error(None, ['CfgTestAlgorithm.lr=1', param]) == f"--conf_param {param!r}: {message}"


def test_conf_param_error_after_a_valid_file():
    write('x.gin', "CfgTestAlgorithm.lr = 0.1\n")
    assert conf_error('x.gin', ['CfgTestAlgorithm.gama=3']) == (
        "--conf_param 'CfgTestAlgorithm.gama=3': 'CfgTestAlgorithm' has no parameter 'gama'; did you mean 'gamma'?")


def test_error_in_included_file_names_that_file_and_the_include():
    write('confs/base.gin', """
        CfgTestAlgorithm.lr = 0.1
        CfgTestAlgorithm.gama = 0.9
    """)
    write('confs/main.gin', """
        # main
        include 'base.gin'
    """)
    assert conf_error('confs/main.gin') == (
        "confs/base.gin:2 (included from confs/main.gin:2): 'CfgTestAlgorithm' has no parameter 'gama'; "
        "did you mean 'gamma'?")


def test_syntax_error_in_included_file():
    write('confs/base.gin', "CfgTestAlgorithm.lr = 0.1\nCfgTestAlgorithm.gamma 0.9\n")
    write('confs/main.gin', "include 'base.gin'\n")
    assert conf_error('confs/main.gin') == (
        "confs/base.gin:2: gin syntax error: Couldn't parse statement, expected ':' or '='.")


def test_unclosed_bracket_in_included_file():
    write('confs/base.gin', "# base\ncfgtest_network.hidden = [64,\n")
    write('confs/main.gin', "CfgTestAlgorithm.lr = 0.1\ninclude 'base.gin'\n")
    assert conf_error('confs/main.gin') == (
        "confs/base.gin:2 (included from confs/main.gin:2): gin syntax error: EOF in multi-line statement "
        "(a bracket or string is never closed)")


def test_bad_indentation_in_included_file():
    write('confs/base.gin', "CfgTestAlgorithm:\n    lr = 0.1\n  gamma = 0.9\n")
    write('confs/main.gin', "# main\ninclude 'base.gin'\n")
    assert conf_error('confs/main.gin') == (
        "confs/base.gin:3 (included from confs/main.gin:2): gin syntax error: "
        "unindent does not match any outer indentation level")


def test_missing_include(tmp_path):
    write('confs/main.gin', "include 'gone.gin'\n")
    assert conf_error('confs/main.gin') == (
        f"confs/main.gin:1: included file 'gone.gin' not found (searched: cwd {tmp_path}, confs)")


def test_conf_error_is_always_one_line():
    assert str(ConfError("a\n  b\tc")) == "a b c"


# ----------------------------------------------------------------------------------------------------------------
# register_configurables


def test_register_configurables_imports_all_submodules_and_skips_missing_packages(tmp_path, monkeypatch):
    write('pkgs/cfgtest_pkg_ok/__init__.py', "")
    write('pkgs/cfgtest_pkg_ok/sub/__init__.py', "")
    write('pkgs/cfgtest_pkg_ok/sub/deep.py', """
        import gin
        @gin.configurable
        def cfgtest_deep_fn(a=1):
            return a
    """)
    monkeypatch.syspath_prepend(str(tmp_path / 'pkgs'))
    found = registration.register_configurables(['cfgtest_pkg_ok', 'cfgtest_pkg_missing', 'cfgtest_pkg_ok.missing'])
    assert found == ['cfgtest_pkg_ok']
    assert 'cfgtest_pkg_ok.sub.deep.cfgtest_deep_fn' in gin_config._REGISTRY


def test_register_configurables_propagates_real_import_errors(tmp_path, monkeypatch):
    write('pkgs/cfgtest_pkg_broken/__init__.py', "")
    write('pkgs/cfgtest_pkg_broken/mod.py', "import cfgtest_dependency_that_is_missing\n")
    monkeypatch.syspath_prepend(str(tmp_path / 'pkgs'))
    with pytest.raises(ModuleNotFoundError, match='cfgtest_dependency_that_is_missing'):
        registration.register_configurables(['cfgtest_pkg_broken'])


def test_load_conf_registers_configurable_packages(tmp_path, monkeypatch):
    write('pkgs/cfgtest_pkg_conf/__init__.py', "")
    write('pkgs/cfgtest_pkg_conf/algo.py', """
        import gin
        @gin.configurable
        def cfgtest_pkg_algorithm(lr=1):
            return lr
    """)
    monkeypatch.syspath_prepend(str(tmp_path / 'pkgs'))
    monkeypatch.setattr(registration, 'CONFIGURABLE_PACKAGES', ('cfgtest_pkg_conf',))
    load_conf(None, ['cfgtest_pkg_algorithm.lr = 3'])
    assert sys.modules['cfgtest_pkg_conf.algo'].cfgtest_pkg_algorithm() == 3


# ----------------------------------------------------------------------------------------------------------------
# load_config_text


# Stored configs are parsed in the restricted mode (alfish.config.untrusted, tested in test_untrusted_config.py): they
# may use only the configurables of trusted modules, so these tests trust this one, whose configurables they bind.
TRUSTED = ('alfish', __name__)


def text_error(text, allowed=TRUSTED) -> str:
    """The ConfError message load_config_text raises for `text` named 'runs/a/operative.gin'."""
    with pytest.raises(ConfError) as info:
        load_config_text(textwrap.dedent(text).lstrip('\n'), 'runs/a/operative.gin', allowed)
    assert '\n' not in str(info.value)
    return str(info.value)


def test_load_config_text_binds_and_applies_overrides():
    load_config_text("import alfish.config\nCfgTestAlgorithm.lr = 0.5\nCfgTestAlgorithm.gamma = 0.5\n",
                     'runs/a/operative.gin', TRUSTED, conf_params=['CfgTestAlgorithm.gamma = 0.25'])
    assert (CfgTestAlgorithm().lr, CfgTestAlgorithm().gamma) == (0.5, 0.25)


def test_load_config_text_rejects_foreign_import_before_running_anything(tmp_path, monkeypatch):
    marker = tmp_path / 'imported'
    write('pkgs/cfgtest_side_effect.py', f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path / 'pkgs'))
    message = text_error("""
        CfgTestAlgorithm.lr = 0.5
        import cfgtest_side_effect
    """)
    assert message == ("runs/a/operative.gin:2: import of module 'cfgtest_side_effect' is not allowed in a stored "
                       f"config (trusted: 'alfish', '{__name__}'); if you trust that module, pass --allow_import "
                       "cfgtest_side_effect")
    assert not marker.exists()
    assert gin_config._CONFIG == {}  # Nothing was bound either.


@pytest.mark.parametrize('statement', ['import alfishx', 'import os', 'from os import path'])
def test_load_config_text_import_prefix_is_a_module_boundary(statement):
    assert 'is not allowed in a stored config' in text_error(statement)


def test_load_config_text_allows_configured_prefixes():
    load_config_text("import os.path\nCfgTestAlgorithm.lr = 0.5\n", 'stored.gin', (*TRUSTED, 'os'))
    assert CfgTestAlgorithm().lr == 0.5


def test_load_config_text_rejects_include():
    assert text_error("# stored\ninclude 'base.gin'\n") == (
        "runs/a/operative.gin:2: include 'base.gin' is not allowed in a stored config (it would read another file); "
        "if you trust this root_dir completely, pass --allow_import '*'")


@pytest.mark.parametrize('text, message', [
    ("CfgTestAlgorithm.lr = 0.5\nCfgTestAlgorthm.gamma = 0.5\n",
     "runs/a/operative.gin:2: unknown configurable 'CfgTestAlgorthm'; did you mean 'CfgTestAlgorithm'?"),
    ("CfgTestAlgorithm.gama = 0.5\n",
     "runs/a/operative.gin:1: 'CfgTestAlgorithm' has no parameter 'gama'; did you mean 'gamma'?"),
    ("CfgTestAlgorithm.lr 0.5\n",
     "runs/a/operative.gin:1: gin syntax error: Couldn't parse statement, expected ':' or '='."),
])
def test_load_config_text_translates_errors(text, message):
    assert text_error(text) == message


# ----------------------------------------------------------------------------------------------------------------
# write_config_record


def test_write_config_record_lists_unused_bindings(tmp_path, caplog):
    load_conf(None, [
        'CfgTestAlgorithm.lr = 0.5',
        'train/CfgTestAlgorithm.gamma = 0.5',  # used: called in scope train
        'CfgTestAlgorithm.gamma = 0.75',  # unused: train/ overrides it, and that is the only call
        "eval/cfgtest_network.activation = 'tanh'",  # unused: never called in scope eval
        'cfgtest_network.hidden = (8,)',  # unused: the caller passes hidden itself
        'cfgtest_never_called.x = 2',  # unused: never called
        'rate = 0.1', 'unused_rate = 0.2',
        "cfgtest_network.activation = %rate",
    ])
    with gin.config_scope('train'):
        CfgTestAlgorithm()
    cfgtest_network(hidden=(4,))
    with caplog.at_level(logging.WARNING, logger='alfish.config.config_record'):
        unused = write_config_record(str(tmp_path / 'run'))
    assert unused == [
        'CfgTestAlgorithm.gamma = 0.75',
        'cfgtest_network.hidden = (8,)',
        'cfgtest_never_called.x = 2',
        "eval/cfgtest_network.activation = 'tanh'",
        'unused_rate = 0.2',
    ]
    assert [r.getMessage() for r in caplog.records] == [
        f'gin binding set but never used: {binding}' for binding in unused]
    operative = (tmp_path / 'run' / 'config' / 'operative.gin').read_text()
    assert operative.startswith(gin.operative_config_str())
    assert operative.rstrip('\n').splitlines()[-5:] == [f'# UNUSED: {binding}' for binding in unused]
    assert 'train/CfgTestAlgorithm.gamma = 0.5' in operative
    full = (tmp_path / 'run' / 'config' / 'full.gin').read_text()
    assert full == gin.config_str()
    assert "eval/cfgtest_network.activation = 'tanh'" in full
    assert sorted(os.listdir(tmp_path / 'run' / 'config')) == ['full.gin', 'operative.gin']  # no temp files left


def test_write_config_record_with_everything_used(tmp_path):
    load_conf(None, ['CfgTestAlgorithm.lr = 0.5', 'train/CfgTestAlgorithm.lr = 0.25'])
    CfgTestAlgorithm()
    with gin.config_scope('train'):
        with gin.config_scope('actor'):  # A deeper scope still uses train/'s binding.
            CfgTestAlgorithm()
    assert write_config_record(str(tmp_path)) == []
    assert 'UNUSED' not in (tmp_path / 'config' / 'operative.gin').read_text()


def test_operative_record_reloads_with_load_config_text(tmp_path):
    load_conf(None, ['CfgTestAlgorithm.lr = 0.5', 'CfgTestAlgorithm.network = @cfgtest_network()',
                     'cfgtest_network.hidden = (16,)', 'cfgtest_never_called.x = 3'])
    CfgTestAlgorithm()
    write_config_record(str(tmp_path))
    text = (tmp_path / 'config' / 'operative.gin').read_text()
    load_config_text(text, str(tmp_path / 'config' / 'operative.gin'), TRUSTED)
    algorithm = CfgTestAlgorithm()
    assert (algorithm.lr, algorithm.network['hidden']) == (0.5, (16,))
    assert cfgtest_never_called() == 1  # Unused bindings are comments in the record, not restored.
