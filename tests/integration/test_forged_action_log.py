"""A checkpoint whose recorded action log was forged (a 4-byte stride-0 tensor claiming ten million actions) resumes
in seconds, in bounded memory, with one warning and an inexact resume (the envs restart), instead of replaying ten
million env steps."""
import logging
import resource
import time

import torch

from alfish.rundir.checkpoint import Checkpointer

from .inprocess import run_trainer_from_text

CONF = """
create_environment.env_name = 'CartPole-v1'
create_environment.num_parallel_environments = 2
DqnAlgorithm.hidden_sizes = (8,)
TrainerConfig.algorithm_ctor = @DqnAlgorithm
TrainerConfig.random_seed = 1
TrainerConfig.unroll_length = 2
TrainerConfig.initial_collect_steps = 4
TrainerConfig.replay_buffer_length = 64
TrainerConfig.mini_batch_size = 8
TrainerConfig.mini_batch_length = 2
TrainerConfig.num_checkpoints = 1
TrainerConfig.evaluate = False
Trainer.num_threads = 1
Trainer.run_record = False
"""


def test_a_forged_stride_0_action_log_resumes_quickly_and_inexactly(tmp_path, caplog):
    root = run_trainer_from_text(tmp_path, CONF, ["TrainerConfig.num_iterations = 3"])
    checkpointer = Checkpointer(str(root / "checkpoints"))
    ckpt = checkpointer.load(3)
    tensors = {name: value for name, value in ckpt.tensors.items()}
    tensors["collector"]["envs"][0]["actions"] = torch.zeros(1, dtype=torch.int64).expand(10_000_000)
    checkpointer.save(3, tensors, ckpt.meta)  # a forger can write a matching manifest too
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    with caplog.at_level(logging.WARNING):
        run_trainer_from_text(tmp_path, CONF, ["TrainerConfig.num_iterations = 5"])
    assert time.monotonic() - start < 10.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 200_000  # KB
    damaged = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert len(damaged) == 1 and "collector['envs'][0]['actions']: a broadcast tensor (shape [10000000]" in damaged[0]
    assert Checkpointer(str(root / "checkpoints")).scan().latest.step == 5
