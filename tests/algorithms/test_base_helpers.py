"""RLAlgorithm's helpers on the update path: action (un)scaling in one op with bounds computed once per bound
tensors, ``flat_obs`` that leaves flat float32 observations alone, and target updates that follow replaced
parameters."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from alfish.algorithms.ddpg import Td3Algorithm
from alfish.algorithms.dqn import DqnAlgorithm
from alfish.algorithms.sac import SacAlgorithm

OBS = gym.spaces.Box(-1.0, 1.0, shape=(3,))
ACT = gym.spaces.Box(low=np.array([-2.0, 0.1], dtype=np.float32), high=np.array([2.0, 0.7], dtype=np.float32))


def test_scale_and_unscale_follow_the_formulas():
    alg = SacAlgorithm(OBS, ACT, hidden_sizes=(4,))
    low, high = torch.tensor([-2.0, 0.1]), torch.tensor([2.0, 0.7])
    unit = torch.rand(50, 2) * 2 - 1
    env = low + (unit + 1.0) * 0.5 * (high - low)
    torch.testing.assert_close(alg.scale_action(unit), env)
    torch.testing.assert_close(alg.unscale_action(env), 2.0 * (env - low) / (high - low) - 1.0)
    torch.testing.assert_close(alg.unscale_action(alg.scale_action(unit)), unit)
    torch.testing.assert_close(alg.scale_action(torch.tensor([[-1.0, -1.0], [1.0, 1.0]])), torch.stack([low, high]))


def test_action_bounds_are_recomputed_when_the_module_moves():
    alg = SacAlgorithm(OBS, ACT, hidden_sizes=(4,))
    assert alg.unscale_action(torch.zeros(1, 2)).dtype == torch.float32
    alg.to(torch.float64)  # replaces the bound buffers: the cached affine maps follow them
    out = alg.unscale_action(torch.zeros(1, 2, dtype=torch.float64))
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, torch.tensor([[0.0, 2.0 * (0.0 - 0.1) / 0.6 - 1.0]], dtype=torch.float64))
    alg.to("meta")
    assert alg.scale_action(torch.zeros(1, 2, device="meta", dtype=torch.float64)).device.type == "meta"


def test_flat_obs_returns_flat_float32_observations_as_they_are():
    alg = SacAlgorithm(OBS, ACT, hidden_sizes=(4,))
    obs = torch.randn(2, 5, 3)
    assert alg.flat_obs(obs, batch_dims=2) is obs                  # no reshape, no cast
    torch.testing.assert_close(alg.flat_obs(obs.double(), batch_dims=2), obs)
    assert alg.flat_obs(obs.double(), batch_dims=2).dtype == torch.float32
    counts = gym.spaces.Box(0, 255, shape=(4,), dtype=np.uint8)
    dqn = DqnAlgorithm(counts, gym.spaces.Discrete(2))
    values = torch.arange(5 * 4, dtype=torch.uint8).view(5, 4)
    flat = dqn.flat_obs(values)
    assert flat.shape == (5, 4) and flat.dtype == torch.float32
    torch.testing.assert_close(flat, values.float())


@pytest.mark.parametrize("cls", [SacAlgorithm, Td3Algorithm])
def test_target_update_reads_parameters_replaced_by_load_state_dict_assign(cls):
    """A hard target update (tau = 1) right after ``load_state_dict(assign=True)`` (new Parameter objects) copies
    the loaded online weights: the target update does not hold on to stale parameter lists."""
    torch.manual_seed(0)
    alg = cls(OBS, ACT, hidden_sizes=(4,), target_update_tau=1.0)
    for _ in range(2):  # TD3 moves its targets on every second step
        alg.after_update()
    state = {k: v.clone() + (1.0 if k.startswith("critics.") else 0.0) for k, v in alg.state_dict().items()}
    alg.load_state_dict(state, assign=True)
    for _ in range(2):
        alg.after_update()
    for target, online in zip(alg.target_critics.parameters(), alg.critics.parameters()):
        torch.testing.assert_close(target, online)


def test_a_compiled_call_computes_the_action_maps_in_the_graph_and_caches_nothing():
    """The first (un)scaling inside a compiled region must not fill the cache: with CUDA graphs its tensors would be
    the graph's outputs, overwritten by the next replay. The eager call after it caches as before."""
    alg = Td3Algorithm(OBS, ACT, hidden_sizes=(4,))
    env = torch.tensor([[0.0, 0.4], [2.0, 0.1]])
    expected = torch.tensor([[0.0, 0.0], [1.0, -1.0]])
    torch._dynamo.reset()
    compiled = torch.compile(lambda a: alg.unscale_action(a), backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(env), expected)
    assert "_action_affine_cache" not in alg.__dict__
    torch.testing.assert_close(alg.unscale_action(env), expected)
    assert "_action_affine_cache" in alg.__dict__
    torch._dynamo.reset()
