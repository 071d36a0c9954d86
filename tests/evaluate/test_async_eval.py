"""Asynchronous evaluation (``TrainerConfig.async_eval=True``): results recorded against the iteration and env steps
they evaluated while training went on, the final evaluation awaited, the same numbers as synchronous evaluation of
the same parameters and seed (continuing the seed sequence as a resume does), and the fault cases (a SIGKILLed child,
a stopped one, an exception in it) as one-line errors within seconds, leaving no process or shared memory behind."""
import os
import signal
import threading
import time

import gin
import psutil
import pytest
import torch

from alfish.algorithms.build import build_policy
from alfish.bin.train import known_run_failures
from alfish.collect.child_process import ChildProcessFailed
from alfish.collect.shared_params import AsyncUnrollError
from alfish.config import TrainerConfig, load_conf
from alfish.envs.batched_env import create_environment
from alfish.envs.spec import EnvSpec
from alfish.evaluate.async_evaluator import AsyncEvalError, AsyncEvaluator
from alfish.evaluate.evaluator import Evaluator
from alfish.trainer.build import build_evaluator, build_trainer
from alfish.trainer.counters import Counters
from tests.integration.inprocess import OFF_POLICY_POINT_GOAL, eval_log, tb_scalars

pytestmark = [pytest.mark.timeout(90)]

SAC = """
SacAlgorithm.hidden_sizes = (16,)
TrainerConfig.algorithm_ctor = @SacAlgorithm
Trainer.num_threads = 1
"""

# An evaluation of 10 env steps that takes about 0.2 s: long enough for training to go on meanwhile.
SLOW_EVAL_ENV = """
eval/create_environment.env_name = 'alfish/Latency-v0'
eval/create_environment.env_kwargs = {'env_name': 'alfish/PointGoal-v0', 'latency_s': 0.02}
"""

PENDULUM_SAC = """
create_environment.env_name = 'Pendulum-v1'
create_environment.num_parallel_environments = 1
SacAlgorithm.hidden_sizes = (16,)
TrainerConfig.algorithm_ctor = @SacAlgorithm
TrainerConfig.evaluate = True
TrainerConfig.num_eval_episodes = 4
TrainerConfig.num_eval_environments = 2
"""


def shm_entries() -> set:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def ended(process: psutil.Process) -> bool:
    """Gone, or a zombie: exited, and not yet reaped (an orphan is reaped by init, whenever init gets to it)."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def spawned_children() -> list:
    return [p for p in psutil.Process().children(recursive=True) if "spawn_main" in " ".join(p.cmdline())]


def build(tmp_path, conf_text):
    conf = tmp_path / "conf.gin"
    conf.write_text(conf_text)
    load_conf(str(conf))
    return build_trainer(TrainerConfig(root_dir=str(tmp_path / "run")))


@pytest.fixture(autouse=True)
def clean_gin():
    yield
    gin.clear_config()


class RecordingSummaries:
    """Summaries that keep what they are given: tag -> [(step, value)]."""

    def __init__(self):
        self.values = {}

    def scalar(self, tag, value, step):
        self.values.setdefault(tag, []).append((step, float(value)))

    def scalars(self, prefix, values, step):
        for name, value in values.items():
            self.scalar(f"{prefix}/{name}", value, step)


def test_the_two_children_fail_as_siblings_under_one_base():
    """``except ChildProcessFailed`` (the command line's one-line report) catches either child; neither error is the
    other, so a handler of one kind does not swallow the other."""
    assert issubclass(AsyncEvalError, ChildProcessFailed) and issubclass(AsyncUnrollError, ChildProcessFailed)
    assert not issubclass(AsyncEvalError, AsyncUnrollError) and not issubclass(AsyncUnrollError, AsyncEvalError)
    assert ChildProcessFailed in known_run_failures()


def test_results_are_recorded_against_the_iteration_they_evaluated_while_training_goes_on(tmp_path):
    # 100 warm-up steps, then one env step per iteration: 605 env steps = 505 iterations, an evaluation every 50
    # and the final one at 505 (not a multiple of 50: the run's end evaluates it and waits for it).
    trainer = build(tmp_path, OFF_POLICY_POINT_GOAL + SAC + SLOW_EVAL_ENV + """
TrainerConfig.num_env_steps = 605
TrainerConfig.eval_interval = 50
""")
    assert isinstance(trainer.evaluator, AsyncEvaluator)
    recorded_at = {}  # evaluated iteration -> the trainer's iteration when its result was written
    write = trainer.summaries.scalars

    def spy(prefix, values, step):
        if prefix == "eval":
            recorded_at[step] = trainer.counters.iteration
        write(prefix, values, step)

    trainer.summaries.scalars = spy
    assert trainer.run() == 0
    log = eval_log(trainer.config.root_dir)
    assert [r["iteration"] for r in log] == list(range(50, 501, 50)) + [505]  # every due one, and the final one
    assert all(r["env_steps"] == 100 + r["iteration"] for r in log)  # the env steps of the evaluated iteration
    assert all(r["asynchronous"] is True and r["num_episodes"] == 1 for r in log)
    assert all(r["eval_s"] >= 0.15 for r in log)  # 10 steps of 20 ms each
    # training went on while each evaluation ran: its result arrived when the trainer was further on
    assert all(recorded_at[it] > it for it in range(50, 501, 50)), recorded_at
    assert recorded_at[505] == 505
    scalars = tb_scalars(trainer.config.root_dir)
    assert scalars["eval/average_return"] == [(r["iteration"], pytest.approx(r["average_return"])) for r in log]
    assert scalars["eval_vs_env_steps/average_return"] == [(r["env_steps"], pytest.approx(r["average_return"]))
                                                           for r in log]
    assert "eval/return_std" not in scalars and "return_std" not in log[0]  # eval_uncertainty is off
    assert not spawned_children()


def test_a_sigkilled_evaluator_is_a_one_line_error_within_seconds_and_leaves_nothing_behind(tmp_path):
    trainer = build(tmp_path, OFF_POLICY_POINT_GOAL + SAC + """
TrainerConfig.num_env_steps = 10000000
TrainerConfig.eval_interval = 20
""")
    pid = trainer.evaluator.pid
    path = os.path.join(trainer.config.root_dir, "eval_log.jsonl")
    killed_at, block_names = [], []

    def kill_after_the_first_result():
        deadline = time.monotonic() + 60
        while not (os.path.exists(path) and os.path.getsize(path) > 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        block_names.append(trainer.evaluator.block.name)
        os.kill(pid, signal.SIGKILL)
        killed_at.append(time.monotonic())

    killer = threading.Thread(target=kill_after_the_first_result, daemon=True)
    killer.start()
    with pytest.raises(AsyncEvalError) as info:
        trainer.run()
    assert killed_at and time.monotonic() - killed_at[0] < 5
    assert str(info.value) == f"the async evaluator child (pid {pid}) was killed by signal SIGKILL"
    assert isinstance(info.value, known_run_failures())  # the command line reports it by this one line
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not spawned_children()
    assert block_names and block_names[0] not in shm_entries()  # the parameter block is unlinked


def test_a_dead_evaluator_stops_training_at_once_not_at_the_next_due_evaluation(tmp_path):
    trainer = build(tmp_path, OFF_POLICY_POINT_GOAL + SAC + """
TrainerConfig.num_env_steps = 10000000
TrainerConfig.eval_interval = 1000000
""")
    pid = trainer.evaluator.pid
    os.kill(pid, signal.SIGKILL)  # before any evaluation is due: the first would be at iteration 1,000,000
    start = time.monotonic()
    with pytest.raises(AsyncEvalError, match="was killed by signal SIGKILL"):
        trainer.run()
    assert time.monotonic() - start < 10
    assert trainer.counters.iteration < 100000, trainer.counters.iteration
    assert not spawned_children()


class Parts:
    """What build_trainer gives the evaluator, for a conf: the config, the training spec, the policy."""

    def __init__(self, tmp_path, conf_text, **overrides):
        conf = tmp_path / "conf.gin"
        conf.write_text(conf_text)
        load_conf(str(conf))
        self.config = TrainerConfig(root_dir=str(tmp_path / "root"), **overrides)
        os.makedirs(self.config.root_dir, exist_ok=True)
        env = create_environment()
        self.spec = EnvSpec.of(env)
        env.close()
        torch.manual_seed(5)
        self.transformer, self.algorithm = build_policy(self.config, self.spec)

    def evaluator(self, async_eval, **overrides):
        import dataclasses

        config = dataclasses.replace(self.config, async_eval=async_eval, **overrides)
        return build_evaluator(config, 11, self.transformer, self.spec)


def records_without_timing(root):
    return [{k: v for k, v in r.items() if k not in ("eval_s", "elapsed_s", "asynchronous")} for r in eval_log(root)]


def test_async_and_sync_evaluation_of_the_same_parameters_and_seed_are_identical(tmp_path):
    parts = Parts(tmp_path, PENDULUM_SAC, eval_uncertainty=True)
    sync, asyn = parts.evaluator(False), parts.evaluator(True)
    assert isinstance(sync, Evaluator) and isinstance(asyn, AsyncEvaluator)
    try:
        results = {}
        for name, evaluator in (("sync", sync), ("async", asyn)):
            root = tmp_path / name
            root.mkdir()
            summaries = RecordingSummaries()
            evaluator.num_evaluations = 3  # as after a resume at iteration 3 * eval_interval: seeds continue
            evaluator.record(parts.algorithm, summaries, str(root), Counters(iteration=40, env_steps=400))
            evaluator.record(parts.algorithm, summaries, str(root), Counters(iteration=50, env_steps=500))
            evaluator.wait()
            results[name] = (records_without_timing(root), summaries.values)
            assert evaluator.num_evaluations == 5
        assert results["async"] == results["sync"]
        first, second = results["sync"][0]
        assert (first["iteration"], first["env_steps"], second["iteration"]) == (40, 400, 50)
        assert first["num_episodes"] == 4 and first["average_episode_length"] == 200
        assert first["average_return"] != second["average_return"]  # same parameters, the next seed
        assert first["return_min"] < first["return_max"] and "critic_std" in first
        assert eval_log(tmp_path / "async")[0]["asynchronous"] is True
        assert "asynchronous" not in eval_log(tmp_path / "sync")[0]
    finally:
        sync.close()
        asyn.close()
    assert not spawned_children()


def test_a_stopped_evaluator_is_reported_as_hung_after_the_stall_timeout(tmp_path):
    parts = Parts(tmp_path, OFF_POLICY_POINT_GOAL + SAC)
    evaluator = parts.evaluator(True)
    evaluator.stall_timeout_s = 1.0
    try:
        deadline = time.monotonic() + 60
        while not evaluator.shared.ready.value and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(evaluator.pid, signal.SIGSTOP)
        evaluator.record(parts.algorithm, RecordingSummaries(), parts.config.root_dir, Counters(iteration=10))
        start = time.monotonic()
        with pytest.raises(AsyncEvalError, match=rf"^the async evaluator child \(pid {evaluator.pid}\) is alive but "
                                                 r"took no evaluation env step for \d+ s; is the evaluation "
                                                 r"environment hung \(or the child stopped\)\?$"):
            evaluator.wait()
        assert time.monotonic() - start < 5
    finally:
        pid = evaluator.pid
        start = time.monotonic()
        evaluator.close(timeout_s=2.0)
    assert time.monotonic() - start < 5
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_an_exception_in_the_evaluator_reaches_the_trainer_with_its_traceback(tmp_path):
    parts = Parts(tmp_path, OFF_POLICY_POINT_GOAL + SAC + """
eval/create_environment.env_name = 'alfish/Latency-v0'
eval/create_environment.env_kwargs = {'env_name': 'alfish/PointGoal-v0', 'latency_s': 0.0, 'raise_at_step': 3}
""")
    evaluator = parts.evaluator(True)
    try:
        evaluator.record(parts.algorithm, RecordingSummaries(), parts.config.root_dir, Counters(iteration=10))
        start = time.monotonic()
        with pytest.raises(AsyncEvalError) as info:
            evaluator.wait()
        assert time.monotonic() - start < 30  # the child's start-up included
        message = str(info.value)
        assert message.startswith(f"the async evaluator child (pid {evaluator.pid}) failed:\nTraceback")
        assert "alfish/Latency-v0: injected failure at step 3" in message
        with pytest.raises(AsyncEvalError):  # and again at the next due evaluation: the run stops
            evaluator.record(parts.algorithm, RecordingSummaries(), parts.config.root_dir, Counters(iteration=20))
    finally:
        evaluator.close()
    assert not spawned_children()


def test_an_evaluation_env_that_cannot_be_built_is_a_build_error_with_the_childs_message(tmp_path):
    parts = Parts(tmp_path, OFF_POLICY_POINT_GOAL + SAC + "eval/create_environment.env_name = 'NoSuchEnv-v0'\n")
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"^cannot make gymnasium env 'NoSuchEnv-v0': Environment `NoSuchEnv` "
                                         r"doesn't exist"):
        parts.evaluator(True)  # as the synchronous evaluator, which builds its envs right here
    assert time.monotonic() - start < 30
    assert not spawned_children()


@pytest.mark.cli
def test_a_killed_trainer_takes_its_evaluator_child_with_it_even_mid_evaluation(tmp_path):
    import subprocess
    import sys

    from tests.integration.inprocess import REPO

    conf = tmp_path / "slow_eval.gin"
    conf.write_text(OFF_POLICY_POINT_GOAL + SAC + """
TrainerConfig.num_env_steps = 10000000
TrainerConfig.eval_interval = 10
eval/create_environment.env_name = 'alfish/Latency-v0'
eval/create_environment.env_kwargs = {'env_name': 'alfish/PointGoal-v0', 'latency_s': 0.5}
""")  # an evaluation takes 5 s: the trainer is killed in the middle of one
    proc = subprocess.Popen([sys.executable, "-m", "alfish.bin.train", "--conf", str(conf), "--root_dir",
                             str(tmp_path / "root")], cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, children = time.monotonic() + 60, []
        while not children and time.monotonic() < deadline:
            children = [p for p in psutil.Process(proc.pid).children(recursive=True)
                        if "spawn_main" in " ".join(p.cmdline())]
            time.sleep(0.2)
        assert children, proc.stderr.read()[-3000:] if proc.poll() is not None else "no evaluator child"
        # Ready: it built its envs and serves evaluations (it checks for its trainer between env steps). Until then
        # it is starting (importing torch, building envs: seconds more on a loaded machine) and notices nothing.
        log = tmp_path / "root" / "log.txt"
        while "async eval: child process" not in (log.read_text() if log.exists() else "") and \
                time.monotonic() < deadline:
            time.sleep(0.2)
        assert "async eval: child process" in log.read_text()
        time.sleep(1.5)  # the first evaluation (after 100 warm-up steps and 10 iterations) is running
        proc.kill()
        proc.wait(timeout=30)
        start = time.monotonic()
        while not all(map(ended, children)) and time.monotonic() - start < 10:
            time.sleep(0.1)
        assert all(map(ended, children)) and time.monotonic() - start < 5, children
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
