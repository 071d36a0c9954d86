"""``add_steps``: ``T`` steps per env written at once leave the ring and the sampler exactly as ``T`` calls of ``add``
(every path: the lockstep slice copies with and without wrap-around, episode-end tracking, more steps than slots, a
subset of envs), and the synchronous collector's chunked writes store exactly what per-step writes store."""
import gin
import pytest
import torch

from alfish.collect.collector import WRITE_CHUNK_STEPS, SyncCollector
from alfish.data import nest
from alfish.replay import PrioritizedSampler, ReplayBuffer, RingBuffer, UniformSampler

from .test_replay_buffer import step


def steps_of(env_ids, first, num_steps):
    """Steps ``first .. first + num_steps - 1`` of rings ``env_ids``: batch-major ``[B, T]``, and one by one."""
    one_by_one = [step(env_ids, first + t) for t in range(num_steps)]
    return nest.stack(one_by_one, dim=1), one_by_one


def buffers(kind, num_envs, capacity, track_episode_ends=False):
    """Two identical buffers: one written with add_steps, one with add."""
    def make():
        storage = RingBuffer(num_envs, capacity, track_episode_ends=track_episode_ends)
        generator = torch.Generator().manual_seed(0)
        sampler = (UniformSampler(generator) if kind == "uniform"
                   else PrioritizedSampler(num_envs, capacity, sequence_length=2, generator=generator))
        return ReplayBuffer(storage, sampler)
    return make(), make()


def assert_same(a: ReplayBuffer, b: ReplayBuffer):
    ring_a, ring_b = a.storage.state_dict(), b.storage.state_dict()
    assert torch.equal(ring_a["write_count"], ring_b["write_count"])
    assert all(torch.equal(x, y) for x, y in zip(ring_a["leaves"], ring_b["leaves"]))
    if ring_a.get("episode_end") is not None:
        assert torch.equal(ring_a["episode_end"], ring_b["episode_end"])
    assert a.storage.holds_sequence(2) == b.storage.holds_sequence(2)
    # the samplers draw the same starts (the prioritized one refreshes its dirty leaves first), then hold the same state
    info_a, info_b = a.sampler.sample(a.storage, 16, 2), b.sampler.sample(b.storage, 16, 2)
    assert torch.equal(info_a.positions, info_b.positions) and torch.equal(info_a.env_ids, info_b.env_ids)
    state_a, state_b = a.sampler.state_dict(), b.sampler.state_dict()
    for key in state_a:
        if key != "dirty":
            assert torch.equal(state_a[key], state_b[key]), key


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
@pytest.mark.parametrize("track_episode_ends", [False, True])
@pytest.mark.parametrize("chunks", [[5, 5], [3, 7, 4], [13], [2, 20]])  # capacity 8: wraps, and more than a ring
def test_add_steps_equals_one_add_per_step(kind, track_episode_ends, chunks):
    fast, slow = buffers(kind, 3, 8, track_episode_ends)
    envs, written = torch.arange(3), 0
    for num_steps in chunks:
        batch, one_by_one = steps_of(envs, written, num_steps)
        fast.add_steps(batch)
        for s in one_by_one:
            slow.add(s)
        written += num_steps
        assert_same(fast, slow)
    assert int(fast.write_count()[0]) == sum(chunks)


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_add_steps_of_some_envs_after_lockstep_ended(kind):
    fast, slow = buffers(kind, 3, 8)
    envs = torch.tensor([2, 0])  # not every env, not in order: the per-step path
    for buf in (fast, slow):
        buf.add(step(torch.arange(3), 0))
    fast.add_steps(steps_of(envs, 1, 4)[0])
    for s in steps_of(envs, 1, 4)[1]:
        slow.add(s)
    assert fast.write_count().tolist() == [5, 1, 5]
    assert_same(fast, slow)


class StepRecorder:
    """A sink that is a real replay buffer, counting how often each kind of write was called."""

    def __init__(self, buffer: ReplayBuffer):
        self.buffer, self.calls = buffer, {"add": 0, "add_steps": 0}

    def add(self, exp):
        self.calls["add"] += 1
        self.buffer.add(exp)

    def add_steps(self, exp):
        self.calls["add_steps"] += 1
        self.buffer.add_steps(exp)


TOTAL_STEPS = WRITE_CHUNK_STEPS * 2 + 7


@pytest.mark.parametrize("steps_per_collect, writes_per_collect", [
    (TOTAL_STEPS, {"add": 0, "add_steps": 3}),  # two full chunks and a partial one
    (1, {"add": 1, "add_steps": 0}),  # an unroll of one step (SAC's) is written as it is, without stacking
])
def test_the_sync_collector_writes_chunks_that_store_what_per_step_writes_store(steps_per_collect, writes_per_collect):
    from alfish.algorithms.dqn import DqnAlgorithm  # (the policy only acts: epsilon 1 with a seeded generator)
    from alfish.collect.collector import ProgressPoint
    from alfish.envs.batched_env import BatchedEnv
    from alfish.transforms.base import SequentialDataTransformer

    gin.clear_config()
    collects = TOTAL_STEPS // steps_per_collect
    stored = []
    for chunked in (True, False):
        env = BatchedEnv("CartPole-v1", 2, seed=5)
        torch.manual_seed(0)
        algorithm = DqnAlgorithm(env.observation_space, env.action_space, epsilon_greedy=1.0)
        collector = SyncCollector(env)
        sink = StepRecorder(ReplayBuffer(RingBuffer(2, 1000), UniformSampler()))
        collector.start(algorithm, SequentialDataTransformer([]), sink, seed=5, progress=ProgressPoint(0, 0, 0.0))
        if chunked:
            for _ in range(collects):
                collector.collect(steps_per_collect)
            assert sink.calls == {kind: n * collects for kind, n in writes_per_collect.items()}
        else:  # the unroll loop itself, one write per step
            with torch.inference_mode():
                collector.unroller.unroll(TOTAL_STEPS, sink.add)
        stored.append(sink.buffer.storage.state_dict())
        collector.close()
    assert torch.equal(stored[0]["write_count"], torch.full((2,), TOTAL_STEPS))
    assert all(torch.equal(x, y) for x, y in zip(stored[0]["leaves"], stored[1]["leaves"]))
    episode_starts = (stored[0]["leaves"][0] == 0).sum()  # step_type FIRST: several episodes ran (not a constant)
    assert episode_starts >= 4
