"""Evaluation videos for the experiment trackers (``Trainer.trackers`` with ``Trainer.eval_video_interval``): the
callback after ``EvalVideoCallback`` hands the video just written to the trackers (W&B: ``eval/video`` in the run's
media at the evaluated iteration; MLflow: an artifact under ``videos/``)."""
from __future__ import annotations

import os

from alfish.evaluate.eval_video import EvalVideo
from alfish.rundir.safe_paths import kind_in_root
from alfish.rundir.trackers import Trackers
from alfish.trainer.callbacks import Evaluation, RunningTrainer, TrainerCallback


class TrackedEvalVideos(TrainerCallback):
    """After each recorded evaluation: when ``video`` recorded this one (its every ``interval``-th), give the file
    ``videos/eval-<iteration>.<format>`` to ``trackers`` at the evaluated iteration."""

    def __init__(self, video: EvalVideo, trackers: Trackers) -> None:
        self.video, self.trackers = video, trackers

    def after_evaluation(self, trainer: RunningTrainer, evaluation: Evaluation) -> None:
        if self.video.count % self.video.interval:  # (EvalVideo counts the evaluations it was given)
            return
        path = os.path.join(self.video.directory, f"eval-{evaluation.iteration}.{self.video.video_format}")
        if kind_in_root(self.video.root_dir, path) == "file":
            self.trackers.log_video(path, evaluation.iteration)
