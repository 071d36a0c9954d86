"""The numbers a checkpoint's ``meta.json`` holds, and the range each must be in to be read at all.

``meta.json`` comes from a results directory, so a number in it may be ``Infinity``, ``-5``, ``1e30`` or a string.
Every number alfish takes from meta is checked here when the checkpoint is read (``check_meta_numbers``): a value
out of range makes the checkpoint damaged (the next older one is tried), never a traceback later where it is used.
Consumers read the numbers back through ``LoadedCheckpoint.count`` / ``LoadedCheckpoint.real``, which check again
(a ``LoadedCheckpoint`` built in memory never went through the reader).
"""
from __future__ import annotations

import math
import re
from typing import Any, Optional

from alfish.rundir.bounded import RootDirContentError, checked_count

__all__ = ["MAX_STEP", "step_of_dir_name", "META_COUNTS", "META_REALS", "check_meta_numbers", "meta_count", "meta_real"]

#: The largest step (training iteration) a checkpoint directory may be named with: 18 decimal digits.
MAX_STEP = 10 ** 18 - 1
# ckpt-<step>: ASCII digits without leading zeros (the name Checkpointer.path_of gives), at most 18 of them
_CKPT_DIR_RE = re.compile(r"ckpt-(0|[1-9][0-9]{0,17})")


def step_of_dir_name(name: str) -> Optional[int]:
    """The step of a checkpoint directory named ``name`` (``ckpt-<step>``), or None for any other name (one with a
    step of more than 18 digits included: a name from a results directory is not trusted to be small)."""
    match = _CKPT_DIR_RE.fullmatch(name)
    return int(match.group(1)) if match else None

#: meta's whole numbers -> the inclusive range that makes sense for them.
META_COUNTS: dict[str, tuple[int, int]] = {
    "iteration": (0, MAX_STEP),
    "env_steps": (0, 2 ** 53),
    "num_episodes": (0, 2 ** 53),
    "world_size": (1, 65536),  # DDP ranks
    "layout": (1, 2 ** 16),
    "seed": (-2 ** 63, 2 ** 64 - 1),  # what torch.manual_seed accepts
}
#: meta's real numbers -> the inclusive range that makes sense for them (NaN is never in range).
META_REALS: dict[str, tuple[float, float]] = {
    "unroll_credit": (-1.0, 1.0),  # the fraction of an env step carried to the next iteration
    "elapsed_s": (0.0, 1e12),  # wall-clock seconds of the run
}
# meta["best"] (the best policy's checkpoint): its return may be any number but NaN.
_BEST_RETURN = (-math.inf, math.inf)


def meta_count(meta: dict, name: str, what: str, default: Any = None) -> int:
    """meta's whole number ``name`` (``default`` when absent) as an int, checked in its ``META_COUNTS`` range.

    Raises:
        RootDirContentError: not a whole number in range (or absent without a default); ``what`` names the file.
    """
    low, high = META_COUNTS[name]
    return checked_count(meta.get(name, default), f"{what} {name}", low, high)


def meta_real(meta: dict, name: str, what: str, default: Any = None) -> float:
    """meta's real number ``name`` (``default`` when absent) as a float, checked in its ``META_REALS`` range."""
    low, high = META_REALS[name]
    return _checked_real(meta.get(name, default), f"{what} {name}", low, high)


def _checked_real(value: Any, what: str, low: float, high: float) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an integer of hundreds of digits
            number = math.nan
        if low <= number <= high:
            return number
    shown = repr(value)[:60] if not isinstance(value, str) else repr(value[:40])
    raise RootDirContentError(f"{what} is {shown}, not a number in [{low:g}, {high:g}] (the file was not written by "
                              "alfish or was altered)")


def check_meta_numbers(meta: dict, what: str, step: int) -> None:
    """Check every number of ``META_COUNTS`` and ``META_REALS`` that ``meta`` holds (absent ones are the reader's
    business), that its ``iteration`` is the checkpoint's ``step``, and its ``best`` record.

    Raises:
        RootDirContentError: one line naming ``what`` (the meta.json file) and the value.
    """
    for name in META_COUNTS:
        if name in meta:
            meta_count(meta, name, what)
    for name in META_REALS:
        if name in meta:
            meta_real(meta, name, what)
    if "iteration" in meta and meta_count(meta, "iteration", what) != step:
        raise RootDirContentError(f"{what} records iteration {meta_count(meta, 'iteration', what)} but its directory "
                                  f"says step {step} (the file was not written by alfish or was altered)")
    if "best" in meta:
        best = meta["best"]
        if not isinstance(best, dict):
            raise RootDirContentError(f"{what} best is not a JSON object (the file was not written by alfish or was "
                                      "altered)")
        _checked_real(best.get("average_return"), f"{what} best.average_return", *_BEST_RETURN)
        if "num_episodes" in best:
            checked_count(best["num_episodes"], f"{what} best.num_episodes", *META_COUNTS["num_episodes"])
