"""Behaviour cloning: supervised learning of the dataset's actions (offline RL's baseline), Box or Discrete actions.

Box actions live in the unit box [-1, 1] inside the network (the dataset's actions are unscaled into it with
``unscale_action``) and in [low, high] in the env. ``policy`` picks what the actor is:
  - ``'deterministic'`` (default, as d3rlpy's ``BCConfig``): ``a = tanh(actor(obs))``; loss: squared error to the
    dataset action, summed over the action dims;
  - ``'gaussian'``: a tanh-Gaussian (SAC's actor: mean and log-std of the pre-tanh Gaussian); loss: negative
    log-likelihood of the dataset action.
Discrete actions: ``actor(obs)`` are logits; loss: cross-entropy with the dataset action.

A sample ``[L, B]`` gives the ``L-1`` transitions ``(observation[t], action[t])``, ``t < L-1``, the same per-sample
layout ``[L-1, B]`` as SAC's (so importance weights and masks apply alike). The action stored at a LAST step is a
placeholder (the env ignores it and autoresets), so those transitions are masked out.
"""
from __future__ import annotations

from typing import Any, Callable, Literal, NamedTuple, Optional, Sequence

import gin
import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from alfish.algorithms.base import OffPolicyAlgorithm
from alfish.algorithms.sac import LOG_STD_MAX, LOG_STD_MIN
from alfish.data.types import EMPTY, AlgStep, Experience, LossInfo, StepType, TimeStep
from alfish.networks.distributions import (
    LOG_2,
    categorical_sample,
    gaussian_log_prob,
    tanh_gaussian_sample,
    uniform_where,
)
from alfish.schedulers import Scheduler

#: Dataset actions on the unit box's edge (common: clipped torques) are pulled inside by this much before ``atanh``,
#: which is infinite at +-1.
ATANH_EPS = 1e-6

POLICIES = ("deterministic", "gaussian")


def tanh_gaussian_log_prob(unit_action: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Log density ``[N]`` of ``a = tanh(u)``, ``u ~ N(mean, exp(log_std))``, at ``unit_action [N, D]`` (float32).

    ``unit_action`` is clipped to ``+-(1 - ATANH_EPS)`` first. ``log p(a) = log N(u) - sum log(1 - tanh(u)^2)`` with
    ``u = atanh(a)``, the Jacobian term in the stable form ``2 (log 2 - u - softplus(-2u))`` (as
    ``tanh_gaussian_sample`` and ``torch.distributions.TanhTransform``).
    """
    u = torch.atanh(unit_action.float().clamp(-1.0 + ATANH_EPS, 1.0 - ATANH_EPS))
    log_det = 2.0 * (LOG_2 - u - F.softplus(-2.0 * u))                     # [N, D]
    return gaussian_log_prob(u, mean, log_std) - log_det.sum(-1)


class BcTrainInfo(NamedTuple):
    loss: torch.Tensor       # [N = (L-1) * B], per transition, with gradient
    logits: Any = EMPTY      # [N, num_actions] detached (Discrete actions; for the accuracy summary), else EMPTY


@gin.configurable
class BcAlgorithm(OffPolicyAlgorithm):
    """Behaviour cloning.

    Args:
        hidden_sizes: hidden layers of the default actor MLP.
        lr: Adam learning rate of the actor (number or schedule); 1e-3 as d3rlpy's ``BCConfig.learning_rate``.
        policy: ``'deterministic'`` or ``'gaussian'`` for Box actions (module docstring); must stay
            ``'deterministic'`` (the default) for Discrete actions, whose policy is the softmax of the logits.
        actor_network_cls: ``cls(observation_space, output_dim)`` -> the actor (``obs -> [N, output_dim]``), with
            ``output_dim`` = ``action_dim`` (deterministic: pre-tanh action), ``2 * action_dim`` (gaussian: mean and
            log-std of the pre-tanh Gaussian) or ``num_actions`` (Discrete: logits); ``None``: an MLP of
            ``hidden_sizes`` (through ``EncodingNetwork`` for images and dicts).

    Acting: ``predict_step`` takes the deterministic action (the tanh of the Gaussian's mean; the logits' argmax);
    ``rollout_step`` the same for the deterministic policy, a sample of the Gaussian or of the softmax otherwise.
    ``predict_step``'s ``epsilon_greedy``: for Discrete actions a uniformly random action (as DQN), for Box actions a
    sample of the policy (none for the deterministic one).
    """

    rollout_module_names = ("actor",)  # async unroll ships only these to its child

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Space,
                 hidden_sizes: Sequence[int] = (256, 256), lr: float | Scheduler = 1e-3,
                 policy: Literal["deterministic", "gaussian"] = "deterministic",
                 actor_network_cls: Optional[Callable[..., nn.Module]] = None):
        super().__init__(observation_space, action_space)
        if policy not in POLICIES:
            raise ValueError(f"BcAlgorithm.policy={policy!r} must be one of {POLICIES}")
        if self.discrete and policy != "deterministic":
            raise ValueError(f"BcAlgorithm.policy={policy!r} applies to Box actions; with Discrete actions the policy "
                             "is the softmax of the logits: leave policy at 'deterministic'")
        self.policy = policy
        self.gaussian = policy == "gaussian" and not self.discrete
        if self.discrete:
            output_dim = self.num_actions
        else:
            output_dim = 2 * self.action_dim if self.gaussian else self.action_dim
        self.use_networks(actor_network_cls)
        self.actor = self.build_network(actor_network_cls, output_dim, hidden_sizes)
        self.lr = lr

    def param_groups(self) -> list[dict]:
        return [dict(name="actor", params=list(self.actor.parameters()), lr=self.lr)]

    # ----------------------------------------------------------------------------------------------------- acting --
    def _mean_log_std(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The gaussian actor's output ``[N, 2 * action_dim]`` -> pre-tanh mean and log-std, each ``[N, action_dim]``
        (log-std bounded as SAC's; ``hardtanh`` is its clamp with a one-kernel backward)."""
        mean, log_std = out.chunk(2, dim=-1)
        return mean, F.hardtanh(log_std, LOG_STD_MIN, LOG_STD_MAX)

    def _act(self, obs: Any, greedy: bool) -> tuple[torch.Tensor, Any]:
        """Action ``[B]`` (int64, Discrete) or ``[B, action_dim]`` in the env's bounds (Box)."""
        out = self.actor(self.network_input(obs))
        if self.discrete:
            return (out.argmax(-1) if greedy else categorical_sample(out)), EMPTY
        if not self.gaussian:
            unit_action = torch.tanh(out)
        elif greedy:  # the tanh of the Gaussian's mean
            unit_action = torch.tanh(out[..., :self.action_dim])
        else:
            unit_action, _ = tanh_gaussian_sample(*self._mean_log_std(out))
        return self.scale_action(unit_action), EMPTY

    def predict_step(self, time_step: TimeStep, state: Any = EMPTY, epsilon_greedy: float = 0.0) -> AlgStep:
        """The deterministic action; with probability ``epsilon_greedy`` per env, a uniformly random one (Discrete)
        or a sample of the policy (Box, as ``RLAlgorithm``)."""
        if not self.discrete:
            return super().predict_step(time_step, state, epsilon_greedy)
        action, _ = self._act(time_step.observation, greedy=True)
        return AlgStep(output=uniform_where(action, self.num_actions, epsilon_greedy), state=state)

    # --------------------------------------------------------------------------------------------------- training --
    def train_step(self, exp: Experience, state: Any = EMPTY) -> AlgStep:
        """Per-transition loss ``[N = (L-1) * B]`` of the actions ``exp.action[:-1]`` of ``exp`` ``[L, B]``."""
        if exp.step_type.shape[0] < 2:
            raise ValueError(f"BcAlgorithm trains on the L-1 transitions of sequences of L >= 2 steps, got "
                             f"L={exp.step_type.shape[0]}; set TrainerConfig.mini_batch_length = 2")
        obs = self.steps(self.network_input(exp.observation, batch_dims=2), slice(None, -1))   # [N, ...]
        out = self.actor(obs)
        action = exp.action[:-1].flatten(0, 1)                                  # [N] or [N, action_dim]
        if self.discrete:
            # float32 logits: under AMP the log-softmax must keep its precision (as in alfish.networks.distributions)
            logits = out.float()
            return AlgStep(info=BcTrainInfo(F.cross_entropy(logits, action.long(), reduction="none"),
                                            logits.detach()))
        unit_action = self.unscale_action(action)                               # [N, action_dim] in [-1, 1]
        if self.gaussian:
            loss = -tanh_gaussian_log_prob(unit_action, *self._mean_log_std(out))
        else:
            loss = (torch.tanh(out.float()) - unit_action).square().sum(-1)
        return AlgStep(info=BcTrainInfo(loss))

    def calc_loss(self, exp: Experience, train_info: BcTrainInfo) -> LossInfo:
        """Per-transition loss ``[L-1, B]``; transitions out of a LAST step (placeholder action) are masked out."""
        valid = exp.step_type[:-1] != StepType.LAST                             # [L-1, B]
        shape = valid.shape
        valid = valid.flatten().to(train_info.loss.dtype)
        loss = train_info.loss * valid

        def extra() -> dict[str, torch.Tensor]:  # evaluated only when a summary is due
            count = valid.sum().clamp(min=1.0)
            terms = dict(bc_loss=loss.detach().sum() / count)
            if self.discrete:
                correct = train_info.logits.argmax(-1) == exp.action[:-1].flatten(0, 1).long()
                terms["accuracy"] = (correct.to(valid.dtype) * valid).sum() / count
            return terms

        return LossInfo(loss=loss.view(shape), extra=extra)
