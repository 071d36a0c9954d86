"""`ScheduleError` and the number checks shared by the progress record and the schedules."""
from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

from alfish.errors import OneLineValueError

Number = int | float


class ScheduleError(OneLineValueError):
    """A bad schedule or progress argument; its str() is always the one-line message (through gin too)."""


def is_number(value: Any) -> bool:
    """A real number that is not a bool and not NaN."""
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and not (isinstance(value, float) and math.isnan(value)))


def quoted(names: Sequence[str]) -> str:
    """``'a', 'b', 'c'``: names for a message."""
    return ', '.join(repr(n) for n in names)
