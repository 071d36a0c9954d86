"""A private ``XDG_RUNTIME_DIR`` for rendering envs, so SDL does not print its own error line.

Gymnasium's classic-control and Box2D envs render with pygame, whose SDL prints ``error: XDG_RUNTIME_DIR is invalid
or not set in the environment.`` to stderr when that variable is missing (containers, ssh sessions, CI). The
rendering works anyway, but the line reads as alfish's own error in the middle of ``play``'s output. Before an env
with a render mode is made, ``ensure_runtime_dir`` points the variable at a folder only this user can use:
``$TMPDIR/alfish-runtime-<uid>`` (created with mode 0700; a folder of that name that another user owns or others can
read is not used: a fresh private one is made instead). A valid variable is left as it is.
"""
from __future__ import annotations

import os
import stat
import tempfile

VARIABLE = "XDG_RUNTIME_DIR"


def _is_private_dir(path: str) -> bool:
    """Whether ``path`` is a real folder owned by this user that nobody else can read, write or enter."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def ensure_runtime_dir() -> str:
    """Make ``XDG_RUNTIME_DIR`` name an existing folder (a private one of ours when it named none); returns it."""
    current = os.environ.get(VARIABLE)
    if current and os.path.isdir(current):
        return current
    path = os.path.join(tempfile.gettempdir(), f"alfish-runtime-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        path = ""
    if not path or not _is_private_dir(path):  # (someone else's, a symlink, or not creatable: a fresh one)
        path = tempfile.mkdtemp(prefix="alfish-runtime-")
    os.environ[VARIABLE] = path
    return path
