"""DDPG and TD3: loss-term isolation, the TD target by hand, target smoothing, the policy delay, exploration noise.

Mirrors test_loss_isolation.py's SAC tests: critic loss -> critics only; actor loss -> actor only (the critic is read
through detached weights); target networks never get gradients and move by exactly tau, and for TD3 only on the
steps where the delayed actor is trained.
"""
import pytest
import torch

from alfish.algorithms.ddpg import DdpgAlgorithm, Td3Algorithm
from alfish.data.types import StepType, TimeStep

from .test_loss_isolation import B_, L_, hand_experience, names, params_reached, spaces


def make(cls, **kwargs):
    torch.manual_seed(0)
    obs_space, act_space = spaces("Pendulum-v1")
    kwargs.setdefault("hidden_sizes", (16, 16))
    return cls(obs_space, act_space, **kwargs)


def pendulum_exp(seed=1):
    gen = torch.Generator().manual_seed(seed)
    action = torch.rand(L_, B_, 1, generator=gen) * 4.0 - 2.0  # inside Pendulum's [-2, 2]
    return hand_experience(3, action, gen)


def reached(alg):
    return {n for n, p in alg.named_parameters() if p.grad is not None and bool(p.grad.abs().sum() > 0)}


ALGS = [DdpgAlgorithm, Td3Algorithm]


# ------------------------------------------------------------------------------------------------ loss isolation ---

@pytest.mark.parametrize("cls", ALGS)
@pytest.mark.parametrize("term, prefix", [("critic_loss", "critics."), ("actor_loss", "actor.")])
def test_each_loss_term_reaches_only_its_parameters(cls, term, prefix):
    alg = make(cls, policy_delay=1)  # the actor is due on every step
    exp = pendulum_exp()
    loss = getattr(alg.train_step(exp).info, term)
    assert loss.shape == ((L_ - 1) * B_,)  # one per transition
    assert params_reached(alg, loss.sum()) == names(alg, prefix)


@pytest.mark.parametrize("cls", ALGS)
def test_total_loss_trains_actor_and_critics_never_targets(cls):
    alg = make(cls, policy_delay=1)
    exp = pendulum_exp()
    info = alg.train_step(exp).info
    loss = alg.calc_loss(exp, info)
    assert loss.loss.shape == (L_ - 1, B_) and loss.priority.shape == (B_,)
    assert set(loss.extra()) == {"critic_loss", "actor_loss", "q_mean"}
    loss.loss.sum().backward()
    assert all(p.grad is None for p in alg.target_critics.parameters())
    assert all(p.grad is None for p in alg.target_actor.parameters())
    assert reached(alg) == names(alg, "critics.") | names(alg, "actor.")
    torch.testing.assert_close(loss.priority, info.td_error.view(L_ - 1, B_).mean(0))


def test_critic_ensemble_sizes():
    assert make(DdpgAlgorithm).critics.num_members == 1
    assert make(Td3Algorithm).critics.num_members == 2


def test_transition_out_of_a_last_step_is_masked():
    alg = make(Td3Algorithm, policy_delay=1)
    exp = pendulum_exp()
    st = exp.step_type.clone()
    st[1, 2] = StepType.LAST
    exp = exp._replace(step_type=st)
    loss = alg.calc_loss(exp, alg.train_step(exp).info).loss.detach()
    assert float(loss[1, 2]) == 0.0
    assert bool((loss[0] != 0).all()) and bool((loss[1, [0, 1, 3]] != 0).all())


# ------------------------------------------------------------------------------------------------ the TD target ---

def member_forward(ensemble, x, e):
    """Member ``e`` of an EnsembleMLP, computed layer by layer with plain matmuls."""
    n = len(ensemble.weights)
    for i, (w, b) in enumerate(zip(ensemble.weights, ensemble.biases)):
        x = x @ w[e] + b[e]
        if i < n - 1:
            x = torch.relu(x)
    return x.squeeze(-1)


@pytest.mark.parametrize("cls", ALGS)
def test_td_target_by_hand(cls):
    alg = make(cls, gamma=0.9)
    exp = pendulum_exp()
    exp = exp._replace(discount=exp.discount.index_fill(0, torch.tensor([2]), 0.0)
                       .index_put((torch.tensor([1]), torch.tensor([3])), torch.tensor(0.0)))
    torch.manual_seed(5)
    info = alg.train_step(exp).info

    obs = exp.observation
    obs_t, obs_next = obs[:-1].reshape(-1, 3), obs[1:].reshape(-1, 3)
    act_t = exp.action[:-1].reshape(-1, 1) / 2.0  # Pendulum's [-2, 2] -> [-1, 1]
    reward, discount = exp.reward[1:].reshape(-1), exp.discount[1:].reshape(-1)
    torch.manual_seed(5)  # the smoothing noise is the only random draw in train_step
    with torch.no_grad():
        next_action = torch.tanh(alg.target_actor(obs_next))
        if cls is Td3Algorithm:
            noise = (torch.randn(next_action.shape) * 0.2).clamp(-0.5, 0.5)
            next_action = (next_action + noise).clamp(-1, 1)
        x_next = torch.cat([obs_next, next_action], -1)
        target_qs = [member_forward(alg.target_critics, x_next, e) for e in range(alg.critics.num_members)]
        next_q = torch.minimum(*target_qs) if cls is Td3Algorithm else target_qs[0]
        if cls is Td3Algorithm:
            assert not torch.allclose(target_qs[0], target_qs[1])  # the min matters
        target = reward + 0.9 * discount * next_q
        x = torch.cat([obs_t, act_t], -1)
        qs = [member_forward(alg.critics, x, e) for e in range(alg.critics.num_members)]
        critic_loss = sum(0.5 * (q - target) ** 2 for q in qs)
        td_error = sum((q - target).abs() for q in qs) / len(qs)
    torch.testing.assert_close(info.critic_loss.detach(), critic_loss)
    torch.testing.assert_close(info.td_error, td_error)


def test_smoothing_noise_is_clipped():
    alg = make(Td3Algorithm, target_policy_noise=1.0, target_noise_clip=0.3)
    torch.manual_seed(0)
    noise = alg.smoothing_noise(torch.zeros(10000, 1))
    assert float(noise.abs().max()) == pytest.approx(0.3)
    assert float((noise.abs() == 0.3).float().mean()) > 0.5  # N(0, 1) is beyond 0.3 about 76% of the time
    # by hand: the same draw, clipped
    torch.manual_seed(0)
    torch.testing.assert_close(noise, torch.randn(10000, 1).clamp(-0.3, 0.3))
    # an unclipped std: 0.2 with a clip of 10
    alg = make(Td3Algorithm, target_policy_noise=0.2, target_noise_clip=10.0)
    assert float(alg.smoothing_noise(torch.zeros(20000, 1)).std()) == pytest.approx(0.2, rel=0.05)


# ------------------------------------------------------------------------------------------------- policy delay ---

def fill_online_and_targets(alg, online, target):
    with torch.no_grad():
        for p in list(alg.actor.parameters()) + list(alg.critics.parameters()):
            p.fill_(online)
        for p in list(alg.target_actor.parameters()) + list(alg.target_critics.parameters()):
            p.fill_(target)


def targets(alg):
    return list(alg.target_actor.parameters()) + list(alg.target_critics.parameters())


def test_policy_delay_actor_gradients_only_on_delay_steps():
    alg = make(Td3Algorithm, policy_delay=3)
    exp = pendulum_exp()
    due = []
    for _ in range(6):
        alg.zero_grad(set_to_none=True)
        info = alg.train_step(exp).info
        alg.calc_loss(exp, info).loss.sum().backward()
        actor_grads = [p.grad for p in alg.actor.parameters()]
        due.append(all(g is not None for g in actor_grads))
        if not due[-1]:
            assert all(g is None for g in actor_grads)  # not even zeros: Adam skips the actor entirely
            assert not info.actor_loss.requires_grad and bool((info.actor_loss == 0).all())
        assert reached(alg) >= names(alg, "critics.")  # the critics train every step
        alg.after_update()
    assert due == [False, False, True, False, False, True]


def test_adam_leaves_the_actor_alone_on_non_delay_steps():
    alg = make(Td3Algorithm, policy_delay=2)
    opt = torch.optim.Adam([g["params"] for g in alg.param_groups()][0] + list(alg.critics.parameters()), lr=1e-2)
    exp = pendulum_exp()

    def update():
        opt.zero_grad(set_to_none=True)
        alg.calc_loss(exp, alg.train_step(exp).info).loss.mean().backward()
        opt.step()
        alg.after_update()

    update()  # step 1: critics only
    update()  # step 2: actor and critics (Adam now has actor state)
    actor_before = [p.detach().clone() for p in alg.actor.parameters()]
    critic_before = [p.detach().clone() for p in alg.critics.parameters()]
    update()  # step 3: critics only -- Adam's momentum must not move the actor
    for p, q in zip(alg.actor.parameters(), actor_before):
        torch.testing.assert_close(p.detach(), q, rtol=0, atol=0)
    assert any(not torch.equal(p.detach(), q) for p, q in zip(alg.critics.parameters(), critic_before))


def test_targets_move_only_on_delay_steps_by_tau():
    alg = make(Td3Algorithm, hidden_sizes=(8,), policy_delay=2, target_update_tau=0.1)
    fill_online_and_targets(alg, online=1.0, target=0.0)
    alg.after_update()  # update 1: not due
    assert all(bool((p == 0).all()) for p in targets(alg))
    alg.after_update()  # update 2: 0 + 0.1 * (1 - 0) = 0.1, for the target actor and the target critics
    for p in targets(alg):
        torch.testing.assert_close(p, torch.full_like(p, 0.1))
    alg.after_update()  # update 3: not due
    for p in targets(alg):
        torch.testing.assert_close(p, torch.full_like(p, 0.1))
    alg.after_update()  # update 4: 0.1 + 0.1 * 0.9 = 0.19
    for p in targets(alg):
        torch.testing.assert_close(p, torch.full_like(p, 0.19))
    for p in list(alg.actor.parameters()) + list(alg.critics.parameters()):
        torch.testing.assert_close(p, torch.ones_like(p))


def test_ddpg_targets_move_every_step():
    alg = make(DdpgAlgorithm, hidden_sizes=(8,), target_update_tau=0.5)
    fill_online_and_targets(alg, online=2.0, target=0.0)
    alg.after_update()
    for p in targets(alg):
        torch.testing.assert_close(p, torch.ones_like(p))


def test_the_delay_phase_survives_a_state_dict_round_trip():
    alg = make(Td3Algorithm, policy_delay=2)
    alg.after_update()  # one update done: the next one trains the actor
    assert alg.actor_due()
    fresh = make(Td3Algorithm, policy_delay=2)
    assert not fresh.actor_due()
    fresh.load_state_dict(alg.state_dict())
    assert fresh.actor_due()


# ---------------------------------------------------------------------------------------------------- exploring ---

def pendulum_time_step(n):
    return TimeStep(step_type=torch.full((n,), StepType.MID, dtype=torch.int8), reward=torch.zeros(n),
                    discount=torch.ones(n), observation=torch.randn(n, 3), prev_action=torch.zeros(n, 1),
                    env_id=torch.arange(n))


def set_actor_output(alg, value):
    last = alg.actor[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.fill_(value)


@pytest.mark.parametrize("cls", ALGS)
def test_exploration_noise_std_in_rollout_and_greedy_predict(cls):
    alg = make(cls, exploration_noise=0.1)
    set_actor_output(alg, 0.0)  # unit action tanh(0) = 0 -> env action 0
    ts = pendulum_time_step(20000)
    with torch.inference_mode():
        action = alg.rollout_step(ts).output
        greedy = alg.predict_step(ts).output
    assert action.shape == (20000, 1)
    unit = action / 2.0  # Pendulum's [-2, 2]
    assert float(unit.std()) == pytest.approx(0.1, rel=0.05)
    assert abs(float(unit.mean())) < 0.005
    assert bool((greedy == 0).all())


def test_exploration_is_clipped_to_the_action_bounds():
    alg = make(DdpgAlgorithm, exploration_noise=0.5)
    set_actor_output(alg, 3.0)  # tanh(3) = 0.995: about half of the noisy actions leave the box
    with torch.inference_mode():
        action = alg.rollout_step(pendulum_time_step(5000)).output
    assert float(action.max()) == 2.0 and float(action.min()) >= -2.0
    assert 0.3 < float((action == 2.0).float().mean()) < 0.7


def test_discrete_action_space_is_an_error():
    obs_space, act_space = spaces("CartPole-v1")
    for cls in ALGS:
        with pytest.raises(ValueError, match="needs a Box action space"):
            cls(obs_space, act_space)


# --------------------------------------------------------------------------------------------- TD3's gin surface ---

def test_td3_takes_every_ddpg_parameter_from_gin_with_its_own_defaults():
    import gin

    from alfish.config.gin_names import parameter_names as _parameter_names

    assert _parameter_names("Td3Algorithm") == _parameter_names("DdpgAlgorithm")
    obs_space, act_space = spaces("Pendulum-v1")
    gin.clear_config()
    try:
        gin.parse_config("Td3Algorithm.actor_lr = 0.25\nTd3Algorithm.hidden_sizes = (8,)\n"
                         "Td3Algorithm.target_noise_clip = 0.3\nDdpgAlgorithm.num_critics = 3")
        alg = Td3Algorithm(obs_space, act_space)
        assert alg._lrs["actor"] == 0.25 and alg.target_noise_clip == 0.3
        # TD3's defaults, not a DdpgAlgorithm binding
        assert (alg.critics.num_members, alg.policy_delay, alg.target_policy_noise) == (2, 2, 0.2)
        assert "Td3Algorithm.actor_lr = 0.25" in gin.operative_config_str()
        assert make(DdpgAlgorithm).critics.num_members == 3
        with pytest.raises(ValueError, match="doesn't have a parameter named 'actr_lr'"):
            gin.parse_config("Td3Algorithm.actr_lr = 0.5")
    finally:
        gin.clear_config()
    positional = Td3Algorithm(obs_space, act_space, (8,), 0.5)
    assert positional._lrs["actor"] == 0.5 and positional.policy_delay == 2
