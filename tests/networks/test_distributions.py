"""The hand-written distribution formulas against torch.distributions (the slow reference)."""
import torch

from alfish.networks import distributions as D


def test_tanh_gaussian_log_prob_matches_torch_distributions():
    torch.manual_seed(0)
    mean, log_std = torch.randn(64, 3), 0.5 * torch.randn(64, 3)
    torch.manual_seed(1)
    action, log_prob = D.tanh_gaussian_sample(mean, log_std)
    torch.manual_seed(1)
    u = mean + log_std.exp() * torch.randn(64, 3)  # the same draw
    normal = torch.distributions.Normal(mean, log_std.exp())
    reference = (normal.log_prob(u) - torch.log(1 - torch.tanh(u) ** 2)).sum(-1)
    assert torch.allclose(action, torch.tanh(u))
    assert torch.allclose(log_prob, reference, rtol=1e-3, atol=1e-3)  # the reference loses digits at large |u|


def test_tanh_gaussian_gradients_match_the_density_evaluated_at_the_sample():
    # d log_prob / d(mean, log_std) through the reparameterised sample must equal the reference's.
    torch.manual_seed(0)
    mean = torch.randn(8, 2, requires_grad=True)
    log_std = (0.3 * torch.randn(8, 2)).requires_grad_()
    torch.manual_seed(3)
    D.tanh_gaussian_sample(mean, log_std)[1].sum().backward()
    ours = (mean.grad.clone(), log_std.grad.clone())
    mean.grad, log_std.grad = None, None
    torch.manual_seed(3)
    u = mean + log_std.exp() * torch.randn(8, 2)
    ref = (torch.distributions.Normal(mean, log_std.exp()).log_prob(u) - torch.log(1 - torch.tanh(u) ** 2)).sum()
    ref.backward()
    assert torch.allclose(ours[0], mean.grad, rtol=1e-3, atol=1e-3)
    assert torch.allclose(ours[1], log_std.grad, rtol=1e-3, atol=1e-3)


def test_gaussian_and_categorical_against_torch():
    torch.manual_seed(0)
    x, mean, log_std = torch.randn(10, 4), torch.randn(10, 4), torch.randn(10, 4)
    normal = torch.distributions.Normal(mean, log_std.exp())
    assert torch.allclose(D.gaussian_log_prob(x, mean, log_std), normal.log_prob(x).sum(-1), atol=1e-5)
    assert torch.allclose(D.gaussian_entropy(log_std), normal.entropy().sum(-1), atol=1e-5)
    logits, action = torch.randn(10, 3), torch.randint(0, 3, (10,))
    cat = torch.distributions.Categorical(logits=logits)
    assert torch.allclose(D.categorical_log_prob(logits, action), cat.log_prob(action), atol=1e-6)
    assert torch.allclose(D.categorical_entropy(logits), cat.entropy(), atol=1e-6)


def test_categorical_sample_frequencies_follow_the_probabilities():
    torch.manual_seed(0)
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).expand(20000, 3)
    counts = torch.bincount(D.categorical_sample(logits), minlength=3).float() / 20000
    assert torch.allclose(counts, torch.tensor([0.7, 0.2, 0.1]), atol=0.02)
