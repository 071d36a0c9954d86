"""The one interface every experiment tracker implements (``wandb_tracker.py``, ``mlflow_tracker.py``).

A tracker is called in this order: ``start`` once, then ``log_config`` and ``log_run_record`` once each, then
``log_scalars`` and ``log_video`` as the run writes them, then ``close``. Any method may raise anything: the
``Trackers`` that calls them (``tracker_set.py``) turns a failure into one warning and stops calling that tracker.
"""
from __future__ import annotations

import abc
import dataclasses
from pathlib import Path
from typing import Any, Mapping, Optional


@dataclasses.dataclass(frozen=True)
class RunRecordInfo:
    """What a tracker gets of the run record of this start (``alfish/rundir/run_record.py``): ``folder``
    (``ROOT_DIR/run_record/<start time>/``; its files become the tracker's artifacts under ``run_record/<start
    time>/``) and ``tags`` (``git_commit``, ``git_branch``, ``git_dirty``: short strings read from its ``git.txt``)."""

    folder: Path
    tags: Mapping[str, str]


class Tracker(abc.ABC):
    """One experiment tracker's run."""

    #: The name ``Trainer.trackers`` uses (``'wandb'``, ``'mlflow'``).
    name: str = ""

    @abc.abstractmethod
    def start(self, run_id: Optional[str]) -> str:
        """Begin a new tracker run (``run_id`` None) or continue the run ``run_id`` (a resumed training run);
        returns the run's id (stored in ``ROOT_DIR/trackers.json``)."""

    @abc.abstractmethod
    def log_config(self, text: str, params: Mapping[str, Any]) -> None:
        """The operative gin config: ``text`` as a file, ``params`` (``{'Name.param': value}``, values JSON-like or
        their gin text) as the run's config / parameters."""

    @abc.abstractmethod
    def log_run_record(self, record: RunRecordInfo) -> None:
        """The run record of this start: its files as artifacts, its git tags as tags."""

    @abc.abstractmethod
    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        """Scalars by their TensorBoard tag (``loss/total``, ...) at TensorBoard's ``step``."""

    @abc.abstractmethod
    def log_video(self, path: str, step: int) -> None:
        """An evaluation video file (``ROOT_DIR/videos/eval-<iteration>.mp4|gif``) of the evaluation at ``step``."""

    @abc.abstractmethod
    def close(self) -> None:
        """End the tracker run (it may be continued later by ``start(run_id)``)."""
