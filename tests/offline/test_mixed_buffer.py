"""MixedReplayBuffer: one buffer over online rings and offline data, by hand on tiny contents."""
import pytest
import torch

from alfish.data.types import Experience, StepType
from alfish.replay.offline.d4rl import d4rl_to_steps
from alfish.replay.offline.mixed import MixedReplayBuffer
from alfish.replay.offline.offline_buffer import offline_replay_buffer
from alfish.replay.replay_buffer import ReplayBuffer
from alfish.replay.ring_buffer import RingBuffer
from alfish.replay.samplers import UniformSampler
from tests.replay.test_offline_d4rl import two_episodes


def step(t: int, num_envs: int = 2) -> Experience:
    """Online step t of every env: observation 100 * env + t (so a row says where it came from)."""
    env = torch.arange(num_envs)
    return Experience(step_type=torch.full((num_envs,), StepType.MID, dtype=torch.int8), reward=torch.zeros(num_envs),
                      discount=torch.ones(num_envs), observation=(100.0 * env + t).unsqueeze(1),
                      action=torch.zeros(num_envs, 1), env_id=env)


def mixture(fraction: float = 0.25) -> MixedReplayBuffer:
    online = ReplayBuffer(RingBuffer(2, 10), UniformSampler(torch.Generator().manual_seed(0)))
    for t in range(6):
        online.add(step(t))
    offline = offline_replay_buffer(d4rl_to_steps(two_episodes()), step(0),
                                    UniformSampler(torch.Generator().manual_seed(1)))
    return MixedReplayBuffer(online, offline, fraction)


def test_a_batch_is_online_rows_then_the_offline_fraction():
    buffer = mixture(0.25)
    exp, info = buffer.sample(8, 2)
    assert info.env_ids[:6].lt(2).all() and info.env_ids[6:].eq(2).all()  # offline data is env 2 of the mixture
    online_obs, offline_obs = exp.observation[:6, :, 0], exp.observation[6:, :, 0]
    assert ((online_obs % 100) < 6).all() and (online_obs[:, 1] - online_obs[:, 0] == 1).all()  # consecutive steps
    assert set(offline_obs.flatten().tolist()) <= {0.0, 1.0, 2.0, 20.0, 3.0, 4.0, 40.0}
    assert buffer.summary() == {"replay/offline_fraction": 0.25, "replay/offline_fraction_total": 0.25}
    assert len(buffer) == 12  # online steps only
    with pytest.raises(RuntimeError, match="read-only"):
        buffer.offline.add(step(0, 1))


def test_reads_by_env_id_are_routed_to_each_part_and_reassembled_in_order():
    buffer = mixture()
    env_ids = torch.tensor([2, 0, 2, 1])
    index = torch.tensor([[3], [4], [6], [5]])
    got = buffer.gather_at(env_ids, index).observation[:, 0, 0].tolist()
    assert got == [20.0, 4.0, 40.0, 105.0]
    assert buffer.oldest_index().tolist() == [0, 0, 0] and buffer.num_stored().tolist() == [6, 6, 7]


def test_a_checkpoint_restores_the_counts_of_drawn_sequences():
    buffer = mixture(0.5)
    buffer.sample(4, 2)
    state = buffer.state_dict()
    fresh = mixture(0.5)
    fresh.load_state_dict(state, step(0))
    assert fresh.drawn.tolist() == [2, 2]
