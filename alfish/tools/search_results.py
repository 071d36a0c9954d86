"""What ``alfish.tools.search`` leaves when it ends: the table of trials, the best bindings as a gin file, Optuna's
parameter-importance plot, and each ended trial's TensorBoard HParams session.

The table's columns: trial (Optuna's number), state (complete, pruned, failed, interrupted: a trial that was running
when the search was stopped, re-queued under a new number in the same folder), value (the objective Optuna got: for a
pruned trial, its last reported return), then ``alfish.tools.compare``'s columns from the trial's eval log (env steps,
final, best, at, steps/s, wall-clock s), then the trial's value of each binding.
"""
from __future__ import annotations

import json
import math
import os
import shlex
import warnings
from typing import AbstractSet as Set
from typing import Any, Optional, Sequence

from alfish.tools import hparams
from alfish.tools.cli import ToolError
from alfish.tools.compare import Row, cells, record, render_table, summarize
from alfish.tools.runs import Group
from alfish.tools.search_space import Param, gin_text

BEST_FILE = "best.gin"
IMPORTANCE_FILE = "importance.png"
#: Complete trials the importance plot needs (with so few it is a rough hint; it firms up with tens of trials).
MIN_TRIALS_FOR_IMPORTANCE = 2
_NUMBER_COLUMNS = ["env steps", "final", "best", "at", "steps/s", "wall-clock s"]


def state_name(trial: Any, interrupted: Set[int]) -> str:
    """complete, pruned, failed, interrupted (a number in ``interrupted``: re-queued), running or waiting."""
    if trial.number in interrupted:
        return "interrupted"
    names = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed"}
    return names.get(trial.state.name, trial.state.name.lower())


def trial_records(out_dir: str, trials: Sequence[Any], space: dict[str, Param], interrupted: Set[int]) -> list[dict]:
    """One JSON-ready record per trial (see the module docstring): ``trial``, ``state``, ``value``, ``root_dir``,
    ``params`` (name -> value, a tuple choice as a list), ``error``, and compare's numbers (None where unknown).
    ``interrupted``: the numbers of the interrupted trials."""
    records = []
    for trial in trials:
        root = trial.user_attrs.get("root_dir")
        state = state_name(trial, interrupted)
        numbers: dict[str, Any] = {}
        if isinstance(root, str) and state not in ("interrupted", "running", "waiting"):
            try:
                row = summarize(Group(root, (os.path.join(out_dir, root),)))
                numbers = {k: v for k, v in record(row, None).items() if k not in ("run", "runs")}
            except ToolError:
                pass  # no evaluation (yet): the columns say '-'
        params = {name: _jsonable(space[name].value(v)) if name in space else v for name, v in trial.params.items()}
        records.append(dict(trial=trial.number, state=state, value=trial.value, root_dir=root,
                            params=params, error=trial.user_attrs.get("error"), **numbers))
    return records


def format_trials(records: Sequence[dict], space: dict[str, Param], fmt: str) -> str:
    """The table in ``fmt`` (text, csv, markdown or json), ending with a newline."""
    if fmt == "json":
        return json.dumps(list(records), indent=1) + "\n"
    names = list(space)
    shorts = [n.rpartition(".")[2] for n in names]
    columns = [s if shorts.count(s) == 1 else n for s, n in zip(shorts, names)]
    table = [["trial", "state", "value", *_NUMBER_COLUMNS, *columns]]
    for r in records:
        if "final" in r:
            row = Row(label="", runs=1, env_steps=r["env_steps"], final=r["final"], best=r["best"],
                      best_at=r["best_at_env_steps"], to_threshold=None, steps_per_s=r["env_steps_per_s"],
                      wall_clock_s=r["wall_clock_s"])
            numbers = cells(row, None)[2:]
        else:
            numbers = ["-"] * len(_NUMBER_COLUMNS)
        value = "-" if r["value"] is None else f"{r['value']:.2f}"
        params = [_cell(r["params"][n]) if n in r["params"] else "-" for n in names]
        table.append([str(r["trial"]), r["state"], value, *numbers, *params])
    return render_table(table, fmt)


def write_best(out_dir: str, best: Any, space: dict[str, Param], conf: str, conf_params: Sequence[str]) -> str:
    """Write ``OUT/best.gin``: the best trial's bindings, one a line, each also valid as a --conf_param; its header
    says how to train with it. Returns the train command it suggests."""
    path = os.path.join(out_dir, BEST_FILE)
    include = f'include "{path}"'  # double quotes: the shell command then needs no escaped single quotes
    command = shlex.join(["python", "-m", "alfish.bin.train", "--conf", conf, "--root_dir", "RUN",
                          "--conf_param", include])
    values = {name: space[name].value(v) if name in space else v for name, v in best.params.items()}
    lines = [f"# The best trial of the search in {out_dir}: trial {best.number}, objective {best.value:.6g}.",
             "# Train with it (the conf, then these bindings over it):",
             f"#   {command}",
             "# or give each binding below as a --conf_param.",
             *([f"# The search's trials also had: {' '.join(shlex.quote(p) for p in conf_params)}"]
               if conf_params else []),
             *(f"{name} = {gin_text(value)}" for name, value in values.items())]
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)
    return command


def write_importance(out_dir: str, study: Any) -> str:
    """Write Optuna's parameter-importance plot (PED-ANOVA: needs neither scikit-learn nor scipy) to
    ``OUT/importance.png`` when there are ``MIN_TRIALS_FOR_IMPORTANCE`` complete trials; returns a line saying what
    was done."""
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    if len(complete) < MIN_TRIALS_FOR_IMPORTANCE:
        return (f"importance plot: not written ({len(complete)} complete trials; it needs "
                f"{MIN_TRIALS_FOR_IMPORTANCE})")
    if len({t.value for t in complete}) < 2:
        return "importance plot: not written (every complete trial has the same value: nothing to explain)"
    try:
        import matplotlib
    except ImportError:
        return "importance plot: not written: it needs matplotlib: pip install 'alfish[plot]'"
    matplotlib.use("Agg")  # no display needed; before optuna imports pyplot
    import optuna
    from optuna.importance import PedAnovaImportanceEvaluator
    from optuna.visualization.matplotlib import plot_param_importances

    path = os.path.join(out_dir, IMPORTANCE_FILE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # its matplotlib plots are experimental
        try:
            axes = plot_param_importances(study, evaluator=PedAnovaImportanceEvaluator())
        except (ValueError, RuntimeError) as err:
            return f"importance plot: not written: {' '.join(str(err).split())}"
    axes.figure.tight_layout()
    axes.figure.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(axes.figure)
    return f"importance plot: {path}"


def write_trial_hparams(out_dir: str, root: str, params: dict, state: str, space: dict[str, Param]) -> None:
    """The HParams session of a trial that ended ``state`` (complete or pruned), named after its folder ``root``: its
    bindings (``params``: Optuna's values), its state, and its final and best evaluation return."""
    values: dict[str, Any] = {name: space[name].value(v) if name in space else v for name, v in params.items()}
    values["state"] = state
    metrics: dict[str, Optional[float]] = {}
    try:
        row = summarize(Group(root, (os.path.join(out_dir, root),)))
        metrics = {hparams.FINAL_RETURN: row.final, hparams.BEST_RETURN: row.best}
    except ToolError:
        pass
    domains: dict[str, Sequence[Any]] = {n: p.choices for n, p in space.items() if p.kind == "categorical"}
    domains["state"] = ["complete", "pruned"]
    hparams.write_session(out_dir, root, values, metrics, domains)


def _cell(value: Any) -> str:
    """A binding's value in the table: a float to 4 significant digits (best.gin and the JSON have it in full)."""
    return f"{value:.4g}" if isinstance(value, float) else gin_text(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
