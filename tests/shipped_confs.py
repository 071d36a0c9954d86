"""The shipped confs, and which of them need an optional extra: tests that run every conf skip those (with the reason)
where the extra is not installed, as in CI."""
from __future__ import annotations

import importlib.util

import pytest

# conf -> the modules it needs beyond the test extras, and the install line that brings them
NEEDS = {name: (("ale_py", "cv2"), "pip install alfish[atari]")
         for name in ("dqn_pong.gin", "dqn_breakout.gin", "ppo_pong.gin", "ppo_breakout.gin")}


def skip_unless_installed(conf: str) -> None:
    """Skip the calling test if ``conf`` needs a module that is not installed."""
    modules, install = NEEDS.get(conf, ((), ""))
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{conf} needs {', '.join(missing)}: {install}")
