"""Normalizer statistics under DDP: a single process keeps its plain running statistics bit for bit; ranks that saw
different data hold, after a merge, bit-identical statistics equal to one process's over all the data (in-process with
simulated ranks, and with two real torchrun ranks over gloo)."""
import os
import subprocess
import sys

import pytest
import torch

from alfish.learn.distributed import DistContext, merge_statistics_across_ranks
from alfish.transforms import RunningMeanStd
from tests.trainer.ddp_batches import normalizer_batches

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(REPO, "tests", "trainer", "ddp_worker.py")


def old_update(count, mean, m2, batch):
    """RunningMeanStd.update as it was before statistics could be merged across ranks (the reference)."""
    n = batch.shape[0]
    batch_mean = batch.mean(0)
    batch_m2 = ((batch - batch_mean) ** 2).sum(0)
    total = count + n
    delta = batch_mean - mean
    mean += delta * (n / total)
    m2 += batch_m2 + delta ** 2 * (count * n / total)
    count.copy_(total)


def chunks(seed, sizes, scale=1.0, shift=0.0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn((n, 3), generator=gen, dtype=torch.float64) * scale + shift for n in sizes]


def test_a_single_process_keeps_the_plain_running_statistics_bit_for_bit():
    stats = RunningMeanStd((3,))
    assert not stats.tracks_rank_deltas  # no process group: no deltas kept
    count, mean, m2 = torch.zeros((), dtype=torch.float64), torch.zeros(3, dtype=torch.float64), torch.zeros(
        3, dtype=torch.float64)
    for batch in chunks(0, [1, 7, 100, 3], scale=2.0, shift=3.0):
        stats.update(batch)
        old_update(count, mean, m2, batch)
    assert torch.equal(stats.count, count) and torch.equal(stats.mean, mean) and torch.equal(stats.m2, m2)
    assert set(stats.state_dict()) == {"count", "mean", "m2"}  # checkpoints hold what they held
    before = {k: v.clone() for k, v in stats.state_dict().items()}
    merge_statistics_across_ranks(stats, DistContext())  # a single process: nothing happens
    assert all(torch.equal(before[k], v) for k, v in stats.state_dict().items())


def simulated_rank():
    stats = RunningMeanStd((3,))
    stats.tracks_rank_deltas = True  # as if built inside a 2-rank job
    return stats


def test_folding_the_ranks_deltas_gives_every_rank_one_processs_statistics_over_all_data():
    ranks = [simulated_rank(), simulated_rank()]
    reference = RunningMeanStd((3,))
    for merge_round in range(3):
        data = [chunks(10 * merge_round, [4, 1, 9]), chunks(10 * merge_round + 1, [5, 5], scale=3.0, shift=50.0)]
        if merge_round == 2:
            data[1] = []  # a rank that saw nothing since the last merge
        for stats, batches in zip(ranks, data):
            for batch in batches:
                stats.update(batch)
        assert not torch.equal(ranks[0].mean, ranks[1].mean)  # before the merge: each rank its own
        deltas = [stats.delta_vector() for stats in ranks]
        for stats in ranks:
            stats.fold_rank_deltas(deltas)
        for batch in data[0] + data[1]:
            reference.update(batch)
        for name in ("count", "mean", "m2"):
            assert torch.equal(getattr(ranks[0], name), getattr(ranks[1], name)), name  # bit-identical ranks
            torch.testing.assert_close(getattr(ranks[0], name), getattr(reference, name), rtol=1e-12, atol=1e-9)
        assert float(ranks[0].delta_count) == 0.0


def test_loading_statistics_starts_a_new_merge_base():
    saved = RunningMeanStd((3,))
    for batch in chunks(1, [6]):
        saved.update(batch)
    stats = simulated_rank()
    stats.update(chunks(2, [3])[0])
    stats.load_state_dict(saved.state_dict())
    assert float(stats.delta_count) == 0.0 and torch.equal(stats.base_mean, saved.mean)
    stats.fold_rank_deltas([stats.delta_vector(), stats.delta_vector()])  # nothing new anywhere: unchanged
    assert torch.equal(stats.mean, saved.mean) and torch.equal(stats.m2, saved.m2)


def test_statistics_built_before_the_process_group_are_refused():
    expected = r"normalizer statistics \['RunningMeanStd'\] were built before init_distributed"
    with pytest.raises(RuntimeError, match=expected):
        merge_statistics_across_ranks(RunningMeanStd((3,)), DistContext(rank=0, world_size=2))


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_two_ranks_that_saw_different_data_normalize_alike_after_each_merge(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           WORKER, "normalizer", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=100, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = [torch.load(tmp_path / f"stats-rank{r}.pt", weights_only=True) for r in (0, 1)]
    obs_ref, reward_ref = RunningMeanStd((3,)), RunningMeanStd(())
    for merge_round in range(2):
        for rank in (0, 1):
            for obs, reward in normalizer_batches(rank, merge_round):
                obs_ref.update(obs)
                reward_ref.update(reward)
        r0, r1 = got[0][merge_round], got[1][merge_round]
        assert not torch.equal(r0["local"]["transformers.0.stats.mean"], r1["local"]["transformers.0.stats.mean"])
        assert r0["merged"].keys() == r1["merged"].keys()
        for key in r0["merged"]:
            assert torch.equal(r0["merged"][key], r1["merged"][key]), key  # the same numbers on both ranks
        assert torch.equal(r0["probe"], r1["probe"])  # hence the same normalized observation
        expected = {"transformers.0.stats": obs_ref, "transformers.1.stats": reward_ref}
        for prefix, ref in expected.items():
            for name in ("count", "mean", "m2"):
                torch.testing.assert_close(r0["merged"][f"{prefix}.{name}"], getattr(ref, name), rtol=1e-12,
                                           atol=1e-9, msg=f"round {merge_round}: {prefix}.{name}")
