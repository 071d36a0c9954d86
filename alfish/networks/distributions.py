"""Action distributions written out as the few formulas the algorithms need (no torch.distributions overhead).

Every function computes in float32 whatever its inputs' precision: under AMP the networks' outputs may be bf16/fp16,
but log-probabilities, entropies and the samples' tanh correction must keep float32's precision (CPU autocast leaves
``exp``/``softplus`` in the input's dtype). ``.float()`` of a float32 tensor is the tensor itself: no cost in fp32.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

LOG_2 = math.log(2.0)
HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Log density of a diagonal Gaussian, summed over the last dim: ``[N, D] -> [N]``."""
    x, mean, log_std = x.float(), mean.float(), log_std.float()
    return (-0.5 * ((x - mean) * torch.exp(-log_std)) ** 2 - log_std - HALF_LOG_2PI).sum(-1)


def gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """Entropy of a diagonal Gaussian, summed over the last dim."""
    return (log_std.float() + 0.5 + HALF_LOG_2PI).sum(-1)


def tanh_gaussian_sample(mean: torch.Tensor, log_std: torch.Tensor, deterministic: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Reparameterised sample ``a = tanh(u)``, ``u ~ N(mean, std)`` ``[N, D]``, and its log density ``[N]``.

    With ``u = mean + std * eps`` the Gaussian term is ``-eps^2/2 - log_std - log(2 pi)/2`` exactly (same value and
    same gradients as evaluating the density at ``u``, in fewer ops). The tanh correction
    ``log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))`` is the numerically stable form. ``deterministic``:
    ``u = mean`` (``eps = 0``).

    Each aten op costs several microseconds on the CPU at SAC's sizes, more than its arithmetic, so the formula is
    written in few of them: ``addcmul`` for ``u`` and for the ``eps^2`` term, and ``2 softplus(-2u)`` as
    ``softplus(-4u, beta=1/2)`` (the same floats: the scalings are by powers of two, and the same threshold).
    """
    mean, log_std = mean.float(), log_std.float()
    if deterministic:
        u = mean
    else:
        eps = torch.randn_like(mean)
        u = torch.addcmul(mean, torch.exp(log_std), eps)
    correction = torch.add(F.softplus(-4.0 * u, beta=0.5), u, alpha=2.0)  # 2 (u + softplus(-2u))
    per_dim = correction - log_std
    if not deterministic:
        per_dim = torch.addcmul(per_dim, eps, eps, value=-0.5)            # - eps^2 / 2
    log_prob = per_dim.sum(-1) - mean.shape[-1] * (HALF_LOG_2PI + 2.0 * LOG_2)
    return torch.tanh(u), log_prob


def categorical_log_prob(logits: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """``logits [N, K]``, ``action [N]`` int -> ``[N]``."""
    return torch.log_softmax(logits.float(), -1).gather(-1, action.unsqueeze(-1)).squeeze(-1)


def categorical_entropy(logits: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits.float(), -1)
    return -(logp.exp() * logp).sum(-1)


def categorical_sample(logits: torch.Tensor) -> torch.Tensor:
    """One sample per row via the Gumbel-max trick (cheaper than torch.multinomial for small batches)."""
    gumbel = -torch.log(-torch.log(torch.rand_like(logits).clamp_(1e-20, 1.0)))
    return torch.argmax(logits + gumbel, dim=-1)


def uniform_where(action: torch.Tensor, num_actions: int, probability: float) -> torch.Tensor:
    """Discrete ``action`` (int64, any shape, e.g. ``[B]``), each entry replaced by a uniformly random action of
    ``range(num_actions)`` with ``probability`` (epsilon-greedy exploration); ``action`` itself when it is <= 0."""
    if probability <= 0.0:
        return action
    random = torch.randint(num_actions, action.shape, device=action.device)
    pick = torch.rand(action.shape, device=action.device) < probability
    return torch.where(pick, random, action)


# --- several discrete choices per step (MultiDiscrete, MultiBinary actions), as SB3's MultiCategoricalDistribution and
# BernoulliDistribution: one independent categorical (or Bernoulli) per sub-action; the log-prob and the entropy of the
# joint action are the sums over the sub-actions.

#: The logit of a padding entry in ``multi_categorical_logits``: exp() of it is exactly 0 in float32, so a padded
#: entry has probability 0, is never the argmax nor sampled, and adds ``0 * -1e9 = 0`` to the entropy (``-inf`` would
#: add NaN).
PADDING_LOGIT = -1e9


def multi_categorical_layout(nvec: Sequence[int]) -> Optional[torch.Tensor]:
    """How ``multi_categorical_logits`` lays out ``sum(nvec)`` flat logits as ``[k, max(nvec)]``: the index (int64
    ``[k * max(nvec)]``) of each padded entry into the flat logits followed by one padding column (index
    ``sum(nvec)``); ``None`` when all sub-actions have the same number of choices (a plain reshape)."""
    nvec = [int(n) for n in nvec]
    width = max(nvec)
    if all(n == width for n in nvec):
        return None
    index, start, pad = [], 0, sum(nvec)
    for n in nvec:
        index += list(range(start, start + n)) + [pad] * (width - n)
        start += n
    return torch.tensor(index, dtype=torch.int64)


def multi_categorical_logits(flat: torch.Tensor, nvec: Sequence[int], layout: Optional[torch.Tensor]
                             ) -> torch.Tensor:
    """``flat [N, sum(nvec)]`` (sub-action ``i``'s logits after sub-action ``i-1``'s) -> ``[N, k, max(nvec)]``, the
    shorter rows padded with ``PADDING_LOGIT``; ``layout`` from ``multi_categorical_layout`` (on ``flat``'s device).
    The categorical functions above then work on the last dim, one categorical per sub-action."""
    flat = flat.float()  # before padding: PADDING_LOGIT would be -inf in fp16
    if layout is None:
        return flat.unflatten(-1, (len(nvec), -1))
    padded = torch.cat([flat, flat.new_full(flat.shape[:-1] + (1,), PADDING_LOGIT)], -1)
    return padded.index_select(-1, layout).unflatten(-1, (len(nvec), -1))


def multi_categorical_log_prob(logits: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """``logits [N, k, n]`` (``multi_categorical_logits``), ``action [N, k]`` int -> ``[N]``: the sum of the
    sub-actions' log-probs."""
    return categorical_log_prob(logits, action).sum(-1)


def multi_categorical_entropy(logits: torch.Tensor) -> torch.Tensor:
    """``logits [N, k, n]`` -> ``[N]``: the sum of the sub-actions' entropies (nats)."""
    return categorical_entropy(logits).sum(-1)


def bernoulli_log_prob(logits: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """``logits [N, k]`` (``p = sigmoid(logits)``, the probability of a 1), ``action [N, k]`` of 0/1 (any dtype) ->
    ``[N]``: ``sum_i a_i log p_i + (1 - a_i) log(1 - p_i)``, in the stable form (minus the cross-entropy)."""
    logits = logits.float()
    return -F.binary_cross_entropy_with_logits(logits, action.to(logits.dtype), reduction="none").sum(-1)


def bernoulli_entropy(logits: torch.Tensor) -> torch.Tensor:
    """``logits [N, k]`` -> ``[N]``: ``sum_i -p_i log p_i - (1 - p_i) log(1 - p_i)`` (nats), which is the
    cross-entropy of ``p`` with itself."""
    logits = logits.float()
    return F.binary_cross_entropy_with_logits(logits, torch.sigmoid(logits), reduction="none").sum(-1)


def bernoulli_sample(logits: torch.Tensor) -> torch.Tensor:
    """``logits [N, k]`` -> int64 ``[N, k]``: 1 with probability ``sigmoid(logits)``."""
    return (torch.rand_like(logits, dtype=torch.float32) < torch.sigmoid(logits.float())).long()


def bernoulli_mode(logits: torch.Tensor) -> torch.Tensor:
    """``logits [N, k]`` -> int64 ``[N, k]``: 1 where ``p > 0.5`` (``logits > 0``)."""
    return (logits > 0).long()
