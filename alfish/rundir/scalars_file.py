"""``ROOT_DIR/scalars.csv``: every scalar summary as a CSV row, for readers without TensorBoard.

Format: a header ``step,tag,value,wall_time`` (written when the file is new or empty), then one row per scalar:
the step it was written with, its TensorBoard tag (quoted only if it holds a comma or a quote), its value as
``repr(float)`` (round-trips exactly) and ``wall_time`` in seconds since the epoch with three decimals (as
TensorBoard's events). A resumed run appends to the same file. Writes the disk refuses become one
``DiskWriteError`` line naming the file; so does a file alfish refuses to open (a symlink, FIFO or hard link: it is
opened through ``alfish.rundir.safe_paths``).
"""
from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator, Optional

from alfish.rundir.disk import DiskWriteError, write_failure
from alfish.rundir.safe_paths import open_in_root

__all__ = ["HEADER", "ScalarsFile"]

HEADER = "step,tag,value,wall_time\n"
_WHAT = "the scalars CSV"  # how write_failure names the file


class ScalarsFile:
    """An open scalars CSV at ``path`` (created, with its header, when missing or empty; appended to otherwise).

    ``root_dir``: the results directory ``path`` lies in, as the user typed it (no link below it is followed);
    None: the directory of ``path``.
    """

    def __init__(self, path: str, root_dir: Optional[str] = None) -> None:
        self.path = path
        self._file = None
        with self._disk_errors():
            root = root_dir if root_dir is not None else os.path.dirname(os.path.abspath(path))
            self._file = open_in_root(root, os.path.abspath(path), "a", newline="")
            if os.fstat(self._file.fileno()).st_size == 0:
                self._file.write(HEADER)

    @contextlib.contextmanager
    def _disk_errors(self) -> Iterator[None]:
        try:
            yield
        except OSError as e:
            raise DiskWriteError(write_failure(_WHAT, self.path, e)) from e

    def write_row(self, step: int, tag: str, value: float, wall_time: Optional[float] = None) -> None:
        """Append the row of scalar ``tag`` = ``value`` at ``step`` (``wall_time``: seconds since the epoch; now if
        None)."""
        # (a tag is a TensorBoard name: letters, digits, '/', '_', '.', '-'; quoted anyway in case a user's has a comma)
        quoted = f'"{tag}"' if "," in tag or '"' in tag else tag
        stamp = time.time() if wall_time is None else wall_time
        with self._disk_errors():
            self._file.write(f"{step},{quoted},{value!r},{stamp:.3f}\n")

    def flush(self) -> None:
        """Hand the buffered rows to the operating system; DiskWriteError if it refuses them."""
        with self._disk_errors():
            self._file.flush()

    def close(self) -> None:
        """Close the file, never raising (it runs on the way out of a run, also after a disk error)."""
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
