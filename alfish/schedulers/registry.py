"""The weak registry of live schedules, each under a unique readable name, and `scheduler_summaries` listing them.

A schedule's name is, in order of preference: the `name` it was given; the gin binding whose reference built it
(``SacAlgorithm.actor_lr``, ``actor/Name.param``; a macro's name for ``EPSILON = @ExponentialScheduler()``); or its
class name with a number (``LinearScheduler#0``). Duplicate names get ``#1``, ``#2``, ...

The binding is found from the scope gin builds in (``gin.current_scope()`` when the schedule registers, at the end of
its constructor), without inspecting the call stack. gin builds ``@actor/Name()`` in exactly the scope ``actor`` (a
reference's scope replaces the enclosing one), and an unscoped ``@Name()`` in the scope it is building the binding's
configurable in. So a binding (scope, selector, param) is taken when it holds a reference to the schedule's class
whose scope, or if it has none the binding's own scope, equals the current scope, and no other binding does. Limits:
- several matching bindings give the class name, never a guess (``A.lr = @lr/LinearScheduler()`` and
  ``B.lr = @lr/LinearScheduler()``);
- an unscoped reference in a binding applied in a deeper scope (``SacAlgorithm.actor_lr = @LinearScheduler()`` with
  ``@sac/SacAlgorithm()``) is not recognised: the schedule gets its class name;
- a schedule built in Python (not by a reference) in the scope where gin builds one matching binding's reference takes
  that binding's name, e.g. ``LinearScheduler(...)`` called at the top level while the conf holds exactly one
  ``X.y = @LinearScheduler()``: give such a schedule a `name`.
"""
from __future__ import annotations

import itertools
import threading
import weakref
from typing import Callable

import gin
from gin import config as gin_config

# What the registry keeps: a schedule, i.e. a callable returning its current value (the registry sits below
# alfish.schedulers.schedules, which registers every schedule it builds here, so it does not import it back).
Scheduler = Callable[[], float]

_LOCK = threading.Lock()
# Unique name -> live schedule, in the order built (an entry goes when its schedule is garbage collected).
REGISTRY: weakref.WeakValueDictionary[str, Scheduler] = weakref.WeakValueDictionary()


def register(scheduler: Scheduler, name: str | None) -> str:
    """Records `scheduler` (weakly); returns its unique name: `name`, or else as the module docstring says."""
    base = name or _gin_binding_name(scheduler)
    numbered = (f'{base or type(scheduler).__name__}#{k}' for k in itertools.count(1 if base else 0))
    with _LOCK:
        unique = next(n for n in itertools.chain([base] if base else [], numbered) if n not in REGISTRY)
        REGISTRY[unique] = scheduler
    return unique


def unregister(scheduler: Scheduler) -> None:
    """Forgets `scheduler` (if it was recorded), e.g. a schedule that is part of another one."""
    with _LOCK:
        for name in [name for name, s in REGISTRY.items() if s is scheduler]:
            del REGISTRY[name]


def scheduler_summaries() -> dict[str, float]:
    """``{name: current value}`` (in the hyperparameter's own units) of every live schedule built, in the order built,
    for the trainer's summaries, e.g. ``summaries.scalars('schedule', scheduler_summaries(), iteration)``."""
    return {name: scheduler() for name, scheduler in list(REGISTRY.items())}


def _gin_binding_name(scheduler: Scheduler) -> str | None:
    """The binding of the gin config that built `scheduler` through a reference, as written in a conf; None when no
    binding or several match (see the module docstring)."""
    try:
        scope = '/'.join(gin.current_scope())
        found = {(binding_scope, selector, arg)
                 for (binding_scope, selector), params in list(gin_config._CONFIG.items())
                 for arg, value in list(params.items())
                 for reference in gin_config.iterate_references({arg: value})
                 if reference.configurable.wrapped is type(scheduler)
                 and scope == ('/'.join(reference.scopes) if reference.scopes else binding_scope)}
        return _binding_name(*found.pop()) if len(found) == 1 else None
    except (AttributeError, KeyError, TypeError, ValueError):  # gin's private structures changed: naming is only a
        return None                                            # convenience and must never break construction


def _binding_name(scope: str, selector: str, arg: str) -> str:
    """How the binding is written in a conf: a macro's name, or 'scope/Name.param'."""
    configurable = gin_config._REGISTRY.get(selector)
    if configurable is not None and configurable.wrapped is gin_config.macro:
        return scope
    name = gin_config._REGISTRY.minimal_selector(selector)
    return f'{scope}/{name}.{arg}' if scope else f'{name}.{arg}'
