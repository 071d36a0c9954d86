"""End to end: ``python -m alfish.bin.play`` on a results directory that an attacker controlled entirely (its
checkpoint re-sealed, so it verifies) runs none of their code, and a run of the user's own env package plays once the
user trusts that package with --allow_import. Also: --record_file is checked before any episode is played."""
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

from alfish.bin import play
from alfish.rundir.checkpoint import Checkpointer

from .inprocess import CONFS, REPO

pytestmark = [pytest.mark.cli]

ENV_MODULE = "untrusted_test_envs"  # the user's own env package
MARKER_MODULE = "untrusted_test_marker"  # writes a marker file when imported
ENV_MODULE_SOURCE = '''\
"""A tiny env registered on import, standing in for a user's own env package."""
import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    """Step right (action 1) to the end of a 4-cell corridor: reward -1 per step, at most 8 steps."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}
    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode
        self.position = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.position = max(0, self.position + (1 if int(action) == 1 else -1))
        return np.array([self.position / 3], np.float32), -1.0, self.position == 3, False, {}

    def render(self):
        frame = np.zeros((8, 32, 3), np.uint8)
        frame[:, 8 * self.position:8 * self.position + 8] = 255
        return frame


gym.register(id="UntrustedTest/Corridor-v0", entry_point=Corridor, max_episode_steps=8)
'''
# The conf given to train is trusted: it imports the user's env package. Two iterations of A2C, one checkpoint.
CONF = f"""\
import {ENV_MODULE}
include '{CONFS / "a2c_cartpole.gin"}'
create_environment.env_name = 'UntrustedTest/Corridor-v0'
create_environment.num_parallel_environments = 2
TrainerConfig.num_env_steps = 32
TrainerConfig.evaluate = False
TrainerConfig.num_checkpoints = 1
"""
EPISODE = r"^episode 1: return -\d+\.00 length \d+$"


def child_env(pythonpath: pathlib.Path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", SDL_VIDEODRIVER="dummy", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(pythonpath), str(REPO)]))
    env.pop("DISPLAY", None)
    return env


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> pathlib.Path:
    """A finished run of the user's env: <dir>/root, with the env package in <dir>/pkgs."""
    work = tmp_path_factory.mktemp("user")
    (work / "pkgs").mkdir()
    (work / "pkgs" / f"{ENV_MODULE}.py").write_text(ENV_MODULE_SOURCE)
    (work / "user.gin").write_text(CONF)
    proc = subprocess.run([sys.executable, "-m", "alfish.bin.train", "--conf", "user.gin", "--root_dir", "root"],
                          cwd=work, env=child_env(work / "pkgs"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work


@pytest.fixture
def work(trained, tmp_path) -> pathlib.Path:
    """A copy of the trained run that a test may tamper with, and a marker module importable from its cwd."""
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    (tmp_path / f"{MARKER_MODULE}.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    return tmp_path


def run_play(work: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "alfish.bin.play", "--root_dir", "root", *args], cwd=work,
                          env=child_env(work / "pkgs"), capture_output=True, text=True, timeout=120)


def checkpoint_dir(work: pathlib.Path) -> pathlib.Path:
    (step,) = Checkpointer(str(work / "root" / "checkpoints")).steps()
    return work / "root" / "checkpoints" / f"ckpt-{step}"


def stored_config(work: pathlib.Path) -> str:
    return json.loads((checkpoint_dir(work) / "meta.json").read_text())["operative_config"]


def tamper(work: pathlib.Path, operative_config: str) -> None:
    """Replaces the stored config and re-seals the manifest, as an attacker who controls the directory would."""
    path = checkpoint_dir(work)
    meta = json.loads((path / "meta.json").read_text())
    meta["operative_config"] = operative_config
    data = json.dumps(meta).encode()
    (path / "meta.json").write_bytes(data)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["meta.json"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (path / "manifest.json").write_text(json.dumps(manifest))
    Checkpointer(str(path.parent)).load_latest()  # it verifies: nothing marks the checkpoint as tampered with
    assert Checkpointer(str(path.parent)).load_latest().meta["operative_config"] == operative_config


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The only non-empty stderr line of a play that exited with 2 before any episode."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "episode" not in proc.stdout
    return lines[0]


def stored(work: pathlib.Path) -> str:
    """How play names the stored config in its errors: lines count within the operative_config string."""
    return f"{checkpoint_dir(work)}/meta.json[operative_config]"


@pytest.mark.timeout(120)
def test_users_env_package_plays_only_once_trusted(work):
    line = one_error_line(run_play(work))
    assert line == (f"error: {stored(work)}:1: import of module '{ENV_MODULE}' is not allowed in a stored config "
                    f"(trusted: 'alfish'); if you trust that module, pass --allow_import {ENV_MODULE}")
    gif = work / "new" / "dir" / "out.gif"  # a directory that does not exist yet is created
    proc = run_play(work, "--allow_import", ENV_MODULE, "--record_file", str(gif))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len([m for m in proc.stdout.splitlines() if m.startswith("episode 1: return -")]) == 1, proc.stdout
    assert gif.read_bytes()[:6] in (b"GIF87a", b"GIF89a")


@pytest.mark.timeout(120)
def test_module_env_name_of_users_package_plays_once_trusted(work):
    # The same run, naming its env 'module:EnvId' instead of importing the module: gymnasium imports it.
    text = stored_config(work).replace(f"import {ENV_MODULE}\n", "").replace(
        "'UntrustedTest/Corridor-v0'", f"'{ENV_MODULE}:UntrustedTest/Corridor-v0'")
    tamper(work, text)
    proc = run_play(work, "--allow_import", ENV_MODULE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "episode 1: return -" in proc.stdout


@pytest.mark.timeout(120)
def test_dynamic_registration_payload_is_refused(work):
    marker = work / "pwned"
    payload = textwrap.dedent(f"""\
        from __gin__ import dynamic_registration
        import alfish.rundir.checkpoint
        alfish.rundir.checkpoint.os.system.command = 'touch {marker}'
        alfish.config.trainer_config.TrainerConfig.random_seed = @alfish.rundir.checkpoint.os.system()
        """)
    tamper(work, payload + stored_config(work))
    line = one_error_line(run_play(work, "--allow_import", ENV_MODULE))
    assert line == (f"error: {stored(work)}:1: 'from __gin__ import dynamic_registration' is not allowed in a stored "
                    f"config (it makes any function reachable from an imported module callable); if you trust this "
                    f"root_dir completely, pass --allow_import '*'")
    assert not marker.exists()


@pytest.mark.timeout(120)
def test_module_env_name_payload_is_refused(work):
    text = stored_config(work).replace("'UntrustedTest/Corridor-v0'", f"'{MARKER_MODULE}:Evil-v0'")
    line_number = text.splitlines().index(f"create_environment.env_name = '{MARKER_MODULE}:Evil-v0'") + 1
    tamper(work, text)
    line = one_error_line(run_play(work, "--allow_import", ENV_MODULE))
    assert line == (f"error: {stored(work)}:{line_number}: create_environment.env_name names env "
                    f"'{MARKER_MODULE}:Evil-v0', and gymnasium would import module '{MARKER_MODULE}' to make it; a "
                    f"stored config may not import modules: if you trust that module, pass --allow_import "
                    f"{MARKER_MODULE}")
    assert not (work / "imported").exists()


# ----------------------------------------------------------------------------------------------------------------
# --record_file, checked in this process (play.main) before anything is loaded


def play_error(capsys, *args: str) -> str:
    assert play.main(["--root_dir", "no_such_dir", *args]) == 2
    captured = capsys.readouterr()
    assert "episode" not in captured.out
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    return lines[0]


def test_record_file_extension(capsys):
    assert play_error(capsys, "--record_file", "out.avi") == "error: --record_file 'out.avi' must end with one of " \
                                                            ".mp4, .gif"


def test_record_file_directory_must_be_writable(capsys, tmp_path):
    (tmp_path / "a_file").write_text("")
    path = str(tmp_path / "a_file" / "sub" / "out.gif")
    assert play_error(capsys, "--record_file", path) == (
        f"error: --record_file {path!r} cannot be written: {tmp_path / 'a_file'} is a file, not a directory")
    (tmp_path / "out.gif").mkdir()
    assert play_error(capsys, "--record_file", str(tmp_path / "out.gif")) == (
        f"error: --record_file {str(tmp_path / 'out.gif')!r} is a directory; give a file name ending with .mp4 or "
        f".gif")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into any directory")
def test_record_file_directory_without_write_permission(capsys, tmp_path):
    (tmp_path / "locked").mkdir(mode=0o555)
    path = str(tmp_path / "locked" / "out.gif")
    assert play_error(capsys, "--record_file", path) == (
        f"error: --record_file {path!r} cannot be written: {tmp_path / 'locked'} is not writable (Permission "
        f"denied); choose another directory")


def test_record_file_needs_the_render_extra(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # what Python does for a module that is not installed
    path = str(tmp_path / "out.mp4")
    assert play_error(capsys, "--record_file", path) == (
        f"error: --record_file {path!r} needs imageio's ffmpeg plugin, which is not installed: "
        f"pip install 'alfish[render]' (or record a .gif)")
    monkeypatch.setitem(sys.modules, "imageio", None)
    monkeypatch.setitem(sys.modules, "imageio.v2", None)
    assert play_error(capsys, "--record_file", str(tmp_path / "out.gif")) == (
        "error: --record_file needs imageio, which is not installed: pip install 'alfish[render]'")


def test_bad_arguments_are_one_line(capsys):
    assert play_error(capsys, "--num_episodes", "0") == "error: --num_episodes 0 must be >= 1"
    assert play_error(capsys, "--allow_import", "my-envs").startswith(
        "error: --allow_import 'my-envs' is not a module name")
