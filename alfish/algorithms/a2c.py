"""Advantage Actor-Critic (Mnih et al. 2016, synchronous): trains on the trajectory it just unrolled, with gradients."""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Sequence

import gin
import gymnasium as gym
import torch
from torch import nn

from alfish.algorithms.actor_critic import ActorCriticNetworks, ActorCriticParams
from alfish.algorithms.base import OnPolicyAlgorithm
from alfish.algorithms.debug_stats import explained_variance, masked_stats
from alfish.data import nest
from alfish.data.types import EMPTY, Experience, LossInfo, StepType
from alfish.losses.returns import generalized_advantage_estimation, masked_standardize
from alfish.losses.vtrace import VTraceSettings, vtrace_returns
from alfish.networks.initialization import init_policy_value
from alfish.schedulers import Scheduler, TracedValue


class A2cRolloutInfo(NamedTuple):
    log_prob: torch.Tensor  # [B], with grad
    entropy: torch.Tensor   # [B], with grad
    value: torch.Tensor     # [B], with grad
    behaviour_log_prob: Any = EMPTY  # [B]: the acting policy's (off_policy_correction='vtrace'), no grad


@gin.configurable
class A2cAlgorithm(ActorCriticParams, OnPolicyAlgorithm):
    """A2C on the on-policy path: ``calc_loss`` receives the unroll ``[T+1, B]`` whose rollout infos carry gradients;
    the last row only bootstraps.

    Args: hidden_sizes/activation (policy and value MLPs), lr (Adam), gamma, gae_lambda (1.0 gives n-step returns),
    value_loss_coef, entropy_coef, normalize_advantages (standardize over the unroll). lr and entropy_coef may be
    schedules (alfish.schedulers). actor_network_ctor, value_network_ctor: the networks' constructors, as PPO's.
    ortho_init: SB3's ``ortho_init`` (True, False, or None: alfish's init), as PPO's.
    off_policy_correction: ``'vtrace'``: the policy gradient and value targets are V-trace's (IMPALA:
    ``pg_advantage`` and ``value_target`` of ``alfish.losses.vtrace``, ``gae_lambda`` as its lambda, the policy-
    gradient weight truncated at ``vtrace_clip_rho``), with the acting policy's log-probabilities kept from the
    unroll: what ``TrainerConfig.async_unroll`` needs (older parameters act). On data the current parameters acted
    it equals the uncorrected loss when ``gae_lambda = 1`` (the default). ``None``: GAE, synchronous unroll only.
    vtrace_clip_rho, vtrace_clip_c: V-trace's rho-bar and c-bar (IMPALA's 1 and 1).
    """


    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Space,
                 hidden_sizes: Sequence[int] = (64, 64), activation: str = "tanh", lr: float | Scheduler = 7e-4,
                 gamma: float = 0.99, gae_lambda: float = 1.0, value_loss_coef: float = 0.5,
                 entropy_coef: float | Scheduler = 0.0, normalize_advantages: bool = False,
                 actor_network_ctor: Optional[Callable[..., nn.Module]] = None,
                 value_network_ctor: Optional[Callable[..., nn.Module]] = None,
                 ortho_init: Optional[bool] = None, off_policy_correction: Optional[str] = None,
                 vtrace_clip_rho: float = 1.0, vtrace_clip_c: float = 1.0):
        super().__init__(observation_space, action_space)
        self.use_off_policy_correction(off_policy_correction, vtrace_clip_rho, vtrace_clip_c)
        self.use_networks(actor_network_ctor, value_network_ctor)
        self.net = ActorCriticNetworks(self, hidden_sizes, activation, actor_network_ctor=actor_network_ctor,
                                       value_network_ctor=value_network_ctor)
        init_policy_value(ortho_init, self.net.policy, self.net.value_net, self.net.encoder)
        if self.net.recurrent:
            raise ValueError("A2cAlgorithm does not train a recurrent encoder (EncodingNetwork.rnn); use "
                             "PpoAlgorithm, or set EncodingNetwork.rnn = None")
        self.lr, self.gamma, self.gae_lambda = lr, gamma, gae_lambda
        self.value_loss_coef, self.entropy_coef = value_loss_coef, TracedValue(entropy_coef)  # read by the loss
        self.normalize_advantages = normalize_advantages

    recomputes_rollout_info = True  # (not recurrent: each step's info is a function of its observation and action)

    def _act(self, obs: torch.Tensor, greedy: bool) -> tuple[torch.Tensor, Any]:
        out = self.net.act(self.network_input(obs), greedy)
        return out.action, A2cRolloutInfo(out.log_prob, out.entropy, out.value)

    def recompute_rollout_info(self, exp: Experience) -> Experience:
        """The log-probs, entropies and values ``[T+1, B]`` of the unroll's observations and actions, with gradients,
        in one forward pass (the last row's action was computed but not taken: only its value is read)."""
        length, batch = exp.step_type.shape[:2]
        out = self.net.evaluate(self.steps(self.network_input(exp.observation, batch_dims=2), slice(None)),
                                exp.action.flatten(0, 1))
        info = A2cRolloutInfo(*(x.view(length, batch) for x in (out.log_prob, out.entropy, out.value)))
        if self.off_policy_correction is not None:  # the acting policy's, from the unroll
            info = nest.replace_fields(info, behaviour_log_prob=exp.rollout_info.log_prob.detach())
        return nest.replace_fields(exp, rollout_info=info)

    def loss_terms(self, exp: Experience) -> dict[str, torch.Tensor]:
        """Per-step terms ``[T, B]`` (with gradients) of the unroll ``[T+1, B]``: policy gradient, value, entropy;
        also (no gradient) the GAE ``advantage`` before any standardizing and the ``value_target``, and ``value``
        (with gradient), which ``calc_loss`` reads for the debug summaries."""
        info: A2cRolloutInfo = exp.rollout_info
        value = info.value
        if self.off_policy_correction == "vtrace":
            out = vtrace_returns(info.log_prob.detach() - info.behaviour_log_prob, exp.reward, value.detach(),
                                 exp.step_type, exp.discount,
                                 VTraceSettings(self.gamma, self.gae_lambda, self.vtrace_clip_rho, self.vtrace_clip_c,
                                                clip_pg_rho=self.vtrace_clip_rho))
            advantage = adv = out.pg_advantage
            value_target = out.value_target
        else:
            advantage = adv = generalized_advantage_estimation(exp.reward, value.detach(), exp.step_type,
                                                               exp.discount, self.gamma, self.gae_lambda)
            value_target = adv + value.detach()[:-1]
        if self.normalize_advantages:
            adv = masked_standardize(adv, (exp.step_type[:-1] != StepType.LAST).to(value.dtype))
        value_t = value[:-1]
        return dict(policy_loss=-adv * info.log_prob[:-1], value_loss=(value_target - value_t) ** 2,
                    entropy=info.entropy[:-1], advantage=advantage, value_target=value_target, value=value_t)

    def calc_loss(self, exp: Experience, train_info: Any = None) -> LossInfo:
        """Per-step loss ``[T, B]``; steps out of a LAST step (env autoreset) are masked out."""
        terms = self.loss_terms(exp)
        valid = (exp.step_type[:-1] != StepType.LAST).to(terms["value_loss"].dtype)
        loss = (terms["policy_loss"] + self.value_loss_coef * terms["value_loss"]
                - self.entropy_coef.value() * terms["entropy"]) * valid

        def extra() -> dict[str, torch.Tensor]:  # evaluated only when a summary is due
            count = valid.sum().clamp(min=1.0)
            out = {k: (terms[k].detach() * valid).sum() / count for k in ("policy_loss", "value_loss", "entropy")}
            if self.debug_summaries:  # TrainerConfig.debug_summaries
                out.update(masked_stats("advantage", terms["advantage"], valid, ("mean", "std")))
                out["debug/explained_variance"] = explained_variance(terms["value"], terms["value_target"], valid)
            return out

        return LossInfo(loss=loss, extra=extra)
