"""``python -m alfish.tools.grid_search``: 2x2 points of a toy conf (PPO on CartPole, 4 iterations), in parallel
processes; each point's runs got its bindings; the summary table has a row per point; a second search trains
nothing again, and a run whose marker is gone is trained again (resumed from its checkpoint); bad grids are one
line."""
import json
import os

import pytest

from alfish.tools import grid_search
from tests.integration.inprocess import CONFS

pytestmark = [pytest.mark.timeout(180)]

GRID = ["--grid", "PpoAlgorithm.lr=[1e-3, 3e-3]", "--grid", "PpoAlgorithm.gae_lambda=[0.8, 0.9]"]


def tiny_conf(tmp_path):
    conf = tmp_path / "ppo.gin"
    conf.write_text((CONFS / "ppo_cartpole.gin").read_text() + """
TrainerConfig.num_env_steps = 0
TrainerConfig.num_iterations = 4
TrainerConfig.eval_interval = 2
TrainerConfig.async_eval = False
TrainerConfig.num_checkpoints = 1
TrainerConfig.num_eval_episodes = 2
""")
    return conf


@pytest.mark.slow  # four training runs (14 s); the failing-run test keeps the grid tool in the default run
def test_a_2x2_grid_trains_every_point_and_resumes(tmp_path, capsys):
    conf, root = tiny_conf(tmp_path), tmp_path / "grid"
    assert grid_search.main(["--conf", str(conf), "--root_dir", str(root), *GRID, "--parallel", "2"]) == 0
    out = capsys.readouterr().out
    points = sorted(p for p in os.listdir(root) if os.path.isdir(root / p) and p != "hparams")
    assert points == ["lr=0.001,gae_lambda=0.8", "lr=0.001,gae_lambda=0.9", "lr=0.003,gae_lambda=0.8",
                      "lr=0.003,gae_lambda=0.9"]
    for point in points:
        run = root / point / "seed-0"
        operative = (run / "config" / "operative.gin").read_text()
        lr, lam = (part.split("=")[1] for part in point.split(","))
        assert f"PpoAlgorithm.lr = {lr}" in operative and f"PpoAlgorithm.gae_lambda = {lam}" in operative
        assert [json.loads(line)["iteration"] for line in (run / "eval_log.jsonl").read_text().splitlines()] == [2, 4]
        assert (run / grid_search.DONE).exists()
        assert (root / "hparams" / point / "seed-0").is_dir()  # its TensorBoard HParams session
    summary = json.loads((root / "grid_summary.json").read_text())
    assert sorted(row["run"] for row in summary) == points
    assert all(row["runs"] == 1 for row in summary)
    assert "lr=0.003,gae_lambda=0.9" in out and "4 points x 1 seeds = 4 runs" in out

    # again: nothing is trained; then a run without its marker is trained again, resuming from its checkpoint
    os.remove(root / points[0] / "seed-0" / grid_search.DONE)
    assert grid_search.main(["--conf", str(conf), "--root_dir", str(root), *GRID,
                             "--conf_param", "TrainerConfig.num_iterations=6"]) == 0
    out = capsys.readouterr().out
    assert out.count("finished earlier") == 3
    log = (root / points[0] / "seed-0" / "log.txt").read_text()
    assert "resumed from" in log and "ckpt-4" in log
    assert [json.loads(line)["iteration"] for line in
            (root / points[0] / "seed-0" / "eval_log.jsonl").read_text().splitlines()] == [2, 4, 6]


def test_a_failing_run_is_reported_and_the_exit_status_is_1(tmp_path, capsys):
    conf = tiny_conf(tmp_path)
    assert grid_search.main(["--conf", str(conf), "--root_dir", str(tmp_path / "g"),
                             "--grid", "PpoAlgorithm.lr=[1e-3, -1.0]"]) == 1
    captured = capsys.readouterr()
    assert "failed: lr=-1.0 seed 0" in captured.err
    assert "lr=0.001" in captured.out  # the run that finished is in the table


@pytest.mark.parametrize("args, message", [
    (["--grid", "lr=[1]"], "--grid 'lr=[1]' must be NAME=[values]"),
    (["--grid", "PpoAlgorithm.lr=[open('x')]"], "is not a list of Python literals"),
    (["--grid", "PpoAlgorithm.lr=[]"], "give a non-empty list of values"),
    ([], "give the grid with --grid"),
    (["--grid", "PpoAlgorithm.lr=[1]", "--seeds", "0"], "--seeds 0 must be >= 1"),
])
def test_bad_grids_are_one_line(tmp_path, capsys, args, message):
    assert grid_search.main(["--conf", str(tiny_conf(tmp_path)), "--root_dir", str(tmp_path / "g"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_alfs_grid_file(tmp_path):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"desc": "ALF's format", "parameters": {"PpoAlgorithm.lr": [1e-3, 3e-4]},
                                "repeats": 2}))
    points, seeds = grid_search.check_args(grid_search.parse_args(
        ["--conf", str(tiny_conf(tmp_path)), "--root_dir", "x", "--grid_file", str(grid)]))
    assert [p.name for p in points] == ["lr=0.001", "lr=0.0003"] and seeds == 2
