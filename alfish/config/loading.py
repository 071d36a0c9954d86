"""Loading gin confs with strict one-line errors: unknown names, misspelled parameters, undefined macros and values
that do not fit their parameter fail before any environment starts.

Every problem is a one-line `ConfError` of the form ``<file>:<line>: <problem>; did you mean '<closest valid name>'?``
(``--conf_param '<binding>': ...`` for bindings given on the command line). The parts: `alfish.config.sources` (what
is parsed), `alfish.config.gin_errors` (gin's exceptions in those words), `alfish.config.binding_checks` (the values),
`alfish.config.registration` (which configurables exist); the record of what a run used is
`alfish.config.config_record`'s.
"""
from __future__ import annotations

import io
import itertools
import os
import re
import tokenize
from typing import Any, Iterator, Optional, Sequence

import gin
from gin import config as gin_config
from gin import config_parser

from alfish.config import binding_checks
from alfish.config.conf_error import ConfError
from alfish.config.gin_errors import translate_gin_error
from alfish.config.gin_names import binding_key, is_macro, suggest
from alfish.config.registration import register_configurables
from alfish.config.sources import (
    INCLUDE_STATEMENT_RE,
    Source,
    conf_param_source,
    file_source,
    include_search_path,
    read_text,
    resolve_include,
    strip_comment,
)


def load_conf(conf_file: Optional[str], conf_params: Sequence[str] = ()) -> None:
    """Clears gin's config, then parses `conf_file` and the `--conf_param` bindings (applied in order, last wins).

    `include` statements are resolved against the cwd first, then the directory of `conf_file`.

    Raises:
        ConfError: one line naming the file and line (or the --conf_param) and the closest valid name.
    """
    gin.clear_config()
    register_configurables()
    sources = [file_source(conf_file)] if conf_file else []
    sources += [conf_param_source(param) for param in conf_params]
    search_dir = os.path.dirname(conf_file) if conf_file else ''
    with include_search_path(search_dir):
        parse_sources(sources)


def parse_sources(sources: Sequence[Source]) -> None:
    """Parses `sources` in order into gin's config, then checks that every macro used is defined and that every value
    bound to an alfish configurable fits its parameter's type and range (alfish.config.binding_checks)."""
    included: list[Source] = []
    for source in sources:
        included += _parse_source(source)
    _check_macros_defined(list(sources) + included)
    _check_values(sources)


def _check_values(sources: Sequence[Source]) -> None:
    """ConfError naming the file and line of the first bound value that does not fit (and where the others are)."""
    problems = binding_checks.binding_problems()
    if not problems:
        return
    locations = _binding_locations(sources)
    fallback = (len(locations), sources[0].name if sources else '<conf>')
    located = []
    for problem in problems:
        order, where = locations.get((problem.scope, problem.selector, problem.param), fallback)
        message = problem.message
        if problem.macro is not None and (problem.macro, 'gin.macro', 'value') in locations:
            message += f'; %{problem.macro} is set at {locations[problem.macro, "gin.macro", "value"][1]}'
        located.append((order, where, message))
    located.sort(key=lambda item: item[0])
    raise ConfError(binding_checks.first_problem_summary([(where, message) for _, where, message in located]))


def _binding_locations(sources: Sequence[Source]) -> dict[tuple[str, str, str], tuple[int, str]]:
    """(scope, full selector, param) -> (order, 'file:line') of the statement that last bound it, includes followed.

    Macros are keyed (name, 'gin.macro', 'value'), as gin binds them. The order numbers statements as gin applied
    them, so errors can be reported in the order a reader meets them.
    """
    locations: dict[tuple[str, str, str], tuple[int, str]] = {}
    order = itertools.count()
    for source in sources:
        _collect_locations(source, '', locations, order, {source.name})
    return locations


def _collect_locations(source: Source, included_from: str, locations: dict[tuple[str, str, str], tuple[int, str]],
                       order: Iterator[int], visited: set[str]) -> None:
    """Adds the bindings of `source` (and of the files it includes, where they are included) to `locations`."""
    stream = io.StringIO(source.text)
    stream.name = source.name
    try:
        statements = list(config_parser.ConfigParser(stream, _InertDelegate()))
    except (SyntaxError, tokenize.TokenError):  # gin parsed it already; a statement it does not know locates nothing
        return
    for statement in statements:
        where = source.where(statement.location.line_num) + included_from
        if isinstance(statement, config_parser.IncludeStatement):
            path = resolve_include(statement.filename)
            if path is not None and path not in visited:
                _collect_locations(Source(name=path, text=read_text(path)), f' (included from {where})', locations,
                                   order, visited | {path})
        elif isinstance(statement, config_parser.BindingStatement):
            locations[_statement_key(statement)] = (next(order), where)


def _statement_key(statement: config_parser.BindingStatement) -> tuple[str, str, str]:
    """The key gin binds a statement under: (scope, full selector, param), or (name, 'gin.macro', 'value')."""
    if not statement.arg_name:
        name = f'{statement.scope}/{statement.selector}' if statement.scope else statement.selector
        return name, 'gin.macro', 'value'
    try:
        configurable = gin_config._REGISTRY.get_match(statement.selector)
    except KeyError:  # ambiguous: gin would have refused it already
        configurable = None
    selector = configurable.selector if configurable is not None else statement.selector
    return statement.scope, selector, statement.arg_name


def _parse_source(source: Source) -> list[Source]:
    """Parses one source with gin; returns the files it included (for locating later errors)."""
    _check_includes_exist(source)
    stream = io.StringIO(source.text)
    stream.name = source.name  # gin reports locations by the stream's name.
    try:
        includes, _ = gin.parse_config(stream)
    except (SyntaxError, tokenize.TokenError, ValueError, KeyError, ImportError, OSError) as error:
        raise translate_gin_error(error, source) from error
    return [Source(name=path, text=read_text(path)) for path in _included_paths(includes)]


def _check_includes_exist(source: Source) -> None:
    """ConfError for an `include` of a file that is on none of gin's search paths.

    Checked before gin parses, because gin's fallback lookup of a missing include as a Python package resource
    crashes with a TypeError when the include's folder is an importable namespace package (e.g. `confs/`).
    """
    for line_number, line in enumerate(source.text.splitlines(), start=1):
        included = INCLUDE_STATEMENT_RE.match(strip_comment(line))
        if included and resolve_include(included['file']) is None:
            prefixes = [''] if os.path.isabs(included['file']) else gin_config._LOCATION_PREFIXES
            searched = ', '.join(p or f'cwd {os.getcwd()}' for p in prefixes)
            raise ConfError(f"{source.where(line_number)}: included file '{included['file']}' not found "
                            f"(searched: {searched})")


def _included_paths(includes: Sequence[Any]) -> Iterator[str]:
    """Paths of the files named by gin's (nested) include records, resolved as gin resolved them."""
    for include in includes:
        path = resolve_include(include.filename)
        if path is not None:
            yield path
        yield from _included_paths(include.includes)


class _InertDelegate(config_parser.ParserDelegate):
    """Parser delegate that resolves nothing, so statements can be inspected before gin acts on them."""

    def configurable_reference(self, scoped_configurable_name: str, evaluate: bool) -> str:
        return scoped_configurable_name

    def macro(self, macro_name: str) -> str:
        return macro_name


# Macros: gin accepts `%undefined` at parse time and fails only when the value is used; check right after
# parsing.


def _check_macros_defined(sources: Sequence[Source]) -> None:
    """ConfError naming the first use of a macro that no source defines."""
    config = gin_config._CONFIG
    defined = sorted(scope for (scope, selector) in config if is_macro(selector))
    for (scope, selector), params in config.items():
        for arg, value in params.items():
            for reference in gin_config.iterate_references({arg: value}):
                if not is_macro(reference.configurable.selector):
                    continue
                name = '/'.join(reference.scopes)
                if (name, reference.configurable.selector) not in config:
                    binding = binding_key(scope, selector, arg)
                    where = _find_macro_use(name, sources)
                    raise ConfError(f"{where}: undefined macro '%{name}' (used by '{binding}')"
                                    f"{suggest(name, defined, '; define it, e.g. ' + name + ' = <value>')}")


def _find_macro_use(name: str, sources: Sequence[Source]) -> str:
    """'file:line' of the first `%name` outside a comment in `sources` (the first source's name if none)."""
    pattern = re.compile(r'%' + re.escape(name) + r'(?![\w/.])')
    for source in sources:
        for number, line in enumerate(source.text.splitlines(), 1):
            if pattern.search(strip_comment(line)):
                return source.where(number)
    return sources[0].name if sources else '<conf>'
