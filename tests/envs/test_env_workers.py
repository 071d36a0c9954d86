"""Env workers (``vectorization='async'``) with real forkserver subprocesses: an env registered by a module the conf
imports works there; a worker killed by a signal, raising, hanging in step or reset, crashing in C or exiting is an
``EnvWorkerError`` naming the env index and pid (and the signal, the worker's traceback or its stack), within seconds;
afterwards every worker is gone and ``close`` returns at once.
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time

import gin
import gymnasium as gym
import pytest
import torch

from alfish.config import load_conf
from alfish.envs.batched_env import BatchedEnv, create_environment
from alfish.envs.contract import EnvContractError
from alfish.envs.workers import EnvWorkerError

from . import misbehaving_envs

pytestmark = [pytest.mark.timeout(60)]
FAULTY = misbehaving_envs.ids("alfish-test/Faulty-v0")
ZERO = torch.zeros(2, dtype=torch.int64)


@pytest.fixture
def make_env():
    envs = []

    def make(env_name=FAULTY, step_timeout_s=30.0, **env_kwargs):
        env = BatchedEnv(env_name, 2, seed=0, vectorization="async", env_kwargs=env_kwargs,
                         step_timeout_s=step_timeout_s)
        envs.append(env)
        return env

    yield make
    for env in envs:
        env.close()


def worker_error(env, action=lambda env: env.step(ZERO), within_s=10.0) -> tuple[str, float]:
    """The EnvWorkerError that ``action`` raises (steps until it does), and the seconds it took."""
    start = time.monotonic()
    with pytest.raises(EnvWorkerError) as info:
        for _ in range(10):
            action(env)
    elapsed = time.monotonic() - start
    assert elapsed < within_s
    return str(info.value), elapsed


def assert_stopped(env, pids):
    """Every worker is gone, using the env again says why, and close returns at once."""
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(EnvWorkerError, match="were stopped after an earlier error: env worker"):
        env.step(ZERO)
    start = time.monotonic()
    env.close()
    assert time.monotonic() - start < 1.0


def pids_of(env):
    return [process.pid for process in env._venv.processes]


# ----------------------------------------------------------------------------------------------- conf imports ---

@pytest.fixture
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def test_env_registered_by_a_module_the_conf_imports_runs_in_async_workers(tmp_path, monkeypatch, clean_gin):
    """The workers import what the conf imported: the module records each process that imports it."""
    marker = tmp_path / "imported_by.txt"
    (tmp_path / "alfish_test_conf_envs.py").write_text(f'''
import os
import gymnasium as gym
import numpy as np

with open({str(marker)!r}, "a") as f:
    f.write(f"{{os.getpid()}}\\n")


class Counting(gym.Env):
    observation_space = gym.spaces.Box(0.0, 100.0, shape=(1,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = 0
        return np.zeros(1, np.float32), {{}}

    def step(self, action):
        self.n += 1 + int(action)
        return np.full(1, self.n, np.float32), 1.0, False, False, {{}}


gym.register(id="alfish-test/ConfImported-v0", entry_point=Counting)
''')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "alfish_test_conf_envs", raising=False)
    monkeypatch.delitem(gym.registry, "alfish-test/ConfImported-v0", raising=False)
    conf = tmp_path / "conf.gin"
    conf.write_text("import alfish_test_conf_envs\n"
                    "create_environment.env_name = 'alfish-test/ConfImported-v0'\n"
                    "create_environment.num_parallel_environments = 2\n"
                    "create_environment.vectorization = 'async'\n")
    load_conf(str(conf))
    env = create_environment(step_timeout_s=30.0)
    try:
        env.reset()
        env.step(torch.tensor([0, 1]))
        assert env.step(torch.tensor([1, 0])).observation[:, 0].tolist() == [3.0, 3.0]
        importers = {int(line) for line in marker.read_text().split()}
        assert set(pids_of(env)) <= importers and os.getpid() in importers
    finally:
        env.close()
    monkeypatch.delitem(gym.registry, "alfish-test/ConfImported-v0", raising=False)


def test_env_registered_only_in_the_trainer_process_is_one_line_naming_the_fix(make_env, clean_gin, monkeypatch):
    monkeypatch.setitem(gym.registry, "alfish-test/ParentOnly-v0",
                        gym.envs.registration.EnvSpec("alfish-test/ParentOnly-v0", misbehaving_envs.Scripted))
    module = misbehaving_envs.__name__
    with pytest.raises(EnvContractError) as info:
        make_env("alfish-test/ParentOnly-v0")
    assert str(info.value) == (
        "env 'alfish-test/ParentOnly-v0' is registered in the trainer process but not in its env workers "
        f"(vectorization='async'): register it in a module the conf imports (a line `import {module}`) or name it "
        f"'{module}:alfish-test/ParentOnly-v0'")


# ----------------------------------------------------------------------------------------------------- deaths ---

def test_worker_killed_while_idle_is_named_with_index_pid_and_signal(make_env):
    env = make_env("CartPole-v1")
    env.reset()
    env.step(ZERO)
    pids = pids_of(env)
    os.kill(pids[1], signal.SIGKILL)
    message, _ = worker_error(env)
    assert re.fullmatch(rf"env worker 1 \(pid {pids[1]}\) of 'CartPole-v1' was killed by signal SIGKILL during "
                        r"step\(\)", message), message
    assert_stopped(env, pids)


def test_worker_killed_while_busy_is_an_error_at_once_not_after_the_timeout(make_env):
    env = make_env(fault="hang", at_step=2, step_timeout_s=50.0)
    env.reset()
    env.step(ZERO)
    pids = pids_of(env)
    threading.Timer(0.5, os.kill, (pids[0], signal.SIGKILL)).start()
    message, elapsed = worker_error(env, within_s=5.0)
    assert re.fullmatch(rf"env worker 0 \(pid {pids[0]}\) of '{re.escape(FAULTY)}' was killed by signal SIGKILL "
                        r"during step\(\)", message), message
    assert elapsed >= 0.5
    assert_stopped(env, pids)


def test_crash_in_c_code_shows_the_signal_and_the_workers_last_words(make_env):
    env = make_env(fault="segfault", at_step=3)
    env.reset()
    pids = pids_of(env)
    message, _ = worker_error(env)
    first, rest = message.split("\n", 1)
    assert re.fullmatch(rf"env worker [01] \(pid \d+\) of '{re.escape(FAULTY)}' was killed by signal SIGSEGV during "
                        r"step\(\); its last words follow", first), first
    assert "Fatal Python error: Segmentation fault" in rest and "in _fail" in rest and ", line " in rest
    assert_stopped(env, pids)


def test_worker_that_exits_names_its_exit_code(make_env):
    env = make_env(fault="exit", at_step=2)
    env.reset()
    pids = pids_of(env)
    message, _ = worker_error(env)
    assert re.fullmatch(rf"env worker [01] \(pid \d+\) of '{re.escape(FAULTY)}' exited with code 3 during step\(\)",
                        message), message
    assert_stopped(env, pids)


# ------------------------------------------------------------------------------------------------- exceptions ---

def test_exception_in_a_worker_shows_a_summary_line_then_the_workers_traceback(make_env):
    env = make_env(fault="raise", at_step=2)
    env.reset()
    pids = pids_of(env)
    message, _ = worker_error(env)
    first, trace = message.split("\n", 1)
    assert re.fullmatch(rf"env worker 0 \(pid {pids[0]}\) of '{re.escape(FAULTY)}' raised ZeroDivisionError: "
                        r"division by zero during step\(\); its traceback follows", first), first
    assert trace.startswith("Traceback (most recent call last):")
    assert 'misbehaving_envs.py", line' in trace and "in divide" in trace
    assert trace.endswith("ZeroDivisionError: division by zero")
    assert_stopped(env, pids)


# ------------------------------------------------------------------------------------------------------ hangs ---

@pytest.mark.parametrize("fault, call", [({"at_step": 2}, "step()"), ({"at_reset": 2}, "reset()")])
def test_hung_worker_is_an_error_after_step_timeout_s_with_its_python_stack(make_env, fault, call):
    env = make_env(fault="hang", step_timeout_s=2.0, **fault)
    env.reset()
    env.step(ZERO)
    pids = pids_of(env)
    message, elapsed = worker_error(env, action=lambda env: env.reset() if call == "reset()" else env.step(ZERO))
    assert elapsed >= 2.0
    lines = message.split("\n")
    assert lines[0] == (f"env worker 0 (pid {pids[0]}) of '{FAULTY}' did not reply to {call} within step_timeout_s=2 "
                        "s: it hung (and env worker 1 too); raise create_environment.step_timeout_s if the env is only "
                        "slow")
    assert lines[1] == f"--- the Python stack of env worker 0 (pid {pids[0]}) ---"
    stack = "\n".join(lines[2:])
    assert "in hang_here_forever" in stack and f"in {call[:-2]}" in stack
    assert f"--- the Python stack of env worker 1 (pid {pids[1]}) ---" in message
    assert_stopped(env, pids)


# ------------------------------------------------------------------------------------------------ good health ---

def test_workers_ignore_ctrl_c_and_close_their_envs_cleanly(make_env):
    """Ctrl-C (SIGINT to the whole process group) is the trainer's to handle; close asks each worker to close its env
    and each exits 0."""
    env = make_env("CartPole-v1")
    env.reset()
    for pid in pids_of(env):
        os.kill(pid, signal.SIGINT)
    time.sleep(0.2)
    assert env.step(ZERO).observation.shape == (2, 4)
    processes = list(env._venv.processes)
    env.close()
    assert [process.exitcode for process in processes] == [0, 0]


def test_a_worker_unpickles_its_factory_without_importing_torch():
    """What a worker imports to run (alfish.envs.workers, .factory, the toy envs) leaves torch out: a worker starts in
    about a second instead of paying torch's import (seconds on a busy machine) and its memory."""
    code = ("import sys, alfish.envs.workers, alfish.envs.factory, gymnasium as gym; gym.make('alfish/Chain-v0'); "
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    assert result.stdout.strip() == "False"
