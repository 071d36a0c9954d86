"""Experiment trackers as optional sinks beside TensorBoard: Weights & Biases and MLflow.

    Trainer.trackers = ['wandb', 'mlflow']      # default []: TensorBoard (and Trainer.scalars_csv) only

Rank 0 gives each tracker every scalar TensorBoard gets, at the same steps (``alfish.trainer.summary.Summaries``
tees them), the operative gin config, the run record (git commit, diff, installed packages: ``run_record.py``) and
the evaluation videos (``Trainer.eval_video_interval``). A resumed run continues the same tracker runs (their ids are
kept in ``ROOT_DIR/trackers.json``: ``run_ids.py``). A tracker that fails costs one warning and is disabled; training
goes on (``tracker_set.py``). Each tracker's settings are its own gin configurable (``settings.py``); its package is an
extra (``pip install 'alfish[wandb]'``, ``'alfish[mlflow]'``), checked when the run is built.
"""
from __future__ import annotations

from typing import Sequence

from alfish.rundir.trackers.base import RunRecordInfo, Tracker
from alfish.rundir.trackers.names import TRACKERS, check_tracker_names, check_tracker_packages
from alfish.rundir.trackers.settings import MlflowSettings, WandbSettings
from alfish.rundir.trackers.tracker_set import Trackers

__all__ = ["TRACKERS", "RunRecordInfo", "Tracker", "Trackers", "build_trackers", "check_tracker_names",
           "check_tracker_packages"]


def build_trackers(names: Sequence[str], root_dir: str, resume: bool) -> Trackers:
    """The trackers ``names`` (``Trainer.trackers``) of the run in ``root_dir``, not started yet (``Trackers.start``
    does: after the run record is written). Their gin settings are read here, so a bad one fails while building."""
    from alfish.rundir.trackers.mlflow_tracker import MlflowTracker
    from alfish.rundir.trackers.wandb_tracker import WandbTracker

    check_tracker_names(names)
    check_tracker_packages(names)
    made = {"wandb": lambda: WandbTracker(WandbSettings(), root_dir),
            "mlflow": lambda: MlflowTracker(MlflowSettings(), root_dir)}
    return Trackers([made[name]() for name in names], root_dir, resume)
