"""Is alfish's SAC update Stable-Baselines3's? One update of each from the same networks, batch and noise.

SB3's SAC is built for an env (HalfCheetah-v5 by default: its spaces and the RL Zoo networks, 256x256), its weights
are copied into an alfish ``SacAlgorithm`` (actor: ``latent_pi`` + ``mu``/``log_std`` = alfish's MLP, whose last layer
gives mean then log-std; twin critics: ``qf0``/``qf1`` = the members of alfish's ``EnsembleCritic``, weights
transposed; temperature ``log_ent_coef`` = ``log_alpha``), and both take one update on the same random batch with the
same Gaussian draws (SB3 draws the current observations' actions first, alfish the next ones': each gets the same two
tensors in its own order). SB3 runs in alfish's order (``scripts/sb3_peer.py``'s ``use_combined_update_order``: the
actor's loss on the critic before that update's step), so the gradients of all three losses are comparable; and once
in its own order, to show what that order changes (the actor's gradient only).

Printed per parameter group: the largest relative difference of the gradients, ``max |g_alfish - g_sb3| / max
|g_sb3|``. Usage::

    python tools/bench/sac_update_vs_sb3.py [--env HalfCheetah-v5] [--batch 256] [--seeds 3] [--done_fraction 0.1]

needs Stable-Baselines3 (``pip install -r tools/bench/requirements-peers.txt``) and the env's extra (MuJoCo).
"""
from __future__ import annotations

import argparse
import pathlib
import sys
from contextlib import contextmanager
from typing import Iterator

import gymnasium as gym
import numpy as np
import torch

from alfish.algorithms.sac import SacAlgorithm
from alfish.data.types import Experience, StepType

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))


def sb3_sac(env_name: str, seed: int):
    """SB3's SAC at its (and RL Zoo's) defaults for ``env_name``, logging nowhere."""
    from stable_baselines3 import SAC
    from stable_baselines3.common.logger import configure

    model = SAC("MlpPolicy", env_name, learning_starts=0, seed=seed, device="cpu")
    model.set_logger(configure(None, []))
    return model


def alfish_copy(model) -> SacAlgorithm:
    """An alfish SAC with ``model``'s weights: actor, critics, target critics and temperature."""
    sac = SacAlgorithm(model.observation_space, model.action_space, hidden_sizes=(256, 256))
    actor, critic = model.actor, model.critic
    with torch.no_grad():
        sb3_actor = [actor.latent_pi[0], actor.latent_pi[2]]
        for mine, theirs in zip([sac.actor[0], sac.actor[2]], sb3_actor):
            mine.weight.copy_(theirs.weight)
            mine.bias.copy_(theirs.bias)
        sac.actor[4].weight.copy_(torch.cat([actor.mu.weight, actor.log_std.weight]))  # mean first, then log-std
        sac.actor[4].bias.copy_(torch.cat([actor.mu.bias, actor.log_std.bias]))
        for ensemble, sb3_critic in ((sac.critics, critic), (sac.target_critics, model.critic_target)):
            for member, q_net in enumerate(sb3_critic.q_networks):
                linears = [m for m in q_net if isinstance(m, torch.nn.Linear)]
                for layer, linear in enumerate(linears):
                    ensemble.weights[layer][member].copy_(linear.weight.T)
                    ensemble.biases[layer][member, 0].copy_(linear.bias)
        sac.log_alpha.copy_(model.log_ent_coef.detach().reshape(sac.log_alpha.shape))
    return sac


@contextmanager
def draws(target: object, name: str, tensors: list[torch.Tensor]) -> Iterator[None]:
    """``target.name`` returns ``tensors`` in turn instead of drawing (each call must ask for that shape)."""
    original, queue = getattr(target, name), list(tensors)

    def replay(*args, **kwargs):
        return queue.pop(0).clone()

    setattr(target, name, replay)
    try:
        yield
    finally:
        setattr(target, name, original)
    assert not queue, f"{len(queue)} prepared draws were not used"


def grads(params) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in params])


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def compare(env_name: str, batch: int, seed: int, done_fraction: float) -> dict[str, float]:
    """One update of each framework from the same state; the gradients' relative differences."""
    import sb3_peer
    from stable_baselines3.common.type_aliases import ReplayBufferSamples

    gen = torch.Generator().manual_seed(seed)
    combined, own = sb3_sac(env_name, seed), sb3_sac(env_name, seed)
    sb3_peer.use_combined_update_order(combined)
    sac = alfish_copy(combined)
    obs_dim, act_dim = sac.obs_dim, sac.action_dim
    obs, next_obs = torch.randn(2, batch, obs_dim, generator=gen)
    action = torch.rand(batch, act_dim, generator=gen) * 2 - 1   # SB3 stores actions in the unit box
    reward = torch.randn(batch, generator=gen)
    done = (torch.rand(batch, generator=gen) < done_fraction).float()
    eps_now, eps_next = torch.randn(2, batch, act_dim, generator=gen)

    samples = ReplayBufferSamples(obs, action, next_obs, done.reshape(-1, 1), reward.reshape(-1, 1), None)
    for model in (combined, own):
        model.replay_buffer.sample = lambda *args, **kwargs: samples
        with draws(torch.distributions.normal, "_standard_normal", [eps_now, eps_next]):  # SB3's order
            model.train(gradient_steps=1, batch_size=batch)

    step_type = torch.full((2, batch), int(StepType.MID), dtype=torch.int8)
    step_type[1] = torch.where(done.bool(), int(StepType.LAST), int(StepType.MID)).to(torch.int8)
    exp = Experience(step_type=step_type, reward=torch.stack([torch.zeros(batch), reward]),
                     discount=torch.stack([torch.ones(batch), 1.0 - done]), observation=torch.stack([obs, next_obs]),
                     action=torch.stack([sac.scale_action(action), torch.zeros_like(action)]),  # (env scale)
                     env_id=torch.arange(batch).expand(2, batch))
    with draws(torch, "randn_like", [eps_next, eps_now]):  # alfish's order: the next step's action first
        loss_info = sac.calc_loss(exp, sac.train_step(exp).info)
    loss_info.loss.mean().backward()

    return dict(
        actor=relative(alfish_actor_grads(sac), grads(sb3_actor_params(combined))),
        critics=relative(alfish_critic_grads(sac), sb3_critic_grads(combined)),
        temperature=relative(sac.log_alpha.grad.reshape(-1), combined.log_ent_coef.grad.reshape(-1)),
        actor_sb3_own_order=relative(alfish_actor_grads(sac), grads(sb3_actor_params(own))),
    )


def sb3_actor_params(model) -> list[torch.nn.Parameter]:
    """SB3's actor parameters in alfish's layout order: the two hidden layers, then mean and log-std heads."""
    actor = model.actor
    return [actor.latent_pi[0].weight, actor.latent_pi[0].bias, actor.latent_pi[2].weight, actor.latent_pi[2].bias,
            actor.mu.weight, actor.log_std.weight, actor.mu.bias, actor.log_std.bias]


def alfish_actor_grads(sac: SacAlgorithm) -> torch.Tensor:
    a = sac.actor
    return torch.cat([t.reshape(-1) for t in (a[0].weight.grad, a[0].bias.grad, a[2].weight.grad, a[2].bias.grad,
                                              a[4].weight.grad, a[4].bias.grad)])


def sb3_critic_grads(model) -> torch.Tensor:
    """SB3's critic gradients in alfish's ensemble layout: per layer, both members' weights (transposed), then
    biases."""
    layers = [[m for m in q if isinstance(m, torch.nn.Linear)] for q in model.critic.q_networks]
    weights = [torch.stack([layers[e][i].weight.grad.T for e in range(2)]) for i in range(3)]
    biases = [torch.stack([layers[e][i].bias.grad.reshape(1, -1) for e in range(2)]) for i in range(3)]
    return torch.cat([t.reshape(-1) for t in weights + biases])


def alfish_critic_grads(sac: SacAlgorithm) -> torch.Tensor:
    c = sac.critics
    return torch.cat([c.weights[i].grad.reshape(-1) for i in range(3)] +
                     [c.biases[i].grad.reshape(-1) for i in range(3)])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--done_fraction", type=float, default=0.1,
                        help="share of the batch's transitions that end in a termination (no bootstrap)")
    args = parser.parse_args(argv)
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        print("error: needs Stable-Baselines3: pip install -r tools/bench/requirements-peers.txt", file=sys.stderr)
        return 2
    gym.make(args.env).close()  # a missing extra fails here, with gymnasium's message
    torch.set_num_threads(1)
    np.set_printoptions(precision=3)
    print("max |g_alfish - g_sb3| / max |g_sb3| after one update (SB3 in alfish's order; last column: in its own)")
    for seed in range(args.seeds):
        diffs = compare(args.env, args.batch, seed, args.done_fraction)
        print(f"seed {seed}: " + "  ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
