"""The training loop (DESIGN.md §1, §3.11): the same calls in the same order whatever the mode.

``Trainer.run`` reads top to bottom: restore or start, warm up, then iterate until ``num_iterations`` or
``num_env_steps``; a SIGTERM/SIGINT writes a checkpoint and exits, SIGUSR2 writes one and continues, a crash writes
one (asking first only on a terminal) and re-raises, except when the crash is the disk refusing a write (a full disk,
a quota, a read-only file system): another write would fail the same way. Under torchrun rank 0 writes the
checkpoints and the other ranks wait for it in the checkpoint barrier (``alfish.learn.checkpoint_barrier``). The parts
are assembled by ``alfish.trainer.build``.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import signal
import sys
import time
from typing import Optional

import torch

from alfish.algorithms.base import Algorithm
from alfish.collect.collector import Collector
from alfish.collect.no_collector import NoCollector
from alfish.config.trainer_config import TrainerConfig
from alfish.console.hard_exit import critical_section, set_exit_note
from alfish.console.progress import Progress
from alfish.console.signals import SignalRequests, confirm_checkpoint_on_crash
from alfish.errors import NonFiniteLossError
from alfish.evaluate.evaluator import EvaluatorPart, recorded_iterations
from alfish.learn.checkpoint_barrier import wait_for_checkpoint, writing_checkpoint
from alfish.learn.distributed import DistContext, any_rank, check_parameters_equal, explain_collective_timeout, shutdown
from alfish.learn.learner import Learner
from alfish.replay.null_replay import NullReplay
from alfish.replay.replay_buffer import ReplayBuffer
from alfish.rundir.checkpoint import Checkpointer, LoadedCheckpoint
from alfish.rundir.disk import DiskWriteError, disk_error_in
from alfish.rundir.safe_paths import unsafe_path_in
from alfish.schedulers import reset_progress, scheduler_summaries, update_progress
from alfish.seeding import reseed
from alfish.trainer.callbacks import CallbackList
from alfish.trainer.counters import Counters, RunPlan
from alfish.trainer.options import RunOptions
from alfish.trainer.profiler import NullProfiler
from alfish.trainer.resume import CheckpointedParts, checkpoint_contents, restore, run_meta
from alfish.trainer.summary import (
    NullSummaries,
    Summaries,
    Throughput,
    action_distributions,
    episode_scalars,
    parameter_histograms,
    parameter_norms,
)
from alfish.trainer.training import TrainingStep
from alfish.transforms.base import DataTransformer


@dataclasses.dataclass
class Trainer:
    """Runs one experiment from its parts; holds them and nothing else (``build_trainer`` makes them)."""

    config: TrainerConfig
    options: RunOptions
    dist: DistContext
    plan: RunPlan
    counters: Counters
    collector: Collector  # the training envs
    replay: ReplayBuffer | NullReplay  # NullReplay when training on-policy
    learner: Learner  # loss -> parameter update
    training: TrainingStep  # what one iteration does with the three above
    algorithm: Algorithm
    transformer: DataTransformer
    evaluator: EvaluatorPart  # sync or async (build_evaluator chooses); NullEvaluator where none evaluates
    summaries: Summaries | NullSummaries
    checkpointer: Checkpointer
    seed: int
    rank_seed: int
    resume_from: Optional[LoadedCheckpoint] = None
    throughput: Throughput = dataclasses.field(default_factory=Throughput)
    profiler: NullProfiler = dataclasses.field(default_factory=NullProfiler)  # TrainerConfig.profiling
    callbacks: CallbackList = dataclasses.field(default_factory=CallbackList)  # stop_value, best checkpoint, ...
    checkpointed_iteration: Optional[int] = None  # the iteration of the last checkpoint this run wrote
    started: bool = False  # the parts were restored and acting began: a crash from now on is worth a checkpoint
    resumed: bool = False  # restored from a checkpoint of this root_dir (callbacks read it in before_run)

    def run(self) -> int:
        """Train to the end (or until a stop signal); returns the process exit code."""
        counters = self.counters
        progress: Optional[Progress] = None
        with SignalRequests(self.options.stop_grace_s) as signals:
            try:
                self._restore_or_start()
                if signals.stop_requested and self.dist.world_size == 1:
                    # during the restore (e.g. a long action-log replay): nothing new to save (ranks of a DDP job
                    # agree on stopping at an iteration's end instead)
                    logging.warning("stopped by signal %s before the first iteration; no checkpoint written (the "
                                    "previous one, if any, is where a rerun resumes)", signals.stop_signal)
                    return signals.exit_code()
                progress = Progress(self.plan.expected_iterations, counters.iteration,
                                    self.options.progress_log_interval_s if self.dist.is_main else math.inf,
                                    offline=isinstance(self.collector, NoCollector))
                self._warm_up()
                while not self.plan.finished(counters):
                    self._update_schedules()
                    steps_per_env = counters.steps_this_iteration(self.config.unroll_length)
                    counters.env_steps += round(self.training.run(steps_per_env) * self.plan.total_envs)
                    counters.iteration += 1
                    self.collector.publish_parameters(counters.iteration, self.plan.progress(counters))
                    self._after_iteration()
                    progress.update(counters.iteration, counters.env_steps, self.collector.stats.average_return(),
                                    self.learner.num_updates, self._last_loss)
                    exit_code, finish_now = self._act_on_requests(signals)
                    if exit_code is not None:
                        return exit_code
                    if finish_now:  # a callback's decision (stop_value): end as a run that reached its end
                        break
                self._finish()
                self.callbacks.after_run(self)
            except (KeyboardInterrupt, Exception) as err:
                # a collective that timed out on this rank names the rank that hung (while the group is still up)
                explained = explain_collective_timeout(err, self.dist)
                self._checkpoint_after_crash(err)
                if explained is not err:
                    raise explained from err
                raise
            finally:
                if progress is not None:
                    progress.close()
                self.close()
        logging.info("training finished: %d iterations, %d env steps", counters.iteration, counters.env_steps)
        return 0

    def _last_loss(self) -> Optional[float]:
        """The last update's loss (one host read), for the progress line of an offline run; None before any."""
        last = self.learner.last_loss
        return None if last is None else float(last.loss)

    # ------------------------------------------------------------------------------------------ start and end ----
    def _restore_or_start(self) -> None:
        """Restore every part from the resume point (if any), then start acting: the envs restart with seeds that
        depend on the iteration (episodes in flight are not resumable)."""
        collector_state, pending_evaluations = None, []
        if self.resume_from is not None:
            # an evaluation pending when the checkpoint was written, and recorded after it, is not re-run
            recorded = recorded_iterations(self.config.root_dir)
            pending_evaluations = [p for p in self.resume_from.tensors.get("pending_evaluations") or []
                                   if int(p["iteration"]) not in recorded]
            collector_state = restore(self.resume_from, self.checkpointed_parts(), rank=self.dist.rank,
                                      rank_seed=self.rank_seed)
            set_exit_note(f"the checkpoint resumed from, {self.resume_from.path}, is intact")
            self.resume_from = None
            self.resumed = True
        # continue the sequence of evaluation seeds
        self.evaluator.num_evaluations = self.counters.iteration // self.plan.eval_interval
        self.evaluator.keep_snapshots = self.callbacks.needs_snapshots
        self.evaluator.resubmit(pending_evaluations, self.summaries, self.config.root_dir)
        reset_progress()
        self._update_schedules()
        self.callbacks.before_run(self)  # (a warm start loads its weights here: before the first action)
        self.collector.start(self.algorithm, self.transformer, self.replay,
                             reseed(self.rank_seed, self.counters.iteration), self.plan.progress(self.counters),
                             before_publish=self.learner.check_finite, resume=collector_state)
        if self.resumed and not self.collector.resumed_exactly:
            self.replay.truncate_episodes()  # the envs restarted: the stored episodes end where they were cut
        self.started = True

    def _warm_up(self) -> None:
        """Collect what the training step needs before its first update (``initial_collect_steps``)."""
        steps = self.training.steps_before_training(self.counters)
        if steps > 0:
            start = time.monotonic()
            self.counters.env_steps += round(self.collector.warm_up(steps) * self.plan.total_envs)
            logging.info("collected %d initial env steps in %.1fs", steps * self.plan.total_envs,
                         time.monotonic() - start)

    def _finish(self) -> None:
        """Always end with an evaluation of the final policy and a checkpoint; then leave the process group together."""
        it = self.counters.iteration
        if self.plan.final_evaluation_due(it):
            self._evaluate()
        # (timed checkpoints alone also end with one: the run's last interval of work is not lost)
        checkpointing = self.config.num_checkpoints > 0 or self.options.checkpoint_interval_s is not None
        if checkpointing and self.checkpointed_iteration != it:
            self.save_checkpoint()
        self.evaluator.wait()  # an asynchronous evaluation still running (the final one) is recorded before exit
        self._deliver_evaluations()
        self.summaries.flush()  # a failed event write surfaces here, not lost in the writer's thread
        shutdown(self.dist, synchronize=True)  # every rank is done: no collective is left in flight

    def close(self) -> None:
        """Stop the collector (and its child), close the envs and the summary writer; leave the process group."""
        self.profiler.close()  # (a run that ends inside the profiling window writes what it recorded)
        self.collector.close()
        self.evaluator.close()  # (before the summaries: an async evaluator records results from its thread)
        self.callbacks.close()
        self.summaries.close()
        shutdown(self.dist)

    # ------------------------------------------------------------------------------------------ every iteration ----
    def _update_schedules(self) -> None:
        """Advance the progress that schedules read, and set the optimizer's scheduled learning rates."""
        point = self.plan.progress(self.counters)
        update_progress(iterations=point.iterations, env_steps=point.env_steps, fraction=point.fraction)
        self.learner.update_learning_rates()

    def _after_iteration(self) -> None:
        it = self.counters.iteration
        if self.summaries.is_due(it):
            self._write_summaries()
        self.evaluator.check()  # an asynchronous evaluator's failure stops the run now, not at the next evaluation
        if self.plan.evaluation_due(it):
            self._evaluate()
        self._deliver_evaluations()
        if self.plan.checkpoint_due(it):
            self.save_checkpoint()
        self.profiler.step(it)
        interval = self.config.ddp_paras_check_interval
        if interval > 0 and it % interval == 0:
            check_parameters_equal(self.algorithm, self.dist)  # every rank takes part; raises on a mismatch
            self.summaries.scalar("ddp/parameters_checked", 1.0, it)
        if self.config.empty_cache and torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.callbacks.after_iteration(self)

    def _act_on_requests(self, signals: SignalRequests) -> tuple[Optional[int], bool]:
        """Checkpoint and/or stop as signalled or as a callback asks; ranks act together (a signal reaches them at
        slightly different iterations; a callback decides on rank 0). Returns ``(exit code, finish now)``: the exit
        code when a signal stops the run; ``finish now`` when a callback ends it (the run then ends as finished)."""
        checkpoint_now, stop_now, finish_now = any_rank(
            [signals.checkpoint_requested or self.callbacks.wants_checkpoint(), signals.stop_requested,
             self.callbacks.wants_stop()], self.dist, iteration=self.counters.iteration)
        if checkpoint_now:
            signals.clear_checkpoint_request()  # before saving: a SIGUSR2 during the save is kept
            self.save_checkpoint()
        if not stop_now:
            if finish_now:
                logging.info("stopping at iteration %d: a callback asked to (e.g. Trainer.stop_value reached)",
                             self.counters.iteration)
            return None, finish_now
        signals.extend_grace("writing the stop's checkpoint and closing")
        self.evaluator.stop_recording()  # what is still being evaluated goes into the checkpoint, re-run on resume
        self.save_checkpoint()
        logging.warning("stopped by signal %s at iteration %d; checkpoint written, rerun the same command to resume",
                        signals.stop_signal, self.counters.iteration)
        shutdown(self.dist, synchronize=True)  # all ranks agreed to stop at this iteration
        # a rank stopped because another one was signalled exits as if it had been sent SIGTERM
        return signals.exit_code() or 128 + int(signal.SIGTERM), False

    # --------------------------------------------------------------------------- summaries, eval, checkpoints ----
    def _write_summaries(self) -> None:
        self.learner.check_finite()  # reads the device flags: no NaN loss is ever summarized as a number
        c, it = self.counters, self.counters.iteration
        stats = self.collector.stats
        scalars = {**self.learner.summary(), **self.training.summary(), **self.collector.summary(),
                   **episode_scalars(stats, self.config.metric_min_buffer_size),
                   **self.throughput.rates(c.env_steps, it),
                   **{f"schedule/{name}": value for name, value in scheduler_summaries().items()},
                   "train/env_steps": c.env_steps, "train/num_episodes": stats.num_episodes}
        step = self.summaries.step(it)  # the iteration, or the update count (update_counter_every_mini_batch)
        if self.config.summarize_grads_and_vars:
            scalars.update(parameter_norms(self.algorithm))
            self.summaries.histograms(parameter_histograms(self.algorithm), step)
        if self.config.summarize_action_distributions:
            action_scalars, action_histograms = action_distributions(self.training.taken_actions(), self.algorithm)
            scalars.update(action_scalars)
            self.summaries.histograms(action_histograms, step)
        self.summaries.write(scalars, step)
        if "train/episode_return" in scalars:
            self.summaries.scalar("train_vs_env_steps/episode_return", scalars["train/episode_return"], c.env_steps)

    def _evaluate(self) -> None:
        self.learner.check_finite()  # a policy with a non-finite update behind it is not worth scoring
        self.evaluator.record(self.algorithm, self.summaries, self.config.root_dir, self.counters)

    def evaluate_now(self) -> None:
        """Evaluate the current parameters now (e.g. at iteration 0, ``Trainer.evaluate_at_start``); records nothing
        without an evaluator (``evaluate=False``, or a rank other than 0: the ``NullEvaluator``)."""
        self._evaluate()
        self._deliver_evaluations()

    def _deliver_evaluations(self) -> None:
        for evaluation in self.evaluator.completed():
            self.callbacks.after_evaluation(self, evaluation)

    def save_checkpoint(self) -> Optional[str]:
        """Write a checkpoint. Every rank calls it at the same point (the ranks agree on when): rank 0 writes it (the
        ranks hold the same model), and the others wait for it in the checkpoint barrier, which allows for a long
        write, rather than in the next collective, which would take it for a hung rank
        (``alfish.learn.checkpoint_barrier``). Returns its path on rank 0, None on the others."""
        path = self._write_checkpoint() if self.dist.is_main else None
        wait_for_checkpoint(self.dist, self.counters.iteration)
        self.checkpointed_iteration = self.counters.iteration
        return path

    def _write_checkpoint(self) -> str:
        """Rank 0's write of a checkpoint (the job's store says it is writing meanwhile); returns its path."""
        self.learner.check_finite()  # never save a model a non-finite update may have touched
        with writing_checkpoint(self.dist, self.counters.iteration):
            tensors, meta = checkpoint_contents(
                self.checkpointed_parts(with_replay=self.options.save_replay_buffer), self.seed,
                world_size=self.dist.world_size,
                collector_state=self.collector.state_dict() if self.dist.world_size == 1 else None,
                pending_evaluations=self.evaluator.pending())
            with critical_section():  # a hard exit (watchdog, second signal) waits for the rename into place
                path = self.checkpointer.save(self.counters.iteration, tensors, meta)
        set_exit_note(f"the last checkpoint, {path}, is intact")
        logging.info("checkpoint written: %s", path)
        self.callbacks.after_checkpoint(self, path)
        return path

    def checkpointed_parts(self, with_replay: bool = True) -> CheckpointedParts:
        """The parts a checkpoint holds; ``with_replay=False`` leaves the buffer out (``Trainer.save_replay_buffer``
        off)."""
        return CheckpointedParts(algorithm=self.algorithm, transformer=self.transformer, learner=self.learner,
                                 counters=self.counters, stats=self.collector.stats,
                                 replay=self.replay if with_replay else None, spec=self.collector.spec)

    def checkpoint_meta(self) -> dict:
        """The meta a checkpoint of this run holds now, without the RNG states (e.g. for the best policy's)."""
        return run_meta(self.counters, self.seed, self.dist.world_size)

    def _checkpoint_after_crash(self, err: BaseException) -> None:
        """Write a checkpoint after a crash, unless the model is broken (a NaN loss), checkpoints are off, or the
        crash is the disk refusing a write (a failed checkpoint or event write, a full disk): saving would only add
        a second failure of the same kind to the first."""
        if (self.config.num_checkpoints <= 0 or isinstance(err, NonFiniteLossError) or not self.dist.is_main
                or not self.started):
            return  # a NaN model, or one never restored, is not worth saving over the last good checkpoint
        if isinstance(err, DiskWriteError) or disk_error_in(err) is not None or unsafe_path_in(err) is not None:
            return  # (a path refused inside the root_dir, e.g. a symlinked checkpoints/: not written through either)
        try:
            if confirm_checkpoint_on_crash(self.config.confirm_checkpoint_upon_crash, sys.stdin):
                logging.error("training crashed (%s: %s); writing a checkpoint", type(err).__name__, err)
                self._write_checkpoint()  # (no checkpoint barrier: the other ranks may be anywhere after a failure)
        except Exception as save_err:  # noqa: BLE001  (the original error matters more; report both)
            logging.error("could not write a checkpoint after the crash: %s", save_err)
