"""Run by ``torchrun`` in tests/trainer/test_distributed.py, test_rank_statistics.py and tests/gpu (one process per
rank).

    torchrun --nproc_per_node=2 tests/trainer/ddp_worker.py grads OUT_DIR ALGO [DEVICE [BACKEND]]
    torchrun --nproc_per_node=2 tests/trainer/ddp_worker.py updates OUT_DIR ALGO [DEVICE [BACKEND]]
    torchrun --nproc_per_node=2 tests/trainer/ddp_worker.py train OUT_DIR CONF ROOT_DIR [BINDING ...]
    torchrun --nproc_per_node=2 tests/trainer/ddp_worker.py slow_save OUT_DIR SECONDS PART CONF ROOT_DIR [BINDING ...]
    torchrun --nproc_per_node=2 tests/trainer/ddp_worker.py check OUT_DIR dqn
    torchrun --nproc_per_node=2 tests/trainer/ddp_worker.py normalizer OUT_DIR [DEVICE [BACKEND]]

grads: one DDP update of ALGO ('dqn' or 'ddpg', both with deterministic losses) on this rank's half of a fixed batch;
    writes the gradients to OUT_DIR/grads-rank{r}.pt. DEVICE: 'cpu' (default), 'cuda' (this local rank's GPU) or
    'cuda:N'; BACKEND: init_distributed's ('gloo', 'nccl'; default automatic).
updates: UPDATES Adam steps through DDP, each rank on batches of its own (rank-dependent seeds); writes the final
    parameters to OUT_DIR/params-rank{r}.pt.
train: a whole Trainer run of CONF (plus gin BINDINGs) into ROOT_DIR; writes the final parameters to
    OUT_DIR/params-rank{r}.pt (outside ROOT_DIR, which only rank 0 may write to).
slow_save: ``train``, with every checkpoint taking SECONDS longer, as a multi-GB replay buffer on a slow disk would:
    PART 'write' slows the write (``Checkpointer.save``, which a hard exit waits for), 'contents' the gathering of
    what it holds (``checkpoint_contents``, which a hard exit interrupts).
check: rank 1 nudges a parameter; the consistency check must name it.
normalizer: each rank feeds its own observations and rewards (``ddp_batches.normalizer_batches``) through an
    observation and a reward normalizer and merges the statistics across ranks, twice; writes each round's local
    (before the merge) and merged statistics and the normalized probe observation to OUT_DIR/stats-rank{r}.pt.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.trainer.ddp_batches import build_algorithm_and_batch, normalizer_batches  # noqa: E402

UPDATES = 5
PROBE = torch.tensor([[0.5, 4.0, 12.0]])


def _join(device_name: str = "cpu", backend: str = ""):
    """``(ctx, device)``: this rank's training device, and the process group joined for it."""
    from alfish.learn.device import DevicePolicy
    from alfish.learn.distributed import init_distributed

    device = DevicePolicy(device=device_name).training_device()
    return init_distributed(device, backend=backend or None), device


def grads(out_dir: str, algo: str, device_name: str = "cpu", backend: str = "") -> None:
    from alfish.data import nest
    from alfish.learn.distributed import shutdown, wrap_for_ddp

    ctx, device = _join(device_name, backend)
    algorithm, batch = build_algorithm_and_batch(algo)  # the same on every rank (fixed seeds)
    half = batch.step_type.shape[1] // ctx.world_size
    mine = nest.map_nest(lambda x: x[:, ctx.rank * half:(ctx.rank + 1) * half].to(device), batch)
    module = wrap_for_ddp(algorithm.to(device), ctx, device)
    module(mine).loss.mean().backward()
    torch.save({n: p.grad.cpu() for n, p in algorithm.named_parameters() if p.grad is not None},
               os.path.join(out_dir, f"grads-rank{ctx.rank}.pt"))
    shutdown(ctx, synchronize=True)


def updates(out_dir: str, algo: str, device_name: str = "cpu", backend: str = "") -> None:
    from alfish.data import nest
    from alfish.learn.distributed import check_parameters_equal, shutdown, wrap_for_ddp

    ctx, device = _join(device_name, backend)
    algorithm, _ = build_algorithm_and_batch(algo)
    algorithm.to(device)
    torch.manual_seed(10 + ctx.rank)  # DDP's initial broadcast must make up for the rank-dependent init
    with torch.no_grad():
        for p in algorithm.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    module = wrap_for_ddp(algorithm, ctx, device)
    optimizer = torch.optim.Adam(algorithm.parameters(), lr=1e-2)
    for step in range(UPDATES):
        _, batch = build_algorithm_and_batch(algo, batch_size=8, seed=1000 * ctx.rank + step)
        optimizer.zero_grad()
        module(nest.map_nest(lambda x: x.to(device), batch)).loss.mean().backward()
        optimizer.step()
    check_parameters_equal(algorithm, ctx)
    torch.save({n: p.detach().cpu() for n, p in algorithm.named_parameters()},
               os.path.join(out_dir, f"params-rank{ctx.rank}.pt"))
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


def normalizer(out_dir: str, device_name: str = "cpu", backend: str = "") -> None:
    import gymnasium as gym
    import numpy as np

    from alfish.data import nest
    from alfish.data.types import StepType, TimeStep
    from alfish.learn.distributed import merge_statistics_across_ranks, shutdown
    from alfish.transforms import ObservationNormalizer, RewardNormalizer, SequentialDataTransformer

    ctx, device = _join(device_name, backend)
    space = gym.spaces.Box(-100.0, 100.0, shape=(3,), dtype=np.float32)
    transformer = SequentialDataTransformer([ObservationNormalizer(space, clip_value=0.0), RewardNormalizer()])
    transformer.to(device)
    view = transformer.rollout_view(update_stats=True)
    rounds = []
    for merge_round in range(2):
        for obs, reward in normalizer_batches(ctx.rank, merge_round):
            n = obs.shape[0]
            step = TimeStep(torch.full((n,), StepType.MID, dtype=torch.int8), reward, torch.ones(n), obs,
                            torch.zeros(n, 1), torch.arange(n))
            view(nest.map_nest(lambda x: x.to(device), step))
        local = {k: v.cpu().clone() for k, v in transformer.state_dict().items()}
        merge_statistics_across_ranks(transformer, ctx)
        merged = {k: v.cpu().clone() for k, v in transformer.state_dict().items()}
        probe = transformer.transformers[0].normalize(PROBE.to(device)).cpu()
        rounds.append(dict(local=local, merged=merged, probe=probe))
    torch.save(rounds, os.path.join(out_dir, f"stats-rank{ctx.rank}.pt"))
    shutdown(ctx, synchronize=True)


def train(out_dir: str, conf: str, root_dir: str, *bindings: str) -> None:
    from alfish.bin.train import setup_logging
    from alfish.config import TrainerConfig, load_conf
    from alfish.trainer.build import build_trainer

    load_conf(conf, list(bindings))
    setup_logging(root_dir)  # as ``python -m alfish.bin.train``: rank 0 logs to root_dir/log.txt
    trainer = build_trainer(TrainerConfig(root_dir=root_dir))
    algorithm = trainer.algorithm
    assert trainer.run() == 0
    torch.save({k: v.cpu() for k, v in algorithm.state_dict().items()},
               os.path.join(out_dir, f"params-rank{os.environ['RANK']}.pt"))


def slow_save(out_dir: str, seconds: str, part: str, conf: str, root_dir: str, *bindings: str) -> None:
    import time

    from alfish.rundir.checkpoint import Checkpointer
    from alfish.trainer import trainer

    owner, name = dict(write=(Checkpointer, "save"), contents=(trainer, "checkpoint_contents"))[part]
    fast = getattr(owner, name)

    def slow(*args, **kwargs):
        time.sleep(float(seconds))
        return fast(*args, **kwargs)

    setattr(owner, name, slow)
    train(out_dir, conf, root_dir, *bindings)


MODES = dict(grads=grads, updates=updates, check=check, normalizer=normalizer, train=train, slow_save=slow_save)

if __name__ == "__main__":
    MODES[sys.argv[1]](*sys.argv[2:])
