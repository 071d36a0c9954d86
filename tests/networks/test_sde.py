"""gSDE's distribution (alfish/networks/sde.py): variance, log-prob and entropy against hand-computed values, the
acting matrices' redraws, and the options' one-line errors."""
import math

import pytest
import torch

from alfish.errors import OneLineValueError
from alfish.networks.sde import StateDependentNoise, check_sde_options

FIRST, MID = 0, 1


def tiny_noise(full_std: bool = True, sample_freq: int = -1) -> StateDependentNoise:
    """latent_dim 2, action_dim 1, sigma = (0.5, 2)."""
    noise = StateDependentNoise(2, 1, log_std_init=0.0, full_std=full_std, sample_freq=sample_freq)
    with torch.no_grad():
        noise.log_std.copy_(torch.log(torch.tensor([[0.5], [2.0]])))
    return noise


def test_variance_log_prob_and_entropy_are_the_hand_computed_values():
    noise = tiny_noise()
    latent, mean, u = torch.tensor([[1.0, 3.0]]), torch.tensor([[0.5]]), torch.tensor([[1.5]])
    variance = 1.0 * 0.25 + 9.0 * 4.0 + 1e-6                                  # latent^2 @ sigma^2 (+ SB3's 1e-6)
    expected = -0.5 * (1.5 - 0.5) ** 2 / variance - 0.5 * math.log(variance) - 0.5 * math.log(2 * math.pi)
    assert noise.variance(latent).item() == pytest.approx(variance, rel=1e-6)
    assert noise.log_prob(u, mean, latent).item() == pytest.approx(expected, rel=1e-6)
    assert noise.entropy(latent).item() == pytest.approx(0.5 * math.log(2 * math.pi * math.e * variance), rel=1e-6)


def test_one_sigma_per_latent_unit_is_shared_by_the_action_dims():
    noise = StateDependentNoise(2, 3, log_std_init=-1.0, full_std=False, sample_freq=-1)
    assert noise.log_std.shape == (2, 1) and noise.std().shape == (2, 3)
    variance = noise.variance(torch.tensor([[1.0, 2.0]]))
    assert torch.allclose(variance, torch.full((1, 3), 5.0 * math.exp(-2.0) + 1e-6))
    assert StateDependentNoise(2, 3, 0.0, True, -1).log_std.shape == (2, 3)


def test_sigma_learns_through_the_log_prob_and_the_latent_only_with_learn_features():
    noise = tiny_noise()
    latent = torch.tensor([[1.0, 3.0]], requires_grad=True)
    noise.log_prob(torch.tensor([[1.5]]), torch.tensor([[0.5]]), latent).backward()
    assert noise.log_std.grad is not None and noise.log_std.grad.abs().sum() > 0
    assert latent.grad is None  # SB3's learn_features=False (its PPO)
    noise.learn_features = True  # SB3's SAC: the log-prob and the noise reach the features
    noise.log_prob(torch.tensor([[1.5]]), torch.tensor([[0.5]]), latent).backward()
    # d/d latent_j of log N(1.5; 0.5, v), v = sum_j latent_j^2 sigma_j^2 + 1e-6 = 0.25 + 36 + 1e-6:
    # (d log p / d v) * 2 latent_j sigma_j^2, d log p / d v = ((x - m)^2 / v - 1) / (2 v)
    v = 0.25 * 1.0 + 4.0 * 9.0 + 1e-6
    dv = ((1.0 ** 2) / v - 1.0) / (2 * v)
    assert torch.allclose(latent.grad, torch.tensor([[dv * 2 * 1.0 * 0.25, dv * 2 * 3.0 * 4.0]]), rtol=1e-5)
    noise.noise(latent, torch.ones(2, 1)).sum().backward()  # and through the training noise latent @ matrix
    assert torch.allclose(latent.grad, torch.tensor([[dv * 0.5 + 1.0, dv * 24.0 + 1.0]]), rtol=1e-5)


def test_acting_noise_applies_each_envs_own_matrix():
    noise = tiny_noise()
    latent = torch.tensor([[1.0, 2.0], [3.0, -1.0]])
    out = noise.acting_noise(latent, torch.tensor([FIRST, FIRST], dtype=torch.int8))
    assert torch.allclose(out, torch.stack([latent[i] @ noise.matrices[i] for i in range(2)]))
    assert not torch.equal(noise.matrices[0], noise.matrices[1])


def test_options_are_validated():
    check_sde_options("SacAlgorithm", True, -1, None, True)
    check_sde_options("SacAlgorithm", True, 4, -2.0, False)
    check_sde_options("SacAlgorithm", False, -1, None, True)  # the defaults without gSDE
    for bad in (0, -2):
        with pytest.raises(OneLineValueError, match=f"SacAlgorithm.sde_sample_freq={bad} must be -1"):
            check_sde_options("SacAlgorithm", True, bad, None, True)


@pytest.mark.parametrize("option, args", [("sde_sample_freq", (4, None, True)), ("log_std_init", (-1, -3.0, True)),
                                          ("full_std", (-1, None, False))])
def test_gsde_options_without_gsde_are_refused(option, args):
    with pytest.raises(OneLineValueError, match=f"^PpoAlgorithm.{option} is a gSDE option and does nothing"):
        check_sde_options("PpoAlgorithm", False, *args)
