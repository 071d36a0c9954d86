"""Bounded parsing of what alfish reads from a results directory: JSON, JSON-lines and the numbers in them.

A small file must not be able to cost gigabytes of memory or escape as a traceback. JSON text is checked before it
is parsed: its nesting depth (``json`` recurses, so a deep document is a ``RecursionError``) and the number of values
it holds (what bounds the Python objects built, about 50-100 bytes each, not only the bytes read). Numbers that count
something (iterations, world sizes, episode lengths) are checked finite, integral and in range where they are used
(:func:`checked_count`). Line files (``eval_log.jsonl``, ``scalars.csv``) are read streaming, line by line, with a
cap per line and in total (:func:`bounded_lines`).

Every failure is a :class:`RootDirContentError` (a ``ValueError``) whose message is one line; callers that treat a
checkpoint as damaged catch ``ValueError`` (and ``OSError``) as they already did.
"""
from __future__ import annotations

import json
import math
from typing import IO, Any, Iterator

import numpy as np

__all__ = ["RootDirContentError", "MAX_JSON_DEPTH", "loads_bounded", "checked_count", "bounded_lines"]

#: Deepest nesting alfish's own JSON has is under 10 (meta: RNG states, the config record); 64 leaves room.
MAX_JSON_DEPTH = 64
# +1 for a byte that opens a container, -1 for one that closes it (outside strings)
_NESTING = np.zeros(256, dtype=np.int8)
_NESTING[[ord("["), ord("{")]] = 1
_NESTING[[ord("]"), ord("}")]] = -1


class RootDirContentError(ValueError):
    """What a file in a results directory holds is out of bounds (too deep, too many values, a number out of range,
    a line too long); ``str()`` is one line naming the file and the bound."""


def _structure(raw: bytes) -> np.ndarray:
    """The bytes of ``raw`` outside JSON strings (strings may hold brackets and commas that are not structure)."""
    data = np.frombuffer(raw, dtype=np.uint8)
    quote = data == ord('"')
    if quote.any():
        # a quote preceded by an odd run of backslashes is escaped: find the runs with a cumulative count
        backslash = (data == ord("\\")).astype(np.int64)
        run = np.cumsum(backslash)
        reset = np.maximum.accumulate(np.where(backslash == 0, run, 0))
        odd_before = np.zeros_like(quote)
        odd_before[1:] = ((run - reset)[:-1] % 2) == 1
        quote &= ~odd_before
        inside = (np.cumsum(quote) % 2).astype(bool) | quote
        data = data[~inside]
    return data


def loads_bounded(raw: bytes, what: str, max_values: int, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(raw)`` once ``raw`` is known to nest at most ``max_depth`` deep and hold at most ``max_values``
    values (containers and their elements), so the objects built are bounded by ``max_values``.

    Raises:
        RootDirContentError: too deep, too many values, not UTF-8 or not JSON (one line naming ``what``).
    """
    outside = _structure(raw)
    step = _NESTING[outside]
    deepest = int(np.cumsum(step, dtype=np.int64).max()) if step.size else 0
    if deepest > max_depth:
        raise RootDirContentError(f"{what} nests {deepest} levels deep, more than the {max_depth} alfish reads (it "
                                  "was not written by alfish)")
    values = int((step == 1).sum()) + int((outside == ord(",")).sum()) + 1
    if values > max_values:
        raise RootDirContentError(f"{what} holds about {values} JSON values, more than the {max_values} alfish "
                                  "reads (it was not written by alfish)")
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError, MemoryError) as e:  # bad UTF-8 or JSON; a 5000-digit integer
        raise RootDirContentError(f"{what} is not valid JSON ({type(e).__name__}: {_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def checked_count(value: Any, what: str, low: int = 0, high: int = 2 ** 53) -> int:
    """``value`` as an int if it is an integral, finite number in ``[low, high]`` (a float like 3.0 is accepted:
    JSON has one number type); otherwise RootDirContentError naming ``what`` and the range."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and isinstance(value, float):
        ok = math.isfinite(value) and value.is_integer()
    if ok and low <= value <= high:
        return int(value)
    shown = repr(value) if not isinstance(value, str) else repr(value[:40])
    raise RootDirContentError(f"{what} is {shown[:60]}, not a whole number in [{low}, {high}] (the file was not "
                              "written by alfish or was altered)")


def bounded_lines(stream: IO[bytes], what: str, max_line_bytes: int, max_total_bytes: int) -> Iterator[bytes]:
    """The lines of the binary ``stream`` (without their newline), read one at a time.

    Raises:
        RootDirContentError: a line longer than ``max_line_bytes`` or more than ``max_total_bytes`` in all.
    """
    total = 0
    while True:
        line = stream.readline(max_line_bytes + 2)
        if not line:
            return
        total += len(line)
        if total > max_total_bytes:
            raise RootDirContentError(f"{what} is larger than the {max_total_bytes} bytes alfish reads from it (it "
                                      "was not written by alfish); move it aside")
        body = line.rstrip(b"\r\n")
        if len(body) > max_line_bytes:
            raise RootDirContentError(f"{what} has a line longer than the {max_line_bytes} bytes alfish reads (it "
                                      "was not written by alfish); move it aside")
        yield body
