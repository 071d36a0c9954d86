"""The trackers' own settings, each a small gin configurable read only when its tracker is on (a binding of a tracker
that is off is reported as set but never used, as any other).

    Trainer.trackers = ['wandb', 'mlflow']
    wandb_tracker.project = 'my-project'
    wandb_tracker.mode = 'offline'          # runs `wandb sync` uploads later
    mlflow_tracker.tracking_uri = 'http://mlflow.example:5000'
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import gin

WANDB_MODES = ("online", "offline")


@gin.configurable("wandb_tracker")
@dataclasses.dataclass(frozen=True)
class WandbSettings:
    """Weights & Biases (``wandb.init``'s arguments of the same meaning).

    project, entity: where the run goes (``entity``: your default team when None). run_name: the run's display name
    (None: the root_dir's folder name). mode: ``'online'`` or ``'offline'`` (None: W&B's own choice, ``WANDB_MODE``,
    else online). W&B's files go to ``ROOT_DIR/wandb/`` (``$WANDB_DIR/wandb/`` when ``WANDB_DIR`` is set).
    """

    project: str = "alfish"
    entity: Optional[str] = None
    run_name: Optional[str] = None
    mode: Optional[str] = None

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in WANDB_MODES:
            raise ValueError(f"wandb_tracker.mode={self.mode!r} is not one of {WANDB_MODES} (or None: W&B's default)")


@gin.configurable("mlflow_tracker")
@dataclasses.dataclass(frozen=True)
class MlflowSettings:
    """MLflow.

    tracking_uri: the tracking server or store (``'http://host:5000'``, ``'sqlite:///mlflow.db'``, ...; None: MLflow's
    own choice, ``MLFLOW_TRACKING_URI``). experiment_name: the experiment the run goes in (made when missing).
    run_name: the run's name (None: the root_dir's folder name).
    """

    tracking_uri: Optional[str] = None
    experiment_name: str = "alfish"
    run_name: Optional[str] = None
