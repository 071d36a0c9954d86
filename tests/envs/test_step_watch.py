"""The hang guard of in-process envs (``alfish/envs/step_watch.py``): a sync env whose step never returns ends the
process after ``step_timeout_s`` with one line naming the env and where it hung; a long exact-resume replay whose
steps are each quick is not a hang; the guard costs well under a microsecond or two per step."""
import os
import subprocess
import sys
import textwrap
import time

from alfish.envs.batched_env import BatchedEnv

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HANG = "alfish/Latency-v0"


def _child(code: str, timeout: float = 60.0) -> tuple[int, str, str, float]:
    """Run ``code`` in a fresh interpreter; (exit code, stdout, stderr, seconds from its "go" line to its end)."""
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    first = proc.stdout.readline()  # "go", printed just before the call that may hang
    start = time.monotonic()
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, first + out, err, time.monotonic() - start


def test_a_hung_sync_step_ends_the_process_with_one_line_naming_env_and_frame():
    rc, out, err, took = _child(f"""
        import torch
        from alfish.envs.batched_env import BatchedEnv
        env = BatchedEnv({HANG!r}, 2, seed=0, env_kwargs={{'env_name': 'CartPole-v1', 'latency_s': 0.0,
                                                          'hang_at_step': 2}}, step_timeout_s=1.0)
        env.reset()
        env.step(torch.zeros(2, dtype=torch.int64))
        print("go", flush=True)
        env.step(torch.zeros(2, dtype=torch.int64))  # never returns
        print("returned", flush=True)
    """)
    assert rc == 1, err
    assert out == "go\n"
    assert took < 1.0 + 5.0, took
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"alfish: env '{HANG}' did not return from step() within create_environment."
                               "step_timeout_s=1 s (vectorization='sync', in this process): it hung at "
                               "alfish/envs/latency.py:")
    assert "in step: `time.sleep(3600)  # injected hang`" in lines[0]
    assert lines[0].endswith("quitting (no checkpoint of this run was written yet); fix the env, or raise "
                             "step_timeout_s if it is only slow")


def test_a_long_replay_of_quick_steps_is_not_a_hang():
    """Replaying 30 logged steps of 0.05 s takes 1.5 s, over the 1 s step_timeout_s: the replay re-arms per step."""
    rc, out, err, _ = _child(f"""
        import numpy as np, torch
        from alfish.envs.batched_env import BatchedEnv
        kwargs = {{'env_name': 'CartPole-v1', 'latency_s': 0.05, 'max_episode_steps': 500}}
        env = BatchedEnv({HANG!r}, 1, seed=0, env_kwargs=dict(kwargs, latency_s=0.0), step_timeout_s=1.0)
        env.reset()
        for i in range(30):
            env.step(torch.tensor([i % 2]))
        states = env.resume_states()
        assert len(states[0]["actions"]) == 30  # (alternate pushes keep the pole up: one episode)
        again = BatchedEnv({HANG!r}, 1, seed=5, env_kwargs=kwargs, step_timeout_s=1.0)
        print("go", flush=True)
        print(again.restore(states, env._prev_done.copy()), flush=True)
    """)
    assert rc == 0 and out.split() == ["go", "[True]"], err


def test_the_guard_costs_about_a_microsecond_per_step(capsys):
    """The whole guard of one step (``BatchedEnv._watched``: arm, call, disarm) around a call that does nothing."""
    env = BatchedEnv("CartPole-v1", 1, seed=0)

    def nothing(value):
        return value

    def per_call_us(call, n=50_000):
        start = time.perf_counter()
        for _ in range(n):
            call()
        return (time.perf_counter() - start) / n * 1e6

    guarded = min(per_call_us(lambda: env._watched("step()", nothing, 1)) for _ in range(3))
    plain = min(per_call_us(lambda: nothing(1)) for _ in range(3))
    env.close()
    with capsys.disabled():
        print(f"\nhang guard: {guarded - plain:.2f} us per guarded env step")
    assert guarded - plain < 10.0  # ~0.7 us on a loaded 2-core machine; a CartPole sync step takes ~20-40 us
