"""Replay retirement (``Trainer.replay_max_use`` / ``replay_max_staleness``; DI-engine's AdvancedReplayBuffer): a
start drawn ``max_use`` times, or acted by parameters more than ``max_staleness`` iterations old, is never drawn
again; a batch that cannot avoid retired starts is a clear error; the counts survive a checkpoint; the truncation of
an env subset; and the run-level wiring (checks, a short SAC run)."""
import pytest
import torch

from alfish.algorithms.a2c import A2cAlgorithm
from alfish.algorithms.sac import SacAlgorithm
from alfish.config import TrainerConfig
from alfish.data.types import StepType
from alfish.replay import PrioritizedSampler, ReplayBuffer, RingBuffer, UniformSampler
from alfish.replay.replay_buffer import online_replay_of
from alfish.replay.retirement import RetiringSampler, _occurrence_rank
from alfish.trainer.collection_checks import check_collection
from alfish.trainer.options import RunOptions

from .test_replay_buffer import add, step


def retiring(kind, num_envs=1, capacity=8, max_use=None, max_staleness=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    inner = UniformSampler(gen) if kind == "uniform" else PrioritizedSampler(num_envs, capacity, sequence_length=1,
                                                                             generator=gen)
    sampler = RetiringSampler(inner, num_envs, capacity, max_use, max_staleness)
    return ReplayBuffer(RingBuffer(num_envs, capacity), sampler), sampler


def test_occurrence_rank_counts_earlier_equal_elements():
    assert _occurrence_rank(torch.tensor([5, 3, 5, 5, 3, 1])).tolist() == [0, 0, 1, 2, 1, 0]


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_every_start_is_drawn_at_most_max_use_times(kind):
    buf, sampler = retiring(kind, max_use=2)
    for _ in range(4):
        add(buf)  # 4 starts of length 1: 8 uses in all
    drawn = []
    for _ in range(4):  # 4 batches of 2 rows: exactly the 8 uses there are
        drawn += buf.sample(2, 1)[1].positions.tolist()
    assert sorted(drawn) == [0, 0, 1, 1, 2, 2, 3, 3]  # each start twice, never a third time
    assert sampler.uses[0, :4].tolist() == [2, 2, 2, 2]
    with pytest.raises(RuntimeError, match=r"100% of a replay batch is still retired after 32 redraws "
                                           r"\(Trainer.replay_max_use=2, replay_max_staleness=None\): the buffer holds "
                                           r"too few live sequences"):
        buf.sample(1, 1)
    add(buf)  # a new step is live again
    assert buf.sample(1, 1)[1].positions.tolist() == [4]


def test_a_slot_written_again_is_a_new_start_with_no_uses():
    buf, sampler = retiring("uniform", capacity=2, max_use=1)
    add(buf), add(buf)
    assert sorted(buf.sample(2, 1)[1].positions.tolist()) == [0, 1]
    add(buf)  # overwrites slot 0 with step 2: live again
    assert buf.sample(1, 1)[1].positions.tolist() == [2] and sampler.uses[0].tolist() == [1, 1]


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_steps_acted_by_too_old_parameters_are_not_drawn(kind):
    buf, sampler = retiring(kind, max_staleness=3)
    for stamp in (0, 0, 5, 5):  # the iteration whose parameters acted each step
        buf.set_acting_iteration(stamp)
        add(buf)
    buf.set_current_iteration(7)  # 7 - 0 = 7 > 3: retired; 7 - 5 = 2: live
    _, info = buf.sample(64, 1)
    assert set(info.positions.tolist()) == {2, 3}
    assert buf.oldest_index().tolist() == [2] and len(buf) == 2  # the stale steps (an env's oldest) were forgotten
    if kind == "prioritized":
        assert info.importance_weights.shape == (64,) and bool(torch.isfinite(info.importance_weights).all())
    assert buf.summary() == {"replay/retired_redraws": 0.0, "replay/stale_steps_forgotten": 2.0,
                             "replay/sampled_policy_age": 2.0, "replay/sampled_policy_age_max": 2.0}
    buf.set_current_iteration(9)  # now 9 - 5 = 4 > 3 too
    with pytest.raises(RuntimeError, match=r"the replay buffer holds \[0\] steps per env, too few"):
        buf.sample(1, 1)


def test_within_the_limit_a_retired_row_is_drawn_again():
    buf, sampler = retiring("prioritized", max_use=1, seed=3)
    for _ in range(4):
        add(buf)
    _, info = buf.sample(4, 1)  # 4 rows of 4 starts of one use each: a start drawn twice is drawn again
    assert sorted(info.positions.tolist()) == [0, 1, 2, 3] and info.importance_weights.shape == (4,)


def test_uses_and_stamps_survive_a_checkpoint():
    buf, sampler = retiring("uniform", max_use=3, max_staleness=10)
    for stamp in range(3):
        buf.set_acting_iteration(stamp)
        add(buf)
    buf.sample(4, 1)
    state = buf.state_dict()
    restored, restored_sampler = retiring("uniform", max_use=3, max_staleness=10)
    restored.load_state_dict(state, step(torch.arange(1), torch.zeros(1, dtype=torch.int64)))
    assert torch.equal(restored_sampler.uses, sampler.uses)
    assert restored_sampler.redraws == sampler.redraws
    assert restored.storage.policy_iterations[0, :3].tolist() == [0, 1, 2]


def test_a_checkpoint_whose_sampler_kept_the_stamps_still_restores_them():
    """Checkpoints written before the storage kept the acting iterations had them in the retiring sampler's state."""
    buf, _ = retiring("uniform", max_staleness=10)
    for stamp in (4, 6):
        buf.set_acting_iteration(stamp)
        add(buf)
    state = buf.state_dict()
    legacy_stamps = torch.zeros(1, 8, dtype=torch.int64)
    legacy_stamps[0, :2] = torch.tensor([4, 6])
    del state["storage"]["policy_iterations"]
    state["sampler"]["stamps"] = legacy_stamps
    restored, _ = retiring("uniform", max_staleness=10)
    restored.load_state_dict(state, step(torch.arange(1), torch.zeros(1, dtype=torch.int64)))
    assert restored.storage.policy_iterations[0, :3].tolist() == [4, 6, 0]


def test_truncating_some_envs_marks_only_their_newest_step():
    buf = ReplayBuffer(RingBuffer(3, 8), UniformSampler())
    for _ in range(2):
        add(buf)
    buf.truncate_episodes(torch.tensor([2, 0]))
    exp, _ = buf.gather_all()
    assert exp.step_type[:, -1].tolist() == [StepType.LAST, StepType.MID, StepType.LAST]
    assert exp.step_type[:, 0].tolist() == [StepType.FIRST] * 3


def test_the_collector_finds_the_replay_buffer_of_its_sink():
    buf, _ = retiring("uniform", max_use=1)
    assert online_replay_of(buf) is buf

    class Mixed:
        online = buf

    assert online_replay_of(Mixed()) is buf and online_replay_of(object()) is None


def test_retirement_needs_sampled_off_policy_replay():
    with pytest.raises(ValueError, match="Trainer.replay_max_use / replay_max_staleness retire samples of sampled "
                                         "replay; TrainerConfig.whole_replay_buffer_training=True trains on everything "
                                         "stored"):
        check_collection(TrainerConfig(root_dir="unused", algorithm_ctor=SacAlgorithm), RunOptions(replay_max_use=2))
    with pytest.raises(ValueError, match="A2cAlgorithm trains on-policy without replay"):
        config = TrainerConfig(root_dir="unused", algorithm_ctor=A2cAlgorithm, whole_replay_buffer_training=False,
                               mini_batch_size=4, mini_batch_length=1)
        check_collection(config, RunOptions(replay_max_staleness=5), A2cAlgorithm)


@pytest.mark.parametrize("name, value, low", [("replay_max_use", 0, 1), ("replay_max_staleness", -1, 0),
                                              ("replay_max_use", 2.0, 1)])
def test_retirement_limits_are_checked(name, value, low):
    with pytest.raises(ValueError, match=rf"Trainer.{name}={value} must be an int >= {low} or None \(no limit\)"):
        RunOptions(**{name: value})
