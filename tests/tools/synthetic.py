"""Results directories written by hand for the analysis tools' tests: eval logs with known values, and real short
training runs (SAC on alfish/PointGoal-v0, 2 seeds, 300 env steps, an evaluation every 50 iterations, 2 checkpoints
each, the replay buffer saved)."""
from __future__ import annotations

import json
import pathlib
from typing import Sequence

from tests.integration.inprocess import OFF_POLICY_POINT_GOAL, run_trainer_from_text

# Three seeds evaluated at env steps 0, 1000, ..., 10000: seed i's return is SHAPE[k] + OFFSETS[i] at env steps
# 1000 k, and it runs at RATES[i] env steps per second (elapsed_s = env steps / rate).
ENV_STEPS = [1000 * k for k in range(11)]
SHAPE = [0, 1, 2, 3, 4, 5, 6, 7, 6.5, 6, 5.5]  # rises to 7 at 7000 env steps, then falls
LINEAR = [float(k) for k in range(11)]  # returns = env steps / 1000
OFFSETS = [0.0, 2.0, 4.0]
RATES = [500.0, 1000.0, 2000.0]

SAC = OFF_POLICY_POINT_GOAL + """
SacAlgorithm.hidden_sizes = (16,)
TrainerConfig.algorithm_ctor = @SacAlgorithm
Trainer.num_threads = 1
TrainerConfig.num_env_steps = 300
TrainerConfig.eval_interval = 50
TrainerConfig.summary_interval = 50
TrainerConfig.num_checkpoints = 2
TrainerConfig.async_eval = False
"""


def write_eval_log(root: pathlib.Path, records: Sequence[dict]) -> pathlib.Path:
    """``root/eval_log.jsonl`` holding ``records``, one JSON line each (as the trainer writes them)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "eval_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root


def seeds(tmp: pathlib.Path, shape: Sequence[float] = SHAPE, name: str = "seed") -> list[pathlib.Path]:
    """The three synthetic seeds (see the constants above) under ``tmp``, as ``<name>-0`` .. ``<name>-2``."""
    return [write_eval_log(tmp / f"{name}-{i}", [
        dict(iteration=steps // 10, env_steps=steps, elapsed_s=steps / rate, eval_s=0.1,
             average_return=value + offset, average_episode_length=10.0, num_episodes=1)
        for steps, value in zip(ENV_STEPS, shape)]) for i, (offset, rate) in enumerate(zip(OFFSETS, RATES))]


def real_runs(tmp: pathlib.Path) -> list[pathlib.Path]:
    """Two seeds of a real SAC run (a few seconds in all)."""
    return [run_trainer_from_text(tmp, SAC, [f"TrainerConfig.random_seed={seed}"], name=f"sac-s{seed}")
            for seed in (1, 2)]
