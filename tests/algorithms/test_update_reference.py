"""One update of SAC, TD3, DDPG and DQN against a straightforward reference written here from each algorithm's
definition: the per-sample loss, the replay priorities, the summary terms and the gradients after backward.

The reference runs in float64 on a double copy of the networks, evaluates every network member by member with plain
matmuls (not through ``MLP``/``EnsembleMLP.forward``), uses the textbook formulas (``clamp``, the Gaussian density at
the sample, ``log(1 - tanh(u)^2)``, a Python loop over each sample's n-step window) and draws its noise with the same
seed, in the documented order (SAC: the next step's action first, then the current one). The algorithms' fast paths
must agree with it to float32 rounding, so the optimisations in them (fused ops, amin, a one-op n-step target, only
member 0 evaluated for TD3's actor, ...) cannot change the math.
"""
from __future__ import annotations

import copy

import gymnasium as gym
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from alfish.algorithms.ddpg import DdpgAlgorithm, Td3Algorithm
from alfish.algorithms.dqn import DqnAlgorithm
from alfish.algorithms.sac import LOG_STD_MAX, LOG_STD_MIN, SacAlgorithm
from alfish.data.types import Experience, StepType

OBS = gym.spaces.Box(-1.0, 1.0, shape=(3,))
ACT = gym.spaces.Box(low=torch.tensor([-2.0, 0.0]).numpy(), high=torch.tensor([2.0, 3.0]).numpy())  # asymmetric
B = 12
F_, M_, L_ = StepType.FIRST, StepType.MID, StepType.LAST


# ------------------------------------------------------------------------------------------------- the reference ---

def mlp_ref(mlp: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """``MLP`` by hand: ``x W^T + b`` per Linear, ReLU between."""
    for layer in mlp:
        x = x @ layer.weight.T + layer.bias if isinstance(layer, nn.Linear) else torch.relu(x)
    return x


def member_ref(ensemble: nn.Module, x: torch.Tensor, e: int, detach: bool = False) -> torch.Tensor:
    """Member ``e`` of an ``EnsembleMLP`` by hand, ``[N, in] -> [N]`` (output size 1)."""
    n = len(ensemble.weights)
    for i in range(n):
        w, b = ensemble.weights[i][e], ensemble.biases[i][e]
        if detach:
            w, b = w.detach(), b.detach()
        x = x @ w + b
        if i < n - 1:
            x = torch.relu(x)
    return x.squeeze(-1)


def unit(alg, env_action: torch.Tensor) -> torch.Tensor:
    low, high = alg.action_low.to(env_action.dtype), alg.action_high.to(env_action.dtype)
    return 2.0 * (env_action - low) / (high - low) - 1.0


def double(alg):
    """A float64 copy of ``alg`` (its gradients cleared): the reference's networks."""
    ref = copy.deepcopy(alg).double()
    ref.zero_grad(set_to_none=True)
    return ref


def batch(n_steps: int, action: torch.Tensor, seed: int = 1) -> Experience:
    """``[L = n_steps, B]``: random observations and rewards; episode ends (terminations and truncations) and
    autoreset steps sprinkled in, so masks, cut windows and bootstraps are all exercised."""
    gen = torch.Generator().manual_seed(seed)
    step_type = torch.full((n_steps, B), M_, dtype=torch.int8)
    discount = torch.ones(n_steps, B)
    step_type[1, 0], discount[1, 0] = L_, 0.0      # termination right after step 0
    step_type[1, 1] = L_                            # truncation (discount 1) right after step 0
    step_type[0, 2] = L_                            # step 0 is LAST: the transition out of it is not real
    step_type[1, 2] = F_
    if n_steps > 2:
        step_type[2, 3], discount[2, 3] = L_, 0.0  # termination inside a longer window
        step_type[2, 4] = L_                        # truncation inside it
        step_type[1, 5] = L_                        # ... and LAST at 1 then FIRST at 2 (cut at 1)
        step_type[2, 5] = F_
    return Experience(step_type=step_type, reward=torch.randn(n_steps, B, generator=gen), discount=discount,
                      observation=torch.randn(n_steps, B, 3, generator=gen), action=action,
                      env_id=torch.arange(B).expand(n_steps, B))


def backward_and_grads(alg, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    alg.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad for n, p in alg.named_parameters() if p.grad is not None}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    expected = expected.detach().to(actual.dtype)
    scale = max(1.0, float(expected.abs().max())) if expected.numel() else 1.0
    torch.testing.assert_close(actual, expected, rtol=2e-4, atol=2e-5 * scale, msg=lambda m: f"{what}: {m}")


def assert_grads(alg, ref, grads: dict[str, torch.Tensor]) -> None:
    ref_grads = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}
    assert set(grads) == set(ref_grads)
    for name, grad in grads.items():
        assert_close(grad, ref_grads[name], f"grad of {name}")


# ------------------------------------------------------------------------------------------------------------ SAC ---

def sac_policy_ref(ref, obs: torch.Tensor, eps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean, log_std = mlp_ref(ref.actor, obs).chunk(2, dim=-1)
    log_std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
    u = mean + log_std.exp() * eps
    gaussian = torch.distributions.Normal(mean, log_std.exp()).log_prob(u)
    return torch.tanh(u), (gaussian - torch.log(1.0 - torch.tanh(u) ** 2)).sum(-1)


@pytest.mark.parametrize("seed", [0, 1])
def test_sac_update_matches_the_reference(seed):
    torch.manual_seed(seed)
    alg = SacAlgorithm(OBS, ACT, hidden_sizes=(16, 16), gamma=0.9, initial_log_alpha=-0.5)
    ref = double(alg)
    gen = torch.Generator().manual_seed(seed + 10)
    exp = batch(2, torch.rand(2, B, 2, generator=gen) * torch.tensor([4.0, 3.0]) - torch.tensor([2.0, 0.0]))

    torch.manual_seed(100)
    info = alg.train_step(exp).info
    loss_info = alg.calc_loss(exp, info)
    grads = backward_and_grads(alg, loss_info.loss.mean())

    torch.manual_seed(100)  # the same draws, in SAC's order: the next step's action, then the current one
    eps_next, eps_now = torch.randn(B, 2).double(), torch.randn(B, 2).double()
    obs = exp.observation.double()
    obs_t, obs_next = obs[0], obs[1]
    act_t = unit(ref, exp.action[0].double())
    reward, discount = exp.reward[1].double(), exp.discount[1].double()
    alpha = ref.log_alpha.detach().exp()
    with torch.no_grad():
        next_action, next_log_prob = sac_policy_ref(ref, obs_next, eps_next)
        x_next = torch.cat([obs_next, next_action], -1)
        next_q = torch.minimum(member_ref(ref.target_critics, x_next, 0), member_ref(ref.target_critics, x_next, 1))
        target = reward + 0.9 * discount * (next_q - alpha * next_log_prob)
    x = torch.cat([obs_t, act_t], -1)
    qs = [member_ref(ref.critics, x, e) for e in range(2)]
    critic_loss = sum(0.5 * (q - target) ** 2 for q in qs)
    new_action, log_prob = sac_policy_ref(ref, obs_t, eps_now)
    x_new = torch.cat([obs_t, new_action], -1)
    q_new = torch.minimum(member_ref(ref.critics, x_new, 0, detach=True), member_ref(ref.critics, x_new, 1, True))
    actor_loss = alpha * log_prob - q_new
    alpha_loss = -ref.log_alpha * (log_prob.detach() + (-2.0))  # target entropy: -action_dim
    valid = (exp.step_type[0] != L_).double()
    loss = (critic_loss + actor_loss + alpha_loss) * valid
    priority = sum((q - target).abs() for q in qs).detach() / 2 * valid
    loss.mean().backward()

    assert not bool(valid.all())  # the mask is exercised
    assert_close(info.critic_loss.detach(), critic_loss.detach(), "critic loss")
    assert_close(info.actor_loss.detach(), actor_loss.detach(), "actor loss")
    assert_close(info.log_prob, log_prob.detach(), "log prob")
    assert_close(loss_info.loss.detach(), loss.detach().view(1, B), "loss")
    assert_close(loss_info.priority, priority, "priority")
    extra = loss_info.extra()
    count = valid.sum()
    assert_close(extra["entropy"], -(log_prob.detach() * valid).sum() / count, "entropy")
    assert_close(extra["critic_loss"], (critic_loss.detach() * valid).sum() / count, "critic_loss term")
    assert_grads(alg, ref, grads)


def test_sac_policy_matches_the_reference_where_tanh_saturates():
    # Large |u| (tanh saturated): the stable correction must still match the reference within float32 precision.
    torch.manual_seed(0)
    alg = SacAlgorithm(OBS, ACT, hidden_sizes=(8,))
    obs = torch.randn(64, 3)
    with torch.no_grad():
        alg.actor[-1].bias.copy_(torch.tensor([3.0, -3.0, 0.5, 1.0]))  # means +-3, log_std 0.5 and 1
    torch.manual_seed(4)
    action, log_prob = alg._policy(obs, greedy=False)
    torch.manual_seed(4)
    ref_action, ref_log_prob = sac_policy_ref(double(alg), obs.double(), torch.randn(64, 2).double())
    assert_close(action, ref_action, "action")
    assert_close(log_prob, ref_log_prob, "log prob")


# ---------------------------------------------------------------------------------------------------- TD3 / DDPG ---

@pytest.mark.parametrize("cls, actor_due", [(Td3Algorithm, False), (Td3Algorithm, True), (DdpgAlgorithm, True)])
def test_ddpg_td3_update_matches_the_reference(cls, actor_due):
    torch.manual_seed(0)
    alg = cls(OBS, ACT, hidden_sizes=(16, 16), gamma=0.9)
    if actor_due and not alg.actor_due():
        alg.after_update()  # TD3: the second optimizer step trains the actor
    assert alg.actor_due() == actor_due
    ref = double(alg)
    gen = torch.Generator().manual_seed(3)
    exp = batch(3, torch.rand(3, B, 2, generator=gen) * torch.tensor([4.0, 3.0]) - torch.tensor([2.0, 0.0]))

    torch.manual_seed(7)
    info = alg.train_step(exp).info
    loss_info = alg.calc_loss(exp, info)
    grads = backward_and_grads(alg, loss_info.loss.mean())

    torch.manual_seed(7)  # TD3's smoothing noise is the only draw
    obs = exp.observation.double()
    obs_t, obs_next = obs[:-1].reshape(-1, 3), obs[1:].reshape(-1, 3)
    act_t = unit(ref, exp.action[:-1].reshape(-1, 2).double())
    reward, discount = exp.reward[1:].reshape(-1).double(), exp.discount[1:].reshape(-1).double()
    n_critics = alg.critics.num_members
    with torch.no_grad():
        next_action = torch.tanh(mlp_ref(ref.target_actor, obs_next))
        if cls is Td3Algorithm:
            noise = (torch.randn(next_action.shape).double() * 0.2).clamp(-0.5, 0.5)
            next_action = (next_action + noise).clamp(-1.0, 1.0)
        x_next = torch.cat([obs_next, next_action], -1)
        next_q = torch.stack([member_ref(ref.target_critics, x_next, e) for e in range(n_critics)]).min(0).values
        target = reward + 0.9 * discount * next_q
    qs = [member_ref(ref.critics, torch.cat([obs_t, act_t], -1), e) for e in range(n_critics)]
    critic_loss = sum(0.5 * (q - target) ** 2 for q in qs)
    if actor_due:
        new_action = torch.tanh(mlp_ref(ref.actor, obs_t))
        actor_loss = -member_ref(ref.critics, torch.cat([obs_t, new_action], -1), 0, detach=True)
    else:
        actor_loss = torch.zeros_like(critic_loss)
    valid = (exp.step_type[:-1] != L_).reshape(-1).double()
    loss = (critic_loss + actor_loss) * valid
    priority = (sum((q - target).abs() for q in qs).detach() / n_critics * valid).view(2, B).mean(0)
    loss.mean().backward()

    assert_close(loss_info.loss.detach(), loss.detach().view(2, B), "loss")
    assert_close(info.actor_loss.detach(), actor_loss.detach(), "actor loss")
    assert_close(loss_info.priority, priority, "priority")
    assert_close(info.q, (sum(qs) / n_critics).detach(), "q")
    assert_grads(alg, ref, grads)
    assert ("actor.0.weight" in grads) == actor_due  # Adam must see no actor gradient on the other steps


# ------------------------------------------------------------------------------------------------------------ DQN ---

def n_step_target_ref(reward, discount, step_type, value, gamma: float, n: int) -> torch.Tensor:
    """Per sample, the textbook n-step return: rewards up to the window's end ``e`` (LAST or n), then
    ``gamma^e * prod(discount) * value_e`` (zero after a termination, whose discount is 0)."""
    out = []
    for b in range(reward.shape[1]):
        total, scale = 0.0, 1.0
        for k in range(1, n + 1):
            total += scale * float(reward[k, b])
            scale *= gamma * float(discount[k, b])
            if k == n or int(step_type[k, b]) == L_:
                total += scale * float(value[k, b])
                break
        out.append(total)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("n_step, double_q, huber", [(1, True, True), (1, False, False), (3, True, True),
                                                     (3, False, False), (3, True, False)])
def test_dqn_update_matches_the_reference(n_step, double_q, huber):
    torch.manual_seed(0)
    alg = DqnAlgorithm(OBS, gym.spaces.Discrete(4), hidden_sizes=(16, 16), gamma=0.9, n_step=n_step,
                       double_q=double_q, huber_loss=huber)
    with torch.no_grad():  # a target network that differs from the online one, so double Q matters
        for p in alg.target_q_net.parameters():
            p.add_(0.3 * torch.randn(p.shape))
    ref = double(alg)
    gen = torch.Generator().manual_seed(5)
    exp = batch(n_step + 1, torch.randint(4, (n_step + 1, B), generator=gen))
    exp = exp._replace(reward=exp.reward * 3.0)  # TD errors on both sides of the Huber threshold

    info = alg.train_step(exp).info
    loss_info = alg.calc_loss(exp, info)
    grads = backward_and_grads(alg, loss_info.loss.mean())

    obs = exp.observation.double()
    with torch.no_grad():
        value = torch.zeros(n_step + 1, B, dtype=torch.float64)
        for k in range(1, n_step + 1):
            target_q = mlp_ref(ref.target_q_net, obs[k])
            best = (mlp_ref(ref.q_net, obs[k]) if double_q else target_q).argmax(-1)
            value[k] = target_q[torch.arange(B), best]
        target = n_step_target_ref(exp.reward, exp.discount, exp.step_type, value, 0.9, n_step)
    q = mlp_ref(ref.q_net, obs[0])[torch.arange(B), exp.action[0]]
    td = q - target
    per_sample = torch.where(td.abs() < 1.0, 0.5 * td ** 2, td.abs() - 0.5) if huber else 0.5 * td ** 2
    valid = (exp.step_type[0] != L_).double()
    loss = per_sample * valid
    loss.mean().backward()

    assert_close(info.target, target, "n-step target")
    assert_close(info.q.detach(), q.detach(), "q")
    assert_close(loss_info.loss.detach(), loss.detach().view(1, B), "loss")
    assert_close(loss_info.priority, td.detach().abs() * valid, "priority")
    assert_grads(alg, ref, grads)
    if huber:
        assert bool((td.abs() > 1.0).any()) and bool((td.abs() < 1.0).any())


# ------------------------------------------------------------------------------------------------ determinism ---

@pytest.mark.parametrize("make", [
    lambda: SacAlgorithm(OBS, ACT, hidden_sizes=(16, 16)),
    lambda: Td3Algorithm(OBS, ACT, hidden_sizes=(16, 16)),
], ids=["sac", "td3"])
def test_seeded_updates_are_reproducible(make):
    """Two runs with the same seeds give bit-identical parameters after a few updates (same draws, same order)."""
    def run() -> list[torch.Tensor]:
        torch.manual_seed(0)
        alg = make()
        opt = torch.optim.Adam([p for g in alg.param_groups() for p in g["params"]], lr=1e-3)
        gen = torch.Generator().manual_seed(1)
        exp = batch(2, torch.rand(2, B, 2, generator=gen) * torch.tensor([4.0, 3.0]) - torch.tensor([2.0, 0.0]))
        for _ in range(4):
            loss = alg.calc_loss(exp, alg.train_step(exp).info).loss.mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            alg.after_update()
        return [t.clone() for t in alg.state_dict().values()] + [torch.randn(3)]

    assert all(torch.equal(a, b) for a, b in zip(run(), run()))


def test_reference_helpers_agree_with_the_networks():
    """The hand-written member/MLP evaluations are the networks' own outputs (so the tests above test the math)."""
    torch.manual_seed(0)
    alg = SacAlgorithm(OBS, ACT, hidden_sizes=(8, 8))
    x = torch.randn(5, 5)
    out = alg.critics(x[:, :3], x[:, 3:])  # (obs, action): the members read them concatenated
    for e in range(2):
        torch.testing.assert_close(out[e].squeeze(-1), member_ref(alg.critics, x, e))
    torch.testing.assert_close(alg.actor(x[:, :3]), mlp_ref(alg.actor, x[:, :3]))
    assert F.hardtanh(torch.tensor([-30.0, 5.0]), LOG_STD_MIN, LOG_STD_MAX).tolist() == [LOG_STD_MIN, LOG_STD_MAX]
