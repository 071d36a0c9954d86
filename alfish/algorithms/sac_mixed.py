"""SAC for a mixed action: one Discrete part (``n`` choices) and one Box part (``d`` dims), as ALF's SAC drives it
(``ActionType.Mixed``; Delalleau et al. 2019, "Discrete and Continuous Action Representation for Practical RL in Video
Games").

    actor:    ``s -> (mean, log_std) [2d]``, the tanh-Gaussian policy of the Box part ``pi_c(a_c | s)``, as SAC's;
    critics:  ``(s, a_c) -> Q(s, a_c, .) [n]``, one Q value per choice for the given Box action (ALF's "universal Q
              network"), an ensemble of ``num_critics`` (the minimum over members is used, as SAC);
    discrete policy:  ``pi_d(k | s, a_c) = softmax_k(Q(s, a_c, k) / alpha_d)`` over the members' minimum: no network of
              its own (ALF's design). Acting draws ``a_c ~ pi_c(s)``, then ``k ~ pi_d(. | s, a_c)``; greedy acting takes
              the Box part's mean ``tanh(mean)`` and the argmax of the Q values at it.

Each part has its own temperature (``log_alpha`` for the Box part, ``discrete_log_alpha``) and its own target entropy
(``SacAlgorithm.target_entropy``, default ``-d`` as SB3; ``SacAlgorithm.discrete_target_entropy``, default ALF's
``default_discrete_entropy(n)``). With ``N`` transitions ``(s, a_c, k, r, s')``:

    critic:  ``0.5 sum_i (Q_i(s, a_c, k) - y)^2``, ``y = r + gamma * discount * V(s')``, with ``a_c' ~ pi_c(s')`` and
             ``V(s') = sum_k pi_d(k|s', a_c') (min_i Q'_i(s', a_c', k) - alpha_d log pi_d(k|s', a_c'))
                       - alpha_c log pi_c(a_c'|s')``;
    actor:   ``alpha_c log pi_c(a|s) - sum_k pi_d(k|s, a) min_i Q_i(s, a, k)``, ``a ~ pi_c(s)`` reparameterised, the
             discrete probabilities detached (ALF's expectation over the discrete policy), the critics' weights
             detached;
    alpha:   ``log_alpha_c (-log pi_c(a|s) - target_c) + log_alpha_d (H_d(s, a) - target_d)``, ``H_d`` the discrete
             policy's entropy.

Where this departs from ALF: the discrete part's soft value and entropy are the exact expectations over the ``n``
choices (as SAC-Discrete, Christodoulou 2019) instead of ALF's one sampled choice: lower variance, ``n`` values per
transition. ``pi_d(.|s', a_c')`` is computed from the online critics (the policy being acted with), the values from
the target critics. Simplification: default MLP networks over flat observations only (no ``actor_network_cls``,
``critic_network_cls``, shared encoder or gSDE), refused in one line.

Fixed temperature: ``SacAlgorithm.ent_coef`` fixes both parts' alphas at that value (no alpha loss, no alpha group).
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from alfish.algorithms.sac import SacAlgorithm
from alfish.data import nest
from alfish.data.types import EMPTY, AlgStep, Experience, LossInfo, StepType
from alfish.envs.mixed_actions import choice_of
from alfish.errors import OneLineValueError
from alfish.networks.ensemble import EnsembleCritic
from alfish.schedulers import Scheduler, TracedValue

#: ALF's ``calc_default_target_entropy`` for a discrete action: the entropy of a policy that gives its peak
#: ``1 - MIN_PROB`` and spreads ``MIN_PROB`` evenly over the other choices.
MIN_PROB = 0.1


def default_discrete_entropy(num_choices: int, min_prob: float = MIN_PROB) -> float:
    """ALF's default target entropy (nats) of a Discrete(``num_choices``) action: ``min_prob * (log(n - 1) -
    log(min_prob)) - (1 - min_prob) log(1 - min_prob)`` (0 for ``n = 1``). E.g. 0.325 for n = 2 (of at most log 2 =
    0.693), 0.394 for n = 3 (of log 3 = 1.099)."""
    if num_choices <= 1:
        return 0.0
    return min_prob * (math.log(num_choices - 1) - math.log(min_prob)) - (1 - min_prob) * math.log(1 - min_prob)


def pack(choice: torch.Tensor, box_action: torch.Tensor) -> torch.Tensor:
    """Packed mixed actions ``[*, 1 + d]`` (``alfish.envs.mixed_actions``) of choices ``[*]`` (integers) and Box actions
    ``[*, d]`` (env units)."""
    return torch.cat([choice.unsqueeze(-1).to(box_action.dtype), box_action], dim=-1)


def discrete_policy(q: torch.Tensor, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(probs, log_probs)`` ``[N, n]`` of ``softmax(q / alpha)`` for Q values ``q`` ``[N, n]`` and a temperature
    ``alpha`` (a 0-d tensor)."""
    log_probs = F.log_softmax(q / alpha, dim=-1)
    return log_probs.exp(), log_probs


class MixedSacTrainInfo(NamedTuple):
    """``SacTrainInfo``'s fields (``alpha_loss``: both parts'; ``log_prob``: the Box part's), plus the discrete part's
    entropy, each ``[N]``."""
    td_error: torch.Tensor
    critic_loss: torch.Tensor
    actor_loss: torch.Tensor
    alpha_loss: torch.Tensor
    log_prob: torch.Tensor          # [N], log pi_c(a|s) of the Box part
    q: torch.Tensor                 # [E, N], Q_i(s, a_c, k) of the replayed action
    td_target: torch.Tensor         # [N]
    discrete_entropy: torch.Tensor  # [N], H(pi_d(. | s, a)), no gradient
    actor_valid: Optional[torch.Tensor] = None  # always None: mixed actions train in the joint order only


class MixedSacAlgorithm(SacAlgorithm):
    """SAC driving a mixed action (module docstring). Built by ``SacAlgorithm(...)`` for such an action space, with
    ``SacAlgorithm``'s gin parameters; not configurable by itself."""

    drives_mixed_actions = True
    rollout_module_names = ("actor", "critics", "discrete_log_alpha")  # acting reads the critics and alpha_d

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)  # (SacAlgorithm's __init__, with its gin bindings)
        if self.use_sde or self._encoded or self.raw_observations:
            raise OneLineValueError("SacAlgorithm with a mixed action space builds its own MLP actor and critics over "
                                    "flat (Box or Dict-of-Box vector) observations: leave actor_network_cls, "
                                    "critic_network_cls, encoding_network_ctor and use_sde unset")

    def build_critics(self, ctor: Any, num_critics: int, hidden_sizes: Sequence[int],
                      activation: str = "relu") -> nn.Module:
        """An ensemble ``(obs [N, obs_dim], a_c [N, d]) -> [E, N, n]``: one Q value per discrete choice."""
        return EnsembleCritic(num_critics, self.obs_dim + self.action_dim, self.num_actions, hidden_sizes, activation)

    def _init_temperature(self, initial_log_alpha: float, ent_coef: Optional[float],
                          target_entropy: Optional[float | Scheduler],
                          discrete_target_entropy: Optional[float | Scheduler]) -> None:
        """The Box part's as ``SacAlgorithm``'s, then the discrete part's: ``discrete_log_alpha`` (a parameter, or a
        buffer at ``log(ent_coef)``) and ``discrete_target_entropy``."""
        super()._init_temperature(initial_log_alpha, ent_coef, target_entropy, discrete_target_entropy)
        if self.learns_alpha:
            self.discrete_log_alpha = nn.Parameter(torch.tensor(float(initial_log_alpha)))
        else:
            self.register_buffer("discrete_log_alpha", torch.tensor(math.log(ent_coef)))
        if isinstance(discrete_target_entropy, (int, float)) and discrete_target_entropy > math.log(self.num_actions):
            raise OneLineValueError(f"SacAlgorithm.discrete_target_entropy={discrete_target_entropy} is above "
                                    f"log({self.num_actions}) = {math.log(self.num_actions):.4f}, the most entropy "
                                    f"{self.num_actions} choices can have (alpha would grow without end); set it "
                                    "lower, or None for ALF's default")
        self.discrete_target_entropy = TracedValue(default_discrete_entropy(self.num_actions)
                                                   if discrete_target_entropy is None else discrete_target_entropy)

    def param_groups(self) -> list[dict]:
        """As SAC's; the ``alpha`` group holds both parts' temperatures."""
        groups = super().param_groups()
        if self.learns_alpha:
            groups[-1]["params"].append(self.discrete_log_alpha)
        return groups

    # ----------------------------------------------------------------------------------------------------- acting --
    def _act(self, obs: torch.Tensor, greedy: bool) -> tuple[torch.Tensor, Any]:
        """Packed actions ``[B, 1 + d]`` (``alfish.envs.mixed_actions``): the Box part from the actor, then the choice
        from the Q values at it (greedy: argmax; else drawn from ``softmax(Q / alpha_d)``)."""
        obs = self.network_input(obs)
        unit_action, _ = self._policy(obs, greedy)                                # [B, d] in [-1, 1]
        q = self.critics(obs, unit_action).amin(0)                                # [B, n]
        if greedy:
            choice = q.argmax(-1)
        else:
            probs, _ = discrete_policy(q, self.discrete_log_alpha.detach().exp())
            choice = torch.multinomial(probs, 1).squeeze(-1)
        return pack(choice, self.scale_action(unit_action)), EMPTY

    # --------------------------------------------------------------------------------------------------- training --
    def _losses(self, critic_in: Any, policy_in: Any, next_policy_in: Any, next_target_in: Any, action: torch.Tensor,
                reward: torch.Tensor, discount: torch.Tensor) -> AlgStep:
        """The mixed SAC losses of ``N`` transitions, each ``[N]`` (module docstring). Arguments as
        ``SacAlgorithm._losses``; ``action`` ``[L', B, 1 + d]`` packed (env scale)."""
        packed = action.flatten(0, 1)                                             # [N, 1 + d]
        choice = choice_of(packed, self.num_actions)                              # [N]
        act_t = self.unscale_action(packed[:, 1:])                                # [N, d]
        reward, discount = reward.flatten(), discount.flatten()
        alpha_c, alpha_d = self.log_alpha.detach().exp(), self.discrete_log_alpha.detach().exp()

        with torch.no_grad():
            next_action, next_log_prob = self._policy(next_policy_in, greedy=False)      # [N, d], [N]
            next_probs, next_log_probs = discrete_policy(self.critics(next_policy_in, next_action).amin(0), alpha_d)
            next_q = self.target_critics(next_target_in, next_action).amin(0)              # [N, n]
            soft_value = (next_probs * (next_q - alpha_d * next_log_probs)).sum(-1) - alpha_c * next_log_prob
            td_target = reward + self.gamma * discount * soft_value

        q_all = self.critics(critic_in, act_t)                                    # [E, N, n]
        q = q_all.gather(-1, choice.view(1, -1, 1).expand(q_all.shape[0], -1, 1)).squeeze(-1)   # [E, N]
        td = q - td_target
        critic_loss = 0.5 * (td ** 2).sum(0)

        new_action, log_prob = self._policy(policy_in, greedy=False)
        q_new = self.critics(policy_in, new_action, detach_params=True).min(0).values          # [N, n]
        probs, log_probs = discrete_policy(q_new.detach(), alpha_d)
        actor_loss = alpha_c * log_prob - (probs * q_new).sum(-1)

        log_prob = log_prob.detach()
        discrete_entropy = -(probs * log_probs).sum(-1)                           # [N], no gradient
        if self.learns_alpha:
            alpha_loss = (self.log_alpha * (-self.target_entropy.value() - log_prob)
                          + self.discrete_log_alpha * (discrete_entropy - self.discrete_target_entropy.value()))
        else:  # fixed alphas (ent_coef): no alpha term
            alpha_loss = torch.zeros_like(log_prob)
        return AlgStep(info=MixedSacTrainInfo(td.detach().abs().mean(0), critic_loss, actor_loss, alpha_loss, log_prob,
                                              q, td_target, discrete_entropy))

    def calc_loss(self, exp: Experience, train_info: MixedSacTrainInfo) -> LossInfo:
        """As SAC's; the summaries add ``discrete_entropy`` and ``discrete_alpha`` (``entropy`` and ``alpha`` are the
        Box part's)."""
        loss_info = super().calc_loss(exp, train_info)
        sac_extra = loss_info.extra

        def extra() -> dict[str, torch.Tensor]:  # evaluated only when a summary is due
            out = sac_extra()
            valid = (exp.step_type[:-1] != StepType.LAST).flatten().to(train_info.discrete_entropy.dtype)
            out["discrete_entropy"] = (train_info.discrete_entropy * valid).sum() / valid.sum().clamp(min=1.0)
            out["discrete_alpha"] = self.discrete_log_alpha.detach().exp()
            if self.debug_summaries:
                out["debug/discrete_target_entropy"] = self.discrete_target_entropy.tensor_value(valid.device)
            return out

        return nest.replace_fields(loss_info, extra=extra)


SacAlgorithm.mixed_action_class = MixedSacAlgorithm  # what SacAlgorithm(...) builds for a mixed action space
