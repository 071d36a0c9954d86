"""Text from a results directory made safe to print: what a planted file name or file holds reaches the terminal as
visible escapes, never as control bytes (an ESC sequence could rewrite the screen, hide a line or retitle the
window)."""
from __future__ import annotations

__all__ = ["printable"]


def _escaped(char: str) -> str:
    """``char`` as Python writes it in a string literal: ``\\x1b``, ``\\n``, ``\\u200b``, ``\\udcff``."""
    return char.encode("unicode_escape").decode("ascii")


def printable(text: str) -> str:
    """``text`` with every character that is not printable (controls, format characters, lone surrogates from
    undecodable file names, line and paragraph separators) replaced by its backslash escape, e.g. ``'\\x1b'`` by the
    four characters ``\\x1b``; spaces and printable characters of any script are kept. A backslash stays one
    backslash (the result is for reading, not for parsing back)."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escaped(char) for char in text)
