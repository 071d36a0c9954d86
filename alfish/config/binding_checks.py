"""Checking gin's bindings: every value bound to an alfish configurable must fit its parameter (value_checks).

Each problem names the binding as a conf writes it, the value as given (and what a ``%macro`` in it stands for) and
what is expected; `first_problem_summary` puts the first of them, and where the others are, on one line.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Optional, Sequence

from gin import config as gin_config

from alfish.config.gin_names import binding_key
from alfish.config.value_checks import UNKNOWN, Instance, nested_items, parameters_of, resolve

_MAX_VALUE_CHARS = 80
_MAX_LISTED_OTHERS = 3


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
                binding = binding_key(scope, selector, param)
                problems.append(BindingProblem(scope, selector, param,
                                               problem.message(binding, _value_text(raw, config)), _macro_name(raw)))
    return problems


def _is_alfish(wrapped: Any) -> bool:
    module = getattr(wrapped, '__module__', '') or ''
    return module == 'alfish' or module.startswith('alfish.')


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
    return any(_macro_name(item) is not None for item in nested_items(raw))


def _plain_repr(value: Any) -> str:
    """repr of a resolved value, with references written back as '@Name' / '@Name()'."""
    if isinstance(value, Instance):
        return f'@{value.cls.__name__}()'
    if value is UNKNOWN:
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
