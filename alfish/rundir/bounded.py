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


_CHUNK = 1 << 20  # bytes scanned at a time: the scan's arrays stay ~40 MB whatever the size of the document


class _Scan:
    """The structure of a JSON document scanned chunk by chunk: the nesting depth (deepest so far) and the number of
    values (containers opened plus commas, plus one), counting only bytes outside strings (strings may hold brackets
    and commas that are not structure). Carries between chunks whether a string is open and whether the chunk ended
    in an odd run of backslashes (which escapes a quote at the start of the next)."""

    def __init__(self) -> None:
        self.depth = self.deepest = self.values = 0
        self.in_string = self.odd_backslashes = False

    def add(self, chunk: memoryview) -> None:
        """Scan the next ``chunk`` (not empty) of the document."""
        data = np.frombuffer(chunk, dtype=np.uint8)
        quote = data == ord('"')
        backslash = data == ord("\\")
        if quote.any() or backslash.any() or self.in_string or self.odd_backslashes:
            # a quote preceded by an odd run of backslashes is escaped: find the runs with a cumulative count
            count = np.cumsum(backslash, dtype=np.int32) + np.int32(self.odd_backslashes)
            run = count - np.maximum.accumulate(np.where(backslash, 0, count))  # backslashes ending at each byte
            odd_before = np.empty_like(quote)
            odd_before[0], odd_before[1:] = self.odd_backslashes, (run[:-1] % 2) == 1
            quote &= ~odd_before
            opened = (np.cumsum(quote, dtype=np.int32) + np.int32(self.in_string)) % 2 == 1
            data = data[~(opened | quote)]
            self.in_string, self.odd_backslashes = bool(opened[-1]), bool(run[-1] % 2)
        step = _NESTING[data]
        if step.size:
            self.deepest = max(self.deepest, self.depth + int(np.cumsum(step, dtype=np.int32).max()))
            self.depth += int(step.sum(dtype=np.int64))
        self.values += int((step == 1).sum()) + int((data == ord(",")).sum())


def loads_bounded(raw: bytes, what: str, max_values: int, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(raw)`` once ``raw`` is known to nest at most ``max_depth`` deep and hold at most ``max_values``
    values (containers and their elements), so the objects built are bounded by ``max_values``. The check scans
    ``raw`` a chunk at a time (its memory does not grow with ``raw``) and stops at the first chunk over a bound.

    Raises:
        RootDirContentError: too deep, too many values, not UTF-8 or not JSON (one line naming ``what``).
    """
    scan = _Scan()
    for start in range(0, len(raw), _CHUNK):
        scan.add(memoryview(raw)[start:start + _CHUNK])
        if scan.deepest > max_depth or scan.values + 1 > max_values:
            break
    if scan.deepest > max_depth:
        raise RootDirContentError(f"{what} nests {scan.deepest} levels deep, more than the {max_depth} alfish reads "
                                  "(it was not written by alfish)")
    values = scan.values + 1
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
