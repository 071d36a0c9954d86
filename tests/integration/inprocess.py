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

# The trainer settings every off-policy learning test on alfish/PointGoal-v0 shares (1 env, one step and one update
# per iteration, 1500 env steps, an evaluation every 100 iterations); each test adds its algorithm's bindings.
OFF_POLICY_POINT_GOAL = """
create_environment.env_name = 'alfish/PointGoal-v0'
create_environment.num_parallel_environments = 1
TrainerConfig.random_seed = 1
TrainerConfig.num_iterations = 0
TrainerConfig.num_env_steps = 1500
TrainerConfig.unroll_length = 1
TrainerConfig.initial_collect_steps = 100
TrainerConfig.whole_replay_buffer_training = False
TrainerConfig.replay_buffer_length = 10000
TrainerConfig.mini_batch_size = 128
TrainerConfig.mini_batch_length = 2
TrainerConfig.num_updates_per_train_iter = 1
TrainerConfig.summary_interval = 100
TrainerConfig.evaluate = True
TrainerConfig.eval_interval = 100
TrainerConfig.num_eval_episodes = 1
TrainerConfig.num_eval_environments = 1
TrainerConfig.num_checkpoints = 0
"""


def run_trainer(conf_file: str | os.PathLike, root_dir: str | os.PathLike, params: Sequence[str] = ()) -> int:
    """``python -m alfish.bin.train`` minus the process: load the conf (+ bindings), build the Trainer, run it.

    Evaluation runs in this process (``TrainerConfig.async_eval = False``) unless the conf or ``params`` say
    otherwise: a learning test reads the same returns either way (tests/evaluate/test_async_eval.py checks that
    asynchronous and synchronous evaluations of the same parameters and seed are identical, and tests the child
    itself), and the child's start (a fresh interpreter importing torch, 2-4 s of CPU) is most of a short test's cost.
    """
    from alfish.trainer.build import build_trainer

    chosen = "async_eval" in pathlib.Path(conf_file).read_text() or any("async_eval" in p for p in params)
    load_conf(str(conf_file), ([] if chosen else ["TrainerConfig.async_eval = False"]) + list(params))
    try:
        config = TrainerConfig(root_dir=str(root_dir))
        return build_trainer(config).run()
    finally:
        gin.clear_config()


def run_trainer_from_text(tmp_path: pathlib.Path, conf_text: str, params: Sequence[str] = (),
                          name: str = "run", expect: int = 0) -> pathlib.Path:
    """Train ``conf_text`` (+ ``params``) into ``tmp_path/name``; asserts the run's exit code is ``expect``."""
    conf = tmp_path / f"{name}.gin"
    conf.write_text(conf_text)
    root = tmp_path / name
    assert run_trainer(conf, root, params) == expect
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
