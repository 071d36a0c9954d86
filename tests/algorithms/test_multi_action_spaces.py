"""MultiDiscrete and MultiBinary actions: PPO's and A2C's policy head (shapes, dtypes, log-probs and entropies as the
sums over sub-actions, greedy actions), and the one-line refusal of the algorithms that cannot drive them."""
import gymnasium as gym
import numpy as np
import pytest
import torch

from alfish.algorithms.a2c import A2cAlgorithm
from alfish.algorithms.bc import BcAlgorithm
from alfish.algorithms.ddpg import DdpgAlgorithm, Td3Algorithm
from alfish.algorithms.dqn import DqnAlgorithm
from alfish.algorithms.iql import IqlAlgorithm
from alfish.algorithms.ppo import PpoAlgorithm
from alfish.algorithms.sac import SacAlgorithm
from alfish.data.types import StepType, TimeStep
from alfish.errors import OneLineValueError

OBS = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
MULTI_DISCRETE = gym.spaces.MultiDiscrete([3, 2])
MULTI_BINARY = gym.spaces.MultiBinary(3)


def time_step(obs: torch.Tensor) -> TimeStep:
    n = obs.shape[0]
    return TimeStep(step_type=torch.full((n,), StepType.MID, dtype=torch.int8), reward=torch.zeros(n),
                    discount=torch.ones(n), observation=obs, prev_action=torch.zeros(n), env_id=torch.arange(n))


def reference(space: gym.Space, out: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.distributions' log-prob and entropy ``[N]`` of the policy output ``out``."""
    if isinstance(space, gym.spaces.MultiBinary):
        dist = torch.distributions.Bernoulli(logits=out)
        return dist.log_prob(action.float()).sum(-1), dist.entropy().sum(-1)
    parts = [torch.distributions.Categorical(logits=x) for x in torch.split(out, list(space.nvec), -1)]
    return (sum(d.log_prob(action[:, i]) for i, d in enumerate(parts)), sum(d.entropy() for d in parts))


@pytest.mark.parametrize("cls", [PpoAlgorithm, A2cAlgorithm])
@pytest.mark.parametrize("space", [MULTI_DISCRETE, MULTI_BINARY], ids=["MultiDiscrete", "MultiBinary"])
def test_policy_head_samples_and_scores_multi_actions(cls, space):
    torch.manual_seed(0)
    alg = cls(OBS, space, hidden_sizes=(8,))
    k = space.shape[0]
    obs = torch.rand(64, 4) * 2 - 1
    out = alg.net.act(obs, greedy=False)
    assert out.action.shape == (64, k) and out.action.dtype == torch.int64
    assert space.contains(out.action[0].numpy().astype(space.dtype))
    logits = alg.net.policy(obs)
    assert logits.shape == (64, sum(space.nvec) if hasattr(space, "nvec") else k)
    ref_log_prob, ref_entropy = reference(space, logits, out.action)
    assert torch.allclose(out.log_prob, ref_log_prob, atol=1e-5) and out.log_prob.shape == (64,)
    assert torch.allclose(out.entropy, ref_entropy, atol=1e-5) and out.entropy.shape == (64,)
    again = alg.net.evaluate(obs, out.action)  # what PPO's update scores the stored action with
    assert torch.allclose(again.log_prob, out.log_prob)
    again.log_prob.sum().backward()
    # the score-function gradient reaches the policy head
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in alg.net.policy.parameters())


@pytest.mark.parametrize("space", [MULTI_DISCRETE, MULTI_BINARY], ids=["MultiDiscrete", "MultiBinary"])
def test_greedy_action_is_each_sub_actions_mode(space):
    torch.manual_seed(0)
    alg = PpoAlgorithm(OBS, space, hidden_sizes=(8,))
    obs = torch.rand(32, 4) * 2 - 1
    with torch.no_grad():
        logits = alg.net.policy(obs)
        greedy = alg.predict_step(time_step(obs)).output
    if isinstance(space, gym.spaces.MultiBinary):
        expected = (torch.sigmoid(logits) > 0.5).long()
    else:
        expected = torch.stack([x.argmax(-1) for x in torch.split(logits, list(space.nvec), -1)], -1)
    assert torch.equal(greedy, expected)
    assert len({tuple(a) for a in greedy.tolist()}) > 1  # the check is not vacuous: the actions differ by obs


def test_multi_discrete_parameters_and_state_dict_have_no_gaussian_log_std():
    alg = PpoAlgorithm(OBS, MULTI_DISCRETE, hidden_sizes=(8,))
    assert not hasattr(alg.net, "log_std")
    assert not any("layout" in key for key in alg.state_dict())  # the layout is rebuilt, not checkpointed


@pytest.mark.parametrize("cls", [SacAlgorithm, DqnAlgorithm, DdpgAlgorithm, Td3Algorithm, IqlAlgorithm, BcAlgorithm])
@pytest.mark.parametrize("space", [MULTI_DISCRETE, MULTI_BINARY], ids=["MultiDiscrete", "MultiBinary"])
def test_other_algorithms_refuse_multi_actions_in_one_line(cls, space):
    with pytest.raises(OneLineValueError) as err:
        cls(OBS, space)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{cls.__name__} cannot drive {type(space).__name__} actions")
    assert "PpoAlgorithm and A2cAlgorithm can" in message
