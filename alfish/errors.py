"""Error types shared across alfish."""
from __future__ import annotations

from typing import Any


class OneLineValueError(ValueError):
    """A ValueError whose str() is always its one-line message.

    gin re-raises an exception escaping a configurable as a dynamically made subclass of its type whose str() appends
    "In call to configurable ..."; ``__init_subclass__`` restores the one-line str() on such subclasses, so a bad value
    in a conf is reported as one line.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__str__ = OneLineValueError.__str__

    def __str__(self) -> str:
        return self.message


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; raised before the update, so the parameters stay as they were.

    The message names the non-finite loss terms (see ``alfish.learn.learner.Learner``); a checkpoint is not worth
    writing after it.
    """
