"""Assembly: a ``TrainerConfig`` becomes the parts of a run (DESIGN.md §3.11). Every feature combination is checked
here, before any env or process starts where the config alone decides it; the modes are chosen here, once, so the
training loop has no branch on them.

    config ──► checks ──► seed, DDP context, resume point
           ──► Collector (sync | async child)  ──► EnvSpec ──► data transformers + algorithm
           ──► Learner, ReplayBuffer (uniform | prioritized sampler), training step (on-policy | sampled | whole buffer)
    offline data (TrainerConfig.offline_buffer_dir; offline_parts.py): loaded first; pure offline training gets a
           NoCollector over the data's spaces instead of envs; the offline buffer joins the online one (a
           MixedReplayBuffer) and the training step is ALF's HybridTraining or sampling from the mixture (RLPD)
           ──► summaries, evaluator, checkpointer ──► Trainer
"""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
from typing import Any, Optional

import gin
import torch

from alfish.algorithms.base import Algorithm
from alfish.algorithms.build import build_policy
from alfish.collect.async_collector import AsyncCollector, CollectionSettings, UnrollSpec
from alfish.collect.collector import Collector, SyncCollector, check_random_actions_storable
from alfish.collect.no_collector import NoCollector
from alfish.collect.restarts import RestartBudget
from alfish.config.trainer_config import TrainerConfig
from alfish.envs.batched_env import create_environment, environment_settings
from alfish.envs.spec import EnvSpec
from alfish.evaluate.async_evaluator import AsyncEvaluator, EvalSpec, gin_constants
from alfish.evaluate.eval_video import EvalVideo, check_video_support
from alfish.evaluate.evaluator import Evaluator, EvaluatorPart
from alfish.evaluate.null_evaluator import NullEvaluator
from alfish.learn.amp import AmpPolicy
from alfish.learn.device import CPU, DevicePolicy
from alfish.learn.diagnostics import Diagnostics
from alfish.learn.distributed import DistContext, broadcast_object, init_distributed, log_job_totals
from alfish.learn.host_memory import keep_freed_host_memory
from alfish.learn.learner import Learner
from alfish.learn.optim import OptimizerConfig
from alfish.learn.threads import AUTO, set_threads
from alfish.replay.null_replay import NullReplay
from alfish.replay.offline.options import OfflineOptions
from alfish.replay.offline.steps import Steps
from alfish.replay.prioritized import make_prioritized_sampler
from alfish.replay.replay_buffer import ReplayBuffer
from alfish.replay.retirement import RetiringSampler
from alfish.replay.samplers import UniformSampler
from alfish.replay.storage import make_storage
from alfish.replay.supervised_data import SupervisedData
from alfish.rundir.checkpoint import Checkpointer, LoadedCheckpoint
from alfish.rundir.disk import DiskWriteError, write_failure
from alfish.rundir.run_record import resolve_snapshots, snapshot_texts, write_run_record
from alfish.rundir.trackers import Trackers, build_trackers, check_tracker_packages
from alfish.seeding import EVAL_SEED_OFFSET, RANK_SEED_OFFSET, seed_everything
from alfish.trainer.callbacks import CallbackList, TrainerCallback
from alfish.trainer.collection_checks import check_collection
from alfish.trainer.counters import Counters, RunPlan
from alfish.trainer.lifecycle import BestCheckpoint, EvaluateAtStart, EvalVideoCallback, StopAtValue, TimedCheckpoints
from alfish.trainer.offline_parts import (
    build_offline_collector,
    build_offline_replay,
    build_offline_training_step,
    check_offline_combinations,
    combine_replay,
    is_pure_offline,
    load_sources,
    offline_spec,
)
from alfish.trainer.options import RunOptions
from alfish.trainer.profiler import IterationProfiler, NullProfiler
from alfish.trainer.resume import choose_resume_point
from alfish.trainer.summary import GlobalStep, NullSummaries, Summaries
from alfish.trainer.supervised_training import SupervisedTraining
from alfish.trainer.tracker_videos import TrackedEvalVideos
from alfish.trainer.trainer import Trainer
from alfish.trainer.training import (
    OnPolicyTraining,
    ReplaySettings,
    SampledReplayTraining,
    StepParts,
    TrainingStep,
    WholeBufferTraining,
)
from alfish.trainer.warm_start import WarmStart
from alfish.transforms.base import STAGE_READS_BUFFER, DataTransformer


@dataclasses.dataclass(frozen=True)
class RunSetup:
    """What ``build_trainer`` settles before the parts are built: the config and options, where the job runs, its
    checkpoints and resume point, its seeds (``rank_seed``: this rank's), and the data it trains on instead of or
    besides envs (offline data, supervised data; ``None``: none)."""

    config: TrainerConfig
    options: RunOptions
    dist: DistContext
    devices: DevicePolicy
    device: torch.device
    checkpointer: Checkpointer
    resume_from: Optional[LoadedCheckpoint]
    seed: int
    rank_seed: int
    offline_options: Optional[OfflineOptions] = None
    offline_steps: Optional[Steps] = None
    supervised_data: Optional[SupervisedData] = None


def build_trainer(config: TrainerConfig, options: Optional[RunOptions] = None, fresh: bool = False) -> Trainer:
    """The parts of the run ``config`` describes, assembled; ``options`` default to the gin-bound ``Trainer.*``.
    ``fresh``: start over, moving the root_dir's previous checkpoints aside (``train --fresh``)."""
    options = options or RunOptions()
    check_combinations(config, options, _declared_on_policy(config))
    ctor = config.algorithm_ctor
    declared = ctor if isinstance(ctor, type) and issubclass(ctor, Algorithm) else None
    check_collection(config, options, declared)
    if declared is not None:  # before the async child starts, from the class
        check_lag_correction(config, ctor, _bound(f"{ctor.__name__}.off_policy_correction"))
    resolve_snapshots(config.code_snapshots)  # a missing file fails before anything starts
    OptimizerConfig()  # (built again for the Learner) an optimizer setting that does not apply fails here too
    keep_freed_host_memory(options.host_memory_cache_mb)
    if options.num_threads != AUTO:  # ('auto' needs the networks: set once they are built)
        set_threads(options.num_threads, torch.nn.Module(), 0)
    devices = DevicePolicy()
    device = devices.training_device()
    dist = init_distributed(device)
    os.makedirs(config.root_dir, exist_ok=True)
    checkpointer = Checkpointer(os.path.join(config.root_dir, "checkpoints"), options.max_checkpoints_to_keep,
                                root_dir=config.root_dir)
    resume_from = choose_resume_point(config.root_dir, checkpointer, dist, fresh)  # rank 0 chooses for all
    seed = int(broadcast_object(_choose_seed(config, resume_from), dist))
    rank_seed = seed + RANK_SEED_OFFSET * dist.rank
    seed_everything(rank_seed)
    offline_options = OfflineOptions() if config.offline_buffer_dir is not None else None
    if offline_options is not None:  # (before loading: the config alone decides these)
        check_offline_combinations(config, offline_options, _declared_on_policy(config), "")
    setup = RunSetup(config=config, options=options, dist=dist, devices=devices, device=device,
                     checkpointer=checkpointer, resume_from=resume_from, seed=seed, rank_seed=rank_seed,
                     offline_options=offline_options,
                     offline_steps=load_sources(config, offline_options) if offline_options is not None else None,
                     supervised_data=SupervisedData() if config.ml_type == "sl" else None)
    if setup.supervised_data is not None:  # no env: the data's spaces stand for the env's
        data = setup.supervised_data
        collector = NoCollector(EnvSpec(data.input_space, data.target_space, 1))
    elif setup.offline_steps is not None and is_pure_offline(config):
        collector = build_offline_collector(offline_spec(setup.offline_steps))  # no training env at all
    else:
        collector = build_collector(config, options, rank_seed, device)
    try:
        return _assemble(setup, collector)
    except BaseException:
        collector.close()  # the async child, the envs
        raise


def _assemble(setup: RunSetup, collector: Collector) -> Trainer:
    config, options, dist = setup.config, setup.options, setup.dist
    spec = collector.spec
    transformer, algorithm = build_policy(config, spec)
    algorithm.debug_summaries = config.debug_summaries  # its calc_loss adds debug/... terms (summaries only)
    check_combinations(config, options, algorithm.on_policy, type(algorithm).__name__)
    check_lag_correction(config, algorithm, algorithm.off_policy_correction)
    check_collection(config, options, algorithm)
    refusal = algorithm.replay_refusal(config.priority_replay, config.offline_buffer_dir is not None)
    if refusal is not None:
        raise ValueError(refusal)
    if setup.offline_options is not None:
        check_offline_combinations(config, setup.offline_options, algorithm.on_policy, type(algorithm).__name__)
    if options.num_threads == AUTO:
        children = (options.num_unroll_processes if config.async_unroll else 0) + int(
            config.evaluate and config.async_eval and dist.is_main)
        set_threads(AUTO, algorithm, training_batch_rows(config, spec.num_envs, algorithm.on_policy), children)
    if options.random_warm_up_actions:
        check_random_actions_storable(algorithm, transformer, spec)
    total_envs = spec.num_envs * dist.world_size  # num_parallel_environments and mini_batch_size are per rank
    log_job_totals(dist, spec.num_envs, config.mini_batch_size)
    learner = Learner(algorithm, OptimizerConfig(), AmpPolicy(config.enable_amp, setup.device.type), dist,
                      setup.device)
    if learner.scan_updates and not setup.options.presample_mini_batches:
        raise ValueError("Learner.scan_updates=True runs an iteration's presampled mini-batches as one compiled call: "
                         "set Trainer.presample_mini_batches=True too")
    transformer.to(setup.device)  # normalizer statistics are used in training, on the device
    counters = Counters()
    replay, training = build_replay_and_training(setup, StepParts(collector, learner, algorithm, transformer),
                                                 counters, total_envs)
    plan = RunPlan(config, total_envs, evaluates=config.evaluate and dist.is_main)
    summaries = build_summaries(config, options, dist, plan, learner, resume=setup.resume_from is not None)
    if config.summarize_gradient_noise_scale or config.summarize_output:  # measured inside the summarized updates
        learner.diagnostics = Diagnostics(algorithm, config.summarize_gradient_noise_scale, config.summarize_output,
                                          lambda update: summaries.due_for_update(counters.iteration + 1, update))
    evaluator = build_evaluator(config, setup.seed, transformer, spec) if plan.evaluates else NullEvaluator()
    callbacks = build_callbacks(config, options, dist, setup.seed, summaries.trackers)
    profiler = NullProfiler()
    if dist.is_main:  # (last: the trackers' runs start here, once nothing can fail the build any more)
        profiler = record_code(config, options, summaries)
    return Trainer(config=config, options=options, dist=dist, plan=plan, counters=counters, collector=collector,
                   replay=replay, learner=learner, training=training, algorithm=algorithm, transformer=transformer,
                   evaluator=evaluator, summaries=summaries, checkpointer=setup.checkpointer, seed=setup.seed,
                   rank_seed=setup.rank_seed, resume_from=setup.resume_from, profiler=profiler, callbacks=callbacks)


def build_replay_and_training(setup: RunSetup, parts: StepParts, counters: Counters,
                              total_envs: int) -> tuple[ReplayBuffer | NullReplay, TrainingStep]:
    """The replay part the trainer holds (fills, checkpoints) and the training step that trains from it: the online
    buffer of an off-policy algorithm that has envs, joined by the offline data when there is some; a ``NullReplay``
    when nothing is stored (on-policy, supervised)."""
    config = setup.config
    if setup.supervised_data is not None:
        return NullReplay(), SupervisedTraining(parts, setup.supervised_data, config.num_updates_per_train_iter,
                                                config.mini_batch_size, setup.rank_seed)
    online = None
    if not parts.algorithm.on_policy and not isinstance(parts.collector, NoCollector):
        online = build_replay_buffer(config, parts.collector.spec, parts.transformer, setup.devices, setup.device,
                                     (setup.options.replay_max_use, setup.options.replay_max_staleness))
    if setup.offline_steps is None:
        training = build_training_step(config, parts, online, total_envs, setup.options.presample_mini_batches)
        return (online if online is not None else NullReplay()), training
    offline = build_offline_replay(config, setup.offline_options, setup.offline_steps, parts.algorithm,
                                   parts.transformer, parts.collector.spec, setup.device)
    replay = combine_replay(online, offline, setup.offline_options)
    return replay, build_offline_training_step(config, setup.offline_options, parts, replay, counters, total_envs)


def build_summaries(config: TrainerConfig, options: RunOptions, dist: DistContext, plan: RunPlan,
                    learner: Learner, resume: bool = False) -> Summaries | NullSummaries:
    """TensorBoard (and with ``Trainer.scalars_csv`` CSV, with ``Trainer.trackers`` the experiment trackers: they
    continue their runs when the run ``resume``s from a checkpoint) summaries, written by rank 0 alone."""
    if not dist.is_main:
        return NullSummaries()
    global_step = None
    if config.update_counter_every_mini_batch:  # ALF's global counter: the update count
        global_step = GlobalStep(lambda: learner.num_updates,
                                 interval_counts_global_step=config.num_summaries is None)
    summaries = Summaries(config.root_dir, plan.summary_interval, config.summarize_first_interval,
                          config.summaries_flush_secs, config.summary_max_queue, global_step=global_step,
                          csv_path=os.path.join(config.root_dir, "scalars.csv") if options.scalars_csv else None)
    if options.trackers:
        summaries.trackers = build_trackers(options.trackers, config.root_dir, resume)
    return summaries


def build_callbacks(config: TrainerConfig, options: RunOptions, dist: DistContext, seed: int,
                    trackers: Optional[Trackers] = None) -> CallbackList:
    """The lifecycle callbacks the ``Trainer.*`` options ask for, then the user's ``Trainer.callbacks``, in the
    order they run: a warm start loads weights before the evaluation at iteration 0 scores them. The callbacks that
    react to evaluations or write files exist on rank 0 only (it alone evaluates and writes); their decisions reach
    the other ranks through the per-iteration agreement."""
    callbacks: list[TrainerCallback] = []
    if options.warm_start_from is not None:
        callbacks.append(WarmStart(options.warm_start_from, options.warm_start))  # every rank loads the same weights
    if dist.is_main:
        if options.checkpoint_interval_s is not None:
            callbacks.append(TimedCheckpoints(options.checkpoint_interval_s))
        if config.evaluate:
            if options.evaluate_at_start:
                callbacks.append(EvaluateAtStart())
            if options.keep_best_checkpoint:
                callbacks.append(BestCheckpoint(config.root_dir))
            if options.stop_value is not None:
                callbacks.append(StopAtValue(options.stop_value))
            if options.eval_video_interval:
                video = EvalVideo(config.root_dir, options.eval_video_interval, options.eval_video_format,
                                  seed + EVAL_SEED_OFFSET)
                callbacks.append(EvalVideoCallback(video))
                if trackers is not None:  # (after the video is written)
                    callbacks.append(TrackedEvalVideos(video, trackers))
    return CallbackList(callbacks + list(options.callbacks))


def record_code(config: TrainerConfig, options: RunOptions, summaries: Summaries) -> NullProfiler:
    """Rank 0 at start: the code snapshots (TensorBoard text), the run record, the trackers' runs (given the config
    and the run record), and the profiler of the run."""
    for tag, text in snapshot_texts(resolve_snapshots(config.code_snapshots)).items():
        summaries.writer.add_text(tag, text, 0)
    record = None
    if options.run_record:
        try:
            record = write_run_record(config.root_dir, config.conf_file, sys.argv)
        except OSError as err:  # a full disk or a read-only root_dir: one line, as every other write
            raise DiskWriteError(write_failure("the run record in", config.root_dir, err)) from err
    if summaries.trackers is not None:
        summaries.trackers.start(gin.operative_config_str(), record)
    return IterationProfiler(config.root_dir) if config.profiling else NullProfiler()


def check_combinations(config: TrainerConfig, options: RunOptions, on_policy: Optional[bool],
                       algorithm_name: str = "") -> None:
    """Feature combinations the parts cannot serve, each a one-line ValueError naming the parameters. ``on_policy``
    ``None``: not known yet (the algorithm constructor is not a class); checked again once it is built."""
    name = algorithm_name or getattr(config.algorithm_ctor, "__name__", "the algorithm")
    check_tracker_packages(options.trackers)  # (a missing wandb / mlflow: one line naming the extra)
    if on_policy and config.priority_replay:
        raise ValueError(f"TrainerConfig.priority_replay=True needs an off-policy algorithm; {name} trains on-policy "
                         "without replay")
    if options.presample_mini_batches and (config.whole_replay_buffer_training or config.offline_buffer_dir is not None
                                           or on_policy):
        raise ValueError("Trainer.presample_mini_batches=True draws the mini-batches of sampled online training: it "
                         "needs an off-policy algorithm, TrainerConfig.whole_replay_buffer_training=False and no "
                         "offline_buffer_dir")
    if options.random_warm_up_actions and (on_policy or config.async_unroll):
        raise ValueError("Trainer.random_warm_up_actions=True needs an off-policy algorithm and a synchronous unroll "
                         "(TrainerConfig.async_unroll=False): the warm-up runs in this process")
    needs_evaluation = [name for name, value in (("stop_value", options.stop_value is not None),
                                                 ("evaluate_at_start", options.evaluate_at_start),
                                                 ("eval_video_interval", options.eval_video_interval > 0)) if value]
    if needs_evaluation and not config.evaluate:
        raise ValueError(f"Trainer.{needs_evaluation[0]} acts on evaluations, and TrainerConfig.evaluate=False: set "
                         "TrainerConfig.evaluate=True or remove the binding")
    if options.eval_video_interval:
        check_video_support(options.eval_video_format)
    rollout_device = DevicePolicy().rollout_device
    evaluates_in_a_child = config.evaluate and config.async_eval
    if not config.async_unroll and not evaluates_in_a_child and rollout_device != "cpu":
        raise ValueError(f"DevicePolicy.rollout_device='{rollout_device}' applies to the async unroll and async eval "
                         "children, but this run has neither (TrainerConfig.async_unroll=False and no asynchronous "
                         "evaluation): the synchronous unroll acts on DevicePolicy.device; remove the binding or set "
                         "async_unroll=True")
    if on_policy is False and config.unroll_with_grad:
        raise ValueError(f"TrainerConfig.unroll_with_grad=True: {name} is off-policy and stores its steps in the "
                         "replay buffer, where autograd graphs must not be kept; set it to False (on-policy "
                         "algorithms always unroll with gradients)")


def check_lag_correction(config: TrainerConfig, algorithm: Algorithm | type[Algorithm],
                         correction: Optional[str]) -> None:
    """An algorithm whose loss takes the stored data as its own (``Algorithm.assumes_own_data``: PPO, A2C) trains
    from an asynchronous unroll, where older parameters act (the policy lag), only with its off-policy correction
    (``correction``, its ``off_policy_correction``); an on-policy one also recomputes its rollout infos (the
    child's carry no gradients) from whole unrolls. ``algorithm``: built, or its class (checked before building)."""
    if not config.async_unroll or not algorithm.assumes_own_data:
        return
    name = algorithm.__name__ if isinstance(algorithm, type) else type(algorithm).__name__
    if correction is None:
        raise ValueError(f"TrainerConfig.async_unroll=True: {name} would train on steps acted by older parameters as "
                         f"if its own had acted them; set {name}.off_policy_correction='vtrace', or "
                         "async_unroll=False")
    if algorithm.on_policy and not getattr(algorithm, "recomputes_rollout_info", False):
        raise ValueError(f"TrainerConfig.async_unroll=True: {name} trains on the gradients of its own unroll, which "
                         "another process cannot provide; use async_unroll=False")
    if algorithm.on_policy and not config.unroll_length >= 1:
        raise ValueError(f"TrainerConfig.unroll_length={config.unroll_length}: {name} trains on whole unrolls of a "
                         "fixed length from the asynchronous unroll; set it to 1 or more")
    if config.unroll_parameter_update_period > 1 and not isinstance(algorithm, type):
        logging.warning("TrainerConfig.unroll_parameter_update_period=%d: %s's data will be acted by parameters up to "
                        "%d iterations old; V-trace corrects a small lag, and PPO learned alfish/Chain-v0 with a "
                        "period of 1 but not with 10 (README, Asynchronous unroll): consider 1",
                        config.unroll_parameter_update_period, name, config.unroll_parameter_update_period)


def _bound(parameter: str) -> Any:
    """The value gin binds to ``parameter`` (``'Class.name'``), or None when it binds none."""
    try:
        return gin.query_parameter(parameter)
    except ValueError:
        return None


def _declared_on_policy(config: TrainerConfig) -> Optional[bool]:
    """The algorithm class's ``on_policy`` flag, without building it (None for a constructor function)."""
    ctor = config.algorithm_ctor
    if isinstance(ctor, type) and issubclass(ctor, Algorithm):
        return bool(ctor.on_policy)
    return None


def build_collector(config: TrainerConfig, options: RunOptions, rank_seed: int,
                    device: torch.device = CPU) -> Collector:
    """The owner of the training envs: in a child process with ``async_unroll`` (acting on
    ``DevicePolicy.rollout_device``), else here (acting on the training ``device``)."""
    if config.async_unroll:
        # The settings are read here (so the operative config records them); the child builds the envs from them.
        spec = UnrollSpec(env_settings=environment_settings(seed=rank_seed), config_text=gin.config_str(),
                          root_dir=config.root_dir, step_interval_s=config.unroll_step_interval,
                          parent_pid=os.getpid())
        collection = CollectionSettings(options.num_unroll_processes, options.unroll_min_fraction,
                                        options.max_policy_lag, options.restart_crashed_envs,
                                        options.max_env_restarts_per_hour)
        return AsyncCollector(spec, config.unroll_queue_size, config.max_unroll_length,
                              config.unroll_parameter_update_period,
                              stall_timeout_s=spec.env_settings.step_timeout_s, device=device, collection=collection)
    settings = environment_settings(seed=rank_seed)
    restarts = None
    if options.restart_crashed_envs:
        if settings.vectorization != "async":
            raise ValueError("Trainer.restart_crashed_envs=True replaces failed env worker processes "
                             "(create_environment.vectorization='async') or async unroll children; these envs run in "
                             f"the trainer (vectorization='{settings.vectorization}'), where a failure cannot be "
                             "contained: set one of the two, or remove it")
        restarts = RestartBudget(options.max_env_restarts_per_hour)
    return SyncCollector(settings.create(), options.random_warm_up_actions, device, restarts)


def build_replay_buffer(config: TrainerConfig, spec: EnvSpec, transformer: DataTransformer,
                        devices: DevicePolicy, device: torch.device,
                        retire: tuple[Optional[int], Optional[int]] = (None, None)) -> ReplayBuffer:
    """Per-env rings of ``replay_buffer_length`` steps (in the memory ``DevicePolicy.replay_storage`` names),
    sampled uniformly or by priority, handing batches (and their infos) to the training ``device``.

    The priority trees live with the storage (on the device with ``'device'`` storage: the whole sample/update path
    stays there), except when a transformer reads neighbouring stored steps at sample time (frame stacking,
    hindsight). Those index the ring's bookkeeping, which stays on the host (oldest indices, episode ends: updated
    by every add, read without a sync), with the sampler's indices, and hindsight decides on the host whether any row
    is relabelled; device indices would cost a read back per sample. With host indices the only transfers are
    non-blocking copies to the device (the gather's index, hindsight's mask: ``ReplayBuffer.to_storage``), and the
    device priorities reach the host trees one update late without a wait (``DeferredPriorities``).

    ``retire``: ``(Trainer.replay_max_use, replay_max_staleness)``; either set wraps the sampler in a
    ``RetiringSampler`` (``alfish/replay/retirement.py``)."""
    scratch_dir = None
    if devices.replay_storage == "mmap":
        scratch_dir = os.path.join(config.root_dir, "replay_mmap")
        os.makedirs(scratch_dir, exist_ok=True)
    storage = make_storage(devices.replay_storage, spec.num_envs, config.replay_buffer_length, device=device,
                           track_episode_ends=transformer.needs_episode_ends, scratch_dir=scratch_dir)
    if config.priority_replay:
        trees = CPU if _reads_buffer(transformer) else storage.device
        sampler = make_prioritized_sampler(config, spec.num_envs, config.replay_buffer_length, device=trees)
    else:
        sampler = UniformSampler()
    if retire != (None, None):
        sampler = RetiringSampler(sampler, spec.num_envs, config.replay_buffer_length, *retire)
    return ReplayBuffer(storage, sampler, device=device)


def _reads_buffer(transformer: DataTransformer) -> bool:
    parts = getattr(transformer, "transformers", [transformer])
    return any(getattr(t, "stage", None) == STAGE_READS_BUFFER for t in parts)


def build_training_step(config: TrainerConfig, parts: StepParts, replay: Optional[ReplayBuffer],
                        total_envs: int, presample: bool = False) -> TrainingStep:
    """On-policy (no ``replay``): train on the unroll. Off-policy: from replay, sampled (``presample``:
    ``Trainer.presample_mini_batches``) or over the whole buffer."""
    if replay is None:
        return OnPolicyTraining(parts)
    settings = dataclasses.replace(ReplaySettings.of(config, total_envs), presample_mini_batches=presample)
    if config.whole_replay_buffer_training:
        return WholeBufferTraining(parts, replay, settings, clear=config.clear_replay_buffer)
    return SampledReplayTraining(parts, replay, settings)


def build_evaluator(config: TrainerConfig, seed: int, transformer: DataTransformer, spec: EnvSpec) -> EvaluatorPart:
    """Evaluation envs of their own (never the training instance), built under the gin scope ``eval``: bindings such
    as ``eval/create_environment.env_name = 'MySim-v0'`` evaluate a policy trained on hardware that can be opened
    only once in a simulator instead (or set ``TrainerConfig.evaluate = False`` and evaluate with play).
    ``async_eval``: the envs and a policy copy (built from the training ``spec``, acting on
    ``DevicePolicy.rollout_device``) live in a child process; else here, acting with the algorithm itself."""
    eval_seed = seed + EVAL_SEED_OFFSET
    if config.async_eval:
        with gin.config_scope("eval"):  # read here, so the operative config records them; the child builds the envs
            settings = environment_settings(num_parallel_environments=config.num_eval_environments, seed=eval_seed)
        eval_spec = EvalSpec(env_settings=settings, env_spec=spec, config_text=gin.config_str(),
                             root_dir=config.root_dir, gin_constants=gin_constants(),
                             num_episodes=config.num_eval_episodes, epsilon_greedy=config.epsilon_greedy,
                             seed=eval_seed, uncertainty=config.eval_uncertainty, parent_pid=os.getpid())
        return AsyncEvaluator(eval_spec, transformer, stall_timeout_s=settings.step_timeout_s)
    with gin.config_scope("eval"):
        env = create_environment(num_parallel_environments=config.num_eval_environments, seed=eval_seed)
    return Evaluator(env, config.num_eval_episodes, config.epsilon_greedy, seed=eval_seed,
                     transform=transformer.rollout_view(update_stats=False), uncertainty=config.eval_uncertainty)


def _choose_seed(config: TrainerConfig, resume_from: Optional[LoadedCheckpoint]) -> int:
    if resume_from is not None:
        return resume_from.count("seed")
    if config.random_seed is not None:
        return int(config.random_seed)
    seed = int.from_bytes(os.urandom(4), "little") % (2**31 - 1)
    logging.info("TrainerConfig.random_seed is None; using random seed %d", seed)
    return seed


def training_batch_rows(config: TrainerConfig, num_envs: int, on_policy: bool) -> int:
    """Rows a network sees in one training forward pass (what ``Trainer.num_threads='auto'`` sizes threads by): the
    unroll for on-policy training, else a mini-batch's transitions (``mini_batch_size x (mini_batch_length - 1)``;
    the whole buffer when no mini-batch size is set)."""
    whole_unroll = num_envs * max(1, config.unroll_length)
    if on_policy or not config.mini_batch_size:
        return whole_unroll
    return config.mini_batch_size * max(1, (config.mini_batch_length or 1) - 1)
