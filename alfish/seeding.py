"""Seeds: how one run's seed becomes the seeds of its ranks, envs, evaluations and child processes.

Every derived seed is the run's seed plus a named offset, so two streams never start from the same seed. The offsets
are primes larger than any realistic number of envs (env ``i`` of a batch is seeded ``seed + i``), so the seed ranges
of two streams do not overlap either.
"""
from __future__ import annotations

import random

import numpy as np
import torch

#: Each DDP rank's envs and sampling: ``seed + RANK_SEED_OFFSET * rank``.
RANK_SEED_OFFSET = 10_007
#: Evaluation envs: ``seed + EVAL_SEED_OFFSET`` (never the training envs' seeds).
EVAL_SEED_OFFSET = 1_000_003
#: Re-seeding after a resume (``seed + RESEED_STRIDE * iteration``) and for the k-th evaluation
#: (``seed + RESEED_STRIDE * k``): a stride larger than the number of envs keeps consecutive reseeds disjoint.
RESEED_STRIDE = 7919
#: Action sampling in the async unroll child: its own stream, apart from the trainer's.
CHILD_SEED_OFFSET = 104_729


def seed_everything(seed: int) -> None:
    """Seed python's ``random``, numpy's global RNG and torch's."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def reseed(seed: int, count: int) -> int:
    """The seed of the ``count``-th restart of a stream seeded ``seed`` (a resume at iteration ``count``, the
    ``count``-th evaluation)."""
    return seed + RESEED_STRIDE * count
