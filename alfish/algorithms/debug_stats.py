"""Statistics behind ``TrainerConfig.debug_summaries``: the ``debug/...`` terms an algorithm adds to the lazy
``LossInfo.extra`` of ``calc_loss`` when its ``debug_summaries`` flag is on (set at assembly). They are computed only
when ``extra`` is evaluated, i.e. when a summary is due: no op and no host sync on other updates.

Every statistic runs over the valid entries of a per-sample tensor (masked, not indexed: no data-dependent shape);
with no valid entry it is NaN, which the summary writer skips.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

__all__ = ["explained_variance", "masked_stats"]


def masked_stats(name: str, x: torch.Tensor, valid: torch.Tensor,
                 stats: Sequence[str] = ("mean", "min", "max")) -> dict[str, torch.Tensor]:
    """``{'debug/<name>.<stat>': 0-d tensor}`` for ``stat`` in ``stats`` (``mean``, ``std``, ``min``, ``max``) of
    ``x [..., N]`` over the entries where ``valid [N]`` (0/1, broadcast over ``x``'s leading dims) is 1. The std is
    the population one (divided by the count)."""
    x = x.detach().float()
    mask = valid.detach().to(x.dtype).expand_as(x)
    count = mask.sum()
    some = count > 0
    mean = (x * mask).sum() / count.clamp(min=1.0)
    out = {}
    for stat in stats:
        if stat == "mean":
            value = mean
        elif stat == "std":
            value = (((x - mean) ** 2 * mask).sum() / count.clamp(min=1.0)).sqrt()
        elif stat == "min":
            value = torch.where(mask > 0, x, math.inf).amin()
        elif stat == "max":
            value = torch.where(mask > 0, x, -math.inf).amax()
        else:
            raise ValueError(f"unknown statistic {stat!r}: use mean, std, min or max")
        out[f"debug/{name}.{stat}"] = torch.where(some, value, math.nan)
    return out


def explained_variance(prediction: torch.Tensor, target: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``1 - Var[target - prediction] / Var[target]`` over the valid entries (0-d): 1 is a perfect value function, 0
    one no better than the targets' mean, negative a worse one; never above 1. NaN when the targets are constant."""
    prediction, target = prediction.detach().float(), target.detach().float()
    mask = valid.detach().to(target.dtype).expand_as(target)
    count = mask.sum().clamp(min=1.0)

    def variance(x: torch.Tensor) -> torch.Tensor:
        mean = (x * mask).sum() / count
        return ((x - mean) ** 2 * mask).sum() / count

    var_target = variance(target)
    return torch.where(var_target > 0, 1.0 - variance(target - prediction) / var_target, math.nan)
