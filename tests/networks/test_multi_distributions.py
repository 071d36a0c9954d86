"""MultiDiscrete (one categorical per sub-action) and MultiBinary (one Bernoulli per sub-action) distributions against
values computed by hand, and against torch.distributions."""
import math

import torch

from alfish.networks import distributions as D

NVEC = (3, 2)
# Sub-action 0: probabilities (1/4, 1/2, 1/4), shifted by +2 (softmax ignores the shift); sub-action 1: (1/4, 3/4).
MD_LOGITS = torch.tensor([[2.0, 2.0 + math.log(2.0), 2.0, 0.0, math.log(3.0)]])
# MultiBinary(3): p = sigmoid(logits) = (1/2, 3/4, 1/4).
MB_LOGITS = torch.tensor([[0.0, math.log(3.0), -math.log(3.0)]])


def binary_entropy(p: float) -> float:
    return -p * math.log(p) - (1 - p) * math.log(1 - p)


def md_logits(flat: torch.Tensor, nvec=NVEC) -> torch.Tensor:
    return D.multi_categorical_logits(flat, nvec, D.multi_categorical_layout(nvec))


def test_multi_categorical_log_prob_is_the_sum_over_sub_actions():
    logits = md_logits(MD_LOGITS)
    assert logits.shape == (1, 2, 3)
    for action, expected in (([1, 0], 0.5 * 0.25), ([0, 1], 0.25 * 0.75), ([2, 1], 0.25 * 0.75)):
        log_prob = D.multi_categorical_log_prob(logits, torch.tensor([action]))
        assert log_prob.shape == (1,)
        assert math.isclose(log_prob.item(), math.log(expected), rel_tol=1e-6), action


def test_multi_categorical_entropy_is_the_sum_over_sub_actions():
    entropy = D.multi_categorical_entropy(md_logits(MD_LOGITS))
    expected = 1.5 * math.log(2.0) + binary_entropy(0.25)  # (1/4, 1/2, 1/4) has 1.5 ln 2 nats
    assert entropy.shape == (1,)
    assert math.isclose(entropy.item(), expected, rel_tol=1e-6)  # the padding entry adds nothing (not NaN)


def test_multi_categorical_greedy_action_is_the_argmax_per_sub_action():
    assert md_logits(MD_LOGITS).argmax(-1).tolist() == [[1, 1]]


def test_multi_categorical_samples_follow_each_sub_action_and_never_the_padding():
    torch.manual_seed(0)
    sample = D.categorical_sample(md_logits(MD_LOGITS.expand(20000, -1)))
    assert sample.shape == (20000, 2) and sample.dtype == torch.int64
    assert set(sample[:, 1].tolist()) == {0, 1}  # sub-action 1 has 2 choices: never the padded third
    freq0 = torch.bincount(sample[:, 0], minlength=3).float() / 20000
    assert torch.allclose(freq0, torch.tensor([0.25, 0.5, 0.25]), atol=0.02)
    assert abs(sample[:, 1].float().mean().item() - 0.75) < 0.02


def test_multi_categorical_matches_torch_distributions_for_even_and_uneven_nvec():
    torch.manual_seed(0)
    for nvec in ((4, 4, 4), (2, 5, 3)):
        flat = torch.randn(16, sum(nvec))
        action = torch.stack([torch.randint(n, (16,)) for n in nvec], -1)
        parts = [torch.distributions.Categorical(logits=x) for x in torch.split(flat, nvec, -1)]
        ref_log_prob = sum(d.log_prob(action[:, i]) for i, d in enumerate(parts))
        ref_entropy = sum(d.entropy() for d in parts)
        logits = md_logits(flat, nvec)
        assert torch.allclose(D.multi_categorical_log_prob(logits, action), ref_log_prob, atol=1e-5)
        assert torch.allclose(D.multi_categorical_entropy(logits), ref_entropy, atol=1e-5)


def test_multi_categorical_layout_is_a_reshape_for_even_nvec():
    assert D.multi_categorical_layout((4, 4)) is None
    assert D.multi_categorical_layout((3, 2)).tolist() == [0, 1, 2, 3, 4, 5]  # index 5: the padding column


def test_bernoulli_log_prob_and_entropy_by_hand():
    log_prob = D.bernoulli_log_prob(MB_LOGITS, torch.tensor([[1, 0, 0]], dtype=torch.int8))
    assert log_prob.shape == (1,)
    assert math.isclose(log_prob.item(), math.log(0.5 * 0.25 * 0.75), rel_tol=1e-6)
    entropy = D.bernoulli_entropy(MB_LOGITS)
    assert math.isclose(entropy.item(), math.log(2.0) + 2 * binary_entropy(0.25), rel_tol=1e-6)


def test_bernoulli_greedy_is_p_above_one_half_and_samples_follow_p():
    assert D.bernoulli_mode(MB_LOGITS).tolist() == [[0, 1, 0]]  # p = 1/2 exactly is not above one half
    torch.manual_seed(0)
    sample = D.bernoulli_sample(MB_LOGITS.expand(20000, -1))
    assert sample.dtype == torch.int64
    assert torch.allclose(sample.float().mean(0), torch.tensor([0.5, 0.75, 0.25]), atol=0.02)


def test_bernoulli_matches_torch_distributions():
    torch.manual_seed(0)
    logits = 3 * torch.randn(16, 5)
    action = torch.randint(2, (16, 5))
    ref = torch.distributions.Bernoulli(logits=logits)
    assert torch.allclose(D.bernoulli_log_prob(logits, action), ref.log_prob(action.float()).sum(-1), atol=1e-5)
    assert torch.allclose(D.bernoulli_entropy(logits), ref.entropy().sum(-1), atol=1e-5)


def test_low_precision_logits_give_float32_results_without_nan():
    flat = MD_LOGITS.to(torch.float16)
    logits = md_logits(flat)
    assert logits.dtype == torch.float32
    assert torch.isfinite(D.multi_categorical_entropy(logits)).all()
    assert D.bernoulli_entropy(MB_LOGITS.to(torch.bfloat16)).dtype == torch.float32
