"""What an in-process ``train``/``play`` leaves behind, undone: the log handlers it added to the root logger (its
``log.txt`` handler would keep the file open) and the gin config it parsed."""
import contextlib
import logging
from typing import Iterator

import gin


@contextlib.contextmanager
def logging_and_gin_restored() -> Iterator[None]:
    """Inside: commands may add root-logger handlers and parse confs; on exit their handlers are closed and removed,
    the root level is restored and gin's config cleared."""
    root_logger = logging.getLogger()
    handlers, level = list(root_logger.handlers), root_logger.level
    try:
        yield
    finally:
        for handler in root_logger.handlers[:]:
            if handler not in handlers:
                root_logger.removeHandler(handler)
                handler.close()
        root_logger.setLevel(level)
        gin.clear_config()
