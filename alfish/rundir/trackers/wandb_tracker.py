"""Weights & Biases as a tracker (``Trainer.trackers = ['wandb']``; ``pip install 'alfish[wandb]'``).

Every scalar goes into the run's history with TensorBoard's step as the custom x-axis ``step`` (``define_metric``):
TensorBoard writes some tags against env steps (``*_vs_env_steps/...``) between those against iterations, which W&B's
own monotonic step would drop, and a resumed run repeats the steps after its checkpoint. The operative gin config is
the run's config (``{'Name.param': value}``) and the file ``config/operative.gin``; the run record's files go under
``run_record/<start time>/`` and its git tags into the config's ``run_record`` entry; an evaluation video is logged
as ``eval/video`` at its iteration. A resumed training run continues the W&B run (``id=..., resume='allow'``; in
offline mode each start writes its own folder with the same run id, which ``wandb sync`` joins).

wandb is imported when the tracker starts (a second): a run without it does not pay for it.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Mapping, Optional

from alfish.rundir.safe_paths import make_dirs_in_root, read_bytes_in_root
from alfish.rundir.trackers.base import RunRecordInfo, Tracker
from alfish.rundir.trackers.settings import WandbSettings
from alfish.rundir.trackers.start_info import record_files

#: The history key that holds TensorBoard's step (every other key is plotted against it).
STEP = "step"
_MAX_RECORD_FILE_BYTES = 64 << 20


class WandbTracker(Tracker):
    """A W&B run of the training run in ``root_dir`` (module docstring)."""

    name = "wandb"

    def __init__(self, settings: WandbSettings, root_dir: str) -> None:
        self.settings, self.root_dir = settings, root_dir
        self.run: Any = None

    def start(self, run_id: Optional[str]) -> str:
        import wandb

        # W&B logs (its debug lines, a failed init's traceback) to its own files in the run folder; propagated, they
        # would also reach alfish's log.txt and stderr, where a failure is the tracker set's one warning (wandb 0.31
        # does this itself; kept for older releases)
        logging.getLogger("wandb").propagate = False
        directory = os.environ.get("WANDB_DIR")
        if not directory:
            make_dirs_in_root(self.root_dir, "wandb")  # W&B writes ROOT_DIR/wandb/ by name: a symlink is refused
            directory = self.root_dir
        s = self.settings
        self.run = wandb.init(project=s.project, entity=s.entity, mode=s.mode, dir=directory,
                              name=s.run_name or os.path.basename(os.path.abspath(self.root_dir)),
                              id=run_id, resume="allow" if run_id else None,
                              reinit="create_new",  # never finish (or log into) a W&B run the user's code holds
                              settings=wandb.Settings(console="off"))  # alfish's own log.txt keeps the output
        self.run.define_metric(STEP)
        self.run.define_metric("*", step_metric=STEP)
        return self.run.id

    def log_config(self, text: str, params: Mapping[str, Any]) -> None:
        self.run.config.update(dict(params), allow_val_change=True)  # (a resume may change a value)
        self._write_file(Path("config", "operative.gin"), text.encode("utf-8"))

    def log_run_record(self, record: RunRecordInfo) -> None:
        self.run.config.update({"run_record": dict(record.tags)}, allow_val_change=True)
        for name in record_files(self.root_dir, record.folder):
            data = read_bytes_in_root(self.root_dir, str(record.folder / name), _MAX_RECORD_FILE_BYTES)
            self._write_file(Path("run_record", record.folder.name, name), data[:_MAX_RECORD_FILE_BYTES])

    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        self.run.log({**scalars, STEP: step})

    def log_video(self, path: str, step: int) -> None:
        import wandb

        self.run.log({"eval/video": wandb.Video(path, format=os.path.splitext(path)[1][1:]), STEP: step})

    def close(self) -> None:
        run, self.run = self.run, None
        if run is not None:
            run.finish()

    def _write_file(self, name: Path, data: bytes) -> None:
        """``data`` as the run's file ``name`` (in the run's folder, which W&B uploads)."""
        path = Path(self.run.dir, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        self.run.save(str(path), base_path=self.run.dir, policy="now")
