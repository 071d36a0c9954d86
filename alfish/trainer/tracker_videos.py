"""Evaluation videos for the experiment trackers (``Trainer.trackers`` with ``Trainer.eval_video_interval``): the
callback after ``EvalVideoCallback`` hands the video just written to the trackers (W&B: ``eval/video`` in the run's
media at the evaluated iteration; MLflow: an artifact under ``videos/``)."""
from __future__ import annotations

from typing import Optional

from alfish.evaluate.eval_video import EvalVideo
from alfish.rundir.safe_paths import kind_in_root
from alfish.rundir.trackers import Trackers
from alfish.trainer.callbacks import Evaluation, RunningTrainer, TrainerCallback


class TrackedEvalVideos(TrainerCallback):
    """After each recorded evaluation: when ``video`` has just written this evaluation's video
    (``EvalVideo.last_written``), give the file to ``trackers`` at the evaluated iteration."""

    def __init__(self, video: EvalVideo, trackers: Trackers) -> None:
        self.video, self.trackers = video, trackers
        self._given: Optional[tuple[int, str]] = None

    def after_evaluation(self, trainer: RunningTrainer, evaluation: Evaluation) -> None:
        written = self.video.last_written
        if written is None or written == self._given or written[0] != evaluation.iteration:
            return
        self._given = written
        if kind_in_root(self.video.root_dir, written[1]) == "file":
            self.trackers.log_video(written[1], evaluation.iteration)
