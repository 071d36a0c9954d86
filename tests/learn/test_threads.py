"""``Trainer.num_threads = 'auto'``: the rule of ``alfish.learn.threads`` on hand-computed cases, and its use by
``build_trainer``."""
import pytest
import torch

from alfish.learn.threads import (
    MAX_AUTO_THREADS,
    MIN_MACS_FOR_THREADS,
    auto_threads,
    check_setting,
    largest_matmul_macs,
)
from alfish.networks.mlp import MLP, EnsembleMLP
from alfish.trainer.options import RunOptions


def test_largest_matmul_counts_the_biggest_weight_times_the_batch():
    net = MLP(3, 1, (256, 64))  # weights 256x3, 64x256, 1x64: the largest has 16,384 entries
    assert largest_matmul_macs(net, 10) == 10 * 256 * 64
    twins = EnsembleMLP(2, 4, 1, (32, 32))  # [2, 32, 32] is one batched matmul of 2 * 32 * 32 MACs per row
    assert largest_matmul_macs(twins, 7) == 7 * 2 * 32 * 32


def test_small_updates_get_one_thread_whatever_the_machine():
    assert auto_threads(MIN_MACS_FOR_THREADS - 1, cores=64, busy=0.0) == 1


def test_large_updates_get_the_free_cores():
    big = MIN_MACS_FOR_THREADS * 10
    assert auto_threads(big, cores=2, busy=0.0) == 2
    assert auto_threads(big, cores=2, busy=1.2) == 1        # one core taken by another process
    assert auto_threads(big, cores=2, busy=3.0) == 1        # never below one
    assert auto_threads(big, cores=16, busy=4.0) == MAX_AUTO_THREADS   # 12 free, capped
    assert auto_threads(big, ranks_on_machine=4, cores=16, busy=0.0) == 4   # the ranks share the cores
    assert auto_threads(big, ranks_on_machine=4, cores=16, busy=8.0) == 2


@pytest.mark.parametrize("bad", [0, -2, 1.5, "two", True])
def test_bad_settings_are_refused_in_one_line(bad):
    with pytest.raises(ValueError, match="Trainer.num_threads.*'auto'"):
        RunOptions(num_threads=bad)
    check_setting("auto")
    check_setting(None)
    check_setting(3)


def test_build_trainer_gives_a_small_network_one_thread(tmp_path):
    import gin

    from alfish.config import TrainerConfig, load_conf
    from alfish.trainer.build import build_trainer, training_batch_rows
    from tests.integration.inprocess import OFF_POLICY_POINT_GOAL

    conf = tmp_path / "conf.gin"
    conf.write_text(OFF_POLICY_POINT_GOAL + "TrainerConfig.algorithm_ctor = @SacAlgorithm\n"
                    "SacAlgorithm.hidden_sizes = (16,)\nTrainerConfig.mini_batch_size = 16\n")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        load_conf(str(conf), [])
        config = TrainerConfig(root_dir=str(tmp_path / "root"))
        assert training_batch_rows(config, 1, on_policy=False) == 16 * (config.mini_batch_length - 1)
        trainer = build_trainer(config)
        trainer.close()
        assert torch.get_num_threads() == 1  # 16 rows x (2 x 16 x 16) MACs is far below the threshold
    finally:
        gin.clear_config()
        torch.set_num_threads(before)


def test_the_runs_own_child_processes_count_as_busy_cores(monkeypatch):
    from torch import nn

    from alfish.learn import threads

    monkeypatch.setattr(threads, "cores_available", lambda: 4)
    monkeypatch.setattr(threads, "busy_cores", lambda: 0.0)  # the children are idle when this is measured
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    big = nn.Linear(1024, 1024)  # 1M weights: batch 256 -> 268M MACs, above the threshold
    before = torch.get_num_threads()
    try:
        threads.set_threads("auto", big, 256)
        assert torch.get_num_threads() == 4
        threads.set_threads("auto", big, 256, own_children=2)  # async unroll child and async evaluator
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
