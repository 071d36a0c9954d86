"""A fixed algorithm and batch for the DDP gradient test (built identically in every process)."""
import gymnasium as gym
import numpy as np
import torch

from alfish.data.types import Experience, StepType


def build_algorithm_and_batch(algo: str, batch_size: int = 16, seed: int = 1):
    """``(algorithm, time-major batch [2, batch_size])`` from fixed seeds (the batch's: ``seed``); losses without
    sampling noise."""
    from alfish.algorithms.ddpg import DdpgAlgorithm
    from alfish.algorithms.dqn import DqnAlgorithm

    torch.manual_seed(0)
    obs_space = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
    if algo == "dqn":
        algorithm = DqnAlgorithm(obs_space, gym.spaces.Discrete(2), hidden_sizes=(8,), n_step=1)
    else:
        algorithm = DdpgAlgorithm(obs_space, gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32),
                                  hidden_sizes=(8,))
    gen = torch.Generator().manual_seed(seed)
    shape = (2, batch_size)
    action = (torch.randint(0, 2, shape, generator=gen) if algo == "dqn"
              else torch.rand(shape + (1,), generator=gen) * 2 - 1)
    batch = Experience(step_type=torch.full(shape, StepType.MID, dtype=torch.int8),
                       reward=torch.randn(shape, generator=gen), discount=torch.ones(shape),
                       observation=torch.randn(shape + (3,), generator=gen), action=action,
                       env_id=torch.zeros(shape, dtype=torch.long))
    return algorithm, batch


def normalizer_batches(rank: int, merge_round: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """What rank ``rank`` collects before merge ``merge_round``: ``[(observation [B, 3], reward [B])]`` with a
    rank-dependent number of envs ``B`` (2 + rank), number of steps (3 - rank + merge_round) and distribution (mean
    10 x rank, scale 1 + rank), from fixed seeds."""
    gen = torch.Generator().manual_seed(100 * rank + merge_round)
    num_envs, steps = 2 + rank, 3 - rank + merge_round
    return [(torch.randn((num_envs, 3), generator=gen, dtype=torch.float64).float() * (1 + rank) + 10.0 * rank,
             torch.randn((num_envs,), generator=gen) * (1 + rank) - 5.0 * rank) for _ in range(steps)]
