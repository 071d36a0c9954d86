"""Whether a command's output path can be written, checked before any work is done (collect, export)."""
from __future__ import annotations

import os
from typing import Optional


def why_unwritable(path: str) -> Optional[str]:
    """Why ``path`` could not be created, as the end of a one-line error (None when it can be): the nearest existing
    ancestor (the missing part is created later) must be a writable directory."""
    existing = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{existing} is a file, not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable; choose another directory"
    return None
