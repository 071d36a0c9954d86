"""DDPG/TD3 ``update_order='critic_first'``: the actor's loss reads the critic after its step (Stable-Baselines3's and
the TD3 authors' order), by deferring the actor's term one update (alfish/algorithms/ddpg.py's docstring).

The reference here is that order written out by hand: on a step where the actor is due, the critics' loss, backward
and optimizer step, then the actor's loss on the updated critic, its backward and step, then the Polyak update. With
the same optimizer (one Adam over both groups: a step with only one group's gradients leaves the other alone, as two
optimizers would) and no smoothing noise (no random numbers), the actor comes out bit for bit the same, one update
later; the joint order's does not.
"""
import copy

import gymnasium as gym
import pytest
import torch

from alfish.algorithms.ddpg import DdpgAlgorithm, Td3Algorithm
from alfish.data.types import StepType
from alfish.learn.learner import Learner
from alfish.learn.optim import OptimizerConfig
from alfish.networks.mlp import polyak_update

from .test_loss_isolation import L_, hand_experience, spaces


def make(update_order, cls=Td3Algorithm, **kwargs):
    torch.manual_seed(0)
    obs_space, act_space = spaces("Pendulum-v1")
    return cls(obs_space, act_space, hidden_sizes=(16, 16), target_policy_noise=0.0, update_order=update_order,
               **kwargs)


def batches(n, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [hand_experience(3, torch.rand(L_, 4, 1, generator=gen) * 4.0 - 2.0, gen) for _ in range(n)]


def params(module):
    return [p.detach().clone() for p in module.parameters()]


def assert_same(a, b):
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


class ReferenceOrder:
    """TD3 in the reference order, by hand, on a ``'joint'`` algorithm's networks (its train_step is not used)."""

    def __init__(self, alg: DdpgAlgorithm):
        self.alg = alg
        self.optimizer = OptimizerConfig().build(alg.param_groups())
        self.steps = 0

    def critic_loss(self, exp):
        alg = self.alg
        obs, act = exp.observation[:-1].flatten(0, 1), alg.unscale_action(exp.action[:-1].flatten(0, 1))
        next_obs = exp.observation[1:].flatten(0, 1)
        with torch.no_grad():
            next_q = alg.target_critics(next_obs, torch.tanh(alg.target_actor(next_obs))).amin(0).squeeze(-1)
            target = torch.addcmul(exp.reward[1:].flatten(), exp.discount[1:].flatten(), next_q, value=alg.gamma)
        q = alg.critics(obs, act).squeeze(-1)
        return (0.5 * ((q - target) ** 2).sum(0)).mean()  # (the float operations of alfish's loss, in its order)

    def actor_loss(self, exp):
        obs = exp.observation[:-1].flatten(0, 1)
        return -self.alg.critics(obs, torch.tanh(self.alg.actor(obs)), detach_params=True,
                                 members=slice(0, 1)).mean()

    def step(self, exp):
        self.steps += 1
        for loss in [self.critic_loss] + ([self.actor_loss] if self.steps % self.alg.policy_delay == 0 else []):
            self.optimizer.zero_grad(set_to_none=True)
            loss(exp).backward()
            self.optimizer.step()  # only the parameters this loss reached have gradients: the others stay put
        if self.steps % self.alg.policy_delay == 0:
            polyak_update(self.alg.target_actor, self.alg.actor, self.alg.tau())
            polyak_update(self.alg.target_critics, self.alg.critics, self.alg.tau())


@pytest.mark.parametrize("policy_delay", [1, 2])
def test_critic_first_makes_the_reference_orders_actor_step_one_update_later(policy_delay):
    alfish, joint = make("critic_first", policy_delay=policy_delay), make("joint", policy_delay=policy_delay)
    reference = ReferenceOrder(make("joint", policy_delay=policy_delay))
    learners = [Learner(alfish), Learner(joint)]
    data = batches(policy_delay + 1)
    for exp in data[:policy_delay]:  # up to the first step the actor is due at
        for learner in learners:
            learner.update(exp)
        reference.step(exp)
    # The critics' steps are the reference's; the actor has not moved in the deferred order yet.
    assert_same(params(alfish.critics), params(reference.alg.critics))
    assert_same(params(alfish.actor), params(make("joint").actor))
    assert alfish.deferred_observations.shape == (2 * 4, 3)  # the batch kept for the actor: [(L-1) * B, obs_dim]
    learners[0].update(data[policy_delay])  # its actor term: the kept batch, the critic after the previous step
    assert_same(params(alfish.actor), params(reference.alg.actor))
    assert_same(params(alfish.target_actor), params(reference.alg.target_actor))
    # ... where the joint order's actor step read the critic before that step: not the same actor.
    assert not all(torch.equal(a, b) for a, b in zip(params(joint.actor), params(reference.alg.actor)))


def test_the_kept_batch_is_checkpointed_and_a_resume_takes_the_same_actor_step():
    data = batches(3)
    run = make("critic_first", policy_delay=2)
    learner = Learner(run)
    for exp in data[:2]:
        learner.update(exp)
    state = {k: v.clone() for k, v in run.state_dict().items()}
    optimizer_state = copy.deepcopy(learner.optimizer.state_dict())  # (a checkpoint's copy, not the live moments)
    assert state["deferred_observations"].shape == (8, 3) and state["deferred_valid"].shape == (8,)
    resumed = make("critic_first", policy_delay=2)
    assert resumed.deferred_observations.shape == (0,)
    resumed.load_state_dict(state)  # takes the kept batch's shape
    resumed_learner = Learner(resumed)
    resumed_learner.optimizer.load_state_dict(optimizer_state)
    learner.update(data[2])
    resumed_learner.update(data[2])
    assert_same(params(resumed), params(run))
    assert_same(list(resumed.buffers()), list(run.buffers()))


def test_the_actor_term_is_masked_by_its_own_batchs_last_steps():
    alg = make("critic_first", policy_delay=1)
    first, second = batches(2)
    step_type = first.step_type.clone()
    step_type[1, 2] = StepType.LAST  # the kept batch's transition out of a LAST step: no actor term for it
    first = first._replace(step_type=step_type)
    alg.calc_loss(first, alg.train_step(first).info)
    alg.after_update()
    info = alg.train_step(second).info
    loss = alg.calc_loss(second, info).loss.detach()
    assert info.actor_valid.tolist() == [1.0] * 6 + [0.0] + [1.0]  # row (1, 2) of [L-1, B] = index 1 * 4 + 2
    critic_only = info.critic_loss.detach().view(L_ - 1, 4)
    torch.testing.assert_close(loss[1, 2], critic_only[1, 2])  # this batch's row 6 is valid; the kept one was not
    assert not torch.equal(loss[0, 0], critic_only[0, 0])


def test_targets_move_after_the_step_that_trained_the_actor():
    alg = make("critic_first", policy_delay=2)
    learner = Learner(alg)
    moved = []
    for exp in batches(6):
        before = params(alg.target_actor)
        learner.update(exp)
        moved.append(not all(torch.equal(a, b) for a, b in zip(before, params(alg.target_actor))))
    assert moved == [False, False, True, False, True, False]  # joint order: updates 2, 4, 6; here 3 and 5


def test_ddp_looks_for_the_actor_left_out_of_the_first_update_even_without_a_delay():
    assert make("critic_first", cls=DdpgAlgorithm).skips_parameters_in_some_updates  # (find_unused_parameters)
    assert not make("joint", cls=DdpgAlgorithm).skips_parameters_in_some_updates


def test_bad_settings_are_one_line_errors():
    with pytest.raises(ValueError, match=r"^Td3Algorithm.update_order='sb3': use one of \('joint', 'critic_first'\)"):
        make("sb3")
    box = gym.spaces.Box(-1.0, 1.0, (2,))
    with pytest.raises(ValueError, match=r"update_order='critic_first' keeps a batch's observations .* Dict"):
        DdpgAlgorithm(gym.spaces.Dict(a=box), box, update_order="critic_first")
    alg = make("critic_first")
    assert alg.replay_refusal(prioritized=False, offline=False) is None
    assert "TrainerConfig.priority_replay=True" in alg.replay_refusal(prioritized=True, offline=False)
    assert "offline data" in alg.replay_refusal(prioritized=False, offline=True)
    assert make("joint").replay_refusal(prioritized=True, offline=True) is None


def test_the_kept_batch_buffers_are_sized_before_the_update_which_only_copies_into_them():
    # (a compiled update with CUDA graphs must not allocate them: the graph's next replay would overwrite its outputs)
    alg = make("critic_first", policy_delay=1)
    first, second = batches(2)
    alg.before_update(first)
    kept, valid = alg.deferred_observations, alg.deferred_valid
    assert kept.shape == ((L_ - 1) * 4, 3) and kept.dtype == torch.float32 and valid.shape == ((L_ - 1) * 4,)
    Learner(alg).update(first)  # calls before_update again (same shape: nothing reallocated), then keeps the batch
    assert alg.deferred_observations is kept and alg.deferred_valid is valid
    torch.testing.assert_close(kept, first.observation[:-1].flatten(0, 1), rtol=0, atol=0)
    assert valid.tolist() == [1.0] * ((L_ - 1) * 4)
    alg.before_update(second._replace(observation=second.observation[:, :2], step_type=second.step_type[:, :2],
                                      reward=second.reward[:, :2]))  # a smaller batch: resized before its update
    assert alg.deferred_observations.shape == ((L_ - 1) * 2, 3) and alg.deferred_valid.shape == ((L_ - 1) * 2,)
    joint = make("joint")  # the joint order keeps nothing
    joint.before_update(first)
    assert "deferred_observations" not in dict(joint.named_buffers())
