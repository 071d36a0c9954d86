"""Each loss term, back-propagated alone, reaches exactly the parameters it is meant to train (DESIGN.md §3.2).

SAC: critic loss -> critics only; actor loss -> actor only (the critics are read through detached weights); alpha
loss -> log_alpha only; target critics never get gradients and move by exactly tau in after_update.
PPO / A2C: policy term -> the policy net (and log_std for Gaussian policies); value term -> the value net; entropy ->
the policy (only log_std for a state-independent Gaussian).
"""
import gymnasium as gym
import pytest
import torch

from alfish.algorithms.a2c import A2cAlgorithm
from alfish.algorithms.ppo import PpoAlgorithm, PpoExperienceInfo
from alfish.algorithms.sac import SacAlgorithm
from alfish.collect.episode_stats import EpisodeStats
from alfish.collect.unroller import Unroller
from alfish.data.types import Experience, StepType
from alfish.envs.batched_env import BatchedEnv

L_, B_ = 3, 4  # time-major [L, B] batches built by hand


def spaces(env_id):
    env = gym.make(env_id)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def hand_experience(obs_dim, action, gen, rollout_info=()):
    """A time-major Experience [L, B] of MID steps with random observations and rewards."""
    return Experience(
        step_type=torch.full((L_, B_), StepType.MID, dtype=torch.int8),
        reward=torch.randn(L_, B_, generator=gen),
        discount=torch.ones(L_, B_),
        observation=torch.randn(L_, B_, obs_dim, generator=gen),
        action=action,
        env_id=torch.arange(B_).expand(L_, B_),
        rollout_info=rollout_info,
    )


def params_reached(module: torch.nn.Module, loss: torch.Tensor, retain_graph: bool = False) -> set[str]:
    """Names of the parameters that get a non-zero gradient from ``loss`` alone."""
    module.zero_grad(set_to_none=True)
    loss.backward(retain_graph=retain_graph)
    reached = {name for name, p in module.named_parameters() if p.grad is not None and bool(p.grad.abs().sum() > 0)}
    module.zero_grad(set_to_none=True)
    return reached


def names(module, prefix):
    found = {name for name, _ in module.named_parameters() if name.startswith(prefix)}
    assert found, f"no parameters under {prefix!r}"
    return found


# ---------------------------------------------------------------------------------------------------------- SAC ---

@pytest.fixture
def sac_and_exp():
    torch.manual_seed(0)
    obs_space, act_space = spaces("Pendulum-v1")
    sac = SacAlgorithm(obs_space, act_space, hidden_sizes=(32, 32))
    gen = torch.Generator().manual_seed(1)
    action = torch.rand(L_, B_, 1, generator=gen) * 4.0 - 2.0  # inside Pendulum's [-2, 2]
    return sac, hand_experience(3, action, gen)


@pytest.mark.parametrize("term, prefix", [("critic_loss", "critics."), ("actor_loss", "actor."),
                                          ("alpha_loss", "log_alpha")])
def test_sac_each_loss_reaches_only_its_parameters(sac_and_exp, term, prefix):
    sac, exp = sac_and_exp
    info = sac.train_step(exp).info
    loss = getattr(info, term)
    assert loss.shape == ((L_ - 1) * B_,)  # one per transition
    assert params_reached(sac, loss.sum()) == names(sac, prefix)


def test_sac_target_critics_never_get_gradients(sac_and_exp):
    sac, exp = sac_and_exp
    info = sac.train_step(exp).info
    sac.calc_loss(exp, info).loss.sum().backward()
    assert all(p.grad is None for p in sac.target_critics.parameters())
    reached = {n for n, p in sac.named_parameters() if p.grad is not None and bool(p.grad.abs().sum() > 0)}
    assert reached == names(sac, "critics.") | names(sac, "actor.") | {"log_alpha"}


def test_sac_transition_out_of_a_last_step_is_masked(sac_and_exp):
    sac, exp = sac_and_exp
    st = exp.step_type.clone()
    st[1, 2] = StepType.LAST  # row 1 of column 2 is LAST: the transition 1 -> 2 there is the autoreset, not real
    exp = exp._replace(step_type=st)
    loss = sac.calc_loss(exp, sac.train_step(exp).info).loss
    assert loss.shape == (L_ - 1, B_)
    loss = loss.detach()
    assert float(loss[1, 2]) == 0.0
    assert bool((loss[0] != 0).all()) and bool((loss[1, [0, 1, 3]] != 0).all())


def test_sac_target_critics_move_towards_critics_by_tau():
    obs_space, act_space = spaces("Pendulum-v1")
    sac = SacAlgorithm(obs_space, act_space, hidden_sizes=(8,), target_update_tau=0.1)
    with torch.no_grad():
        for p in sac.critics.parameters():
            p.fill_(1.0)
        for p in sac.target_critics.parameters():
            p.fill_(0.0)
    sac.after_update()
    # new = old + tau * (critic - old) = 0 + 0.1 * (1 - 0) = 0.1
    for p in sac.target_critics.parameters():
        torch.testing.assert_close(p, torch.full_like(p, 0.1))
    sac.after_update()
    # 0.1 + 0.1 * (1 - 0.1) = 0.19
    for p in sac.target_critics.parameters():
        torch.testing.assert_close(p, torch.full_like(p, 0.19))
    for p in sac.critics.parameters():  # the critics themselves are untouched
        torch.testing.assert_close(p, torch.ones_like(p))


def test_sac_target_update_period_two_updates_every_second_call():
    obs_space, act_space = spaces("Pendulum-v1")
    sac = SacAlgorithm(obs_space, act_space, hidden_sizes=(8,), target_update_tau=0.5, target_update_period=2)
    with torch.no_grad():
        for p in sac.critics.parameters():
            p.fill_(2.0)
        for p in sac.target_critics.parameters():
            p.fill_(0.0)
    sac.after_update()  # update 1: not due
    assert all(bool((p == 0).all()) for p in sac.target_critics.parameters())
    sac.after_update()  # update 2: 0 + 0.5 * (2 - 0) = 1
    for p in sac.target_critics.parameters():
        torch.testing.assert_close(p, torch.ones_like(p))


# ---------------------------------------------------------------------------------------------------------- PPO ---

def ppo_batch(env_id):
    """PpoAlgorithm for ``env_id``'s spaces and a hand-built [L, B] batch in preprocess_experience's output format.

    The stored log-probs are the current policy's, so the ratio is 1 (inside the clip range: the clipped surrogate
    passes gradients)."""
    torch.manual_seed(0)
    obs_space, act_space = spaces(env_id)
    ppo = PpoAlgorithm(obs_space, act_space, hidden_sizes=(16, 16))
    gen = torch.Generator().manual_seed(2)
    obs_dim = obs_space.shape[0]
    if ppo.discrete:
        action = torch.randint(0, act_space.n, (L_, B_), generator=gen)
    else:
        action = torch.randn(L_, B_, act_space.shape[0], generator=gen)
    exp = hand_experience(obs_dim, action, gen)
    with torch.no_grad():
        log_prob = ppo.train_step(exp).info.log_prob.view(L_, B_)
    info = PpoExperienceInfo(log_prob=log_prob, value=torch.randn(L_, B_, generator=gen),
                             advantage=torch.randn(L_, B_, generator=gen),
                             value_target=torch.randn(L_, B_, generator=gen))
    return ppo, exp._replace(rollout_info=info)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_ppo_each_loss_term_reaches_only_its_parameters(env_id):
    ppo, exp = ppo_batch(env_id)
    policy = names(ppo, "net.policy.")
    value = names(ppo, "net.value_net.")
    if ppo.discrete:
        expected = dict(policy_loss=policy, value_loss=value, entropy=policy)
    else:
        log_std = {"net.log_std"}
        # A state-independent Gaussian's entropy depends on log_std alone.
        expected = dict(policy_loss=policy | log_std, value_loss=value, entropy=log_std)
    assert set(names(ppo, "")) == policy | value | (set() if ppo.discrete else {"net.log_std"})
    for term, params in expected.items():
        terms = ppo.loss_terms(exp, ppo.train_step(exp).info)
        assert terms[term].shape == (L_ * B_,)
        assert params_reached(ppo, terms[term].sum()) == params, term
    ratio = ppo.loss_terms(exp, ppo.train_step(exp).info)["ratio"]
    torch.testing.assert_close(ratio, torch.ones_like(ratio))


def test_ppo_preprocess_experience_by_hand():
    # One env, 3 steps (batch-major [1, 3]), gamma = lambda = 0.5; rewards r = [0, 1, 2], values V = [.5, 1, 2].
    # delta1 = r2 + .5 V2 - V1 = 2 + 1 - 1 = 2 -> adv1 = 2 ; delta0 = r1 + .5 V1 - V0 = 1 + .5 - .5 = 1
    # -> adv0 = 1 + .25 * 2 = 1.5 ; value_target = adv + V = [2, 3]. The newest step only bootstraps: 2 steps out.
    obs_space, act_space = spaces("CartPole-v1")
    ppo = PpoAlgorithm(obs_space, act_space, hidden_sizes=(8,), gamma=0.5, gae_lambda=0.5)
    from alfish.algorithms.ppo import PpoRolloutInfo
    exp = Experience(step_type=torch.tensor([[StepType.FIRST, StepType.MID, StepType.MID]], dtype=torch.int8),
                     reward=torch.tensor([[0.0, 1.0, 2.0]]), discount=torch.ones(1, 3),
                     observation=torch.zeros(1, 3, 4), action=torch.tensor([[0, 1, 0]]),
                     env_id=torch.zeros(1, 3, dtype=torch.int64),
                     rollout_info=PpoRolloutInfo(log_prob=torch.tensor([[-0.1, -0.2, -0.3]]),
                                                 value=torch.tensor([[0.5, 1.0, 2.0]])))
    out = ppo.preprocess_experience(exp)
    assert out.step_type.shape == out.observation.shape[:2] == (1, 2)
    torch.testing.assert_close(out.rollout_info.advantage, torch.tensor([[1.5, 2.0]]))
    torch.testing.assert_close(out.rollout_info.value_target, torch.tensor([[2.0, 3.0]]))
    torch.testing.assert_close(out.rollout_info.log_prob, torch.tensor([[-0.1, -0.2]]))
    assert out.action.tolist() == [[0, 1]]


# ---------------------------------------------------------------------------------------------------------- A2C ---

@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_a2c_loss_terms_on_an_on_policy_unroll(env_id):
    torch.manual_seed(0)
    env = BatchedEnv(env_id, 2, seed=0)
    try:
        a2c = A2cAlgorithm(env.observation_space, env.action_space, hidden_sizes=(16, 16))
        unroller = Unroller(env, a2c, EpisodeStats(2))
        trajectory = unroller.unroll_on_policy(6)
    finally:
        env.close()
    assert trajectory.step_type.shape == (7, 2)  # [T + 1, B]: the last row only bootstraps
    # The unroll's graph is shared by all terms: keep it across the backward passes below.
    assert trajectory.rollout_info.value[:-1].requires_grad
    assert params_reached(a2c, trajectory.rollout_info.value[-1].sum(), retain_graph=True) == set()
    policy, value = names(a2c, "net.policy."), names(a2c, "net.value_net.")
    if a2c.discrete:
        expected = dict(policy_loss=policy, value_loss=value, entropy=policy)
    else:
        log_std = {"net.log_std"}
        expected = dict(policy_loss=policy | log_std, value_loss=value, entropy=log_std)
    terms = a2c.loss_terms(trajectory)
    for term, params in expected.items():
        assert terms[term].shape == (6, 2)
        assert params_reached(a2c, terms[term].sum(), retain_graph=True) == params, term
