"""SAC's TD target against a hand computation on a 2-step batch, with a time-limit truncation (bootstrapped) and a
true termination (not bootstrapped). Critics are set to constants so the target is known exactly:
target critics output (2, 3) -> min 2; online critics output (1, 1.5); alpha = 0 (no entropy term); gamma = 0.9."""
import gymnasium as gym
import pytest
import torch

from alfish.algorithms.sac import SacAlgorithm
from alfish.data.types import Experience, StepType

GAMMA = 0.9


def constant_ensemble(ensemble, values):
    """Every member outputs its constant, whatever the input: zero weights and hidden biases, output bias = value."""
    with torch.no_grad():
        for w in ensemble.weights:
            w.zero_()
        for b in ensemble.biases:
            b.zero_()
        ensemble.biases[-1].copy_(torch.tensor(values).view(-1, 1, 1))


@pytest.fixture
def sac():
    space = gym.spaces.Box(-1.0, 1.0, shape=(1,))
    algorithm = SacAlgorithm(space, space, hidden_sizes=(4,), gamma=GAMMA, initial_log_alpha=-1e4)  # alpha = 0
    constant_ensemble(algorithm.target_critics, [2.0, 3.0])
    constant_ensemble(algorithm.critics, [1.0, 1.5])
    return algorithm


def two_step_batch(second_step_type, second_discount):
    """``[L=2, B=2]``: env 0 MID -> MID with reward 1; env 1 MID -> ``second_step_type`` with reward 0.5."""
    mid = StepType.MID
    return Experience(
        step_type=torch.tensor([[mid, mid], [mid, second_step_type]], dtype=torch.int8),
        reward=torch.tensor([[0.0, 0.0], [1.0, 0.5]]),
        discount=torch.tensor([[1.0, 1.0], [1.0, second_discount]]),
        observation=torch.zeros(2, 2, 1), action=torch.zeros(2, 2, 1), env_id=torch.tensor([[0, 1], [0, 1]]))


@pytest.mark.parametrize("step_type, discount, target_env1", [
    (StepType.MID, 1.0, 0.5 + GAMMA * 2.0),   # an ordinary step bootstraps: 2.3
    (StepType.LAST, 1.0, 0.5 + GAMMA * 2.0),  # a time-limit truncation is LAST with discount 1: still bootstraps
    (StepType.LAST, 0.0, 0.5),                # a true termination: the reward alone
], ids=["mid", "truncated", "terminated"])
def test_td_target_matches_the_hand_computation(sac, step_type, discount, target_env1):
    exp = two_step_batch(step_type, discount)
    loss_info = sac.calc_loss(exp, sac.train_step(exp).info)
    targets = torch.tensor([1.0 + GAMMA * 2.0, target_env1])  # env 0: 1 + 0.9 * min(2, 3) = 2.8
    q = torch.tensor([[1.0], [1.5]])  # [critics, 1]
    expected_td_error = (q - targets).abs().mean(0)  # mean over the twin critics, per sequence
    expected_critic_loss = 0.5 * ((q - targets) ** 2).sum(0)
    assert torch.allclose(loss_info.priority, expected_td_error, atol=1e-6)
    info = sac.train_step(exp).info
    assert torch.allclose(info.critic_loss, expected_critic_loss, atol=1e-6)
    # by hand for the truncated case: |1 - 2.3| and |1.5 - 2.3| -> 1.05; 0.5 * (1.69 + 0.64) = 1.165
    if step_type == StepType.LAST and discount == 1.0:
        assert loss_info.priority[1].item() == pytest.approx(1.05)
        assert info.critic_loss[1].item() == pytest.approx(1.165)
