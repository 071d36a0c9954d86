"""Resuming and the checkpoint schedule, in process (a tiny SAC on alfish/PointGoal-v0: 10-step episodes)."""
import os

import gin
import pytest

from alfish.config import TrainerConfig, load_conf
from alfish.data.types import StepType
from alfish.trainer.checkpoint import Checkpointer

from .test_learning import SAC_POINT_GOAL

TINY = ["SacAlgorithm.hidden_sizes = (8,)", "TrainerConfig.mini_batch_size = 4", "TrainerConfig.evaluate = False",
        "TrainerConfig.summary_interval = 1000"]


def build_trainer(tmp_path, params):
    from alfish.trainer.trainer import Trainer

    conf = tmp_path / "sac_point_goal.gin"
    conf.write_text(SAC_POINT_GOAL)
    load_conf(str(conf), TINY + list(params))
    return Trainer(TrainerConfig(root_dir=str(tmp_path / "root")))


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
    stored = trainer.replay.gather_all().step_type[0]
    assert len(stored) == 35 and int(stored[-1]) == StepType.MID
    assert firsts_not_after_last(stored) == []  # an uninterrupted run is clean
    gin.clear_config()

    resumed = build_trainer(tmp_path, ["Trainer.save_replay_buffer = True", "TrainerConfig.initial_collect_steps = 20",
                                       "TrainerConfig.num_env_steps = 60", "TrainerConfig.num_checkpoints = 1"])
    assert resumed.run() == 0
    stored = resumed.replay.gather_all().step_type[0]
    assert len(stored) == 60
    assert firsts_not_after_last(stored) == []


@pytest.mark.timeout(60)
def test_num_checkpoints_are_written_when_warm_up_counts_toward_num_env_steps(tmp_path):
    trainer = build_trainer(tmp_path, ["TrainerConfig.initial_collect_steps = 100", "TrainerConfig.num_env_steps = 150",
                                       "TrainerConfig.num_checkpoints = 2"])
    assert trainer.run() == 0
    assert trainer.iteration == 50 and trainer.env_steps == 150
    steps = Checkpointer(os.path.join(tmp_path, "root", "checkpoints")).steps()
    # Two checkpoints, evenly spaced over the 50 iterations, the last at the end.
    assert steps == [25, 50]
