"""``HybridTraining``: ALF's offline + online scheme as a training step (a part chosen at assembly, DESIGN.md §3.11).

Every update trains the algorithm's loss on an offline batch of ``mini_batch_size`` sequences. The RL part (online
collection, and the loss on an online batch of another ``mini_batch_size``, summed with the offline loss into one
backward) starts at iteration ``rl_train_after_update_steps`` and then trains at the iterations divisible by
``rl_train_every_update_steps``; the iteration is ALF's global counter, which advances once per iteration. Before the RL
part starts nothing is collected; when it starts, the warm-up (``initial_collect_steps``, at least one sequence per
env) is collected first. Pure offline training is this step with ``rl_train_after_update_steps >= num_iterations``, a
``NoCollector`` and no online buffer: it never collects.

RLPD's scheme (one loss on batches mixing both) needs no step of its own: it is ``SampledReplayTraining`` over a
``MixedReplayBuffer``.
"""
from __future__ import annotations

import math
import time
from typing import Optional

import torch

from alfish.algorithms.base import Algorithm
from alfish.collect.collector import Collector
from alfish.data.types import BatchInfo
from alfish.learn.distributed import merge_statistics_across_ranks
from alfish.learn.learner import Learner
from alfish.replay.batching import to_time_major
from alfish.replay.offline.mixed import MixedReplayBuffer
from alfish.replay.offline.offline_buffer import OfflineReplayBuffer
from alfish.replay.replay_buffer import ReplayBuffer
from alfish.trainer.counters import Counters
from alfish.trainer.training import TrainingStep
from alfish.transforms.base import DataTransformer


class HybridTraining(TrainingStep):
    """See the module docstring.

    Args:
        offline: the offline data.
        online: the online buffer (``None`` for pure offline training), and ``mixture`` the buffer the trainer
            checkpoints that holds both (it counts the sequences drawn from each part).
        counters: the run's counters (the iteration decides whether the RL part trains).
        initial_collect_steps, total_envs: as ``ReplayTraining`` (env steps over the job; envs over all ranks).
    """

    def __init__(self, collector: Collector, learner: Learner, algorithm: Algorithm, transformer: DataTransformer,
                 offline: OfflineReplayBuffer, online: Optional[ReplayBuffer], mixture: Optional[MixedReplayBuffer],
                 counters: Counters, rl_train_after_update_steps: int, rl_train_every_update_steps: int,
                 initial_collect_steps: int, total_envs: int, num_updates_per_train_iter: int, mini_batch_size: int,
                 mini_batch_length: int):
        super().__init__(collector, learner, algorithm)
        self.transformer, self.offline, self.online, self.mixture = transformer, offline, online, mixture
        self.counters = counters
        self.rl_after, self.rl_every = rl_train_after_update_steps, rl_train_every_update_steps
        self.initial_collect_steps, self.total_envs = initial_collect_steps, total_envs
        self.num_updates, self.mini_batch_size, self.mini_batch_length = (num_updates_per_train_iter, mini_batch_size,
                                                                          mini_batch_length)
        self.updates = {"offline": 0, "rl": 0}  # updates that trained each part (this process's run)

    # ------------------------------------------------------------------------------------------------ schedule ----
    def rl_started(self, iteration: int) -> bool:
        return self.online is not None and iteration >= self.rl_after

    def rl_due(self, iteration: int) -> bool:
        """ALF's rule: ``counter >= rl_train_after_update_steps and counter % rl_train_every_update_steps == 0``."""
        return self.rl_started(iteration) and iteration % self.rl_every == 0

    def steps_before_training(self, counters: Counters) -> int:
        """The warm-up, once the RL part has started (else nothing)."""
        return self._warm_up_steps() if self.rl_started(counters.iteration) else 0

    def _warm_up_steps(self) -> int:
        stored = int(self.online.num_stored().min())
        target = math.ceil(self.initial_collect_steps / self.total_envs)
        return max(0, max(target, self.mini_batch_length) - stored)

    # ------------------------------------------------------------------------------------------------ training ----
    def _collect_and_train(self, steps_per_env: int) -> int:
        iteration = self.counters.iteration
        collected = 0
        self.timing["unroll_s"] = 0.0
        if self.rl_started(iteration):
            start = time.monotonic()
            warm_up = self._warm_up_steps()  # the RL part has just started: fill the online buffer first
            if warm_up:
                collected += self.collector.warm_up(warm_up)
            collected += self.collector.collect(steps_per_env)
            self.timing["unroll_s"] = time.monotonic() - start
        merge_statistics_across_ranks(self.transformer, self.learner.dist)
        rl_due = self.rl_due(iteration)
        for _ in range(self.num_updates):
            self._update(rl_due)
        return collected

    def _update(self, rl_due: bool) -> None:
        batch, info = self._batch(self.offline)
        self.last_actions = batch.action, batch.step_type
        if not rl_due:
            loss_info = self.learner.update(batch, info)
            self.offline.update_priorities(info, loss_info.priority)
            self._count(0, self.mini_batch_size)
            return
        rl_batch, rl_info = self._batch(self.online)
        both = BatchInfo(env_ids=torch.cat([info.env_ids, rl_info.env_ids]),
                         positions=torch.cat([info.positions, rl_info.positions]),
                         importance_weights=_cat_weights(info, rl_info))
        loss_info = self.learner.update(batch, both, rl_batch=rl_batch)
        self.last_actions = rl_batch.action, rl_batch.step_type  # the online batch: rollout actions
        if isinstance(loss_info.priority, torch.Tensor):
            n = self.mini_batch_size
            self.offline.update_priorities(info, loss_info.priority[:n])
            self.online.update_priorities(rl_info, loss_info.priority[n:])
        self._count(self.mini_batch_size, self.mini_batch_size)

    def _batch(self, buffer: ReplayBuffer):
        raw, info = buffer.sample(self.mini_batch_size, self.mini_batch_length)
        raw = self.transformer.transform_sample(raw, info, buffer)
        raw, on_device = buffer.to_device(raw, info)
        return self.transformer.transform_experience(to_time_major(raw)), on_device

    def _count(self, online: int, offline: int) -> None:
        self.updates["offline"] += 1
        self.updates["rl"] += int(online > 0)
        if self.mixture is not None:
            self.mixture.record_draw(online, offline)

    def summary(self) -> dict[str, float]:
        out = super().summary()
        out.update({f"hybrid/{part}_updates": float(count) for part, count in self.updates.items()})
        if self.mixture is not None:
            out.update(self.mixture.summary())
        return out


def _cat_weights(first: BatchInfo, second: BatchInfo) -> Optional[torch.Tensor]:
    if first.importance_weights is None and second.importance_weights is None:
        return None

    def weights(info: BatchInfo) -> torch.Tensor:
        return (info.importance_weights if info.importance_weights is not None
                else torch.ones(len(info.env_ids), device=_device_of(first, second)))

    return torch.cat([weights(first), weights(second)])


def _device_of(*infos: BatchInfo) -> torch.device:
    return next(i.importance_weights.device for i in infos if i.importance_weights is not None)
