"""The evaluation and checkpoint lifecycle, as trainer callbacks (``alfish.trainer.callbacks``), each made by a
``Trainer.*`` option (``alfish/trainer/options.py``; ``build_callbacks`` in ``build.py`` assembles them):

* ``StopAtValue`` (``Trainer.stop_value``, DI-engine's): the run ends once an evaluation's average return reaches the
  value; it ends as a finished run does (a final evaluation and checkpoint).
* ``BestCheckpoint`` (``Trainer.keep_best_checkpoint``): the policy of the best evaluation so far is kept in
  ``ROOT_DIR/checkpoints/best/ckpt-<evaluated iteration>`` (the algorithm and the transformers' statistics: what
  ``play --best``, ``export`` and a warm start need; not resumable). With ``async_eval`` it is the evaluated snapshot,
  not the parameters current when the result arrives. A resumed run continues from the best recorded there.
* ``TimedCheckpoints`` (``Trainer.checkpoint_interval_s``): a checkpoint whenever that many seconds passed since the
  last one (rank 0's clock; the ranks agree on the iteration).
* ``EvaluateAtStart`` (``Trainer.evaluate_at_start``): an evaluation at iteration 0, before any training (a fresh
  run only).
* ``EvalVideoCallback`` (``Trainer.eval_video_interval``): a video of one greedy episode every K evaluations
  (``alfish.evaluate.eval_video.EvalVideo`` records it).
"""
from __future__ import annotations

import logging
import math
import os
import signal
import time
from typing import TYPE_CHECKING, Optional

import gin

from alfish.evaluate.eval_video import EvalVideo
from alfish.evaluate.evaluator import policy_snapshot
from alfish.rundir.checkpoint import Checkpointer, CheckpointError
from alfish.trainer.callbacks import Evaluation, TrainerCallback

if TYPE_CHECKING:
    from alfish.trainer.trainer import Trainer

#: Where the best policy is kept, under the root_dir (a Checkpointer root: ``best/ckpt-<iteration>``).
BEST_DIR = os.path.join("checkpoints", "best")


def best_checkpointer(root_dir: str) -> Checkpointer:
    """The Checkpointer of ``ROOT_DIR/checkpoints/best`` (one checkpoint kept: the best)."""
    return Checkpointer(os.path.join(root_dir, BEST_DIR), max_to_keep=1, root_dir=root_dir)


class StopAtValue(TrainerCallback):
    """Ask to stop once an evaluation's average return is ``>= stop_value``."""

    def __init__(self, stop_value: float):
        self.stop_value = float(stop_value)
        self.reached_at: Optional[Evaluation] = None

    def after_evaluation(self, trainer: "Trainer", evaluation: Evaluation) -> None:
        if self.reached_at is None and evaluation.result.average_return >= self.stop_value:
            self.reached_at = evaluation
            logging.info("Trainer.stop_value=%g reached: evaluation return %.3f at iteration %d (env steps %d)",
                         self.stop_value, evaluation.result.average_return, evaluation.iteration,
                         evaluation.env_steps)

    def wants_stop(self) -> bool:
        return self.reached_at is not None


class BestCheckpoint(TrainerCallback):
    """Keep the policy of the best evaluation so far (module docstring)."""

    needs_snapshots = True

    def __init__(self, root_dir: str):
        self.checkpointer = best_checkpointer(root_dir)
        self.best_return = -math.inf

    def before_run(self, trainer: "Trainer") -> None:
        if not trainer.resumed:
            return  # (a fresh start moved the old checkpoints aside, the best with them)
        try:
            kept = self.checkpointer.load_latest()
        except CheckpointError as err:
            logging.warning("could not read the best checkpoint so far (%s); the next evaluation replaces it", err)
            return
        if kept is not None:
            self.best_return = float(kept.meta.get("best", {}).get("average_return", -math.inf))

    def after_evaluation(self, trainer: "Trainer", evaluation: Evaluation) -> None:
        value = evaluation.result.average_return
        if not value > self.best_return:  # (a NaN return is never the best)
            return
        self.best_return = value
        snapshot = evaluation.snapshot or policy_snapshot(trainer.algorithm, trainer.transformer)
        meta = dict(trainer.checkpoint_meta(), iteration=evaluation.iteration, env_steps=evaluation.env_steps,
                    best=dict(average_return=value, num_episodes=evaluation.result.num_episodes))
        path = self.checkpointer.save(evaluation.iteration, dict(snapshot), meta)
        logging.info("best checkpoint so far (return %.3f): %s", value, path)


class TimedCheckpoints(TrainerCallback):
    """Ask for a checkpoint when ``interval_s`` seconds passed since the last one (or since the start)."""

    def __init__(self, interval_s: float, clock=time.monotonic):
        self.interval_s = float(interval_s)
        self.clock = clock
        self.last = clock()

    def wants_checkpoint(self) -> bool:
        return self.clock() - self.last >= self.interval_s

    def after_checkpoint(self, trainer: "Trainer", path: str) -> None:
        self.last = self.clock()


class EvaluateAtStart(TrainerCallback):
    """Evaluate the untrained (or warm-started) policy at iteration 0 of a fresh run."""

    def before_run(self, trainer: "Trainer") -> None:
        if trainer.counters.iteration == 0:
            trainer.evaluate_now()


@gin.configurable
class SimulatedPreemption(TrainerCallback):
    """Sends this process SIGTERM after iteration ``iteration``, as a cluster's preemption would: the trainer writes
    a checkpoint at that iteration and exits with 128 + 15 (``python -m alfish.tools.check_resume`` uses it through
    ``Trainer.callbacks = [@SimulatedPreemption()]``)."""

    def __init__(self, iteration: int):
        self.iteration = int(iteration)

    def after_iteration(self, trainer: "Trainer") -> None:
        if trainer.counters.iteration == self.iteration:
            os.kill(os.getpid(), signal.SIGTERM)


class EvalVideoCallback(TrainerCallback):
    """Hands each recorded evaluation to an ``EvalVideo``, which records every K-th one."""

    needs_snapshots = True

    def __init__(self, video: EvalVideo):
        self.video = video

    def after_evaluation(self, trainer: "Trainer", evaluation: Evaluation) -> None:
        self.video.after_evaluation(trainer.algorithm, trainer.transformer, evaluation.iteration, evaluation.snapshot)

    def close(self) -> None:
        self.video.close()
