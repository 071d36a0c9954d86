"""The trainer's prioritized sampler, from its ``TrainerConfig``: the one place that maps the config's
``priority_replay_*`` and ``normalize_importance_weights_by_max`` to the sampler's options."""
from __future__ import annotations

import torch

from alfish.config.trainer_config import TrainerConfig
from alfish.replay.prioritized.base import PrioritizedSampler
from alfish.schedulers import as_scheduler


def make_prioritized_sampler(config: TrainerConfig, num_envs: int, capacity: int,
                             device: str | torch.device = "cpu") -> PrioritizedSampler:
    """A ``PrioritizedSampler`` for rings of ``num_envs x capacity`` steps drawing sequences of
    ``config.mini_batch_length`` steps, its trees on ``device`` (which picks the implementation: see
    ``PrioritizedSampler``); alpha and beta are schedulers (a number becomes a constant one)."""
    return PrioritizedSampler(num_envs, capacity, sequence_length=config.mini_batch_length,
                              alpha=as_scheduler(config.priority_replay_alpha),
                              beta=as_scheduler(config.priority_replay_beta), eps=config.priority_replay_eps,
                              normalize_by_max=config.normalize_importance_weights_by_max, device=device)
