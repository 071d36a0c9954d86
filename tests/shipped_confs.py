"""The shipped confs, and which of them need an optional extra: tests that run every conf skip those (with the reason)
where the extra is not installed, as in CI."""
from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

# conf -> the modules it needs beyond the test extras, and the install line that brings them
NEEDS = {name: (("ale_py", "cv2"), "pip install alfish[atari]")
         for name in ("dqn_pong.gin", "dqn_breakout.gin", "ppo_pong.gin", "ppo_breakout.gin")}
# The RL Zoo benchmark confs (issue 30). The test extra installs MuJoCo, and Box2D where it comes as a wheel (Python
# < 3.14); elsewhere (`pip install alfish[box2d]` on 3.14 builds box2d-py with swig and a compiler) these skip.
MUJOCO_CONFS = tuple(f"{algo}_{env}.gin" for algo in ("sac", "td3", "ppo")
                     for env in ("halfcheetah", "hopper", "walker2d", "ant"))
BOX2D_CONFS = ("ppo_lunarlander.gin", "dqn_lunarlander.gin", "sac_lunarlander_continuous.gin",
               "td3_lunarlander_continuous.gin", "td3_bipedalwalker.gin", "ppo_bipedalwalker.gin",
               "sac_bipedalwalker.gin")
# The RL Zoo benchmark confs on gymnasium's classic-control envs (no extra needed).
CLASSIC_CONTROL_CONFS = ("sac_mountaincar_continuous.gin",)
NEEDS.update({name: (("mujoco",), "pip install alfish[mujoco]") for name in MUJOCO_CONFS})
NEEDS.update({name: (("Box2D",), "pip install alfish[box2d]") for name in BOX2D_CONFS})


def skip_unless_installed(conf: str) -> None:
    """Skip the calling test if ``conf`` needs a module that is not installed."""
    modules, install = NEEDS.get(conf, ((), ""))
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{conf} needs {', '.join(missing)}: {install}")


# conf -> the gin macro naming its offline dataset: tests that run every conf give it a small dataset of their own
OFFLINE_DATA = {name: "DATASET" for name in ("bc_pendulum.gin", "iql_pendulum.gin", "sac_pendulum_hybrid.gin")}


def data_params(conf: str, folder: pathlib.Path) -> list[str]:
    """The bindings that point ``conf``'s offline dataset at a small one made in ``folder`` (none for online confs):
    two episodes of random actions in Pendulum-v1, as D4RL arrays."""
    if conf not in OFFLINE_DATA:
        return []
    from tests.offline.datasets import rollouts

    path = folder / "pendulum_random.npz"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(path, **rollouts("Pendulum-v1", lambda obs, rng: rng.uniform(-2, 2, 1).astype(np.float32), 2))
    return [f"{OFFLINE_DATA[conf]} = '{path}'"]
