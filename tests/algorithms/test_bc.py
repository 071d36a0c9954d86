"""BcAlgorithm: the three losses by hand (squared error, tanh-Gaussian NLL against torch.distributions, cross-entropy),
masking of the transition out of a LAST step, actions within the env's bounds, an update on ``meta`` (no host sync),
and cloning the toy envs' experts with the Learner."""
from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from alfish.algorithms import BcAlgorithm
from alfish.data.types import Experience, StepType, TimeStep
from alfish.envs.toy import Chain
from alfish.learn.learner import Learner
from alfish.learn.optim import OptimizerConfig

M_, L_ = StepType.MID, StepType.LAST
# Two action dims with different bounds: unit = a / 2 on the first, 2 a - 1 on the second.
BOX = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))
OBS2 = gym.spaces.Box(-5.0, 5.0, shape=(2,))
DISCRETE = gym.spaces.Discrete(2)


class ScaledIdentity(nn.Module):
    """``obs -> obs * scale`` (scale starts at 1): an actor whose output is known by hand."""

    def __init__(self, observation_space: gym.Space, output_dim: int):
        super().__init__()
        assert observation_space.shape == (output_dim,)
        self.scale = nn.Parameter(torch.ones(output_dim))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return obs * self.scale


def experience(obs, action, step_type) -> Experience:
    """``[L, B]`` experience; reward and discount are not read by BC."""
    L, B = step_type.shape
    return Experience(step_type=step_type, reward=torch.zeros(L, B), discount=torch.ones(L, B), observation=obs,
                      action=action, env_id=torch.arange(B).expand(L, B))


def time_step(obs: torch.Tensor) -> TimeStep:
    n = obs.shape[0]
    return TimeStep(torch.full((n,), M_, dtype=torch.int8), torch.zeros(n), torch.ones(n), obs, torch.zeros(n),
                    torch.arange(n))


# --------------------------------------------------------------------------------------------- deterministic ---

def test_deterministic_loss_is_the_squared_error_to_the_unscaled_action_summed_over_dims():
    bc = BcAlgorithm(OBS2, BOX, actor_network_cls=ScaledIdentity)
    # Actor output atanh(u): the unit action is u. Columns: u = (0.5, -0.5) vs a = (1, 0.5) -> unit (0.5, 0)
    # -> 0 + 0.25; u = (0, 0.8) vs a = (-2, 1) -> unit (-1, 1) -> 1 + 0.04. Row 1 only bootstraps (not read).
    u = torch.tensor([[[0.5, -0.5], [0.0, 0.8]], [[0.9, 0.9], [0.9, 0.9]]])
    action = torch.tensor([[[1.0, 0.5], [-2.0, 1.0]], [[0.0, 0.0], [0.0, 0.0]]])
    exp = experience(torch.atanh(u), action, torch.full((2, 2), M_, dtype=torch.int8))
    info = bc.train_step(exp).info
    torch.testing.assert_close(info.loss, torch.tensor([0.25, 1.04]))
    loss_info = bc.calc_loss(exp, info)
    assert loss_info.loss.shape == (1, 2)
    torch.testing.assert_close(loss_info.extra()["bc_loss"], torch.tensor(0.645))
    # d/d scale of sum (tanh(scale * x) - t)^2 = sum 2 (tanh(x) - t) (1 - tanh(x)^2) x, at scale 1
    loss_info.loss.sum().backward()
    x, t = torch.atanh(u[0]), torch.tensor([[0.5, 0.0], [-1.0, 1.0]])
    torch.testing.assert_close(bc.actor.scale.grad, (2 * (u[0] - t) * (1 - u[0] ** 2) * x).sum(0))


def test_the_transition_out_of_a_last_step_is_masked():
    bc = BcAlgorithm(OBS2, BOX, hidden_sizes=(8,))
    gen = torch.Generator().manual_seed(0)
    step_type = torch.full((3, 4), M_, dtype=torch.int8)
    step_type[1, 2] = L_  # its action is the placeholder the env ignored
    exp = experience(torch.randn(3, 4, 2, generator=gen), torch.rand(3, 4, 2, generator=gen), step_type)
    info = bc.train_step(exp).info
    loss_info = bc.calc_loss(exp, info)
    loss = loss_info.loss.detach()
    assert loss.shape == (2, 4)
    assert float(loss[1, 2]) == 0.0
    assert bool((loss[0] != 0).all()) and bool((loss[1, [0, 1, 3]] != 0).all())
    # the summary is the mean over the 7 real transitions: all but the 7th of the 8 (row 1, column 2)
    real = torch.ones(8)
    real[6] = 0.0
    torch.testing.assert_close(loss_info.extra()["bc_loss"], (info.loss.detach() * real).sum() / 7)


def test_sequences_need_two_steps():
    bc = BcAlgorithm(OBS2, BOX, hidden_sizes=(8,))
    exp = experience(torch.zeros(1, 3, 2), torch.zeros(1, 3, 2), torch.full((1, 3), M_, dtype=torch.int8))
    with pytest.raises(ValueError, match="mini_batch_length = 2"):
        bc.train_step(exp)


def test_predict_and_rollout_give_the_tanh_action_scaled_to_the_bounds():
    bc = BcAlgorithm(OBS2, BOX, actor_network_cls=ScaledIdentity)
    obs = torch.tensor([[0.0, 0.0], [100.0, -100.0], [-100.0, 100.0], [math.atanh(0.5), math.atanh(-0.5)]])
    expected = torch.tensor([[0.0, 0.5], [2.0, 0.0], [-2.0, 1.0], [1.0, 0.25]])  # low + (u + 1) (high - low) / 2
    for step in (bc.predict_step(time_step(obs)), bc.predict_step(time_step(obs), epsilon_greedy=1.0),
                 bc.rollout_step(time_step(obs))):
        torch.testing.assert_close(step.output, expected)


# -------------------------------------------------------------------------------------------------- gaussian ---

def test_gaussian_nll_matches_torch_distributions():
    torch.manual_seed(0)
    bc = BcAlgorithm(OBS2, BOX, hidden_sizes=(16,), policy="gaussian")
    gen = torch.Generator().manual_seed(1)
    obs = torch.randn(2, 5, 2, generator=gen)
    unit = torch.rand(2, 5, 2, generator=gen) * 1.8 - 0.9                      # inside (-1, 1)
    action = bc.scale_action(unit)
    info = bc.train_step(experience(obs, action, torch.full((2, 5), M_, dtype=torch.int8))).info
    with torch.no_grad():
        mean, log_std = bc.actor(obs[0]).chunk(2, -1)
    dist = torch.distributions.TransformedDistribution(torch.distributions.Normal(mean, log_std.clamp(-20, 2).exp()),
                                                       torch.distributions.transforms.TanhTransform())
    torch.testing.assert_close(info.loss.detach(), -dist.log_prob(unit[0]).sum(-1), rtol=1e-5, atol=1e-4)


def test_gaussian_nll_of_an_action_on_the_bound_is_finite():
    bc = BcAlgorithm(OBS2, BOX, hidden_sizes=(8,), policy="gaussian")
    action = torch.tensor([[[2.0, 0.0], [-2.0, 1.0]]]).expand(2, 2, 2)          # the box's corners
    exp = experience(torch.zeros(2, 2, 2), action, torch.full((2, 2), M_, dtype=torch.int8))
    loss = bc.calc_loss(exp, bc.train_step(exp).info).loss
    loss.sum().backward()
    assert bool(torch.isfinite(loss).all())
    assert all(bool(torch.isfinite(p.grad).all()) for p in bc.actor.parameters())


def test_gaussian_predicts_the_mean_and_samples_within_the_bounds_in_rollout():
    torch.manual_seed(0)
    bc = BcAlgorithm(OBS2, BOX, hidden_sizes=(8,), policy="gaussian")
    obs = torch.randn(64, 2) * 3
    with torch.no_grad():
        mean = bc.actor(obs).chunk(2, -1)[0]
    torch.testing.assert_close(bc.predict_step(time_step(obs)).output, bc.scale_action(torch.tanh(mean)))
    sampled = bc.rollout_step(time_step(obs)).output
    low, high = torch.as_tensor(BOX.low), torch.as_tensor(BOX.high)
    assert bool(((sampled >= low) & (sampled <= high)).all())
    assert not torch.allclose(sampled, bc.scale_action(torch.tanh(mean)))


# -------------------------------------------------------------------------------------------------- discrete ---

def test_discrete_loss_is_the_cross_entropy_and_accuracy_counts_real_transitions():
    bc = BcAlgorithm(OBS2, DISCRETE, actor_network_cls=ScaledIdentity)
    # logits (0, ln 3): probabilities (1/4, 3/4) -> -log p = ln 4 for action 0, ln(4/3) for action 1.
    logits = torch.tensor([0.0, math.log(3.0)]).expand(2, 3, 2)
    step_type = torch.tensor([[M_, M_, L_], [M_, M_, M_]], dtype=torch.int8)
    exp = experience(logits, torch.tensor([[0, 1, 0], [0, 0, 0]]), step_type)
    info = bc.train_step(exp).info
    torch.testing.assert_close(info.loss, torch.tensor([math.log(4.0), math.log(4.0 / 3.0), math.log(4.0)]))
    loss_info = bc.calc_loss(exp, info)
    torch.testing.assert_close(loss_info.loss, torch.tensor([[math.log(4.0), math.log(4.0 / 3.0), 0.0]]))
    extra = loss_info.extra()
    torch.testing.assert_close(extra["accuracy"], torch.tensor(0.5))           # argmax 1: right on one of two
    torch.testing.assert_close(extra["bc_loss"], torch.tensor(0.5 * (math.log(4.0) + math.log(4.0 / 3.0))))


def test_discrete_predicts_the_argmax_honours_epsilon_and_samples_in_rollout():
    bc = BcAlgorithm(OBS2, DISCRETE, actor_network_cls=ScaledIdentity)
    obs = torch.tensor([[0.0, 1.0], [1.0, 0.0]]).repeat(200, 1)                # argmax 1, 0, 1, 0, ...
    assert bc.predict_step(time_step(obs)).output.tolist() == [1, 0] * 200
    torch.manual_seed(0)
    random = bc.predict_step(time_step(obs), epsilon_greedy=1.0).output
    assert set(random.tolist()) == {0, 1} and 100 < int((random == 1).sum()) < 300   # uniform, not the argmax
    sampled = bc.rollout_step(time_step(torch.tensor([[0.0, math.log(3.0)]]).expand(4000, 2))).output
    assert abs(float((sampled == 1).float().mean()) - 0.75) < 0.03            # softmax (1/4, 3/4)


def test_a_gaussian_policy_for_discrete_actions_is_refused():
    with pytest.raises(ValueError, match="applies to Box actions"):
        BcAlgorithm(OBS2, DISCRETE, policy="gaussian")
    with pytest.raises(ValueError, match="must be one of"):
        BcAlgorithm(OBS2, BOX, policy="stochastic")


# ---------------------------------------------------------------------------------------------- the contract ---

def test_param_groups_and_rollout_modules():
    bc = BcAlgorithm(OBS2, BOX, hidden_sizes=(8,), lr=5e-4)
    (group,) = bc.param_groups()
    assert group["name"] == "actor" and group["lr"] == 5e-4
    assert {id(p) for p in group["params"]} == {id(p) for p in bc.parameters()}
    assert BcAlgorithm.rollout_module_names == ("actor",)
    assert BcAlgorithm(OBS2, BOX).lr == 1e-3  # d3rlpy's BC learning rate


@pytest.mark.parametrize("action_space, policy", [(BOX, "deterministic"), (BOX, "gaussian"),
                                                  (DISCRETE, "deterministic")])
def test_learner_update_on_meta(action_space, policy):
    """The Learner's update path on ``meta``: no host sync, every tensor where its inputs live."""
    meta = torch.device("meta")
    torch.manual_seed(0)
    bc = BcAlgorithm(OBS2, action_space, hidden_sizes=(8,), policy=policy).to(meta)
    learner = Learner(bc, OptimizerConfig(fused=False), device=meta, finite_check_interval=10**9)
    shape = (3, 4)
    action = (torch.empty(shape, dtype=torch.int64, device=meta) if action_space is DISCRETE
              else torch.empty(shape + (2,), device=meta))
    exp = Experience(step_type=torch.full(shape, M_, dtype=torch.int8, device=meta),
                     reward=torch.empty(shape, device=meta), discount=torch.ones(shape, device=meta),
                     observation=torch.empty(shape + (2,), device=meta), action=action,
                     env_id=torch.zeros(shape, dtype=torch.int64, device=meta))
    loss_info = learner.update(exp)
    assert loss_info.loss.shape == (2, 4) and loss_info.loss.device == meta
    assert all(v.device == meta and v.dim() == 0 for v in loss_info.extra().values())
    assert all(p.device == meta for p in bc.parameters())


def test_image_observations_reach_a_users_actor_raw():
    image = gym.spaces.Box(0, 255, (1, 4, 4), np.uint8)

    class ImageActor(nn.Module):
        def __init__(self, observation_space, output_dim):
            super().__init__()
            self.layer = nn.Linear(16, output_dim)

        def forward(self, obs):
            assert obs.dtype == torch.uint8 and obs.shape[1:] == (1, 4, 4)
            return self.layer(obs.flatten(1).float() / 255.0)

    bc = BcAlgorithm(image, DISCRETE, actor_network_cls=ImageActor)
    obs = torch.randint(0, 256, (2, 3, 1, 4, 4), dtype=torch.uint8)
    exp = experience(obs, torch.zeros(2, 3, dtype=torch.int64), torch.full((2, 3), M_, dtype=torch.int8))
    bc.calc_loss(exp, bc.train_step(exp).info).loss.sum().backward()
    assert bc.actor.layer.weight.grad is not None
    assert bc.predict_step(time_step(obs[0])).output.shape == (3,)


# ------------------------------------------------------------------------------------- cloning toy experts ---

def fit(bc: BcAlgorithm, exp: Experience, updates: int) -> None:
    learner = Learner(bc)
    for _ in range(updates):
        learner.update(exp)


def test_clones_the_point_goal_expert():
    """64 transitions of PointGoal's expert ``a = clip(-x / 0.25, -1, 1)``; 8 more columns repeat states of the first
    8 but start at a LAST step, with the opposite action as placeholder: were they not masked, those states would be
    fit to about 0. Full-batch updates; the states within 0.01 of the expert's kinks at +-0.25 take the most
    (about 2,000 of them bring every state within 0.05 for any of 8 seeds; 0.6 s)."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(64, generator=gen) * 3.0 - 1.5                              # inside the observation box
    expert = (-x / 0.25).clamp(-1.0, 1.0)
    x_next = (x + 0.25 * expert).clamp(-2.0, 2.0)
    obs = torch.stack([torch.cat([x, x[:8]]), torch.cat([x_next, x_next[:8]])]).unsqueeze(-1)     # [2, 72, 1]
    action = torch.stack([torch.cat([expert, -expert[:8]]), torch.zeros(72)]).unsqueeze(-1)
    step_type = torch.full((2, 72), M_, dtype=torch.int8)
    step_type[0, 64:] = L_
    space = gym.spaces.Box(-2.0, 2.0, shape=(1,))
    bc = BcAlgorithm(space, gym.spaces.Box(-1.0, 1.0, shape=(1,)), hidden_sizes=(64, 64), lr=3e-3)
    fit(bc, experience(obs, action, step_type), updates=2500)
    with torch.no_grad():
        predicted = bc.predict_step(time_step(x.unsqueeze(-1))).output.squeeze(-1)
    assert float((predicted - expert).abs().max()) < 0.05


def test_clones_the_chain_expert():
    """Chain's expert always moves right (action 1). 24 columns start at a LAST step in cell 2 with the placeholder
    action 0, more than cell 2's 16 real transitions: were they not masked, cell 2 would go left."""
    torch.manual_seed(0)
    cells = torch.cat([torch.arange(4).repeat(16), torch.full((24,), 2)])    # 64 real + 24 LAST
    eye = torch.eye(Chain.N)
    obs = torch.stack([eye[cells], eye[(cells + 1).clamp(max=Chain.N - 1)]])   # [2, 88, 5]
    action = torch.stack([torch.cat([torch.ones(64), torch.zeros(24)]), torch.ones(88)]).long()
    step_type = torch.full((2, 88), M_, dtype=torch.int8)
    step_type[0, 64:] = L_
    env = Chain()
    bc = BcAlgorithm(env.observation_space, env.action_space, hidden_sizes=(32, 32))
    fit(bc, experience(obs, action, step_type), updates=100)
    assert bc.predict_step(time_step(eye[:4])).output.tolist() == [1, 1, 1, 1]
