"""Rendering envs (play, evaluation videos) without ``XDG_RUNTIME_DIR``: SDL's own error line is not printed, and the
folder alfish points the variable at is private to this user."""
import os
import stat
import subprocess
import sys
import tempfile

from alfish.envs import sdl_runtime


def test_a_rendering_env_prints_no_sdl_runtime_dir_error(tmp_path):
    code = ("from alfish.envs.factory import EnvFactory\n"
            "env = EnvFactory.here('CartPole-v1', {}, 'rgb_array')()\n"
            "env.reset(seed=0)\n"
            "print(env.render().shape)\n")
    environ = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    environ["TMPDIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=environ)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "(400, 600, 3)"
    assert "XDG_RUNTIME_DIR" not in done.stderr, done.stderr  # (pygame's SDL prints it when the variable is unset)


def test_the_runtime_dir_is_private_and_a_foreign_or_open_one_is_not_used(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    open_dir = tmp_path / f"alfish-runtime-{os.getuid()}"
    open_dir.mkdir(mode=0o755)
    os.chmod(open_dir, 0o755)  # (mkdir's mode is masked by the umask)
    chosen = sdl_runtime.ensure_runtime_dir()
    assert chosen != str(open_dir) and os.environ["XDG_RUNTIME_DIR"] == chosen
    assert stat.S_IMODE(os.stat(chosen).st_mode) == 0o700 and os.stat(chosen).st_uid == os.getuid()
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    open_dir.rmdir()
    assert sdl_runtime.ensure_runtime_dir() == str(open_dir)  # made by us, 0700: the stable name is used
    assert stat.S_IMODE(os.stat(open_dir).st_mode) == 0o700
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert sdl_runtime.ensure_runtime_dir() == str(tmp_path)  # a valid one is left as it is
