"""The console scripts (``alfish-train``, ``alfish-play``, ... from setup.py's entry points) beside ``python -m``.

``python -m alfish.bin.play`` puts the working directory first on ``sys.path``, so a ``json.py`` planted there is
imported instead of the standard library's; an installed console script starts with its own directory there instead.
CI installs with ``pip install -e ".[test]"``, which puts the scripts on PATH; where they are not installed (a checkout
used through PYTHONPATH) the subprocess test is skipped.
"""
import importlib
import os
import runpy
import shutil
import subprocess
import sys
from unittest import mock

import pytest

from .inprocess import REPO

COMMANDS = ("train", "play", "evaluate", "export", "collect")
# Imported instead of the standard library's json when the working directory is on sys.path: it leaves a marker.
PLANTED_JSON = "import pathlib\npathlib.Path(__file__).with_name('IMPORTED').write_text('planted json.py ran')\n"


def declared_console_scripts() -> list[str]:
    """setup.py's ``console_scripts`` entries, read by running setup.py with ``setup`` replaced (nothing is built)."""
    with mock.patch("setuptools.setup") as setup:
        runpy.run_path(str(REPO / "setup.py"))
    return setup.call_args.kwargs["entry_points"]["console_scripts"]


def test_every_command_has_a_console_script_calling_its_main():
    entries = dict(line.replace(" ", "").split("=") for line in declared_console_scripts())
    assert entries == {f"alfish-{name}": f"alfish.bin.{name}:main" for name in COMMANDS}
    for target in entries.values():
        module, _, attr = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attr)), target


def run_in(directory, argv: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=directory, env=env, capture_output=True, text=True, timeout=120)


def test_a_console_script_does_not_import_a_module_planted_in_the_working_directory(tmp_path):
    script = shutil.which("alfish-play")
    if script is None:
        pytest.skip("alfish-play is not installed (pip install -e .); CI installs it")
    (tmp_path / "json.py").write_text(PLANTED_JSON)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    proc = run_in(tmp_path, [script, "--help"], env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--root_dir" in proc.stdout
    assert not (tmp_path / "IMPORTED").exists()
    # The same command through `python -m` imports the planted file: what the console script avoids.
    run_in(tmp_path, [sys.executable, "-m", "alfish.bin.play", "--help"], dict(env, PYTHONPATH=str(REPO)))
    assert (tmp_path / "IMPORTED").read_text() == "planted json.py ran"
