"""Several async unroll processes per rank (``Trainer.num_unroll_processes``), with real child processes: each steps
its share of the envs (ids and seeds as one process stepping them all), every step arrives, one publish reaches
every process, synchronous rounds (all processes or a fraction), dropped stale steps cut the stored episode, the
trajectories of on-policy algorithms, and no child outlives a killed trainer.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import gin
import pytest
import torch

from alfish.algorithms.build import build_policy
from alfish.collect.async_collector import (
    AsyncCollector,
    CollectionSettings,
    UnrollSpec,
    restart_episodes,
    truncate_episodes,
)
from alfish.collect.collector import ProgressPoint
from alfish.collect.episode_stats import EpisodeStats
from alfish.config import TrainerConfig, load_conf
from alfish.data import nest
from alfish.data.types import Experience, StepType, TimeStep
from alfish.envs.batched_env import EnvSettings, environment_settings

from . import test_async_collector as single

pytestmark = [pytest.mark.timeout(90)]

# The single-child tests' confs, with 4 envs (2 a process)
DQN_CHAIN = single.DQN_CHAIN.replace("num_parallel_environments = 2", "num_parallel_environments = 4")
SAC_POINT_GOAL = single.SAC_POINT_GOAL.replace("num_parallel_environments = 2", "num_parallel_environments = 4")
DQN_CARTPOLE = DQN_CHAIN.replace("'alfish/Chain-v0'", "'CartPole-v1'")
A2C_CHAIN = single.A2C_CHAIN.replace("num_parallel_environments = 2", "num_parallel_environments = 4")


class Sink(list):
    """A collector's sink that keeps every step ``[B/N, ...]`` it is given, in order, and every episode cut."""

    def __init__(self):
        super().__init__()
        self.cuts = []

    def add(self, step):
        self.append(step)

    def truncate_episodes(self, env_ids=None):
        self.cuts.append((len(self), env_ids.tolist()))


class Rig:
    """The trainer side with ``processes`` children (started), the policy built from the spec they reported."""

    def __init__(self, tmp_path, conf_text, processes=2, queue_size=50, seed=3, **collection):
        conf = tmp_path / "conf.gin"
        conf.write_text(conf_text)
        load_conf(str(conf))
        config = TrainerConfig(root_dir=str(tmp_path / "root"))
        spec = UnrollSpec(environment_settings(seed=seed), gin.config_str(), str(tmp_path / "root"),
                          step_interval_s=0.0, parent_pid=os.getpid())
        self.collector = AsyncCollector(spec, queue_size, collection=CollectionSettings(processes, **collection))
        self.transformer, self.algorithm = build_policy(config, self.collector.spec)
        self.sink = Sink()
        self.collector.start(self.algorithm, self.transformer, self.sink, seed, ProgressPoint(0, 0, 0.0))

    def publish(self):
        return self.collector.publish(ProgressPoint(0, 0, 0.0))


@pytest.fixture
def rig_factory(tmp_path):
    rigs = []

    def make(conf_text, **kwargs):
        rigs.append(Rig(tmp_path / str(len(rigs)), conf_text, **kwargs))
        return rigs[-1]

    yield make
    for rig in rigs:
        rig.collector.close()
    gin.clear_config()


@pytest.fixture(autouse=True)
def _dirs(tmp_path):
    for i in range(3):
        (tmp_path / str(i)).mkdir()


def by_process(steps):
    grouped = {}
    for s in steps:
        grouped.setdefault(s.process, []).append(s)
    return grouped


# ----------------------------------------------------------------------------------------------- the env shares --
def test_env_shares_keep_the_ids_and_seeds_of_one_batch():
    settings = EnvSettings("CartPole-v1", 6, seed=100, vectorization="sync", env_kwargs=None, render_mode=None,
                           step_timeout_s=60.0)
    shares = [settings.share(p, 3) for p in range(3)]
    assert [(s.num_parallel_environments, s.seed, s.first_env_id) for s in shares] == [(2, 100, 0), (2, 102, 2),
                                                                                        (2, 104, 4)]
    env = shares[1].create()
    try:
        assert env.reset().env_id.tolist() == [2, 3]
    finally:
        env.close()
    with pytest.raises(ValueError, match=r"num_parallel_environments=6 must be a multiple of "
                                         r"Trainer.num_unroll_processes=4"):
        settings.share(0, 4)


def test_episode_stats_of_a_share_of_the_envs():
    stats = EpisodeStats(4)

    def step(step_type, reward, env_id):
        return TimeStep(torch.tensor(step_type, dtype=torch.int8), torch.tensor(reward), torch.ones(len(env_id)),
                        torch.zeros(len(env_id), 1), torch.zeros(len(env_id)), torch.tensor(env_id))

    stats.observe(step([StepType.FIRST] * 4, [0.0] * 4, [0, 1, 2, 3]))
    stats.observe(step([StepType.MID, StepType.MID], [1.0, 2.0], [2, 3]))  # envs 2 and 3 only
    stats.observe(step([StepType.MID, StepType.LAST], [10.0, 20.0], [0, 1]))  # env 1 ends: 20 in 1 step
    stats.observe(step([StepType.LAST, StepType.MID], [3.0, 4.0], [2, 3]))  # env 2 ends: 1 + 3 in 2 steps
    assert list(stats.returns) == [20.0, 4.0] and list(stats.lengths) == [1, 2] and stats.num_episodes == 2
    stats.observe(step([StepType.LAST, StepType.LAST], [1.0, 1.0], [0, 3]))  # env 0: 10 + 1, env 3: 2 + 4 + 1
    assert list(stats.returns)[2:] == [11.0, 7.0] and list(stats.lengths)[2:] == [2, 3]


def test_the_step_after_a_gap_starts_episodes_and_the_step_before_it_ends_them():
    exp = Experience(step_type=torch.tensor([StepType.FIRST, StepType.MID, StepType.LAST], dtype=torch.int8),
                     reward=torch.tensor([0.0, 2.0, 3.0]), discount=torch.tensor([1.0, 0.0, 0.0]),
                     observation=torch.zeros(3, 2), action=torch.zeros(3), env_id=torch.arange(3))
    restarted = restart_episodes(exp)
    assert restarted.step_type.tolist() == [StepType.FIRST, StepType.FIRST, StepType.LAST]
    assert restarted.reward.tolist() == [0.0, 0.0, 3.0] and restarted.discount.tolist() == [1.0, 1.0, 0.0]
    ended = truncate_episodes(exp)
    assert ended.step_type.tolist() == [StepType.LAST] * 3
    assert torch.equal(ended.reward, exp.reward) and torch.equal(ended.discount, exp.discount)


# -------------------------------------------------------------------------------------------- the processes --
def test_each_process_steps_its_share_and_every_step_arrives_in_order(rig_factory):
    rig = rig_factory(SAC_POINT_GOAL, processes=2)
    collector = rig.collector
    assert collector.spec.num_envs == 4 and len(set(collector.processes.pids)) == 2
    steps = by_process(collector.receive(25))
    assert sorted(steps) == [0, 1] and all(len(s) == 25 for s in steps.values())  # 25 steps of every process
    for process, ids in ((0, [0, 1]), (1, [2, 3])):
        assert all(s.experience.env_id.tolist() == ids for s in steps[process])
        obs = torch.stack([s.experience.observation[:, 0] for s in steps[process]])
        action = torch.stack([s.experience.action[:, 0] for s in steps[process]])
        step_type = torch.stack([s.experience.step_type for s in steps[process]])
        expected = ([StepType.FIRST] + [StepType.MID] * 9 + [StepType.LAST]) * 3  # 10-step episodes
        assert step_type.T.tolist() == [expected[:25]] * 2
        for t in range(24):  # each step follows from the previous one and its action: x' = clip(x + 0.25 a)
            if int(step_type[t + 1, 0]) != StepType.FIRST:
                assert torch.allclose(obs[t + 1], (obs[t] + 0.25 * action[t].clamp(-1, 1)).clamp(-2, 2), atol=1e-5)


def test_the_envs_start_as_one_process_stepping_all_of_them_would(rig_factory):
    first_obs = []
    for processes in (1, 2):
        rig = rig_factory(DQN_CARTPOLE, processes=processes, seed=11)
        steps = rig.collector.receive(1)
        first = sorted(steps, key=lambda s: int(s.experience.env_id[0]))
        first_obs.append(torch.cat([s.experience.observation for s in first]))
        rig.collector.close()
    assert first_obs[0].shape == (4, 4) and len(set(first_obs[0][:, 0].tolist())) == 4  # envs seeded apart
    assert torch.equal(first_obs[0], first_obs[1])  # env i is seeded seed + i whichever process steps it


def test_one_publish_reaches_every_process(rig_factory):
    rig = rig_factory(DQN_CHAIN, processes=2, queue_size=8)
    head = [m for m in rig.algorithm.q_net.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(torch.tensor([0.0, 5.0]))  # always "right"
    first = rig.publish()
    rig.collector.receive(15)
    with torch.no_grad():
        head.bias.copy_(torch.tensor([5.0, 0.0]))  # always "left"
    second = rig.publish()
    after = rig.collector.receive(30)
    for process, steps in by_process(after).items():
        acting = {s.version for s in steps}
        assert acting <= {first, second} and second in acting, (process, acting)  # stamps name published versions
        for s in steps:
            if int(s.experience.step_type[0]) != StepType.LAST:  # (the env ignores the action at LAST)
                assert set(s.experience.action.tolist()) == ({1} if s.version == first else {0}), (process, s.version)
        assert all(s.version == second for s in steps[-10:])  # in use within a queue's worth of steps


def test_a_round_waits_for_a_fraction_of_the_processes(rig_factory):
    rig = rig_factory(SAC_POINT_GOAL, processes=2, queue_size=10, min_fraction=0.5)
    rig.collector.receive(3)  # both are stepping
    stopped = rig.collector.processes.pids[1]
    os.kill(stopped, signal.SIGSTOP)  # process 1 sends nothing more
    try:
        time.sleep(0.5)
        rig.collector.receive(None)  # (what each sent before the stop)
        start = time.monotonic()
        steps = by_process(rig.collector.receive(20))
        assert time.monotonic() - start < 5  # did not wait for the stopped process (its stall check is 5 s)
        assert len(steps[0]) == 20 and len(steps.get(1, [])) < 20
    finally:
        os.kill(stopped, signal.SIGCONT)
    arrived = set()
    for _ in range(5):  # the continued process sends again, and its steps are taken
        arrived |= set(by_process(rig.collector.receive(20)))
    assert arrived == {0, 1}


def test_every_process_delivers_its_share_when_the_fraction_is_one(rig_factory):
    rig = rig_factory(SAC_POINT_GOAL, processes=2, queue_size=1000)
    rig.collector.receive(3)
    stopped = rig.collector.processes.pids[1]
    os.kill(stopped, signal.SIGSTOP)
    try:
        with pytest.raises(Exception, match=rf"the async unroll child 1 of 2 \(pid {stopped}\) is stopped"):
            rig.collector.receive(10_000)
    finally:
        os.kill(stopped, signal.SIGCONT)


def test_steps_of_too_old_a_policy_are_dropped_and_the_stored_episode_cut(rig_factory):
    rig = rig_factory(SAC_POINT_GOAL, processes=2, queue_size=6, max_policy_lag=0)
    time.sleep(1.0)  # the queue fills with steps of version 1
    version = rig.publish()  # 2: the queued steps are now one version old
    assert rig.collector.collect(4) == 4  # 4 steps of each process's 2 envs, all of version 2
    kept = rig.sink
    assert len(kept) == 8 and rig.collector.dropped_env_steps >= 2 * 3  # the full queue, at least, was dropped
    assert rig.collector.summary()["async/dropped_env_steps"] == rig.collector.dropped_env_steps
    firsts = {}
    for index, step in enumerate(kept):
        firsts.setdefault(tuple(step.env_id.tolist()), index)
    # Each process's first kept step follows its dropped ones: the sink cut its envs' stored episodes just before it
    # (the newest stored step becomes LAST), and the step itself starts episodes (no MID left in it).
    assert sorted(rig.sink.cuts) == sorted((firsts[ids], list(ids)) for ids in firsts)
    for index in firsts.values():
        assert StepType.MID not in kept[index].step_type.tolist()
    # Versions: nothing older than the newest was kept (max_policy_lag=0).
    assert rig.collector.policy_lag.summary(0)["policy_lag_versions_max"] == 0 and version == 2


def test_a_kept_step_is_neither_cut_nor_restarted_without_a_gap(rig_factory):
    rig = rig_factory(SAC_POINT_GOAL, processes=2, queue_size=6, max_policy_lag=5)
    rig.collector.collect(12)
    assert rig.collector.dropped_env_steps == 0 and rig.sink.cuts == []
    step_types = torch.stack([s.step_type for s in rig.sink if s.env_id.tolist() == [0, 1]])
    assert step_types[:11, 0].tolist() == [StepType.FIRST] + [StepType.MID] * 9 + [StepType.LAST]


def test_trajectories_of_several_processes_follow_each_other(rig_factory):
    rig = rig_factory(A2C_CHAIN, processes=2)
    first, second = rig.collector.collect_trajectory(5, with_grad=False), rig.collector.collect_trajectory(5, False)
    assert first.step_type.shape == second.step_type.shape == (6, 4)  # [T + 1, B], both processes side by side
    assert torch.equal(first.env_id, torch.arange(4).expand(6, 4))
    for a, b in zip(nest.flatten(first), nest.flatten(second)):  # the last row (bootstrap only) trains next time
        assert torch.equal(a[-1], b[0])
    for steps in torch.cat([first.step_type, second.step_type[1:]]).T.tolist():  # consecutive steps of each env
        assert steps[0] == StepType.FIRST
        assert all(b == StepType.FIRST for a, b in zip(steps, steps[1:]) if a == StepType.LAST), steps
        assert all(b != StepType.FIRST for a, b in zip(steps, steps[1:]) if a != StepType.LAST), steps


def test_a_process_failure_names_the_process(rig_factory):
    rig = rig_factory(SAC_POINT_GOAL.replace("'alfish/PointGoal-v0'", "'alfish/Latency-v0'") + """
create_environment.env_kwargs = {'env_name': 'alfish/PointGoal-v0', 'latency_s': 0.0, 'raise_at_step': 7}
""", processes=2)
    with pytest.raises(Exception, match=r"the async unroll child [01] of 2 \(pid \d+\) failed:\n.*Traceback") as info:
        rig.collector.receive(1000)
    assert "injected failure at step 7" in str(info.value)


ORPHAN_SCRIPT = """
import os, sys, time
import gin
from alfish.collect.async_collector import AsyncCollector, CollectionSettings, UnrollSpec
from alfish.algorithms.build import build_policy
from alfish.collect.collector import ProgressPoint
from alfish.config import TrainerConfig, load_conf
from alfish.envs.batched_env import environment_settings

if __name__ == "__main__":  # (spawned children import this script again)
    load_conf(sys.argv[1])
    config = TrainerConfig(root_dir=sys.argv[2])
    spec = UnrollSpec(environment_settings(seed=0), gin.config_str(), sys.argv[2], step_interval_s=0.0,
                      parent_pid=os.getpid())
    collector = AsyncCollector(spec, 4, collection=CollectionSettings(3))
    transformer, algorithm = build_policy(config, collector.spec)
    collector.start(algorithm, transformer, None, 0, ProgressPoint(0, 0, 0.0))
    print(" ".join(str(p) for p in collector.processes.pids), flush=True)
    time.sleep(600)  # killed here, holding 3 children that block on a full queue
"""


def test_no_process_outlives_a_killed_trainer(tmp_path):
    conf = tmp_path / "conf.gin"
    conf.write_text(SAC_POINT_GOAL.replace("num_parallel_environments = 4", "num_parallel_environments = 3"))
    script = tmp_path / "trainer.py"
    script.write_text(textwrap.dedent(ORPHAN_SCRIPT))
    trainer = subprocess.Popen([sys.executable, str(script), str(conf), str(tmp_path / "root")],
                               stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in trainer.stdout.readline().split()]
        assert len(pids) == 3
        trainer.kill()  # SIGKILL: no close(), no atexit
        trainer.wait(timeout=10)
        deadline = time.monotonic() + 20
        alive = pids
        while alive and time.monotonic() < deadline:
            alive = [p for p in pids if _alive(p)]
            time.sleep(0.2)
        assert not alive, f"children {alive} outlived their trainer"
    finally:
        if trainer.poll() is None:
            trainer.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not reaped by the dead parent's reaper yet) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


# ------------------------------------------------------------------------------------------------- restarts --
FAILING_POINT_GOAL = SAC_POINT_GOAL.replace("'alfish/PointGoal-v0'", "'alfish/Latency-v0'") + """
create_environment.env_kwargs = {'env_name': 'alfish/PointGoal-v0', 'latency_s': 0.0, 'raise_at_step': 7}
"""


def test_a_crashed_child_is_replaced_and_its_episodes_are_cut_not_counted(rig_factory):
    # Every env raises at its 7th step: each child (and each replacement) sends 6 steps (FIRST + 5 MID) and fails;
    # a 10-step episode never finishes.
    # (one process: a replacement's start-up takes seconds, and the replacements of several run one after another)
    rig = rig_factory(FAILING_POINT_GOAL, processes=1, restart_crashed=True, max_restarts_per_hour=100)
    collector = rig.collector
    pids = collector.processes.pids
    assert collector.collect(8) == 8  # more than one child of each process could give: replacements stepped on
    assert collector.env_restarts >= 1 and collector.processes.pids != pids
    assert collector.summary()["async/env_restarts"] == collector.env_restarts
    assert collector.stats.num_episodes == 0  # no episode was cut short and counted as finished
    for ids in ([0, 1, 2, 3],):
        steps = [s for s in rig.sink if s.env_id.tolist() == ids]
        types = [int(s.step_type[0]) for s in steps]
        assert len(types) == 8
        # 6 steps of each child in order, then the next child's FIRST: no MID ever leads into a FIRST, and the steps
        # before each FIRST after the first were cut (the sink marked its newest stored step LAST)
        assert types[:6] == [StepType.FIRST] + [StepType.MID] * 5 and types[6] == StepType.FIRST, types
        cut_at = [index for index, cut in rig.sink.cuts if cut == ids]
        starts = [index for index, s in enumerate(rig.sink) if s.env_id.tolist() == ids and
                  int(s.step_type[0]) == StepType.FIRST][1:]
        assert cut_at == starts, (cut_at, starts)


def test_replacements_beyond_the_hourly_limit_end_the_run(rig_factory):
    rig = rig_factory(FAILING_POINT_GOAL, processes=1, restart_crashed=True, max_restarts_per_hour=2)
    with pytest.raises(Exception, match=r"the async unroll child \(pid \d+\) failed: RuntimeError: alfish/Latency-v0: "
                                        r"injected failure at step 7 \(crashed envs were "
                                        r"replaced 2 times within the last hour, Trainer.max_env_restarts_per_hour="
                                        r"2: the env keeps failing; the last failure follows\)") as info:
        rig.collector.collect(100)
    assert "injected failure at step 7" in str(info.value) and rig.collector.env_restarts == 2


def test_a_killed_child_is_replaced_when_restarts_are_on(rig_factory):
    # A queue of 5 steps: the killed child cannot have queued the 40 steps asked next (with the rig's 50 it could run
    # that far ahead during collect(3) on a loaded machine, and collect(40) was served from its queue without ever
    # waiting on it, so the death went unseen: a CI flake)
    rig = rig_factory(SAC_POINT_GOAL, processes=2, restart_crashed=True, queue_size=5)
    rig.collector.collect(3)
    killed = rig.collector.processes.pids[0]
    os.kill(killed, signal.SIGKILL)
    rig.collector.collect(40)  # goes on: the new child steps envs 0 and 1
    assert rig.collector.env_restarts == 1 and killed not in rig.collector.processes.pids
    with pytest.raises(ProcessLookupError):
        os.kill(killed, 0)
