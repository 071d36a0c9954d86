"""The search space of ``alfish.tools.search``: a JSON file with a range or a set of choices per gin binding.

    {
      "PpoAlgorithm.lr":          {"type": "float", "low": 1e-4, "high": 3e-3, "log": true},
      "PpoAlgorithm.clip_range":  {"type": "float", "low": 0.1, "high": 0.3, "step": 0.05},
      "TrainerConfig.unroll_length": {"type": "int", "low": 8, "high": 64, "log": true},
      "PpoAlgorithm.gae_lambda":  {"type": "categorical", "choices": [0.8, 0.9, 0.95]},
      "PpoAlgorithm.hidden_sizes": {"type": "categorical", "choices": [[64, 64], [256, 256]]}
    }

Types: ``int`` and ``float`` take ``low`` <= ``high`` (both included) and optionally ``"log": true`` (sampled
uniformly in log space; needs low > 0) or a ``step`` (not both); ``categorical`` takes a non-empty list of
``choices``, each a number, string, true/false, null, or a list of those (bound as a tuple, e.g. hidden sizes).
A value is bound as ``NAME=<gin literal>`` (a string as a quoted string). Every problem is one line naming the
binding; a binding gin does not know, or a value outside what the parameter accepts (``low``, ``high`` and each
choice are tried against the conf), is found before any trial starts.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any, Optional, Sequence

from alfish.tools.cli import ToolError

TYPES = ("int", "float", "categorical")
_KEYS = {"int": {"type", "low", "high", "log", "step"}, "float": {"type", "low", "high", "log", "step"},
         "categorical": {"type", "choices"}}
_BINDING_RE = re.compile(r"[A-Za-z_][\w./]*\.[A-Za-z_]\w*")
_EXAMPLE = '{"PpoAlgorithm.lr": {"type": "float", "low": 1e-4, "high": 3e-3, "log": true}}'


@dataclasses.dataclass(frozen=True)
class Param:
    """One binding's range: ``kind`` is one of ``TYPES``; ``low``/``high``/``log``/``step`` for int and float,
    ``choices`` (as written in the JSON, lists turned into tuples) for categorical."""

    name: str
    kind: str
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    step: Optional[float] = None
    choices: tuple = ()

    @property
    def optuna_choices(self) -> tuple:
        """The choices as Optuna stores them (it takes None, bools, numbers and strings only): a tuple choice as its
        gin text."""
        return tuple(gin_text(c) if isinstance(c, tuple) else c for c in self.choices)

    def distribution(self) -> Any:
        """The Optuna distribution of this range (optuna imported here: the caller has checked it is installed)."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.kind == "categorical":
            return CategoricalDistribution(self.optuna_choices)
        if self.kind == "int":
            return IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def value(self, sampled: Any) -> Any:
        """The value a sampled Optuna parameter stands for (a tuple choice's gin text back to the tuple)."""
        if self.kind != "categorical":
            return sampled
        for choice, stored in zip(self.choices, self.optuna_choices):
            if type(stored) is type(sampled) and stored == sampled:
                return choice
        raise ToolError(f"{self.name}: {sampled!r} is not one of the search space's choices; the study holds a "
                        "different space (use a new --root_dir)")

    def binding(self, sampled: Any) -> str:
        """``NAME=<gin literal>`` for a sampled value (a --conf_param and a line of best.gin)."""
        return f"{self.name}={gin_text(self.value(sampled))}"

    def probes(self) -> list:
        """The values tried against the conf before the search: the range's ends, or every choice."""
        if self.kind == "categorical":
            return list(self.choices)
        return [int(self.low), int(self.high)] if self.kind == "int" else [self.low, self.high]

    def spec(self) -> dict:
        """This range as the JSON object it was read from (normalized: what the study records)."""
        if self.kind == "categorical":
            return {"type": "categorical", "choices": [list(c) if isinstance(c, tuple) else c for c in self.choices]}
        out = {"type": self.kind, "low": self.low, "high": self.high, "log": self.log}
        return out if self.step is None else {**out, "step": self.step}


def gin_text(value: Any) -> str:
    """``value`` as a gin literal: numbers, True/False, None and quoted strings as Python writes them, a list or tuple
    as a tuple."""
    if isinstance(value, (list, tuple)):
        items = [gin_text(v) for v in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return repr(value)


def read_space(path: str) -> dict[str, Param]:
    """The search space in the JSON file ``path``; a ToolError (one line naming the binding) for anything wrong."""
    def no_constant(name: str) -> None:
        raise ValueError(f"{name} is not a number JSON allows")

    try:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f, parse_constant=no_constant)
    except (OSError, ValueError) as err:
        raise ToolError(f"--space {path}: cannot read it as JSON ({' '.join(str(err).split())})") from None
    if not isinstance(spec, dict) or not spec:
        raise ToolError(f"--space {path}: give a non-empty JSON object of ranges, e.g. {_EXAMPLE}")
    return {name: parse_param(name, entry, f"--space {path}: {name}") for name, entry in spec.items()}


def parse_param(name: str, entry: Any, where: str) -> Param:
    """One entry of the space file (see the module docstring); ``where`` starts each error message."""
    if not _BINDING_RE.fullmatch(name):
        raise ToolError(f"{where}: not a gin binding; name one as Configurable.parameter, e.g. PpoAlgorithm.lr")
    kind = entry.get("type") if isinstance(entry, dict) else None
    if kind not in TYPES:
        got = f"type {kind!r}" if isinstance(entry, dict) else f"{entry!r}"
        raise ToolError(f"{where}: unknown {got}; give an object with \"type\": \"int\", \"float\" (\"log\": true for "
                        "a log scale) or \"categorical\"")
    unknown = sorted(set(entry) - _KEYS[kind])
    if unknown:
        raise ToolError(f"{where}: unknown key {unknown[0]!r} for type {kind} (its keys: "
                        f"{', '.join(sorted(_KEYS[kind] - {'type'}))})")
    if kind == "categorical":
        return Param(name, kind, choices=_choices(entry.get("choices"), where))
    low, high = (_number(entry.get(key), key, kind, where) for key in ("low", "high"))
    if low > high:
        raise ToolError(f"{where}: low {low:g} > high {high:g}; give low <= high")
    log = entry.get("log", False)
    if not isinstance(log, bool):
        raise ToolError(f"{where}: \"log\" must be true or false, got {log!r}")
    step = entry.get("step")
    if step is not None:
        step = _number(step, "step", kind, where)
        if step <= 0 or log:
            raise ToolError(f"{where}: \"step\" must be > 0 and cannot go with \"log\": true")
    if log and low <= 0:
        raise ToolError(f"{where}: \"log\": true needs low > 0, got low {low:g}")
    return Param(name, kind, low=low, high=high, log=log, step=step)


def _number(value: Any, key: str, kind: str, where: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ToolError(f"{where}: \"{key}\" must be a number, got {value!r}")
    if kind == "int" and value != int(value):
        raise ToolError(f"{where}: \"{key}\" must be a whole number for type int, got {value!r}")
    return int(value) if kind == "int" else float(value)


def _choices(choices: Any, where: str) -> tuple:
    if not isinstance(choices, list) or not choices:
        raise ToolError(f"{where}: \"choices\" must be a non-empty list, got {choices!r}")
    out = []
    for choice in choices:
        if isinstance(choice, list):
            if not all(_scalar(c) for c in choice):
                raise ToolError(f"{where}: the choice {choice!r} must hold numbers, strings, true/false or null only")
            choice = tuple(choice)
        elif not _scalar(choice):
            raise ToolError(f"{where}: the choice {choice!r} must be a number, string, true/false, null or a list of "
                            "those")
        out.append(choice)
    # Optuna finds a choice by equality: 1, 1.0 and true are one choice to it, and so are [64, 64] and "(64, 64)"
    stored = [gin_text(c) if isinstance(c, tuple) else c for c in out]
    for i, choice in enumerate(stored):
        if choice in stored[:i]:
            raise ToolError(f"{where}: the choices {out[stored.index(choice)]!r} and {out[i]!r} are the same choice; "
                            "give each once")
    return tuple(out)


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, str)) or (isinstance(value, float) and math.isfinite(value))


def space_json(space: dict[str, Param]) -> str:
    """The space as canonical JSON text (the study records it, to refuse resuming with a different space)."""
    return json.dumps({name: p.spec() for name, p in space.items()}, sort_keys=True)


def check_space(space: dict[str, Param], conf: str, conf_params: Sequence[str]) -> None:
    """Load ``conf`` with ``conf_params`` and each probe of each range (``Param.probes``), and build its
    TrainerConfig, as ``alfish.bin.train`` would: a binding gin does not know, a value the parameter refuses, or a
    TrainerConfig that does not validate is a ToolError naming the binding. Clears gin's config after."""
    import gin

    from alfish.config import ConfError, TrainerConfig, load_conf

    clashes = [p for p in conf_params if p.partition("=")[0].strip() in space]
    if clashes:
        raise ToolError(f"--conf_param {clashes[0]!r} binds a parameter of the search space; leave it to --space")
    try:
        for param in space.values():
            for value in param.probes():
                binding = f"{param.name}={gin_text(value)}"
                try:
                    load_conf(conf, [*conf_params, binding])
                    TrainerConfig(root_dir="search-space-check", conf_file=conf)
                except (ConfError, ValueError, TypeError) as err:
                    raise ToolError(f"--space {param.name}: {binding} does not fit --conf {conf}: "
                                    f"{' '.join(str(err).split())}") from None
    finally:
        gin.clear_config()
