"""Helpers for the integration tests: run a Trainer in this process from gin text, read what it wrote."""
from __future__ import annotations

import json
import os
import pathlib
from typing import Sequence

import gin

from alfish.config import TrainerConfig, load_conf

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFS = REPO / "confs"


def run_trainer(conf_file: str | os.PathLike, root_dir: str | os.PathLike, params: Sequence[str] = ()) -> int:
    """``python -m alfish.bin.train`` minus the process: load the conf (+ bindings), build the Trainer, run it."""
    from alfish.trainer.trainer import Trainer

    load_conf(str(conf_file), list(params))
    try:
        config = TrainerConfig(root_dir=str(root_dir))
        return Trainer(config).run()
    finally:
        gin.clear_config()


def run_trainer_from_text(tmp_path: pathlib.Path, conf_text: str, params: Sequence[str] = (),
                          name: str = "run") -> pathlib.Path:
    conf = tmp_path / f"{name}.gin"
    conf.write_text(conf_text)
    root = tmp_path / name
    assert run_trainer(conf, root, params) == 0
    return root


def eval_log(root_dir: str | os.PathLike) -> list[dict]:
    with open(os.path.join(root_dir, "eval_log.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def tb_scalars(root_dir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in ``root_dir/tb``'s event files: tag -> [(step, value), ...]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(root_dir, "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
