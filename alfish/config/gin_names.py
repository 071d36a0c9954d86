"""Names in gin's registry as a conf writes them: bindings, macros, parameters, and the closest valid name.

Every "did you mean" of alfish's conf errors comes from `suggest`, over the candidates listed here.
"""
from __future__ import annotations

import difflib
import inspect
from typing import Sequence

from gin import config as gin_config

# Selector prefix of gin's own builtins (macro, constant, singleton): valid names, but never useful suggestions.
_GIN_BUILTIN_PREFIX = 'gin.'
_MAX_LISTED_PARAMETERS = 12
# A suggestion needs this similarity (difflib ratio); others are listed only if nearly as similar as the best.
_SUGGEST_CUTOFF = 0.6
_SUGGEST_SPREAD = 0.05


def is_macro(selector: str) -> bool:
    """True for gin's macro configurable (`%name` references and `name = value` bindings)."""
    configurable = gin_config._REGISTRY.get(selector)
    return configurable is not None and configurable.wrapped is gin_config.macro


def binding_key(scope: str, selector: str, arg: str) -> str:
    """How a binding is written in a conf: 'scope/Name.param', or the macro's name for a macro."""
    if is_macro(selector):
        return scope
    name = gin_config._REGISTRY.minimal_selector(selector)
    return f'{scope}/{name}.{arg}' if scope else f'{name}.{arg}'


UNKNOWN_HINT = "; no registered configurable has a similar name (is the module that defines it imported?)"


def parameters_hint(parameters: Sequence[str]) -> str:
    """Lists the valid parameters when none is close to the misspelled one."""
    listed = ', '.join(parameters[:_MAX_LISTED_PARAMETERS])
    more = ', ...' if len(parameters) > _MAX_LISTED_PARAMETERS else ''
    return f"; its parameters are: {listed}{more}" if parameters else "; it takes no configurable parameters"


def suggest(name: str, candidates: Sequence[str], hint_if_none: str) -> str:
    """"; did you mean 'x'?" naming the closest candidate (case-insensitive; up to three when about as close).

    Returns `hint_if_none` when no candidate is similar enough.
    """
    by_lower = {c.lower(): c for c in candidates}
    scored = sorted(((difflib.SequenceMatcher(None, name.lower(), lower).ratio(), original)
                     for lower, original in by_lower.items()), key=lambda pair: (-pair[0], pair[1]))
    if not scored or scored[0][0] < _SUGGEST_CUTOFF:
        return hint_if_none
    best = scored[0][0]
    close = [original for score, original in scored[:3] if score >= best - _SUGGEST_SPREAD]
    quoted = [f"'{c}'" for c in close]
    options = quoted[0] if len(quoted) == 1 else ', '.join(quoted[:-1]) + ' or ' + quoted[-1]
    return f'; did you mean {options}?'


def configurable_candidates(name: str) -> list[str]:
    """Registered configurable names written the way `name` is (same number of dotted module components)."""
    depth = name.count('.') + 1
    names = set()
    for selector, _ in gin_config._REGISTRY.items():
        if selector.startswith(_GIN_BUILTIN_PREFIX):
            continue
        components = selector.split('.')
        if len(components) >= depth:
            names.add('.'.join(components[-depth:]))
    return sorted(names)


def parameter_names(selector: str) -> list[str]:
    """The parameters gin may bind for the configurable `selector` (respecting its allowlist/denylist)."""
    configurable = gin_config._REGISTRY.get_match(selector)
    if configurable is None:
        return []
    fn = configurable.wrapped
    if inspect.isclass(fn):
        fn = gin_config._find_class_construction_fn(fn)
    spec = inspect.getfullargspec(inspect.unwrap(fn))
    names = [n for n in spec.args + spec.kwonlyargs if n not in ('self', 'cls')]
    if configurable.allowlist:
        names = [n for n in names if n in configurable.allowlist]
    if configurable.denylist:
        names = [n for n in names if n not in configurable.denylist]
    return names
