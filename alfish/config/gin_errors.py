"""gin's parse exceptions turned into one-line `ConfError`s that name the file and line and the closest valid name.

gin reports problems as multi-line exceptions whose location is sometimes an attribute, sometimes text appended to
the message and sometimes missing. `translate_gin_error` turns them into ``<file>:<line>: <problem>; did you mean
'<closest valid name>'?`` (``--conf_param '<binding>': ...`` for bindings given on the command line); a bracket or
string left open is reported where it opens, also inside an included file.
"""
from __future__ import annotations

import ast
import dataclasses
import io
import os
import re
import tokenize
from typing import Optional, Sequence

from alfish.config.conf_error import ConfError
from alfish.config.gin_names import (
    UNKNOWN_HINT,
    configurable_candidates,
    parameter_names,
    parameters_hint,
    suggest,
)
from alfish.config.sources import INCLUDE_STATEMENT_RE, Source, read_text, resolve_include, strip_comment

# gin appends one of these per enclosing statement (innermost first), via gin.utils.try_with_location.
_LOCATION_RE = re.compile(
    r'\n  In (?:file "(?P<file>[^"\n]*)",|bindings string) line (?P<line>\d+)\n    (?P<content>[^\n]*)(?:\n *\^)?')
_UNKNOWN_REFERENCE_RE = re.compile(r"^No configurable matching reference '@(?P<name>[^'()]+)(?:\(\))?'\.")
_UNKNOWN_CONFIGURABLE_RE = re.compile(r"^No configurable matching '(?P<name>[^']+)'\.")
_UNKNOWN_PARAMETER_RE = re.compile(r"^Configurable '(?P<name>[^']+)' doesn't have a parameter named '(?P<arg>[^']+)'\.")
_AMBIGUOUS_RE = re.compile(r"^Ambiguous selector '(?P<name>[^']+)', matches (?P<matches>\[.*\])\.")
_INCLUDE_MISSING_RE = re.compile(r"^Unable to open file: (?P<file>.*)\. Searched config paths: (?P<paths>\[.*\])\.")
_NO_MODULE_RE = re.compile(r"^No module named '(?P<name>[^']+)'")


@dataclasses.dataclass(frozen=True)
class _GinLocation:
    """One location gin appended to a message: file (None for a bindings string), line and the line's text."""

    file: Optional[str]
    line: int
    content: str


def translate_gin_error(error: Exception, source: Source) -> ConfError:
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


def _where(locations: Sequence[_GinLocation], source: Source) -> str:
    """'file:line' of the innermost location, plus '(included from file:line)' for each enclosing include."""
    if not locations:
        return source.name
    inner, *outer = locations
    where = _location_str(inner, source)
    for location in outer:
        where += f' (included from {_location_str(location, source)})'
    return where


def _location_str(location: _GinLocation, source: Source) -> str:
    """A location gin reported, named like the source it belongs to."""
    if location.file is None or location.file == source.name:
        return source.where(location.line)
    return f'{location.file}:{location.line}'


def _describe(message: str) -> str:
    """The problem in gin's message, said plainly with the closest valid names."""
    if match := _UNKNOWN_REFERENCE_RE.match(message) or _UNKNOWN_CONFIGURABLE_RE.match(message):
        name = match['name']
        return f"unknown configurable '{name}'{suggest(name, configurable_candidates(name), UNKNOWN_HINT)}"
    if match := _UNKNOWN_PARAMETER_RE.match(message):
        name, arg = match['name'], match['arg']
        parameters = parameter_names(name)
        return f"'{name}' has no parameter '{arg}'{suggest(arg, parameters, parameters_hint(parameters))}"
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


def _translate_syntax_error(error: SyntaxError, source: Source) -> ConfError:
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
    error_line = strip_comment(lines[line_number - 1])
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
        return read_text(path)
    except (OSError, UnicodeDecodeError):
        return None


def _locate_tokenize_error(source: Source, visited: set[str]) -> Optional[str]:
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
        included = INCLUDE_STATEMENT_RE.match(line)
        path = resolve_include(included['file']) if included else None
        if path is not None and path not in visited:
            where = _locate_tokenize_error(Source(name=path, text=read_text(path)), visited)
            if where is not None:
                return f'{where} (included from {source.where(line_number)})'
    return None


def _translate_token_error(error: tokenize.TokenError, message: str, locations: Sequence[_GinLocation],
                           source: Source) -> ConfError:
    """An unterminated bracket or string: reported at the line where the unclosed statement starts.

    Python's tokenizer reports the end of the file, which names neither the file (in an include) nor a useful line,
    so the statement start is found by tokenizing the file again.
    """
    reason = error.args[0] if error.args else _unquote_tuple_head(message)
    where = source.where(_unclosed_statement_line(source.text))
    if locations:  # Raised inside an included file: gin only names the include statement.
        included = INCLUDE_STATEMENT_RE.match(locations[0].content)
        path = resolve_include(included['file']) if included else None
        if path is not None:
            inner = Source(name=path, text=read_text(path))
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
