"""MLflow as a tracker (``Trainer.trackers = ['mlflow']``; ``pip install 'alfish[mlflow]'``, the MLflow client).

Every scalar is a metric at TensorBoard's step (MLflow keeps each metric's steps as given, in any order). The
operative gin config becomes the run's parameters (``Name.param`` -> its value as text) and the artifact
``config/operative.gin``; the run record's files are artifacts under ``run_record/<start time>/`` and its git facts
tags (``alfish.git_commit``, ``alfish.git_branch``, ``alfish.git_dirty``, and MLflow's own
``mlflow.source.git.commit``); an evaluation video is an artifact under ``videos/``.

A resumed training run continues the MLflow run (it is set RUNNING again). MLflow never changes a parameter once
logged: a resume logs only the parameters the run does not have yet (``config/operative.gin`` is replaced by the
config of the latest start). The client (``MlflowClient``, not the fluent API) names the run in every call, so no
global "active run" is touched. mlflow is imported when the tracker starts.
"""
from __future__ import annotations

import os
import re
import time
from typing import Any, Mapping, Optional

from alfish.rundir.trackers.base import RunRecordInfo, Tracker
from alfish.rundir.trackers.settings import MlflowSettings
from alfish.rundir.trackers.start_info import record_files

# MLflow's limits (its validation of each request): a key's length and characters, a parameter value's length, and
# how many metrics / parameters one log_batch request may hold.
_MAX_KEY = 250
_MAX_PARAM_VALUE = 6000
_KEY = re.compile(r"[\w\-. /:]+")
_METRICS_PER_BATCH = 1000
_PARAMS_PER_BATCH = 100


class MlflowTracker(Tracker):
    """An MLflow run of the training run in ``root_dir`` (module docstring)."""

    name = "mlflow"

    def __init__(self, settings: MlflowSettings, root_dir: str) -> None:
        self.settings, self.root_dir = settings, root_dir
        self.client: Any = None
        self.run_id: Optional[str] = None

    def start(self, run_id: Optional[str]) -> str:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.settings.tracking_uri)
        if run_id is not None:
            self.client.get_run(run_id)  # (raises when the tracking store does not have it)
            self.client.update_run(run_id, status="RUNNING")
        else:
            experiment = self.client.get_experiment_by_name(self.settings.experiment_name)
            experiment_id = (experiment.experiment_id if experiment is not None
                             else self.client.create_experiment(self.settings.experiment_name))
            name = self.settings.run_name or os.path.basename(os.path.abspath(self.root_dir))
            run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
        self.run_id = run_id
        return run_id

    def log_config(self, text: str, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        have = self.client.get_run(self.run_id).data.params
        new = [Param(key, _param_text(value)) for key, value in params.items()
               if key not in have and len(key) <= _MAX_KEY and _KEY.fullmatch(key)]
        for start in range(0, len(new), _PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=new[start:start + _PARAMS_PER_BATCH])
        self.client.log_text(self.run_id, text, "config/operative.gin")

    def log_run_record(self, record: RunRecordInfo) -> None:
        for key, value in record.tags.items():
            self.client.set_tag(self.run_id, f"alfish.{key}", value)
        if "git_commit" in record.tags:
            self.client.set_tag(self.run_id, "mlflow.source.git.commit", record.tags["git_commit"])
        for name in record_files(self.root_dir, record.folder):
            folder = os.path.join("run_record", record.folder.name, os.path.dirname(name))
            self.client.log_artifact(self.run_id, str(record.folder / name), folder.rstrip("/"))

    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(tag, float(value), now, int(step)) for tag, value in scalars.items()]
        for start in range(0, len(metrics), _METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + _METRICS_PER_BATCH])

    def log_video(self, path: str, step: int) -> None:
        self.client.log_artifact(self.run_id, path, "videos")

    def close(self) -> None:
        client, run_id, self.run_id = self.client, self.run_id, None
        if client is not None and run_id is not None:
            client.set_terminated(run_id, "FINISHED")


def _param_text(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= _MAX_PARAM_VALUE else text[:_MAX_PARAM_VALUE - 3] + "..."
