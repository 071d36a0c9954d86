"""``python -m alfish.tools.compare``: the table's numbers equal those computed by hand from synthetic eval logs (final,
best and where, env steps to a threshold, env steps/s, wall-clock), in every format; real runs' rows equal what their
eval logs say; the ``tools/compare.py`` wrapper runs this checkout's code from any directory."""
import csv
import io
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from alfish.tools import compare
from tests.integration.inprocess import eval_log
from tests.tools.synthetic import RATES, seeds, write_eval_log

REPO = pathlib.Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.timeout(60)]

# By hand from tests/tools/synthetic.py: the three seeds' mean return at env steps 1000 k is SHAPE[k] + 2, i.e.
# 2, 3, 4, 5, 6, 7, 8, 9, 8.5, 8, 7.5; seed 2 alone is SHAPE[k] + 4. Each seed takes 10000 env steps at RATES[i]
# steps/s, so its last elapsed_s is 10000 / RATES[i]: 20, 10 and 5 s.
GROUP = dict(run="three", runs=3, env_steps=10000.0, final=7.5, best=9.0, best_at_env_steps=7000.0, threshold=5.0,
             env_steps_to_threshold=3000.0, env_steps_per_s=sum(RATES) / 3, wall_clock_s=35 / 3)
SEED_2 = dict(runs=1, env_steps=10000.0, final=9.5, best=11.0, best_at_env_steps=7000.0, threshold=5.0,
              env_steps_to_threshold=1000.0, env_steps_per_s=2000.0, wall_clock_s=5.0)


def as_json(capsys, argv):
    assert compare.main(argv + ["--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_rows_equal_the_hand_computed_values(tmp_path, capsys):
    dirs = seeds(tmp_path)
    group, single = as_json(capsys, [f"--run=three={tmp_path}/seed-*", str(dirs[2]), "--threshold", "5"])
    assert group == pytest.approx(GROUP)
    assert single == pytest.approx(dict(SEED_2, run=str(dirs[2])))


def test_a_threshold_never_reached_and_no_threshold(tmp_path, capsys):
    seeds(tmp_path)
    [row] = as_json(capsys, [f"--run=three={tmp_path}/seed-*", "--threshold", "9.5"])
    assert row["env_steps_to_threshold"] is None
    [row] = as_json(capsys, [f"--run=three={tmp_path}/seed-*"])
    assert "threshold" not in row and "env_steps_to_threshold" not in row


def test_the_mean_from_env_steps_averages_the_mean_curve_from_there(tmp_path, capsys):
    dirs = seeds(tmp_path)
    # by hand (the comment above GROUP): the group's mean curve at 7000..10000 is 9, 8.5, 8, 7.5 -> 8.25; seed 2
    # alone is 2 above it -> 10.25. From 7500 on: 8.5, 8, 7.5 -> 8.0 (the curve's own env steps, not interpolated).
    group, single = as_json(capsys, [f"--run=three={tmp_path}/seed-*", str(dirs[2]), "--mean_from", "7000"])
    assert group["mean_from_env_steps"] == 7000.0 and group["mean_return_from"] == pytest.approx(8.25)
    assert single["mean_return_from"] == pytest.approx(10.25)
    [group] = as_json(capsys, [f"--run=three={tmp_path}/seed-*", "--mean_from", "7500"])
    assert group["mean_return_from"] == pytest.approx(8.0)
    [group] = as_json(capsys, [f"--run=three={tmp_path}/seed-*", "--mean_from", "20000"])  # past the last evaluation
    assert group["mean_return_from"] is None
    assert compare.main([f"--run=three={tmp_path}/seed-*", "--mean_from", "7000"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert "mean >= 7000  steps/s" in header and row.split()[-3] == "8.25"
    [group] = as_json(capsys, [f"--run=three={tmp_path}/seed-*"])  # not asked: no such key
    assert "mean_return_from" not in group


def test_a_group_is_read_only_where_all_its_runs_have_data(tmp_path, capsys):
    [first, *_] = seeds(tmp_path)
    # a second run at a constant 3, evaluated in between (500, 1500, ...) and only to 8500 env steps
    write_eval_log(tmp_path / "short", [dict(iteration=k, env_steps=1000 * k + 500, elapsed_s=k + 1.0,
                                             average_return=3.0) for k in range(9)])
    [row] = as_json(capsys, [f"--run=two={first},{tmp_path}/short"])
    # the grid is every env step of either run within 500..8500; the first run is interpolated at 8500 (between
    # 8000 -> 6.5 and 9000 -> 6): 6.25
    assert row["env_steps"] == 8500.0 and row["final"] == pytest.approx((6.25 + 3) / 2)
    assert row["best"] == pytest.approx((7 + 3) / 2) and row["best_at_env_steps"] == 7000.0


def test_text_markdown_and_csv(tmp_path, capsys):
    seeds(tmp_path)
    argv = [f"--run=three={tmp_path}/seed-*", "--threshold", "9.5"]
    assert compare.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split() for line in lines] == [
        ["run", "runs", "env", "steps", "final", "best", "at", "to", ">=", "9.5", "steps/s", "wall-clock", "s"],
        ["three", "3", "10000", "7.50", "9.00", "7000", "-", "1166.7", "11.7"]]
    assert len({len(line) for line in lines}) == 1  # numbers right-aligned: every line ends in the same column
    assert compare.main(argv + ["--format", "markdown"]) == 0
    assert capsys.readouterr().out == (
        "| run | runs | env steps | final | best | at | to >= 9.5 | steps/s | wall-clock s |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        "| three | 3 | 10000 | 7.50 | 9.00 | 7000 | - | 1166.7 | 11.7 |\n")
    assert compare.main(argv + ["--format", "csv"]) == 0
    [row] = csv.DictReader(io.StringIO(capsys.readouterr().out))
    assert row["env_steps_to_threshold"] == "-" and float(row["final"]) == 7.5
    assert float(row["env_steps_per_s"]) == pytest.approx(3500 / 3)


def test_real_runs_rows_are_what_their_eval_logs_say(real_runs, capsys):
    logs = [eval_log(root) for root in real_runs]
    assert [r["env_steps"] for r in logs[0]] == [r["env_steps"] for r in logs[1]]  # the same evaluation points
    [row] = as_json(capsys, [f"--run=sac={real_runs[0]},{real_runs[1]}"])
    assert row["final"] == pytest.approx(np.mean([log[-1]["average_return"] for log in logs]))
    assert row["env_steps"] == logs[0][-1]["env_steps"]
    assert row["env_steps_per_s"] == pytest.approx(np.mean([log[-1]["env_steps"] / log[-1]["elapsed_s"]
                                                            for log in logs]))
    assert row["wall_clock_s"] == pytest.approx(np.mean([log[-1]["elapsed_s"] for log in logs]))


def test_a_bad_directory_exits_2_with_one_line(tmp_path, capsys):
    assert compare.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {tmp_path} has no eval_log.jsonl (trained without TrainerConfig.evaluate?); plot a " \
                  "TensorBoard scalar with --tag instead\n"


def test_the_wrapper_runs_this_checkouts_code_from_anywhere(tmp_path):
    [_, _, run] = seeds(tmp_path)
    done = subprocess.run([sys.executable, str(REPO / "tools" / "compare.py"), str(run), "--format", "json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)
    assert row["final"] == SEED_2["final"]
