"""Implicit Q-Learning (Kostrikov, Nair, Levine 2021, "Offline Reinforcement Learning with Implicit Q-Learning"),
continuous actions, with d3rlpy 2.x's defaults.

IQL never evaluates Q at an action outside the dataset. Per transition ``(s, a, r, s')`` of the dataset:
    value:  L2_tau(min_i Q_target_i(s, a) - V(s)),  L2_tau(u) = |tau - 1(u < 0)| u^2   (expectile regression)
    critic: sum_i 0.5 (Q_i(s, a) - (r + gamma * discount * V(s')))^2
    actor:  -min(exp(beta * (min_i Q_target_i(s, a) - V(s))), max_weight) * log pi(a | s)   (advantage-weighted)
The three are summed into one loss and back-propagated once: each reads the others' networks through values computed
without gradient (the target critics need none; ``V(s')`` in the critic's target and ``V(s)`` in the advantage are
detached), so the value term trains only V, the critic term only the critics, the actor term only the actor.

The actor is d3rlpy's ``NormalPolicy`` with ``use_std_parameter=True`` (as the paper's code): a Gaussian whose mean is
``tanh(actor(s))`` and whose log-std is one state-independent parameter per action dim, squashed into
``[LOG_STD_MIN, LOG_STD_MAX]`` by a sigmoid. The distribution itself is not squashed: the log-likelihood of a dataset
action on the unit box's edge (clipped torques are common in datasets) stays finite, where a tanh-Gaussian's would
need ``atanh`` of a clipped action and a large Jacobian term. ``predict_step`` takes the mean; ``rollout_step`` a
sample clipped to the box (so IQL can also fine-tune online).
"""
from __future__ import annotations

import copy
import math
from typing import Any, Callable, NamedTuple, Optional, Sequence

import gin
import gymnasium as gym
import torch
from torch import nn

from alfish.algorithms.base import OffPolicyAlgorithm, UpdateCounter
from alfish.algorithms.debug_stats import masked_stats
from alfish.data.types import EMPTY, AlgStep, Experience, LossInfo, StepType
from alfish.networks.distributions import gaussian_log_prob
from alfish.networks.mlp import polyak_update
from alfish.schedulers import Scheduler, as_scheduler

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0  # d3rlpy's IQL policy (create_normal_policy(min_logstd=-5, max_logstd=2))


def expectile_loss(diff: torch.Tensor, expectile: float) -> torch.Tensor:
    """``|expectile - 1(diff < 0)| * diff^2``, elementwise: residuals above zero weigh ``expectile``, below
    ``1 - expectile``; with ``expectile > 0.5`` the fit leans to an upper expectile of the targets."""
    weight = torch.where(diff < 0, 1.0 - expectile, expectile)
    return weight * diff.square()


class IqlTrainInfo(NamedTuple):
    td_error: torch.Tensor     # [N], |Q - target| averaged over the critics (replay priority), detached
    value_loss: torch.Tensor   # [N]
    critic_loss: torch.Tensor  # [N]
    actor_loss: torch.Tensor   # [N]
    advantage: torch.Tensor    # [N], min Q_target(s, a) - V(s), detached
    weight: torch.Tensor       # [N], the actor's clipped exp(beta * advantage), detached
    q: torch.Tensor            # [E, N], Q_i(s, a) of the dataset action (its graph is the critic term's; debug only)
    td_target: torch.Tensor    # [N], r + gamma * discount * V(s'), no gradient


@gin.configurable
class IqlAlgorithm(UpdateCounter, OffPolicyAlgorithm):
    """IQL.

    Args:
        hidden_sizes: hidden layers of the actor, of each critic and of the value network.
        actor_lr, critic_lr, value_lr: Adam learning rates of the three parameter groups (numbers or schedules).
        gamma: discount per env step.
        target_update_tau: Polyak factor for target critics (1 = hard copy); a number or a schedule.
        target_update_period: optimizer steps between target updates.
        expectile: the value network's expectile ``tau`` in (0, 1); 0.5 is a mean, towards 1 a max over the dataset's
            actions.
        weight_temp: the inverse temperature ``beta`` of the actor's advantage weights (0: behaviour cloning).
        max_weight: the advantage weights are clipped to at most this.
        num_critics: critic ensemble size; the value and actor terms read the minimum over the target critics.
        actor_network_cls: ``cls(observation_space, action_dim)`` -> the actor's mean network (``obs -> [N,
            action_dim]``, before tanh); ``None``: an MLP of ``hidden_sizes`` (through ``EncodingNetwork`` for
            images and dicts). See ``alfish.networks.heads`` for the contract.
        critic_network_cls: ``cls(observation_space, action_dim)`` -> one critic (``(obs, action) -> [N, 1]``); the
            ``num_critics`` members are one ``VmapEnsemble``. ``None``: MLP critics of ``hidden_sizes``.
        value_network_cls: ``cls(observation_space, 1)`` -> the value network (``obs -> [N, 1]``); ``None``: an MLP
            of ``hidden_sizes``.

    Parameters: ``actor.*`` and ``actor_log_std`` (group ``actor``), ``critics.*`` (``critic``), ``value_net.*``
    (``value``); ``target_critics.*`` are not optimized.
    """

    rollout_module_names = ("actor", "actor_log_std")  # async unroll ships only these to its child

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Space,
                 hidden_sizes: Sequence[int] = (256, 256), actor_lr: float | Scheduler = 3e-4,
                 critic_lr: float | Scheduler = 3e-4, value_lr: float | Scheduler = 3e-4, gamma: float = 0.99,
                 target_update_tau: float | Scheduler = 0.005, target_update_period: int = 1,
                 expectile: float = 0.7, weight_temp: float = 3.0, max_weight: float = 100.0, num_critics: int = 2,
                 actor_network_cls: Optional[Callable[..., nn.Module]] = None,
                 critic_network_cls: Optional[Callable[..., nn.Module]] = None,
                 value_network_cls: Optional[Callable[..., nn.Module]] = None):
        super().__init__(observation_space, action_space)
        if self.discrete:
            raise ValueError(f"IqlAlgorithm needs a Box action space, got {action_space}; use BcAlgorithm or "
                             "DqnAlgorithm for discrete actions")
        if target_update_period < 1:
            raise ValueError(f"IqlAlgorithm.target_update_period={target_update_period} must be >= 1")
        if not 0.0 < expectile < 1.0:
            raise ValueError(f"IqlAlgorithm.expectile={expectile} must be in (0, 1)")
        if weight_temp < 0.0 or max_weight <= 0.0:
            raise ValueError(f"IqlAlgorithm.weight_temp={weight_temp} must be >= 0 and max_weight={max_weight} > 0")
        self.use_networks(actor_network_cls, critic_network_cls, value_network_cls)
        self.actor = self.build_network(actor_network_cls, self.action_dim, hidden_sizes)
        # d3rlpy's std parameter: log_std = MIN + (MAX - MIN) * sigmoid(p), p = 0 at the start (log_std -1.5).
        self.actor_log_std = nn.Parameter(torch.zeros(self.action_dim))
        self.critics = self.build_critics(critic_network_cls, num_critics, hidden_sizes)
        self.target_critics = copy.deepcopy(self.critics).requires_grad_(False)
        self.value_net = self.build_network(value_network_cls, 1, hidden_sizes)
        self.gamma = gamma
        self.tau = as_scheduler(target_update_tau)
        self.target_update_period = target_update_period
        self.expectile = expectile
        self.weight_temp = weight_temp
        # exp(min(x, log m)) == min(exp(x), m), without an inf from exp of a large advantage on the way
        self.log_max_weight = math.log(max_weight)
        self._lrs = dict(actor=actor_lr, critic=critic_lr, value=value_lr)
        self._init_update_counter()  # the num_updates buffer, mirrored by a Python int (no sync in after_update)

    def param_groups(self) -> list[dict]:
        return [dict(name="actor", params=[*self.actor.parameters(), self.actor_log_std], lr=self._lrs["actor"]),
                dict(name="critic", params=list(self.critics.parameters()), lr=self._lrs["critic"]),
                dict(name="value", params=list(self.value_net.parameters()), lr=self._lrs["value"])]

    # ----------------------------------------------------------------------------------------------------- acting --
    def _policy(self, obs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The Gaussian's mean ``[N, action_dim]`` (in [-1, 1]) and log-std ``[action_dim]``, float32."""
        mean = torch.tanh(self.actor(obs).float())
        log_std = torch.sigmoid(self.actor_log_std).mul(LOG_STD_MAX - LOG_STD_MIN).add(LOG_STD_MIN)
        return mean, log_std

    def _act(self, obs: Any, greedy: bool) -> tuple[torch.Tensor, Any]:
        mean, log_std = self._policy(self.network_input(obs))
        unit_action = mean if greedy else torch.addcmul(mean, log_std.exp(), torch.randn_like(mean)).clamp_(-1, 1)
        return self.scale_action(unit_action), EMPTY

    # --------------------------------------------------------------------------------------------------- training --
    def train_step(self, exp: Experience, state: Any = EMPTY) -> AlgStep:
        """Losses of the ``L-1`` transitions of ``exp`` ``[L, B]``, each ``[N = (L-1) * B]``."""
        obs = self.network_input(exp.observation, batch_dims=2)                # [L, B, obs_dim] (flat mode)
        obs_t = self.steps(obs, slice(None, -1))                                # [N, obs_dim]
        act_t = self.unscale_action(exp.action[:-1].flatten(0, 1))             # [N, action_dim] in [-1, 1]
        reward, discount = exp.reward[1:].flatten(), exp.discount[1:].flatten()
        length = exp.step_type.shape[0]

        # V of all L steps in one forward: rows :-1 are V(s) (trained by the value term), rows 1: are V(s').
        value = self.value_net(self.steps(obs, slice(None))).float().view(length, -1)   # [L, B]
        v_t = value[:-1].flatten()                                              # [N], with gradient
        with torch.no_grad():
            v_next = value[1:].flatten()                                        # [N], no gradient into V
            td_target = torch.addcmul(reward, discount, v_next, value=self.gamma)   # r + gamma * discount * V(s')
            q_target = self.target_critics(obs_t, act_t).amin(0).squeeze(-1).float()   # [N]
            advantage = q_target - v_t.detach()
            weight = (self.weight_temp * advantage).clamp_(max=self.log_max_weight).exp_()

        value_loss = expectile_loss(q_target - v_t, self.expectile)

        q = self.critics(obs_t, act_t).squeeze(-1)                              # [E, N]
        td = q - td_target
        critic_loss = 0.5 * td.square().sum(0)

        mean, log_std = self._policy(obs_t)
        actor_loss = -weight * gaussian_log_prob(act_t, mean, log_std)          # log_std broadcasts over N
        return AlgStep(info=IqlTrainInfo(td.detach().abs().mean(0), value_loss, critic_loss, actor_loss, advantage,
                                         weight, q, td_target))

    def calc_loss(self, exp: Experience, train_info: IqlTrainInfo) -> LossInfo:
        """Per-transition loss ``[L-1, B]``; transitions out of a LAST step (env autoreset, placeholder action) are
        masked out."""
        valid = exp.step_type[:-1] != StepType.LAST                             # [L-1, B]
        shape = valid.shape
        valid = valid.flatten().to(train_info.value_loss.dtype)  # float32 (the value term is computed in it)
        loss = (train_info.value_loss + train_info.critic_loss).add_(train_info.actor_loss).mul_(valid)

        def extra() -> dict[str, torch.Tensor]:  # evaluated only when a summary is due
            count = valid.sum().clamp(min=1.0)
            terms = torch.stack([train_info.value_loss, train_info.critic_loss, train_info.actor_loss,
                                 train_info.advantage, train_info.weight]).detach()
            means = (terms * valid).sum(-1) / count
            out = dict(value_loss=means[0], critic_loss=means[1], actor_loss=means[2], advantage=means[3],
                       weight=means[4])
            if self.debug_summaries:  # TrainerConfig.debug_summaries
                out.update(masked_stats("q", train_info.q, valid))
                out.update(masked_stats("td_target", train_info.td_target, valid))
                every = ("mean", "std", "min", "max")
                out.update(masked_stats("advantage", train_info.advantage, valid, every))
                out.update(masked_stats("weight", train_info.weight, valid, every))
            return out

        # Replay priority of each sampled sequence [B]: its transitions' mean |TD error|.
        priority = (train_info.td_error * valid).view(shape).mean(0)
        return LossInfo(loss=loss.view(shape), extra=extra, priority=priority)

    def after_update(self) -> None:
        """Counts the optimizer step; on every ``target_update_period``-th, Polyak-averages the target critics
        towards the critics. The period is decided on the Python mirror of the count: no host sync."""
        if self._count_update() % self.target_update_period == 0:
            polyak_update(self.target_critics, self.critics, self.tau())
