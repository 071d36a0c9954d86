"""A dataset twice the size of the memory allowed for it trains within that cap: the offline buffer reads it through
memory-mapped files page by page (RLIMIT_DATA caps private memory; the mapped file's pages do not count)."""
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np

from alfish.data.types import StepType
from alfish.replay.offline.alfish_format import DatasetWriter
from alfish.replay.offline.steps import Steps

ALLOW_MB = 96
DATASET_MB = 2 * ALLOW_MB
EPISODE = 10


def make_dataset(out) -> int:
    # PointGoal-shaped steps (1 float observed, 1 float action): 17 bytes per step; the observations alone are
    # DATASET_MB, i.e. twice the allowance, before the actions, rewards, discounts and step types are counted.
    rows = (DATASET_MB << 20) // 4
    rows -= rows % EPISODE
    writer = DatasetWriter(out)
    observation = writer.allocate("observation", (rows, 1), np.float32)
    step_type = writer.allocate("step_type", (rows,), np.int8)
    chunk = 1 << 20
    pattern = np.full(EPISODE, StepType.MID, np.int8)
    pattern[0], pattern[-1] = StepType.FIRST, StepType.LAST
    for lo in range(0, rows, chunk):
        n = min(chunk, rows - lo)
        observation[lo:lo + n, 0] = np.linspace(0.8, 0.0, EPISODE, dtype=np.float32)[np.arange(lo, lo + n) % EPISODE]
        step_type[lo:lo + n] = pattern[np.arange(lo, lo + n) % EPISODE]
    reward = writer.allocate("reward", (rows,), np.float32)
    reward[:] = -np.abs(observation[:, 0])
    discount = writer.allocate("discount", (rows,), np.float32)
    discount[:] = 1.0
    action = writer.allocate("action", (rows, 1), np.float32)
    action[:] = -0.3
    steps = Steps(step_type, reward, discount, observation, action, num_episodes=rows // EPISODE,
                  observation_space=gym.spaces.Box(-2.0, 2.0, (1,), np.float32),
                  action_space=gym.spaces.Box(-1.0, 1.0, (1,), np.float32), source="big")
    writer.finish(steps)
    return rows


def test_a_dataset_twice_the_allowed_memory_trains_within_the_cap(tmp_path):
    rows = make_dataset(tmp_path / "big")
    script = os.path.join(os.path.dirname(__file__), "capped_training.py")
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    out = subprocess.run([sys.executable, script, str(tmp_path / "big"), str(tmp_path / "run"), str(ALLOW_MB)],
                         capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "control: MemoryError" in out.stdout  # the cap bites: the data itself does not fit under it
    assert "trained 400 updates" in out.stdout, out.stdout
    assert rows * 17 >= 2 * (ALLOW_MB << 20)  # observations, actions, rewards, discounts, step types
