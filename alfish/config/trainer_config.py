"""TrainerConfig: every knob of a training run, with ALF's names and defaults.

ALF users move their confs over unchanged: the parameter names and defaults are ALF's. Values are validated when the
object is built, so a bad conf fails with one line naming the parameter before any environment starts: each value
against its annotation and its range in ``alfish.config.value_rules.RULES`` (the same check that names the conf's
file and line when the conf is loaded), then the rules that relate several parameters, here. Every parameter is
operative (``tests/config/test_every_field_read.py`` checks that each is read by the code that acts on it), except
``no_thread_env_for_conf``, accepted for ALF confs and documented as having no effect.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from fractions import Fraction
from typing import Any, Callable, Optional, Sequence, Union

import gin

from alfish.config import value_checks
from alfish.errors import OneLineValueError

# A number or a schedule (alfish.schedulers: a callable giving the current value). Written without importing
# alfish.schedulers, which imports torch, so that reading a TrainerConfig stays cheap.
NumberOrSchedule = Union[float, Callable[[], float]]

class TrainerConfigError(OneLineValueError):
    """A bad TrainerConfig value; its str() is always the one-line message (through gin too)."""


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """All parameters of one training run (ALF's names and defaults; validated on construction).

    An *iteration* is one unroll phase followed by one training phase. Under ``torchrun`` (DDP) the settings follow
    ALF: ``create_environment.num_parallel_environments`` and ``mini_batch_size`` are per rank (each rank steps its own
    envs and samples its own mini-batches), while ``num_env_steps`` and ``initial_collect_steps`` count env steps
    summed over all envs of all ranks (job totals); the effective totals are logged at start. The object is frozen;
    use ``dataclasses.replace(config, random_seed=...)`` to derive a changed copy.

    Args:
        root_dir: directory for checkpoints, summaries and the config record (passed by the train command).
        conf_file: path of the conf file this config came from (recorded for reference only).
        ml_type: ``'rl'`` (reinforcement learning) or ``'sl'``: supervised learning of ``SupervisedModel`` on
            ``SupervisedData`` pairs, on the same loop, Learner, summaries and checkpoints (no env; the validation
            loss is summarized as ``sl/validation_loss``; needs ``evaluate=False``, ``mini_batch_size`` and
            ``num_iterations``).
        algorithm_ctor: the algorithm's constructor, e.g. ``@SacAlgorithm``; the trainer calls it with the env specs.
        data_transformer_ctor: constructor, or list of constructors, of data transformers (alfish.transforms), applied
            to each TimeStep before the algorithm sees it and to each replay sample before training.
        random_seed: seed for torch/numpy/python and the envs; None picks one at random and logs it.
        num_iterations: stop after this many iterations (0: no limit from iterations).
        num_env_steps: stop after this many env steps summed over all envs of all DDP ranks (0: no limit from
            env steps); when both limits are > 0, training stops at whichever is reached first. Like every int
            parameter here it also takes a whole float such as 1e6 (as ALF confs write it), stored as an int.
        unroll_length: env steps per env per iteration; a fraction < 1 means one step every 1/unroll_length
            iterations.
        unroll_with_grad: ALF's switch for gradients through the unroll; here implied by the algorithm (on-policy ones
            train on the unroll's own rollout infos: with gradients, or recomputed with gradients in one batched
            pass, as A2C does), and True with an off-policy algorithm is refused (stored steps would keep autograd
            graphs).
        async_unroll: step the envs in a child process (with a copy of the rollout policy) feeding a bounded queue
            while this process trains; replay algorithms, and PPO/A2C with ``off_policy_correction='vtrace'`` (their
            loss otherwise takes the lagged data as their own: refused). With unroll_length > 0 each iteration takes
            exactly that many steps per env from the queue (waiting for them); with unroll_length == 0 it takes
            what has arrived, at most max_unroll_length, and trains even if nothing arrived.
        max_unroll_length: async unroll with unroll_length == 0: most steps per env taken in one iteration (0: all
            that have arrived).
        unroll_queue_size: async unroll: capacity of the queue, in batched env steps; a full queue pauses the child.
        unroll_step_interval: async unroll: seconds between two env steps (fixed-rate pacing, e.g. a real-time
            robot); 0: as fast as possible.
        unroll_parameter_update_period: async unroll: iterations between pushes of fresh rollout-policy parameters
            (and transformer statistics) to the child.
        use_rollout_state: a recurrent algorithm (e.g. an ``EncodingNetwork(rnn='lstm'|'gru')`` core) stores its
            rollout state with the experience, and training sequences start from the state stored with their first
            step; False: they start from the initial (zero) state.
        temporally_independent_train_step: None decides automatically (False for a recurrent algorithm, True
            otherwise). True: train_step sees all time steps of a mini-batch at once (a recurrent algorithm then starts
            each step from its stored rollout state, which needs use_rollout_state=True). False: train_step runs over
            each sequence step by step, carrying the state and resetting it at FIRST steps (recurrent algorithms only).
        num_checkpoints: number of checkpoints, evenly spaced over the run, the last at its end (0: none).
        confirm_checkpoint_upon_crash: after a crash a checkpoint is written either way; True first asks "Write a
            checkpoint before exiting? [Y/n]" when stdin is an interactive terminal (60 s, default yes), never in a
            batch job or pipe; False writes it without asking. A NaN/inf loss never writes one.
        no_thread_env_for_conf: ALF's switch for the extra env ALF builds to show the config; accepted for ALF confs
            and has no effect in alfish, which never builds that env.
        evaluate: evaluate the greedy policy periodically in separate eval envs.
        num_evals: number of evaluations over the run; when set it overrides eval_interval.
        eval_interval: iterations between two evaluations.
        epsilon_greedy: probability in [0, 1] of sampling an action instead of the greedy one in evaluation/play.
        eval_uncertainty: also record the spread of each evaluation: the std, min and max of the episode returns
            (``eval/return_std``, ``return_min``, ``return_max``) and, for an algorithm with a critic ensemble
            (``algorithm.critics``: SAC, TD3/DDPG, IQL), the critics' estimates of the evaluation's own state-action
            pairs: ``eval/critic_mean`` and, with 2 or more critics, ``eval/critic_std`` (mean over the steps of the
            std across the ensemble). Others (PPO, A2C, DQN, BC, SAC with a shared encoder, whose critics read its
            features, and SAC with mixed actions, whose critics give one value per choice) record the return spread
            only.
        num_eval_episodes: episodes per evaluation, summed over the eval envs.
        num_eval_environments: number of parallel eval envs.
        async_eval: run evaluation in a child process (acting on ``DevicePolicy.rollout_device``, the CPU by default)
            on a copy of the parameters sent when it is due, so training does not wait for it; results are recorded
            against the iteration they evaluated. An evaluation due while the previous one still runs waits for it
            (so every due evaluation is recorded); the final one is awaited before the run ends.
        ddp_paras_check_interval: iterations between checks that DDP ranks hold equal parameters (0: never); a
            mismatch is an error naming the first differing parameter.
        num_summaries: number of summary writes over the run; when set it overrides summary_interval.
        summary_interval: iterations between two summary writes.
        summarize_first_interval: write summaries at every iteration of the first summary interval.
        update_counter_every_mini_batch: advance the global counter per mini-batch instead of per iteration: the
            TensorBoard step of the training summaries is the number of optimizer updates, and summary_interval
            counts updates (a summary after each iteration in which the count reaches a multiple of it; with
            num_summaries set, summaries stay spaced by iterations). Evaluations, checkpoints and every other
            interval count iterations; the eval/ scalars keep the iteration as their step.
        summaries_flush_secs: seconds between flushes of the summary writer to disk.
        summary_max_queue: summaries queued in memory before a flush is forced.
        metric_min_buffer_size: episodes kept in the buffer that averages episodic metrics (return, length).
        debug_summaries: the algorithm adds debug/ statistics to its loss terms, computed only when a summary is
            due: Q-values and TD targets (SAC, DDPG/TD3, DQN, IQL; mean/min/max), entropy and alpha (SAC),
            advantage mean/std and the value function's explained variance (PPO, A2C), advantage and weight
            statistics (IQL).
        profiling: ``torch.profiler`` over a window of iterations (``Profiler.skip_iterations``,
            ``Profiler.active_iterations``): Chrome trace and top-ops table in ``root_dir/profile``.
        enable_amp: mixed-precision training: the loss under torch.autocast (bf16 on CPU; fp16 with a gradient
            scaler on CUDA; AmpPolicy.dtype chooses).
        code_snapshots: source files recorded as TensorBoard text (``code/<path>``) at start (ALF's meaning); a path
            as given, else relative to the alfish package. (The run record, ``Trainer.run_record``, is separate.)
        summarize_grads_and_vars: write the norms (vars/<name>.norm, grads/<name>.norm) and histograms
            (vars/<name>, grads/<name>) of the parameters and of the last update's gradients.
        summarize_gradient_noise_scale: write the simple gradient noise scale of McCandlish et al. 2018 (gns/simple,
            with its estimates gns/grad_norm_sq and gns/noise_trace), measured on one update per summary by two
            extra backwards on the two halves of its mini-batch, averaged over summaries.
        summarize_action_distributions: write histograms of the actions (action/dim<i> per Box dim with their mean
            and std; action/discrete and action/frequency.<k> for Discrete actions): this iteration's rollout for
            on-policy and whole-buffer training, the last sampled mini-batch otherwise.
        summarize_output: write the mean/std/min/max of the outputs of the algorithm's networks (output/<module>.*),
            recorded by forward hooks on one update per summary.
        initial_collect_steps: env steps summed over all envs of all DDP ranks collected before any training starts
            (each env takes ceil(initial_collect_steps / total envs) steps).
        num_updates_per_train_iter: gradient-update passes per iteration (epochs over the buffer with
            whole_replay_buffer_training).
        mini_batch_length: steps per sampled sequence (None: the algorithm's default / the whole unroll).
        mini_batch_size: sequences per mini-batch, per DDP rank: each rank samples its own, and an update averages
            the gradients of world_size x mini_batch_size sequences (None: the algorithm's default / the whole
            buffer).
        whole_replay_buffer_training: train on the whole buffer each iteration (PPO style) instead of samples.
        replay_buffer_length: steps kept per env in the replay buffer's ring.
        priority_replay: prioritized experience replay over sequence starts (off-policy, sampled training only).
        priority_replay_alpha: priority exponent: stored priority = (priority + eps) ** alpha; float or schedule.
        priority_replay_beta: importance-weight exponent: w = (N * P(i)) ** -beta; float or schedule.
        priority_replay_eps: added to every priority before the exponent, so none is 0.
        offline_buffer_dir: offline data for offline or hybrid training: one source or a list of them, each a
            path (an alfish dataset, an alfish results or checkpoint directory, a Minari dataset directory, a
            D4RL-style .npz/.hdf5 file or directory of .npy arrays), optionally prefixed by its kind
            (``'d4rl:/data/x.npz'``); see ``alfish/replay/offline/sources.py``. ``None``: online training only.
        offline_buffer_length: most steps loaded from each offline source (``None``: all).
        rl_train_after_update_steps: hybrid training (``HybridTraining.mixing='separate'``, ALF's scheme): the
            online RL part (collection and the RL loss on online samples) starts at this iteration (ALF's global
            counter); before it only the offline loss trains. ``>= num_iterations``: pure offline training, and no
            training env is built.
        rl_train_every_update_steps: hybrid training: once started, the RL part trains at iterations divisible by
            this (ALF: ``global_counter % rl_train_every_update_steps == 0``); the offline loss trains every update.
        empty_cache: call torch.cuda.empty_cache() every iteration (no effect without CUDA).
        normalize_importance_weights_by_max: prioritized replay: divide the importance weights by their max in the
            batch (ALF's meaning); False keeps (N * P(i)) ** -beta.
        clear_replay_buffer: with whole_replay_buffer_training, clear the buffer after each iteration.
    """

    root_dir: str
    conf_file: str = ''
    ml_type: str = 'rl'
    algorithm_ctor: Optional[Callable[..., Any]] = None
    data_transformer_ctor: Optional[Any] = None
    random_seed: Optional[int] = None
    num_iterations: int = 1000
    num_env_steps: int = 0
    unroll_length: float = 8
    unroll_with_grad: bool = False
    async_unroll: bool = False
    max_unroll_length: int = 0
    unroll_queue_size: int = 200
    unroll_step_interval: float = 0
    unroll_parameter_update_period: int = 10
    use_rollout_state: bool = False
    temporally_independent_train_step: Optional[bool] = None
    num_checkpoints: int = 10
    confirm_checkpoint_upon_crash: bool = True
    no_thread_env_for_conf: bool = False
    evaluate: bool = False
    num_evals: Optional[int] = None
    eval_interval: int = 10
    epsilon_greedy: float = 0.
    eval_uncertainty: bool = False
    num_eval_episodes: int = 10
    num_eval_environments: int = 1
    async_eval: bool = True
    ddp_paras_check_interval: int = 0
    num_summaries: Optional[int] = None
    summary_interval: int = 50
    summarize_first_interval: bool = True
    update_counter_every_mini_batch: bool = False
    summaries_flush_secs: float = 1
    summary_max_queue: int = 10
    metric_min_buffer_size: int = 10
    debug_summaries: bool = False
    profiling: bool = False
    enable_amp: bool = False
    code_snapshots: Optional[Sequence[str]] = None
    summarize_grads_and_vars: bool = False
    summarize_gradient_noise_scale: bool = False
    summarize_action_distributions: bool = False
    summarize_output: bool = False
    initial_collect_steps: int = 0
    num_updates_per_train_iter: int = 4
    mini_batch_length: Optional[int] = None
    mini_batch_size: Optional[int] = None
    whole_replay_buffer_training: bool = True
    replay_buffer_length: int = 1024
    priority_replay: bool = False
    priority_replay_alpha: NumberOrSchedule = 0.7
    priority_replay_beta: NumberOrSchedule = 0.4
    priority_replay_eps: float = 1e-6
    offline_buffer_dir: Union[str, list[str], tuple[str, ...], None] = None
    offline_buffer_length: Optional[int] = None
    rl_train_after_update_steps: int = 0
    rl_train_every_update_steps: int = 1
    empty_cache: bool = False
    normalize_importance_weights_by_max: bool = False
    clear_replay_buffer: bool = True

    def __post_init__(self) -> None:
        """Validates all parameters; raises a one-line TrainerConfigError (a ValueError) naming each offender.

        Whole floats given for int parameters (``num_env_steps=1e6``) are stored as ints first.
        """
        _store_whole_floats_as_ints(self)
        problems = validation_problems(self)
        if len(problems) == 1:
            raise TrainerConfigError(problems[0])
        if problems:
            numbered = ' '.join(f'[{i}] {p}.' for i, p in enumerate(problems, 1))
            raise TrainerConfigError(f'{len(problems)} problems in TrainerConfig: {numbered}')

    def expected_num_iterations(self, num_envs: int) -> int:
        """Iterations the run will take with `num_envs` training envs (the first of the two limits reached)."""
        if num_envs < 1:
            raise ValueError(f"num_envs={num_envs} must be >= 1")
        limits = []
        if self.num_iterations > 0:
            limits.append(int(self.num_iterations))
        if self.num_env_steps > 0 and self.unroll_length > 0:
            # The warm-up (initial_collect_steps, rounded up to whole steps of every env) counts towards
            # num_env_steps but takes no iteration.
            warm_up = math.ceil(self.initial_collect_steps / num_envs) * num_envs
            # Exact rational arithmetic so that e.g. unroll_length=0.1 does not lose an iteration to rounding.
            steps_per_iteration = Fraction(self.unroll_length).limit_denominator(10**6) * num_envs
            limits.append(max(1, math.ceil(Fraction(self.num_env_steps - warm_up) / steps_per_iteration)))
        return min(limits)

    def resolved_summary_interval(self, num_envs: int) -> int:
        """Iterations between summaries: from num_summaries when set, else summary_interval."""
        return self._resolved_interval(self.num_summaries, self.summary_interval, num_envs)

    def resolved_eval_interval(self, num_envs: int) -> int:
        """Iterations between evaluations: from num_evals when set, else eval_interval."""
        return self._resolved_interval(self.num_evals, self.eval_interval, num_envs)

    def checkpoint_iterations(self, num_envs: int) -> list[int]:
        """Iterations (1-based, ascending, distinct) after which to checkpoint; the last is the run's end.

        `num_checkpoints` points evenly spaced over the run (fewer if the run has fewer iterations); empty when
        num_checkpoints is 0.
        """
        total = self.expected_num_iterations(num_envs)
        n = self.num_checkpoints
        points = {(total * i) // n for i in range(1, n + 1)}
        return sorted(p for p in points if p >= 1)

    def _resolved_interval(self, count: Optional[int], interval: int, num_envs: int) -> int:
        """`count` events evenly over the run when count is set, else the fixed `interval`."""
        if count is None:
            return interval
        return max(1, self.expected_num_iterations(num_envs) // count)


def _parameters() -> dict[str, value_checks.Parameter]:
    """Every TrainerConfig parameter with its annotation and its rules (value_rules.RULES)."""
    return value_checks.parameters_of(TrainerConfig, 'TrainerConfig')


def _store_whole_floats_as_ints(config: TrainerConfig) -> None:
    """Replaces a whole float (1e6) in an int parameter by the int, so that counts are ints downstream."""
    for name, parameter in _parameters().items():
        value = getattr(config, name)
        if isinstance(value, float) and value.is_integer() and int in _members(parameter.annotation):
            object.__setattr__(config, name, int(value))


def _members(annotation: Any) -> tuple[Any, ...]:
    """The types of a Union (Optional included), or the annotation alone."""
    return typing.get_args(annotation) if typing.get_origin(annotation) in (Union, types.UnionType) else (annotation,)


def validation_problems(config: TrainerConfig) -> list[str]:
    """All problems of `config`, each one sentence naming the parameter(s) and the fix; empty when valid.

    A value of the wrong type is reported alone (the other checks would compare it with numbers); otherwise: features
    not built yet, required values, values out of range, then rules that relate several parameters.
    """
    wrong_type, out_of_range = [], []
    for name, parameter in _parameters().items():
        value = getattr(config, name)
        problem = parameter.problem(value)
        if problem is not None:
            message = problem.message(f'TrainerConfig.{name}', _one_line_repr(value))
            (out_of_range if problem.type_ok else wrong_type).append(message)
    if wrong_type:
        return wrong_type
    return _unsupported_problems(config) + _required_problems(config) + out_of_range + _cross_field_problems(config)


def _unsupported_problems(config: TrainerConfig) -> list[str]:
    """Values alfish does not support, set in the conf."""
    problems = []
    if config.ml_type not in ('rl', 'sl'):
        problems.append(f"TrainerConfig.ml_type={config.ml_type!r} must be 'rl' (reinforcement learning) or 'sl' "
                        "(supervised learning)")
    return problems


def _required_problems(config: TrainerConfig) -> list[str]:
    """Values a run cannot do without (the ranges of single parameters are in value_rules.RULES)."""
    c = config
    checks = [
        (not c.root_dir, "TrainerConfig.root_dir is empty; pass --root_dir to the train command"),
        (c.algorithm_ctor is None,
         "TrainerConfig.algorithm_ctor is not set; set it in the conf, "
         "e.g. TrainerConfig.algorithm_ctor=@SacAlgorithm"),
        (c.num_iterations <= 0 and c.num_env_steps <= 0,
         f"TrainerConfig.num_iterations={c.num_iterations} and TrainerConfig.num_env_steps={c.num_env_steps}: "
         f"set at least one of them > 0 (training stops at whichever is reached first)"),
        (c.unroll_length == 0 and not c.async_unroll,
         f"TrainerConfig.unroll_length={c.unroll_length} must be > 0 (env steps per env per iteration; "
         f"a fraction < 1 steps every 1/unroll_length iterations; 0 only with async_unroll=True)"),
    ]
    return [message for failed, message in checks if failed]


def _cross_field_problems(config: TrainerConfig) -> list[str]:
    """Parameters that are valid alone but not together."""
    c = config
    needed_length = math.ceil(c.unroll_length) + 1 if c.unroll_length > 0 else 0
    checks = [
        (c.async_unroll and c.unroll_length == 0 and c.num_iterations <= 0,
         "TrainerConfig.unroll_length=0 with async_unroll=True takes whatever has arrived each iteration, so the "
         "number of iterations is unknown in advance: set TrainerConfig.num_iterations > 0"),
        (c.async_unroll and c.unroll_with_grad,
         "TrainerConfig.async_unroll=True unrolls in another process, so it cannot keep gradients: set "
         "TrainerConfig.unroll_with_grad=False"),
        (c.async_unroll and c.unroll_length != int(c.unroll_length),
         f"TrainerConfig.unroll_length={c.unroll_length} must be a whole number with async_unroll=True"),
        (c.priority_replay and c.whole_replay_buffer_training,
         "TrainerConfig.priority_replay=True samples mini-batches from the buffer, so it needs "
         "TrainerConfig.whole_replay_buffer_training=False"),
        (not c.whole_replay_buffer_training and (c.mini_batch_size is None or c.mini_batch_length is None),
         f"TrainerConfig.whole_replay_buffer_training=False needs TrainerConfig.mini_batch_size "
         f"(now {c.mini_batch_size}) and TrainerConfig.mini_batch_length (now {c.mini_batch_length}) to be set"),
        (c.whole_replay_buffer_training and c.replay_buffer_length < needed_length,
         f"TrainerConfig.whole_replay_buffer_training=True needs TrainerConfig.replay_buffer_length "
         f"(now {c.replay_buffer_length}) >= ceil(TrainerConfig.unroll_length)+1 = {needed_length} "
         f"(one unroll plus the step to bootstrap from)"),
        (c.ml_type == 'sl' and (c.evaluate or c.num_iterations <= 0 or c.offline_buffer_dir is not None),
         "TrainerConfig.ml_type='sl' trains a model on SupervisedData with no env: set TrainerConfig.evaluate=False "
         "(the validation loss is summarized), TrainerConfig.num_iterations > 0 and no offline_buffer_dir"),
        (c.offline_buffer_dir is None and c.offline_buffer_length is not None,
         f"TrainerConfig.offline_buffer_length={c.offline_buffer_length} limits the offline data, but "
         "TrainerConfig.offline_buffer_dir is not set; set it or remove offline_buffer_length"),
        (c.offline_buffer_dir is None and (c.rl_train_after_update_steps != 0 or c.rl_train_every_update_steps != 1),
         "TrainerConfig.rl_train_after_update_steps / rl_train_every_update_steps schedule the RL part of hybrid "
         "training, but TrainerConfig.offline_buffer_dir is not set; set it or remove them"),
        (c.offline_buffer_dir is not None and isinstance(c.offline_buffer_dir, (list, tuple))
         and len(c.offline_buffer_dir) == 0,
         "TrainerConfig.offline_buffer_dir=[] names no source; give one or more paths, or None"),
        (c.offline_buffer_dir is not None and c.whole_replay_buffer_training,
         "TrainerConfig.offline_buffer_dir trains from sampled mini-batches: set "
         "TrainerConfig.whole_replay_buffer_training=False (with mini_batch_size and mini_batch_length)"),
        (c.mini_batch_length is not None and c.mini_batch_length > c.replay_buffer_length,
         f"TrainerConfig.mini_batch_length={c.mini_batch_length} must be <= "
         f"TrainerConfig.replay_buffer_length={c.replay_buffer_length}"),
    ]
    if c.evaluate:
        checks += [
            (c.num_eval_environments < 1, f"TrainerConfig.num_eval_environments={c.num_eval_environments} must be "
                                          f">= 1 when TrainerConfig.evaluate=True"),
            (c.num_eval_episodes < 1, f"TrainerConfig.num_eval_episodes={c.num_eval_episodes} must be >= 1 when "
                                      f"TrainerConfig.evaluate=True"),
            (c.eval_interval < 1, f"TrainerConfig.eval_interval={c.eval_interval} must be >= 1 (iterations) when "
                                  f"TrainerConfig.evaluate=True"),
        ]
    return [message for failed, message in checks if failed]


def _one_line_repr(value: Any) -> str:
    """repr() squeezed onto one line, so error messages stay one line."""
    return ' '.join(repr(value).split())
