"""gSDE in SAC and PPO (``use_sde=True``): when ``rollout_step`` redraws each env's noise matrix, the log-prob of an
action against hand-computed values (SAC with the tanh correction, PPO without), state-dependent exploration, greedy
actions that ignore the noise, and a few iterations of training (SAC with a checkpoint and a resume)."""
import math

import gin
import gymnasium as gym
import pytest
import torch

from alfish.algorithms import PpoAlgorithm, SacAlgorithm
from alfish.config import TrainerConfig, load_conf
from alfish.data.types import StepType, TimeStep
from alfish.errors import OneLineValueError
from alfish.rundir.checkpoint import Checkpointer
from alfish.trainer.build import build_trainer

OBS = gym.spaces.Box(-1.0, 1.0, shape=(2,))
BOX = gym.spaces.Box(-2.0, 2.0, shape=(1,))
FIRST, MID = int(StepType.FIRST), int(StepType.MID)


def make(cls: type, **kwargs) -> SacAlgorithm | PpoAlgorithm:
    torch.manual_seed(0)
    return cls(OBS, BOX, hidden_sizes=(2,), use_sde=True, **kwargs)


def sde_of(alg):
    return alg.actor.noise if isinstance(alg, SacAlgorithm) else alg.net.policy.noise


def mlp_of(alg):
    return alg.actor.mlp if isinstance(alg, SacAlgorithm) else alg.net.policy.mlp


def time_step(step_type: list[int], obs: torch.Tensor | None = None) -> TimeStep:
    batch = len(step_type)
    return TimeStep(step_type=torch.tensor(step_type, dtype=torch.int8), reward=torch.zeros(batch),
                    discount=torch.ones(batch), observation=torch.full((batch, 2), 0.3) if obs is None else obs,
                    prev_action=torch.zeros(batch, 1), env_id=torch.arange(batch))


def redraws(alg, step_types: list[list[int]]) -> list[list[bool]]:
    """Drive ``rollout_step`` over 2 envs; per step after the first, whether each env's noise matrix changed."""
    changed, before = [], None
    for step_type in step_types:
        alg.rollout_step(time_step(step_type))
        matrices = sde_of(alg).matrices
        if before is not None:
            changed.append([not torch.equal(matrices[i], before[i]) for i in range(2)])
        before = matrices.clone()
    return changed


STEPS = [[FIRST, FIRST], [MID, MID], [MID, FIRST], [MID, MID], [MID, MID], [MID, MID], [MID, MID]]


@pytest.mark.parametrize("cls", [SacAlgorithm, PpoAlgorithm])
def test_the_noise_matrix_is_redrawn_every_sde_sample_freq_steps_and_at_episode_starts(cls):
    # sde_sample_freq 3: env 0 draws at steps 0, 3, 6; env 1 at 0, 2 (its episode starts), 5.
    assert redraws(make(cls, sde_sample_freq=3), STEPS) == [
        [False, False], [False, True], [True, False], [False, False], [False, True], [True, False]]
    # -1: only at an episode's start
    assert redraws(make(cls, sde_sample_freq=-1), STEPS) == [[False, False], [False, True]] + [[False, False]] * 4


@pytest.mark.parametrize("cls", [SacAlgorithm, PpoAlgorithm])
def test_a_training_iteration_redraws_every_envs_matrix(cls):
    alg = make(cls)
    alg.rollout_step(time_step([FIRST, FIRST]))
    before = sde_of(alg).matrices.clone()
    alg.after_train_iter()
    alg.rollout_step(time_step([MID, MID]))
    assert all(not torch.equal(sde_of(alg).matrices[i], before[i]) for i in range(2))


@pytest.mark.parametrize("cls", [SacAlgorithm, PpoAlgorithm])
def test_the_acting_matrices_round_trip_through_the_exploration_state(cls):
    # A checkpoint's collector state carries them, so a resumed run acts from the same matrices (the full exact
    # resume of a gSDE run: tests/integration/test_exact_resume.py, slow tier).
    alg, fresh = make(cls, sde_sample_freq=4), make(cls, sde_sample_freq=4)
    assert alg.exploration_state() is None  # nothing drawn yet
    for step_type in STEPS[:3]:
        alg.rollout_step(time_step(step_type))
    saved = alg.exploration_state()
    assert saved["matrices"].shape == (2, 2, 1) and saved["steps"].tolist() == [3, 1]  # env 1 restarted at step 2
    fresh.load_exploration_state({k: v.clone() for k, v in saved.items()})
    torch.manual_seed(7)
    acted = alg.rollout_step(time_step([MID, MID])).output
    torch.manual_seed(7)
    assert torch.equal(fresh.rollout_step(time_step([MID, MID])).output, acted)
    fresh.load_exploration_state(None)
    assert fresh.exploration_state() is None


def set_tiny_policy(alg) -> torch.Tensor:
    """Latent ``(0.5, 0.8)`` at the returned observation (identity first layer), mean ``0.5 - 0.8 + 0.2 = -0.1``,
    sigma ``(0.5, 2)``; the variance is ``0.25 * 0.25 + 0.64 * 4 = 2.6225`` (+ 1e-6)."""
    first, last = mlp_of(alg)[0], mlp_of(alg)[-1]
    with torch.no_grad():
        first.weight.copy_(torch.eye(2)), first.bias.zero_()
        last.weight.copy_(torch.tensor([[1.0, -1.0]])), last.bias.fill_(0.2)
        sde_of(alg).log_std.copy_(torch.log(torch.tensor([[0.5], [2.0]])))
    latent = torch.tensor([[0.5, 0.8]])
    return latent if isinstance(alg, SacAlgorithm) else torch.atanh(latent)  # SAC: relu, PPO: tanh


def gaussian(x: float, mean: float, variance: float) -> float:
    return -0.5 * (x - mean) ** 2 / variance - 0.5 * math.log(variance) - 0.5 * math.log(2 * math.pi)


VARIANCE, MEAN = 0.25 * 0.25 + 0.64 * 4.0 + 1e-6, -0.1


def test_ppo_log_prob_and_entropy_are_the_hand_computed_values():
    alg = make(PpoAlgorithm)
    obs = set_tiny_policy(alg)
    out = alg.net.evaluate(obs, torch.tensor([[0.7]]))
    assert out.log_prob.item() == pytest.approx(gaussian(0.7, MEAN, VARIANCE), rel=1e-5)
    assert out.entropy.item() == pytest.approx(0.5 * math.log(2 * math.pi * math.e * VARIANCE), rel=1e-5)


def test_sac_log_prob_has_the_tanh_correction():
    alg = make(SacAlgorithm)
    obs = set_tiny_policy(alg)
    action, log_prob = alg._sde_policy(obs, greedy=False, noise=torch.tensor([[0.3]]))
    u = MEAN + 0.3
    assert action.item() == pytest.approx(math.tanh(u), rel=1e-6)
    expected = gaussian(u, MEAN, VARIANCE) - math.log(1 - math.tanh(u) ** 2 + 1e-6)
    assert log_prob.item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("cls", [SacAlgorithm, PpoAlgorithm])
def test_exploration_is_state_dependent(cls):
    """One matrix for both envs: two observations get different noise, each ``latent(s) @ theta``."""
    alg = make(cls)
    obs = torch.tensor([[0.2, 0.9], [0.9, 0.1]])
    alg.rollout_step(time_step([FIRST, FIRST], obs))
    sde = sde_of(alg)
    theta = torch.tensor([[1.5], [-2.0]])
    sde.matrices = theta.expand(2, 2, 1).clone()
    action = alg.rollout_step(time_step([MID, MID], obs)).output
    mean, latent = (alg.actor if cls is SacAlgorithm else alg.net.policy)(obs)
    expected = mean + latent @ theta
    expected = alg.scale_action(torch.tanh(expected)) if cls is SacAlgorithm else expected
    assert torch.allclose(action, expected.detach(), atol=1e-6)
    noise = (latent @ theta).squeeze(-1)
    assert (noise[0] - noise[1]).abs() > 1e-3


@pytest.mark.parametrize("cls", [SacAlgorithm, PpoAlgorithm])
def test_the_greedy_action_ignores_the_noise(cls):
    alg = make(cls)
    obs = torch.tensor([[0.2, 0.9], [0.9, 0.1]])
    alg.rollout_step(time_step([FIRST, FIRST], obs))
    greedy = alg.predict_step(time_step([MID, MID], obs)).output
    sde_of(alg).matrices = torch.full_like(sde_of(alg).matrices, 100.0)
    assert torch.equal(alg.predict_step(time_step([MID, MID], obs)).output, greedy)
    mean = (alg.actor if cls is SacAlgorithm else alg.net.policy)(obs)[0]
    expected = alg.scale_action(torch.tanh(mean)) if cls is SacAlgorithm else mean
    assert torch.allclose(greedy, expected)
    assert not torch.allclose(alg.rollout_step(time_step([MID, MID], obs)).output, greedy)


@pytest.mark.parametrize("cls", [SacAlgorithm, PpoAlgorithm])
def test_gsde_needs_the_default_networks_over_flat_observations(cls):
    name = "actor_network_cls" if cls is SacAlgorithm else "actor_network_ctor"
    with pytest.raises(OneLineValueError, match="use_sde=True"):
        cls(OBS, BOX, use_sde=True, **{name: lambda space, dim: torch.nn.Linear(2, dim)})
    with pytest.raises(OneLineValueError, match="sde_sample_freq=0"):
        cls(OBS, BOX, use_sde=True, sde_sample_freq=0)


def test_ppo_gsde_refuses_a_shared_encoder():
    gin.parse_config("ActorCriticNetworks.encoding_network_ctor = @EncodingNetwork")
    try:
        with pytest.raises(OneLineValueError, match="unbind ActorCriticNetworks.encoding_network_ctor"):
            PpoAlgorithm(OBS, BOX, use_sde=True)
    finally:
        gin.clear_config()


COMMON = """
create_environment.env_name = 'alfish/PointGoal-v0'
TrainerConfig.random_seed = 3
TrainerConfig.evaluate = False
TrainerConfig.summary_interval = 1000
"""
SAC = COMMON + """
SacAlgorithm.hidden_sizes = (8,)
SacAlgorithm.use_sde = True
SacAlgorithm.sde_sample_freq = 2
TrainerConfig.algorithm_ctor = @SacAlgorithm
TrainerConfig.unroll_length = 1
TrainerConfig.initial_collect_steps = 5
TrainerConfig.whole_replay_buffer_training = False
TrainerConfig.replay_buffer_length = 32
TrainerConfig.mini_batch_size = 4
TrainerConfig.mini_batch_length = 2
TrainerConfig.num_checkpoints = 1
"""
PPO = COMMON + """
create_environment.num_parallel_environments = 2
PpoAlgorithm.hidden_sizes = (8,)
PpoAlgorithm.use_sde = True
PpoAlgorithm.sde_sample_freq = 4
TrainerConfig.algorithm_ctor = @PpoAlgorithm
TrainerConfig.num_iterations = 4
TrainerConfig.unroll_length = 8
TrainerConfig.replay_buffer_length = 9
TrainerConfig.mini_batch_size = 8
TrainerConfig.mini_batch_length = 1
TrainerConfig.num_updates_per_train_iter = 2
"""


def train(tmp_path, conf_text: str, params: list[str]):
    conf = tmp_path / "conf.gin"
    conf.write_text(conf_text)
    load_conf(str(conf), params)
    try:
        trainer = build_trainer(TrainerConfig(root_dir=str(tmp_path / "run")))
        assert trainer.run() == 0
    finally:
        gin.clear_config()
    return trainer


def test_sac_with_gsde_trains_checkpoints_and_resumes(tmp_path):
    first = train(tmp_path, SAC, ["TrainerConfig.num_iterations = 10"])
    log_std = first.algorithm.actor.noise.log_std.detach().clone()
    assert not torch.equal(log_std, torch.full_like(log_std, -3.0))  # sigma was trained
    ckpt = Checkpointer(str(tmp_path / "run" / "checkpoints")).load_latest()
    assert ckpt.step == 10
    resumed = train(tmp_path, SAC, ["TrainerConfig.num_iterations = 14"])
    assert resumed.resumed and resumed.counters.iteration == 14
    assert resumed.algorithm.updates_done > first.algorithm.updates_done


def test_ppo_with_gsde_trains(tmp_path):
    trainer = train(tmp_path, PPO, [])
    assert trainer.counters.iteration == 4
    log_std = trainer.algorithm.net.policy.noise.log_std
    assert torch.isfinite(log_std).all() and not torch.equal(log_std, torch.zeros_like(log_std))


def test_sac_trains_the_features_through_the_noise_and_ppo_does_not():
    # SB3: StateDependentNoiseDistribution(learn_features=True) in SAC's actor, False in ActorCriticPolicy
    assert sde_of(make(SacAlgorithm)).learn_features and not sde_of(make(PpoAlgorithm)).learn_features
