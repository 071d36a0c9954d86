"""scripts/pendulum_dataset.py (the offline examples' dataset): writes into a folder that does not exist yet (the
README's `runs/datasets/...` on a fresh clone), and the file is a D4RL-style dataset alfish loads."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pendulum_dataset.py"


def test_the_dataset_script_makes_its_folder_and_writes_episodes_of_200_steps(tmp_path):
    out = tmp_path / "runs" / "datasets" / "pendulum.npz"  # neither folder exists
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--num_steps", "400", "--noise", "0.3"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    assert summary["episodes"] == 2 and -400 < summary["episode_return_mean"] < 0
    data = np.load(out)
    assert data["observations"].shape == (400, 3) and data["actions"].shape == (400, 1)
    assert data["timeouts"].nonzero()[0].tolist() == [199, 399] and not data["terminals"].any()
