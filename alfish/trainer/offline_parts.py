"""The parts of offline and hybrid training (DESIGN.md §3.11, §3.14), for ``build.py``.

    TrainerConfig.offline_buffer_dir ──► load_offline_data (each source, ``offline_buffer_length`` steps at most)
        ──► Steps ──► (pure offline) EnvSpec of the data, NoCollector
        ──► OfflineReplayBuffer (uniform or prioritized, like the online one)
        ──► replay: the offline buffer alone (pure offline) or a MixedReplayBuffer with the online one
        ──► training step: HybridTraining (ALF's scheme, pure offline included) or SampledReplayTraining over the
            mixture (RLPD's)
"""
from __future__ import annotations

import logging
import os
from typing import Optional

import gymnasium as gym
import torch

from alfish.algorithms.base import Algorithm
from alfish.collect.collector import Collector, example_experience
from alfish.collect.no_collector import NoCollector
from alfish.config.trainer_config import TrainerConfig
from alfish.envs.batched_env import create_environment
from alfish.envs.spec import EnvSpec
from alfish.replay.offline.mixed import MixedReplayBuffer
from alfish.replay.offline.offline_buffer import OfflineReplayBuffer, concatenate, offline_replay_buffer
from alfish.replay.offline.options import OfflineOptions
from alfish.replay.offline.sources import load_offline_data
from alfish.replay.offline.statistics import init_normalizers
from alfish.replay.offline.steps import Steps, check_spaces, infer_spaces
from alfish.replay.prioritized import make_prioritized_sampler
from alfish.replay.replay_buffer import ReplayBuffer
from alfish.replay.samplers import UniformSampler
from alfish.trainer.counters import Counters
from alfish.trainer.hybrid_training import HybridTraining, RlSchedule
from alfish.trainer.training import ReplaySettings, SampledReplayTraining, StepParts, TrainingStep
from alfish.transforms.base import DataTransformer


def is_pure_offline(config: TrainerConfig) -> bool:
    """Offline data and no RL part within the run: ``rl_train_after_update_steps >= num_iterations > 0``."""
    return (config.offline_buffer_dir is not None and config.num_iterations > 0
            and config.rl_train_after_update_steps >= config.num_iterations)


def check_offline_combinations(config: TrainerConfig, options: OfflineOptions, on_policy: Optional[bool],
                               name: str) -> None:
    """What offline data cannot be combined with, each a one-line ValueError."""
    if config.offline_buffer_dir is None:
        return
    name = name or getattr(config.algorithm_ctor, "__name__", "the algorithm")
    if on_policy:
        raise ValueError(f"TrainerConfig.offline_buffer_dir needs an off-policy algorithm; {name} trains on-policy on "
                         "its own unroll (use SAC, TD3, DDPG, DQN, BC or IQL)")
    if options.mixing == "mixed" and (config.rl_train_after_update_steps != 0
                                      or config.rl_train_every_update_steps != 1):
        raise ValueError("TrainerConfig.rl_train_after_update_steps / rl_train_every_update_steps schedule ALF's "
                         "separate offline and RL losses, but OfflineData.mixing='mixed' trains one loss on mixed "
                         "batches; remove them or set OfflineData.mixing='separate'")
    if config.num_iterations <= 0 and config.rl_train_after_update_steps > 0:
        raise ValueError(f"TrainerConfig.rl_train_after_update_steps={config.rl_train_after_update_steps} counts "
                         "iterations: set TrainerConfig.num_iterations > 0 (a run bounded by num_env_steps alone "
                         "collects nothing while only the offline loss trains)")


def load_sources(config: TrainerConfig, options: OfflineOptions) -> Steps:
    """Every source of ``offline_buffer_dir`` (at most ``offline_buffer_length`` steps each), as one ``Steps``."""
    specs = config.offline_buffer_dir
    specs = [specs] if isinstance(specs, str) else list(specs)
    cache_dir = options.cache_dir or os.path.join(config.root_dir, "offline_cache")
    limit = None if options.in_memory_limit_mb is None else options.in_memory_limit_mb << 20
    sources = []
    for spec in specs:
        steps = load_offline_data(spec, cache_dir=cache_dir, in_memory_limit_bytes=limit)
        if config.offline_buffer_length is not None:
            steps = steps.head(config.offline_buffer_length)
        logging.info("offline data %s: %d steps, %d episodes", spec, len(steps), steps.num_episodes)
        sources.append(steps)
    return concatenate(sources)


def offline_spec(steps: Steps) -> EnvSpec:
    """The spaces pure offline training builds the algorithm for: those the data stores; for data that stores none
    (D4RL arrays), those of the conf's env (``create_environment.env_name``: one instance opened and closed here), or
    inferred from the data (``steps.infer_spaces``) when they do not fit it."""
    if steps.observation_space is not None and steps.action_space is not None:
        return EnvSpec(steps.observation_space, steps.action_space, 1)
    env = create_environment(num_parallel_environments=1, vectorization="sync")
    try:
        observation_space, action_space = env.observation_space, env.action_space
    finally:
        env.close()
    try:
        check_spaces(steps, observation_space, action_space, "the conf's env (create_environment.env_name)")
    except ValueError as err:
        observation_space, action_space = infer_spaces(steps)
        logging.warning("%s; using spaces inferred from the data instead: %s, %s", err, observation_space,
                        action_space)
    return EnvSpec(observation_space, action_space, 1)


def build_offline_collector(spec: EnvSpec) -> Collector:
    return NoCollector(spec)


def build_offline_replay(config: TrainerConfig, options: OfflineOptions, steps: Steps, algorithm: Algorithm,
                         transformer: DataTransformer, spec: EnvSpec, device: torch.device) -> OfflineReplayBuffer:
    """The offline data as a read-only buffer shaped as the online one (checked against the env's spaces), sampled
    uniformly or by priority as ``TrainerConfig.priority_replay`` says; normalizers initialised from it."""
    check_spaces(steps, spec.observation_space, spec.action_space, "the env")
    if isinstance(spec.action_space, gym.spaces.Box):
        _warn_actions_outside(steps, spec.action_space)
    example = example_experience(algorithm, transformer, spec)
    if config.priority_replay:
        sampler = make_prioritized_sampler(config, 1, len(steps))
    else:
        sampler = UniformSampler()
    buffer = offline_replay_buffer(steps, example, sampler, device=device,
                                   track_episode_ends=transformer.needs_episode_ends)
    if options.init_normalizers:
        updated = init_normalizers(transformer, steps)
        if updated:
            logging.info("normalizer statistics initialised from the offline data: %s", ", ".join(updated))
    return buffer


def combine_replay(online: Optional[ReplayBuffer], offline: OfflineReplayBuffer, options: OfflineOptions):
    """What the trainer holds (adds to, checkpoints): the offline buffer alone for pure offline training, else both."""
    if online is None:
        return offline
    fraction = options.offline_fraction if options.mixing == "mixed" else 0.5
    return MixedReplayBuffer(online, offline, fraction)


def build_offline_training_step(config: TrainerConfig, options: OfflineOptions, parts: StepParts,
                                replay: OfflineReplayBuffer | MixedReplayBuffer, counters: Counters,
                                total_envs: int) -> TrainingStep:
    """ALF's scheme (pure offline included): ``HybridTraining``; RLPD's: sampled training over the mixture."""
    settings = ReplaySettings.of(config, total_envs)
    if options.mixing == "mixed" and isinstance(replay, MixedReplayBuffer):
        return SampledReplayTraining(parts, replay, settings)
    schedule = RlSchedule(rl_train_after_update_steps=config.rl_train_after_update_steps,
                          rl_train_every_update_steps=config.rl_train_every_update_steps)
    return HybridTraining(parts, replay, counters, settings, schedule)


def _warn_actions_outside(steps: Steps, space: gym.spaces.Box) -> None:
    import numpy as np

    low, high = float(np.min(steps.action)), float(np.max(steps.action))
    if low < float(np.min(space.low)) - 1e-6 or high > float(np.max(space.high)) + 1e-6:
        logging.warning("%s: actions span [%.3g, %.3g], outside the env's action space [%s, %s]; they are used as "
                        "they are", steps.source, low, high, space.low, space.high)
