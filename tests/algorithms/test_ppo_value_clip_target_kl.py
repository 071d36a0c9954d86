"""PPO's SB3 options: ``clip_range_vf`` (the value clipped around the old value before the squared error) against a
hand computation, and ``target_kl`` (the iteration's epochs stop at the first mini-batch whose approximate KL exceeds
1.5 * target_kl) counted in updates."""
import gin
import pytest
import torch

from alfish.algorithms.ppo import PpoAlgorithm, PpoExperienceInfo, PpoTrainInfo
from alfish.config import ConfError, TrainerConfig, load_conf
from alfish.trainer.build import build_trainer
from tests.algorithms.test_loss_isolation import B_, L_, hand_experience, spaces

N = L_ * B_


def hand_batch(clip_range_vf):
    """A Pendulum PPO and a [3, 4] batch whose old values, value targets and new values are set by hand: the first
    four predictions move +0.5 from the old value 0, the next four -0.05, the last four +1 from the old value 1;
    every target is 1."""
    obs_space, act_space = spaces("Pendulum-v1")
    ppo = PpoAlgorithm(obs_space, act_space, hidden_sizes=(4,), clip_range_vf=clip_range_vf)
    gen = torch.Generator().manual_seed(0)
    old_value = torch.tensor([0.0] * 8 + [1.0] * 4)
    new_value = torch.tensor([0.5] * 4 + [-0.05] * 4 + [2.0] * 4)
    info = PpoExperienceInfo(log_prob=torch.zeros(L_, B_), value=old_value.view(L_, B_),
                             advantage=torch.ones(L_, B_), value_target=torch.ones(L_, B_))
    exp = hand_experience(obs_space.shape[0], torch.zeros(L_, B_, 1), gen)._replace(rollout_info=info)
    train_info = PpoTrainInfo(log_prob=torch.zeros(N), entropy=torch.zeros(N), value=new_value)
    return ppo, exp, train_info


def test_clipped_value_loss_matches_the_hand_computation():
    ppo, exp, train_info = hand_batch(clip_range_vf=0.2)
    value_loss = ppo.loss_terms(exp, train_info)["value_loss"]
    # clipped predictions: 0 + 0.2 (0.5 clipped), -0.05 (inside), 1 + 0.2 (2 clipped); squared error to the target 1
    expected = torch.tensor([0.8 ** 2] * 4 + [1.05 ** 2] * 4 + [0.2 ** 2] * 4)
    torch.testing.assert_close(value_loss, expected)


def test_no_clip_range_vf_is_todays_unclipped_value_loss():
    ppo, exp, train_info = hand_batch(clip_range_vf=None)
    expected = torch.tensor([0.5 ** 2] * 4 + [1.05 ** 2] * 4 + [1.0 ** 2] * 4)
    torch.testing.assert_close(ppo.loss_terms(exp, train_info)["value_loss"], expected)


def test_bad_target_kl_is_refused():
    obs_space, act_space = spaces("Pendulum-v1")
    with pytest.raises(ValueError, match="target_kl=0 must be > 0"):
        PpoAlgorithm(obs_space, act_space, hidden_sizes=(4,), target_kl=0)


PPO = """
create_environment.env_name = 'alfish/Chain-v0'
create_environment.num_parallel_environments = 2
PpoAlgorithm.hidden_sizes = (8,)
PpoAlgorithm.lr = 0.01
TrainerConfig.algorithm_ctor = @PpoAlgorithm
TrainerConfig.random_seed = 1
TrainerConfig.num_iterations = 2
TrainerConfig.unroll_length = 8
TrainerConfig.whole_replay_buffer_training = True
TrainerConfig.clear_replay_buffer = True
TrainerConfig.replay_buffer_length = 16
TrainerConfig.num_updates_per_train_iter = 3
TrainerConfig.mini_batch_size = 4
TrainerConfig.mini_batch_length = 1
TrainerConfig.evaluate = False
TrainerConfig.num_checkpoints = 0
"""


def updates_after_two_iterations(tmp_path, extra: str = "") -> int:
    conf = tmp_path / "ppo.gin"
    conf.write_text(PPO + extra)
    load_conf(str(conf))
    try:
        trainer = build_trainer(TrainerConfig(root_dir=str(tmp_path / "run")))
    finally:
        gin.clear_config()
    trainer.run()
    return trainer.learner.num_updates


def test_tiny_target_kl_stops_each_iteration_after_its_first_mini_batch(tmp_path):
    # the unrolled policy is the trained one at the first mini-batch (KL ~ 0): it is trained on; after that update
    # (lr 0.01) the next mini-batch's KL is above 1.5e-9, so the iteration's remaining epochs are skipped
    assert updates_after_two_iterations(tmp_path, "PpoAlgorithm.target_kl = 1e-9\n") == 2


def test_without_target_kl_every_epoch_runs(tmp_path):
    plain = updates_after_two_iterations(tmp_path)
    assert plain > 2 and plain % 3 == 0  # 3 epochs of whole passes, each iteration
    assert updates_after_two_iterations(tmp_path, "PpoAlgorithm.target_kl = 100.0\n") == plain  # never exceeded


@pytest.mark.parametrize("binding", ["PpoAlgorithm.clip_range_vf = 0", "PpoAlgorithm.target_kl = -0.01"])
def test_value_check_refuses_non_positive_values(binding, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfError, match=f"{binding}: expected a number > 0"):
        load_conf(None, [binding])
    gin.clear_config()
    load_conf(None, [binding.split(" = ")[0] + " = 0.05"])
    gin.clear_config()
