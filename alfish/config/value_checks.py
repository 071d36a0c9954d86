"""Typed, ranged config values: whether a value fits its parameter's annotation and rules, and what it expects.

A value is checked against its parameter's annotation (int, float, bool, str, ``Optional``, ``Literal``, sequences,
tuples, dicts, schedules, classes) and against its rules (``alfish.config.value_rules.RULES``: the range of a
number, the fixed set of a string). So ``SacAlgorithm.actor_lr = 'fast'`` or ``TrainerConfig.num_iterations = 3.5``
fails when the conf is loaded, with one line naming the binding, the value given and what is expected, instead of
deep inside the first update. Applying this to every binding of gin's config is ``alfish.config.binding_checks``'s.

What is not checked: a reference that is called (``@name()``) to a function, whose result is known only after the
call; values of configurables defined outside alfish (their annotations are not ours to enforce).
"""
from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import functools
import inspect
import math
import types
import typing
from typing import Any, Callable, Iterator, Optional, Sequence, Union

from gin import config as gin_config

from alfish.config.value_rules import WHOLE_FLOAT_INTS, OneOf, Range, Rule, rules_for


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
class Instance:
    """What a called reference to a class (``@Name()``) gives: an instance of `cls`, known before the call."""

    cls: type


class _Unknown:
    """A value that cannot be known before it is built (a called reference to a function, a gin constant)."""


UNKNOWN = _Unknown()


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
        if isinstance(value, str) and value in choices and _is_sequence_annotation(self.annotation):
            return f"; write [{value!r}]: a list, even of one"  # (a valid element given where a list is expected)
        if isinstance(value, str) and choices:
            close = difflib.get_close_matches(value.lower(), [c.lower() for c in choices], n=1, cutoff=0.6)
            if close:
                return f"; did you mean '{next(c for c in choices if c.lower() == close[0])}'?"
        if inspect.isclass(value) and checker.accepts(Instance(value), self.annotation):
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
    an uncalled ``@Name`` gives the configurable itself, a called ``@Name()`` of a class an `Instance`, anything
    whose result is known only when built `UNKNOWN`."""
    if isinstance(value, gin_config.ConfigurableReference):
        wrapped = value.configurable.wrapped
        if wrapped is gin_config.macro and value.evaluate:
            name = '/'.join(value.scopes)
            bound = config.get((name, value.configurable.selector), {})
            if name in seen or 'value' not in bound:
                return UNKNOWN  # a cycle or an undefined macro: reported elsewhere (gin, loading's macro check)
            return resolve(bound['value'], config, seen | {name})
        if not value.evaluate:
            return wrapped
        return Instance(wrapped) if inspect.isclass(wrapped) else UNKNOWN
    if isinstance(value, (list, tuple)):
        items = [resolve(v, config, seen) for v in value]
        return type(value)(items) if type(value) in (list, tuple) else items
    if isinstance(value, dict):
        return {resolve(k, config, seen): resolve(v, config, seen) for k, v in value.items()}
    return value


def nested_items(value: Any) -> Iterator[Any]:
    """`value` and everything nested in it (list, tuple and dict items, dict keys included), depth first: a bound
    value as gin parsed it, or as a restricted parse records it (``alfish.config.untrusted``)."""
    yield value
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from nested_items(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from nested_items(key)
            yield from nested_items(item)


class _Checker:
    """Whether a value fits an annotation, applying `rules` to the numbers and strings found in it."""

    def __init__(self, rules: tuple[Rule, ...], whole_floats: bool) -> None:
        self.range = next((r for r in rules if isinstance(r, Range)), None)
        self.one_of = next((r for r in rules if isinstance(r, OneOf)), None)
        self.whole_floats = whole_floats

    def accepts(self, value: Any, annotation: Any, ignore_rules: bool = False) -> bool:
        if value is UNKNOWN or annotation in (Any, object, inspect.Parameter.empty):
            return True
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin in (Union, types.UnionType):
            return any(self.accepts(value, a, ignore_rules) for a in args)
        if annotation in (None, type(None)):
            return value is None
        if origin is typing.Literal:
            return not isinstance(value, Instance) and value in args
        if isinstance(value, Instance):
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
