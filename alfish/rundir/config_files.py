"""``ROOT_DIR/config/``: the record of the config a run used (``operative.gin``, ``full.gin``; what they hold is
``alfish.config.config_record``'s), written atomically through the results directory's safe paths."""
from __future__ import annotations

import os

from alfish.config.config_record import config_record
from alfish.rundir.atomic_text import write_text_atomic

#: The folder of a results directory that holds the config record.
CONFIG_DIR = "config"


def write_config_record(root_dir: str) -> list[str]:
    """Write ``root_dir/config/operative.gin`` and ``full.gin`` (each atomically; never through a link inside
    ``root_dir``); returns the bindings that were set but never used (each also logged as a warning). Call it after
    the training objects have been built (see ``alfish.config.config_record.config_record``).

    Raises:
        UnsafePathError: ``config/`` or one of its files is a symlink, FIFO, ... (one line); OSError: the disk.
    """
    record = config_record()
    for name, text in record.files.items():
        write_text_atomic(root_dir, os.path.join(CONFIG_DIR, name), text)
    return record.unused
