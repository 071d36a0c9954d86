"""How far a run is (``Counters``, checkpointed) and where it is going (``RunPlan``, derived from the config)."""
from __future__ import annotations

import dataclasses
import time
from typing import Optional

from alfish.collect.collector import ProgressPoint
from alfish.config.trainer_config import TrainerConfig


@dataclasses.dataclass
class Counters:
    """iteration: iterations completed. env_steps: env steps taken, summed over every env of every rank.
    unroll_credit: the fraction of a step per env carried over when ``unroll_length`` is fractional.
    elapsed_before_s: wall-clock seconds of the earlier runs of this experiment (resume)."""

    iteration: int = 0
    env_steps: int = 0
    unroll_credit: float = 0.0
    elapsed_before_s: float = 0.0
    started_at: float = dataclasses.field(default_factory=time.monotonic)

    def steps_this_iteration(self, unroll_length: float) -> int:
        """Env steps per env to unroll now; a fractional unroll_length unrolls one step every 1/x iterations."""
        self.unroll_credit += unroll_length
        steps = int(self.unroll_credit + 1e-9)
        self.unroll_credit -= steps
        return steps

    def elapsed_s(self) -> float:
        """Wall-clock seconds of this experiment so far, earlier runs included."""
        return self.elapsed_before_s + time.monotonic() - self.started_at

    def state_dict(self) -> dict:
        return dict(iteration=self.iteration, env_steps=self.env_steps, unroll_credit=self.unroll_credit,
                    elapsed_s=self.elapsed_s())

    def load_state_dict(self, state: dict) -> None:
        self.iteration, self.env_steps = int(state["iteration"]), int(state["env_steps"])
        self.unroll_credit = float(state["unroll_credit"])
        self.elapsed_before_s, self.started_at = float(state.get("elapsed_s", 0.0)), time.monotonic()


class RunPlan:
    """The run's length and the iterations at which evaluations and checkpoints fall, for ``total_envs`` envs (all
    ranks)."""

    def __init__(self, config: TrainerConfig, total_envs: int, evaluates: Optional[bool] = None):
        self.config = config
        self.total_envs = total_envs
        self.expected_iterations = config.expected_num_iterations(total_envs)
        self.checkpoint_iterations = set(config.checkpoint_iterations(total_envs))
        self.eval_interval = config.resolved_eval_interval(total_envs)
        self.summary_interval = config.resolved_summary_interval(total_envs)
        # whether this process evaluates (None: TrainerConfig.evaluate); where it does not, no evaluation is ever due
        self.evaluates = config.evaluate if evaluates is None else evaluates

    def finished(self, counters: Counters) -> bool:
        """``num_iterations`` or ``num_env_steps`` reached (whichever limit is set and comes first)."""
        cfg = self.config
        return ((cfg.num_iterations > 0 and counters.iteration >= cfg.num_iterations)
                or (cfg.num_env_steps > 0 and counters.env_steps >= cfg.num_env_steps))

    def progress(self, counters: Counters) -> ProgressPoint:
        """What schedules read: iterations, env steps and the fraction of the run done."""
        return ProgressPoint(counters.iteration, counters.env_steps,
                             min(1.0, counters.iteration / max(1, self.expected_iterations)))

    def evaluation_due(self, iteration: int) -> bool:
        return self.evaluates and iteration % self.eval_interval == 0

    def final_evaluation_due(self, iteration: int) -> bool:
        """The run ends with an evaluation of its final policy, unless one was made at this ``iteration``."""
        return self.evaluates and iteration % self.eval_interval != 0

    def checkpoint_due(self, iteration: int) -> bool:
        return iteration in self.checkpoint_iterations
