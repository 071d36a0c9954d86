"""The ranges and fixed sets of strings of alfish's configurable parameters, in one table (`RULES`).

Ranges live in ``RULES`` here, one table for every configurable, rather than as ``Annotated[...]`` metadata on each
signature: the whole set can be read (and reviewed) in one place, the signatures stay plain, and a parameter shared
by all algorithms (``gamma``, ``hidden_sizes``) is declared once with a ``*.`` key. Sets of strings come from the
tuples the code itself validates against (``VECTORIZATIONS``, ``ACTIVATIONS``, ...), read when first needed, so the
table cannot drift from the code and importing this module imports none of those packages.

The checks that apply these rules to a value are ``alfish.config.value_checks``'s.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import re
from typing import Optional, Union


@dataclasses.dataclass(frozen=True)
class Range:
    """Numbers from `low` to `high` (either may be None: unbounded); `*_open` excludes the bound itself.

    Applies to every number in the value: a count, each size in ``hidden_sizes``, each of Adam's ``betas``.
    `note` says what the number means, e.g. '0: no limit'.
    """

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False
    note: str = ''

    def contains(self, number: float) -> bool:
        """True when `number` lies in the range."""
        if self.low is not None and (number < self.low or (self.low_open and number == self.low)):
            return False
        return self.high is None or not (number > self.high or (self.high_open and number == self.high))

    def text(self) -> str:
        """'>= 1', '> 0', 'in (0, 1]', ... ('' for an unbounded range)."""
        if self.low is not None and self.high is not None:
            left, right = '(' if self.low_open else '[', ')' if self.high_open else ']'
            return f"in {left}{_num(self.low)}, {_num(self.high)}{right}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {_num(self.low)}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {_num(self.high)}"
        return ''


@dataclasses.dataclass(frozen=True)
class OneOf:
    """Strings from a fixed set: `choices` itself, or 'module:NAME' of the tuple (or dict) the code checks against.

    `pattern` (a regex) also admits strings the set cannot list, shown as `pattern_text` (e.g. 'cuda:N').
    """

    choices: Union[tuple[str, ...], str]
    pattern: str = ''
    pattern_text: str = ''

    def values(self) -> tuple[str, ...]:
        """The valid strings (imports the module named by 'module:NAME' when first asked)."""
        if isinstance(self.choices, tuple):
            return self.choices
        return _named_choices(self.choices)

    def contains(self, text: str) -> bool:
        """True for one of the choices, or a string matching `pattern`."""
        return text in self.values() or bool(self.pattern and re.fullmatch(self.pattern, text))

    def text(self) -> str:
        """"one of 'a', 'b'" (with `pattern_text` last), or just "'a'" for a single choice."""
        shown = [repr(c) for c in self.values()] + ([repr(self.pattern_text)] if self.pattern_text else [])
        return shown[0] if len(shown) == 1 else 'one of ' + ', '.join(shown)


Rule = Union[Range, OneOf]


# Common ranges.
POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
AT_LEAST_ONE = Range(1)
PROBABILITY = Range(0, 1)
DISCOUNT = Range(0, 1, low_open=True)


# (Configurable name).(parameter) -> its rule(s). 'Name' is the configurable's registered name (as a conf writes it);
# '*.param' applies to that parameter of every alfish configurable, unless 'Name.param' has its own entry. A tuple
# holds one rule per kind of value (a Range for the numbers, a OneOf for the strings).
RULES: dict[str, Union[Rule, tuple[Rule, ...]]] = {
    # TrainerConfig (its cross-field rules, e.g. unroll_length = 0 only with async_unroll, stay in trainer_config.py).
    'TrainerConfig.num_iterations': Range(0, note='0: no limit from iterations'),
    'TrainerConfig.num_env_steps': Range(0, note='0: no limit from env steps'),
    'TrainerConfig.unroll_length': Range(0, note='env steps per env per iteration'),
    'TrainerConfig.max_unroll_length': Range(0, note='0: no limit'),
    'TrainerConfig.unroll_queue_size': AT_LEAST_ONE,
    'TrainerConfig.unroll_step_interval': Range(0, note='seconds between env steps'),
    'TrainerConfig.unroll_parameter_update_period': AT_LEAST_ONE,
    'TrainerConfig.num_checkpoints': Range(0, note='0: no checkpoints'),
    'TrainerConfig.num_evals': AT_LEAST_ONE,
    'TrainerConfig.eval_interval': NON_NEGATIVE,  # >= 1 when evaluate=True (a cross-field rule)
    'TrainerConfig.epsilon_greedy': PROBABILITY,
    'TrainerConfig.num_eval_episodes': NON_NEGATIVE,  # >= 1 when evaluate=True
    'TrainerConfig.num_eval_environments': NON_NEGATIVE,  # >= 1 when evaluate=True
    'TrainerConfig.ddp_paras_check_interval': Range(0, note='iterations; 0: never'),
    'TrainerConfig.num_summaries': AT_LEAST_ONE,
    'TrainerConfig.summary_interval': Range(1, note='iterations'),
    'TrainerConfig.summaries_flush_secs': Range(0, low_open=True, note='seconds'),
    'TrainerConfig.summary_max_queue': AT_LEAST_ONE,
    'TrainerConfig.metric_min_buffer_size': Range(1, note='episodes'),
    'TrainerConfig.initial_collect_steps': Range(0, note='env steps before training'),
    'TrainerConfig.num_updates_per_train_iter': AT_LEAST_ONE,
    'TrainerConfig.mini_batch_length': AT_LEAST_ONE,
    'TrainerConfig.mini_batch_size': AT_LEAST_ONE,
    'TrainerConfig.replay_buffer_length': AT_LEAST_ONE,
    'TrainerConfig.offline_buffer_length': Range(2, note='steps loaded from each offline source'),
    'TrainerConfig.rl_train_after_update_steps': Range(0, note='iterations of offline training first'),
    'TrainerConfig.rl_train_every_update_steps': AT_LEAST_ONE,
    'TrainerConfig.priority_replay_alpha': NON_NEGATIVE,
    'TrainerConfig.priority_replay_beta': NON_NEGATIVE,
    'TrainerConfig.priority_replay_eps': NON_NEGATIVE,
    # Algorithms and networks.
    '*.gamma': DISCOUNT,
    '*.lr': POSITIVE,
    '*.actor_lr': POSITIVE,
    '*.critic_lr': POSITIVE,
    '*.alpha_lr': POSITIVE,
    'SacAlgorithm.ent_coef': Range(0, low_open=True, note='the fixed entropy temperature alpha; None: learned'),
    'SacAlgorithm.discrete_target_entropy': Range(0, note="nats, a mixed action's discrete part: at most log(n)"),
    '*.value_lr': POSITIVE,
    'IqlAlgorithm.expectile': Range(0, 1, low_open=True, high_open=True),
    'IqlAlgorithm.weight_temp': NON_NEGATIVE,
    'IqlAlgorithm.max_weight': POSITIVE,
    'OfflineData.offline_fraction': PROBABILITY,
    'OfflineData.in_memory_limit_mb': NON_NEGATIVE,
    '*.hidden_sizes': AT_LEAST_ONE,
    '*.actor_hidden_sizes': AT_LEAST_ONE,
    '*.critic_hidden_sizes': AT_LEAST_ONE,
    '*.activation': OneOf('alfish.networks.mlp:ACTIVATIONS'),
    '*.target_update_tau': DISCOUNT,
    '*.target_update_period': AT_LEAST_ONE,
    '*.gae_lambda': PROBABILITY,
    '*.value_loss_coef': NON_NEGATIVE,
    '*.entropy_coef': NON_NEGATIVE,
    '*.clip_range': POSITIVE,
    'PpoAlgorithm.clip_range_vf': Range(0, low_open=True, note='in units of the value; None: no clipping'),
    'PpoAlgorithm.target_kl': Range(0, low_open=True, note='None: no early stop'),
    '*.n_step': AT_LEAST_ONE,
    '*.num_critics': AT_LEAST_ONE,
    '*.epsilon_greedy': PROBABILITY,
    '*.exploration_noise': NON_NEGATIVE,
    '*.target_policy_noise': NON_NEGATIVE,
    '*.target_noise_clip': NON_NEGATIVE,
    '*.policy_delay': AT_LEAST_ONE,
    '*.output_gain': POSITIVE,
    '*.dropout': Range(0, 1, high_open=True, note='a probability'),
    'EncodingNetwork.conv_layers': (AT_LEAST_ONE, OneOf('alfish.networks.encoding:CONV_PRESETS')),
    'EncodingNetwork.fc_layers': AT_LEAST_ONE,
    'EncodingNetwork.key_fc_layers': AT_LEAST_ONE,
    'EncodingNetwork.rnn': OneOf('alfish.networks.encoding:RNN_KINDS'),
    'EncodingNetwork.rnn_size': AT_LEAST_ONE,
    'EncodingNetwork.memory_format': OneOf('alfish.networks.encoding:MEMORY_FORMATS'),
    # Envs.
    'create_environment.num_parallel_environments': AT_LEAST_ONE,
    'create_environment.seed': NON_NEGATIVE,
    'create_environment.vectorization': OneOf('alfish.envs.batched_env:VECTORIZATIONS'),
    'create_environment.step_timeout_s': Range(0, low_open=True, note='seconds'),
    # Learning: optimizer, devices, precision, distribution, run options.
    'OptimizerConfig.betas': Range(0, 1, high_open=True),
    'OptimizerConfig.eps': POSITIVE,
    'OptimizerConfig.weight_decay': NON_NEGATIVE,
    'OptimizerConfig.max_grad_norm': POSITIVE,
    'OptimizerConfig.max_grad_value': POSITIVE,
    'OptimizerConfig.name': OneOf('alfish.learn.optim:OPTIMIZERS'),
    'OptimizerConfig.momentum': Range(0, 1, high_open=True),
    'OptimizerConfig.dampening': PROBABILITY,
    'OptimizerConfig.alpha': PROBABILITY,
    'DevicePolicy.device': OneOf(('auto', 'cpu', 'cuda'), pattern=r'cuda:\d+', pattern_text='cuda:N'),
    'DevicePolicy.rollout_device': OneOf(('auto', 'cpu', 'cuda'), pattern=r'cuda:\d+', pattern_text='cuda:N'),
    'DevicePolicy.replay_storage': OneOf('alfish.learn.device:REPLAY_STORAGES'),
    'DevicePolicy.matmul_precision': OneOf('alfish.learn.device:MATMUL_PRECISIONS'),
    'AmpPolicy.dtype': OneOf('alfish.learn.amp:DTYPES'),
    'AmpPolicy.max_consecutive_skips': AT_LEAST_ONE,
    'init_distributed.backend': OneOf('alfish.learn.distributed:BACKENDS'),
    'init_distributed.timeout_s': Range(0, low_open=True, note='seconds'),
    'init_distributed.checkpoint_timeout_s': Range(0, low_open=True, note='seconds'),
    'Learner.finite_check_interval': AT_LEAST_ONE,
    'Trainer.num_threads': (AT_LEAST_ONE, OneOf(('auto',))),
    'Trainer.progress_log_interval_s': Range(0, low_open=True, note='seconds'),
    'Trainer.stop_grace_s': Range(0, low_open=True, note='seconds after SIGTERM before the process ends anyway'),
    'Trainer.host_memory_cache_mb': Range(0, note='MB; 0: malloc defaults'),
    'Trainer.trackers': OneOf('alfish.rundir.trackers.names:TRACKERS'),
    'wandb_tracker.mode': OneOf('alfish.rundir.trackers.settings:WANDB_MODES'),
    # Schedules.
    '*.progress_type': OneOf('alfish.schedulers.progress:PROGRESS_TYPES'),
    'CyclicalScheduler.mode': OneOf('alfish.schedulers.schedules:CYCLE_MODES'),
    'CyclicalScheduler.period': POSITIVE,
    'ExponentialScheduler.decay_rate': POSITIVE,
    'ExponentialScheduler.decay_time': POSITIVE,
    # Data transformers.
    'FrameStacker.stack_size': AT_LEAST_ONE,
    'HindsightExperienceTransformer.her_proportion': PROBABILITY,
    'sparse_goal_reward.tolerance': NON_NEGATIVE,
    'ObservationNormalizer.update_mode': OneOf(('rollout', 'replay')),
    'ObservationNormalizer.clip_value': POSITIVE,
    'ObservationNormalizer.epsilon': POSITIVE,
    'RewardNormalizer.clip_value': POSITIVE,
    'RewardNormalizer.epsilon': POSITIVE,
    'RewardNormalizer.gamma': Range(0, 1, low_open=True, note="VecNormalize's return discount; None: the rewards' std"),
}


# Configurables whose int parameters also take a whole float such as 1e6: ALF confs write TrainerConfig's step counts
# that way, and TrainerConfig stores them as ints.
WHOLE_FLOAT_INTS: frozenset[str] = frozenset({'TrainerConfig'})


def rules_for(name: str, param: str) -> tuple[Rule, ...]:
    """The rules of parameter `param` of the configurable registered as `name` (its last selector component)."""
    rules = RULES.get(f'{name}.{param}', RULES.get(f'*.{param}', ()))
    return rules if isinstance(rules, tuple) else (rules,)


@functools.lru_cache(maxsize=None)
def _named_choices(spec: str) -> tuple[str, ...]:
    """The strings of the tuple (or the keys of the dict) named 'module:NAME'."""
    module, name = spec.split(':')
    return tuple(getattr(importlib.import_module(module), name))


def _num(number: float) -> str:
    return f'{number:g}'
