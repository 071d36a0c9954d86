"""The error of a conf that cannot be used: one line naming where (file and line, or the --conf_param) and what."""
from __future__ import annotations


class ConfError(Exception):
    """A problem in a conf (file, --conf_param or stored config). Its str() is always one line."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


def one_line(text: str) -> str:
    """`text` with every run of whitespace (newlines included) collapsed to one space."""
    return ' '.join(str(text).split())
