"""SAC with a fixed entropy coefficient (SB3's ``ent_coef=0.1``): the actor loss reads exactly that alpha, nothing
trains it, and the value check refuses an alpha <= 0. Critics are constants (as in test_sac_td_target), so the actor
loss is ``alpha * log_prob - min(1, 1.5)`` whatever the sampled action."""
import math

import gin
import gymnasium as gym
import pytest
import torch

from alfish.algorithms.sac import SacAlgorithm
from alfish.config import ConfError, TrainerConfig, load_conf
from alfish.data.types import StepType
from alfish.trainer.build import build_trainer
from tests.algorithms.test_sac_td_target import constant_ensemble, two_step_batch
from tests.integration.inprocess import OFF_POLICY_POINT_GOAL

SPACE = gym.spaces.Box(-1.0, 1.0, shape=(1,))


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def fixed_alpha_sac(ent_coef: float = 0.1) -> SacAlgorithm:
    algorithm = SacAlgorithm(SPACE, SPACE, hidden_sizes=(4,), ent_coef=ent_coef)
    constant_ensemble(algorithm.critics, [1.0, 1.5])
    constant_ensemble(algorithm.target_critics, [2.0, 3.0])
    return algorithm


def test_actor_loss_uses_exactly_the_fixed_alpha_and_there_is_no_alpha_term():
    torch.manual_seed(0)
    sac = fixed_alpha_sac(0.1)
    info = sac.train_step(two_step_batch(StepType.MID, 1.0)).info
    assert torch.allclose(info.actor_loss, 0.1 * info.log_prob - 1.0, atol=1e-6)  # min over the critics: 1.0
    assert torch.equal(info.alpha_loss, torch.zeros(2))
    # by hand, for the first transition: the log-prob it drew, times 0.1, minus 1
    assert info.actor_loss[0].item() == pytest.approx(0.1 * info.log_prob[0].item() - 1.0, abs=1e-6)


def test_fixed_alpha_has_no_parameter_group_and_never_changes_over_updates():
    torch.manual_seed(0)
    sac = fixed_alpha_sac(0.25)
    assert [g["name"] for g in sac.param_groups()] == ["actor", "critic"]
    assert "log_alpha" not in dict(sac.named_parameters())
    assert "log_alpha" in sac.state_dict()  # checkpoints keep the same key as a learned alpha
    optimizer = torch.optim.Adam([dict(params=g["params"]) for g in sac.param_groups()], lr=0.1)
    actor_before = sac.actor[-1].bias.detach().clone()  # (observations are zeros: the biases learn)
    for _ in range(3):
        exp = two_step_batch(StepType.MID, 1.0)
        loss = sac.calc_loss(exp, sac.train_step(exp).info).loss.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert sac.log_alpha.exp().item() == pytest.approx(0.25, rel=1e-7)
    assert not torch.equal(sac.actor[-1].bias, actor_before)  # the updates did train the actor


def test_learned_alpha_is_still_the_default():
    sac = SacAlgorithm(SPACE, SPACE, hidden_sizes=(4,), initial_log_alpha=math.log(0.1))
    assert [g["name"] for g in sac.param_groups()] == ["actor", "critic", "alpha"]
    assert sac.log_alpha.requires_grad and sac.log_alpha.exp().item() == pytest.approx(0.1)


@pytest.mark.parametrize("value", ["0", "-0.1"])
def test_value_check_refuses_an_alpha_that_is_not_positive(value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfError) as info:
        load_conf(None, [f"SacAlgorithm.ent_coef = {value}"])
    assert f"SacAlgorithm.ent_coef = {value}: expected a number > 0" in str(info.value)
    with pytest.raises(ValueError, match="must be > 0"):  # built in Python, without a conf
        SacAlgorithm(SPACE, SPACE, hidden_sizes=(4,), ent_coef=float(value))


def test_value_check_accepts_a_positive_alpha_and_none(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    load_conf(None, ["SacAlgorithm.ent_coef = 0.1"])
    load_conf(None, ["SacAlgorithm.ent_coef = None"])


@pytest.mark.parametrize("binding", ["alpha_lr = 1e-3", "initial_log_alpha = -1.0", "target_entropy = -2.0"])
def test_a_learned_alpha_setting_next_to_a_fixed_alpha_is_an_error(binding):
    gin.bind_parameter(f"SacAlgorithm.{binding.split(' = ')[0]}", float(binding.split(" = ")[1]))
    with pytest.raises(ValueError, match=f"SacAlgorithm.{binding.split(' = ')[0]} is bound, but"):
        SacAlgorithm(SPACE, SPACE, hidden_sizes=(4,), ent_coef=0.1)


def test_the_defaults_an_operative_config_records_are_not_an_error_next_to_a_fixed_alpha():
    # play and resume rebuild from root_dir/config/operative.gin, which records every default of SacAlgorithm
    for param, default in (("alpha_lr", 3e-4), ("initial_log_alpha", 0.0), ("target_entropy", None)):
        gin.bind_parameter(f"SacAlgorithm.{param}", default)
    assert not SacAlgorithm(SPACE, SPACE, hidden_sizes=(4,), ent_coef=0.1).learns_alpha


def test_a_fixed_alpha_trains_through_the_trainer(tmp_path):
    # the whole path (Learner with two parameter groups, summaries of alpha) with SAC's fixed alpha
    conf = tmp_path / "sac.gin"
    conf.write_text(OFF_POLICY_POINT_GOAL.replace("num_env_steps = 1500", "num_env_steps = 140").replace(
        "TrainerConfig.evaluate = True", "TrainerConfig.evaluate = False") + """
SacAlgorithm.hidden_sizes = (8,)
SacAlgorithm.ent_coef = 0.2
TrainerConfig.algorithm_ctor = @SacAlgorithm
TrainerConfig.summary_interval = 10
""")
    load_conf(str(conf))
    try:
        trainer = build_trainer(TrainerConfig(root_dir=str(tmp_path / "run")))
    finally:
        gin.clear_config()
    assert trainer.run() == 0
    assert trainer.learner.num_updates == 40
    assert trainer.algorithm.log_alpha.exp().item() == pytest.approx(0.2)
