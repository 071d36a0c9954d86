"""Loading gin confs with strict one-line errors, and writing the record of the config a run used.

gin reports problems as multi-line exceptions whose location is sometimes an attribute, sometimes text appended to
the message and sometimes missing. Everything here turns them into a one-line `ConfError` of the form
``<file>:<line>: <problem>; did you mean '<closest valid name>'?`` (``--conf_param '<binding>': ...`` for bindings
given on the command line), so a typo fails before any environment starts.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import importlib
import inspect
import io
import itertools
import logging
import os
import pkgutil
import re
import tempfile
import tokenize
from types import ModuleType
from typing import Any, Iterator, Optional, Sequence

import gin
from gin import config as gin_config
from gin import config_parser

from alfish.config import value_checks

logger = logging.getLogger(__name__)

# Packages whose modules define the configurables a conf may name; every module under them is imported before parsing.
CONFIGURABLE_PACKAGES: tuple[str, ...] = (
    'alfish.algorithms', 'alfish.envs', 'alfish.learn', 'alfish.networks', 'alfish.trainer',
    'alfish.transforms', 'alfish.replay', 'alfish.schedulers',
)

# Selector prefix of gin's own builtins (macro, constant, singleton): valid names, but never useful suggestions.
_GIN_BUILTIN_PREFIX = 'gin.'
_MAX_LISTED_PARAMETERS = 12
# A suggestion needs this similarity (difflib ratio); others are listed only if nearly as similar as the best.
_SUGGEST_CUTOFF = 0.6
_SUGGEST_SPREAD = 0.05


class ConfError(Exception):
    """A problem in a conf (file, --conf_param or stored config). Its str() is always one line."""

    def __init__(self, message: str) -> None:
        super().__init__(_one_line(message))


# ---------------------------------------------------------------------------------------------------------------------
# Public API


def register_configurables(packages: Optional[Sequence[str]] = None) -> list[str]:
    """Imports every module of `packages` so their `@gin.configurable`s are registered; returns the packages found.

    `packages` defaults to CONFIGURABLE_PACKAGES (read at call time). A package that does not exist (yet) is
    skipped; any other import error, including a missing module imported by an existing one, propagates unchanged.
    """
    found = []
    for name in CONFIGURABLE_PACKAGES if packages is None else packages:
        package = _import_if_exists(name)
        if package is None:
            logger.debug("Package %s does not exist; none of its configurables are registered", name)
            continue
        found.append(name)
        _import_submodules(package)
    return found


def load_conf(conf_file: Optional[str], conf_params: Sequence[str] = ()) -> None:
    """Clears gin's config, then parses `conf_file` and the `--conf_param` bindings (applied in order, last wins).

    `include` statements are resolved against the cwd first, then the directory of `conf_file`.

    Raises:
        ConfError: one line naming the file and line (or the --conf_param) and the closest valid name.
    """
    gin.clear_config()
    register_configurables()
    sources = [_file_source(conf_file)] if conf_file else []
    sources += [_conf_param_source(param) for param in conf_params]
    search_dir = os.path.dirname(conf_file) if conf_file else ''
    with _include_search_path(search_dir):
        _parse_sources(sources)


def write_config_record(root_dir: str) -> list[str]:
    """Writes root_dir/config/operative.gin and full.gin; returns the bindings that were set but never used.

    operative.gin holds the bindings the program actually used (gin.operative_config_str(), defaults included),
    followed by one ``# UNUSED: Name.param = value`` comment per unused binding; full.gin holds everything that was
    set (gin.config_str()). Call it after the training objects have been built: gin counts a binding as used only
    once its configurable has been called. Each unused binding is also logged as a warning (one line each), so the
    caller need not log them again. Files are written atomically.
    """
    unused = unused_bindings()
    operative = gin.operative_config_str()
    if unused:
        operative += ('\n\n# Bindings set in the conf but never used (their configurable was not called, '
                      'or its caller passed the value itself):\n')
        operative += ''.join(f'# UNUSED: {binding}\n' for binding in unused)
    config_dir = os.path.join(root_dir, 'config')
    os.makedirs(config_dir, exist_ok=True)
    _atomic_write(os.path.join(config_dir, 'operative.gin'), operative)
    _atomic_write(os.path.join(config_dir, 'full.gin'), gin.config_str())
    for binding in unused:
        logger.warning("gin binding set but never used: %s", binding)
    return unused


def unused_bindings() -> list[str]:
    """Bindings ('scope/Name.param = value') that are set but did not supply the value of any call so far.

    A binding supplies a call's value when the call's scope equals or lies inside the binding's scope, no binding in
    a more specific scope sets the same parameter, and the caller did not pass the parameter itself.
    """
    used = _used_binding_keys()
    return sorted(_format_binding(scope, selector, arg, value)
                  for (scope, selector), params in gin_config._CONFIG.items()
                  for arg, value in params.items() if (scope, selector, arg) not in used)


# ---------------------------------------------------------------------------------------------------------------------
# Registering configurables


def _import_if_exists(name: str) -> Optional[ModuleType]:
    """Imports module `name`; None if it (or a parent package) does not exist. Other failures propagate."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        missing = error.name or ''
        if missing and (name == missing or name.startswith(missing + '.')):
            return None
        raise


def _import_submodules(package: ModuleType) -> None:
    """Imports every module below `package` (recursively); the first import error propagates."""
    if not hasattr(package, '__path__'):
        return  # A plain module: nothing below it.
    for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + '.', onerror=_reraise_import):
        importlib.import_module(info.name)


def _reraise_import(name: str) -> None:
    """pkgutil's onerror hook: imports `name` again so its real exception propagates instead of being skipped."""
    importlib.import_module(name)


# ---------------------------------------------------------------------------------------------------------------------
# Sources and parsing


@dataclasses.dataclass(frozen=True)
class _Source:
    """Text to parse and the name errors call it by (a file path, or "--conf_param '...'" without line numbers)."""

    name: str
    text: str
    has_lines: bool = True

    def where(self, line: Optional[int]) -> str:
        """The location prefix of an error message: 'file:line', or the name alone."""
        return f'{self.name}:{line}' if self.has_lines and line else self.name


def _file_source(conf_file: str) -> _Source:
    """Reads a conf file; ConfError if it does not exist."""
    if not os.path.isfile(conf_file):
        raise ConfError(f"conf file '{conf_file}' not found (cwd: {os.getcwd()})")
    with open(conf_file, encoding='utf-8') as stream:
        return _Source(name=conf_file, text=stream.read())


def _conf_param_source(param: str) -> _Source:
    """A --conf_param binding as a source of its own, so errors can quote it."""
    return _Source(name=f'--conf_param {param!r}', text=param, has_lines=False)


@contextlib.contextmanager
def _include_search_path(directory: str) -> Iterator[None]:
    """Lets `include` find files relative to `directory` (after the cwd) while parsing; restores gin's path after."""
    prefixes = gin_config._LOCATION_PREFIXES
    added = bool(directory) and directory not in prefixes
    if added:
        gin.add_config_file_search_path(directory)
    # gin logs "Path not found" on the root logger for every search location an include is not in, even when a later
    # one has it; drop those records (a missing include is our own one-line error), and keep a handler on the root
    # logger meanwhile so that logging does not install its default stderr handler for them.
    root = logging.getLogger()
    quiet = _DropGinPathProbes()
    placeholder = logging.NullHandler() if not root.handlers else None
    root.addFilter(quiet)
    if placeholder is not None:
        root.addHandler(placeholder)
    try:
        yield
    finally:
        root.removeFilter(quiet)
        if placeholder is not None:
            root.removeHandler(placeholder)
        if added:
            prefixes.remove(directory)


class _DropGinPathProbes(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.pathname.replace("\\", "/").endswith("gin/resource_reader.py")


def _parse_sources(sources: Sequence[_Source]) -> None:
    """Parses `sources` in order into gin's config, then checks that every macro used is defined and that every value
    bound to an alfish configurable fits its parameter's type and range (alfish.config.value_checks)."""
    included: list[_Source] = []
    for source in sources:
        included += _parse_source(source)
    _check_macros_defined(list(sources) + included)
    _check_values(sources)


def _check_values(sources: Sequence[_Source]) -> None:
    """ConfError naming the file and line of the first bound value that does not fit (and where the others are)."""
    problems = value_checks.binding_problems()
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
    raise ConfError(value_checks.first_problem_summary([(where, message) for _, where, message in located]))


def _binding_locations(sources: Sequence[_Source]) -> dict[tuple[str, str, str], tuple[int, str]]:
    """(scope, full selector, param) -> (order, 'file:line') of the statement that last bound it, includes followed.

    Macros are keyed (name, 'gin.macro', 'value'), as gin binds them. The order numbers statements as gin applied
    them, so errors can be reported in the order a reader meets them.
    """
    locations: dict[tuple[str, str, str], tuple[int, str]] = {}
    order = itertools.count()
    for source in sources:
        _collect_locations(source, '', locations, order, {source.name})
    return locations


def _collect_locations(source: _Source, included_from: str, locations: dict[tuple[str, str, str], tuple[int, str]],
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
            path = _resolve_include(statement.filename)
            if path is not None and path not in visited:
                _collect_locations(_Source(name=path, text=_read(path)), f' (included from {where})', locations,
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


def _parse_source(source: _Source) -> list[_Source]:
    """Parses one source with gin; returns the files it included (for locating later errors)."""
    _check_includes_exist(source)
    stream = io.StringIO(source.text)
    stream.name = source.name  # gin reports locations by the stream's name.
    try:
        includes, _ = gin.parse_config(stream)
    except (SyntaxError, tokenize.TokenError, ValueError, KeyError, ImportError, OSError) as error:
        raise _translate(error, source) from error
    return [_Source(name=path, text=_read(path)) for path in _included_paths(includes)]


def _check_includes_exist(source: _Source) -> None:
    """ConfError for an `include` of a file that is on none of gin's search paths.

    Checked before gin parses, because gin's fallback lookup of a missing include as a Python package resource
    crashes with a TypeError when the include's folder is an importable namespace package (e.g. `confs/`).
    """
    for line_number, line in enumerate(source.text.splitlines(), start=1):
        included = _INCLUDE_STATEMENT_RE.match(_strip_comment(line))
        if included and _resolve_include(included['file']) is None:
            prefixes = [''] if os.path.isabs(included['file']) else gin_config._LOCATION_PREFIXES
            searched = ', '.join(p or f'cwd {os.getcwd()}' for p in prefixes)
            raise ConfError(f"{source.where(line_number)}: included file '{included['file']}' not found "
                            f"(searched: {searched})")


def _included_paths(includes: Sequence[Any]) -> Iterator[str]:
    """Paths of the files named by gin's (nested) include records, resolved as gin resolved them."""
    for include in includes:
        path = _resolve_include(include.filename)
        if path is not None:
            yield path
        yield from _included_paths(include.includes)


def _resolve_include(filename: str) -> Optional[str]:
    """The path gin opens for `include '<filename>'` (first search prefix holding it), or None."""
    prefixes = [''] if os.path.isabs(filename) else gin_config._LOCATION_PREFIXES
    for prefix in prefixes:
        path = os.path.join(prefix, filename)
        if os.path.isfile(path):
            return path
    return None


def _read(path: str) -> str:
    """The text of a file."""
    with open(path, encoding='utf-8') as stream:
        return stream.read()


class _InertDelegate(config_parser.ParserDelegate):
    """Parser delegate that resolves nothing, so statements can be inspected before gin acts on them."""

    def configurable_reference(self, scoped_configurable_name: str, evaluate: bool) -> str:
        return scoped_configurable_name

    def macro(self, macro_name: str) -> str:
        return macro_name


# ---------------------------------------------------------------------------------------------------------------------
# Translating gin's exceptions

# gin appends one of these per enclosing statement (innermost first), via gin.utils.try_with_location.
_LOCATION_RE = re.compile(
    r'\n  In (?:file "(?P<file>[^"\n]*)",|bindings string) line (?P<line>\d+)\n    (?P<content>[^\n]*)(?:\n *\^)?')
_UNKNOWN_REFERENCE_RE = re.compile(r"^No configurable matching reference '@(?P<name>[^'()]+)(?:\(\))?'\.")
_UNKNOWN_CONFIGURABLE_RE = re.compile(r"^No configurable matching '(?P<name>[^']+)'\.")
_UNKNOWN_PARAMETER_RE = re.compile(r"^Configurable '(?P<name>[^']+)' doesn't have a parameter named '(?P<arg>[^']+)'\.")
_AMBIGUOUS_RE = re.compile(r"^Ambiguous selector '(?P<name>[^']+)', matches (?P<matches>\[.*\])\.")
_INCLUDE_MISSING_RE = re.compile(r"^Unable to open file: (?P<file>.*)\. Searched config paths: (?P<paths>\[.*\])\.")
_NO_MODULE_RE = re.compile(r"^No module named '(?P<name>[^']+)'")
_INCLUDE_STATEMENT_RE = re.compile(r"""^\s*include\s+(['"])(?P<file>.+)\1""")


@dataclasses.dataclass(frozen=True)
class _GinLocation:
    """One location gin appended to a message: file (None for a bindings string), line and the line's text."""

    file: Optional[str]
    line: int
    content: str


def _translate(error: Exception, source: _Source) -> ConfError:
    """One-line ConfError for an exception gin raised while parsing `source`."""
    if isinstance(error, SyntaxError):
        return _translate_syntax_error(error, source)
    message, locations = _split_gin_message(error)
    if isinstance(error, tokenize.TokenError):
        return _translate_token_error(error, message, locations, source)
    where = _where(locations, source)
    return ConfError(f'{where}: {_describe(message)}')


def _split_gin_message(error: Exception) -> tuple[str, list[_GinLocation]]:
    """Splits gin's text into the original message and the locations gin appended (innermost first)."""
    text = str(error)
    matches = list(_LOCATION_RE.finditer(text))
    message = text[:matches[0].start()] if matches else text
    if isinstance(error, KeyError):  # str(KeyError) is the repr of its message.
        message = _unquote(message)
    locations = [_GinLocation(m['file'], int(m['line']), m['content']) for m in matches]
    return message, locations


def _unquote(text: str) -> str:
    """The string a repr() denotes, or `text` unchanged if it is not a string literal."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return value if isinstance(value, str) else text


def _where(locations: Sequence[_GinLocation], source: _Source) -> str:
    """'file:line' of the innermost location, plus '(included from file:line)' for each enclosing include."""
    if not locations:
        return source.name
    inner, *outer = locations
    where = _location_str(inner, source)
    for location in outer:
        where += f' (included from {_location_str(location, source)})'
    return where


def _location_str(location: _GinLocation, source: _Source) -> str:
    """A location gin reported, named like the source it belongs to."""
    if location.file is None or location.file == source.name:
        return source.where(location.line)
    return f'{location.file}:{location.line}'


def _describe(message: str) -> str:
    """The problem in gin's message, said plainly with the closest valid names."""
    if match := _UNKNOWN_REFERENCE_RE.match(message) or _UNKNOWN_CONFIGURABLE_RE.match(message):
        name = match['name']
        return f"unknown configurable '{name}'{_suggest(name, _configurable_candidates(name), _UNKNOWN_HINT)}"
    if match := _UNKNOWN_PARAMETER_RE.match(message):
        name, arg = match['name'], match['arg']
        parameters = _parameter_names(name)
        return f"'{name}' has no parameter '{arg}'{_suggest(arg, parameters, _parameters_hint(parameters))}"
    if match := _AMBIGUOUS_RE.match(message):
        matches = ', '.join(repr(m) for m in sorted(ast.literal_eval(match['matches'])))
        return (f"configurable name '{match['name']}' is ambiguous: it matches {matches}; "
                f"write enough of the module path to pick one")
    if match := _INCLUDE_MISSING_RE.match(message):
        searched = ', '.join(p or f'cwd {os.getcwd()}' for p in ast.literal_eval(match['paths']))
        return f"included file '{match['file']}' not found (searched: {searched})"
    if match := _NO_MODULE_RE.match(message):
        return f"cannot import module: no module named '{match['name']}'"
    return message


_UNKNOWN_HINT = "; no registered configurable has a similar name (is the module that defines it imported?)"


def _parameters_hint(parameters: Sequence[str]) -> str:
    """Lists the valid parameters when none is close to the misspelled one."""
    listed = ', '.join(parameters[:_MAX_LISTED_PARAMETERS])
    more = ', ...' if len(parameters) > _MAX_LISTED_PARAMETERS else ''
    return f"; its parameters are: {listed}{more}" if parameters else "; it takes no configurable parameters"


def _suggest(name: str, candidates: Sequence[str], hint_if_none: str) -> str:
    """"; did you mean 'x'?" naming the closest candidate (case-insensitive; up to three when about as close).

    Returns `hint_if_none` when no candidate is similar enough.
    """
    by_lower = {c.lower(): c for c in candidates}
    scored = sorted(((difflib.SequenceMatcher(None, name.lower(), lower).ratio(), original)
                     for lower, original in by_lower.items()), key=lambda pair: (-pair[0], pair[1]))
    if not scored or scored[0][0] < _SUGGEST_CUTOFF:
        return hint_if_none
    best = scored[0][0]
    close = [original for score, original in scored[:3] if score >= best - _SUGGEST_SPREAD]
    quoted = [f"'{c}'" for c in close]
    options = quoted[0] if len(quoted) == 1 else ', '.join(quoted[:-1]) + ' or ' + quoted[-1]
    return f'; did you mean {options}?'


def _configurable_candidates(name: str) -> list[str]:
    """Registered configurable names written the way `name` is (same number of dotted module components)."""
    depth = name.count('.') + 1
    names = set()
    for selector, _ in gin_config._REGISTRY.items():
        if selector.startswith(_GIN_BUILTIN_PREFIX):
            continue
        components = selector.split('.')
        if len(components) >= depth:
            names.add('.'.join(components[-depth:]))
    return sorted(names)


def _parameter_names(selector: str) -> list[str]:
    """The parameters gin may bind for the configurable `selector` (respecting its allowlist/denylist)."""
    configurable = gin_config._REGISTRY.get_match(selector)
    if configurable is None:
        return []
    fn = configurable.wrapped
    if inspect.isclass(fn):
        fn = gin_config._find_class_construction_fn(fn)
    spec = inspect.getfullargspec(inspect.unwrap(fn))
    names = [n for n in spec.args + spec.kwonlyargs if n not in ('self', 'cls')]
    if configurable.allowlist:
        names = [n for n in names if n in configurable.allowlist]
    if configurable.denylist:
        names = [n for n in names if n not in configurable.denylist]
    return names


def _translate_syntax_error(error: SyntaxError, source: _Source) -> ConfError:
    """gin's SyntaxError carries its own file and line; tokenize's IndentationError names only '<tokenize>'.

    A bracket left open is reported where it opens: gin reads on past it and fails at a later line (the next
    statement, or a closing bracket of another kind), which is not where the mistake is.
    """
    if error.filename in (None, '<tokenize>'):
        where = _locate_tokenize_error(source, set()) or source.where(error.lineno)
        return ConfError(f'{where}: gin syntax error: {error.msg}')
    text = source.text if error.filename == source.name else _read_if_file(error.filename)
    unclosed = _unclosed_bracket_at(text, error.lineno) if text is not None and error.lineno else None
    if unclosed is not None:
        line, problem = unclosed
        return ConfError(f"{_location_str(_GinLocation(error.filename, line, ''), source)}: gin syntax error: "
                         f"{problem}")
    where = _location_str(_GinLocation(error.filename, error.lineno or 0, error.text or ''), source)
    return ConfError(f'{where}: gin syntax error: {error.msg}')


_CLOSING = {'(': ')', '[': ']', '{': '}'}
# A line that starts a new statement (a binding, a block, an import or include): never valid inside a value.
# (Dict keys are literals in gin, so a line like `1: 'a'` or `None: 2` inside a dict is not taken for a block.)
_STATEMENT_START_RE = re.compile(
    r'^\s*(?:(?:import|from|include)\s|(?!(?:True|False|None)\b)[A-Za-z_][\w.]*(?:/[\w.]+)*\s*[=:])')


def _unclosed_bracket_at(text: str, line_number: int) -> Optional[tuple[int, str]]:
    """(line, problem) when gin's syntax error on `line_number` comes from a bracket opened on an earlier line.

    That is the case when the bracket is still open where the error line starts and that line either starts a new
    statement or begins with a closing bracket of another kind. None otherwise (the error line is the right one).
    """
    lines = text.splitlines()
    if not 1 <= line_number <= len(lines):
        return None
    stack: list[tuple[str, int]] = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.start[0] >= line_number:
                break
            if token.type == tokenize.OP and token.string in _CLOSING:
                stack.append((token.string, token.start[0]))
            elif token.type == tokenize.OP and token.string in _CLOSING.values() and stack:
                stack.pop()
    except (tokenize.TokenError, SyntaxError):  # SyntaxError: an IndentationError before the error line.
        return None
    if not stack:
        return None
    bracket, opened = stack[-1]
    fix = f"add the missing '{_CLOSING[bracket]}'"
    error_line = _strip_comment(lines[line_number - 1])
    if _STATEMENT_START_RE.match(error_line):
        return opened, f"'{bracket}' is never closed (line {line_number} was read as part of it); {fix}"
    first = error_line.strip()[:1]
    if first in _CLOSING.values() and first != _CLOSING[bracket] and len(stack) > 1:
        outer, outer_line = stack[-2]
        if _CLOSING[outer] == first:
            return opened, (f"'{bracket}' is never closed ('{first}' on line {line_number} closes the '{outer}' of "
                            f"line {outer_line}); {fix}")
    return None


def _read_if_file(path: str) -> Optional[str]:
    """The text of `path`, or None if it cannot be read (then the error keeps gin's line)."""
    try:
        return _read(path)
    except (OSError, UnicodeDecodeError):
        return None


def _locate_tokenize_error(source: _Source, visited: set[str]) -> Optional[str]:
    """'file:line' of the first indentation error in `source` or, recursively, in the files it includes."""
    visited.add(source.name)
    try:
        for _ in tokenize.generate_tokens(io.StringIO(source.text).readline):
            pass
    except IndentationError as error:
        return source.where(error.lineno)
    except tokenize.TokenError:
        return None
    for line_number, line in enumerate(source.text.splitlines(), 1):
        included = _INCLUDE_STATEMENT_RE.match(line)
        path = _resolve_include(included['file']) if included else None
        if path is not None and path not in visited:
            where = _locate_tokenize_error(_Source(name=path, text=_read(path)), visited)
            if where is not None:
                return f'{where} (included from {source.where(line_number)})'
    return None


def _translate_token_error(error: tokenize.TokenError, message: str, locations: Sequence[_GinLocation],
                           source: _Source) -> ConfError:
    """An unterminated bracket or string: reported at the line where the unclosed statement starts.

    Python's tokenizer reports the end of the file, which names neither the file (in an include) nor a useful line,
    so the statement start is found by tokenizing the file again.
    """
    reason = error.args[0] if error.args else _unquote_tuple_head(message)
    where = source.where(_unclosed_statement_line(source.text))
    if locations:  # Raised inside an included file: gin only names the include statement.
        included = _INCLUDE_STATEMENT_RE.match(locations[0].content)
        path = _resolve_include(included['file']) if included else None
        if path is not None:
            inner = _Source(name=path, text=_read(path))
            where = f'{inner.where(_unclosed_statement_line(inner.text))} (included from {_where(locations, source)})'
    return ConfError(f'{where}: gin syntax error: {reason} (a bracket or string is never closed)')


def _unquote_tuple_head(text: str) -> str:
    """First element of a tuple repr such as "('EOF in multi-line statement', (3, 0))", or `text`."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return str(value[0]) if isinstance(value, tuple) and value else text


def _unclosed_statement_line(text: str) -> Optional[int]:
    """Line where the statement left open at the end of `text` starts (None if tokenizing succeeds)."""
    statement_start = None
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                statement_start = None
            elif statement_start is None and token.type not in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT,
                                                                 tokenize.DEDENT):
                statement_start = token.start[0]
    except tokenize.TokenError as error:
        return statement_start or error.args[1][0]
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Macros: gin accepts `%undefined` at parse time and fails only when the value is used; check right after parsing.


def _check_macros_defined(sources: Sequence[_Source]) -> None:
    """ConfError naming the first use of a macro that no source defines."""
    config = gin_config._CONFIG
    defined = sorted(scope for (scope, selector) in config if _is_macro(selector))
    for (scope, selector), params in config.items():
        for arg, value in params.items():
            for reference in gin_config.iterate_references({arg: value}):
                if not _is_macro(reference.configurable.selector):
                    continue
                name = '/'.join(reference.scopes)
                if (name, reference.configurable.selector) not in config:
                    binding = _binding_key(scope, selector, arg)
                    where = _find_macro_use(name, sources)
                    raise ConfError(f"{where}: undefined macro '%{name}' (used by '{binding}')"
                                    f"{_suggest(name, defined, '; define it, e.g. ' + name + ' = <value>')}")


def _is_macro(selector: str) -> bool:
    """True for gin's macro configurable (`%name` references and `name = value` bindings)."""
    configurable = gin_config._REGISTRY.get(selector)
    return configurable is not None and configurable.wrapped is gin_config.macro


def _find_macro_use(name: str, sources: Sequence[_Source]) -> str:
    """'file:line' of the first `%name` outside a comment in `sources` (the first source's name if none)."""
    pattern = re.compile(r'%' + re.escape(name) + r'(?![\w/.])')
    for source in sources:
        for number, line in enumerate(source.text.splitlines(), 1):
            if pattern.search(_strip_comment(line)):
                return source.where(number)
    return sources[0].name if sources else '<conf>'


def _strip_comment(line: str) -> str:
    """`line` without a trailing '# ...' comment (a '#' inside a quoted string is kept)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in '\'"':
            quote = char
        elif char == '#':
            return line[:i]
    return line


# ---------------------------------------------------------------------------------------------------------------------
# The config record


def _used_binding_keys() -> set[tuple[str, str, str]]:
    """(scope, selector, param) of every binding that supplied a value to some configurable call."""
    used = set()
    with gin_config._OPERATIVE_CONFIG_LOCK:
        operative = {key: list(params) for key, params in gin_config._OPERATIVE_CONFIG.items()}
    for (call_scope, selector), params in operative.items():
        for arg in params:
            binding_scope = _supplying_scope(call_scope, selector, arg)
            if binding_scope is not None:
                used.add((binding_scope, selector, arg))
    return used


def _supplying_scope(call_scope: str, selector: str, arg: str) -> Optional[str]:
    """The scope of the binding gin used for `arg` in a call made in `call_scope`: the most specific bound one."""
    components = call_scope.split('/') if call_scope else []
    for depth in range(len(components), -1, -1):
        scope = '/'.join(components[:depth])
        if arg in gin_config._CONFIG.get((scope, selector), {}):
            return scope
    return None


def _binding_key(scope: str, selector: str, arg: str) -> str:
    """How a binding is written in a conf: 'scope/Name.param', or the macro's name for a macro."""
    if _is_macro(selector):
        return scope
    name = gin_config._REGISTRY.minimal_selector(selector)
    return f'{scope}/{name}.{arg}' if scope else f'{name}.{arg}'


def _format_binding(scope: str, selector: str, arg: str, value: Any) -> str:
    """'scope/Name.param = value' on one line."""
    return f'{_binding_key(scope, selector, arg)} = {_one_line(repr(value))}'


def _atomic_write(path: str, text: str) -> None:
    """Writes `text` to `path` through a temporary file and os.replace, so readers never see a partial file."""
    directory = os.path.dirname(path) or '.'
    fd, tmp_path = tempfile.mkstemp(dir=directory, prefix='.' + os.path.basename(path) + '.', suffix='.tmp')
    try:
        with os.fdopen(fd, 'w', encoding='utf-8') as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        os.unlink(tmp_path)
        raise


def _one_line(text: str) -> str:
    """`text` with every run of whitespace (newlines included) collapsed to one space."""
    return ' '.join(str(text).split())
