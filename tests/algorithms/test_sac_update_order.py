"""SAC ``update_order='critic_first'``: the actor's loss reads the critics after their step (Stable-Baselines3's and the
SAC authors' order), by deferring the actor's and the temperature's terms one update
(alfish/algorithms/deferred_actor.py).

The reference is SB3's ``SAC.train`` written out by hand on one batch: the policy's sample and log-prob, the
temperature's loss and step, the critics' loss (TD target with the temperature from before its step) and step, the
actor's loss on the updated critics (same sample, same temperature) and step, then the Polyak update. The sampler's
Gaussian noise is fixed (the same ``eps`` for every draw of a shape), so the comparison does not depend on the order in
which the two orders draw; one Adam over all groups, as alfish's (a step with only some groups' gradients leaves the
others alone, as separate optimizers would).
"""
import copy

import gymnasium as gym
import pytest
import torch

from alfish.algorithms.sac import SacAlgorithm
from alfish.data.types import StepType
from alfish.envs.mixed_actions import MixedActionBox
from alfish.learn.learner import Learner
from alfish.learn.optim import OptimizerConfig
from alfish.networks.mlp import polyak_update

from .test_ddpg_update_order import assert_same, batches, params  # (Pendulum batches, bit-exact comparison)
from .test_loss_isolation import L_, spaces


def make(update_order, **kwargs):
    torch.manual_seed(0)
    obs_space, act_space = spaces("Pendulum-v1")
    return SacAlgorithm(obs_space, act_space, hidden_sizes=(16, 16), update_order=update_order, **kwargs)


@pytest.fixture
def fixed_noise(monkeypatch):
    """Every ``randn_like`` (the sampler's only draw) returns the same noise for a shape: a fixed, varied ``eps``."""
    def noise(like):
        return torch.linspace(-1.7, 1.3, like.numel(), dtype=like.dtype).view_as(like)
    monkeypatch.setattr(torch, "randn_like", noise)


class Sb3Order:
    """SAC in SB3's order, by hand, on a ``'joint'`` algorithm's networks (its train_step is not used)."""

    def __init__(self, alg: SacAlgorithm):
        self.alg = alg
        self.optimizer = OptimizerConfig().build(alg.param_groups())

    def minimize(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss.mean().backward()
        self.optimizer.step()  # only the parameters this loss reached have gradients: the others stay put

    def step(self, exp):
        alg = self.alg
        obs, next_obs = exp.observation[:-1].flatten(0, 1), exp.observation[1:].flatten(0, 1)
        act = alg.unscale_action(exp.action[:-1].flatten(0, 1))
        alpha = alg.log_alpha.detach().exp()  # from before the temperature's step, for the critics and the actor
        new_action, log_prob = alg._policy(obs, greedy=False)
        self.minimize(alg.log_alpha * torch.rsub(log_prob.detach(), -alg.target_entropy.value()))
        with torch.no_grad():
            next_action, next_log_prob = alg._policy(next_obs, greedy=False)
            next_q = alg.target_critics(next_obs, next_action).amin(0).squeeze(-1)
            soft_value = torch.addcmul(next_q, alpha, next_log_prob, value=-1.0)
            target = torch.addcmul(exp.reward[1:].flatten(), exp.discount[1:].flatten(), soft_value, value=alg.gamma)
        q = alg.critics(obs, act).squeeze(-1)
        self.minimize(0.5 * ((q - target) ** 2).sum(0))
        q_new = alg.critics(obs, new_action, detach_params=True).min(0).values.squeeze(-1)  # the stepped critics
        self.minimize(alpha * log_prob - q_new)
        polyak_update(alg.target_critics, alg.critics, alg.tau())


def test_critic_first_makes_sb3s_actor_and_temperature_steps_one_update_later(fixed_noise):
    alfish, joint, reference = make("critic_first"), make("joint"), Sb3Order(make("joint"))
    learner, joint_learner = Learner(alfish), Learner(joint)
    first, second = batches(2)
    learner.update(first)
    joint_learner.update(first)
    reference.step(first)
    # The critics' step is SB3's (the temperature it reads is the one before the temperature's step); the actor and
    # the temperature sit this update out: no batch was kept yet.
    assert_same(params(alfish.critics), params(reference.alg.critics))
    assert_same(params(alfish.target_critics), params(reference.alg.target_critics))
    assert_same(params(alfish.actor), params(make("joint").actor))
    assert alfish.log_alpha.item() == 0.0
    assert alfish.deferred_observations.shape == (2 * 4, 3)  # the batch kept: [(L-1) * B, obs_dim]
    learner.update(second)  # the actor's and temperature's terms: the kept batch, the critics after the first step
    assert_same(params(alfish.actor), params(reference.alg.actor))
    assert_same([alfish.log_alpha], [reference.alg.log_alpha])
    # ... where the joint order's actor read the critics from before their step: not the same actor.
    assert not all(torch.equal(a, b) for a, b in zip(params(joint.actor), params(reference.alg.actor)))


def test_the_kept_batch_is_checkpointed_and_a_resume_takes_the_same_steps():
    data = batches(3)
    run = make("critic_first")
    learner = Learner(run)
    for exp in data[:2]:
        learner.update(exp)
    state = {k: v.clone() for k, v in run.state_dict().items()}
    optimizer_state = copy.deepcopy(learner.optimizer.state_dict())
    assert state["deferred_observations"].shape == (8, 3) and state["deferred_valid"].shape == (8,)
    resumed = make("critic_first")
    resumed.load_state_dict(state)  # takes the kept batch's shape
    resumed_learner = Learner(resumed)
    resumed_learner.optimizer.load_state_dict(optimizer_state)
    torch.manual_seed(5)
    learner.update(data[2])
    torch.manual_seed(5)
    resumed_learner.update(data[2])
    assert_same(params(resumed), params(run))
    assert_same(list(resumed.buffers()), list(run.buffers()))


def test_the_actor_and_temperature_terms_are_masked_by_their_own_batchs_last_steps():
    alg = make("critic_first")
    first, second = batches(2)
    step_type = first.step_type.clone()
    step_type[1, 2] = StepType.LAST  # the kept batch's transition out of a LAST step: no actor or alpha term for it
    first = first._replace(step_type=step_type)
    info = alg.train_step(first).info
    assert info.actor_valid.tolist() == [0.0] * 8  # the first update: no kept batch, critic terms only
    loss = alg.calc_loss(first, info).loss.detach()
    critic_only = info.critic_loss.detach().view(L_ - 1, 4) * (step_type[:-1] != StepType.LAST)
    torch.testing.assert_close(loss, critic_only, rtol=0, atol=0)
    alg.after_update()
    info = alg.train_step(second).info
    loss = alg.calc_loss(second, info).loss.detach()
    assert info.actor_valid.tolist() == [1.0] * 6 + [0.0] + [1.0]  # row (1, 2) of [L-1, B] = index 1 * 4 + 2
    critic_only = info.critic_loss.detach().view(L_ - 1, 4)
    torch.testing.assert_close(loss[1, 2], critic_only[1, 2])  # this batch's row 6 is valid; the kept one was not
    expected = critic_only[0, 0] + info.actor_loss[0] + info.alpha_loss[0]
    torch.testing.assert_close(loss[0, 0], expected.detach())
    assert not torch.equal(loss[0, 0], critic_only[0, 0])


def test_the_joint_order_keeps_nothing_and_ddp_looks_for_the_unused_actor_only_in_the_critic_first_order():
    joint = make("joint")
    joint.before_update(batches(1)[0])
    assert "deferred_observations" not in dict(joint.named_buffers())
    assert not joint.skips_parameters_in_some_updates
    assert make("critic_first").skips_parameters_in_some_updates  # (find_unused_parameters)


def test_bad_settings_are_one_line_errors():
    with pytest.raises(ValueError, match=r"^SacAlgorithm.update_order='sb3': use one of \('joint', 'critic_first'\)"):
        make("sb3")
    box = gym.spaces.Box(-1.0, 1.0, (2,))
    with pytest.raises(ValueError, match=r"update_order='critic_first' keeps a batch's observations .* Dict"):
        SacAlgorithm(gym.spaces.Dict(a=box), box, update_order="critic_first")
    mixed = MixedActionBox(gym.spaces.Tuple((gym.spaces.Discrete(3), box)))
    with pytest.raises(ValueError, match=r"update_order='critic_first' .* this SAC has mixed actions: use "
                                         r"update_order='joint'"):
        SacAlgorithm(box, mixed, update_order="critic_first")
    alg = make("critic_first")
    assert alg.replay_refusal(prioritized=False, offline=False) is None
    assert "TrainerConfig.priority_replay=True" in alg.replay_refusal(prioritized=True, offline=False)
    assert "offline data" in alg.replay_refusal(prioritized=False, offline=True)
    assert make("joint").replay_refusal(prioritized=True, offline=True) is None
