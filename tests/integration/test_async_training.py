"""Async unroll through the Trainer: a short async SAC run learns the tiny env and reports queue and lag; an
on-policy algorithm is refused; and, through ``python -m alfish.bin.train`` in real subprocesses, a SIGKILLed child
ends the job with a clear error, and a killed or stopped trainer takes its child with it. Nothing is left behind."""
import glob
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from alfish.rundir.checkpoint import Checkpointer

from .inprocess import OFF_POLICY_POINT_GOAL, REPO, eval_log, run_trainer_from_text, tb_scalars
from .test_learning import SAC_POINT_GOAL

ASYNC = """
TrainerConfig.async_unroll = True
TrainerConfig.unroll_parameter_update_period = 1
TrainerConfig.unroll_queue_size = 8
Trainer.num_threads = 1
"""

# A slow env, so the run lasts until the test stops it.
SLOW_POINT_GOAL = OFF_POLICY_POINT_GOAL.replace("'alfish/PointGoal-v0'", "'alfish/Latency-v0'") + """
create_environment.env_kwargs = {'env_name': 'alfish/PointGoal-v0', 'latency_s': 0.01}
SacAlgorithm.hidden_sizes = (16,)
TrainerConfig.algorithm_ctor = @SacAlgorithm
TrainerConfig.num_env_steps = 1000000
TrainerConfig.evaluate = False
TrainerConfig.num_checkpoints = 1
""" + ASYNC


def shm_entries() -> set:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def left_behind(before: set) -> set:
    """The entries of /dev/shm made since ``before`` that no live process maps: left behind. (Other jobs on the machine
    make and remove entries of their own meanwhile; each is mapped by its process while in use. By inode: a semaphore
    is mapped under the temporary name it was created with.)"""
    new = shm_entries() - before
    mapped = set()
    for maps in glob.glob("/proc/[0-9]*/maps") if new else ():
        try:
            with open(maps) as f:
                mapped.update(int(line.split()[4]) for line in f if " /dev/shm/" in line)
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
    left = set()
    for name in new:
        try:
            if os.stat(os.path.join("/dev/shm", name)).st_ino not in mapped:
                left.add(name)
        except OSError:  # removed meanwhile
            continue
    return left


def unroll_children(pid: int) -> list:
    try:
        return [p for p in psutil.Process(pid).children(recursive=True) if "spawn_main" in " ".join(p.cmdline())]
    except psutil.NoSuchProcess:
        return []


@pytest.mark.learning
@pytest.mark.timeout(120)
def test_short_async_sac_run_learns_point_goal_and_reports_lag(tmp_path):
    shm_before = shm_entries()
    root = run_trainer_from_text(tmp_path, SAC_POINT_GOAL + ASYNC)
    result = [r["average_return"] for r in eval_log(root)]
    # the synchronous SAC test's thresholds (optimum -0.9; a random policy gets about -6). Async data depends on
    # timing (which parameter version chose each action), so runs differ slightly from one another.
    assert result[0] < -1.5 and max(result) >= -1.1, result
    assert sum(result[-3:]) / 3 >= -1.15, result
    scalars = tb_scalars(root)
    for tag in ("async/queue_length", "async/steps_received", "async/env_step_ms", "async/policy_lag_versions",
                "async/policy_lag_iterations"):
        assert tag in scalars, sorted(scalars)
    assert all(v == 1.0 for _, v in scalars["async/steps_received"])  # unroll_length 1: one step per iteration
    lags = [v for _, v in scalars["async/policy_lag_versions"]]
    assert 0 <= min(lags) and max(lags) <= 8 + 2  # at most a queue's worth of steps (plus the one in flight)
    assert not unroll_children(os.getpid())
    assert not left_behind(shm_before)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("conf_name, algorithm", [("a2c_cartpole.gin", "A2cAlgorithm"),
                                                  ("ppo_cartpole.gin", "PpoAlgorithm")])
def test_an_uncorrected_on_policy_algorithm_from_an_async_unroll_is_a_clear_error(tmp_path, conf_name, algorithm):
    conf = (REPO / "confs" / conf_name).read_text() + "\nTrainerConfig.async_unroll = True\n"
    with pytest.raises(ValueError, match=f"TrainerConfig.async_unroll=True: {algorithm} would train on steps acted by "
                                         "older parameters as if its own had acted them; set "
                                         f"{algorithm}.off_policy_correction='vtrace', or async_unroll=False"):
        run_trainer_from_text(tmp_path, conf)


def start_training(tmp_path):
    conf = tmp_path / "slow.gin"
    conf.write_text(SLOW_POINT_GOAL)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "alfish.bin.train", "--conf", str(conf), "--root_dir",
                             str(tmp_path / "root")], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        children = unroll_children(proc.pid)
        if children and (tmp_path / "root" / "tb").exists():
            time.sleep(2.0)  # let it train a little
            return proc, children[0].pid
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"no async unroll child appeared: {proc.communicate()[1][-3000:]}")


def wait_gone(pid: int, timeout_s: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return time.monotonic() - start
        time.sleep(0.1)
    raise AssertionError(f"process {pid} still alive after {timeout_s} s")


@pytest.mark.cli
@pytest.mark.timeout(120)
def test_sigkilled_child_ends_the_job_with_the_signal_and_pid(tmp_path):
    proc, child = start_training(tmp_path)
    os.kill(child, signal.SIGKILL)
    start = time.monotonic()
    _, stderr = proc.communicate(timeout=30)
    assert time.monotonic() - start < 10
    assert proc.returncode != 0
    assert f"the async unroll child (pid {child}) was killed by signal SIGKILL" in stderr, stderr[-3000:]


@pytest.mark.cli
@pytest.mark.timeout(120)
def test_killed_trainer_takes_its_child_with_it(tmp_path):
    shm_before = shm_entries()
    proc, child = start_training(tmp_path)
    proc.kill()
    proc.communicate(timeout=30)
    assert wait_gone(child, 10) < 10
    # The parameter block could not be unlinked by the killed trainer: the resource tracker removes it once both
    # sides are gone.
    deadline = time.monotonic() + 10
    while left_behind(shm_before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left_behind(shm_before)


@pytest.mark.cli
@pytest.mark.timeout(120)
def test_sigterm_writes_a_checkpoint_and_stops_the_child(tmp_path):
    shm_before = shm_entries()
    proc, child = start_training(tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "checkpoint written" in stderr
    assert wait_gone(child, 10) < 10
    assert not left_behind(shm_before)
    # The child built the envs, but the records name them: play and resume rebuild the same env from the root_dir.
    ckpt = Checkpointer(str(tmp_path / "root" / "checkpoints")).load_latest()
    assert "create_environment.env_name = 'alfish/Latency-v0'" in ckpt.meta["operative_config"]
    assert "create_environment.env_name = 'alfish/Latency-v0'" in (tmp_path / "root" / "config" / "operative.gin"
                                                                   ).read_text()


@pytest.mark.timeout(120)
def test_unroll_length_zero_trains_on_whatever_arrived_without_waiting(tmp_path):
    conf = SAC_POINT_GOAL + ASYNC + """
TrainerConfig.unroll_length = 0
TrainerConfig.max_unroll_length = 2
TrainerConfig.unroll_step_interval = 0.2
TrainerConfig.initial_collect_steps = 20
TrainerConfig.num_iterations = 300
TrainerConfig.num_env_steps = 0
TrainerConfig.summary_interval = 1
TrainerConfig.evaluate = False
"""
    root = run_trainer_from_text(tmp_path, conf)
    received = [v for _, v in tb_scalars(root)["async/steps_received"]]
    env_steps = [v for _, v in tb_scalars(root)["train/env_steps"]]
    assert len(received) == 300
    # iterations that trained although nothing had arrived (a step every 200 ms: an iteration takes a few ms, tens on a
    # loaded 2-core machine; with a step every 50 ms, iterations slower than that never found the queue empty)
    assert min(received) == 0.0
    assert max(received) <= 2.0  # max_unroll_length
    assert env_steps[-1] == 20 + sum(received)  # the 20 warm-up steps, then what each iteration took


@pytest.mark.timeout(120)
def test_two_unroll_processes_feed_one_learner_and_every_step_is_counted(tmp_path):
    conf = SAC_POINT_GOAL + ASYNC + """
create_environment.num_parallel_environments = 4
Trainer.num_unroll_processes = 2
Trainer.max_policy_lag = 2
TrainerConfig.unroll_length = 0
TrainerConfig.max_unroll_length = 2
TrainerConfig.initial_collect_steps = 20
TrainerConfig.num_iterations = 150
TrainerConfig.num_env_steps = 0
TrainerConfig.summary_interval = 1
TrainerConfig.evaluate = False
"""
    root = run_trainer_from_text(tmp_path, conf)
    scalars = tb_scalars(root)
    received = [v for _, v in scalars["async/steps_received"]]  # batched steps of one process: 2 envs each
    env_steps = [v for _, v in scalars["train/env_steps"]]
    assert len(received) == 150 and max(received) <= 2 * 2  # max_unroll_length per process
    assert env_steps[-1] == 20 + 2 * sum(received)  # the warm-up (5 steps of each env), then what each took
    assert "async/dropped_env_steps" in scalars  # counted (how many depends on timing)
    lags = [v for _, v in scalars["async/policy_lag_versions_max"]]
    assert max(lags) <= 2  # max_policy_lag: nothing older was trained on
    # every stored step carries its acting iteration: the sampled batches' policy age (replay age + lag), in iterations
    ages, age_max = (dict(scalars[f"replay/sampled_policy_age{s}"]) for s in ("", "_max"))
    assert len(ages) >= 100 and all(0 <= ages[i] <= age_max[i] for i in ages)
    assert max(age_max.values()) > 2  # older than any lag: the replay holds steps of many iterations
    assert not unroll_children(os.getpid())


@pytest.mark.timeout(120)
def test_a_run_with_restarts_on_outlives_its_crashing_envs(tmp_path, caplog):
    # Each env raises at its 30th step: each of the two children is replaced once (5 warm-up + 50 steps per env).
    conf = SAC_POINT_GOAL.replace("'alfish/PointGoal-v0'", "'alfish/Latency-v0'") + ASYNC + """
create_environment.env_kwargs = {'env_name': 'alfish/PointGoal-v0', 'latency_s': 0.0, 'raise_at_step': 30}
create_environment.num_parallel_environments = 2
Trainer.num_unroll_processes = 2
Trainer.restart_crashed_envs = True
TrainerConfig.unroll_length = 1
TrainerConfig.initial_collect_steps = 10
TrainerConfig.num_iterations = 50
TrainerConfig.num_env_steps = 0
TrainerConfig.summary_interval = 1
TrainerConfig.evaluate = False
"""
    with caplog.at_level("WARNING"):
        root = run_trainer_from_text(tmp_path, conf)
    scalars = tb_scalars(root)
    assert scalars["async/env_restarts"][-1][1] == 2.0
    assert [v for _, v in scalars["train/env_steps"]][-1] == 10 + 50 * 2  # every iteration got its steps
    assert caplog.text.count("failed: RuntimeError: alfish/Latency-v0: injected failure at step 30; replacing it: "
                             "the episodes in flight in envs") == 2
    assert not unroll_children(os.getpid())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("algorithm", ["sac", "a2c"])
def test_a_synchronous_run_restarts_its_crashed_env_workers(tmp_path, caplog, algorithm):
    # Env worker processes (vectorization='async') in the trainer; each env raises at its 30th step. SAC: the steps
    # taken are stored and the run goes on; A2C: the trajectory in progress is discarded and unrolled again.
    env = """
create_environment.env_name = 'alfish/Latency-v0'
create_environment.env_kwargs = {'env_name': 'ENV', 'latency_s': 0.0, 'raise_at_step': 30}
create_environment.vectorization = 'async'
create_environment.num_parallel_environments = 2
Trainer.restart_crashed_envs = True
Trainer.num_threads = 1
TrainerConfig.num_iterations = 40
TrainerConfig.num_env_steps = 0
TrainerConfig.summary_interval = 1
TrainerConfig.evaluate = False
"""
    if algorithm == "sac":
        conf = SAC_POINT_GOAL + env.replace("ENV", "alfish/PointGoal-v0") + "TrainerConfig.initial_collect_steps = 10\n"
        steps_per_env, expected_env_steps = 10 // 2 + 40, 10 + 40 * 2
    else:
        conf = (REPO / "confs" / "a2c_cartpole.gin").read_text() + env.replace("ENV", "CartPole-v1") + \
            "TrainerConfig.unroll_length = 5\n"
        steps_per_env, expected_env_steps = 40 * 5, 40 * 5 * 2
    with caplog.at_level("WARNING"):
        root = run_trainer_from_text(tmp_path, conf)
    scalars = tb_scalars(root)
    restarts = scalars["collect/env_restarts"][-1][1]
    assert restarts >= steps_per_env // 30 - 1 and restarts >= 1, restarts  # (a discarded trajectory steps again)
    assert [v for _, v in scalars["train/env_steps"]][-1] == expected_env_steps
    assert caplog.text.count("injected failure at step 30; restarting the 2 env workers of 'alfish/Latency-v0': every "
                             "env's episode in flight is cut (restart") == restarts


@pytest.mark.timeout(90)
def test_the_child_may_step_env_worker_processes_and_is_not_taken_for_a_rank(tmp_path, monkeypatch):
    """vectorization='async' inside the async unroll child: its envs are worker processes of its own, which a daemonic
    child could not start. The child's environment lacks torchrun's rank variables. Nothing is left behind."""
    import gin

    from alfish.config import TrainerConfig, load_conf
    from alfish.trainer.build import build_trainer

    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))  # (a rank variable torchrun sets)
    conf = tmp_path / "conf.gin"
    conf.write_text(SAC_POINT_GOAL + ASYNC + """
create_environment.vectorization = 'async'
create_environment.num_parallel_environments = 2
TrainerConfig.num_env_steps = 300
TrainerConfig.evaluate = False
""")
    load_conf(str(conf))
    try:
        trainer = build_trainer(TrainerConfig(root_dir=str(tmp_path / "run")))
        child = psutil.Process(trainer.collector.process.pid)
        assert "TORCHELASTIC_ERROR_FILE" not in child.environ()
        assert len(child.children(recursive=True)) >= 3  # its forkserver and the env workers it forked
        assert trainer.run() == 0
    finally:
        gin.clear_config()
    assert trainer.counters.env_steps >= 300
    assert not psutil.pid_exists(child.pid) or child.status() == psutil.STATUS_ZOMBIE
    assert not unroll_children(os.getpid())
