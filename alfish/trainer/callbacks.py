"""Trainer callbacks: what happens around the run (stop at a value, keep the best policy, timed checkpoints, warm
start, evaluation videos) arrives as a callback, not as a branch in the training loop (DESIGN.md §3.11).

    Trainer.callbacks = [@MyCallback()]      # a user's own, next to the built-in ones the Trainer.* options make

The hooks, in the order a run calls them (each a no-op unless overridden; all run in the training thread):

* ``before_run(trainer)``: the parts are built and restored from the resume point (``trainer.resumed`` says whether
  there was one); no env has acted yet, so parameters loaded here are the ones the first actions use.
* ``after_iteration(trainer)``: after each iteration's summaries, evaluation and checkpoint.
* ``after_evaluation(trainer, evaluation)``: once per recorded evaluation, on the rank that evaluates (rank 0). With
  ``async_eval`` a result arrives iterations after the parameters it scored were sent: ``evaluation.iteration`` is the
  evaluated iteration, ``evaluation.snapshot`` those parameters (``None`` when they are the current ones).
* ``after_checkpoint(trainer, path)``: after each checkpoint of the run (not the best one) is written.
* ``after_run(trainer)``: the run reached its end (not after a crash or a stop signal).
* ``close()``: at the end of every run, also after a crash: release what the callback holds.

Requests: ``wants_stop()`` and ``wants_checkpoint()`` are read once per iteration and go through the same agreement
between ranks as a stop signal (``any_rank``): a decision taken on rank 0 (stop at ``stop_value``, a timed checkpoint)
is taken by every rank at the same iteration, so no rank waits in a collective for one that left.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

from alfish.evaluate.evaluator import Evaluation

#: The ``alfish.trainer.trainer.Trainer`` a hook is given (not imported: the Trainer imports this module, and a part
#: it holds must not import it back).
RunningTrainer = Any

__all__ = ["CallbackList", "Evaluation", "TrainerCallback"]


class TrainerCallback:
    """Base class of a callback: every hook does nothing, no request is made (module docstring)."""

    #: True when the callback needs ``Evaluation.snapshot`` (the async evaluator then keeps a copy per evaluation).
    needs_snapshots: bool = False

    def before_run(self, trainer: RunningTrainer) -> None:
        pass

    def after_iteration(self, trainer: RunningTrainer) -> None:
        pass

    def after_evaluation(self, trainer: RunningTrainer, evaluation: Evaluation) -> None:
        pass

    def after_checkpoint(self, trainer: RunningTrainer, path: str) -> None:
        pass

    def after_run(self, trainer: RunningTrainer) -> None:
        pass

    def wants_stop(self) -> bool:
        return False

    def wants_checkpoint(self) -> bool:
        return False

    def close(self) -> None:
        """Release what the callback holds (an env, a file); called at the end of every run, also after a crash."""


class CallbackList(TrainerCallback):
    """Several callbacks as one, called in order; a request of any is the list's."""

    def __init__(self, callbacks: Sequence[TrainerCallback] = ()):
        for callback in callbacks:
            if not isinstance(callback, TrainerCallback):
                raise TypeError(f"Trainer.callbacks: {callback!r} is not a TrainerCallback; subclass "
                                "alfish.trainer.callbacks.TrainerCallback and bind an instance (`@MyCallback()`)")
        self.callbacks = list(callbacks)
        self.needs_snapshots = any(c.needs_snapshots for c in self.callbacks)

    def before_run(self, trainer: RunningTrainer) -> None:
        for callback in self.callbacks:
            callback.before_run(trainer)

    def after_iteration(self, trainer: RunningTrainer) -> None:
        for callback in self.callbacks:
            callback.after_iteration(trainer)

    def after_evaluation(self, trainer: RunningTrainer, evaluation: Evaluation) -> None:
        for callback in self.callbacks:
            callback.after_evaluation(trainer, evaluation)

    def after_checkpoint(self, trainer: RunningTrainer, path: str) -> None:
        for callback in self.callbacks:
            callback.after_checkpoint(trainer, path)

    def after_run(self, trainer: RunningTrainer) -> None:
        for callback in self.callbacks:
            callback.after_run(trainer)

    def wants_stop(self) -> bool:
        return any(c.wants_stop() for c in self.callbacks)

    def wants_checkpoint(self) -> bool:
        return any(c.wants_checkpoint() for c in self.callbacks)

    def close(self) -> None:
        """Close every callback; never raises (it runs on the way out of a run, also after an error)."""
        for callback in self.callbacks:
            try:
                callback.close()
            except Exception as err:  # noqa: BLE001  (the run's own outcome matters more)
                logging.warning("closing the callback %s failed: %s", type(callback).__name__, err)
