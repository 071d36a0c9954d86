"""``validate_confs.py --peer sb3``: each conf trained by alfish and by Stable-Baselines3 at the same hyperparameters
(``sb3_translate.py``), budget and seeds, in alternating processes, and a table per task.

Runs go to ``OUT/<conf>/<framework>/seed-<k>/`` (alfish's results directory, or ``sb3_peer.py``'s ``eval_log.jsonl``)
with a ``run.json`` written when the run ends; a run that has one is not trained again, and one without resumes from
its last checkpoint, so a suite interrupted (e.g. by the end of a session) goes on where it stopped (a finished run
at another ``--env_steps`` is an error, not a silent mix).

``--record DIR`` keeps the finished runs beyond ``OUT``: each ``run.json`` (the curve, the wall-clock, the commit that
ran it; a few kB) is also written to ``DIR/<conf>/<framework>/seed-<k>/run.json``, and a run recorded there is read
back instead of trained. With ``DIR`` in the repository (``tools/bench/results/peer_sb3/runs/300k``: a folder per
budget, committed), seeds trained in different sessions, on machines that do not outlive a session, add up to one
table: a 300k-step SAC run takes most of a session here, so no session trains a whole task.

The table gives per framework: the seeds done, the IQM of the final evaluation returns over seeds with its 95%
percentile-bootstrap interval (rliable's protocol, ``alfish.tools.stats``), the IQM at half the budget (the return at
equal env steps along the way), the wall-clock per seed (median; each run's own clock at its final evaluation, which
continues from the checkpoint's after a resume), and the published RL Zoo figure from the conf's header. The curves of
both are drawn with ``alfish.tools.plot --iqm`` (``OUT/<conf>.png``; needs matplotlib).
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import time
from typing import NamedTuple, Optional, Sequence

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
FRAMEWORKS = ("alfish", "sb3")
NUMBER = r"\d+(?:\.\d+)?"
PUBLISHED = re.compile(rf"^# Published \([^)]*\):\s*(?P<value>-?{NUMBER})(?:\s*\+-\s*(?P<spread>{NUMBER}))?")


@dataclasses.dataclass
class PeerRun:
    """One finished (or failed) run: ``curve`` is ``[(env_steps, average_return), ...]``."""
    framework: str
    seed: int
    env_steps: int
    wall_s: float
    curve: list
    error: Optional[str] = None
    commit: Optional[str] = None  # the alfish commit that ran it ("+dirty": with uncommitted changes); None: not known

    @classmethod
    def read(cls, path: pathlib.Path) -> "PeerRun":
        """A ``run.json`` back (plain JSON, its known fields only); a damaged one is a one-line ``ValueError``."""
        try:
            data = json.loads(path.read_text())
            fields = {f.name for f in dataclasses.fields(cls)}
            return cls(**{k: v for k, v in data.items() if k in fields})
        except (ValueError, TypeError, AttributeError) as err:
            raise ValueError(f"{path} is not a run record ({err}); delete it to train that run again") from None

    @property
    def final_return(self) -> Optional[float]:
        return self.curve[-1][1] if self.curve else None

    def return_at(self, env_steps: int) -> Optional[float]:
        """The last evaluation at or before ``env_steps`` (None: none yet)."""
        before = [r for s, r in self.curve if s <= env_steps]
        return before[-1] if before else None


def published_figure(conf: pathlib.Path) -> str:
    """The conf header's ``# Published (...): X +- Y`` figure, as ``'X +- Y'`` (``'-'``: none declared)."""
    for line in conf.read_text().splitlines():
        match = PUBLISHED.match(line)
        if match:
            return match["value"] + (f" ± {match['spread']}" if match["spread"] else "")
    return "-"


def _eval_records(root: pathlib.Path) -> list[dict]:
    path = root / "eval_log.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _command(framework: str, conf: pathlib.Path, root: pathlib.Path, params: Sequence[str]) -> list[str]:
    """The run's command; an interrupted run (checkpoints in ``root``, no ``run.json``) resumes from its checkpoint
    (alfish's own exact resume; the SB3 peer's checkpoints, see ``sb3_peer.py``)."""
    if framework == "alfish":
        command = [sys.executable, "-m", "alfish.bin.train", "--conf", str(conf), "--root_dir", str(root)]
        if not any((root / "checkpoints").glob("ckpt-*")):  # (best/ alone is not a resume point)
            command.append("--fresh")  # moves a previous unfinished run without checkpoints aside
        params = [*params, "Trainer.num_threads=1"]
    else:
        command = [sys.executable, str(REPO / "scripts" / "sb3_peer.py"), "--conf", str(conf), "--root_dir", str(root)]
    for param in params:
        command += ["--conf_param", param]
    return command


def git_commit() -> Optional[str]:
    """This checkout's commit (short), ``+dirty`` with uncommitted changes to tracked files; None outside git."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             timeout=30, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+dirty" if dirty else "")


def run_one(framework: str, conf: pathlib.Path, seed: int, env_steps: int, out: pathlib.Path,
            extra: Sequence[str], timeout_s: float, record_dir: Optional[pathlib.Path] = None,
            train: bool = True) -> Optional[PeerRun]:
    """Train ``conf`` with ``framework`` (or read the finished run back, from ``out`` or ``record_dir``); its
    ``PeerRun``. A finished run is also recorded in ``record_dir`` (``--record``). ``train=False``
    (``--table_only``): None for a run that has no record, instead of training it."""
    where = pathlib.Path(conf.stem) / framework / f"seed-{seed}"
    root, record = out / where, out / where / "run.json"
    kept = record_dir / where / "run.json" if record_dir is not None else None
    for path in (record, kept):
        if path is not None and path.exists():
            run = PeerRun.read(path)
            if run.env_steps != env_steps:
                raise ValueError(f"{path.parent} holds a run of {run.env_steps} env steps, not {env_steps}; use "
                                 "another --out (or --record)")
            if kept is not None and not kept.exists():
                _write_record(kept, run)
            if not record.exists():  # recorded in another session: its curve into OUT too, for the plot
                _write_record(record, run)
                if not (root / "eval_log.jsonl").exists():
                    (root / "eval_log.jsonl").write_text("".join(
                        json.dumps(dict(env_steps=steps, average_return=value)) + "\n" for steps, value in run.curve))
            return run
    if not train:
        return None
    params = [f"TrainerConfig.random_seed={seed}", f"TrainerConfig.num_env_steps={env_steps}",
              "TrainerConfig.num_iterations=0", *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))  # this alfish
    root.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    try:
        proc = subprocess.run(_command(framework, conf, root, params), cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=timeout_s)
        error = None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["?"])[-1]
    except subprocess.TimeoutExpired:
        error = f"did not finish within {timeout_s:.0f} s"
    records = _eval_records(root)
    # the wall-clock is the run's own clock at its final evaluation when it has one: both frameworks' clocks
    # continue from a checkpoint's after a resume, so work lost to an interruption is not counted
    wall_s = float(records[-1]["elapsed_s"]) if records and error is None else time.monotonic() - start
    run = PeerRun(framework, seed, env_steps, wall_s, [(int(r["env_steps"]), float(r["average_return"]))
                                                      for r in records], error, git_commit())
    if error is None:  # a failed run is tried again next time
        for path in filter(None, (record, kept)):
            _write_record(path, run)
    return run


def _write_record(path: pathlib.Path, run: PeerRun) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(run)) + "\n")
    os.replace(tmp, path)  # (atomic: a record is whole or absent)


def _iqm_cell(values: list[float], seed: int = 0) -> str:
    from alfish.tools.stats import bootstrap_ci, iqm

    if not values:
        return "-"
    array = np.asarray(values, dtype=np.float64)[:, None]
    centre = float(iqm(array)[0])
    if len(values) < 2:
        return f"{centre:.0f}"
    low, high = bootstrap_ci(array, seed=seed)
    return f"{centre:.0f} [{float(low[0]):.0f}, {float(high[0]):.0f}]"


def task_rows(conf: pathlib.Path, runs: Sequence[PeerRun], env_steps: int) -> list[list[str]]:
    """One table row per framework for ``conf``'s ``runs``."""
    rows = []
    for framework in FRAMEWORKS:
        done = [r for r in runs if r.framework == framework and r.error is None]
        failed = [r for r in runs if r.framework == framework and r.error is not None]
        finals = [r.final_return for r in done if r.final_return is not None]
        halves = [v for v in (r.return_at(env_steps // 2) for r in done) if v is not None]
        wall = f"{np.median([r.wall_s for r in done]):.0f} s" if done else "-"
        rows.append([conf.stem, framework, f"{len(done)}" + (f" ({len(failed)} failed)" if failed else ""),
                     _iqm_cell(finals), _iqm_cell(halves), wall, published_figure(conf)])
    return rows


HEADER = ["task", "framework", "seeds", "final IQM [95% CI]", "IQM at half budget", "wall/seed", "RL Zoo (published)"]


def markdown_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def plot(conf: pathlib.Path, out: pathlib.Path) -> Optional[str]:
    """Both frameworks' IQM curves of ``conf`` to ``OUT/<conf>.png``; the error line when they cannot be drawn."""
    from alfish.tools import plot as plot_tool

    base = out / conf.stem
    runs = [f"--run={fw}={','.join(str(p) for p in sorted((base / fw).glob('seed-*')) if (p / 'run.json').exists())}"
            for fw in FRAMEWORKS]
    if any(r.endswith("=") for r in runs):
        return "not every framework has a finished run yet"
    code = plot_tool.main([*runs, "--iqm", "--title", conf.stem, "-o", str(out / f"{conf.stem}.png")])
    return None if code == 0 else "the plot tool failed (see above)"


class PeerTask(NamedTuple):
    """One conf of a suite: trained to ``env_steps`` with seeds ``first_seed .. seeds - 1``."""
    conf: pathlib.Path
    seeds: int
    env_steps: int


def run_suite(tasks: Sequence[PeerTask], out: pathlib.Path, extra: Sequence[str], timeout_s: float, parallel: int,
              record_dir: Optional[pathlib.Path] = None, train: bool = True, first_seed: int = 0,
              train_frameworks: Sequence[str] = FRAMEWORKS) -> list[list[str]]:
    """Train every task's conf with both frameworks, seed by seed (alfish, then SB3: alternating processes that see
    the same machine load); the table rows, task by task. Every task's runs are queued at once, so no core idles at
    the end of one conf while its last run finishes. ``train=False``: the rows and plots of the recorded runs only.
    ``first_seed``: the seeds below it are neither trained nor tabled (another session's, not recorded).
    ``train_frameworks``: only these frameworks' missing runs train; the others' are tabled where recorded (after a
    change to alfish that supersedes its records while the peer's stay valid)."""
    import concurrent.futures

    rows = []
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        jobs = [[pool.submit(run_one, fw, task.conf, seed, task.env_steps, out, extra, timeout_s, record_dir,
                             train and fw in train_frameworks)
                 for seed in range(first_seed, task.seeds) for fw in FRAMEWORKS] for task in tasks]
        for task, task_jobs in zip(tasks, jobs):
            runs = []
            for job in task_jobs:
                run = job.result()
                if run is None:  # (--table_only: not recorded yet)
                    continue
                runs.append(run)
                print(f"{task.conf.stem} {run.framework} seed {run.seed}: final {run.final_return}, "
                      f"{run.wall_s:.0f} s" + (f", error: {run.error}" if run.error else ""), flush=True)
            rows += task_rows(task.conf, runs, task.env_steps)
            problem = plot(task.conf, out)
            if problem:
                print(f"{task.conf.stem}: no plot ({problem})", flush=True)
    return rows
