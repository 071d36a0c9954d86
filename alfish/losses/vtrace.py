"""V-trace (Espeholt et al. 2018, "IMPALA", section 4.1): value targets and policy-gradient advantages for data that
a behaviour policy ``mu`` collected while the policy being trained is ``pi`` (asynchronous collection: the acting
parameters lag the learner's by a few versions).

Conventions are those of ``alfish.losses.returns`` (time-major ``[T, B]``; ``rewards[t+1]`` and ``discounts[t+1]``
belong to the transition out of step ``t``; a LAST step has no successor; the last row only bootstraps). With
``rho_t = pi(a_t | x_t) / mu(a_t | x_t)`` of the action taken at step ``t``::

    rho_bar_t = min(clip_rho, rho_t)               (truncated importance weight of the TD error)
    c_t       = lambda * min(clip_c, rho_t)        (truncated trace coefficient)
    delta_t   = rho_bar_t * (r_{t+1} + gamma * d_{t+1} * V(x_{t+1}) - V(x_t))
    v_t - V(x_t) = delta_t + gamma * d_{t+1} * c_t * (v_{t+1} - V(x_{t+1}))        (the paper's recursion)
    pg_advantage_t = min(clip_pg_rho, rho_t) * (r_{t+1} + gamma * d_{t+1} * v_{t+1} - V(x_t))   (IMPALA's)
    advantage_t    = (r_{t+1} + gamma * d_{t+1} * V(x_{t+1}) - V(x_t))
                     + gamma * d_{t+1} * lambda * (v_{t+1} - V(x_{t+1}))

with ``v`` of the bootstrap row (the last) and of every LAST step equal to ``V`` (nothing after them is traced), and
both advantages 0 at LAST steps (callers mask them). A clip of ``None`` does not truncate.

``advantage_t`` is ``v_t - V(x_t)`` with step ``t``'s own importance weights taken out (``rho_bar_t`` and ``c_t``
replaced by 1 and ``lambda``): the later steps stay corrected. It is for a loss that weighs step ``t`` by its
probability ratio ``pi / mu`` itself: PPO's surrogate, whose old log-probs are the behaviour policy's (weighing by
``rho_t`` again would count step ``t``'s correction twice). ``pg_advantage_t`` is for a loss that does not:
``-log pi(a_t) * pg_advantage_t`` is IMPALA's policy gradient (A2C).

On-policy data (``rho_t = 1``, clips >= 1): ``v - V`` and ``advantage`` are GAE(lambda)'s advantage, and with
``lambda = 1`` ``v`` is the bootstrapped discounted return and ``pg_advantage`` GAE(1)'s advantage (tested against
``returns.py``).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import torch

from alfish.data.types import StepType


class VTraceReturns(NamedTuple):
    """``[T-1, B]`` each (the module docstring's symbols)."""

    value_target: torch.Tensor    # v_t
    advantage: torch.Tensor       # advantage_t: step t's own weights left to the loss (PPO); 0 at LAST steps
    pg_advantage: torch.Tensor    # IMPALA's policy-gradient advantage (A2C); 0 at LAST steps


@dataclasses.dataclass(frozen=True)
class VTraceSettings:
    """gamma, lambda_: discount and trace-cutting factor (IMPALA's ``lambda``; 1 in the paper's experiments);
    clip_rho, clip_c, clip_pg_rho: the truncation levels (the paper's rho-bar and c-bar, and the policy-gradient
    term's); ``None``: no truncation."""

    gamma: float
    lambda_: float = 1.0
    clip_rho: Optional[float] = 1.0
    clip_c: Optional[float] = 1.0
    clip_pg_rho: Optional[float] = 1.0


def _truncated(ratio: torch.Tensor, clip: Optional[float]) -> torch.Tensor:
    return ratio if clip is None else ratio.clamp(max=clip)


def vtrace_returns(log_rhos: torch.Tensor, rewards: torch.Tensor, values: torch.Tensor, step_types: torch.Tensor,
                   discounts: torch.Tensor, settings: VTraceSettings) -> VTraceReturns:
    """V-trace targets and advantages ``[T-1, B]`` from inputs ``[T, B]`` (module docstring).

    Args:
        log_rhos: ``log pi(a_t | x_t) - log mu(a_t | x_t)`` of the action stored at each step (the last row's and
            LAST steps' are not used).
        rewards, discounts, step_types: as stored (``returns.py``'s convention).
        values: ``V(x_t)`` under the value function being trained (not the behaviour's estimates).
        settings: gamma, lambda and the truncation levels.
    """
    if values.shape[0] < 2:
        raise ValueError(f"vtrace_returns needs at least 2 time steps (one to bootstrap from), got {values.shape[0]}")
    is_last = step_types == StepType.LAST
    rhos = torch.exp(log_rhos)
    gamma, lambda_ = settings.gamma, settings.lambda_
    rho_bar, trace = _truncated(rhos, settings.clip_rho), lambda_ * _truncated(rhos, settings.clip_c)
    rho_pg = _truncated(rhos, settings.clip_pg_rho)
    value_targets = torch.empty_like(values[:-1])
    advantages, pg_advantages = torch.empty_like(values[:-1]), torch.empty_like(values[:-1])
    zero = torch.zeros_like(values[-1])
    next_correction = zero  # v_{t+1} - V(x_{t+1}): 0 at the bootstrap row and at LAST steps
    for t in range(values.shape[0] - 2, -1, -1):
        bootstrap = gamma * discounts[t + 1]
        td_error = rewards[t + 1] + bootstrap * values[t + 1] - values[t]
        # (torch.where, not a product with a mask: a LAST step's log-ratio may be anything, even non-finite)
        correction = torch.where(is_last[t], zero, rho_bar[t] * td_error + bootstrap * trace[t] * next_correction)
        advantages[t] = torch.where(is_last[t], zero, td_error + bootstrap * lambda_ * next_correction)
        pg_advantages[t] = torch.where(is_last[t], zero, rho_pg[t] * (td_error + bootstrap * next_correction))
        value_targets[t] = values[t] + correction
        next_correction = correction
    return VTraceReturns(value_targets, advantages, pg_advantages)
