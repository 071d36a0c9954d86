"""The training loop (DESIGN.md §1): unroll, train, then summaries, evaluation and checkpoints.

``Trainer.run`` reads top to bottom: restore or start, warm up, then iterate until ``num_iterations`` or
``num_env_steps``; a SIGTERM/SIGINT writes a checkpoint and exits, SIGUSR2 writes one and continues, a crash writes
one (asking first only on a terminal) and re-raises.
"""
from __future__ import annotations

import json
import logging
import math
import os
import random
import signal
import sys
import time
from typing import Optional

import gin
import numpy as np
import torch

from alfish.algorithms.base import Algorithm
from alfish.config.trainer_config import TrainerConfig
from alfish.data import nest
from alfish.data.types import BatchInfo, Experience, LossInfo
from alfish.envs.batched_env import BatchedEnv, create_environment
from alfish.replay.batching import WholeBufferBatches, to_time_major
from alfish.replay.prioritized import PrioritizedSampler
from alfish.replay.ring_buffer import RingBuffer
from alfish.schedulers import (as_scheduler, reset_progress, scheduler_summaries, split_lr_schedules,
                               update_optimizer_lrs, update_progress)
from alfish.trainer.amp import AmpPolicy
from alfish.trainer.async_unroller import AsyncUnroller, PolicyLag, UnrollSpec, as_time_step, rollout_state
from alfish.trainer.checkpoint import Checkpointer, LoadedCheckpoint
from alfish.trainer.distributed import (allreduce_gradients, any_rank, broadcast_object, check_parameters_equal,
                                       bind_envs_per_rank, init_distributed, shutdown, split_total, wrap_for_ddp)
from alfish.trainer.evaluator import Evaluator
from alfish.trainer.metrics import EpisodeStats
from alfish.trainer.optim import OptimizerConfig
from alfish.trainer.progress import Progress
from alfish.trainer.rng import capture_rng_state, restore_rng_state
from alfish.trainer.signals import SignalRequests, confirm_checkpoint_on_crash
from alfish.trainer.summary import NullSummaries, Summaries
from alfish.trainer.unroller import Unroller
from alfish.transforms.base import DataTransformer, build_transformers

EVAL_SEED_OFFSET = 1_000_003  # eval envs never share seeds with training envs
RANK_SEED_OFFSET = 10_007  # each DDP rank's envs and sampling get their own seeds


class NonFiniteLossError(RuntimeError):
    pass


class TrainingStopped(SystemExit):
    """Raised after a signal-requested stop has written its checkpoint; carries the exit code (128 + signal)."""


def loss_terms(loss_info: LossInfo) -> dict:
    """The named loss terms of ``loss_info.extra`` (a dict, or a callable computing one lazily)."""
    extra = loss_info.extra
    return dict(extra() if callable(extra) else (extra or {}))


def build_algorithm(config: TrainerConfig, env: BatchedEnv, transformer: DataTransformer) -> Algorithm:
    """Construct ``config.algorithm_ctor`` for ``env``'s action space and the observations the data transformers
    hand it (e.g. stacked frames)."""
    return config.algorithm_ctor(observation_space=transformer.output_observation_space(env.observation_space),
                                 action_space=env.action_space)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@gin.configurable
class Trainer:
    """Runs one experiment described by ``config``.

    save_replay_buffer: store the replay buffer (as tensors, full capacity) in checkpoints, so a resumed run continues
    with the same data; set False to keep checkpoints small (a resume then refills one mini-batch of fresh steps).
    num_threads: torch intra-op threads (``None``: torch's default).
    progress_log_interval_s: seconds between progress lines when stderr is not a terminal.
    random_warm_up_actions: collect the ``initial_collect_steps`` with uniformly random actions instead of the
    untrained policy's (as the TD3 paper and SB3's ``learning_starts`` do; ALF uses the policy, the default here).
    Off-policy algorithms whose rollout stores no info (SAC, DDPG, TD3, DQN), synchronous unroll only.
    """

    def __init__(self, config: TrainerConfig, save_replay_buffer: bool = True, num_threads: Optional[int] = None,
                 progress_log_interval_s: float = 10.0, random_warm_up_actions: bool = False):
        self.config = config
        self.random_warm_up_actions = random_warm_up_actions
        self.root_dir = config.root_dir
        self.save_replay_buffer = save_replay_buffer
        self.progress_log_interval_s = progress_log_interval_s
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.dist = init_distributed()
        os.makedirs(self.root_dir, exist_ok=True)
        self.checkpointer = Checkpointer(os.path.join(self.root_dir, "checkpoints"))
        self._resume_from: Optional[LoadedCheckpoint] = self.checkpointer.load_latest()  # every rank, same one
        self.seed = int(broadcast_object(self._choose_seed(), self.dist))
        self.rank_seed = self.seed + RANK_SEED_OFFSET * self.dist.rank
        seed_everything(self.rank_seed)

        if self.dist.enabled:  # job totals, split across the ranks
            bind_envs_per_rank(self.dist)
        self.env = create_environment(seed=self.rank_seed)
        self.total_envs = self.env.num_envs * self.dist.world_size
        self.mini_batch_size = config.mini_batch_size
        if self.dist.enabled and config.mini_batch_size is not None:
            self.mini_batch_size = split_total(config.mini_batch_size, self.dist, "TrainerConfig.mini_batch_size")
        self.transformer = build_transformers(config.data_transformer_ctor, self.env.observation_space)
        self.algorithm = build_algorithm(config, self.env, self.transformer)
        self.optimizer_config = OptimizerConfig()
        # Learning rates may be schedules (alfish.schedulers); torch needs numbers, updated once per iteration.
        groups, self.lr_schedules = split_lr_schedules(self.algorithm.param_groups())
        self.optimizer = self.optimizer_config.build(groups)
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.loss_module = wrap_for_ddp(self.algorithm, self.dist)  # forward = the loss of a batch
        self.amp = AmpPolicy(config.enable_amp)
        self.stats = EpisodeStats(self.env.num_envs)
        self.replay: Optional[RingBuffer] = None
        self.prioritized: Optional[PrioritizedSampler] = None
        if not self.algorithm.on_policy:
            self.replay = RingBuffer(self.env.num_envs, config.replay_buffer_length,
                                     track_episode_ends=self.transformer.needs_episode_ends)
            if config.priority_replay:
                self.prioritized = PrioritizedSampler(
                    self.env.num_envs, config.replay_buffer_length, sequence_length=config.mini_batch_length,
                    alpha=as_scheduler(config.priority_replay_alpha), eps=config.priority_replay_eps,
                    normalize_by_max=config.normalize_importance_weights_by_max)
                self._priority_beta = as_scheduler(config.priority_replay_beta)
        elif config.priority_replay:
            raise ValueError(f"TrainerConfig.priority_replay=True needs an off-policy algorithm; "
                             f"{type(self.algorithm).__name__} trains on-policy without replay")
        if random_warm_up_actions and (self.algorithm.on_policy or config.async_unroll):
            raise ValueError("Trainer.random_warm_up_actions=True needs an off-policy algorithm and a synchronous "
                             "unroll (TrainerConfig.async_unroll=False): the warm-up runs in this process")
        if config.async_unroll and self.algorithm.on_policy:
            raise ValueError(f"TrainerConfig.async_unroll=True needs an off-policy algorithm; "
                             f"{type(self.algorithm).__name__} trains on-policy on the unroll it just made (with "
                             "gradients), which another process cannot provide")
        self.async_unroller: Optional[AsyncUnroller] = None
        self.policy_lag = PolicyLag()
        num_envs = self.total_envs
        self.expected_iterations = config.expected_num_iterations(num_envs)
        self.checkpoint_iterations = set(config.checkpoint_iterations(num_envs))
        self.eval_interval = config.resolved_eval_interval(num_envs)
        self.summaries = NullSummaries()  # rank 0 alone writes files
        if self.dist.is_main:
            self.summaries = Summaries(self.root_dir, config.resolved_summary_interval(num_envs),
                                       config.summarize_first_interval, config.summaries_flush_secs,
                                       config.summary_max_queue)
        self.evaluator: Optional[Evaluator] = None
        if config.evaluate and self.dist.is_main:
            if config.async_eval:
                logging.info("async_eval=True: asynchronous evaluation is not built yet; evaluating synchronously")
            eval_seed = self.seed + EVAL_SEED_OFFSET
            eval_env = create_environment(num_parallel_environments=config.num_eval_environments, seed=eval_seed)
            self.evaluator = Evaluator(eval_env, config.num_eval_episodes, config.epsilon_greedy, seed=eval_seed,
                                       transform=self.transformer.rollout_view(update_stats=False))
        # Progress counters (all checkpointed).
        self.iteration = 0
        self.env_steps = 0
        self.num_updates = 0
        self._unroll_credit = 0.0  # fractional unroll_length accumulates here
        self._last_loss: Optional[LossInfo] = None
        self._timing = dict(unroll_s=0.0, train_s=0.0)
        self._wall_start = time.monotonic()
        self._elapsed_before = 0.0  # wall-clock of earlier runs of this experiment (resume)

    # ------------------------------------------------------------------------------------------------------ run ----
    def run(self) -> int:
        """Train to the end (or until a stop signal); returns the process exit code."""
        self.unroller = Unroller(self.env, self.algorithm, self.stats,
                                 transform=self.transformer.rollout_view(update_stats=True))
        if self._resume_from is not None:
            self._restore(self._resume_from)
            self._resume_from = None
        progress = Progress(self.expected_iterations, self.iteration,
                            self.progress_log_interval_s if self.dist.is_main else math.inf)
        reset_progress()
        with SignalRequests() as signals:
            try:
                self._update_schedules()
                if self.config.async_unroll:
                    self._start_async_unroll()
                self._warm_up()
                while not self._finished():
                    self._update_schedules()
                    self._train_iteration()
                    self.iteration += 1
                    self._publish_parameters_when_due()
                    self._after_iteration()
                    progress.update(self.iteration, self.env_steps, self.stats.average_return())
                    # Ranks act on a signal together (a signal reaches them at slightly different iterations).
                    checkpoint_now, stop_now = any_rank([signals.checkpoint_requested, signals.stop_requested],
                                                        self.dist)
                    if checkpoint_now:
                        signals.clear_checkpoint_request()  # before saving: a SIGUSR2 during the save is kept
                        self.save_checkpoint()
                    if stop_now:
                        self.save_checkpoint()
                        logging.warning("stopped by signal %s at iteration %d; checkpoint written, rerun the same "
                                        "command to resume", signals.stop_signal, self.iteration)
                        shutdown(self.dist, synchronize=True)  # all ranks agreed to stop at this iteration
                        # a rank stopped because another one was signalled exits as if it had been sent SIGTERM
                        return signals.exit_code() or 128 + int(signal.SIGTERM)
                if self.evaluator is not None and self.iteration % self.eval_interval != 0:
                    self._evaluate()  # always end with an evaluation of the final policy
                if self.config.num_checkpoints > 0 and self.iteration not in self.checkpoint_iterations:
                    self.save_checkpoint()
                shutdown(self.dist, synchronize=True)  # every rank is done: no collective is left in flight
            except (KeyboardInterrupt, Exception) as err:
                self._checkpoint_after_crash(err)
                raise
            finally:
                if self.async_unroller is not None:
                    self.async_unroller.close()
                progress.close()
                self.summaries.close()
                self.env.close()
                if self.evaluator is not None:
                    self.evaluator.env.close()
                shutdown(self.dist)
        logging.info("training finished: %d iterations, %d env steps", self.iteration, self.env_steps)
        return 0

    def _update_schedules(self) -> None:
        """Advance the progress that schedules read, and set the optimizer's scheduled learning rates."""
        update_progress(iterations=self.iteration, env_steps=self.env_steps,
                        fraction=min(1.0, self.iteration / max(1, self.expected_iterations)))
        if self.lr_schedules:
            update_optimizer_lrs(self.optimizer, self.lr_schedules)

    def _finished(self) -> bool:
        cfg = self.config
        return ((cfg.num_iterations > 0 and self.iteration >= cfg.num_iterations)
                or (cfg.num_env_steps > 0 and self.env_steps >= cfg.num_env_steps))

    # ------------------------------------------------------------------------------------------ one iteration ----
    def _warm_up(self) -> None:
        """Collect ``initial_collect_steps`` (total over envs) before training; skipped when resuming past it.

        A resumed off-policy run whose checkpoint has no replay buffer (``Trainer.save_replay_buffer=False``) refills
        one mini-batch worth of steps, so its first samples are not all duplicates.
        """
        cfg = self.config
        if self.replay is None:
            return
        warm_up_target = cfg.initial_collect_steps
        if cfg.num_env_steps > 0:  # never collect past the run's own budget
            warm_up_target = min(warm_up_target, cfg.num_env_steps)
        steps_per_env = max(0, math.ceil((warm_up_target - self.env_steps) / self.total_envs))
        if not cfg.whole_replay_buffer_training:
            # Sampling needs at least one whole sequence per env before the first update.
            steps_per_env = max(steps_per_env, cfg.mini_batch_length - int(self.replay.num_stored().min()))
        if not cfg.whole_replay_buffer_training and self.replay.total_stored() == 0 and self.iteration > 0:
            refill = max(cfg.mini_batch_length, math.ceil(self.mini_batch_size / self.env.num_envs))
            logging.info("resumed without a saved replay buffer: refilling %d steps per env before training "
                         "(set Trainer.save_replay_buffer=True to keep the buffer in checkpoints)", refill)
            steps_per_env = max(steps_per_env, refill)
        if steps_per_env > 0:
            start = time.monotonic()
            if self.random_warm_up_actions:
                self._check_rollout_info_is_empty()
                self.unroller.unroll(steps_per_env, self._store, with_grad=False, random_actions=True)
                self.env_steps += steps_per_env * self.total_envs
            else:
                self._collect(steps_per_env)
            logging.info("collected %d initial env steps in %.1fs", steps_per_env * self.total_envs,
                         time.monotonic() - start)

    def _steps_this_iteration(self) -> int:
        """Env steps per env to unroll now; a fractional unroll_length unrolls one step every 1/x iterations."""
        self._unroll_credit += self.config.unroll_length
        steps = int(self._unroll_credit + 1e-9)
        self._unroll_credit -= steps
        return steps

    def _train_iteration(self) -> None:
        cfg = self.config
        steps = self._steps_this_iteration()
        start = time.monotonic()
        if self.algorithm.on_policy:
            trajectory = self.unroller.unroll_on_policy(steps)
            self.env_steps += steps * self.total_envs
            self._timing["unroll_s"] = time.monotonic() - start
            with self.amp.autocast():
                loss_info = self.algorithm.calc_loss(trajectory, None)
            self._apply_loss(loss_info)
        else:
            self._collect(steps)
            self._timing["unroll_s"] = time.monotonic() - start
            if cfg.whole_replay_buffer_training:
                self._train_on_whole_buffer()
            else:
                for _ in range(cfg.num_updates_per_train_iter):
                    self._update(*self._sample())
        self._timing["train_s"] = time.monotonic() - start - self._timing["unroll_s"]
        self.algorithm.after_train_iter()

    def _check_rollout_info_is_empty(self) -> None:
        """Random warm-up actions come without rollout info; an algorithm that stores some (e.g. PPO's log-probs)
        cannot train on them."""
        with torch.inference_mode():
            info = self.algorithm.rollout_step(self.unroller.seen()).info
        if nest.flatten(info):
            raise ValueError(f"Trainer.random_warm_up_actions=True: {type(self.algorithm).__name__} stores rollout "
                             "info with each step, which random actions do not have; set it to False")

    def _collect(self, steps_per_env: int) -> None:
        """Unroll ``steps_per_env`` steps of every env into the replay buffer: here, or from the async unroll child
        (where ``steps_per_env == 0`` takes whatever has arrived, up to ``max_unroll_length``)."""
        if self.async_unroller is None:
            if steps_per_env > 0:
                self.unroller.unroll(steps_per_env, self._store, with_grad=self.config.unroll_with_grad)
                self.env_steps += steps_per_env * self.total_envs
            return
        received = self.async_unroller.collect(steps_per_env or None, self.config.max_unroll_length)
        for step in received:
            raw = as_time_step(step.experience)
            self._async_stats_view(raw)  # data transformer statistics (e.g. normalizers) live here, not in the child
            self.stats.observe(raw)
            self._store(step.experience)
        self.env_steps += len(received) * self.total_envs
        self.policy_lag.received(received, self.iteration)

    def _start_async_unroll(self) -> None:
        cfg = self.config
        spec = UnrollSpec(config_text=gin.config_str(), root_dir=self.root_dir,
                          seed=self.rank_seed + 7919 * self.iteration,
                          step_interval_s=cfg.unroll_step_interval, parent_pid=os.getpid())
        self.async_unroller = AsyncUnroller(spec, rollout_state(self.algorithm, self.transformer),
                                            cfg.unroll_queue_size)
        self._async_stats_view = self.transformer.rollout_view(update_stats=True)
        self._publish_parameters()  # before the child starts: its first action already uses the current policy
        self.async_unroller.start()

    def _publish_parameters_when_due(self) -> None:
        if self.async_unroller is not None and self.iteration % self.config.unroll_parameter_update_period == 0:
            self._publish_parameters()

    def _publish_parameters(self) -> None:
        progress = (self.iteration, self.env_steps, min(1.0, self.iteration / max(1, self.expected_iterations)))
        version = self.async_unroller.publish(rollout_state(self.algorithm, self.transformer), progress)
        self.policy_lag.published(version, self.iteration)

    def _train_on_whole_buffer(self) -> None:
        """Epochs of shuffled mini-batches over everything stored; then (optionally) clear all but the newest step
        of each env: the next unroll's first transition starts from it."""
        cfg = self.config
        raw = self.replay.gather_all()
        where = BatchInfo(env_ids=torch.arange(self.replay.num_envs), positions=self.replay.oldest_index())
        exp = self.transformer.transform_experience(self.transformer.transform_sample(raw, where, self.replay))
        exp = self.algorithm.preprocess_experience(exp)
        batches = WholeBufferBatches(exp, cfg.mini_batch_length or 1, self.mini_batch_size)
        for _ in range(cfg.num_updates_per_train_iter):
            for batch in batches.epoch():
                self._update(batch)
        if cfg.clear_replay_buffer:
            self.replay.clear(keep_last=1)

    def _store(self, exp: Experience) -> None:
        """Store one step ``[B, ...]`` in the replay buffer (and give it the max priority when prioritized)."""
        self.replay.add(exp)
        if self.prioritized is not None:
            self.prioritized.on_add(exp.env_id)

    def _sample(self) -> tuple[Experience, BatchInfo]:
        """A training batch: time-major ``[L, B]`` experience and where it came from."""
        cfg = self.config
        if self.prioritized is not None:
            exp, info = self.prioritized.sample_batch(self.replay, self.mini_batch_size, self._priority_beta)
        else:
            exp, info = self.replay.sample_uniform(self.mini_batch_size, cfg.mini_batch_length)
        exp = self.transformer.transform_sample(exp, info, self.replay)
        return self.transformer.transform_experience(to_time_major(exp)), info

    def _update(self, exp: Experience, batch_info: Optional[BatchInfo] = None) -> None:
        """One gradient step on a time-major batch ``[L, B]``."""
        with self.amp.autocast():
            loss_info = self.loss_module(exp)  # train_step + calc_loss; under DDP, backward all-reduces gradients
        self._apply_loss(loss_info, batch_info)
        if self.prioritized is not None and isinstance(loss_info.priority, torch.Tensor):
            self.prioritized.update_priorities(batch_info.env_ids, batch_info.positions, loss_info.priority)

    def _apply_loss(self, loss_info: LossInfo, batch_info: Optional[BatchInfo] = None) -> None:
        """Backward and optimizer step on the per-sample loss ``[..., B]``, weighted by importance weights ``[B]``."""
        per_sample = loss_info.loss
        if batch_info is not None and batch_info.importance_weights is not None:
            per_sample = per_sample * batch_info.importance_weights
        loss = per_sample.mean()
        if not torch.isfinite(loss):
            terms = {k: float(v) for k, v in loss_terms(loss_info).items()}
            raise NonFiniteLossError(f"loss is {float(loss)} at iteration {self.iteration} (update "
                                     f"{self.num_updates}); terms: {terms}; lower the learning rates or check the "
                                     "env's rewards/observations for NaN/inf")
        self.optimizer.zero_grad(set_to_none=True)
        self.amp.backward(loss)
        if self.algorithm.on_policy:  # its loss was built in the unroll, outside DDP's forward
            allreduce_gradients(self.params, self.dist)
        self.amp.unscale(self.optimizer)
        grad_norm = self.optimizer_config.clip(self.params)
        self.amp.step(self.optimizer)
        self.algorithm.after_update()
        self.num_updates += 1
        self._last_loss = loss_info._replace(loss=loss.detach())
        self._last_grad_norm = grad_norm

    # --------------------------------------------------------------------------- summaries, eval, checkpoints ----
    def _after_iteration(self) -> None:
        it = self.iteration
        if self.summaries.is_due(it):
            self._write_summaries()
        if self.evaluator is not None and it % self.eval_interval == 0:
            self._evaluate()
        if it in self.checkpoint_iterations:
            self.save_checkpoint()
        interval = self.config.ddp_paras_check_interval
        if interval > 0 and it % interval == 0:
            check_parameters_equal(self.algorithm, self.dist)  # every rank takes part; raises on a mismatch
            self.summaries.scalar("ddp/parameters_checked", 1.0, it)
        if self.config.empty_cache and torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _elapsed_s(self) -> float:
        return self._elapsed_before + time.monotonic() - self._wall_start

    def _write_summaries(self) -> None:
        s, it = self.summaries, self.iteration
        if self._last_loss is not None:
            s.scalar("loss/total", self._last_loss.loss, it)
            s.scalars("loss", loss_terms(self._last_loss), it)
            if self._last_grad_norm is not None:
                s.scalar("loss/grad_norm", self._last_grad_norm, it)
        if len(self.stats.returns) >= min(self.config.metric_min_buffer_size, self.stats.returns.maxlen):
            s.scalar("train/episode_return", self.stats.average_return(), it)
            s.scalar("train/episode_length", self.stats.average_length(), it)
            s.scalar("train_vs_env_steps/episode_return", self.stats.average_return(), self.env_steps)
        s.scalar("train/env_steps", self.env_steps, it)
        s.scalar("train/num_episodes", self.stats.num_episodes, it)
        s.scalar("time/unroll_s", self._timing["unroll_s"], it)
        s.scalar("time/train_s", self._timing["train_s"], it)
        now = time.monotonic()
        last = getattr(self, "_last_summary", None)
        if last is not None and now > last[0]:
            s.scalar("time/env_steps_per_s", (self.env_steps - last[1]) / (now - last[0]), it)
            s.scalar("time/iterations_per_s", (it - last[2]) / (now - last[0]), it)
        self._last_summary = (now, self.env_steps, it)
        if self.config.summarize_grads_and_vars:
            for name, p in self.algorithm.named_parameters():
                s.scalar(f"vars/{name}.norm", p.detach().norm(), it)
                if p.grad is not None:
                    s.scalar(f"grads/{name}.norm", p.grad.norm(), it)
        s.scalars("schedule", scheduler_summaries(), it)
        s.scalars("amp", self.amp.summary(), it)
        if self.async_unroller is not None:
            s.scalars("async", self.policy_lag.summary(self.async_unroller.queue_length()), it)
        for group in self.optimizer.param_groups:
            s.scalar(f"optimizer/lr.{group['name']}", group["lr"], it)

    def _evaluate(self) -> None:
        start = time.monotonic()
        result = self.evaluator.evaluate(self.algorithm)
        it = self.iteration
        self.summaries.scalars("eval", dict(average_return=result.average_return,
                                            average_episode_length=result.average_length,
                                            num_episodes=result.num_episodes), it)
        self.summaries.scalar("eval_vs_env_steps/average_return", result.average_return, self.env_steps)
        record = dict(iteration=it, env_steps=self.env_steps, elapsed_s=round(self._elapsed_s(), 3),
                      eval_s=round(time.monotonic() - start, 3), average_return=result.average_return,
                      average_episode_length=result.average_length, num_episodes=result.num_episodes)
        with open(os.path.join(self.root_dir, "eval_log.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")
        logging.info("eval at iteration %d (env steps %d): return %.2f, length %.1f over %d episodes (%.1fs)",
                     it, self.env_steps, result.average_return, result.average_length, result.num_episodes,
                     time.monotonic() - start)

    def save_checkpoint(self) -> Optional[str]:
        """Write a checkpoint (rank 0 only; the ranks hold the same model). Returns its path."""
        if not self.dist.is_main:
            return None
        rng_tensors, rng_meta = capture_rng_state()
        tensors = dict(algorithm=self.algorithm.state_dict(), optimizer=self.optimizer.state_dict(), rng=rng_tensors,
                       transformers=self.transformer.state_dict(), amp=self.amp.state_dict())
        if self.save_replay_buffer and self.replay is not None:
            tensors["replay"] = self.replay.state_dict()
            if self.prioritized is not None:
                tensors["priorities"] = self.prioritized.state_dict()
        meta = dict(iteration=self.iteration, env_steps=self.env_steps, num_updates=self.num_updates,
                    unroll_credit=self._unroll_credit, seed=self.seed, elapsed_s=self._elapsed_s(),
                    num_episodes=self.stats.num_episodes, rng=rng_meta,
                    operative_config=gin.operative_config_str(), versions=dict(torch=torch.__version__))
        path = self.checkpointer.save(self.iteration, tensors, meta)
        logging.info("checkpoint written: %s", path)
        return path

    def _restore(self, ckpt: LoadedCheckpoint) -> None:
        meta = ckpt.meta
        self.algorithm.load_state_dict(ckpt.tensors["algorithm"])
        if "transformers" in ckpt.tensors:  # absent in checkpoints written before data transformers existed
            self.transformer.load_state_dict(ckpt.tensors["transformers"])
        self.optimizer.load_state_dict(ckpt.tensors["optimizer"])
        if "amp" in ckpt.tensors:
            self.amp.load_state_dict(ckpt.tensors["amp"])
        self.iteration, self.env_steps = meta["iteration"], meta["env_steps"]
        self.num_updates, self._unroll_credit = meta["num_updates"], meta["unroll_credit"]
        self._elapsed_before = meta.get("elapsed_s", 0.0)
        self.stats.num_episodes = meta.get("num_episodes", 0)
        if self.evaluator is not None:  # continue the sequence of evaluation seeds
            self.evaluator.num_evaluations = self.iteration // self.eval_interval
        if "replay" in ckpt.tensors and self.replay is not None:
            with torch.inference_mode():
                seen = self.transformer.rollout_view(update_stats=False)(self.unroller.time_step)
                alg_step = self.algorithm.rollout_step(seen)
            example = Experience.from_time_step(self.unroller.time_step, alg_step.output, alg_step.info)
            self.replay.load_state_dict(ckpt.tensors["replay"], example)
            if self.prioritized is not None:
                self.prioritized.load_state_dict(ckpt.tensors["priorities"])
            self.replay.truncate_episodes()  # the envs restart below; stored episodes end where they were cut
        # Episodes in flight are not resumable; restart the envs with seeds that depend on the iteration.
        self.unroller.reset(seed=self.rank_seed + 7919 * self.iteration)
        restore_rng_state(ckpt.tensors["rng"], meta["rng"])
        if self.dist.rank > 0:  # the checkpoint holds rank 0's RNG; other ranks continue on streams of their own
            seed_everything(self.rank_seed + 7919 * self.iteration)
        logging.info("resumed from %s: iteration %d, env steps %d", ckpt.path, self.iteration, self.env_steps)

    def _choose_seed(self) -> int:
        if self._resume_from is not None:
            return int(self._resume_from.meta["seed"])
        if self.config.random_seed is not None:
            return int(self.config.random_seed)
        seed = int.from_bytes(os.urandom(4), "little") % (2**31 - 1)
        logging.info("TrainerConfig.random_seed is None; using random seed %d", seed)
        return seed

    def _checkpoint_after_crash(self, err: BaseException) -> None:
        if self.config.num_checkpoints <= 0 or isinstance(err, NonFiniteLossError) or not self.dist.is_main:
            return  # a NaN model is not worth saving over the last good checkpoint
        try:
            if confirm_checkpoint_on_crash(self.config.confirm_checkpoint_upon_crash, sys.stdin):
                logging.error("training crashed (%s: %s); writing a checkpoint", type(err).__name__, err)
                self.save_checkpoint()
        except Exception as save_err:  # the original error matters more; report both
            logging.error("could not write a checkpoint after the crash: %s", save_err)
