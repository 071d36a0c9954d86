"""Run options that are not ALF TrainerConfig fields; gin name ``Trainer`` (the name confs have always used)."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Sequence, Union

import gin

from alfish.learn.threads import check_setting
from alfish.rundir.trackers import check_tracker_names  # (also registers the wandb_tracker, mlflow_tracker settings)


@gin.configurable("Trainer")
@dataclasses.dataclass(frozen=True)
class RunOptions:
    """save_replay_buffer: store the replay buffer (as tensors, full capacity) in checkpoints, so a resumed run
    continues with the same data; set False to keep checkpoints small (a resume then refills one mini-batch of fresh
    steps).
    num_threads: torch intra-op threads: ``'auto'`` (the default: one thread for small networks, else the free cores
    of this machine shared by its ranks; the rule and its measurements are in ``alfish/learn/threads.py``), a
    positive int, or ``None`` (torch's default: one per core, whatever else runs).
    progress_log_interval_s: seconds between progress lines when stderr is not a terminal.
    stop_grace_s: after SIGTERM/SIGINT the run stops at the end of the current iteration (with a checkpoint); when
    that iteration has not ended this many seconds after the signal (a hung env step, a stuck collective), the
    process ends anyway with ``128 + signal`` and one line saying where it was stuck, without a checkpoint of the
    unfinished iteration (the last checkpoint is intact). Writing the stop's checkpoint gets the same time again. A
    second signal ends the process at once (``alfish/console/signals.py``).
    presample_mini_batches: sampled training (``TrainerConfig.whole_replay_buffer_training=False``, no offline
    data) draws an iteration's ``num_updates_per_train_iter`` mini-batches in one sampler call (one gather, one
    transform, one copy to the device) and writes their priorities back in one call after the last update, instead
    of one of each per update: less work per update where many run per iteration (DQN's 128). Uniform replay: the
    mini-batches have the same distribution (other random numbers). Prioritized replay: every mini-batch of the
    iteration is drawn from the priorities at its start, so an update's new priorities reach the sampler at the end
    of the iteration, not before the next mini-batch (Ape-X's delayed priorities); each mini-batch is stratified and
    weighted on its own. The transformers see the iteration's mini-batches as one batch.
    random_warm_up_actions: collect the ``initial_collect_steps`` with uniformly random actions instead of the
    untrained policy's (as the TD3 paper and SB3's ``learning_starts`` do; ALF uses the policy, the default here).
    Off-policy algorithms whose rollout stores no info (SAC, DDPG, TD3, DQN), synchronous unroll only.
    host_memory_cache_mb: MB of freed host memory the process keeps for reuse instead of returning it to the OS
    (glibc's mmap/trim thresholds; ``alfish/learn/host_memory.py``): fresh update buffers then cost no page faults
    (SAC's update ~7% faster here); 0 leaves malloc's defaults.
    run_record: write ``ROOT_DIR/run_record/<start time>/`` at each start (rank 0): git commit and diff (or a copy
    of the package source), installed packages, the conf and the user modules it imports, the command line
    (``alfish/rundir/run_record.py``).

    The evaluation and checkpoint lifecycle (trainer callbacks: ``alfish/trainer/lifecycle.py``, ``warm_start.py``,
    ``eval_video.py``):
    stop_value: end the run (as finished: final evaluation and checkpoint) once an evaluation's average return is
    ``>=`` this; ``None``: never. Needs ``TrainerConfig.evaluate``.
    keep_best_checkpoint: keep the policy of the best evaluation so far in ``ROOT_DIR/checkpoints/best/`` (``play
    --best``); with evaluation on.
    evaluate_at_start: also evaluate at iteration 0, before any training (a fresh run).
    eval_video_interval: every this many evaluations, record one greedy episode of the evaluated policy to
    ``ROOT_DIR/videos/eval-<iteration>.<eval_video_format>`` (``'mp4'`` or ``'gif'``); 0: never.
    checkpoint_interval_s: also write a checkpoint whenever this many seconds passed since the last, and one when the
    run ends (``None``: only ``TrainerConfig.num_checkpoints``'s).
    max_checkpoints_to_keep: delete the oldest checkpoints beyond this many, once the newest verified (``None``: keep
    all); the best checkpoint is kept apart and never counted.
    warm_start_from, warm_start: begin a fresh run from another run's checkpoint: ``'weights'``,
    ``'weights_and_optimizer'`` or ``'all'`` (+ replay buffer) (``alfish/trainer/warm_start.py``).
    scalars_csv: also write every scalar summary to ``ROOT_DIR/scalars.csv`` (``step,tag,value`` rows), for readers
    without TensorBoard.
    callbacks: the user's own ``TrainerCallback`` instances (``alfish/trainer/callbacks.py``), called after the
    built-in ones.
    trackers: experiment trackers that also get every scalar (at TensorBoard's steps), the operative config, the run
    record and the evaluation videos, on rank 0: ``'wandb'``, ``'mlflow'`` (each an extra, ``pip install
    'alfish[wandb]'``; settings ``wandb_tracker.*``, ``mlflow_tracker.*``); a resumed run continues their runs, and a
    tracker that fails costs one warning (``alfish/rundir/trackers/``). Default ``[]``: TensorBoard only.

    Collection at scale (``TrainerConfig.async_unroll=True``; ``alfish/collect/unroll_processes.py``):
    num_unroll_processes: unroll child processes of each rank, each stepping an equal share of its
    ``create_environment.num_parallel_environments`` envs (a multiple of it) with its own policy copy, all feeding
    one queue and reading one parameter publish; env ids and seeds are those of one process stepping them all.
    unroll_min_fraction: with ``TrainerConfig.unroll_length > 0`` and several processes, an iteration trains once
    this fraction of the processes delivered their ``unroll_length`` steps (the others' steps that arrived are taken
    too, the rest wait for the next iteration); 1: every process (synchronous collection).
    max_policy_lag: steps acted by parameters more than this many published versions older than the newest are
    dropped (counted in ``async/dropped_env_steps``; the stored episode of their envs is cut there); ``None``: keep
    every step.
    restart_crashed_envs: an unroll child whose env raises, whose env worker processes die
    (``vectorization='async'``), that dies itself, hangs past ``create_environment.step_timeout_s`` or is stopped, is
    replaced by a new one stepping the same envs (reseeded) instead of ending the run: the steps it sent are kept
    (whole transitions), its envs' episodes in flight are cut there and never counted as finished, and each
    replacement is logged and counted (``async/env_restarts``). A synchronous unroll's env worker processes
    (``vectorization='async'``) are restarted the same way, all of the batch at once (``collect/env_restarts``; an
    on-policy trajectory in progress is discarded and unrolled again). Default: fail fast. In-process envs
    (``vectorization='sync'`` without the async unroll) cannot be restarted: refused.
    max_env_restarts_per_hour: with ``restart_crashed_envs``, one more replacement than this within an hour ends the
    run with the failure (an env that keeps failing is a bug, not bad luck).
    replay_max_use, replay_max_staleness: retire a stored sequence start from sampled replay once it was drawn this
    many times, or once the parameters that acted it are more than this many iterations older than the current ones
    (DI-engine's ``AdvancedReplayBuffer``; ``alfish/replay/retirement.py``); ``None``: no limit. Off-policy sampled
    training only (``TrainerConfig.whole_replay_buffer_training=False``).
    """

    save_replay_buffer: bool = True
    num_threads: Union[int, str, None] = "auto"
    progress_log_interval_s: float = 10.0
    stop_grace_s: float = 30.0
    random_warm_up_actions: bool = False
    presample_mini_batches: bool = False
    host_memory_cache_mb: int = 256
    run_record: bool = True
    stop_value: Optional[float] = None
    keep_best_checkpoint: bool = True
    evaluate_at_start: bool = False
    eval_video_interval: int = 0
    eval_video_format: str = "mp4"
    checkpoint_interval_s: Optional[float] = None
    max_checkpoints_to_keep: Optional[int] = None
    warm_start_from: Optional[str] = None
    warm_start: str = "weights"
    scalars_csv: bool = False
    callbacks: Sequence[Any] = ()
    trackers: Sequence[str] = ()
    num_unroll_processes: int = 1
    unroll_min_fraction: float = 1.0
    max_policy_lag: Optional[int] = None
    restart_crashed_envs: bool = False
    max_env_restarts_per_hour: int = 10
    replay_max_use: Optional[int] = None
    replay_max_staleness: Optional[int] = None

    def __post_init__(self) -> None:
        check_setting(self.num_threads)
        check_tracker_names(self.trackers)
        if isinstance(self.num_unroll_processes, bool) or not isinstance(self.num_unroll_processes, int) or (
                self.num_unroll_processes < 1):
            raise ValueError(f"Trainer.num_unroll_processes={self.num_unroll_processes!r} must be an int >= 1")
        if isinstance(self.unroll_min_fraction, bool) or not isinstance(self.unroll_min_fraction, (int, float)) or not (
                0 < self.unroll_min_fraction <= 1):
            raise ValueError(f"Trainer.unroll_min_fraction={self.unroll_min_fraction!r} must be in (0, 1] (the "
                             "fraction of the unroll processes an iteration waits for)")
        if self.max_policy_lag is not None and (isinstance(self.max_policy_lag, bool) or not isinstance(
                self.max_policy_lag, int) or self.max_policy_lag < 0):
            raise ValueError(f"Trainer.max_policy_lag={self.max_policy_lag!r} must be an int >= 0 (parameter "
                             "versions) or None (no limit)")
        if isinstance(self.max_env_restarts_per_hour, bool) or not isinstance(self.max_env_restarts_per_hour, int) or (
                self.max_env_restarts_per_hour < 1):
            raise ValueError(f"Trainer.max_env_restarts_per_hour={self.max_env_restarts_per_hour!r} must be an int "
                             ">= 1")
        for name, low in (("replay_max_use", 1), ("replay_max_staleness", 0)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ValueError(f"Trainer.{name}={value!r} must be an int >= {low} or None (no limit)")
        if self.eval_video_interval < 0:
            raise ValueError(f"Trainer.eval_video_interval={self.eval_video_interval} must be >= 0 (0: no videos)")
        if self.checkpoint_interval_s is not None and not self.checkpoint_interval_s > 0:
            raise ValueError(f"Trainer.checkpoint_interval_s={self.checkpoint_interval_s} must be > 0 seconds (or "
                             "None)")
        if self.max_checkpoints_to_keep is not None and (isinstance(self.max_checkpoints_to_keep, bool) or not
                                                         isinstance(self.max_checkpoints_to_keep, int) or
                                                         self.max_checkpoints_to_keep < 1):
            raise ValueError(f"Trainer.max_checkpoints_to_keep={self.max_checkpoints_to_keep!r} must be an int >= 1 "
                             "(or None: keep all)")
        if self.warm_start not in ("weights", "weights_and_optimizer", "all"):
            raise ValueError(f"Trainer.warm_start={self.warm_start!r} is not one of 'weights', "
                             "'weights_and_optimizer', 'all'")
        if isinstance(self.stop_grace_s, bool) or not isinstance(self.stop_grace_s, (int, float)) or not (
                math.isfinite(self.stop_grace_s) and self.stop_grace_s > 0):
            raise ValueError(f"Trainer.stop_grace_s={self.stop_grace_s!r} must be a finite number of seconds > 0")
        if self.host_memory_cache_mb < 0:
            raise ValueError(f"Trainer.host_memory_cache_mb={self.host_memory_cache_mb} must be >= 0 (0: malloc's "
                             "defaults)")
