"""Typed, ranged config values: each binding of an alfish configurable is checked before anything is built.

A value is checked against its parameter's annotation (int, float, bool, str, ``Optional``, ``Literal``, sequences,
tuples, dicts, schedules, classes) and against the rules of ``RULES``: the range of a number, the fixed set of a
string. So ``SacAlgorithm.actor_lr = 'fast'`` or ``TrainerConfig.num_iterations = 3.5`` fails when the conf is loaded,
with one line naming the binding, the value given and what is expected, instead of deep inside the first update.

Ranges live in ``RULES`` here, one table for every configurable, rather than as ``Annotated[...]`` metadata on each
signature: the whole set can be read (and reviewed) in one place, the signatures stay plain, and a parameter shared
by all algorithms (``gamma``, ``hidden_sizes``) is declared once with a ``*.`` key. Sets of strings come from the
tuples the code itself validates against (``VECTORIZATIONS``, ``ACTIVATIONS``, ...), read when first needed, so the
table cannot drift from the code and importing this module imports none of those packages.

What is not checked: a reference that is called (``@name()``) to a function, whose result is known only after the
call; values of configurables defined outside alfish (their annotations are not ours to enforce).
"""
from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import functools
import importlib
import inspect
import math
import re
import types
import typing
from typing import Any, Callable, Iterator, Optional, Sequence, Union

from gin import config as gin_config

# ---------------------------------------------------------------------------------------------------------------------
# Rules


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
    '*.value_lr': POSITIVE,
    'IqlAlgorithm.expectile': Range(0, 1, low_open=True, high_open=True),
    'IqlAlgorithm.weight_temp': NON_NEGATIVE,
    'IqlAlgorithm.max_weight': POSITIVE,
    'OfflineData.offline_fraction': PROBABILITY,
    'OfflineData.in_memory_limit_mb': NON_NEGATIVE,
    '*.hidden_sizes': AT_LEAST_ONE,
    '*.activation': OneOf('alfish.networks.mlp:ACTIVATIONS'),
    '*.target_update_tau': DISCOUNT,
    '*.target_update_period': AT_LEAST_ONE,
    '*.gae_lambda': PROBABILITY,
    '*.value_loss_coef': NON_NEGATIVE,
    '*.entropy_coef': NON_NEGATIVE,
    '*.clip_range': POSITIVE,
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
    'AmpPolicy.dtype': OneOf('alfish.learn.amp:DTYPES'),
    'AmpPolicy.max_consecutive_skips': AT_LEAST_ONE,
    'init_distributed.backend': OneOf('alfish.learn.distributed:BACKENDS'),
    'init_distributed.timeout_s': Range(0, low_open=True, note='seconds'),
    'Learner.finite_check_interval': AT_LEAST_ONE,
    'Trainer.num_threads': (AT_LEAST_ONE, OneOf(('auto',))),
    'Trainer.progress_log_interval_s': Range(0, low_open=True, note='seconds'),
    'Trainer.host_memory_cache_mb': Range(0, note='MB; 0: malloc defaults'),
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
}

# Configurables whose int parameters also take a whole float such as 1e6: ALF confs write TrainerConfig's step counts
# that way, and TrainerConfig stores them as ints.
WHOLE_FLOAT_INTS: frozenset[str] = frozenset({'TrainerConfig'})

_MAX_VALUE_CHARS = 80
_MAX_LISTED_OTHERS = 3


def rules_for(name: str, param: str) -> tuple[Rule, ...]:
    """The rules of parameter `param` of the configurable registered as `name` (its last selector component)."""
    rules = RULES.get(f'{name}.{param}', RULES.get(f'*.{param}', ()))
    return rules if isinstance(rules, tuple) else (rules,)


@functools.lru_cache(maxsize=None)
def _named_choices(spec: str) -> tuple[str, ...]:
    """The strings of the tuple (or the keys of the dict) named 'module:NAME'."""
    module, name = spec.split(':')
    return tuple(getattr(importlib.import_module(module), name))


# ---------------------------------------------------------------------------------------------------------------------
# Checking one value


@dataclasses.dataclass(frozen=True)
class ValueProblem:
    """A value that does not fit its parameter. `expected` completes "expected ..."; `hint` (may be '') follows it.

    `type_ok` is True when only a rule (a range or a set of strings) failed, so the value can still be compared.
    """

    expected: str
    hint: str
    type_ok: bool

    def message(self, binding: str, value_text: str) -> str:
        """'<binding> = <value>: expected <what>[; <hint>]' on one line."""
        return f'{binding} = {value_text}: expected {self.expected}{self.hint}'


@dataclasses.dataclass(frozen=True)
class _Instance:
    """What a called reference to a class (``@Name()``) gives: an instance of `cls`, known before the call."""

    cls: type


class _Unknown:
    """A value that cannot be known before it is built (a called reference to a function, a gin constant)."""


_UNKNOWN = _Unknown()


@dataclasses.dataclass(frozen=True)
class Parameter:
    """A parameter of a configurable: the name a conf uses for its owner, its annotation, default and rules."""

    owner: str
    name: str
    annotation: Any
    default: Any
    rules: tuple[Rule, ...]
    whole_floats: bool

    def problem(self, value: Any) -> Optional[ValueProblem]:
        """Why `value` (gin references resolved, see `resolve`) does not fit; None when it does."""
        checker = _Checker(self.rules, self.whole_floats)
        if checker.accepts(value, self.annotation):
            return None
        type_ok = checker.accepts(value, self.annotation, ignore_rules=True)
        return ValueProblem(self.expectation(), self._hint(value, checker), type_ok)

    def _hint(self, value: Any, checker: _Checker) -> str:
        """What most likely went wrong: the closest valid string; the parentheses an uncalled reference lacks."""
        choices = (checker.one_of.values() if checker.one_of else ()) + _literal_strings(self.annotation)
        if isinstance(value, str) and choices:
            close = difflib.get_close_matches(value.lower(), [c.lower() for c in choices], n=1, cutoff=0.6)
            if close:
                return f"; did you mean '{next(c for c in choices if c.lower() == close[0])}'?"
        if inspect.isclass(value) and checker.accepts(_Instance(value), self.annotation):
            return f'; @{value.__name__} is the class itself: write @{value.__name__}() to make one'
        return ''

    def expectation(self) -> str:
        """What the parameter takes, in words: 'an int >= 1', 'a number in (0, 1] or a schedule (...)', ..."""
        text = _Describer(self.rules).describe(self.annotation)
        if _is_sequence_annotation(self.annotation) and isinstance(self.default, (list, tuple)) and self.default:
            text += f', e.g. {self.default!r}'
        notes = [r.note for r in self.rules if isinstance(r, Range) and r.note]
        return text + ''.join(f' ({note})' for note in notes)


def parameters_of(fn: Callable[..., Any], owner: str) -> dict[str, Parameter]:
    """The parameters of `fn` (a function or a class) with their resolved annotations and the rules for `owner`."""
    return dict(_parameters_of(fn, owner))


@functools.lru_cache(maxsize=None)
def _parameters_of(fn: Callable[..., Any], owner: str) -> tuple[tuple[str, Parameter], ...]:
    target = gin_config._find_class_construction_fn(fn) if inspect.isclass(fn) else fn
    target = inspect.unwrap(target)
    hints = _type_hints(target)
    result = []
    for name, parameter in inspect.signature(target).parameters.items():
        if name in ('self', 'cls') or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        default = None if parameter.default is inspect.Parameter.empty else parameter.default
        annotation = hints.get(name, Any)
        if parameter.default is None:  # `x: Space = None` means Optional[Space], as PEP 484 once read it
            annotation = Optional[annotation]
        result.append((name, Parameter(owner, name, annotation, default, rules_for(owner, name),
                                       owner in WHOLE_FLOAT_INTS)))
    return tuple(result)


def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """`fn`'s annotations, evaluated (they are strings under `from __future__ import annotations`).

    An annotation that cannot be evaluated (a name imported only for type checkers) is left out: it checks nothing.
    The annotations are alfish's own source text, never a conf's, so evaluating them runs nothing from outside.
    """
    try:
        return typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - any failure of one annotation must not hide the others
        pass
    hints = {}
    namespace = getattr(fn, '__globals__', {})
    for name, annotation in getattr(fn, '__annotations__', {}).items():
        try:
            hints[name] = eval(annotation, namespace) if isinstance(annotation, str) else annotation  # noqa: S307
        except Exception:  # noqa: BLE001
            continue
    return hints


def resolve(value: Any, config: dict, seen: frozenset[str] = frozenset()) -> Any:
    """`value` as bound in gin's `config`, with macros replaced by their values and references by what they give:
    an uncalled ``@Name`` gives the configurable itself, a called ``@Name()`` of a class an `_Instance`, anything
    whose result is known only when built `_UNKNOWN`."""
    if isinstance(value, gin_config.ConfigurableReference):
        wrapped = value.configurable.wrapped
        if wrapped is gin_config.macro and value.evaluate:
            name = '/'.join(value.scopes)
            bound = config.get((name, value.configurable.selector), {})
            if name in seen or 'value' not in bound:
                return _UNKNOWN  # a cycle or an undefined macro: reported elsewhere (gin, _check_macros_defined)
            return resolve(bound['value'], config, seen | {name})
        if not value.evaluate:
            return wrapped
        return _Instance(wrapped) if inspect.isclass(wrapped) else _UNKNOWN
    if isinstance(value, (list, tuple)):
        items = [resolve(v, config, seen) for v in value]
        return type(value)(items) if type(value) in (list, tuple) else items
    if isinstance(value, dict):
        return {resolve(k, config, seen): resolve(v, config, seen) for k, v in value.items()}
    return value


class _Checker:
    """Whether a value fits an annotation, applying `rules` to the numbers and strings found in it."""

    def __init__(self, rules: tuple[Rule, ...], whole_floats: bool) -> None:
        self.range = next((r for r in rules if isinstance(r, Range)), None)
        self.one_of = next((r for r in rules if isinstance(r, OneOf)), None)
        self.whole_floats = whole_floats

    def accepts(self, value: Any, annotation: Any, ignore_rules: bool = False) -> bool:
        if value is _UNKNOWN or annotation in (Any, object, inspect.Parameter.empty):
            return True
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin in (Union, types.UnionType):
            return any(self.accepts(value, a, ignore_rules) for a in args)
        if annotation in (None, type(None)):
            return value is None
        if origin is typing.Literal:
            return not isinstance(value, _Instance) and value in args
        if isinstance(value, _Instance):
            return self._instance_accepts(value.cls, annotation, origin)
        if annotation is bool:
            return isinstance(value, bool)
        if annotation in (int, float):
            return self._number_accepts(value, annotation, ignore_rules)
        if annotation is str:
            return isinstance(value, str) and (ignore_rules or self.one_of is None or self.one_of.contains(value))
        if origin in _SEQUENCE_ORIGINS or annotation in _SEQUENCE_ORIGINS:
            return self._sequence_accepts(value, origin or annotation, args, ignore_rules)
        if origin in _MAPPING_ORIGINS or annotation in _MAPPING_ORIGINS:
            return isinstance(value, dict) and (len(args) != 2 or all(
                self.accepts(k, args[0], ignore_rules) and self.accepts(v, args[1], ignore_rules)
                for k, v in value.items()))
        if origin is collections.abc.Callable or annotation is collections.abc.Callable:
            return callable(value)
        if origin is type:
            return inspect.isclass(value) and (not args or not inspect.isclass(args[0])
                                               or issubclass(value, args[0]))
        if inspect.isclass(annotation):
            return isinstance(value, annotation)
        return True  # a form this checker does not know (a TypeVar, a Protocol, ...): nothing to check

    def _number_accepts(self, value: Any, annotation: type, ignore_rules: bool) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if annotation is int and isinstance(value, float) and not (self.whole_floats and value.is_integer()):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        return ignore_rules or self.range is None or self.range.contains(value)

    def _sequence_accepts(self, value: Any, origin: Any, args: tuple, ignore_rules: bool) -> bool:
        # A string is a sequence too, but never what a parameter asking for a sequence of other things means.
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            return len(value) == len(args) and all(self.accepts(v, a, ignore_rules) for v, a in zip(value, args))
        return not args or all(self.accepts(v, args[0], ignore_rules) for v in value)

    @staticmethod
    def _instance_accepts(cls: type, annotation: Any, origin: Any) -> bool:
        if origin in _SEQUENCE_ORIGINS or annotation in _SEQUENCE_ORIGINS:
            return issubclass(cls, (list, tuple))
        if origin in _MAPPING_ORIGINS or annotation in _MAPPING_ORIGINS:
            return issubclass(cls, dict)
        if origin is collections.abc.Callable or annotation is collections.abc.Callable:
            return any('__call__' in vars(k) for k in cls.__mro__ if k is not object)
        if origin is type:
            return False
        target = origin or annotation
        return issubclass(cls, target) if inspect.isclass(target) else True


_SEQUENCE_ORIGINS = (collections.abc.Sequence, collections.abc.MutableSequence, list, tuple)
_MAPPING_ORIGINS = (collections.abc.Mapping, collections.abc.MutableMapping, dict)


def _literal_strings(annotation: Any) -> tuple[str, ...]:
    """The strings of the Literal[...] in `annotation` (also inside a Union)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (Union, types.UnionType):
        return tuple(s for a in args for s in _literal_strings(a))
    return tuple(a for a in args if isinstance(a, str)) if origin is typing.Literal else ()


def _is_sequence_annotation(annotation: Any) -> bool:
    """True for Sequence[...] / tuple[...] / list[...], also inside Optional[...]."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return any(_is_sequence_annotation(a) for a in typing.get_args(annotation))
    return origin in _SEQUENCE_ORIGINS or annotation in _SEQUENCE_ORIGINS


class _Describer:
    """An annotation (with its rules) in words: 'an int >= 1', 'a list or tuple of ints >= 1', ..."""

    def __init__(self, rules: tuple[Rule, ...]) -> None:
        self.range = next((r for r in rules if isinstance(r, Range)), None)
        self.one_of = next((r for r in rules if isinstance(r, OneOf)), None)

    def describe(self, annotation: Any, plural: bool = False) -> str:
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin in (Union, types.UnionType):
            members = [a for a in args if a is not type(None)]
            if set(members) == {int, float}:  # int | float: 'a number'
                members = [float]
            parts = [self.describe(m, plural) for m in members] + (['None'] if type(None) in args else [])
            return _join_or(parts)
        if annotation in (None, type(None)):
            return 'None'
        if origin is typing.Literal:
            return 'one of ' + ', '.join(repr(a) for a in args)
        if annotation is bool:
            return 'True or False' if not plural else 'bools (True or False)'
        if annotation in (int, float):
            noun = ('ints' if plural else 'an int') if annotation is int else ('numbers' if plural else 'a number')
            bound = self.range.text() if self.range else ''
            return f'{noun} {bound}' if bound else noun
        if annotation is str:
            if self.one_of is not None:
                return self.one_of.text()
            return 'strings' if plural else 'a string'
        if origin in _SEQUENCE_ORIGINS or annotation in _SEQUENCE_ORIGINS:
            prefix = 'lists or tuples' if plural else 'a list or tuple'
            if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
                shape = '(' + ', '.join(_short_name(a) for a in args) + ')'
                noun = 'pair' if len(args) == 2 else 'tuple'
                return f'{shape} {noun}s' if plural else f'a {noun} {shape}'
            return f'{prefix} of {self.describe(args[0], plural=True)}' if args else prefix
        if origin in _MAPPING_ORIGINS or annotation in _MAPPING_ORIGINS:
            return 'dicts' if plural else 'a dict'
        if origin is collections.abc.Callable and args == ([], float):  # how a module that must not import
            return _class_text(_SCHEDULE, plural)                       # torch writes "a schedule"
        if origin is collections.abc.Callable or annotation is collections.abc.Callable:
            return 'callables' if plural else 'a callable (e.g. @Name)'
        if inspect.isclass(annotation):
            return _class_text(annotation, plural)
        return 'anything'


_SCHEDULE = 'schedule'


def _class_text(cls: Union[type, str], plural: bool) -> str:
    """'a schedule (e.g. @LinearScheduler())' for alfish's Scheduler, else 'a <Class>'."""
    if cls is _SCHEDULE or (cls.__name__ == 'Scheduler' and cls.__module__.startswith('alfish.schedulers')):
        return 'schedules' if plural else 'a schedule (e.g. @LinearScheduler())'
    article = 'an' if cls.__name__[:1].lower() in 'aeiou' else 'a'
    return f'{cls.__name__} objects' if plural else f'{article} {cls.__name__}'


def _short_name(annotation: Any) -> str:
    """A type in a tuple's description: 'int', 'number', 'str', ..."""
    args = set(typing.get_args(annotation))
    if annotation is float or args == {int, float}:
        return 'number'
    return getattr(annotation, '__name__', str(annotation))


def _join_or(parts: Sequence[str]) -> str:
    return parts[0] if len(parts) == 1 else ', '.join(parts[:-1]) + ' or ' + parts[-1]


def _num(number: float) -> str:
    return f'{number:g}'


# ---------------------------------------------------------------------------------------------------------------------
# Checking gin's bindings


@dataclasses.dataclass(frozen=True)
class BindingProblem:
    """A bound value that does not fit: the binding (scope, selector, param), its message, and the macro (if the value
    is one, ``%name``) whose definition holds the bad value."""

    scope: str
    selector: str
    param: str
    message: str
    macro: Optional[str]


def binding_problems() -> list[BindingProblem]:
    """Every binding of an alfish configurable in gin's current config whose value does not fit its parameter."""
    config = gin_config._CONFIG
    problems = []
    for (scope, selector), params in list(config.items()):
        configurable = gin_config._REGISTRY.get(selector)
        if configurable is None or not _is_alfish(configurable.wrapped):
            continue
        owner = selector.split('.')[-1]
        parameters = parameters_of(configurable.wrapped, owner)
        for param, raw in params.items():
            parameter = parameters.get(param)
            if parameter is None:
                continue
            problem = parameter.problem(resolve(raw, config))
            if problem is not None:
                binding = _binding_name(scope, selector, param)
                problems.append(BindingProblem(scope, selector, param,
                                               problem.message(binding, _value_text(raw, config)), _macro_name(raw)))
    return problems


def _is_alfish(wrapped: Any) -> bool:
    module = getattr(wrapped, '__module__', '') or ''
    return module == 'alfish' or module.startswith('alfish.')


def _binding_name(scope: str, selector: str, param: str) -> str:
    """How a conf writes the binding: 'scope/Name.param'."""
    name = gin_config._REGISTRY.minimal_selector(selector)
    return f'{scope}/{name}.{param}' if scope else f'{name}.{param}'


def _macro_name(raw: Any) -> Optional[str]:
    if isinstance(raw, gin_config.ConfigurableReference) and raw.configurable.wrapped is gin_config.macro:
        return '/'.join(raw.scopes)
    return None


def _value_text(raw: Any, config: dict) -> str:
    """The value as the conf wrote it (gin's repr keeps '@Name()' and '%macro'), plus what a macro stands for."""
    text = _shorten(repr(raw))
    if _contains_macro(raw):
        text += f' = {_shorten(_plain_repr(resolve(raw, config)))}'
    return text


def _contains_macro(raw: Any) -> bool:
    return any(_macro_name(item) is not None for item in _walk(raw))


def _walk(value: Any) -> Iterator[Any]:
    yield value
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _walk(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(key)
            yield from _walk(item)


def _plain_repr(value: Any) -> str:
    """repr of a resolved value, with references written back as '@Name' / '@Name()'."""
    if isinstance(value, _Instance):
        return f'@{value.cls.__name__}()'
    if value is _UNKNOWN:
        return '<built when used>'
    if inspect.isclass(value) or inspect.isfunction(value):
        return f'@{value.__name__}'
    if isinstance(value, (list, tuple)):
        inner = ', '.join(_plain_repr(v) for v in value)
        return f'[{inner}]' if isinstance(value, list) else f'({inner}{"," if len(value) == 1 else ""})'
    return repr(value)


def _shorten(text: str) -> str:
    text = ' '.join(text.split())
    return text if len(text) <= _MAX_VALUE_CHARS else text[:_MAX_VALUE_CHARS - 3] + '...'


def first_problem_summary(problems: Sequence[tuple[str, str]]) -> str:
    """'<where>: <message>' of the first (where, message) pair, plus where the others are, on one line."""
    (where, message), others = problems[0], problems[1:]
    text = f'{where}: {message}'
    if others:
        listed = ', '.join(w for w, _ in others[:_MAX_LISTED_OTHERS])
        more = ', ...' if len(others) > _MAX_LISTED_OTHERS else ''
        text += f' (and {len(others)} more bad value{"s" if len(others) > 1 else ""}: {listed}{more})'
    return text
