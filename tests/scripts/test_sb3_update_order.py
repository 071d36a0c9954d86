"""``scripts/sb3_peer.py --update_order combined``: SB3's TD3 and SAC trained in alfish's order (the actor's loss on
the critic before that update's critic step). Real SB3 models on Pendulum, updates from the same replay data; skipped
without Stable-Baselines3 (a comparison peer, never an alfish dependency)."""
import pathlib
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
sb3 = pytest.importorskip("stable_baselines3")

import sb3_peer  # noqa: E402
from stable_baselines3.common.logger import configure  # noqa: E402

BATCH = 32


def with_replay(model):
    """``model`` (a small Pendulum TD3 or SAC) logging nowhere, with 200 random transitions in its buffer."""
    model.set_logger(configure(None, []))
    rng = np.random.default_rng(0)
    for _ in range(200):
        obs, next_obs = rng.normal(size=(2, 1, 3)).astype(np.float32)
        action = rng.uniform(-1, 1, size=(1, 1)).astype(np.float32)
        model.replay_buffer.add(obs, next_obs, action, rng.normal(size=1), np.zeros(1), [{}])
    return model


def td3_with_replay() -> "sb3.TD3":
    """A small TD3 (same seed: the same initial networks every call) with 200 random transitions in its buffer."""
    model = sb3.TD3("MlpPolicy", "Pendulum-v1", buffer_size=1000, learning_starts=0, policy_delay=2, seed=0,
                    device="cpu", policy_kwargs=dict(net_arch=[16, 16]))
    return with_replay(model)


def seeded_train(model, updates: int) -> None:
    """``updates`` of SB3's ``train``, its batches and target noise drawn from fixed seeds."""
    np.random.seed(1)
    torch.manual_seed(1)
    model.train(gradient_steps=updates, batch_size=BATCH)


def flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def flat_grad(module: torch.nn.Module) -> torch.Tensor:
    """The gradients of the last backward pass (the actor's: SB3 zeroes them before each of its steps)."""
    return torch.cat([p.grad.flatten() for p in module.parameters()])


def test_combined_order_steps_the_actor_on_the_critic_before_its_step_and_the_critic_as_sb3_does():
    sb3_order, combined = td3_with_replay(), td3_with_replay()
    sb3_peer.use_combined_update_order(combined)
    assert torch.equal(flat(sb3_order.actor), flat(combined.actor))
    seeded_train(sb3_order, 2)  # update 1: the critics only; update 2: critics, then the delayed actor
    seeded_train(combined, 2)

    # The critics took the same two steps (the actor's backward pass added nothing to theirs), hence the same targets.
    assert torch.equal(flat(sb3_order.critic), flat(combined.critic))
    assert torch.equal(flat(sb3_order.critic_target), flat(combined.critic_target))
    # The actors' gradients differ: each read another critic. (Their parameters need not: Adam's first step is the
    # learning rate times the gradient's sign.)
    assert not torch.allclose(flat_grad(sb3_order.actor), flat_grad(combined.actor))

    # By hand: update 1 as SB3 (the critics only), then update 2's batch and the actor's step on the critic as it was
    # before update 2's critic step.
    reference = td3_with_replay()
    seeded_train(reference, 1)
    np.random.seed(1)
    np.random.randint(0, 200, size=BATCH)  # update 1's draw of batch indices
    batch = reference.replay_buffer.sample(BATCH)
    actor_loss = -reference.critic.q1_forward(batch.observations, reference.actor(batch.observations)).mean()
    reference.actor.optimizer.zero_grad()
    actor_loss.backward()
    reference.actor.optimizer.step()
    assert torch.allclose(flat_grad(reference.actor), flat_grad(combined.actor), atol=1e-7, rtol=1e-6)
    assert torch.allclose(flat(reference.actor), flat(combined.actor), atol=1e-7, rtol=0)


def sac_with_replay() -> "sb3.SAC":
    """A small SAC (same seed: the same initial networks every call) with 200 random transitions in its buffer."""
    model = sb3.SAC("MlpPolicy", "Pendulum-v1", buffer_size=1000, learning_starts=0, seed=0, device="cpu",
                    policy_kwargs=dict(net_arch=[16, 16]))
    return with_replay(model)


def test_sac_in_the_combined_order_steps_its_actor_on_the_critic_before_the_critic_step():
    sb3_order, combined = sac_with_replay(), sac_with_replay()
    sb3_peer.use_combined_update_order(combined)
    before = sac_with_replay()  # the model as both were before the update: the reference's critic and actor
    seeded_train(sb3_order, 1)
    seeded_train(combined, 1)

    # The critics and the temperature took the same step (the actor's backward pass added nothing to the critics').
    assert torch.equal(flat(sb3_order.critic), flat(combined.critic))
    assert torch.equal(flat(sb3_order.critic_target), flat(combined.critic_target))
    assert torch.equal(sb3_order.log_ent_coef, combined.log_ent_coef)
    assert not torch.allclose(flat_grad(sb3_order.actor), flat_grad(combined.actor))  # each read another critic

    # By hand: the actor's loss on the critic before the update (SB3's first draw of the update is the actor's
    # reparameterised sample of the batch's observations; the temperature is read before its own step).
    np.random.seed(1)
    torch.manual_seed(1)
    batch = before.replay_buffer.sample(BATCH)
    actions, log_prob = before.actor.action_log_prob(batch.observations)
    q = torch.cat(before.critic(batch.observations, actions), dim=1).min(dim=1, keepdim=True).values
    actor_loss = (torch.exp(before.log_ent_coef.detach()) * log_prob.reshape(-1, 1) - q).mean()
    before.actor.optimizer.zero_grad()
    actor_loss.backward()
    assert torch.allclose(flat_grad(before.actor), flat_grad(combined.actor), atol=1e-7, rtol=1e-6)


def test_update_order_is_refused_for_an_algorithm_without_an_actor_and_critics(capsys):
    conf = pathlib.Path(__file__).resolve().parents[2] / "confs" / "ppo_halfcheetah.gin"
    code = sb3_peer.main(["--conf", str(conf), "--root_dir", "/nonexistent", "--update_order", "combined"])
    assert code == 2
    assert "applies to TD3, DDPG and SAC, not to PPO" in capsys.readouterr().err
