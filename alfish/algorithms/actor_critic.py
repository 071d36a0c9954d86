"""Policy and value networks shared by the policy-gradient algorithms (PPO, A2C).

Discrete actions: a categorical over logits. Box actions: a diagonal Gaussian with a state-independent log-std (as
SB3/CleanRL), sampled unsquashed; the env clips to the bounds, the stored action is the unclipped sample.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import gin
import torch
from torch import nn

from alfish.networks import distributions as D
from alfish.networks.mlp import MLP


class PolicyOutput(NamedTuple):
    action: torch.Tensor    # [N] int64 or [N, action_dim]
    log_prob: torch.Tensor  # [N]
    entropy: torch.Tensor   # [N]
    value: torch.Tensor     # [N]


class ActorCriticParams:
    """For algorithms whose trainable parameters are one ``ActorCriticNetworks`` (``self.net``) at rate ``self.lr``."""

    net: "ActorCriticNetworks"
    lr: object  # a number or a schedule

    def param_groups(self) -> list[dict]:
        return [dict(name="actor_critic", params=list(self.net.parameters()), lr=self.lr)]


@gin.configurable
class ActorCriticNetworks(nn.Module):
    """Separate policy and value MLPs over flat observations ``[N, obs_dim]``."""

    def __init__(self, obs_dim: int, action_dim: int, discrete: bool, hidden_sizes: Sequence[int] = (64, 64),
                 activation: str = "tanh", initial_log_std: float = 0.0):
        super().__init__()
        self.discrete = discrete
        self.policy = MLP(obs_dim, action_dim, hidden_sizes, activation, output_gain=0.01)
        self.value_net = MLP(obs_dim, 1, hidden_sizes, activation, output_gain=1.0)
        if not discrete:
            self.log_std = nn.Parameter(torch.full((action_dim,), float(initial_log_std)))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.value_net(obs).squeeze(-1)

    def act(self, obs: torch.Tensor, greedy: bool) -> PolicyOutput:
        """Sample (or take the mode of) the policy at ``obs``; also returns log-prob, entropy and value."""
        out = self.policy(obs)
        if self.discrete:
            action = out.argmax(-1) if greedy else D.categorical_sample(out)
            log_prob, entropy = D.categorical_log_prob(out, action), D.categorical_entropy(out)
        else:
            log_std = self.log_std.expand_as(out)
            # The sample is detached: its log-prob must depend on the mean (score-function gradient), which the
            # reparameterised sample would cancel out.
            action = (out if greedy else out + log_std.exp() * torch.randn_like(out)).detach()
            log_prob, entropy = D.gaussian_log_prob(action, out, log_std), D.gaussian_entropy(log_std)
        return PolicyOutput(action, log_prob, entropy, self.value(obs))

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor) -> PolicyOutput:
        """Log-prob, entropy and value of given ``action`` at ``obs``."""
        out = self.policy(obs)
        if self.discrete:
            log_prob, entropy = D.categorical_log_prob(out, action), D.categorical_entropy(out)
        else:
            log_std = self.log_std.expand_as(out)
            log_prob, entropy = D.gaussian_log_prob(action, out, log_std), D.gaussian_entropy(log_std)
        return PolicyOutput(action, log_prob, entropy, self.value(obs))
