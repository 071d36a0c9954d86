"""A fixed algorithm and batch for the DDP gradient test (built identically in every process)."""
import gymnasium as gym
import numpy as np
import torch

from alfish.data.types import Experience, StepType


def build_algorithm_and_batch(algo: str, batch_size: int = 16):
    """``(algorithm, time-major batch [2, batch_size])`` from fixed seeds; losses without sampling noise."""
    from alfish.algorithms.ddpg import DdpgAlgorithm
    from alfish.algorithms.dqn import DqnAlgorithm

    torch.manual_seed(0)
    obs_space = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
    if algo == "dqn":
        algorithm = DqnAlgorithm(obs_space, gym.spaces.Discrete(2), hidden_sizes=(8,), n_step=1)
    else:
        algorithm = DdpgAlgorithm(obs_space, gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32),
                                  hidden_sizes=(8,))
    gen = torch.Generator().manual_seed(1)
    shape = (2, batch_size)
    action = (torch.randint(0, 2, shape, generator=gen) if algo == "dqn"
              else torch.rand(shape + (1,), generator=gen) * 2 - 1)
    batch = Experience(step_type=torch.full(shape, StepType.MID, dtype=torch.int8),
                       reward=torch.randn(shape, generator=gen), discount=torch.ones(shape),
                       observation=torch.randn(shape + (3,), generator=gen), action=action,
                       env_id=torch.zeros(shape, dtype=torch.long))
    return algorithm, batch
