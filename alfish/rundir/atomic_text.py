"""Files a run replaces whole (the config record, the profiler's trace and table), written atomically inside the
root_dir: into a new temporary file beside the target, fsynced, then renamed over it, so a reader never sees a
partial file.

Everything goes through ``alfish.rundir.safe_paths`` (DESIGN.md §3.13): the folders on the way are made without
crossing a link, the temporary file is created new (``x``), and a target that exists as anything but a regular file
(a symlink, a FIFO, a folder) is refused rather than replaced; a hard-linked target is replaced by the rename, its
other names keep their content.
"""
from __future__ import annotations

import contextlib
import os
import secrets

from alfish.rundir.safe_paths import (
    make_dirs_in_root,
    open_in_root,
    remove_tree_in_root,
    rename_in_root,
    require_kind_in_root,
)

__all__ = ["write_bytes_atomic", "write_text_atomic"]


def write_bytes_atomic(root_dir: str, path: str, data: bytes) -> str:
    """Write ``data`` to ``path`` (absolute, or relative to ``root_dir``) inside ``root_dir`` atomically; returns
    ``path`` made absolute.

    Raises:
        UnsafePathError: a link on the way, or ``path`` exists and is not a regular file (one line).
        OSError: the disk refused (the temporary file is removed).
    """
    target = os.path.join(os.path.abspath(root_dir), path)
    make_dirs_in_root(root_dir, os.path.dirname(target))  # (the root_dir too, when missing)
    require_kind_in_root(root_dir, target, "file")
    tmp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.{secrets.token_hex(4)}.tmp")
    try:
        with open_in_root(root_dir, tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        rename_in_root(root_dir, tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            remove_tree_in_root(root_dir, tmp)
        raise
    return target


def write_text_atomic(root_dir: str, path: str, text: str) -> str:
    """``write_bytes_atomic`` of ``text`` as UTF-8."""
    return write_bytes_atomic(root_dir, path, text.encode("utf-8"))
