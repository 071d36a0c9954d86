"""Normalizer statistics initialised from offline data (``OfflineData.init_normalizers``).

In pure offline training nothing is rolled out, so a normalizer that learns its statistics from the rollout would
never learn any; in hybrid training the offline data is part of what the algorithm sees. One pass over the data (in
chunks, so mapped data stays mapped) feeds every ``ObservationNormalizer`` that sees raw observations and every
``RewardNormalizer`` (rewards of non-FIRST steps, or with its ``gamma`` their running discounted returns).
"""
from __future__ import annotations

import logging

import numpy as np
import torch

from alfish.replay.offline.steps import Steps
from alfish.transforms.base import DataTransformer
from alfish.transforms.normalizers import ObservationNormalizer, RewardNormalizer

CHUNK_ROWS = 65536


def init_normalizers(transformer: DataTransformer, steps: Steps) -> list[str]:
    """Update the statistics of ``transformer``'s normalizers from ``steps``; returns the names of those updated.

    An observation normalizer placed after a transformer that changes observations (e.g. a frame stacker) does not
    see raw observations and is left to the rollout (logged)."""
    parts = list(getattr(transformer, "transformers", [transformer]))
    updated = []
    raw_observations = True
    for part in parts:
        if isinstance(part, ObservationNormalizer):
            if raw_observations:
                _feed_observations(part, steps)
                updated.append(type(part).__name__)
            else:
                logging.info("OfflineData.init_normalizers: %s follows a transformer that changes observations; "
                             "its statistics come from the rollout only", type(part).__name__)
        elif isinstance(part, RewardNormalizer):
            running_return = 0.0  # RewardNormalizer.gamma: the return carried from one chunk to the next
            for lo in range(0, len(steps), CHUNK_ROWS):
                running_return = part.update_from_episodes(np.asarray(steps.step_type[lo:lo + CHUNK_ROWS]),
                                                           np.asarray(steps.reward[lo:lo + CHUNK_ROWS]),
                                                           running_return)
            updated.append(type(part).__name__)
        elif type(part).__name__ not in ("UntransformedTimeStep",):
            raw_observations = raw_observations and _keeps_observations(part)
    return updated


def _keeps_observations(part: DataTransformer) -> bool:
    """Transformers that leave observations as they are (reward shaping, the untransformed copy)."""
    return "Reward" in type(part).__name__


def _feed_observations(normalizer: ObservationNormalizer, steps: Steps) -> None:
    observation = steps.observation
    if normalizer.fields is None:
        pairs = [(normalizer.stats, observation)]
    else:
        pairs = [(normalizer.field_stats[k], observation[k]) for k in normalizer.fields]
    with torch.no_grad():
        for stats, array in pairs:
            for lo in range(0, len(array), CHUNK_ROWS):
                chunk = np.ascontiguousarray(array[lo:lo + CHUNK_ROWS], dtype=np.float32)
                stats.update(torch.from_numpy(chunk))
