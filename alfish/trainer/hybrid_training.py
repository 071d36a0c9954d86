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

import dataclasses
import math
import time

import torch

from alfish.data.types import BatchInfo
from alfish.learn.distributed import HybridBatch, merge_statistics_across_ranks
from alfish.replay.offline.mixed import MixedReplayBuffer, concat_infos
from alfish.replay.offline.offline_buffer import OfflineReplayBuffer
from alfish.replay.replay_buffer import ReplayBuffer
from alfish.trainer.counters import Counters
from alfish.trainer.training import ReplaySettings, Sample, StepParts, TrainingStep, sample_batch


@dataclasses.dataclass(frozen=True)
class RlSchedule:
    """When the RL part trains: from iteration ``rl_train_after_update_steps`` on, at the iterations divisible by
    ``rl_train_every_update_steps`` (ALF's ``TrainerConfig`` names)."""

    rl_train_after_update_steps: int
    rl_train_every_update_steps: int


class HybridTraining(TrainingStep):
    """See the module docstring.

    Args:
        replay: the offline data alone (pure offline training), or the ``MixedReplayBuffer`` of the online buffer and
            the offline data that the trainer checkpoints (it counts the sequences drawn from each part).
        counters: the run's counters (the iteration decides whether the RL part trains).
        settings: the warm-up (``initial_collect_steps``, ``total_envs``) and the mini-batches; ``num_env_steps`` is
            not read.
    """

    def __init__(self, parts: StepParts, replay: OfflineReplayBuffer | MixedReplayBuffer, counters: Counters,
                 settings: ReplaySettings, schedule: RlSchedule):
        super().__init__(parts)
        self.mixture = replay if isinstance(replay, MixedReplayBuffer) else None
        self.offline = replay.offline if self.mixture is not None else replay
        self.online = replay.online if self.mixture is not None else None
        self.counters, self.settings, self.schedule = counters, settings, schedule
        self.updates = {"offline": 0, "rl": 0}  # updates that trained each part (this process's run)

    # ------------------------------------------------------------------------------------------------ schedule ----
    def rl_started(self, iteration: int) -> bool:
        return self.online is not None and iteration >= self.schedule.rl_train_after_update_steps

    def rl_due(self, iteration: int) -> bool:
        """ALF's rule: ``counter >= rl_train_after_update_steps and counter % rl_train_every_update_steps == 0``."""
        return self.rl_started(iteration) and iteration % self.schedule.rl_train_every_update_steps == 0

    def steps_before_training(self, counters: Counters) -> int:
        """The warm-up, once the RL part has started (else nothing)."""
        return self._warm_up_steps() if self.rl_started(counters.iteration) else 0

    def _warm_up_steps(self) -> int:
        stored = int(self.online.num_stored().min())
        target = math.ceil(self.settings.initial_collect_steps / self.settings.total_envs)
        return max(0, max(target, self.settings.mini_batch_length) - stored)

    # ------------------------------------------------------------------------------------------------ training ----
    def _collect_and_train(self, steps_per_env: int) -> float:
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
        for _ in range(self.settings.num_updates_per_train_iter):
            self._update(rl_due)
        return collected

    def _update(self, rl_due: bool) -> None:
        if not rl_due:
            offline = self._sample(self.offline)
            self.last_actions = offline.batch.action, offline.batch.step_type
            loss_info = self.learner.update(offline.batch, offline.info)
            self.offline.update_priorities(offline.where, loss_info.priority)
            self._count(0, self.settings.mini_batch_size)
            return
        offline, online, both = self.sample_both()
        loss_info = self.learner.update(HybridBatch(offline=offline.batch, online=online.batch), both)
        self.last_actions = online.batch.action, online.batch.step_type  # the online batch: rollout actions
        if isinstance(loss_info.priority, torch.Tensor):
            n = self.settings.mini_batch_size
            self.offline.update_priorities(offline.where, loss_info.priority[:n])
            self.online.update_priorities(online.where, loss_info.priority[n:])
        self._count(self.settings.mini_batch_size, self.settings.mini_batch_size)

    def sample_both(self) -> tuple[Sample, Sample, BatchInfo]:
        """An offline and an online mini-batch (in that order), and the ``BatchInfo`` the learner gets for the two
        (offline rows first), all on the training device whatever device each sampler keeps its indices on (host
        trees for the offline data; maybe device trees online). Priorities go back to each part with the indices its
        own sampler drew (each ``Sample.where``)."""
        offline = self._sample(self.offline)
        online = self._sample(self.online)
        return offline, online, concat_infos([offline.info, online.info], self.offline.device)

    def _sample(self, buffer: ReplayBuffer) -> Sample:
        return sample_batch(buffer, self.transformer, self.settings.mini_batch_size, self.settings.mini_batch_length)

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
