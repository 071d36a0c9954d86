"""IqlAlgorithm: the expectile loss, the critic's target ``r + gamma * discount * V(s')``, the value and actor terms and
the clipped advantage weights by hand (networks set to known functions); each loss term reaches only its own
parameters; target critics follow by tau; masking; acting; an update on ``meta`` (no host sync)."""
from __future__ import annotations

import math

import gymnasium as gym
import pytest
import torch
from torch import nn

from alfish.algorithms import IqlAlgorithm
from alfish.algorithms.iql import LOG_STD_MAX, LOG_STD_MIN, expectile_loss
from alfish.data.types import Experience, StepType, TimeStep
from alfish.learn.learner import Learner
from alfish.learn.optim import OptimizerConfig
from alfish.networks.ensemble import VmapEnsemble

M_, L_ = StepType.MID, StepType.LAST
GAMMA = 0.9
SPACE = gym.spaces.Box(-5.0, 5.0, shape=(1,))
ACTION = gym.spaces.Box(-2.0, 2.0, shape=(1,))


def params_reached(module: nn.Module, loss: torch.Tensor) -> set[str]:
    """Names of the parameters that get a non-zero gradient from ``loss`` alone."""
    module.zero_grad(set_to_none=True)
    loss.backward()
    reached = {name for name, p in module.named_parameters() if p.grad is not None and bool(p.grad.abs().sum() > 0)}
    module.zero_grad(set_to_none=True)
    return reached


def names(module: nn.Module, prefix: str) -> set[str]:
    found = {name for name, _ in module.named_parameters() if name.startswith(prefix)}
    assert found, f"no parameters under {prefix!r}"
    return found


def constant_ensemble(ensemble, values):
    """Every member outputs its constant, whatever the input: zero weights and hidden biases, output bias = value."""
    with torch.no_grad():
        for w in ensemble.weights:
            w.zero_()
        for b in ensemble.biases:
            b.zero_()
        ensemble.biases[-1].copy_(torch.tensor(values).view(-1, 1, 1))


def identity_for_positive_inputs(mlp: nn.Module) -> None:
    """Set a 1-input, 1-output MLP to ``relu(x)`` (``x`` for ``x >= 0``): one path through the first hidden unit."""
    with torch.no_grad():
        linears = [m for m in mlp if isinstance(m, nn.Linear)]
        for layer in linears:
            layer.weight.zero_()
            layer.bias.zero_()
            layer.weight[0, 0] = 1.0


def experience(obs, action, reward, discount, step_type) -> Experience:
    L, B = step_type.shape
    return Experience(step_type=step_type, reward=reward, discount=discount, observation=obs, action=action,
                      env_id=torch.arange(B).expand(L, B))


def time_step(obs: torch.Tensor) -> TimeStep:
    n = obs.shape[0]
    return TimeStep(torch.full((n,), M_, dtype=torch.int8), torch.zeros(n), torch.ones(n), obs, torch.zeros(n, 1),
                    torch.arange(n))


def random_batch(L=3, B=4, seed=1) -> Experience:
    gen = torch.Generator().manual_seed(seed)
    return experience(torch.randn(L, B, 1, generator=gen), torch.rand(L, B, 1, generator=gen) * 4.0 - 2.0,
                      torch.randn(L, B, generator=gen), torch.ones(L, B), torch.full((L, B), M_, dtype=torch.int8))


# ------------------------------------------------------------------------------------------------ by hand ---

def test_expectile_loss_by_hand():
    # tau = 0.7: a positive residual weighs 0.7, a negative one 0.3: 0.7 * 4, 0.3 * 1, 0.7 * 0.25
    loss = expectile_loss(torch.tensor([2.0, -1.0, 0.5]), 0.7)
    torch.testing.assert_close(loss, torch.tensor([2.8, 0.3, 0.175]))
    # 0.5 is half the squared error
    torch.testing.assert_close(expectile_loss(torch.tensor([2.0, -1.0]), 0.5), torch.tensor([2.0, 0.5]))


@pytest.fixture
def iql():
    """Critics output (1, 1.5), target critics (2, 3) -> min 2, whatever (s, a); V(s) = s for s >= 0;
    beta = 3, max_weight = 50."""
    torch.manual_seed(0)
    alg = IqlAlgorithm(SPACE, ACTION, hidden_sizes=(4,), gamma=GAMMA, weight_temp=3.0, max_weight=50.0)
    constant_ensemble(alg.critics, [1.0, 1.5])
    constant_ensemble(alg.target_critics, [2.0, 3.0])
    identity_for_positive_inputs(alg.value_net)
    return alg


def hand_batch() -> Experience:
    """``[L=2, B=3]``: s = (0.5, 3, 2), s' = (1, 2, 3), r = (1, 0.5, 2); env 0 MID -> MID, env 1 MID -> LAST by a
    time limit (discount 1), env 2 MID -> LAST by termination (discount 0)."""
    obs = torch.tensor([[0.5, 3.0, 2.0], [1.0, 2.0, 3.0]]).unsqueeze(-1)
    action = torch.tensor([[1.0, -0.5, 0.0], [0.0, 0.0, 0.0]]).unsqueeze(-1)
    reward = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.5, 2.0]])
    discount = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    step_type = torch.tensor([[M_, M_, M_], [M_, L_, L_]], dtype=torch.int8)
    return experience(obs, action, reward, discount, step_type)


def test_critic_target_is_reward_plus_discounted_value_of_the_next_state(iql):
    info = iql.train_step(hand_batch()).info
    # r + gamma * discount * V(s'): 1 + 0.9 * 1 = 1.9; truncated: 0.5 + 0.9 * 2 = 2.3; terminated: 2 (reward alone)
    target = torch.tensor([1.9, 2.3, 2.0])
    q = torch.tensor([[1.0], [1.5]])
    torch.testing.assert_close(info.critic_loss, 0.5 * ((q - target) ** 2).sum(0))
    torch.testing.assert_close(info.td_error, (q - target).abs().mean(0))
    # by hand for env 0: 0.5 * (0.81 + 0.16) = 0.485
    assert info.critic_loss[0].item() == pytest.approx(0.485)
    loss_info = iql.calc_loss(hand_batch(), info)
    torch.testing.assert_close(loss_info.priority, (q - target).abs().mean(0))  # one transition per sequence


def test_value_and_actor_terms_and_the_clipped_weights_by_hand(iql):
    info = iql.train_step(hand_batch()).info
    # u = min Q_target(s, a) - V(s) = 2 - (0.5, 3, 2) = (1.5, -1, 0)
    advantage = torch.tensor([1.5, -1.0, 0.0])
    torch.testing.assert_close(info.advantage, advantage)
    torch.testing.assert_close(info.value_loss, torch.tensor([0.7 * 2.25, 0.3 * 1.0, 0.0]))
    # exp(3 u) = (exp(4.5) = 90.0 -> clipped to 50, exp(-3), 1)
    torch.testing.assert_close(info.weight, torch.tensor([50.0, math.exp(-3.0), 1.0]))
    # the actor: N(tanh(actor(s)), exp(log_std)) at the unit action a / 2, log_std = -5 + 7 sigmoid(0) = -1.5
    with torch.no_grad():
        mean = torch.tanh(iql.actor(torch.tensor([[0.5], [3.0], [2.0]])))
    std = torch.full_like(mean, math.exp(-1.5))
    unit = torch.tensor([[0.5], [-0.25], [0.0]])
    log_prob = torch.distributions.Normal(mean, std).log_prob(unit).sum(-1)
    torch.testing.assert_close(info.actor_loss, -info.weight * log_prob)
    extra = iql.calc_loss(hand_batch(), info).extra()
    torch.testing.assert_close(extra["advantage"], advantage.mean())
    torch.testing.assert_close(extra["weight"], info.weight.mean())
    torch.testing.assert_close(extra["value_loss"], info.value_loss.mean())


def test_weights_are_clipped_at_max_weight_without_overflow():
    alg = IqlAlgorithm(SPACE, ACTION, hidden_sizes=(4,), weight_temp=10.0, max_weight=100.0)
    constant_ensemble(alg.target_critics, [1000.0, 2000.0])  # advantage ~1000: exp(10 * 1000) is inf in float32
    info = alg.train_step(random_batch()).info
    torch.testing.assert_close(info.weight, torch.full_like(info.weight, 100.0))
    assert bool(torch.isfinite(info.actor_loss).all())


# ---------------------------------------------------------------------------------------------- isolation ---

@pytest.mark.parametrize("term, prefixes", [("value_loss", ("value_net.",)), ("critic_loss", ("critics.",)),
                                            ("actor_loss", ("actor.", "actor_log_std"))])
def test_each_loss_term_reaches_only_its_parameters(term, prefixes):
    torch.manual_seed(0)
    alg = IqlAlgorithm(SPACE, ACTION, hidden_sizes=(16, 16))
    loss = getattr(alg.train_step(random_batch()).info, term)
    assert loss.shape == (2 * 4,)  # one per transition
    assert params_reached(alg, loss.sum()) == set().union(*(names(alg, p) for p in prefixes))


def test_target_critics_never_get_gradients():
    torch.manual_seed(0)
    alg = IqlAlgorithm(SPACE, ACTION, hidden_sizes=(16, 16))
    exp = random_batch()
    alg.calc_loss(exp, alg.train_step(exp).info).loss.sum().backward()
    assert all(p.grad is None for p in alg.target_critics.parameters())
    reached = {n for n, p in alg.named_parameters() if p.grad is not None and bool(p.grad.abs().sum() > 0)}
    assert reached == names(alg, "critics.") | names(alg, "actor.") | names(alg, "value_net.") | {"actor_log_std"}


def test_param_groups_cover_the_trained_parameters_once():
    alg = IqlAlgorithm(SPACE, ACTION, hidden_sizes=(8,), actor_lr=1e-4, critic_lr=2e-4, value_lr=5e-4)
    groups = {g["name"]: g for g in alg.param_groups()}
    assert {k: g["lr"] for k, g in groups.items()} == dict(actor=1e-4, critic=2e-4, value=5e-4)
    by_name = {id(p): n for n, p in alg.named_parameters()}
    assert {by_name[id(p)] for p in groups["actor"]["params"]} == names(alg, "actor.") | {"actor_log_std"}
    assert {by_name[id(p)] for p in groups["critic"]["params"]} == names(alg, "critics.")
    assert {by_name[id(p)] for p in groups["value"]["params"]} == names(alg, "value_net.")
    defaults = IqlAlgorithm(SPACE, ACTION)  # d3rlpy 2.x's IQLConfig
    assert (defaults.gamma, defaults.tau(), defaults.expectile, defaults.weight_temp) == (0.99, 0.005, 0.7, 3.0)
    assert defaults.log_max_weight == pytest.approx(math.log(100.0))
    assert {g["name"]: g["lr"] for g in defaults.param_groups()} == dict(actor=3e-4, critic=3e-4, value=3e-4)


def test_target_critics_move_towards_critics_by_tau():
    alg = IqlAlgorithm(SPACE, ACTION, hidden_sizes=(8,), target_update_tau=0.1)
    with torch.no_grad():
        for p in alg.critics.parameters():
            p.fill_(1.0)
        for p in alg.target_critics.parameters():
            p.fill_(0.0)
    alg.after_update()  # 0 + 0.1 * (1 - 0) = 0.1
    for p in alg.target_critics.parameters():
        torch.testing.assert_close(p, torch.full_like(p, 0.1))
    alg.after_update()  # 0.1 + 0.1 * (1 - 0.1) = 0.19
    for p in alg.target_critics.parameters():
        torch.testing.assert_close(p, torch.full_like(p, 0.19))
    for p in alg.critics.parameters():
        torch.testing.assert_close(p, torch.ones_like(p))
    assert alg.updates_done == 2


def test_the_transition_out_of_a_last_step_is_masked():
    torch.manual_seed(0)
    alg = IqlAlgorithm(SPACE, ACTION, hidden_sizes=(8,))
    exp = random_batch()
    step_type = exp.step_type.clone()
    step_type[1, 2] = L_
    exp = exp._replace(step_type=step_type)
    loss_info = alg.calc_loss(exp, alg.train_step(exp).info)
    loss = loss_info.loss.detach()
    assert loss.shape == (2, 4)
    assert float(loss[1, 2]) == 0.0
    assert bool((loss[0] != 0).all()) and bool((loss[1, [0, 1, 3]] != 0).all())
    assert loss_info.priority.shape == (4,)


# ------------------------------------------------------------------------------------------------- acting ---

def test_predict_is_the_mean_and_rollout_samples_within_the_bounds():
    torch.manual_seed(0)
    alg = IqlAlgorithm(SPACE, ACTION, hidden_sizes=(8,))
    obs = torch.randn(256, 1) * 3
    with torch.no_grad():
        mean = alg.scale_action(torch.tanh(alg.actor(obs)))
        alg.actor_log_std.fill_(10.0)  # log_std -> LOG_STD_MAX: wide samples, often clipped to the bounds
    torch.testing.assert_close(alg.predict_step(time_step(obs)).output, mean)
    sampled = alg.rollout_step(time_step(obs)).output
    assert bool(((sampled >= -2.0) & (sampled <= 2.0)).all())
    assert bool((sampled.abs() == 2.0).any()) and not torch.allclose(sampled, mean)
    assert LOG_STD_MIN < -1.5 < LOG_STD_MAX  # the initial log-std lies inside the range
    assert IqlAlgorithm.rollout_module_names == ("actor", "actor_log_std")


def test_discrete_actions_are_refused():
    with pytest.raises(ValueError, match="needs a Box action space"):
        IqlAlgorithm(SPACE, gym.spaces.Discrete(3))
    with pytest.raises(ValueError, match="expectile=1.0 must be in"):
        IqlAlgorithm(SPACE, ACTION, expectile=1.0)


# ------------------------------------------------------------------------------------ devices and networks ---

def test_learner_update_on_meta():
    """The Learner's update path with prioritized-replay weights on ``meta``: no host sync."""
    from alfish.data.types import BatchInfo

    meta = torch.device("meta")
    torch.manual_seed(0)
    alg = IqlAlgorithm(SPACE, ACTION, hidden_sizes=(8,)).to(meta)
    learner = Learner(alg, OptimizerConfig(fused=False), device=meta, finite_check_interval=10**9)
    shape = (3, 4)
    exp = Experience(step_type=torch.full(shape, M_, dtype=torch.int8, device=meta),
                     reward=torch.empty(shape, device=meta), discount=torch.ones(shape, device=meta),
                     observation=torch.empty(shape + (1,), device=meta), action=torch.empty(shape + (1,), device=meta),
                     env_id=torch.zeros(shape, dtype=torch.int64, device=meta))
    info = BatchInfo(env_ids=torch.arange(4, device=meta), positions=torch.zeros(4, dtype=torch.int64, device=meta),
                     importance_weights=torch.rand(4, device=meta))
    for _ in range(2):
        loss_info = learner.update(exp, info)
    assert loss_info.loss.shape == (2, 4) and loss_info.priority.shape == (4,)
    assert all(v.device == meta and v.dim() == 0 for v in loss_info.extra().values())
    assert alg.updates_done == 2 and all(p.device == meta for p in alg.parameters())


class UserCritic(nn.Module):
    def __init__(self, observation_space, action_dim):
        super().__init__()
        self.layer = nn.Linear(observation_space.shape[0] + action_dim, 1)

    def forward(self, obs, action):
        return self.layer(torch.cat([obs, action], -1))


class UserNet(nn.Module):
    def __init__(self, observation_space, output_dim):
        super().__init__()
        self.layer = nn.Linear(observation_space.shape[0], output_dim)

    def forward(self, obs):
        return self.layer(obs)


def test_user_networks_are_built_with_the_space_and_output_size():
    alg = IqlAlgorithm(SPACE, ACTION, actor_network_cls=UserNet, critic_network_cls=UserCritic,
                       value_network_cls=UserNet, num_critics=3)
    assert isinstance(alg.critics, VmapEnsemble) and alg.critics.num_members == 3
    assert alg.actor.layer.out_features == 1 and alg.value_net.layer.out_features == 1
    exp = random_batch()
    alg.calc_loss(exp, alg.train_step(exp).info).loss.sum().backward()
    assert all(p.grad is not None for p in alg.parameters() if p.requires_grad)
    assert all(p.grad is None for p in alg.target_critics.parameters())
