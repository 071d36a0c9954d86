"""Training-step strategies: what one iteration does with the collector, the replay buffer and the learner.
Chosen once, at assembly (``build.py``), so the loop never branches on the mode.

- ``OnPolicyTraining``: unroll with gradients and train on that trajectory (A2C).
- ``SampledReplayTraining``: collect into the replay buffer, then ``num_updates_per_train_iter`` sampled
  mini-batches (SAC, DQN, DDPG/TD3; uniform or prioritized sampling is the buffer's business).
- ``WholeBufferTraining``: collect into the buffer, then epochs of shuffled mini-batches over all of it, and clear it
  (PPO, ALF's ``whole_replay_buffer_training`` + ``clear_replay_buffer``).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import NamedTuple, Optional

import torch

from alfish.algorithms.base import Algorithm
from alfish.collect.collector import Collector
from alfish.config.trainer_config import TrainerConfig
from alfish.data import nest
from alfish.data.types import BatchInfo, Experience, StepType
from alfish.learn.distributed import any_rank, merge_statistics_across_ranks
from alfish.learn.learner import Learner
from alfish.replay.batching import WholeBufferBatches, to_time_major
from alfish.replay.replay_buffer import ReplayBuffer
from alfish.trainer.counters import Counters
from alfish.transforms.base import DataTransformer


@dataclasses.dataclass(frozen=True)
class StepParts:
    """The parts every training step works with: where experience comes from, the update, the algorithm, and the data
    transformers (applied to sampled batches)."""

    collector: Collector
    learner: Learner
    algorithm: Algorithm
    transformer: DataTransformer


@dataclasses.dataclass(frozen=True)
class ReplaySettings:
    """What the replay training steps read from the config (``TrainerConfig``'s names, per rank).

    initial_collect_steps: env steps over the job before training; num_env_steps: the run's budget (0: none), which
    the warm-up never passes; total_envs: envs over all ranks.
    """

    initial_collect_steps: int
    num_env_steps: int
    total_envs: int
    num_updates_per_train_iter: int
    mini_batch_size: Optional[int]
    mini_batch_length: Optional[int]
    presample_mini_batches: bool = False  # (``Trainer.presample_mini_batches``, a run option)

    @classmethod
    def of(cls, config: TrainerConfig, total_envs: int) -> ReplaySettings:
        return cls(initial_collect_steps=config.initial_collect_steps, num_env_steps=config.num_env_steps,
                   total_envs=total_envs, num_updates_per_train_iter=config.num_updates_per_train_iter,
                   mini_batch_size=config.mini_batch_size, mini_batch_length=config.mini_batch_length)


class Sample(NamedTuple):
    """A sampled mini-batch, ready for an update: ``batch`` time-major ``[L, B]``, transformed, on the training
    device; ``where`` as the sampler returned it (for ``update_priorities``); ``info`` with the importance weights on
    the training device (for ``Learner.update``)."""

    batch: Experience
    where: BatchInfo
    info: BatchInfo


def sample_batch(replay: ReplayBuffer, transformer: DataTransformer, batch_size: int, length: int,
                 num_batches: int = 1) -> Sample:
    """``batch_size`` sequences of ``length`` steps from ``replay`` (the one pipeline of sampled training, hybrid
    included): sampled where the storage is, transformed there (the transformers that read neighbouring stored steps
    read the storage), copied to the training device (one non_blocking copy per field), made time-major and given the
    experience view of the transformers. ``num_batches``: that many mini-batches drawn at once (``[L, num_batches *
    batch_size]``; ``split_sample`` cuts them apart)."""
    raw, where = replay.sample(batch_size, length, num_batches=num_batches) if num_batches > 1 else \
        replay.sample(batch_size, length)
    raw = transformer.transform_sample(raw, where, replay)
    raw, on_device = replay.to_device(raw, where)
    return Sample(transformer.transform_experience(to_time_major(raw)), where, on_device)


def split_sample(sample: Sample, num_batches: int) -> list[tuple[Experience, BatchInfo]]:
    """The ``num_batches`` mini-batches of a ``sample_batch(..., num_batches)``: ``(batch [L, B], info [B])`` views,
    in the order drawn."""
    size = sample.info.env_ids.shape[0] // num_batches

    def rows(k: int) -> tuple[Experience, BatchInfo]:
        part = slice(k * size, (k + 1) * size)
        batch = nest.map_nest(lambda x: x[:, part], sample.batch)  # (time-major: the batch is dim 1)
        info = BatchInfo(*(None if x is None else x[part] for x in sample.info))
        return batch, info

    return [rows(k) for k in range(num_batches)]


class TrainingStep:
    """One iteration's collection and training; ``timing`` holds the last iteration's seconds of each.

    ``last_actions`` are the actions and step types of the experience last trained on (references, kept for the
    action summaries: no copy, no op; not the observations, which may be large); their last row only bootstraps when
    ``last_row_bootstraps`` (the on-policy unroll).
    """

    last_row_bootstraps = False

    def __init__(self, parts: StepParts):
        self.collector, self.learner, self.algorithm = parts.collector, parts.learner, parts.algorithm
        self.transformer = parts.transformer
        self.timing = dict(unroll_s=0.0, train_s=0.0)
        self.last_actions: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # (action, step_type)

    def steps_before_training(self, counters: Counters) -> int:
        """Steps per env to collect before the first iteration (the warm-up), given what ``counters`` say was done."""
        return 0

    def run(self, steps_per_env: int) -> float:
        """Collect ``steps_per_env`` steps per env and train; returns the steps per env collected (``collect``'s)."""
        start = time.monotonic()
        self.transformer.begin_iteration()  # e.g. the observation statistics this iteration normalizes with
        collected = self._collect_and_train(steps_per_env)
        self.timing["train_s"] = time.monotonic() - start - self.timing["unroll_s"]
        self.algorithm.after_train_iter()
        return collected

    def _collect_and_train(self, steps_per_env: int) -> float:
        raise NotImplementedError

    def summary(self) -> dict[str, float]:
        return {f"time/{name}": seconds for name, seconds in self.timing.items()}

    def taken_actions(self) -> Optional[torch.Tensor]:
        """The actions ``[N, *action_shape]`` of ``last_actions`` for ``TrainerConfig.summarize_action_distributions``:
        this iteration's rollout for on-policy (the unroll, without its bootstrap row) and whole-buffer training (the
        buffer); rollout actions sampled from replay for sampled training (the last mini-batch: the async unroll's
        steps reach the trainer only through the buffer); with hybrid training the last online batch if the RL part
        trained, else the offline data's. The placeholders stored at LAST steps (ignored by the env) are left out.
        Reads the step types on the host: call it when a summary is due. ``None`` before any training."""
        if self.last_actions is None or not isinstance(self.last_actions[0], torch.Tensor):
            return None
        action, step_type = self.last_actions
        if self.last_row_bootstraps:
            action, step_type = action[:-1], step_type[:-1]
        taken = (step_type != StepType.LAST).reshape(-1)
        return action.detach().reshape((taken.shape[0],) + tuple(action.shape[step_type.dim():]))[taken]


class OnPolicyTraining(TrainingStep):
    """Trains on the trajectory ``[T + 1, B]`` just unrolled, with gradients; no replay."""

    last_row_bootstraps = True

    def _collect_and_train(self, steps_per_env: int) -> int:
        # The unroll is the update's forward: it runs in the update's contexts (output hooks on diagnosed updates,
        # and the AMP policy's autocast, so the graph the loss backpropagates through is built in its precision).
        # An algorithm that recomputes its rollout infos unrolls without gradients and runs its forward pass on the
        # whole trajectory at once (OnPolicyAlgorithm.recompute_rollout_info).
        recompute = self.algorithm.recomputes_rollout_info
        with self.learner.capturing_outputs(), self.learner.loss_context():
            start = time.monotonic()
            trajectory = self.collector.collect_trajectory(steps_per_env, with_grad=not recompute)
            self.timing["unroll_s"] = time.monotonic() - start
            merge_statistics_across_ranks(self.transformer, self.learner.dist)
            if recompute:
                trajectory = self.algorithm.recompute_rollout_info(trajectory)
            loss_info = self.algorithm.calc_loss(trajectory, None)
        self.learner.apply(loss_info)
        self.last_actions = trajectory.action, trajectory.step_type
        return steps_per_env


class ReplayTraining(TrainingStep):
    """Collects raw steps into ``replay`` and trains from it (``_train``, by the subclass), as ``settings`` say."""

    def __init__(self, parts: StepParts, replay: ReplayBuffer, settings: ReplaySettings):
        super().__init__(parts)
        self.replay, self.settings = replay, settings

    @property
    def num_updates(self) -> int:
        return self.settings.num_updates_per_train_iter

    def steps_before_training(self, counters: Counters) -> int:
        """``initial_collect_steps`` (never past ``num_env_steps``), minus what was taken; skipped on a resume past
        it."""
        target = self.settings.initial_collect_steps
        if self.settings.num_env_steps > 0:  # never collect past the run's own budget
            target = min(target, self.settings.num_env_steps)
        return max(0, math.ceil((target - counters.env_steps) / self.settings.total_envs))

    def _collect_and_train(self, steps_per_env: int) -> float:
        start = time.monotonic()
        collected = self.collector.collect(steps_per_env)
        self.timing["unroll_s"] = time.monotonic() - start
        # Every rank normalizes this iteration's batches with the statistics of all ranks' data (the warm-up's too).
        merge_statistics_across_ranks(self.transformer, self.learner.dist)
        self._train()
        return collected

    def _train(self) -> None:
        raise NotImplementedError

    def summary(self) -> dict[str, float]:
        return {**super().summary(), **self.replay.summary()}


class SampledReplayTraining(ReplayTraining):
    """``num_updates_per_train_iter`` mini-batches of ``mini_batch_size`` sequences of ``mini_batch_length`` steps."""

    def steps_before_training(self, counters: Counters) -> int:
        """The warm-up, and at least one whole sequence per env. A resumed run whose checkpoint has no replay buffer
        (``Trainer.save_replay_buffer=False``) refills one mini-batch worth of steps, so its first samples are not all
        duplicates."""
        length = self.settings.mini_batch_length
        steps = max(super().steps_before_training(counters), length - int(self.replay.num_stored().min()))
        if len(self.replay) == 0 and counters.iteration > 0:
            refill = max(length, math.ceil(self.settings.mini_batch_size / self.replay.num_envs))
            logging.info("resumed without a saved replay buffer: refilling %d steps per env before training "
                         "(set Trainer.save_replay_buffer=True to keep the buffer in checkpoints)", refill)
            steps = max(steps, refill)
        return steps

    def _train(self) -> None:
        if self.settings.presample_mini_batches:
            self._train_presampled()
            return
        for _ in range(self.num_updates):
            sample = sample_batch(self.replay, self.transformer, self.settings.mini_batch_size,
                                  self.settings.mini_batch_length)
            loss_info = self.learner.update(sample.batch, sample.info)
            self.replay.update_priorities(sample.where, loss_info.priority)
            self.last_actions = sample.batch.action, sample.batch.step_type

    def _train_presampled(self) -> None:
        """``Trainer.presample_mini_batches``: the iteration's mini-batches drawn in one call, their priorities
        written back in one, after the last update (in update order: a start drawn twice takes the later one)."""
        sample = sample_batch(self.replay, self.transformer, self.settings.mini_batch_size,
                              self.settings.mini_batch_length, num_batches=self.num_updates)
        scanned = self.learner.update_scanned(sample.batch, sample.info, self.num_updates)  # (Learner.scan_updates)
        if scanned is not None:
            size = sample.info.env_ids.shape[0] // self.num_updates
            self.last_actions = sample.batch.action[:, -size:], sample.batch.step_type[:, -size:]  # the last batch's
            if isinstance(scanned.priority, torch.Tensor):
                self.replay.update_priorities(sample.where, scanned.priority)
            return
        priorities = []
        for batch, info in split_sample(sample, self.num_updates):
            loss_info = self.learner.update(batch, info)
            priorities.append(loss_info.priority)
            self.last_actions = batch.action, batch.step_type
        if all(isinstance(p, torch.Tensor) for p in priorities):
            self.replay.update_priorities(sample.where, torch.cat([p.reshape(-1) for p in priorities]))


class WholeBufferTraining(ReplayTraining):
    """Epochs of shuffled mini-batches over everything stored; then (with ``clear``) all but the newest step of each
    env is forgotten: the next unroll's first transition starts from it, so every transition is trained on once.

    An algorithm with a ``target_kl`` (PPO's, SB3's early stop) stops the iteration's epochs at the first mini-batch
    whose ``approx_kl`` exceeds ``1.5 * target_kl``, before updating on it. That check reads the KL on the host (one
    sync per mini-batch, and under DDP one all-reduce, so that every rank stops at the same mini-batch); it runs only
    when ``target_kl`` is set.
    """

    def __init__(self, parts: StepParts, replay: ReplayBuffer, settings: ReplaySettings, clear: bool = True):
        super().__init__(parts, replay, settings)
        self.clear = clear

    def _train(self) -> None:
        raw, where = self.replay.gather_all()
        raw, _ = self.replay.to_device(self.transformer.transform_sample(raw, where, self.replay), where)
        exp = self.transformer.transform_experience(raw)
        exp = self.algorithm.preprocess_experience(exp)
        batches = WholeBufferBatches(exp, self.settings.mini_batch_length or 1, self.settings.mini_batch_size)
        target_kl = self.algorithm.target_kl  # PPO's early stop (None: none, and no check)
        for _ in range(self.num_updates):
            if not self._train_epoch(batches, target_kl):
                break  # the KL check stopped this epoch: the remaining ones are skipped too
        self.last_actions = exp.action, exp.step_type  # this iteration's rollout (batch-major [B, T])
        if self.clear:
            self.replay.clear(keep_last=1)

    def _train_epoch(self, batches: WholeBufferBatches, target_kl: Optional[float]) -> bool:
        """One update per mini-batch of a shuffled pass over ``batches``; False when the KL check stopped it."""
        for batch in batches.epoch():
            if target_kl is not None and self._kl_too_large(batch, target_kl):
                return False
            self.learner.update(batch)
        return True

    def _kl_too_large(self, batch: Experience, target_kl: float) -> bool:
        """Whether the mini-batch's approximate KL exceeds ``1.5 * target_kl`` on this rank or any other (SB3's
        threshold); one host read of the KL."""
        with self.learner.loss_context():
            kl = float(self.algorithm.approx_kl(batch))
        return any_rank([kl > 1.5 * target_kl], self.learner.dist)[0]
