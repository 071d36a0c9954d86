"""MixedReplayBuffer: one buffer over online rings and offline data, by hand on tiny contents."""
import pytest
import torch

from alfish.data.types import Experience, StepType
from alfish.replay.offline.d4rl import d4rl_to_steps
from alfish.replay.offline.mixed import MixedReplayBuffer
from alfish.replay.offline.offline_buffer import offline_replay_buffer
from alfish.replay.prioritized.base import value_of
from alfish.replay.replay_buffer import ReplayBuffer
from alfish.replay.ring_buffer import RingBuffer
from alfish.replay.samplers import UniformSampler
from tests.offline.device_offline import device_mixture, host_trees_record
from tests.replay.device_parts import BATCH, LENGTH, META, READERS, assert_on
from tests.replay.test_offline_d4rl import two_episodes

CPU = torch.device("cpu")


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


# ----------------------------------------------------- the online storage on the training device (meta here) ---
# (The offline data stay on the host; a meta tensor has no values, so a host tensor mixed into device data, or a read
# of a device value, raises.)

@pytest.mark.parametrize("priority_replay", [False, True], ids=["uniform", "prioritized"])
@pytest.mark.parametrize("reader", [None, *sorted(READERS)])
def test_a_mixed_sample_of_device_storage_and_host_data_is_on_the_device(tmp_path, reader, priority_replay):
    """RLPD with ``replay_storage='device'``: the offline rows are staged to the device before the parts are joined,
    and so are the offline steps a transformer reads; the batch and its info reach the learner there."""
    mixture, transformer = device_mixture(tmp_path, reader, priority_replay)
    assert mixture.offline.storage.device == CPU and mixture.online.storage.device == META
    raw, where = mixture.sample(BATCH, LENGTH)
    assert_on(raw, META)
    exp, info = mixture.to_device(transformer.transform_sample(raw, where, mixture), where)
    assert_on(exp, META)
    assert_on(info, META)
    assert exp.step_type.shape == (BATCH, LENGTH) and info.env_ids.shape == (BATCH,)
    assert (info.importance_weights is not None) == priority_replay
    assert mixture.drawn.tolist() == [BATCH // 2, BATCH // 2]


def test_priorities_of_a_mixed_sample_reach_each_sampler_with_its_own_indices_on_its_device(tmp_path, monkeypatch):
    mixture, _ = device_mixture(tmp_path, None, priority_replay=True)
    assert mixture.online.sampler.device == META  # no buffer reader: the online trees live with the storage
    received = []
    host_trees_record(mixture.offline, received, monkeypatch)
    _, where = mixture.sample(BATCH, LENGTH)
    assert_on(where, META)  # the online sampler's indices, the offline rows' joined to them
    seen = mixture.online.sampler._num_seen
    mixture.update_priorities(where, torch.rand(BATCH, device=META))
    assert mixture.online.sampler._num_seen == seen + BATCH // 2  # applied on the device trees
    [(info, priorities)] = received
    assert info.env_ids.device == info.positions.device == CPU  # as the offline sampler drew them: nothing read back
    assert info.env_ids.tolist() == [0] * (BATCH // 2)  # its own ring, not the mixture's env number
    assert priorities.shape == (BATCH // 2,) and priorities.device == META


def test_priorities_of_a_mixed_sample_land_on_the_rows_each_part_drew(tmp_path):
    """On the CPU, with values: each part's trees get the priorities of its own rows (the last of duplicates wins);
    the priorities of an older sample are refused."""
    mixture, _ = device_mixture(tmp_path, None, priority_replay=True, device=CPU)
    _, older = mixture.sample(BATCH, LENGTH)
    _, where = mixture.sample(BATCH, LENGTH)
    priorities = torch.arange(1.0, BATCH + 1)
    with pytest.raises(ValueError, match="priorities of its last sample"):
        mixture.update_priorities(older, priorities)
    mixture.update_priorities(where, priorities)
    half = BATCH // 2
    for part, rows, first_env in ((mixture.online, slice(0, half), 0), (mixture.offline, slice(half, None), 2)):
        sampler = part.sampler
        expected = {}
        for env, position, priority in zip(where.env_ids[rows].tolist(), where.positions[rows].tolist(),
                                           priorities[rows].tolist()):
            expected[(env - first_env) * part.capacity + position % part.capacity] = priority
        leaves = torch.tensor(list(expected))
        stored = (torch.tensor(list(expected.values())) + sampler.eps).pow(value_of(sampler.alpha))
        assert torch.allclose(sampler._assigned[leaves], stored)


def test_offline_data_handing_batches_to_another_device_than_the_online_storage_is_refused(tmp_path):
    mixture, _ = device_mixture(tmp_path, None, priority_replay=False)
    offline_to_cpu = offline_replay_buffer(d4rl_to_steps(two_episodes()), step(0), UniformSampler(), device="cpu")
    with pytest.raises(ValueError, match="so its buffer must hand batches to that device, not to cpu$"):
        MixedReplayBuffer(mixture.online, offline_to_cpu)


def test_a_mixed_sample_on_the_device_takes_its_priorities_back(tmp_path, monkeypatch):
    mixture, _ = device_mixture(tmp_path, None, priority_replay=True)
    received = []
    host_trees_record(mixture.offline, received, monkeypatch)
    seen = mixture.online.sampler._num_seen
    _, info = mixture.sample(BATCH, LENGTH, on_device=True)
    assert_on(info, META)
    mixture.update_priorities(info, torch.ones(BATCH, device=META))
    assert mixture.online.sampler._num_seen == seen + BATCH // 2
    assert [i.positions.device for i, _ in received] == [CPU]
