"""TensorBoard HParams summaries of a search's runs, so that TensorBoard's HParams tab compares them: one session per
run (trial of ``alfish.tools.search``, point and seed of ``alfish.tools.grid_search``) with its bindings and its
final and best evaluation return.

    tensorboard --logdir ROOT_DIR/hparams      # the HParams tab: a row per run, sortable by its returns

Each session is its own folder ``ROOT_DIR/hparams/<run>`` (one event file), written once when the run has ended.
The summaries are those of torch's ``SummaryWriter.add_hparams`` (its ``hparams()`` protobufs and the metrics as
scalars), written with one writer on the session's folder: ``add_hparams`` itself opens a second writer in a
sub-folder named after a timestamp, which would leave an empty event file per run and make session names unreadable.
"""
from __future__ import annotations

import math
import os
from typing import Any, Mapping, Optional, Sequence

#: Where the sessions go, under the search's root_dir.
HPARAMS_DIR = "hparams"
#: The metrics of each session (TensorBoard scalar tags; the HParams tab's metric columns).
FINAL_RETURN = "eval/final_return"
BEST_RETURN = "eval/best_return"


def hparam_value(value: Any) -> float | str:
    """``value`` as TensorBoard's HParams stores it: a number as float64, a string as itself, anything else (True,
    None, a tuple such as hidden sizes) as its gin text, a string."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        return value
    return repr(tuple(value) if isinstance(value, list) else value)


def discrete_domain(values: Sequence[Any]) -> Optional[list]:
    """The HParams domain of a parameter that takes only ``values`` (a categorical choice, a grid's values): the list
    of their ``hparam_value``s when all are of one kind (TensorBoard needs that), else None."""
    domain = list(dict.fromkeys(hparam_value(v) for v in values))
    return domain if len({type(v) for v in domain}) == 1 else None


def write_session(root_dir: str, session: str, hparams: Mapping[str, Any], metrics: Mapping[str, float],
                  domains: Optional[Mapping[str, Sequence[Any]]] = None) -> str:
    """Write the HParams session ``session`` (a relative folder name, e.g. ``trial-3`` or ``lr=0.001/seed-0``) under
    ``root_dir/hparams`` and return its folder.

    hparams: name -> value (``hparam_value`` converts each); metrics: tag -> number (non-finite ones are left out:
    TensorBoard cannot sort them); domains: name -> every value the parameter can take (``discrete_domain``).
    """
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams as hparams_summaries

    values = {name: hparam_value(value) for name, value in hparams.items()}
    numbers = {tag: float(v) for tag, v in metrics.items() if v is not None and math.isfinite(float(v))}
    domain = {}
    for name, choices in (domains or {}).items():
        found = discrete_domain(choices)
        if found is not None and name in values and isinstance(values[name], type(found[0])):
            domain[name] = found
    folder = os.path.join(root_dir, HPARAMS_DIR, session)
    experiment, start, end = hparams_summaries(values, numbers, domain)
    with SummaryWriter(log_dir=folder) as writer:
        for summary in (experiment, start, end):
            writer.file_writer.add_summary(summary)
        for tag, number in numbers.items():
            writer.add_scalar(tag, number)
    return folder


def has_session(root_dir: str, session: str) -> bool:
    """Whether ``session`` was written (a run that ended in an earlier search is not written again)."""
    return os.path.isdir(os.path.join(root_dir, HPARAMS_DIR, session))
