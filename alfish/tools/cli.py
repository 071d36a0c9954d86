"""What every analysis tool's ``main`` shares: its one-line error and the exit status that goes with it."""
from __future__ import annotations

import sys

from alfish.console.printable import printable
from alfish.errors import OneLineValueError

#: Exit status of a tool for a problem with its arguments or with what they name (argparse uses 2 too).
BAD_INPUT = 2


class ToolError(OneLineValueError):
    """A problem with a tool's arguments or the results directories they name; the message is one line saying what
    is wrong and what to change."""


def report(err: BaseException) -> int:
    """Print ``err`` as one ``error: ...`` line on stderr (what is not printable escaped: messages quote names and
    content of results directories) and return ``BAD_INPUT``."""
    print(f"error: {printable(' '.join(str(err).split())) or type(err).__name__}", file=sys.stderr)
    return BAD_INPUT
