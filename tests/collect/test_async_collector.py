"""AsyncCollector with a real child process (spawn): the child owns the envs and reports their spec; order and
completeness of steps, non-blocking drain, parameter updates visible in the child's actions, pacing, and the fault
cases (exception, SIGKILL, close) within their bounds.
"""
import os
import signal
import time

import gin
import pytest
import torch

from alfish.algorithms.build import build_policy
from alfish.collect.async_collector import AsyncCollector, AsyncUnrollError, UnrollSpec
from alfish.collect.collector import ProgressPoint
from alfish.config import TrainerConfig, load_conf
from alfish.data import nest
from alfish.data.types import StepType
from alfish.envs.batched_env import environment_settings

pytestmark = [pytest.mark.timeout(60)]

SAC_POINT_GOAL = """
create_environment.env_name = 'alfish/PointGoal-v0'
create_environment.num_parallel_environments = 2
SacAlgorithm.hidden_sizes = (16,)
TrainerConfig.algorithm_ctor = @SacAlgorithm
TrainerConfig.mini_batch_size = 4
TrainerConfig.mini_batch_length = 2
"""

DQN_CHAIN = """
create_environment.env_name = 'alfish/Chain-v0'
create_environment.num_parallel_environments = 2
DqnAlgorithm.hidden_sizes = (8,)
DqnAlgorithm.epsilon_greedy = 0.0
TrainerConfig.algorithm_ctor = @DqnAlgorithm
TrainerConfig.mini_batch_size = 4
TrainerConfig.mini_batch_length = 2
"""


A2C_CHAIN = """
create_environment.env_name = 'alfish/Chain-v0'
create_environment.num_parallel_environments = 2
A2cAlgorithm.hidden_sizes = (8,)
A2cAlgorithm.off_policy_correction = 'vtrace'
TrainerConfig.algorithm_ctor = @A2cAlgorithm
"""


class StepList(list):
    """A collector's sink that keeps every step ``[B, ...]`` it is given, in order."""

    def add(self, step):
        self.append(step)


class Rig:
    """A trainer side as build_trainer makes it: the child started (it owns the envs), the policy built here from the
    spec it reported, then started."""

    def __init__(self, tmp_path, conf_text, queue_size=50, interval_s=0.0):
        conf = tmp_path / "conf.gin"
        conf.write_text(conf_text)
        load_conf(str(conf))
        config = TrainerConfig(root_dir=str(tmp_path / "root"))
        spec = UnrollSpec(environment_settings(seed=3), gin.config_str(), str(tmp_path / "root"),
                          step_interval_s=interval_s, parent_pid=os.getpid())
        self.unroller = AsyncCollector(spec, queue_size)
        self.transformer, self.algorithm = build_policy(config, self.unroller.spec)
        self.stored = StepList()
        self.unroller.start(self.algorithm, self.transformer, self.stored, 3, ProgressPoint(0, 0, 0.0))

    def publish(self):
        return self.unroller.publish(ProgressPoint(0, 0, 0.0))


@pytest.fixture
def rig_factory(tmp_path):
    rigs = []

    def make(conf_text, **kwargs):
        rigs.append(Rig(tmp_path, conf_text, **kwargs))
        return rigs[-1]

    yield make
    for rig in rigs:
        rig.unroller.close()
    gin.clear_config()


def test_the_child_reports_the_spec_of_the_envs_it_owns(rig_factory):
    rig = rig_factory(SAC_POINT_GOAL)
    assert rig.unroller.spec.num_envs == 2 and rig.unroller.spec.observation_space.shape == (1,)
    assert rig.unroller.collect(3) == 3 and len(rig.stored) == 3  # collect hands every step to the sink
    assert rig.unroller.stats.num_episodes == 0  # episodes are tracked on this side (10 steps each)


def test_steps_arrive_complete_and_in_order_per_env(rig_factory):
    rig = rig_factory(SAC_POINT_GOAL)
    steps = rig.unroller.receive(45)
    assert len(steps) == 45
    step_type = torch.stack([s.experience.step_type for s in steps])  # [T, B]
    obs = torch.stack([s.experience.observation[:, 0] for s in steps])
    action = torch.stack([s.experience.action[:, 0] for s in steps])
    assert torch.equal(steps[0].experience.env_id, torch.arange(2))
    # PointGoal: FIRST, 9 MID, LAST (the 10-step time limit), then FIRST again, for both envs
    expected = ([StepType.FIRST] + [StepType.MID] * 9 + [StepType.LAST]) * 5
    assert step_type.T.tolist() == [expected[:45]] * 2
    # every step follows from the previous one and the action taken there: x' = clip(x + 0.25 a)
    for t in range(44):
        if int(step_type[t + 1, 0]) == StepType.FIRST:
            continue
        predicted = (obs[t] + 0.25 * action[t].clamp(-1, 1)).clamp(-2, 2)
        assert torch.allclose(obs[t + 1], predicted, atol=1e-5), t


def test_collect_without_a_count_drains_what_arrived_without_blocking(rig_factory):
    rig = rig_factory(SAC_POINT_GOAL, interval_s=0.05)
    seen, durations = 0, []
    deadline = time.monotonic() + 20
    while seen < 10 and time.monotonic() < deadline:
        start = time.monotonic()
        got = rig.unroller.receive(None, max_steps=3)
        durations.append(time.monotonic() - start)
        assert len(got) <= 3
        seen += len(got)
        time.sleep(0.1)
    assert seen >= 10 and len(durations) > 3
    # Never waits for steps: a call that waited would take a poll (0.2 s) whenever the queue ran dry, which happens in
    # most calls (a step every 50 ms, a call every 100 ms, at most 3 taken). The median, not every call: on a loaded
    # machine a call that does not wait can still be descheduled for a while.
    assert sorted(durations)[len(durations) // 2] < 0.1, durations


def _last_linear(module):
    return [m for m in module.modules() if isinstance(m, torch.nn.Linear)][-1]


def test_child_acts_with_new_parameters_after_they_are_published(rig_factory):
    rig = rig_factory(DQN_CHAIN, queue_size=4)
    head = _last_linear(rig.algorithm.q_net)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(torch.tensor([0.0, 5.0]))  # always "right"
    first = rig.publish()
    before = rig.unroller.receive(20)
    with torch.no_grad():
        head.bias.copy_(torch.tensor([5.0, 0.0]))  # always "left"
    second = rig.publish()
    after = rig.unroller.receive(40)
    by_version = {}
    for s in before + after:
        if int(s.experience.step_type[0]) != StepType.LAST:  # the action at LAST is ignored by the env anyway
            by_version.setdefault(s.version, set()).update(s.experience.action.tolist())
    assert by_version[first] == {1}
    assert by_version[second] == {0}  # the new version was in use within at most a queue's worth of steps
    assert all(s.version == second for s in after[10:])


# Registered in this process only (as a user's script may register one before training): the child, which imports
# neither this module nor the script, parses the config text naming it from the spec's gin_constants. A name no
# other test uses: gin resolves `%NAME` by its last part too, so a constant named like another test's macro (GAMMA)
# would change what that test's config means once this module is imported.
gin.constant("test_async_collector.DISCOUNT_SHIPPED_TO_THE_CHILD", 0.9)


def test_trajectories_follow_each_other_sharing_their_bootstrap_row(rig_factory):
    rig = rig_factory(A2C_CHAIN)
    first, second = rig.unroller.collect_trajectory(5, with_grad=False), rig.unroller.collect_trajectory(5, False)
    assert first.step_type.shape == second.step_type.shape == (6, 2)  # [T + 1, B]
    for a, b in zip(nest.flatten(first), nest.flatten(second)):  # the last row (bootstrap only) trains next time
        assert torch.equal(a[-1], b[0])
    # the steps arrive in order: each env's episodes start FIRST, and every LAST is followed by a FIRST, across the
    # seam of the two trajectories too
    for steps in torch.cat([first.step_type, second.step_type[1:]]).T.tolist():  # 11 steps per env
        assert steps[0] == StepType.FIRST and StepType.LAST in steps, steps
        assert all(b == StepType.FIRST for a, b in zip(steps, steps[1:]) if a == StepType.LAST), steps
        assert all(b != StepType.FIRST for a, b in zip(steps, steps[1:]) if a != StepType.LAST), steps
    assert torch.equal(second.env_id[0], torch.arange(2))
    info = first.rollout_info  # the acting policy's, without gradients (the learner recomputes them)
    assert info.log_prob.shape == (6, 2) and not info.log_prob.requires_grad and bool((info.log_prob <= 0).all())
    with pytest.raises(ValueError, match="an asynchronous unroll cannot keep gradients"):
        rig.unroller.collect_trajectory(5, with_grad=True)


def test_the_child_parses_a_config_naming_a_gin_constant_of_the_trainer(rig_factory):
    rig = rig_factory(DQN_CHAIN + "DqnAlgorithm.gamma = %test_async_collector.DISCOUNT_SHIPPED_TO_THE_CHILD\n")
    assert "%test_async_collector.DISCOUNT_SHIPPED_TO_THE_CHILD" in gin.config_str()  # (the text the child parses)
    assert len(rig.unroller.receive(3)) == 3


def test_pacing_holds_the_step_interval(rig_factory):
    # 0.2 s a step: long next to what a loaded machine adds to each step (a late wake-up is not caught up), so the
    # average stays within 30% of it
    rig = rig_factory(SAC_POINT_GOAL, queue_size=100, interval_s=0.2)
    rig.unroller.receive(1)
    start = time.monotonic()
    rig.unroller.receive(15)
    per_step = (time.monotonic() - start) / 15
    assert 0.2 * 0.85 < per_step < 0.2 * 1.3, per_step


def test_exception_in_the_child_reaches_the_parent_with_its_traceback(rig_factory):
    rig = rig_factory(SAC_POINT_GOAL.replace("'alfish/PointGoal-v0'", "'alfish/Latency-v0'") + """
create_environment.env_kwargs = {'env_name': 'alfish/PointGoal-v0', 'latency_s': 0.0, 'raise_at_step': 7}
""")
    start = time.monotonic()
    with pytest.raises(AsyncUnrollError) as info:
        rig.unroller.receive(1000)
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert "the async unroll child (pid" in message and "failed:" in message
    assert "Traceback" in message and "injected failure at step 7" in message


def test_killed_child_is_reported_with_signal_and_pid_and_close_leaves_no_process(rig_factory):
    rig = rig_factory(SAC_POINT_GOAL)
    rig.unroller.receive(5)
    pid = rig.unroller.process.pid
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(AsyncUnrollError, match=rf"the async unroll child \(pid {pid}\) was killed by signal SIGKILL"):
        while True:
            rig.unroller.receive(10)
    assert time.monotonic() - start < 10
    rig.unroller.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_stopped_child_is_reported_after_the_grace_and_close_leaves_no_process(rig_factory):
    rig = rig_factory(SAC_POINT_GOAL, queue_size=1000)
    rig.unroller.receive(5)
    pid = rig.unroller.process.pid
    os.kill(pid, signal.SIGSTOP)  # alive, but never sends again
    rig.unroller.receive(None)  # what arrived before the stop
    start = time.monotonic()
    with pytest.raises(AsyncUnrollError, match=rf"the async unroll child \(pid {pid}\) is stopped \(SIGSTOP or a "
                                               r"debugger\) and sent no env step for \d+ s; do not stop"):
        rig.unroller.receive(10_000)
    assert time.monotonic() - start < 10  # STOPPED_GRACE_S (5 s), not the stall timeout (60 s)
    rig.unroller.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_close_stops_a_child_blocked_on_a_full_queue(rig_factory):
    rig = rig_factory(SAC_POINT_GOAL, queue_size=2)
    rig.unroller.receive(1)
    time.sleep(1.0)  # the child fills the queue and waits on it
    pid = rig.unroller.process.pid
    start = time.monotonic()
    rig.unroller.close()
    assert time.monotonic() - start < 5
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
