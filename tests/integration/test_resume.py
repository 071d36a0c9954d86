"""Resuming and the checkpoint schedule, in process (a tiny SAC on alfish/PointGoal-v0: 10-step episodes)."""
import os

import gin
import pytest
import torch

from alfish.config import TrainerConfig, load_conf
from alfish.data.types import StepType
from alfish.rundir.checkpoint import Checkpointer

from .test_learning import SAC_POINT_GOAL

TINY = ["SacAlgorithm.hidden_sizes = (8,)", "TrainerConfig.mini_batch_size = 4", "TrainerConfig.evaluate = False",
        "TrainerConfig.summary_interval = 1000"]


def build_trainer(tmp_path, params):
    from alfish.trainer.build import build_trainer as build

    conf = tmp_path / "sac_point_goal.gin"
    conf.write_text(SAC_POINT_GOAL)
    load_conf(str(conf), TINY + list(params))
    return build(TrainerConfig(root_dir=str(tmp_path / "root")))


def restore_parts(trainer):
    """What ``Trainer.run`` does first on a resume: every part restored from the resume point."""
    from alfish.trainer.resume import CheckpointedParts, restore

    restore(trainer.resume_from, CheckpointedParts(
        algorithm=trainer.algorithm, transformer=trainer.transformer, learner=trainer.learner,
        counters=trainer.counters, stats=trainer.collector.stats, replay=trainer.replay, spec=trainer.collector.spec))


@pytest.fixture(autouse=True)
def clean_gin():
    yield
    gin.clear_config()


def firsts_not_after_last(step_types):
    """Indices i > 0 where a FIRST step is stored right after a step that is not LAST (a spliced history)."""
    st = step_types.tolist()
    return [i for i in range(1, len(st)) if st[i] == StepType.FIRST and st[i - 1] != StepType.LAST]


@pytest.mark.timeout(60)
def test_resumed_replay_buffer_never_splices_a_reset_into_an_episode(tmp_path):
    # 20 warm-up steps + 15 iterations = 35 stored steps; episodes are FIRST + 10 steps, so the run (and its final
    # checkpoint) ends mid-episode.
    trainer = build_trainer(tmp_path, ["Trainer.save_replay_buffer = True", "TrainerConfig.initial_collect_steps = 20",
                                       "TrainerConfig.num_env_steps = 35", "TrainerConfig.num_checkpoints = 1"])
    assert trainer.run() == 0
    stored = trainer.replay.gather_all()[0].step_type[0]
    assert len(stored) == 35 and int(stored[-1]) == StepType.MID
    assert firsts_not_after_last(stored) == []  # an uninterrupted run is clean
    gin.clear_config()

    resumed = build_trainer(tmp_path, ["Trainer.save_replay_buffer = True", "TrainerConfig.initial_collect_steps = 20",
                                       "TrainerConfig.num_env_steps = 60", "TrainerConfig.num_checkpoints = 1"])
    assert resumed.run() == 0
    stored = resumed.replay.gather_all()[0].step_type[0]
    assert len(stored) == 60
    assert firsts_not_after_last(stored) == []


@pytest.mark.timeout(60)
def test_num_checkpoints_are_written_when_warm_up_counts_toward_num_env_steps(tmp_path):
    trainer = build_trainer(tmp_path, ["TrainerConfig.initial_collect_steps = 100", "TrainerConfig.num_env_steps = 150",
                                       "TrainerConfig.num_checkpoints = 2"])
    assert trainer.run() == 0
    assert trainer.counters.iteration == 50 and trainer.counters.env_steps == 150
    steps = Checkpointer(os.path.join(tmp_path, "root", "checkpoints")).steps()
    # Two checkpoints, evenly spaced over the 50 iterations, the last at the end.
    assert steps == [25, 50]


@pytest.mark.timeout(60)
def test_no_initial_collect_still_fills_one_sequence_before_the_first_update(tmp_path):
    # mini_batch_length=2 with unroll_length=1: without a warm-up of 1 step the first sample would need 2 stored steps
    # per env while only 1 exists.
    trainer = build_trainer(tmp_path, ["TrainerConfig.initial_collect_steps = 0", "TrainerConfig.num_env_steps = 12",
                                       "TrainerConfig.num_checkpoints = 0"])
    assert trainer.run() == 0
    # warm-up: 2 steps (one whole sequence of 2), then one step and one update per iteration
    assert trainer.counters.env_steps == 12 and trainer.learner.num_updates == trainer.counters.iteration == 10


@pytest.mark.timeout(60)
def test_resume_restores_counters_and_optimizer_state(tmp_path):
    # The final checkpoint of a run resumes at its iteration with Adam's moments intact.
    params = ["TrainerConfig.num_env_steps = 40", "TrainerConfig.num_checkpoints = 1",
              "TrainerConfig.initial_collect_steps = 10"]
    trainer = build_trainer(tmp_path, params)
    assert trainer.run() == 0
    saved_state = trainer.learner.optimizer.state_dict()["state"]
    assert saved_state, "Adam has state after training"
    saved_adam = {k: v.clone() for k, v in next(iter(saved_state.values())).items()}
    gin.clear_config()
    resumed = build_trainer(tmp_path, params)
    restore_parts(resumed)
    assert resumed.counters.iteration == trainer.counters.iteration and resumed.counters.env_steps == 40
    restored = next(iter(resumed.learner.optimizer.state_dict()["state"].values()))
    for k, v in saved_adam.items():
        assert torch.equal(restored[k], v), k
    resumed.close()


@pytest.mark.timeout(60)
def test_prioritized_replay_checkpoint_round_trip_and_resume(tmp_path):
    # A prioritized run saves its trees with the ring; the resumed sampler draws exactly as the saved one would.
    params = ["TrainerConfig.priority_replay = True", "TrainerConfig.priority_replay_beta = 0.5",
              "TrainerConfig.initial_collect_steps = 10", "TrainerConfig.num_env_steps = 40",
              "TrainerConfig.num_checkpoints = 1"]
    trainer = build_trainer(tmp_path, params)
    assert trainer.run() == 0
    saved = {k: v.clone() if isinstance(v, torch.Tensor) else v
             for k, v in trainer.replay.sampler.state_dict().items()}
    gin.clear_config()
    resumed = build_trainer(tmp_path, params)
    restore_parts(resumed)
    restored = resumed.replay.sampler.state_dict()
    for key, value in saved.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(restored[key], value), key
    draws = []
    for replay in (trainer.replay, resumed.replay):
        torch.manual_seed(0)
        draws.append(replay.sample(4, 2)[1])
    for a, b in zip(*draws):
        assert torch.equal(a, b)
    resumed.close()
