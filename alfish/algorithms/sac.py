"""Soft Actor-Critic (Haarnoja et al. 2018, "SAC: Algorithms and Applications"), continuous actions.

Twin critics are one ``EnsembleMLP`` (one batched matmul per layer); the entropy temperature is learned on log-alpha.
The three losses are summed into one and back-propagated once: the critic term sees the TD target computed without
gradient, the actor term reads the critics through detached weights, the alpha term sees a detached log-prob.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, NamedTuple, Optional, Sequence

import gin
import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from alfish.algorithms.base import OffPolicyAlgorithm, UpdateCounter
from alfish.algorithms.debug_stats import masked_stats
from alfish.data.types import EMPTY, AlgStep, Experience, LossInfo, StepType
from alfish.networks.distributions import tanh_gaussian_sample
from alfish.networks.mlp import polyak_update
from alfish.schedulers import Scheduler, as_scheduler

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # as SB3 and the SAC reference implementation


class SacTrainInfo(NamedTuple):
    td_error: torch.Tensor     # [N], |Q - target| averaged over the critics (replay priority)
    critic_loss: torch.Tensor  # [N]
    actor_loss: torch.Tensor   # [N]
    alpha_loss: torch.Tensor   # [N]
    log_prob: torch.Tensor     # [N]
    q: torch.Tensor            # [E, N], Q_i(s, a) of the replayed action (its graph is the critic term's; debug only)
    td_target: torch.Tensor    # [N], r + gamma * discount * soft V(s'), no gradient


@gin.configurable
class SacAlgorithm(UpdateCounter, OffPolicyAlgorithm):
    """SAC.

    Args:
        hidden_sizes: hidden layers of the actor and of each critic.
        actor_lr, critic_lr, alpha_lr: Adam learning rates of the three parameter groups (numbers or schedules).
        gamma: discount per env step.
        target_update_tau: Polyak factor for target critics (1 = hard copy); a number or a schedule.
        target_update_period: optimizer steps between target updates.
        initial_log_alpha: starting log of the entropy temperature.
        target_entropy: entropy the temperature aims for (number or schedule); ``None`` means ``-action_dim``.
        num_critics: ensemble size; the TD target takes the minimum over members.
        actor_network_cls: ``cls(observation_space, 2 * action_dim)`` -> the actor (``obs -> [N, 2 * action_dim]``:
            mean and log-std of the pre-tanh Gaussian); ``None``: an MLP of ``hidden_sizes`` (through
            ``EncodingNetwork`` for images and dicts). See ``alfish.networks.heads`` for the contract.
        critic_network_cls: ``cls(observation_space, action_dim)`` -> one critic (``(obs, action) -> [N, 1]``); the
            ``num_critics`` members are one ``VmapEnsemble``. ``None``: MLP critics of ``hidden_sizes``.
    """

    rollout_module_names = ("actor",)  # async unroll ships only these to its child

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Space,
                 hidden_sizes: Sequence[int] = (256, 256), actor_lr: float | Scheduler = 3e-4,
                 critic_lr: float | Scheduler = 3e-4, alpha_lr: float | Scheduler = 3e-4, gamma: float = 0.99,
                 target_update_tau: float | Scheduler = 0.005, target_update_period: int = 1,
                 initial_log_alpha: float = 0.0, target_entropy: Optional[float | Scheduler] = None,
                 num_critics: int = 2, actor_network_cls: Optional[Callable[..., nn.Module]] = None,
                 critic_network_cls: Optional[Callable[..., nn.Module]] = None):
        super().__init__(observation_space, action_space)
        if self.discrete:
            raise ValueError(f"SacAlgorithm needs a Box action space, got {action_space}; use PpoAlgorithm or "
                             "A2cAlgorithm for discrete actions")
        if target_update_period < 1:
            raise ValueError(f"SacAlgorithm.target_update_period={target_update_period} must be >= 1")
        self.use_networks(actor_network_cls, critic_network_cls)
        self.actor = self.build_network(actor_network_cls, 2 * self.action_dim, hidden_sizes)
        self.critics = self.build_critics(critic_network_cls, num_critics, hidden_sizes)
        self.target_critics = copy.deepcopy(self.critics).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(float(initial_log_alpha)))
        self.gamma = gamma
        self.tau = as_scheduler(target_update_tau)
        self.target_update_period = target_update_period
        self.target_entropy = as_scheduler(-float(self.action_dim) if target_entropy is None else target_entropy)
        self._lrs = dict(actor=actor_lr, critic=critic_lr, alpha=alpha_lr)
        self._init_update_counter()  # the num_updates buffer, mirrored by a Python int (no sync in after_update)

    def param_groups(self) -> list[dict]:
        return [dict(name="actor", params=list(self.actor.parameters()), lr=self._lrs["actor"]),
                dict(name="critic", params=list(self.critics.parameters()), lr=self._lrs["critic"]),
                dict(name="alpha", params=[self.log_alpha], lr=self._lrs["alpha"])]

    # ----------------------------------------------------------------------------------------------------- acting --
    def _policy(self, obs: torch.Tensor, greedy: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Unit-box action ``[N, action_dim]`` and its log-prob ``[N]``.

        ``hardtanh`` is ``clamp`` to [LOG_STD_MIN, LOG_STD_MAX] with a one-kernel backward (clamp's backward is five
        aten ops); the two gradients differ only where ``log_std`` sits exactly on a bound.
        """
        mean, log_std = self.actor(obs).chunk(2, dim=-1)
        return tanh_gaussian_sample(mean, F.hardtanh(log_std, LOG_STD_MIN, LOG_STD_MAX), deterministic=greedy)

    def _act(self, obs: torch.Tensor, greedy: bool) -> tuple[torch.Tensor, Any]:
        unit_action, _ = self._policy(self.network_input(obs), greedy)
        return self.scale_action(unit_action), EMPTY

    # --------------------------------------------------------------------------------------------------- training --
    def train_step(self, exp: Experience, state: Any = EMPTY) -> AlgStep:
        """Losses of the ``L-1`` transitions of ``exp`` ``[L, B]``, each ``[N = (L-1) * B]``.

        Written in few aten ops (each costs several microseconds on the CPU, as much as the arithmetic of a [N]
        tensor): ``addcmul`` for the TD target, ``amin`` where no gradient (hence no argmin) is needed.
        """
        obs = self.network_input(exp.observation, batch_dims=2)                # [L, B, obs_dim] (flat mode)
        obs_t, obs_next = self.steps(obs, slice(None, -1)), self.steps(obs, slice(1, None))   # [N, obs_dim]
        act_t = self.unscale_action(exp.action[:-1].flatten(0, 1))             # [N, action_dim]
        reward, discount = exp.reward[1:].flatten(), exp.discount[1:].flatten()
        alpha = self.log_alpha.detach().exp()

        with torch.no_grad():
            next_action, next_log_prob = self._policy(obs_next, greedy=False)
            next_q = self.target_critics(obs_next, next_action).amin(0).squeeze(-1)   # [N]
            soft_value = torch.addcmul(next_q, alpha, next_log_prob, value=-1.0)  # next_q - alpha * log_prob
            td_target = torch.addcmul(reward, discount, soft_value, value=self.gamma)

        q = self.critics(obs_t, act_t).squeeze(-1)                              # [E, N]
        td = q - td_target
        critic_loss = 0.5 * (td ** 2).sum(0)

        new_action, log_prob = self._policy(obs_t, greedy=False)
        q_new = self.critics(obs_t, new_action, detach_params=True).min(0).values.squeeze(-1)
        actor_loss = alpha * log_prob - q_new

        log_prob = log_prob.detach()
        # -log_alpha * (log_prob + target_entropy), as log_alpha * (-target_entropy - log_prob): the same floats
        alpha_loss = self.log_alpha * torch.rsub(log_prob, -self.target_entropy())
        return AlgStep(info=SacTrainInfo(td.detach().abs().mean(0), critic_loss, actor_loss, alpha_loss, log_prob, q,
                                         td_target))

    def calc_loss(self, exp: Experience, train_info: SacTrainInfo) -> LossInfo:
        """Per-transition loss ``[L-1, B]``; transitions out of a LAST step (env autoreset) are masked out."""
        valid = exp.step_type[:-1] != StepType.LAST                             # [L-1, B]
        shape = valid.shape
        valid = valid.flatten().to(train_info.critic_loss.dtype)
        loss = (train_info.critic_loss + train_info.actor_loss).add_(train_info.alpha_loss).mul_(valid)

        def extra() -> dict[str, torch.Tensor]:  # evaluated only when a summary is due
            count = valid.sum().clamp(min=1.0)
            terms = torch.stack([train_info.critic_loss, train_info.actor_loss, train_info.alpha_loss,
                                 -train_info.log_prob]).detach()
            means = (terms * valid).sum(-1) / count
            out = dict(critic_loss=means[0], actor_loss=means[1], alpha_loss=means[2], entropy=means[3],
                       alpha=self.log_alpha.detach().exp())
            if self.debug_summaries:  # TrainerConfig.debug_summaries: Q over every critic, entropy per sample
                out.update(masked_stats("q", train_info.q, valid))
                out.update(masked_stats("td_target", train_info.td_target, valid))
                out.update(masked_stats("entropy", -train_info.log_prob, valid))
                out["debug/alpha"] = out["alpha"]
                out["debug/target_entropy"] = torch.tensor(float(self.target_entropy()), device=valid.device)
            return out

        # Replay priority of each sampled sequence [B]: its transitions' mean |TD error|.
        priority = (train_info.td_error * valid).view(shape).mean(0)
        return LossInfo(loss=loss.view(shape), extra=extra, priority=priority)

    def after_update(self) -> None:
        """Counts the optimizer step; on every ``target_update_period``-th, Polyak-averages the target critics
        towards the critics. The period is decided on the Python mirror of the count: no host sync."""
        if self._count_update() % self.target_update_period == 0:
            polyak_update(self.target_critics, self.critics, self.tau())
