"""PpoAlgorithm(off_policy_correction='vtrace'): on data its own parameters acted it preprocesses as GAE does; on data
a behaviour policy acted, its advantages and targets are V-trace's of the current log-probabilities and values."""
import math

import gymnasium as gym
import pytest
import torch

from alfish.algorithms import PpoAlgorithm
from alfish.algorithms.ppo import PpoRolloutInfo
from alfish.data.types import Experience, StepType, TimeStep
from alfish.losses.vtrace import VTraceSettings, vtrace_returns

B, T = 3, 7
OBS, ACT = gym.spaces.Box(-1.0, 1.0, (4,)), gym.spaces.Discrete(3)


def acted_by(ppo: PpoAlgorithm, action_space: gym.Space = ACT) -> Experience:
    """A batch-major ``[B, T]`` buffer whose actions, log-probs and values ``ppo``'s rollout policy produced, with an
    episode end (a termination) inside it."""
    g = torch.Generator().manual_seed(0)
    obs = torch.rand(B, T, 4, generator=g) * 2 - 1
    step_type = torch.full((B, T), int(StepType.MID), dtype=torch.int8)
    step_type[0, 2], step_type[0, 3] = StepType.LAST, StepType.FIRST
    discount = torch.ones(B, T)
    discount[0, 2] = 0.0
    reward = torch.randn(B, T, generator=g)
    torch.manual_seed(1)
    with torch.no_grad():
        step = ppo.rollout_step(TimeStep(step_type=step_type.flatten(), reward=reward.flatten(),
                                         discount=discount.flatten(), observation=obs.flatten(0, 1),
                                         prev_action=torch.zeros((B * T,) + action_space.shape),
                                         env_id=torch.arange(B).repeat_interleave(T)))
    info = PpoRolloutInfo(log_prob=step.info.log_prob.view(B, T), value=step.info.value.view(B, T))
    return Experience(step_type=step_type, reward=reward, discount=discount, observation=obs,
                      action=step.output.view((B, T) + action_space.shape),
                      env_id=torch.arange(B).unsqueeze(1).expand(B, T), rollout_info=info)


def ppo(action_space: gym.Space = ACT, **kwargs) -> PpoAlgorithm:
    torch.manual_seed(0)
    return PpoAlgorithm(OBS, action_space, hidden_sizes=(16,), gamma=0.9, gae_lambda=0.8, **kwargs)


@pytest.mark.parametrize("action_space, kwargs", [
    (ACT, {}),
    (gym.spaces.Box(-1.0, 1.0, (2,)), {}),
    (gym.spaces.Box(-1.0, 1.0, (2,)), dict(use_sde=True)),
    (gym.spaces.MultiDiscrete([3, 2]), {}),
], ids=["discrete", "gaussian", "gsde", "multi_discrete"])
def test_on_its_own_data_vtrace_equals_gae(action_space, kwargs):
    plain, corrected = ppo(action_space, **kwargs), ppo(action_space, off_policy_correction="vtrace", **kwargs)
    exp = acted_by(plain, action_space)
    gae, vtrace = plain.preprocess_experience(exp), corrected.preprocess_experience(exp)
    assert vtrace.step_type.shape == (B, T - 1)
    for field in ("advantage", "value_target", "value", "log_prob"):
        torch.testing.assert_close(getattr(vtrace.rollout_info, field), getattr(gae.rollout_info, field),
                                   rtol=1e-5, atol=1e-5, msg=field)


def test_on_a_behaviour_policys_data_it_is_vtrace_of_the_current_parameters():
    corrected = ppo(off_policy_correction="vtrace", vtrace_clip_rho=1.5, vtrace_clip_c=0.5)
    exp = acted_by(corrected)
    # The behaviour policy gave every stored action half the current probability (rho = 2), and its values were
    # other estimates than the current value function's (they must not be used).
    info = exp.rollout_info
    behaviour = exp._replace(rollout_info=PpoRolloutInfo(info.log_prob - math.log(2.0), info.value + 10.0))
    out = corrected.preprocess_experience(behaviour).rollout_info
    tm = lambda x: x.transpose(0, 1)  # noqa: E731
    expected = vtrace_returns(torch.full((T, B), math.log(2.0)), tm(exp.reward), tm(info.value), tm(exp.step_type),
                              tm(exp.discount), VTraceSettings(0.9, 0.8, clip_rho=1.5, clip_c=0.5, clip_pg_rho=None))
    torch.testing.assert_close(out.value_target, tm(expected.value_target), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.advantage, tm(expected.advantage), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.value, info.value[:, :-1], rtol=1e-5, atol=1e-5)  # the current values
    torch.testing.assert_close(out.log_prob, behaviour.rollout_info.log_prob[:, :-1])  # the surrogate's old ones
    # rho = 2 is truncated to 1.5 in the TD errors: the targets differ from the on-policy ones
    on_policy = corrected.preprocess_experience(exp).rollout_info
    assert not torch.allclose(out.value_target, on_policy.value_target, atol=1e-3)


@pytest.mark.parametrize("kwargs, message", [
    (dict(off_policy_correction="retrace"), "PpoAlgorithm.off_policy_correction='retrace': use 'vtrace'"),
    (dict(off_policy_correction="vtrace", vtrace_clip_rho=0.0), "must be > 0"),
])
def test_bad_settings_are_one_line_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ppo(**kwargs)
