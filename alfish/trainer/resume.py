"""What a checkpoint holds and how the parts are restored from one: a function of the parts and the checkpoint
(no envs, no processes), so resuming is testable on its own.

Layout 2 (this alfish): tensors ``algorithm``, ``transformers``, ``learner`` (optimizer, AMP scaler, update count),
``rng`` and, with ``Trainer.save_replay_buffer``, ``replay`` (storage and sampler); meta: ``layout``, the counters,
the seed, the episode count, the RNG's JSON half, the operative config, versions and the job's ``world_size`` (DDP
ranks). Play reads only ``algorithm``, ``transformers`` and the operative config, which layout 1 had too.

A checkpoint resumes only with the world size that wrote it: each rank has its own envs, env seeds and replay buffer
(per-rank ``num_parallel_environments``), and the counters advance by the job's total envs, so another world size
would be a different run. A layout-2 checkpoint without ``world_size`` was written before alfish recorded it and is
read as a 1-rank job: multi-rank jobs then split the conf's envs and batch across ranks, so such a job cannot be
continued under today's per-rank settings anyway.
"""
from __future__ import annotations

import logging
from typing import Optional

import gin
import torch
import torch.distributed as dist

from alfish.algorithms.base import Algorithm
from alfish.collect.collector import example_experience
from alfish.collect.episode_stats import EpisodeStats
from alfish.envs.spec import EnvSpec
from alfish.learn.learner import Learner
from alfish.replay.replay_buffer import ReplayBuffer
from alfish.seeding import reseed, seed_everything
from alfish.trainer.checkpoint import CheckpointError, LoadedCheckpoint
from alfish.trainer.counters import Counters
from alfish.trainer.rng import capture_rng_state, restore_rng_state
from alfish.transforms.base import DataTransformer

CHECKPOINT_LAYOUT = 2


def check_resumable(ckpt: LoadedCheckpoint, world_size: Optional[int] = None) -> None:
    """CheckpointError unless ``ckpt`` was written with this alfish's checkpoint layout and, when ``world_size`` is
    given, by a job of that many ranks (a checkpoint without the record counts as 1 rank)."""
    layout = ckpt.meta.get("layout", 1)
    if layout != CHECKPOINT_LAYOUT:
        raise CheckpointError(f"checkpoint {ckpt.path} was made by an older alfish (checkpoint layout {layout}, this "
                              f"version reads {CHECKPOINT_LAYOUT}); resume it with the alfish that wrote it, or "
                              "train into a new root_dir (play still reads it)")
    written_by = int(ckpt.meta.get("world_size", 1))
    if world_size is not None and world_size != written_by:
        launch = (f"{written_by} ranks (e.g. torchrun --nproc_per_node={written_by})" if written_by > 1
                  else "a single process (python -m alfish.bin.train, without torchrun)")
        raise CheckpointError(f"checkpoint {ckpt.path} was written by a {written_by}-rank job and this job has "
                              f"{world_size}; resume it with {launch} (replay buffers and env seeds are per rank), or "
                              "train into a new root_dir")


def job_world_size() -> int:
    """The number of ranks of the process group this process is in (1 outside torchrun)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def checkpoint_contents(*, algorithm: Algorithm, transformer: DataTransformer, learner: Learner, counters: Counters,
                        stats: EpisodeStats, replay: Optional[ReplayBuffer], seed: int,
                        world_size: Optional[int] = None) -> tuple[dict, dict]:
    """``(tensors, meta)`` for ``Checkpointer.save``; ``replay=None`` leaves the buffer out. ``world_size``: the
    job's number of ranks (``None``: read from the process group)."""
    rng_tensors, rng_meta = capture_rng_state()
    tensors = dict(algorithm=algorithm.state_dict(), transformers=transformer.state_dict(),
                   learner=learner.state_dict(), rng=rng_tensors)
    if replay is not None:
        tensors["replay"] = replay.state_dict()
    meta = dict(layout=CHECKPOINT_LAYOUT, **counters.state_dict(), seed=seed, num_episodes=stats.num_episodes,
                rng=rng_meta, operative_config=gin.operative_config_str(), versions=dict(torch=torch.__version__),
                world_size=job_world_size() if world_size is None else int(world_size))
    return tensors, meta


def restore(ckpt: LoadedCheckpoint, *, algorithm: Algorithm, transformer: DataTransformer, learner: Learner,
            counters: Counters, stats: EpisodeStats, replay: Optional[ReplayBuffer], spec: EnvSpec,
            rank: int = 0, rank_seed: int = 0) -> None:
    """Load every part's state from ``ckpt``, the global RNGs last. A replay buffer absent from the checkpoint stays
    empty. Stored episodes end where they were cut (the envs restart: episodes in flight are not resumable). Rank
    ``r > 0`` of a DDP job, which loads rank 0's checkpoint, continues on an RNG stream of its own."""
    check_resumable(ckpt)
    meta, tensors = ckpt.meta, ckpt.tensors
    example = example_experience(algorithm, transformer, spec)  # before the RNG is restored: it draws an action
    algorithm.load_state_dict(tensors["algorithm"])
    transformer.load_state_dict(tensors["transformers"])
    learner.load_state_dict(tensors["learner"])
    counters.load_state_dict(meta)
    stats.num_episodes = int(meta.get("num_episodes", 0))
    if replay is not None and "replay" in tensors:
        replay.load_state_dict(tensors["replay"], example)
        replay.truncate_episodes()
    restore_rng_state(tensors["rng"], meta["rng"])
    if rank > 0:
        seed_everything(reseed(rank_seed, counters.iteration))
    logging.info("resumed from %s: iteration %d, env steps %d", ckpt.path, counters.iteration, counters.env_steps)
