#!/usr/bin/env python
"""Conf regression suite (rl_coach's PresetValidation): train the shipped confs and check each reaches the result its
header declares.

    python scripts/validate_confs.py [confs/ppo_cartpole.gin ...] [--seeds N] [--parallel K] [--out DIR]
                                     [--fast] [--suite SUITE] [--include_manual] [--timeout_s S]

``--suite mujoco`` (or ``box2d``, ``classic_control``, ...) keeps the confs whose env gymnasium registers under
``gymnasium.envs.<suite>`` (the RL Zoo benchmark confs of issue 30 are ``mujoco`` and ``box2d``; most of them are
``manual``, hours each, so add ``--include_manual`` to train them).

Each conf declares its expected result on one header line, as JSON:

    # expected_result: {"threshold": 475, "env_steps": 50000, "seeds": 3}

* ``threshold``: the evaluation average return (``eval_log.jsonl``'s ``average_return``) to reach;
* ``env_steps`` (online and hybrid confs) or ``iterations`` (pure offline confs): the budget to reach it in;
* ``seeds``: how many seeds (0, 1, ...) the full suite trains; ``min_success`` (default: all of them) must reach it;
* ``dataset`` (offline and hybrid confs): ``{"num_steps": N, "noise": X}``, the Pendulum dataset
  ``scripts/pendulum_dataset.py`` makes for it, bound to the conf's ``DATASET`` macro;
* ``fast``: true for the confs of the fast subset (``--fast``, what CI runs with one seed);
* ``manual``: a reason the conf is not trained here (e.g. 10M Atari steps), listed as skipped.

Each run is ``python -m alfish.bin.train`` in a subprocess of its own (one torch thread, ``--parallel`` at a time)
with ``Trainer.stop_value = threshold`` (a run ends at the evaluation that reaches it) and the budget as its length.
The table gives, per conf: seeds that reached the threshold, the env steps (or iterations) at which they did (median),
the wall-clock per seed (median), and the final evaluation return (mean ± std over seeds). The exit status is 1 when
a conf fails (a regression), 2 for bad arguments, 0 otherwise. ``--seeds N`` overrides every conf's seed count.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Optional, Sequence

REPO = pathlib.Path(__file__).resolve().parents[1]
MARKER = "# expected_result:"


class ValidateError(Exception):
    """A problem with the arguments or a conf's declaration; one line."""


@dataclasses.dataclass(frozen=True)
class Expectation:
    conf: pathlib.Path
    threshold: float
    env_steps: Optional[int] = None
    iterations: Optional[int] = None
    seeds: int = 3
    min_success: Optional[int] = None
    dataset: Optional[dict] = None
    fast: bool = False
    manual: Optional[str] = None

    @property
    def budget_flag(self) -> str:
        if self.env_steps is not None:
            return f"TrainerConfig.num_env_steps={self.env_steps}"
        return f"TrainerConfig.num_iterations={self.iterations}"


def read_expectation(conf: pathlib.Path) -> Expectation:
    """The ``# expected_result:`` JSON line of ``conf`` (ValidateError when missing or malformed)."""
    for number, line in enumerate(conf.read_text().splitlines(), 1):
        if line.startswith(MARKER):
            try:
                fields = json.loads(line[len(MARKER):])
                expectation = Expectation(conf=conf, **fields)
            except (json.JSONDecodeError, TypeError) as err:
                raise ValidateError(f"{conf}:{number}: the expected_result line is not valid ({err}); write e.g. "
                                    f'{MARKER} {{"threshold": 475, "env_steps": 50000, "seeds": 3}}') from None
            if expectation.manual is None and (expectation.env_steps is None) == (expectation.iterations is None):
                raise ValidateError(f"{conf}:{number}: give one budget, env_steps or iterations")
            return expectation
    raise ValidateError(f"{conf} declares no expected result; add a line `{MARKER} {{...}}` to its header")


def env_name_of(conf: pathlib.Path) -> Optional[str]:
    """The env ``conf`` trains on: its last ``create_environment.env_name`` binding, the confs it includes read first
    (None: it binds none)."""
    name = None
    for line in conf.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("include "):
            name = env_name_of(conf.parent / line.split(None, 1)[1].strip("'\" ")) or name
        elif line.startswith("create_environment.env_name"):
            name = line.split("=", 1)[1].strip().strip("'\"")
    return name


def suite_of(conf: pathlib.Path) -> Optional[str]:
    """The gymnasium family of ``conf``'s env, the package its registered entry point lives in (``HalfCheetah-v5``:
    ``'mujoco'``, ``LunarLander-v3``: ``'box2d'``, ``CartPole-v1``: ``'classic_control'``); None for a conf without an
    env or an env gymnasium does not ship (alfish's own, Atari). Reads the registry only: no env package is imported."""
    import gymnasium

    spec = gymnasium.envs.registry.get(env_name_of(conf) or "")
    entry = spec.entry_point if spec is not None else None
    if not isinstance(entry, str) or not entry.startswith("gymnasium.envs."):
        return None
    return entry.split(".")[2]


@dataclasses.dataclass
class RunResult:
    seed: int
    reached_at: Optional[int]  # env steps (or iterations for an offline conf) of the first evaluation >= threshold
    final_return: Optional[float]
    wall_s: float
    error: Optional[str] = None


def dataset_for(expectation: Expectation, out: pathlib.Path) -> list[str]:
    """Make the conf's dataset once (shared by its seeds); the binding pointing the conf at it."""
    if expectation.dataset is None:
        return []
    spec = expectation.dataset
    path = out / "datasets" / f"pendulum_{spec['num_steps']}_{spec.get('noise', 1.5)}.npz"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, str(REPO / "scripts" / "pendulum_dataset.py"), "--out", str(path),
                        "--num_steps", str(spec["num_steps"]), "--noise", str(spec.get("noise", 1.5))],
                       check=True, capture_output=True, text=True, cwd=REPO)
    return [f"DATASET='{path}'"]


def train_one(expectation: Expectation, seed: int, root: pathlib.Path, extra: Sequence[str],
              timeout_s: float) -> RunResult:
    command = [sys.executable, "-m", "alfish.bin.train", "--conf", str(expectation.conf), "--root_dir", str(root),
               "--fresh"]
    for param in (f"TrainerConfig.random_seed={seed}", expectation.budget_flag, "TrainerConfig.num_iterations=0"
                  if expectation.env_steps is not None else "TrainerConfig.num_env_steps=0",
                  f"Trainer.stop_value={expectation.threshold}", "Trainer.num_threads=1", *extra):
        command += ["--conf_param", param]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    start = time.monotonic()
    try:
        proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
        error = None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["?"])[-1]
    except subprocess.TimeoutExpired:
        error = f"did not finish within {timeout_s:.0f} s"
    wall_s = time.monotonic() - start
    records = read_eval_log(root)
    key = "env_steps" if expectation.env_steps is not None else "iteration"
    reached = [r[key] for r in records if r["average_return"] >= expectation.threshold]
    return RunResult(seed, reached[0] if reached else None, records[-1]["average_return"] if records else None,
                     wall_s, error)


def read_eval_log(root: pathlib.Path) -> list[dict]:
    path = root / "eval_log.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclasses.dataclass
class ConfResult:
    expectation: Expectation
    runs: list[RunResult]

    @property
    def passed(self) -> bool:
        needed = self.expectation.min_success or len(self.runs)
        return sum(r.reached_at is not None for r in self.runs) >= min(needed, len(self.runs))

    def row(self) -> list[str]:
        e, runs = self.expectation, self.runs
        reached = [r.reached_at for r in runs if r.reached_at is not None]
        finals = [r.final_return for r in runs if r.final_return is not None]
        unit = "env steps" if e.env_steps is not None else "iterations"
        spread = f" ± {statistics.pstdev(finals):.1f}" if len(finals) > 1 else ""
        return [e.conf.name, f">= {e.threshold:g} in {e.env_steps or e.iterations:,} {unit}",
                f"{len(reached)}/{len(runs)}",
                f"{statistics.median(reached):,.0f}" if reached else "-",
                f"{statistics.median(r.wall_s for r in runs):.0f} s",
                f"{statistics.mean(finals):.1f}{spread}" if finals else "-",
                "ok" if self.passed else "REGRESSION"]


HEADER = ["conf", "expected", "reached", "at (median)", "wall/seed", "final return", "status"]


def table(rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [HEADER] + rows) for i in range(len(HEADER))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in [HEADER] + rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python scripts/validate_confs.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("confs", nargs="*", help="confs to validate (default: every conf under confs/)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per conf (default: each conf's own)")
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time (one torch thread each)")
    parser.add_argument("--out", default=str(REPO / "runs" / "validate"), help="results dirs and results.json")
    parser.add_argument("--fast", action="store_true", help="only the confs marked fast")
    parser.add_argument("--suite", default=None,
                        help="only the confs on envs of this gymnasium family: mujoco, box2d, classic_control, ...")
    parser.add_argument("--include_manual", action="store_true", help="also the confs marked manual (hours)")
    parser.add_argument("--timeout_s", type=float, default=3600.0, help="per run")
    parser.add_argument("--conf_param", action="append", default=[], help="an extra binding for every run")
    parser.add_argument("--peer", choices=["sb3"], default=None,
                        help="also train Stable-Baselines3 at the same hyperparameters, budget and seeds (alternating "
                             "processes) and print a table per task: IQM final return [95%% CI], IQM at half the "
                             "budget, wall-clock, the published figure (needs: pip install stable-baselines3)")
    parser.add_argument("--record", default=None,
                        help="with --peer: also keep each finished run's run.json here, and take a run recorded here "
                             "as done (e.g. tools/bench/results/peer_sb3/runs/300k, a folder per budget, committed: "
                             "seeds of several sessions "
                             "in one table)")
    parser.add_argument("--first_seed", type=int, default=0,
                        help="with --peer: start at this seed (the seeds below it ran elsewhere, unrecorded), up to "
                             "--seeds - 1")
    parser.add_argument("--train_only", choices=["alfish", "sb3"], default=None,
                        help="with --peer: train only this framework's missing runs; the other's are tabled where "
                             "recorded (e.g. alfish again after a change that superseded its records, SB3's kept)")
    parser.add_argument("--table_only", action="store_true",
                        help="with --peer: print the table and draw the curves of the runs already finished (in --out "
                             "or --record), training nothing")
    parser.add_argument("--env_steps", type=int, default=None,
                        help="the budget of every run, overriding each conf's (e.g. 300000 for SAC/TD3 MuJoCo here)")
    return parser.parse_args(argv)


def peer_main(args: argparse.Namespace, expectations: Sequence[Expectation]) -> int:
    """``--peer sb3``: each conf (manual ones included) trained by both frameworks to ``--env_steps`` (default: the
    conf's own budget) with ``--seeds`` (default: the conf's own), a table per task (``peer_suite.py``)."""
    sys.path.insert(0, str(REPO / "scripts"))
    import peer_suite
    import sb3_translate

    out = pathlib.Path(args.out).resolve()
    record_dir = pathlib.Path(args.record).resolve() if args.record else None
    tasks = []
    for e in expectations:
        if e.env_steps is None and args.env_steps is None:
            print(f"{e.conf.name}: skipped (an offline conf: no env steps to compare at)", flush=True)
            continue
        try:  # before alfish trains it: a conf the peer cannot run is skipped, with the reason
            sb3_translate.translate(e.conf, args.conf_param)
        except sb3_translate.TranslateError as err:
            print(f"{e.conf.name}: skipped (no SB3 translation: {err})", flush=True)
            continue
        tasks.append(peer_suite.PeerTask(e.conf, args.seeds or e.seeds, args.env_steps or e.env_steps))
    rows = peer_suite.run_suite(tasks, out, args.conf_param, args.timeout_s, args.parallel, record_dir,
                                train=not args.table_only, first_seed=args.first_seed,
                                train_frameworks=[args.train_only] if args.train_only else peer_suite.FRAMEWORKS)
    table_md = peer_suite.markdown_table(rows)
    print(table_md)
    out.mkdir(parents=True, exist_ok=True)
    (out / "peer_table.md").write_text(table_md + "\n")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        if args.seeds is not None and args.seeds < 1 or args.parallel < 1:
            raise ValidateError("--seeds and --parallel must be >= 1")
        if args.first_seed < 0 or args.seeds is not None and args.first_seed >= args.seeds:
            raise ValidateError(f"--first_seed {args.first_seed} must be >= 0 and below --seeds")
        for flag, value in (("--record", args.record is not None), ("--table_only", args.table_only),
                            ("--first_seed", args.first_seed != 0), ("--train_only", args.train_only is not None)):
            if value and args.peer is None:
                raise ValidateError(f"{flag} is about the runs of --peer sb3 only; add --peer sb3 or leave {flag} out")
        confs = [pathlib.Path(c).resolve() for c in args.confs] or sorted((REPO / "confs").glob("*.gin"))
        missing = [str(c) for c in confs if not c.is_file()]
        if missing:
            raise ValidateError(f"no such conf: {missing[0]}")
        expectations = [read_expectation(c) for c in confs]
        if args.suite is not None:
            suites = {e.conf: suite_of(e.conf) for e in expectations}
            expectations = [e for e in expectations if suites[e.conf] == args.suite]
            if not expectations:
                known = ", ".join(sorted({s for s in suites.values() if s}))
                raise ValidateError(f"--suite {args.suite}: no conf trains on a gymnasium.envs.{args.suite} env; the "
                                    f"suites of these confs are: {known}")
    except ValidateError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.fast:
        expectations = [e for e in expectations if e.fast]
    if args.peer is not None:
        return peer_main(args, expectations)
    skipped = [e for e in expectations if e.manual and not args.include_manual]
    todo = [e for e in expectations if e not in skipped]
    out = pathlib.Path(args.out).resolve()
    jobs = []
    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        for e in todo:
            extra = dataset_for(e, out) + list(args.conf_param)
            for seed in range(args.seeds or e.seeds):
                root = out / e.conf.stem / f"seed-{seed}"
                jobs.append((e, pool.submit(train_one, e, seed, root, extra, args.timeout_s)))
        results = {e.conf: ConfResult(e, []) for e in todo}
        for e, job in jobs:
            run = job.result()
            results[e.conf].runs.append(run)
            status = f"reached at {run.reached_at}" if run.reached_at is not None else "not reached"
            print(f"{e.conf.name} seed {run.seed}: {status}, final {run.final_return}, {run.wall_s:.0f} s"
                  + (f", error: {run.error}" if run.error else ""), flush=True)
    rows = [r.row() for r in results.values()]
    rows += [[e.conf.name, "-", "-", "-", "-", "-", f"skipped: {e.manual}"] for e in skipped]
    print(table(rows))
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(
        {r.expectation.conf.name: dict(passed=r.passed, runs=[dataclasses.asdict(run) for run in r.runs])
         for r in results.values()}, indent=1))
    return 0 if all(r.passed for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
