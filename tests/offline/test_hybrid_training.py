"""ALF's four offline parameters and the two ways of mixing offline and online data, counted by hand."""
import dataclasses
import pathlib

import gin
import gymnasium as gym
import numpy as np
import pytest
import torch

from alfish.collect.no_collector import NoCollector
from alfish.config import TrainerConfig, load_conf
from alfish.data.types import LossInfo
from alfish.learn.distributed import sum_losses
from alfish.replay.offline.alfish_format import write_dataset
from alfish.replay.offline.options import OfflineOptions
from alfish.replay.offline.sources import load_offline_data
from alfish.trainer.build import build_trainer
from alfish.trainer.counters import Counters
from alfish.trainer.hybrid_training import HybridTraining
from alfish.trainer.offline_parts import build_offline_training_step
from alfish.trainer.training import StepParts
from tests.integration.inprocess import tb_scalars
from tests.offline.datasets import point_goal_expert, rollouts
from tests.offline.device_offline import device_mixture, host_trees_record
from tests.replay.device_parts import BATCH, LENGTH, META, READERS, assert_on, replay_config

SAC = """
create_environment.env_name = 'alfish/PointGoal-v0'
SacAlgorithm.hidden_sizes = (8, 8)
TrainerConfig.algorithm_ctor = @SacAlgorithm
TrainerConfig.random_seed = 1
TrainerConfig.unroll_length = 1
TrainerConfig.whole_replay_buffer_training = False
TrainerConfig.replay_buffer_length = 1000
TrainerConfig.mini_batch_size = 16
TrainerConfig.mini_batch_length = 2
TrainerConfig.num_updates_per_train_iter = 1
TrainerConfig.summary_interval = 1
TrainerConfig.evaluate = False
TrainerConfig.num_checkpoints = 0
"""


@pytest.fixture(scope="module")
def expert_npz(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("data") / "expert.npz"
    np.savez(path, **rollouts("alfish/PointGoal-v0", lambda o, r: point_goal_expert(o).astype(np.float32), 10))
    return path


def build(tmp_path: pathlib.Path, conf: str, params=(), name: str = "run"):
    path = tmp_path / f"{name}.gin"
    path.write_text(conf)
    load_conf(str(path), list(params))
    try:
        return build_trainer(TrainerConfig(root_dir=str(tmp_path / name)))
    finally:
        gin.clear_config()


def test_alf_scheme_offline_every_update_rl_from_after_then_every_kth_iteration(tmp_path, expert_npz):
    trainer = build(tmp_path, SAC, [f"TrainerConfig.offline_buffer_dir='{expert_npz}'",
                                    "TrainerConfig.num_iterations=8", "TrainerConfig.num_updates_per_train_iter=2",
                                    "TrainerConfig.initial_collect_steps=5",
                                    "TrainerConfig.rl_train_after_update_steps=3",
                                    "TrainerConfig.rl_train_every_update_steps=2"])
    assert trainer.run() == 0
    # iterations 0..7; the RL part trains at 4 and 6 (>= 3 and divisible by 2), 2 updates each
    assert trainer.training.updates == {"offline": 16, "rl": 4}
    assert trainer.learner.num_updates == 16  # one optimizer step per update: the two losses are summed
    # nothing is collected before iteration 3; then a 5-step warm-up and 1 step in each of iterations 3..7
    assert trainer.counters.env_steps == 5 + 5
    assert trainer.replay.drawn.tolist() == [4 * 16, 16 * 16]  # [online, offline] sequences
    scalars = tb_scalars(tmp_path / "run")
    assert "loss/offline/critic_loss" in scalars and "loss/critic_loss" in scalars  # both parts summarized


def test_pure_offline_builds_no_training_env(tmp_path, expert_npz):
    steps = dataclasses.replace(load_offline_data(str(expert_npz)),
                                observation_space=gym.spaces.Box(-2.0, 2.0, (1,), np.float32),
                                action_space=gym.spaces.Box(-1.0, 1.0, (1,), np.float32))
    dataset = write_dataset(steps, tmp_path / "ds")  # (stores the spaces the algorithm is built for)
    # an env id that does not exist: building any training env would fail
    conf = SAC.replace("'alfish/PointGoal-v0'", "'alfish/NoSuchEnv-v0'")
    trainer = build(tmp_path, conf, [f"TrainerConfig.offline_buffer_dir='{dataset}'",
                                     "TrainerConfig.num_iterations=5", "TrainerConfig.rl_train_after_update_steps=5",
                                     "TrainerConfig.num_updates_per_train_iter=1"])
    assert isinstance(trainer.collector, NoCollector)
    assert trainer.run() == 0
    assert trainer.counters.env_steps == 0 and trainer.learner.num_updates == 5
    assert trainer.training.updates == {"offline": 5, "rl": 0}


def test_rlpd_mixed_batches_draw_the_offline_fraction_and_keep_the_count_across_a_resume(tmp_path, expert_npz):
    params = [f"TrainerConfig.offline_buffer_dir='{expert_npz}'", "OfflineData.mixing='mixed'",
              "OfflineData.offline_fraction=0.25", "TrainerConfig.initial_collect_steps=4",
              "TrainerConfig.num_checkpoints=1"]
    first = build(tmp_path, SAC, params + ["TrainerConfig.num_iterations=4"])
    assert first.run() == 0
    assert first.replay.drawn.tolist() == [4 * 12, 4 * 4]  # 16-sequence batches: 4 offline, 12 online
    resumed = build(tmp_path, SAC, params + ["TrainerConfig.num_iterations=6"])
    assert resumed.run() == 0
    assert resumed.replay.drawn.tolist() == [6 * 12, 6 * 4]  # restored, then counted on
    scalars = tb_scalars(tmp_path / "run")
    assert {v for _, v in scalars["replay/offline_fraction"]} == {0.25}
    assert scalars["replay/offline_fraction_total"][-1][1] == pytest.approx(0.25)


def test_sum_losses_is_the_sum_of_the_two_means_with_each_part_weighted():
    first = LossInfo(loss=torch.tensor([[1.0, 3.0]]), extra={"x": torch.tensor(1.0)}, priority=torch.tensor([1., 2.]))
    second = LossInfo(loss=torch.tensor([[2.0, 2.0, 2.0, 6.0]]), extra={"x": torch.tensor(5.0)},
                      priority=torch.tensor([3., 4., 5., 6.]))
    both = sum_losses(first, second)
    assert both.loss.mean().item() == pytest.approx(2.0 + 3.0)
    weights = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    assert (both.loss * weights).mean().item() == pytest.approx((1.0 + 0.0) / 2 + (2.0 + 2.0 + 2.0) / 4)
    assert both.priority.tolist() == [1, 2, 3, 4, 5, 6]
    assert both.extra() == {"offline/x": torch.tensor(1.0), "x": torch.tensor(5.0)}


@pytest.mark.parametrize("params, message", [
    (["OfflineData.mixing='mixed'", "TrainerConfig.rl_train_after_update_steps=2"],
     "OfflineData.mixing='mixed' trains one loss"),
    (["TrainerConfig.algorithm_ctor=@PpoAlgorithm", "TrainerConfig.whole_replay_buffer_training=False"],
     "stores rollout info with each step"),
    (["OfflineData.mixing='separate'", "OfflineData.offline_fraction=0.3"], "applies to mixing='mixed'"),
    (["create_environment.env_name='alfish/Chain-v0'", "TrainerConfig.algorithm_ctor=@DqnAlgorithm"],
     "observation has shape \\(1,\\) but the env's space has \\(5,\\)"),
])
def test_offline_settings_that_do_not_fit_are_one_line_errors(tmp_path, expert_npz, params, message):
    with pytest.raises(Exception, match=message) as err:
        build(tmp_path, SAC, [f"TrainerConfig.offline_buffer_dir='{expert_npz}'", "TrainerConfig.num_iterations=3",
                              *params]).close()
    assert "\n" not in str(err.value)


def test_prioritized_offline_and_online_buffers_checkpoint_their_priorities_and_a_run_buffer_is_offline_data(
        tmp_path, expert_npz):
    from alfish.replay.offline.from_run import read_run

    params = [f"TrainerConfig.offline_buffer_dir='{expert_npz}'", "TrainerConfig.num_iterations=6",
              "TrainerConfig.rl_train_after_update_steps=2", "TrainerConfig.priority_replay=True",
              "TrainerConfig.initial_collect_steps=4", "TrainerConfig.num_checkpoints=1"]
    trainer = build(tmp_path, SAC, params)
    assert trainer.run() == 0
    state = trainer.replay.state_dict()
    assert set(state) == {"online", "offline", "drawn"} and state["offline"]["sampler"]  # priorities saved
    steps = read_run(tmp_path / "run")  # the hybrid run's own online steps, as data
    assert len(steps) == int(trainer.replay.online.num_stored().sum())
    offline_only = build(tmp_path, SAC, [f"TrainerConfig.offline_buffer_dir='{expert_npz}'",
                                         "TrainerConfig.num_iterations=2",
                                         "TrainerConfig.rl_train_after_update_steps=2",
                                         "TrainerConfig.num_checkpoints=1"], name="offline")
    assert offline_only.run() == 0
    with pytest.raises(ValueError, match="trained purely offline and saved no replay data"):
        read_run(tmp_path / "offline")


def test_hybrid_rlpd_with_async_unroll(tmp_path, expert_npz):
    trainer = build(tmp_path, SAC, [f"TrainerConfig.offline_buffer_dir='{expert_npz}'", "OfflineData.mixing='mixed'",
                                    "TrainerConfig.async_unroll=True", "TrainerConfig.num_iterations=5",
                                    "TrainerConfig.initial_collect_steps=4"])
    assert trainer.run() == 0
    assert trainer.replay.drawn.tolist() == [5 * 8, 5 * 8] and trainer.counters.env_steps >= 5 + 4


# ------------------------------------------------------ the online storage on the training device (meta here) ---

class RecordingLearner:
    """Stands in for the Learner (which needs values): records what each update is handed and returns a priority
    per row on the batch's device."""

    def __init__(self):
        self.updates = []

    def update(self, batch, batch_info):
        self.updates.append((batch, batch_info))
        return LossInfo(loss=torch.zeros((), device=META), priority=torch.ones(len(batch_info.env_ids), device=META))


@pytest.mark.parametrize("reader", [None, *sorted(READERS)])
def test_alf_hybrid_update_with_device_storage_and_prioritized_replay_is_on_the_device(tmp_path, monkeypatch, reader):
    """ALF's scheme with ``replay_storage='device'`` and prioritized replay, assembled as the trainer does it: the
    offline and the online batch, and the one ``BatchInfo`` of both, reach the learner on the device; each part's
    priorities go to its own sampler (device trees online without a buffer reader; host trees otherwise, whose
    device priorities are recorded here: see ``host_trees_record``)."""
    mixture, transformer = device_mixture(tmp_path, reader, priority_replay=True, mixing="separate")
    learner = RecordingLearner()
    parts = StepParts(collector=None, learner=learner, algorithm=None, transformer=transformer)
    training = build_offline_training_step(replay_config(tmp_path, True), OfflineOptions(), parts, mixture,
                                           Counters(), total_envs=2)
    assert isinstance(training, HybridTraining)
    received = {"offline": [], "online": []}
    host_trees_record(mixture.offline, received["offline"], monkeypatch)
    if reader is not None:
        host_trees_record(mixture.online, received["online"], monkeypatch)
    seen = mixture.online.sampler._num_seen
    training._update(rl_due=True)
    [(batch, info)] = learner.updates
    assert_on(batch, META)
    assert_on(info, META)
    assert batch.offline.step_type.shape == batch.online.step_type.shape == (LENGTH, BATCH)  # time-major
    assert info.env_ids.shape == info.importance_weights.shape == (2 * BATCH,)
    online_applied = mixture.online.sampler._num_seen - seen
    assert online_applied + sum(len(p) for _, p in received["online"]) == BATCH
    [(offline_info, priorities)] = received["offline"]
    assert offline_info.positions.device == torch.device("cpu") and priorities.shape == (BATCH,)
