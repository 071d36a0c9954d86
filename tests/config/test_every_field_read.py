"""Every TrainerConfig parameter is operative: ``NOT_BUILT_YET`` is gone, and each field is read by the code that
acts on it. A spy on ``TrainerConfig.__getattribute__`` records the fields read outside the config's own validation
while confs run with non-default values (gin's operative config cannot show this: it lists every default of a
configurable that was called)."""
import dataclasses
import sys

import gin
import numpy as np
import pytest

import alfish.config.trainer_config as trainer_config
from alfish.config import TrainerConfig, load_conf
from alfish.trainer.build import build_trainer
from tests.integration.inprocess import CONFS
from tests.integration.test_recurrent_learning import RECURRENT_PPO_MEMORY_CUE
from tests.offline.datasets import point_goal_expert, rollouts

FIELDS = {f.name for f in dataclasses.fields(TrainerConfig)}
# Read by no code path, by design (documented in its docstring): ALF's switch for an env alfish never builds.
NO_EFFECT = {"no_thread_env_for_conf"}
VALIDATION = {"__post_init__", "validation_problems", "_unsupported_problems", "_required_problems",
              "_cross_field_problems", "_store_whole_floats_as_ints", "__repr__", "__eq__", "replace", "asdict"}

POINT_GOAL = """
create_environment.env_name = 'alfish/PointGoal-v0'
SacAlgorithm.hidden_sizes = (8, 8)
TrainerConfig.algorithm_ctor = @SacAlgorithm
TrainerConfig.unroll_length = 1
TrainerConfig.whole_replay_buffer_training = False
TrainerConfig.mini_batch_size = 8
TrainerConfig.mini_batch_length = 2
TrainerConfig.num_eval_episodes = 1
TrainerConfig.num_eval_environments = 1
"""

# Each run: (conf, bindings with non-default values). Together they switch on every feature.
RUNS = [
    ("point_goal", ["TrainerConfig.num_iterations=6", "TrainerConfig.initial_collect_steps=4",
                    "TrainerConfig.priority_replay=True", "TrainerConfig.priority_replay_alpha=0.6",
                    "TrainerConfig.priority_replay_beta=0.5", "TrainerConfig.priority_replay_eps=1e-5",
                    "TrainerConfig.normalize_importance_weights_by_max=True", "TrainerConfig.debug_summaries=True",
                    "TrainerConfig.summarize_grads_and_vars=True", "TrainerConfig.summarize_action_distributions=True",
                    "TrainerConfig.summarize_output=True", "TrainerConfig.summarize_gradient_noise_scale=True",
                    "TrainerConfig.update_counter_every_mini_batch=True", "TrainerConfig.eval_uncertainty=True",
                    "TrainerConfig.evaluate=True", "TrainerConfig.async_eval=False", "TrainerConfig.eval_interval=3",
                    "TrainerConfig.profiling=True",
                    "Profiler.skip_iterations=1", "Profiler.active_iterations=2",
                    "TrainerConfig.code_snapshots=['algorithms/sac.py']", "TrainerConfig.empty_cache=True",
                    "TrainerConfig.ddp_paras_check_interval=2", "TrainerConfig.summary_max_queue=5",
                    "TrainerConfig.summaries_flush_secs=3", "TrainerConfig.metric_min_buffer_size=2",
                    "TrainerConfig.num_checkpoints=2", "TrainerConfig.summarize_first_interval=False",
                    "TrainerConfig.summary_interval=2", "TrainerConfig.epsilon_greedy=0.2"]),
    ("point_goal", ["TrainerConfig.num_env_steps=20", "TrainerConfig.initial_collect_steps=4",
                    "TrainerConfig.async_unroll=True", "TrainerConfig.unroll_length=0",
                    "TrainerConfig.num_iterations=4", "TrainerConfig.max_unroll_length=3",
                    "TrainerConfig.unroll_queue_size=7", "TrainerConfig.unroll_step_interval=0.001",
                    "TrainerConfig.unroll_parameter_update_period=2", "TrainerConfig.evaluate=True",
                    "TrainerConfig.async_eval=True",
                    "TrainerConfig.num_evals=2", "TrainerConfig.num_summaries=2",
                    "TrainerConfig.replay_buffer_length=50",
                    "TrainerConfig.enable_amp=True", "TrainerConfig.random_seed=3"]),
    ("point_goal", ["TrainerConfig.num_iterations=6", "TrainerConfig.offline_buffer_dir='DATA'",
                    "TrainerConfig.offline_buffer_length=40", "TrainerConfig.rl_train_after_update_steps=2",
                    "TrainerConfig.rl_train_every_update_steps=2", "TrainerConfig.evaluate=False",
                    "TrainerConfig.num_updates_per_train_iter=2", "TrainerConfig.confirm_checkpoint_upon_crash=False"]),
    ("ppo_cartpole.gin", ["TrainerConfig.num_iterations=2",
                          "TrainerConfig.clear_replay_buffer=False", "TrainerConfig.evaluate=False"]),
    ("sl_sine.gin", ["TrainerConfig.num_iterations=3", "TrainerConfig.ml_type='sl'"]),
    ("memory_cue", []),
]


@pytest.fixture
def reads(monkeypatch) -> set[str]:
    """The TrainerConfig fields read (outside validation) while the test runs."""
    seen: set[str] = set()
    original = TrainerConfig.__getattribute__

    def spy(self, name):
        if name in FIELDS:
            frame, depth = sys._getframe(1), 0
            while frame is not None and depth < 4:
                if frame.f_code.co_name in VALIDATION:
                    break
                frame, depth = frame.f_back, depth + 1
            else:
                seen.add(name)
        return original(self, name)

    monkeypatch.setattr(TrainerConfig, "__getattribute__", spy)
    return seen


def test_not_built_yet_is_gone():
    assert not hasattr(trainer_config, "NOT_BUILT_YET")


@pytest.mark.timeout(300)
def test_every_field_is_read_by_the_code_that_acts_on_it(tmp_path, reads):
    data = tmp_path / "expert.npz"
    np.savez(data, **rollouts("alfish/PointGoal-v0", lambda o, r: point_goal_expert(o).astype(np.float32), 5))
    for i, (conf, params) in enumerate(RUNS):
        if conf == "point_goal":
            path = tmp_path / "point_goal.gin"
            path.write_text(POINT_GOAL)
        elif conf == "memory_cue":  # a recurrent PPO (tests/integration/test_recurrent_learning.py's settings)
            path = tmp_path / "memory_cue.gin"
            path.write_text(RECURRENT_PPO_MEMORY_CUE)
            params = ["TrainerConfig.num_iterations=2", "TrainerConfig.use_rollout_state=True",
                      "TrainerConfig.temporally_independent_train_step=False", "TrainerConfig.evaluate=False"]
        else:
            path = CONFS / conf
        load_conf(str(path), [p.replace("'DATA'", f"'{data}'") for p in params])
        try:
            trainer = build_trainer(TrainerConfig(root_dir=str(tmp_path / f"run{i}"), conf_file=str(path)))
        finally:
            gin.clear_config()
        assert trainer.run() == 0
        if i == 2:  # (the crash path reads confirm_checkpoint_upon_crash)
            trainer.started = True
            trainer._checkpoint_after_crash(RuntimeError("a crash"))
    missing = sorted(FIELDS - NO_EFFECT - reads)
    assert missing == [], f"never read: {missing}"
    assert not (NO_EFFECT & reads)
