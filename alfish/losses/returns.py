"""Returns and advantages as pure functions over time-major tensors (DESIGN.md §3.5).

Convention (ALF's): index ``t`` of every ``[T, B]`` input is one stored step. ``rewards[t]`` and ``discounts[t]`` belong
to the transition *into* step ``t``; ``values[t]`` estimates the value of step ``t``'s observation. So the transition
out of step ``t`` earns ``rewards[t+1]`` and bootstraps with ``discounts[t+1] * values[t+1]``.

* A step whose ``step_type`` is LAST has no real successor (the env autoresets), so its return/advantage is not
  defined: it gets ``value`` / 0 and callers mask it out of the loss.
* Termination: ``discounts[t+1] == 0`` stops bootstrapping. Truncation: LAST with discount 1 bootstraps from the
  final observation's value ``values[t+1]``.

Outputs have ``T - 1`` rows: the last step of the input is only used for bootstrapping.
"""
from __future__ import annotations

import torch

from alfish.data.types import StepType


def discounted_return(rewards: torch.Tensor, values: torch.Tensor, step_types: torch.Tensor,
                      discounts: torch.Tensor, gamma: float) -> torch.Tensor:
    """Bootstrapped discounted returns ``[T-1, B]`` from inputs ``[T, B]`` (see module doc)."""
    is_last = step_types == StepType.LAST
    returns = torch.empty_like(values[:-1])
    next_return = values[-1]
    for t in range(values.shape[0] - 2, -1, -1):
        # If step t+1 is LAST, the chain stops there and step t bootstraps from V(obs[t+1]).
        continuation = torch.where(is_last[t + 1], values[t + 1], next_return)
        ret = rewards[t + 1] + gamma * discounts[t + 1] * continuation
        returns[t] = torch.where(is_last[t], values[t], ret)
        next_return = returns[t]
    return returns


def generalized_advantage_estimation(rewards: torch.Tensor, values: torch.Tensor, step_types: torch.Tensor,
                                     discounts: torch.Tensor, gamma: float, lambda_: float) -> torch.Tensor:
    """GAE(lambda) advantages ``[T-1, B]`` from inputs ``[T, B]`` (see module doc); 0 at LAST steps."""
    is_last = step_types == StepType.LAST
    advantages = torch.empty_like(values[:-1])
    next_adv = torch.zeros_like(values[-1])
    for t in range(values.shape[0] - 2, -1, -1):
        delta = rewards[t + 1] + gamma * discounts[t + 1] * values[t + 1] - values[t]
        # adv[t+1] is already 0 when step t+1 is LAST, so the chain is cut at episode ends.
        adv = delta + gamma * lambda_ * discounts[t + 1] * next_adv
        advantages[t] = torch.where(is_last[t], torch.zeros_like(adv), adv)
        next_adv = advantages[t]
    return advantages


def masked_standardize(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` with mean and (unbiased) std over the entries where ``mask`` is 1; any shape."""
    count = mask.sum().clamp(min=1.0)
    mean = (x * mask).sum() / count
    std = torch.sqrt(((x - mean) ** 2 * mask).sum() / (count - 1).clamp(min=1.0))
    return (x - mean) / (std + eps)
