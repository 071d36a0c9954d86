"""Policy and value networks shared by the policy-gradient algorithms (PPO, A2C).

Discrete actions: a categorical over logits. Box actions: a diagonal Gaussian with a state-independent log-std (as
SB3/CleanRL), sampled unsquashed; the env clips to the bounds, the stored action is the unclipped sample.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Sequence

import gin
import torch
from torch import nn

from alfish.networks import distributions as D
from alfish.networks.encoding import EncodingNetwork
from alfish.networks.heads import build_encoder
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
    """A policy network and a value network, built by ``RLAlgorithm`` (``algorithm``) in its mode:

      - flat mode: separate policy and value MLPs over flat observations ``[N, obs_dim]``;
      - raw mode with the default networks: one ``EncodingNetwork`` shared by an MLP policy head and an MLP value head
        (as SB3's CnnPolicy and the Nature/IMPALA actor-critics: the conv features are computed once per batch);
      - raw mode with ``actor_network_ctor`` / ``value_network_ctor``: ``ctor(observation_space, output_dim)`` each
        (a part left ``None`` gets its own ``FeedForwardNetwork`` of ``hidden_sizes``).

    Parameters: ``policy.*``, ``value_net.*`` (and ``encoder.*``, ``log_std`` for Box actions).
    """

    def __init__(self, algorithm: Any, hidden_sizes: Sequence[int] = (64, 64), activation: str = "tanh",
                 initial_log_std: float = 0.0, actor_network_ctor: Optional[Callable[..., nn.Module]] = None,
                 value_network_ctor: Optional[Callable[..., nn.Module]] = None):
        super().__init__()
        self.discrete = algorithm.discrete
        action_dim = algorithm.num_actions if self.discrete else algorithm.action_dim
        self.encoder: Optional[nn.Module] = None
        if algorithm.raw_observations and actor_network_ctor is None and value_network_ctor is None:
            self.encoder = build_encoder(EncodingNetwork, algorithm.observation_space)
            features = self.encoder.output_size
            self.policy = MLP(features, action_dim, hidden_sizes, activation, output_gain=0.01)
            self.value_net = MLP(features, 1, hidden_sizes, activation, output_gain=1.0)
        else:
            self.policy = algorithm.build_network(actor_network_ctor, action_dim, hidden_sizes, activation, 0.01)
            self.value_net = algorithm.build_network(value_network_ctor, 1, hidden_sizes, activation, 1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((action_dim,), float(initial_log_std)))

    def _heads(self, obs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(policy output [N, action_dim or num_actions], value [N])`` at ``obs``."""
        features = obs if self.encoder is None else self.encoder(obs)
        return self.policy(features), self.value_net(features).squeeze(-1)

    def act(self, obs: Any, greedy: bool) -> PolicyOutput:
        """Sample (or take the mode of) the policy at ``obs``; also returns log-prob, entropy and value."""
        out, value = self._heads(obs)
        if self.discrete:
            action = out.argmax(-1) if greedy else D.categorical_sample(out)
            log_prob, entropy = D.categorical_log_prob(out, action), D.categorical_entropy(out)
        else:
            log_std = self.log_std.expand_as(out)
            # The sample is detached: its log-prob must depend on the mean (score-function gradient), which the
            # reparameterised sample would cancel out.
            action = (out if greedy else out + log_std.exp() * torch.randn_like(out)).detach()
            log_prob, entropy = D.gaussian_log_prob(action, out, log_std), D.gaussian_entropy(log_std)
        return PolicyOutput(action, log_prob, entropy, value)

    def evaluate(self, obs: Any, action: torch.Tensor) -> PolicyOutput:
        """Log-prob, entropy and value of given ``action`` at ``obs``."""
        out, value = self._heads(obs)
        if self.discrete:
            log_prob, entropy = D.categorical_log_prob(out, action), D.categorical_entropy(out)
        else:
            log_std = self.log_std.expand_as(out)
            log_prob, entropy = D.gaussian_log_prob(action, out, log_std), D.gaussian_entropy(log_std)
        return PolicyOutput(action, log_prob, entropy, value)
