"""Run by ``torchrun`` in tests/trainer/test_distributed.py (one process per rank).

    torchrun --nproc_per_node=2 tests/trainer/ddp_worker.py grads OUT_DIR ALGO
    torchrun --nproc_per_node=2 tests/trainer/ddp_worker.py train OUT_DIR CONF ROOT_DIR

grads: one DDP update of ALGO ('dqn' or 'ddpg', both with deterministic losses) on this rank's half of a fixed batch;
    writes the gradients to OUT_DIR/grads-rank{r}.pt.
train: a whole Trainer run of CONF into ROOT_DIR; writes the final parameters to OUT_DIR/params-rank{r}.pt (outside
    ROOT_DIR, which only rank 0 may write to).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.trainer.ddp_batches import build_algorithm_and_batch  # noqa: E402


def grads(out_dir: str, algo: str) -> None:
    from alfish.data import nest
    from alfish.trainer.distributed import init_distributed, shutdown, wrap_for_ddp

    ctx = init_distributed()
    algorithm, batch = build_algorithm_and_batch(algo)  # the same on every rank (fixed seeds)
    half = batch.step_type.shape[1] // ctx.world_size
    mine = nest.map_nest(lambda x: x[:, ctx.rank * half:(ctx.rank + 1) * half], batch)
    module = wrap_for_ddp(algorithm, ctx)
    module(mine).loss.mean().backward()
    torch.save({n: p.grad for n, p in algorithm.named_parameters() if p.grad is not None},
               os.path.join(out_dir, f"grads-rank{ctx.rank}.pt"))
    shutdown(ctx)


def train(out_dir: str, conf: str, root_dir: str) -> None:
    from alfish.bin.train import setup_logging
    from alfish.config import TrainerConfig, load_conf
    from alfish.trainer.trainer import Trainer

    load_conf(conf)
    setup_logging(root_dir)  # as ``python -m alfish.bin.train``: rank 0 logs to root_dir/log.txt
    trainer = Trainer(TrainerConfig(root_dir=root_dir))
    algorithm = trainer.algorithm
    assert trainer.run() == 0
    torch.save(algorithm.state_dict(), os.path.join(out_dir, f"params-rank{os.environ['RANK']}.pt"))


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    grads(out, sys.argv[3]) if mode == "grads" else train(out, sys.argv[3], sys.argv[4])
