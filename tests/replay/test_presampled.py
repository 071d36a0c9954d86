"""Several mini-batches drawn in one sampler call (``Trainer.presample_mini_batches``): each block of a
prioritized draw is stratified and weighted on its own, the host (numpy) and torch code draw the same bits, uniform
blocks are uniform, and the training step makes one update per block and one priority write in update order.
(``Trainer.presample_mini_batches``.)"""
import pytest
import torch

from alfish.algorithms.dqn import DqnAlgorithm
from alfish.config.trainer_config import TrainerConfig
from alfish.data.types import BatchInfo, LossInfo
from alfish.replay.replay_buffer import ReplayBuffer
from alfish.replay.ring_buffer import RingBuffer
from alfish.replay.samplers import UniformSampler
from alfish.trainer.build import check_combinations
from alfish.trainer.options import RunOptions
from alfish.trainer.training import ReplaySettings, SampledReplayTraining, StepParts
from alfish.transforms.base import DataTransformer
from tests.replay.test_prioritized import add, make
from tests.replay.test_segment_tree import torch_code


@pytest.mark.parametrize("numpy_code", [True, False])
def test_each_block_of_a_prioritized_draw_is_stratified_on_its_own(numpy_code):
    # 8 drawable starts of equal priority and blocks of 8: stratified, each block draws every start exactly once
    # (one draw per eighth of the total); drawn as one batch of 24, the blocks would each cover a third of the range.
    def draw():
        buf, sampler = make(1, 16, 9, sequence_length=2, generator=torch.Generator().manual_seed(3))
        return sampler.sample(buf.storage, 8, 2, num_batches=3)

    if numpy_code:
        info = draw()
    else:
        with torch_code():
            info = draw()
    assert info.positions.shape == (24,) and info.importance_weights.shape == (24,)
    for block in info.positions.view(3, 8):
        assert sorted(block.tolist()) == list(range(8))


def test_host_and_torch_code_draw_the_same_bits_in_blocks_with_weights_normalized_per_block():
    def draw():
        buf, sampler = make(2, 20, 15, sequence_length=2, normalize_by_max=True,
                            generator=torch.Generator().manual_seed(0))
        first = sampler.sample(buf.storage, 6, 2)
        buf.update_priorities(first, torch.arange(1.0, 7.0))  # unequal priorities: unequal weights
        return sampler.sample(buf.storage, 6, 2, num_batches=4)

    host = draw()
    with torch_code():
        reference = draw()
    assert all(torch.equal(x, y) and x.dtype == y.dtype for x, y in zip(host, reference))
    blocks = host.importance_weights.view(4, 6)
    assert torch.equal(blocks.amax(1), torch.ones(4))  # each block by its own max (max_over='batch')
    assert (blocks < 1).any()


def test_uniform_blocks_are_the_draws_of_one_batch_of_all_of_them():
    storage = RingBuffer(2, 10)
    buf = ReplayBuffer(storage, UniformSampler(torch.Generator().manual_seed(5)))
    for _ in range(7):
        add(buf)
    blocks = buf.sampler.sample(storage, 4, 3, num_batches=5)
    buf.sampler.generator.manual_seed(5)
    whole = buf.sampler.sample(storage, 20, 3)
    assert all(torch.equal(a, b) for a, b in zip(blocks[:2], whole[:2])) and blocks.importance_weights is None
    assert ((blocks.positions >= 0) & (blocks.positions <= 7 - 3)).all()


class RecordingLearner:
    """Stands in for the Learner in this bookkeeping test (it records what it is given; the priority of a sequence is
    its batch number, so the write order is visible). The real Learner with presampled batches is the DQN learning
    test's (tests/integration/test_dqn_learning.py, n1-prioritized-presampled-compiled)."""

    def __init__(self) -> None:
        self.batches: list[tuple[torch.Size, BatchInfo]] = []

    def update(self, batch, info):
        self.batches.append((batch.reward.shape, info))
        return LossInfo(loss=torch.zeros(()), priority=torch.full((batch.reward.shape[1],), float(len(self.batches))))

    def update_scanned(self, batch, info, num_updates):
        return None  # (Learner.scan_updates off: one update per mini-batch)


def test_the_training_step_updates_per_block_and_writes_the_priorities_once_in_update_order():
    buf, sampler = make(2, 32, 20, sequence_length=2, generator=torch.Generator().manual_seed(1))
    writes = []
    original = buf.update_priorities
    buf.update_priorities = lambda where, p: (writes.append((where, p)), original(where, p))[1]
    learner = RecordingLearner()
    parts = StepParts(collector=None, learner=learner, algorithm=None, transformer=DataTransformer())
    settings = ReplaySettings(initial_collect_steps=0, num_env_steps=0, total_envs=2, num_updates_per_train_iter=3,
                              mini_batch_size=5, mini_batch_length=2, presample_mini_batches=True)
    SampledReplayTraining(parts, buf, settings)._train()
    assert [shape for shape, _ in learner.batches] == [torch.Size([2, 5])] * 3  # time-major [L, B] blocks
    assert len(writes) == 1
    where, priorities = writes[0]
    assert priorities.tolist() == [1.0] * 5 + [2.0] * 5 + [3.0] * 5
    for k, (_, info) in enumerate(learner.batches):  # each update got its block of the one draw
        assert torch.equal(info.positions, where.positions[5 * k:5 * (k + 1)])
        assert torch.equal(info.importance_weights, where.importance_weights[5 * k:5 * (k + 1)])


def test_presampling_is_for_sampled_online_training(tmp_path):
    options = RunOptions(presample_mini_batches=True)
    for overrides in (dict(whole_replay_buffer_training=True), dict(offline_buffer_dir=str(tmp_path))):
        config = TrainerConfig(root_dir=str(tmp_path), algorithm_ctor=DqnAlgorithm, mini_batch_size=4,
                               mini_batch_length=2, **{"whole_replay_buffer_training": False, **overrides})
        with pytest.raises(ValueError, match=r"^Trainer.presample_mini_batches=True draws the mini-batches of "
                                             r"sampled online training: it needs an off-policy algorithm"):
            check_combinations(config, options, on_policy=False)
