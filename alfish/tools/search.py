"""Hyperparameter search with Optuna and pruning (what RL Zoo's Optuna integration gives SB3 users): each trial trains
the conf with bindings sampled from a search space, in its own ``python -m alfish.bin.train`` process; trials whose
evaluations fall behind are stopped early.

    python -m alfish.tools.search --conf confs/ppo_cartpole.gin --space space.json --root_dir runs/search \\
        --trials 40 [--parallel 2] [--pruner median|hyperband|none] [--sampler tpe|random] [--seed 0] \\
        [--objective final|best] [--iterations 200] [--conf_param 'X.y=1' ...] [--threads_per_run 1]

The space (``alfish.tools.search_space`` says all): a JSON object with a range per gin binding, e.g.
``{"PpoAlgorithm.lr": {"type": "float", "low": 1e-4, "high": 3e-3, "log": true},
"PpoAlgorithm.gae_lambda": {"type": "categorical", "choices": [0.8, 0.95]}}``. Each range, and the conf with
``--conf_param``/``--iterations``, is checked before any trial starts (one error line).

Trials. Trial K trains into ``ROOT_DIR/trial-K`` (its stderr in ``trial-K/search_stderr.txt``), ``--parallel`` at a
time, each with ``Trainer.num_threads = --threads_per_run`` (and ``OMP_NUM_THREADS``). ``--iterations N`` binds
``TrainerConfig.num_iterations = N`` and ``num_env_steps = 0``. The objective (maximized) is the trial's evaluation
return from its ``eval_log.jsonl`` (the conf must set ``TrainerConfig.evaluate = True``): its last evaluation
(``--objective final``, RL Zoo's) or its best one. Each evaluation is reported to Optuna as it arrives (step: its
iteration) and the pruner asked; a pruned trial is sent SIGTERM (it checkpoints and exits) and recorded as pruned. A
trial that exits non-zero, or finishes without an evaluation, is recorded as failed with the last lines of its stderr,
and the search goes on.

Pruners: ``median`` (Optuna's MedianPruner: a trial whose best return so far is below the median of the complete
trials' returns at the same iteration is pruned; none before ``--startup_trials`` trials complete or before iteration
``--min_iterations``), ``hyperband`` (HyperbandPruner, from ``--min_iterations`` (default 1) to the run's
iterations), ``none``. Samplers: ``tpe`` (TPE; the first ``--startup_trials`` trials sampled at random) or
``random``; ``--seed`` seeds the sampler (offset by the number of trials already in the study, so a resumed search
does not draw the same values again).

The study is ``ROOT_DIR/study.db`` (SQLite), driven by this one process: it samples, starts the trial processes and
reads their eval logs in one loop (the trials run in parallel, the bookkeeping need not, and one process owning the
study keeps resuming simple; a lock file refuses a second search on the same root_dir). ``--trials N`` is the total:
a second search with the same ROOT_DIR trains only the trials still missing (finished ones, whatever their state, are
not repeated), with the same --conf, --space and --objective. A trial that was running when the search was stopped
(Ctrl-C or SIGTERM: the search stops its trials cleanly and exits with 128 + the signal; or killed: the next search
stops any trainer it left running) is marked failed as "interrupted" and re-queued with the same bindings as a new
trial, which trains in the same folder, resuming from its newest checkpoint; interrupted trials do not count towards
N.

At the end: the table of trials (``alfish.tools.search_results``; printed and written to
``ROOT_DIR/search_summary.txt`` and ``.json``), the best trial's bindings as ``ROOT_DIR/best.gin`` (train with them:
``python -m alfish.bin.train --conf C --root_dir R --conf_param "include 'ROOT_DIR/best.gin'"``, or each line as a
--conf_param), Optuna's parameter-importance plot ``ROOT_DIR/importance.png`` (needs matplotlib: ``pip install
'alfish[plot]'``) and a TensorBoard HParams session per ended trial (``tensorboard --logdir ROOT_DIR/hparams``).
Needs optuna: ``pip install 'alfish[search]'``. Exit status: 0 when some trial completed, 1 when none did, 2 for
bad arguments (one line), 128 + N when stopped by signal N.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import signal
import sys
import time
import warnings
from typing import Any, Iterator, Optional, Sequence

from alfish.tools.cli import ToolError, report
from alfish.tools.search_results import (
    format_trials,
    state_name,
    trial_records,
    write_best,
    write_importance,
    write_trial_hparams,
)
from alfish.tools.search_space import Param, check_space, read_space, space_json
from alfish.tools.search_trial import TrialProcess, stop_leftover, train_command

SEARCH_EXTRA = "pip install 'alfish[search]'"
STUDY_NAME = "alfish-search"
STUDY_FILE = "study.db"
LOCK_FILE = "search.lock"
POLL_S = 0.5
#: A trial's exit status when the search stopped it (SIGTERM: it checkpointed), or killed it after a second signal.
STOPPED = (128 + signal.SIGTERM, -signal.SIGTERM, 128 + signal.SIGKILL, -signal.SIGKILL)
_TRIAL_DIR_RE = re.compile(r"trial-\d+")
_FORMATS = ("text", "csv", "markdown", "json")


@dataclasses.dataclass(frozen=True)
class Settings:
    """What every trial of the search shares (from the command line, checked)."""

    conf: str
    out: str
    space: dict[str, Param]
    params: tuple[str, ...]  # the --conf_param bindings of every trial (--iterations and threads included)
    trials: int
    parallel: int
    threads: int
    objective: str


@dataclasses.dataclass
class Running:
    """A trial being trained: its Optuna trial, its process, and what was reported of its evaluations."""

    trial: Any
    process: TrialProcess
    root: str
    reported: set = dataclasses.field(default_factory=set)
    pruned_at: Optional[int] = None
    bad_log: Optional[str] = None


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m alfish.tools.search", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", required=True, help="the gin conf every trial trains")
    parser.add_argument("--space", required=True, help="the search space: a JSON file of ranges per gin binding")
    parser.add_argument("--root_dir", required=True, help="the study (study.db) and one folder per trial")
    parser.add_argument("--trials", type=int, required=True, help="how many trials the study should have in all")
    parser.add_argument("--parallel", type=int, default=1, help="trials at a time")
    parser.add_argument("--pruner", choices=("median", "hyperband", "none"), default="median")
    parser.add_argument("--startup_trials", type=int, default=None,
                        help="median pruner: complete trials before it prunes; tpe: random trials first (default 5)")
    parser.add_argument("--min_iterations", type=int, default=None, help="no pruning before this iteration")
    parser.add_argument("--sampler", choices=("tpe", "random"), default="tpe")
    parser.add_argument("--seed", type=int, default=None, help="the sampler's seed")
    parser.add_argument("--objective", choices=("final", "best"), default="final",
                        help="a trial's last evaluation return, or its best")
    parser.add_argument("--iterations", type=int, default=None, help="train each trial this many iterations")
    parser.add_argument("--conf_param", action="append", default=[], help="a binding for every trial")
    parser.add_argument("--threads_per_run", type=int, default=1, help="torch threads of each trial")
    parser.add_argument("--format", choices=_FORMATS, default="text", help="the printed table's format")
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> tuple[Settings, Any]:
    """The settings and the TrainerConfig every trial starts from; ToolError (one line) for anything wrong."""
    try:
        import optuna  # noqa: F401  (only whether it is there)
    except ImportError:
        raise ToolError(f"python -m alfish.tools.search needs optuna: {SEARCH_EXTRA}") from None
    if not os.path.isfile(args.conf):
        raise ToolError(f"--conf {args.conf}: no such file")
    for flag, value, least in (("--trials", args.trials, 1), ("--parallel", args.parallel, 1),
                               ("--threads_per_run", args.threads_per_run, 1), ("--iterations", args.iterations, 1),
                               ("--startup_trials", args.startup_trials, 0),
                               ("--min_iterations", args.min_iterations, 0)):
        if value is not None and value < least:
            raise ToolError(f"{flag} {value} must be >= {least}")
    if args.startup_trials is not None and args.sampler == "random" and args.pruner != "median":
        raise ToolError("--startup_trials is for the median pruner and the tpe sampler; with --sampler random "
                        f"--pruner {args.pruner} it would do nothing")
    if args.min_iterations is not None and args.pruner == "none":
        raise ToolError("--min_iterations delays pruning; with --pruner none it would do nothing")
    out = os.path.abspath(args.root_dir)
    if re.search(r"[?#%]", out):
        raise ToolError(f"--root_dir {out}: a path with ?, # or % cannot be an SQLite URL; choose another")
    conf = os.path.abspath(args.conf)
    params = list(args.conf_param)
    if args.iterations is not None:
        params += [f"TrainerConfig.num_iterations={args.iterations}", "TrainerConfig.num_env_steps=0"]
    params.append(f"Trainer.num_threads={args.threads_per_run}")
    config = base_config(conf, params)
    space = read_space(args.space)
    check_space(space, conf, params)
    return Settings(conf, out, space, tuple(params), args.trials, args.parallel, args.threads_per_run,
                    args.objective), config


def base_config(conf: str, params: Sequence[str]) -> Any:
    """The TrainerConfig of ``conf`` with ``params`` (as train builds it); ToolError if it does not load or does not
    evaluate (the objective is the evaluation return)."""
    import gin

    from alfish.config import ConfError, TrainerConfig, load_conf

    try:
        load_conf(conf, list(params))
        config = TrainerConfig(root_dir="search-check", conf_file=conf)
    except (ConfError, ValueError, TypeError) as err:
        raise ToolError(f"--conf {conf}: {' '.join(str(err).split())}") from None
    finally:
        gin.clear_config()
    if not config.evaluate:
        raise ToolError(f"--conf {conf}: the search maximizes the evaluation return, but the conf does not evaluate: "
                        "set TrainerConfig.evaluate = True (or --conf_param 'TrainerConfig.evaluate=True')")
    return config


def make_study(args: argparse.Namespace, settings: Settings, config: Any) -> Any:
    """Create ``ROOT_DIR/study.db`` or load it (then refusing a different --conf, --space or --objective), with the
    sampler and pruner of ``args``."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the search prints its own line per trial
    storage = optuna.storages.RDBStorage(f"sqlite:///{os.path.join(settings.out, STUDY_FILE)}",
                                         engine_kwargs={"connect_args": {"timeout": 60}})
    study = optuna.create_study(study_name=STUDY_NAME, storage=storage, direction="maximize", load_if_exists=True)
    identity = {"conf": settings.conf, "space": space_json(settings.space), "objective": settings.objective}
    recorded = study.user_attrs.get("search")
    if recorded is None:
        study.set_user_attr("search", identity)
    elif recorded != identity:
        differs = next(k for k in identity if not isinstance(recorded, dict) or recorded.get(k) != identity[k])
        raise ToolError(f"{settings.out}/{STUDY_FILE} is a search with another --{differs}; resume it with the same "
                        "--conf, --space and --objective, or give a new --root_dir")
    startup = 5 if args.startup_trials is None else args.startup_trials
    seed = None if args.seed is None else args.seed + len(study.trials)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.sampler = (optuna.samplers.TPESampler(n_startup_trials=startup, seed=seed) if args.sampler == "tpe"
                         else optuna.samplers.RandomSampler(seed=seed))
    if args.pruner == "median":
        study.pruner = optuna.pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=args.min_iterations or 0)
    elif args.pruner == "hyperband":
        study.pruner = optuna.pruners.HyperbandPruner(min_resource=args.min_iterations or 1,
                                                      max_resource=config.num_iterations or "auto")
    else:
        study.pruner = optuna.pruners.NopPruner()
    return study


@contextlib.contextmanager
def search_lock(out: str) -> Iterator[None]:
    """Hold ``ROOT_DIR/search.lock``: one search at a time per study (it alone may decide which trials are
    stale)."""
    import fcntl

    with open(os.path.join(out, LOCK_FILE), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ToolError(f"another search is running in {out} (it holds {LOCK_FILE}); wait for it or give another "
                            "--root_dir") from None
        yield


class StopSignals:
    """SIGTERM/SIGINT set ``signum`` (the loop then stops the trials cleanly); a second one kills them. Restores the
    previous handlers on exit."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self.count = 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "StopSignals":
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = self.signum or signum
        self.count += 1

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def interrupted_numbers(trials: Sequence[Any]) -> set[int]:
    """The trials that were running when a search stopped: each was re-queued, and its successor records it."""
    found = (t.user_attrs.get("requeued_from") for t in trials)
    return {n for n in found if isinstance(n, int) and not isinstance(n, bool)}


def trial_dir(trial: Any) -> str:
    """The folder of a trial: its own ``trial-<number>``, or, re-queued, the folder of the trial it continues."""
    root = trial.user_attrs.get("root_dir")
    return root if isinstance(root, str) and _TRIAL_DIR_RE.fullmatch(root) else f"trial-{trial.number}"


def requeue(study: Any, number: int, params: dict, root: str, why: str) -> None:
    """Mark trial ``number`` failed (interrupted) and queue its bindings again, to train on in ``root``."""
    from optuna.trial import TrialState

    study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
    study.enqueue_trial(params, user_attrs={"root_dir": root, "requeued_from": number})
    print(f"trial {number} {why}: marked failed (interrupted) and re-queued; it goes on in {root}", flush=True)


def recover_stale(study: Any, out: str) -> None:
    """Trials an earlier search left running (it was killed): stop a trainer still running, re-queue the trial."""
    from optuna.trial import TrialState

    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        root = trial_dir(trial)
        pid, created = trial.user_attrs.get("pid"), trial.user_attrs.get("pid_created")
        if isinstance(pid, int) and isinstance(created, (int, float)):
            if stop_leftover(pid, float(created), os.path.join(out, root)):
                print(f"stopped the trainer of trial {trial.number} that an earlier search left running", flush=True)
        requeue(study, trial.number, trial.params, root, "was running when an earlier search stopped")


def start_trial(study: Any, settings: Settings) -> Running:
    trial = study.ask({name: p.distribution() for name, p in settings.space.items()})
    root = trial_dir(trial)
    bindings = [settings.space[name].binding(value) for name, value in trial.params.items()]
    path = os.path.join(settings.out, root)
    process = TrialProcess(train_command(settings.conf, path, [*settings.params, *bindings]), path, settings.threads)
    trial.set_user_attr("root_dir", root)
    trial.set_user_attr("pid", process.pid)
    trial.set_user_attr("pid_created", process.create_time())
    print(f"trial {trial.number} started in {root}: {' '.join(bindings)}", flush=True)
    return Running(trial, process, root)


def feed(run: Running, prune: bool) -> list[tuple[int, float]]:
    """Report the trial's new evaluations to Optuna and, with ``prune``, stop it if the pruner says so; returns
    all its evaluations so far."""
    try:
        evaluations = run.process.evaluations()
    except ToolError as err:
        run.bad_log = str(err)
        run.process.stop()
        return []
    for iteration, value in evaluations:
        if iteration in run.reported or run.pruned_at is not None or run.bad_log:
            continue  # a resumed run records the iterations after its checkpoint again: the first report stays
        run.trial.report(value, iteration)
        run.reported.add(iteration)
        if prune and run.trial.should_prune():
            run.pruned_at = iteration
            run.process.stop()
            print(f"trial {run.trial.number} pruned at iteration {iteration} (return {value:.4g}); stopping it",
                  flush=True)
    return evaluations


def finish(study: Any, run: Running, code: int, settings: Settings) -> None:
    """Tell Optuna how the ended trial went (complete, pruned or failed) and write its HParams session."""
    from optuna.trial import TrialState

    evaluations = feed(run, prune=False)
    if run.pruned_at is not None:
        study.tell(run.trial, state=TrialState.PRUNED)
        state, note = "pruned", f"pruned at iteration {run.pruned_at}"
    elif run.bad_log or code != 0 or not evaluations:
        error = run.bad_log or (run.process.error(code) if code != 0 else
                                "finished without an evaluation in eval_log.jsonl (TrainerConfig.eval_interval "
                                "beyond the run's iterations?)")
        run.trial.set_user_attr("error", error)
        study.tell(run.trial, state=TrialState.FAIL)
        state, note = "failed", f"FAILED ({error})"
    else:
        returns = [value for _, value in evaluations]
        value = returns[-1] if settings.objective == "final" else max(returns)
        study.tell(run.trial, value)
        state, note = "complete", f"complete: {settings.objective} return {value:.4g}"
    print(f"trial {run.trial.number} {note} ({time.time() - run.process.started:.0f} s)", flush=True)
    if state != "failed":
        write_trial_hparams(settings.out, run.root, run.trial.params, state, settings.space)


def run_trials(study: Any, settings: Settings, stop: StopSignals) -> None:
    """The search's loop: keep ``parallel`` trials running until the study has ``trials`` ended ones (interrupted
    ones not counted), feeding each trial's evaluations to the pruner; on a stop signal, stop every trial cleanly and
    re-queue the unfinished ones."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))
    ended = len(trials) - len(interrupted_numbers(study.get_trials(deepcopy=False)))
    print(f"search: {ended} of {settings.trials} trials ended earlier; {max(0, settings.trials - ended)} to go, "
          f"{settings.parallel} at a time, into {settings.out}", flush=True)
    running: list[Running] = []
    while stop.signum is None:
        while len(running) < settings.parallel and ended + len(running) < settings.trials:
            running.append(start_trial(study, settings))
        if not running:
            return
        for run in list(running):
            feed(run, prune=True)
            code = run.process.poll()
            if code is not None:
                finish(study, run, code, settings)
                running.remove(run)
                ended += 1
        time.sleep(POLL_S)
    print(f"search: stopped by signal {stop.signum}; stopping {len(running)} running trials (they checkpoint)",
          file=sys.stderr, flush=True)
    for run in running:
        run.process.stop()
    for run in running:
        code = wait_stopping(run, stop)
        if code in STOPPED and run.pruned_at is None:
            requeue(study, run.trial.number, run.trial.params, run.root,
                    f"was stopped by the search's signal {stop.signum}")
        else:  # it finished, failed or was pruned before the signal
            finish(study, run, code, settings)


def wait_stopping(run: Running, stop: StopSignals) -> int:
    """Wait for a trial sent SIGTERM to exit; a second signal to the search kills the trial's session at once."""
    while True:
        code = run.process.poll()
        if code is not None:
            return code
        if stop.count > 1:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.process.pid, signal.SIGKILL)
        time.sleep(0.1)


def summarize_search(study: Any, settings: Settings, fmt: str) -> int:
    """Print and write the table of trials, best.gin and the importance plot; the exit status (0 when some trial
    completed, else 1)."""
    trials = study.get_trials(deepcopy=False)
    interrupted = interrupted_numbers(trials)
    records = trial_records(settings.out, trials, settings.space, interrupted)
    print(format_trials(records, settings.space, fmt), end="")
    with open(os.path.join(settings.out, "search_summary.txt"), "w") as f:
        f.write(format_trials(records, settings.space, "text"))
    with open(os.path.join(settings.out, "search_summary.json"), "w") as f:
        f.write(format_trials(records, settings.space, "json"))
    for trial in trials:
        if state_name(trial, interrupted) == "failed":
            print(f"failed: trial {trial.number} ({os.path.join(settings.out, trial_dir(trial))}): "
                  f"{trial.user_attrs.get('error', '?')}", file=sys.stderr)
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    if not complete:
        print("no trial completed: no best.gin", file=sys.stderr)
        return 1
    best = max(complete, key=lambda t: t.value)
    command = write_best(settings.out, best, settings.space, settings.conf,
                         [p for p in settings.params if not p.startswith("Trainer.num_threads=")])
    print(f"best: trial {best.number} ({settings.objective} return {best.value:.4g}) -> "
          f"{os.path.join(settings.out, 'best.gin')}\n  train it: {command}")
    print(write_importance(settings.out, study))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        settings, config = check_args(args)
        os.makedirs(settings.out, exist_ok=True)
        with search_lock(settings.out), StopSignals() as stop:
            study = make_study(args, settings, config)
            recover_stale(study, settings.out)
            run_trials(study, settings, stop)
            status = summarize_search(study, settings, args.format)
    except ToolError as err:
        return report(err)
    return 128 + stop.signum if stop.signum is not None else status


if __name__ == "__main__":
    sys.exit(main())
