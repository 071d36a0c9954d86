"""Conf text to parse and where it came from: a conf file, a --conf_param binding, the files an ``include`` reads.

A `Source` names its text the way error messages quote it (``file:line``, or ``--conf_param '...'`` without lines);
gin resolves ``include`` against its search path, which `include_search_path` extends by the conf's own folder.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
from typing import Iterator, Optional

import gin
from gin import config as gin_config

from alfish.config.conf_error import ConfError


@dataclasses.dataclass(frozen=True)
class Source:
    """Text to parse and the name errors call it by (a file path, or "--conf_param '...'" without line numbers)."""

    name: str
    text: str
    has_lines: bool = True

    def where(self, line: Optional[int]) -> str:
        """The location prefix of an error message: 'file:line', or the name alone."""
        return f'{self.name}:{line}' if self.has_lines and line else self.name


def file_source(conf_file: str) -> Source:
    """Reads a conf file; ConfError if it does not exist."""
    if not os.path.isfile(conf_file):
        raise ConfError(f"conf file '{conf_file}' not found (cwd: {os.getcwd()})")
    with open(conf_file, encoding='utf-8') as stream:
        return Source(name=conf_file, text=stream.read())


def conf_param_source(param: str) -> Source:
    """A --conf_param binding as a source of its own, so errors can quote it."""
    return Source(name=f'--conf_param {param!r}', text=param, has_lines=False)


@contextlib.contextmanager
def include_search_path(directory: str) -> Iterator[None]:
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


def resolve_include(filename: str) -> Optional[str]:
    """The path gin opens for `include '<filename>'` (first search prefix holding it), or None."""
    prefixes = [''] if os.path.isabs(filename) else gin_config._LOCATION_PREFIXES
    for prefix in prefixes:
        path = os.path.join(prefix, filename)
        if os.path.isfile(path):
            return path
    return None


def read_text(path: str) -> str:
    """The text of a file."""
    with open(path, encoding='utf-8') as stream:
        return stream.read()


INCLUDE_STATEMENT_RE = re.compile(r"""^\s*include\s+(['"])(?P<file>.+)\1""")


def strip_comment(line: str) -> str:
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
