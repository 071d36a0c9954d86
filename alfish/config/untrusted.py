"""Parsing a config stored in a results directory (root_dir) in a restricted mode, because a root_dir is untrusted.

What the user types is trusted: the command line and the conf given to ``train``. A root_dir may come from anyone
(DESIGN.md 3.13), so its stored config is checked statement by statement before gin acts on it, and refused with a
one-line `ConfError` naming the line and the flag that would trust it, when it has:

- more than `MAX_STORED_CONFIG_BYTES` of text (alfish writes a few KB);
- an ``include`` (it would read another file) or a ``from __gin__ import ...`` (``dynamic_registration`` makes every
  attribute chain reachable from an imported module callable, e.g. ``alfish.rundir.checkpoint.os.system``);
- an ``import`` of a module that is not under a trusted prefix;
- a binding or ``@reference`` whose name is not a registered configurable defined under a trusted prefix (gin's own
  ``gin.macro``, ``gin.constant`` and ``gin.singleton`` are allowed, so configs written by alfish load unchanged);
- an env name of the form ``'module:EnvId'`` (gymnasium imports ``module`` to make it) whose module is not trusted.

Trusted prefixes are ``alfish`` and those the user gives with ``--allow_import PREFIX``; ``--allow_import '*'``
(`TRUST_ALL`) trusts the root_dir completely, and its config is then parsed as a conf the user wrote.

Why this lives in ``alfish.config`` and not in ``alfish.rundir`` (which may import config): what it decides is which
gin statements, imports, configurables and env ids a parse may reach, and it decides that inside gin's parsing (the
parser's statements, the registry, the same error translation and "did you mean" as a conf the user wrote). It reads
no file: it is given the text. Reading that text out of a root_dir (which checkpoint, bounded and symlink-safe reads)
is the results directory's business and stays with ``alfish.rundir`` and the commands that read a root_dir.
"""
from __future__ import annotations

import dataclasses
import importlib
import io
import re
import tokenize
from typing import Any, Iterator, Mapping, Optional, Sequence

import gin
from gin import config as gin_config
from gin import config_parser

from alfish.config.conf_error import ConfError
from alfish.config.gin_errors import translate_gin_error
from alfish.config.gin_names import UNKNOWN_HINT, configurable_candidates, suggest
from alfish.config.loading import parse_sources
from alfish.config.registration import register_configurables
from alfish.config.sources import Source, conf_param_source
from alfish.config.value_checks import nested_items

# The --allow_import value that trusts a root_dir completely.
TRUST_ALL = '*'
# alfish's own modules are always trusted.
ALWAYS_TRUSTED = 'alfish'
# A stored config is the operative config alfish wrote (a few KB); this bounds what parsing one may cost.
MAX_STORED_CONFIG_BYTES = 1_000_000
# gin's builtins, which operative configs use for macros, constants and singletons; they call only what is bound.
_GIN_BUILTINS = frozenset({'gin.macro', 'gin.constant', 'gin.singleton'})
# Parameters whose strings may reach gymnasium.make as env ids (a wrapper env such as alfish/Latency-v0 takes the id
# of the env it wraps in its env_kwargs).
ENV_PARAMETERS = ('env_name', 'env_kwargs')
# A valid --allow_import prefix: a dotted module name.
_MODULE_NAME_RE = re.compile(r'^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$')

_TRUST_ROOT_DIR = f"if you trust this root_dir completely, pass --allow_import '{TRUST_ALL}'"


def load_config_text(text: str, source_name: str, allowed_import_prefixes: Sequence[str] = (ALWAYS_TRUSTED,),
                     conf_params: Sequence[str] = ()) -> None:
    """Clears gin's config and parses a config stored in a root_dir (for play and every tool that reads one).

    The text is checked in the restricted mode described in this module's docstring before gin parses anything;
    `allowed_import_prefixes` are the trusted module prefixes (``alfish`` is always trusted; ``'*'`` trusts the
    text completely). The `conf_params` (trusted, from the command line) are applied afterwards, as overrides.

    Raises:
        ConfError: one line naming `source_name` and the line, and the --allow_import that would trust it.
    """
    trusted = trusted_prefixes(allowed_import_prefixes)
    gin.clear_config()
    register_configurables()
    source = Source(name=source_name, text=text)
    check_stored_config(source, trusted)
    parse_sources([source] + [conf_param_source(param) for param in conf_params])


def trusted_prefixes(allowed: Sequence[str]) -> tuple[str, ...]:
    """``alfish`` plus the `allowed` prefixes, each checked to be a dotted module name or ``'*'``.

    Raises:
        ConfError: for a prefix that is neither (it would trust nothing, or something unintended).
    """
    for prefix in allowed:
        if prefix != TRUST_ALL and not _MODULE_NAME_RE.match(prefix):
            raise ConfError(f"--allow_import {prefix!r} is not a module name: give a module or package prefix such "
                            f"as 'my_envs' or 'my_pkg.envs', or '{TRUST_ALL}' to trust the root_dir completely")
    return tuple(dict.fromkeys((ALWAYS_TRUSTED, *allowed)))


def module_trusted(module: str, trusted: Sequence[str]) -> bool:
    """True when `module` equals or lies under one of the `trusted` prefixes (always, under ``'*'``)."""
    return TRUST_ALL in trusted or any(module == prefix or module.startswith(prefix + '.') for prefix in trusted)


def check_stored_config(source: Source, trusted: Sequence[str]) -> None:
    """Refuses `source` (a stored config) unless every statement stays within what `trusted` allows.

    Modules a trusted ``import`` names are imported here, in statement order as gin would, so that the
    configurables they register can be checked by the statements after them. With ``'*'`` only the size is checked.

    Raises:
        ConfError: one line naming the line, what is refused and the --allow_import that would trust it.
    """
    # Characters first: a huge text is refused without encoding it (a character is at least one byte).
    if len(source.text) > MAX_STORED_CONFIG_BYTES or \
            len(source.text.encode('utf-8', 'surrogatepass')) > MAX_STORED_CONFIG_BYTES:
        raise ConfError(f"{source.name}: the stored config is over the limit of {MAX_STORED_CONFIG_BYTES} bytes "
                        f"(alfish writes a few KB), so this root_dir is not as alfish wrote it: check where it came "
                        f"from")
    if TRUST_ALL in trusted:
        return
    macros: dict[str, Any] = {}
    env_bindings: list[config_parser.BindingStatement] = []
    for statement in _statements(source):
        where = source.where(statement.location.line_num)
        if isinstance(statement, config_parser.IncludeStatement):
            raise ConfError(f"{where}: include '{statement.filename}' is not allowed in a stored config (it would "
                            f"read another file); {_TRUST_ROOT_DIR}")
        if isinstance(statement, config_parser.ImportStatement):
            _check_import(statement, where, trusted)
        elif isinstance(statement, config_parser.BlockDeclaration):
            _check_configurable(statement.selector, where, trusted)
        elif not statement.arg_name:  # `name = value` defines a macro: any name, only its value is checked.
            _check_references(statement.value, where, trusted)
            macros['/'.join(filter(None, (statement.scope, statement.selector)))] = statement.value
        else:
            _check_configurable(statement.selector, where, trusted)
            _check_references(statement.value, where, trusted)
            if statement.arg_name in ENV_PARAMETERS:
                env_bindings.append(statement)
    for statement in env_bindings:  # After all statements: a macro may be defined after its use.
        binding = f"{'/'.join(filter(None, (statement.scope, statement.selector)))}.{statement.arg_name}"
        check_env_names({binding: _resolve_macros(statement.value, macros, set())}, trusted,
                        source.where(statement.location.line_num))


def check_env_names(values: Mapping[str, Any], trusted: Sequence[str], where: Optional[str] = None) -> None:
    """Refuses a ``'module:EnvId'`` string anywhere in `values` (binding -> value) whose module is not trusted.

    gymnasium.make imports the module of such an id before it looks the env up. Call this before gymnasium sees the
    values of ``create_environment.env_name`` and ``env_kwargs`` that came from a stored config.

    Raises:
        ConfError: one line naming the binding (and `where`, e.g. 'file:line') and the --allow_import to trust it.
    """
    for binding, value in values.items():
        for text in _strings(value):
            module = text.split(':', 1)[0].strip() if ':' in text else ''
            if module and not module_trusted(module, trusted):
                prefix = f'{where}: ' if where else ''
                raise ConfError(f"{prefix}{binding} names env {text!r}, and gymnasium would import module "
                                f"'{module}' to make it; a stored config may not import modules: if you trust that "
                                f"module, pass --allow_import {module}")


# ---------------------------------------------------------------------------------------------------------------------
# Statements


@dataclasses.dataclass(frozen=True)
class _Reference:
    """A ``@name`` or ``@name()`` in a value, as written (scopes included)."""

    name: str


@dataclasses.dataclass(frozen=True)
class _MacroUse:
    """A ``%name`` in a value."""

    name: str


class _RecordingDelegate(config_parser.ParserDelegate):
    """Parser delegate that resolves nothing and records references and macros, so values can be inspected."""

    def configurable_reference(self, scoped_configurable_name: str, evaluate: bool) -> _Reference:
        return _Reference(scoped_configurable_name)

    def macro(self, macro_name: str) -> _MacroUse:
        return _MacroUse(macro_name)


def _statements(source: Source) -> list[Any]:
    """gin's statements of `source`, parsed without acting on any of them."""
    stream = io.StringIO(source.text)
    stream.name = source.name  # gin reports locations by the stream's name.
    try:
        return list(config_parser.ConfigParser(stream, _RecordingDelegate()))
    except (SyntaxError, tokenize.TokenError) as error:
        raise translate_gin_error(error, source) from error


def _check_import(statement: config_parser.ImportStatement, where: str, trusted: Sequence[str]) -> None:
    """Refuses a ``__gin__`` directive or an untrusted module; imports a trusted one (as gin will)."""
    module = statement.module
    if module == '__gin__' or module.startswith('__gin__.'):
        raise ConfError(f"{where}: '{statement.format()}' is not allowed in a stored config (it makes any function "
                        f"reachable from an imported module callable); {_TRUST_ROOT_DIR}")
    if not module_trusted(module, trusted):
        listed = ', '.join(repr(prefix) for prefix in trusted)
        raise ConfError(f"{where}: import of module '{module}' is not allowed in a stored config (trusted: "
                        f"{listed}); if you trust that module, pass --allow_import {module}")
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        raise ConfError(f"{where}: cannot import module: no module named '{error.name or module}'") from error
    except ImportError as error:
        raise ConfError(f"{where}: cannot import module '{module}': {error}") from error


def _check_references(value: Any, where: str, trusted: Sequence[str]) -> None:
    """Checks every ``@reference`` in `value` (a nest of containers) like a binding's configurable."""
    for item in nested_items(value):
        if isinstance(item, _Reference):
            _check_configurable(item.name.rsplit('/', 1)[-1], where, trusted, reference=True)


def _check_configurable(name: str, where: str, trusted: Sequence[str], reference: bool = False) -> None:
    """Refuses a name that is not a registered configurable defined under a trusted prefix.

    A name matching several configurables is left to gin, which refuses it as ambiguous.
    """
    written = f'@{name}' if reference else name
    matches = [match for match in gin_config._REGISTRY.get_all_matches(name) if not _dynamically_registered(match)]
    if not matches:
        if '.' in name:  # An attribute chain into a module, or a module path alfish never registered.
            raise ConfError(f"{where}: '{written}' is not a registered configurable; a stored config may name only "
                            f"the configurables of alfish and of modules trusted with --allow_import, never a "
                            f"function reached through a module's attributes; {_TRUST_ROOT_DIR}")
        raise ConfError(f"{where}: unknown configurable '{name}'"
                        f"{suggest(name, _trusted_candidates(name, trusted), UNKNOWN_HINT)}")
    if len(matches) == 1 and not _configurable_trusted(matches[0], trusted):
        module = matches[0].module or getattr(matches[0].wrapped, '__module__', '?')
        raise ConfError(f"{where}: configurable '{written}' is defined in module '{module}', which a stored config "
                        f"may not use; if you trust that module, pass --allow_import {module}")


def _configurable_trusted(configurable: Any, trusted: Sequence[str]) -> bool:
    """True for gin's builtins and for configurables that code registered under, or defined in, a trusted module."""
    if configurable.selector in _GIN_BUILTINS:
        return True
    if _dynamically_registered(configurable):
        return False
    modules = (configurable.module, getattr(configurable.wrapped, '__module__', None))
    return any(module and module_trusted(module, trusted) for module in modules)


def _dynamically_registered(configurable: Any) -> bool:
    """True for a configurable an earlier parse registered with dynamic registration (it has an import source).

    Such an entry is no configurable that code chose to expose: its module path is the attribute chain it was
    reached through (e.g. 'alfish.rundir.checkpoint.os' for os.system), so a restricted parse treats it as absent.
    """
    return configurable.import_source is not None


def _trusted_candidates(name: str, trusted: Sequence[str]) -> list[str]:
    """The names a misspelled `name` may be suggested as: trusted configurables, written like `name`."""
    return [candidate for candidate in configurable_candidates(name)
            if any(_configurable_trusted(match, trusted) for match in gin_config._REGISTRY.get_all_matches(candidate))]


# ---------------------------------------------------------------------------------------------------------------------
# Values


def _resolve_macros(value: Any, macros: Mapping[str, Any], seen: set[str]) -> Any:
    """`value` with each ``%macro`` defined in `macros` replaced by its (resolved) value; others are kept."""
    if isinstance(value, _MacroUse) and value.name in macros and value.name not in seen:
        return _resolve_macros(macros[value.name], macros, seen | {value.name})
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve_macros(item, macros, seen) for item in value)
    if isinstance(value, dict):  # Keys stay as written: a resolved key might not be hashable.
        return {key: _resolve_macros(item, macros, seen) for key, item in value.items()}
    return value


def _strings(value: Any) -> Iterator[str]:
    """Every string in `value` (a nest of containers)."""
    return (item for item in nested_items(value) if isinstance(item, str))
