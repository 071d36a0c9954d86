"""The null parts: a run that stores no experience holds a ``NullReplay``, a process that does not evaluate a
``NullEvaluator``, and the loop calls them as any replay buffer and evaluator. What such a run writes is what it
wrote when those parts were ``None``: no replay in its checkpoints, no evaluation record."""
import os

import gin
import pytest

from alfish.algorithms.a2c import A2cAlgorithm
from alfish.config import TrainerConfig, load_conf
from alfish.evaluate.null_evaluator import NullEvaluator
from alfish.replay.null_replay import NullReplay
from alfish.rundir.checkpoint import Checkpointer
from alfish.trainer.build import build_trainer
from alfish.trainer.counters import RunPlan

ON_POLICY_WITHOUT_EVALUATION = """
create_environment.env_name = 'alfish/Chain-v0'
create_environment.num_parallel_environments = 2
A2cAlgorithm.hidden_sizes = (8,)
TrainerConfig.algorithm_ctor = @A2cAlgorithm
TrainerConfig.random_seed = 3
TrainerConfig.num_iterations = 4
TrainerConfig.unroll_length = 3
TrainerConfig.evaluate = False
TrainerConfig.eval_interval = 2
TrainerConfig.num_checkpoints = 2
Trainer.save_replay_buffer = True
"""


@pytest.mark.timeout(120)
def test_an_on_policy_run_without_evaluation_saves_no_replay_and_records_no_evaluation(tmp_path):
    conf = tmp_path / "a2c.gin"
    conf.write_text(ON_POLICY_WITHOUT_EVALUATION)
    load_conf(str(conf))
    try:
        config = TrainerConfig(root_dir=str(tmp_path / "run"))
        trainer = build_trainer(config)
        assert isinstance(trainer.replay, NullReplay) and isinstance(trainer.evaluator, NullEvaluator)
        assert not trainer.plan.evaluation_due(2) and not trainer.plan.final_evaluation_due(3)
        assert trainer.run() == 0
        ckpt = Checkpointer(os.path.join(config.root_dir, "checkpoints")).load_latest()
    finally:
        gin.clear_config()
    assert ckpt.step == 4
    assert set(ckpt.tensors) == {"algorithm", "transformers", "learner", "rng", "collector"}
    assert "replay_layout" not in ckpt.meta
    assert not os.path.exists(os.path.join(config.root_dir, "eval_log.jsonl"))


def test_the_plan_of_a_process_that_evaluates_has_evaluations_and_a_final_one():
    config = TrainerConfig(root_dir="unused", algorithm_ctor=A2cAlgorithm, num_iterations=10, eval_interval=5,
                           evaluate=True)
    plan = RunPlan(config, total_envs=1)
    assert [it for it in range(1, 11) if plan.evaluation_due(it)] == [5, 10]
    assert plan.final_evaluation_due(7) and not plan.final_evaluation_due(10)
    other_rank = RunPlan(config, total_envs=1, evaluates=False)
    assert not any(other_rank.evaluation_due(it) or other_rank.final_evaluation_due(it) for it in range(1, 11))
