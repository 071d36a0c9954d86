"""``python -m alfish.tools.grid_search`` writes a TensorBoard HParams session per finished run (read back as
TensorBoard's HParams tab reads it), once: a second search that trains nothing writes nothing again."""
import json
import os

import pytest

from alfish.tools import grid_search
from tests.tools.hparams_events import read_session
from tests.tools.test_grid_search import tiny_conf

pytestmark = [pytest.mark.timeout(180)]


def test_a_finished_run_has_an_hparams_session(tmp_path, capsys):
    conf, root = tiny_conf(tmp_path), tmp_path / "grid"
    grid = ["--grid", "PpoAlgorithm.lr=[1e-3]", "--grid", "PpoAlgorithm.hidden_sizes=[(32,)]"]
    assert grid_search.main(["--conf", str(conf), "--root_dir", str(root), *grid]) == 0
    point = "lr=0.001,hidden_sizes=(32,)"
    point_dir = point.replace("(", "_").replace(")", "_")  # Point.name keeps only safe characters
    session = root / "hparams" / point_dir / "seed-0"
    hparams, metrics, domains = read_session(session)
    assert hparams == {"PpoAlgorithm.lr": 0.001, "PpoAlgorithm.hidden_sizes": "(32,)", "seed": 0.0}
    returns = [json.loads(line)["average_return"]
               for line in (root / point_dir / "seed-0" / "eval_log.jsonl").read_text().splitlines()]
    assert metrics == {"eval/final_return": [pytest.approx(returns[-1])],
                       "eval/best_return": [pytest.approx(max(returns))]}
    assert domains == {"PpoAlgorithm.lr": [0.001], "PpoAlgorithm.hidden_sizes": ["(32,)"]}

    files = os.listdir(session)
    assert grid_search.main(["--conf", str(conf), "--root_dir", str(root), *grid]) == 0
    assert "finished earlier" in capsys.readouterr().out and os.listdir(session) == files
