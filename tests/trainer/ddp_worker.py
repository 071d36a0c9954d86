"""Run by ``torchrun`` in tests/trainer/test_distributed.py (one process per rank).

    torchrun --nproc_per_node=2 tests/trainer/ddp_worker.py grads OUT_DIR ALGO
    torchrun --nproc_per_node=2 tests/trainer/ddp_worker.py train OUT_DIR CONF ROOT_DIR
    torchrun --nproc_per_node=2 tests/trainer/ddp_worker.py check OUT_DIR dqn

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
    from alfish.learn.distributed import init_distributed, shutdown, wrap_for_ddp

    ctx = init_distributed()
    algorithm, batch = build_algorithm_and_batch(algo)  # the same on every rank (fixed seeds)
    half = batch.step_type.shape[1] // ctx.world_size
    mine = nest.map_nest(lambda x: x[:, ctx.rank * half:(ctx.rank + 1) * half], batch)
    module = wrap_for_ddp(algorithm, ctx)
    module(mine).loss.mean().backward()
    torch.save({n: p.grad for n, p in algorithm.named_parameters() if p.grad is not None},
               os.path.join(out_dir, f"grads-rank{ctx.rank}.pt"))
    shutdown(ctx, synchronize=True)


def check(out_dir: str, algo: str) -> None:
    """Rank 1 nudges one parameter; the consistency check must name it on every rank."""
    from alfish.learn.distributed import check_parameters_equal, init_distributed, shutdown

    ctx = init_distributed()
    algorithm, _ = build_algorithm_and_batch(algo)
    check_parameters_equal(algorithm, ctx)  # equal: passes
    if ctx.rank == 1:
        with torch.no_grad():
            dict(algorithm.named_parameters())["q_net.2.bias"][0] += 1e-3
    try:
        check_parameters_equal(algorithm, ctx)
    except RuntimeError as err:
        print(f"rank {ctx.rank}: {err}", flush=True)
        sys.exit(3)
    finally:
        shutdown(ctx)


def train(out_dir: str, conf: str, root_dir: str) -> None:
    from alfish.bin.train import setup_logging
    from alfish.config import TrainerConfig, load_conf
    from alfish.trainer.build import build_trainer

    load_conf(conf)
    setup_logging(root_dir)  # as ``python -m alfish.bin.train``: rank 0 logs to root_dir/log.txt
    trainer = build_trainer(TrainerConfig(root_dir=root_dir))
    algorithm = trainer.algorithm
    assert trainer.run() == 0
    torch.save(algorithm.state_dict(), os.path.join(out_dir, f"params-rank{os.environ['RANK']}.pt"))


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    if mode == "train":
        train(out, sys.argv[3], sys.argv[4])
    else:
        (grads if mode == "grads" else check)(out, sys.argv[3])
