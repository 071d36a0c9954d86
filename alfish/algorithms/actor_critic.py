"""Policy and value networks shared by the policy-gradient algorithms (PPO, A2C).

Discrete actions: a categorical over logits. Box actions: a diagonal Gaussian with a state-independent log-std (as
SB3/CleanRL), sampled unsquashed; the env clips to the bounds, the stored action is the unclipped sample.
MultiDiscrete actions: one categorical per sub-action over its slice of the logits; MultiBinary: one Bernoulli per
sub-action (as SB3's MultiCategoricalDistribution and BernoulliDistribution): log-prob and entropy are the sums over the
sub-actions, the greedy action is each sub-action's mode.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Sequence

import gin
import torch
from torch import nn

from alfish.data.state import is_empty
from alfish.data.types import EMPTY
from alfish.networks import distributions as D
from alfish.networks.encoding import EncodingNetwork
from alfish.networks.heads import build_encoder
from alfish.networks.mlp import MLP


class PolicyOutput(NamedTuple):
    action: torch.Tensor    # [N] int64 (Discrete), [N, k] int64 (MultiDiscrete/MultiBinary) or [N, action_dim]
    log_prob: torch.Tensor  # [N]
    entropy: torch.Tensor   # [N]
    value: torch.Tensor     # [N]
    state: Any = EMPTY      # the recurrent state after this step ([N, ...]; EMPTY without a recurrent encoder)


class ActorCriticParams:
    """For algorithms whose trainable parameters are one ``ActorCriticNetworks`` (``self.net``) at rate ``self.lr``.
    Their policy drives every action space ``ActorCriticNetworks`` has a head for, MultiDiscrete/MultiBinary too."""

    net: "ActorCriticNetworks"
    lr: object  # a number or a schedule
    drives_multi_actions = True

    def param_groups(self) -> list[dict]:
        return [dict(name="actor_critic", params=list(self.net.parameters()), lr=self.lr)]

    def use_off_policy_correction(self, correction: Optional[str], clip_rho: float, clip_c: float) -> None:
        """Check and keep the ``off_policy_correction`` settings (``'vtrace'`` or None, its truncation levels)."""
        name = type(self).__name__
        if correction not in (None, "vtrace"):
            raise ValueError(f"{name}.off_policy_correction={correction!r}: use 'vtrace', or None for none")
        if not (clip_rho > 0 and clip_c > 0):
            raise ValueError(f"{name}.vtrace_clip_rho={clip_rho} and vtrace_clip_c={clip_c} must be > 0 (IMPALA's "
                             "1 and 1)")
        self.off_policy_correction, self.vtrace_clip_rho, self.vtrace_clip_c = correction, clip_rho, clip_c


@gin.configurable
class ActorCriticNetworks(nn.Module):
    """A policy network and a value network, built by ``RLAlgorithm`` (``algorithm``) in its mode:

      - flat mode: separate policy and value MLPs over flat observations ``[N, obs_dim]``;
      - raw mode with the default networks: one ``EncodingNetwork`` shared by an MLP policy head and an MLP value head
        (as SB3's CnnPolicy and the Nature/IMPALA actor-critics: the conv features are computed once per batch);
      - raw mode with ``actor_network_ctor`` / ``value_network_ctor``: ``ctor(observation_space, output_dim)`` each
        (a part left ``None`` gets its own ``FeedForwardNetwork`` of ``hidden_sizes``).

      - ``encoding_network_ctor`` (any mode): ``ctor(observation_space)`` -> one encoder shared by MLP heads, as the
        raw-mode default; it may be recurrent (``EncodingNetwork(rnn='lstm'|'gru')``), which makes the networks
        recurrent: ``act``/``evaluate`` take and return its state, ``evaluate_sequence`` runs over time. In flat mode
        the encoder reads the flat observation (a Box of ``obs_dim``).

    Parameters: ``policy.*``, ``value_net.*`` (and ``encoder.*``, ``log_std`` for Box actions).
    """

    def __init__(self, algorithm: Any, hidden_sizes: Sequence[int] = (64, 64), activation: str = "tanh",
                 initial_log_std: float = 0.0, actor_network_ctor: Optional[Callable[..., nn.Module]] = None,
                 value_network_ctor: Optional[Callable[..., nn.Module]] = None,
                 encoding_network_ctor: Optional[Callable[..., nn.Module]] = None):
        super().__init__()
        self.discrete = algorithm.discrete
        self.action_kind = getattr(algorithm, "action_kind", "discrete" if self.discrete else "box")
        action_dim = self._policy_output_size(algorithm)
        self.encoder: Optional[nn.Module] = None
        shared = encoding_network_ctor is not None or (
            algorithm.raw_observations and actor_network_ctor is None and value_network_ctor is None)
        if shared and (actor_network_ctor is not None or value_network_ctor is not None):
            raise ValueError("ActorCriticNetworks.encoding_network_ctor (a shared encoder) and actor_network_ctor / "
                             "value_network_ctor are exclusive; give one or the other")
        if shared:
            self.encoder = build_encoder(encoding_network_ctor or EncodingNetwork, algorithm.encoder_space(),
                                         allow_recurrent=True)
            features = self.encoder.output_size
            self.policy = MLP(features, action_dim, hidden_sizes, activation, output_gain=0.01)
            self.value_net = MLP(features, 1, hidden_sizes, activation, output_gain=1.0)
        else:
            self.policy = algorithm.build_network(actor_network_ctor, action_dim, hidden_sizes, activation, 0.01)
            self.value_net = algorithm.build_network(value_network_ctor, 1, hidden_sizes, activation, 1.0)
        if self.action_kind == "box":
            self.log_std = nn.Parameter(torch.full((action_dim,), float(initial_log_std)))
        if self.action_kind == "multi_discrete":
            self.action_nvec = algorithm.action_nvec
            self.register_buffer("_nvec_layout", D.multi_categorical_layout(self.action_nvec), persistent=False)

    def _policy_output_size(self, algorithm: Any) -> int:
        """The policy network's output size: logits of each choice (Discrete: ``n``; MultiDiscrete: ``sum(nvec)``),
        one logit per sub-action (MultiBinary: ``k``) or the Gaussian's mean (Box: ``action_dim``)."""
        if self.action_kind == "discrete":
            return algorithm.num_actions
        if self.action_kind == "multi_discrete":
            return sum(algorithm.action_nvec)
        return algorithm.action_dim

    @property
    def recurrent(self) -> bool:
        return bool(getattr(self.encoder, "recurrent", False))

    def initial_state(self, batch_size: int, device: Optional[torch.device] = None) -> Any:
        """The encoder's initial (zero) state for ``batch_size`` samples; ``EMPTY`` when not recurrent."""
        return self.encoder.initial_state(batch_size, device) if self.recurrent else EMPTY

    def _features(self, obs: Any, state: Any) -> tuple[Any, Any]:
        """``(features, next state)`` at ``obs [N, ...]`` from ``state`` (the initial state when ``EMPTY``)."""
        if self.encoder is None:
            return obs, EMPTY
        if not self.recurrent:
            return self.encoder(obs), EMPTY
        return self.encoder(obs, None if is_empty(state) else state)

    def _outputs(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy(features), self.value_net(features).squeeze(-1)

    def _heads(self, obs: Any, state: Any = EMPTY) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """``(policy output [N, action_dim or num_actions], value [N], next state)`` at ``obs``."""
        features, state = self._features(obs, state)
        return (*self._outputs(features), state)

    def _log_prob_entropy(self, out: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-prob ``[N]`` of ``action`` and entropy ``[N]`` of the policy whose network output is ``out``."""
        if self.discrete:
            return D.categorical_log_prob(out, action), D.categorical_entropy(out)
        if self.action_kind == "multi_discrete":
            logits = D.multi_categorical_logits(out, self.action_nvec, self._nvec_layout)
            return D.multi_categorical_log_prob(logits, action), D.multi_categorical_entropy(logits)
        if self.action_kind == "multi_binary":
            return D.bernoulli_log_prob(out, action), D.bernoulli_entropy(out)
        log_std = self.log_std.expand_as(out)
        return D.gaussian_log_prob(action, out, log_std), D.gaussian_entropy(log_std)

    def _multi_action(self, out: torch.Tensor, greedy: bool) -> torch.Tensor:
        """A MultiDiscrete / MultiBinary action ``[N, k]`` int64: each sub-action's mode (``greedy``) or a sample."""
        if self.action_kind == "multi_binary":
            return D.bernoulli_mode(out) if greedy else D.bernoulli_sample(out)
        logits = D.multi_categorical_logits(out, self.action_nvec, self._nvec_layout)
        return logits.argmax(-1) if greedy else D.categorical_sample(logits)

    def act(self, obs: Any, greedy: bool, state: Any = EMPTY) -> PolicyOutput:
        """Sample (or take the mode of) the policy at ``obs``; also returns log-prob, entropy, value and the next
        state (recurrent encoder: from ``state``, the initial state when ``EMPTY``)."""
        out, value, state = self._heads(obs, state)
        if self.discrete:
            action = out.argmax(-1) if greedy else D.categorical_sample(out)
        elif self.action_kind != "box":
            action = self._multi_action(out, greedy)
        else:
            # The sample is detached: its log-prob must depend on the mean (score-function gradient), which the
            # reparameterised sample would cancel out.
            action = (out if greedy else out + self.log_std.expand_as(out).exp() * torch.randn_like(out)).detach()
        return PolicyOutput(action, *self._log_prob_entropy(out, action), value, state)

    def evaluate(self, obs: Any, action: torch.Tensor, state: Any = EMPTY) -> PolicyOutput:
        """Log-prob, entropy and value of given ``action`` at ``obs`` (from ``state``, as ``act``)."""
        out, value, state = self._heads(obs, state)
        return PolicyOutput(action, *self._log_prob_entropy(out, action), value, state)

    def evaluate_sequence(self, obs: Any, action: torch.Tensor, step_type: torch.Tensor,
                          state: Any) -> PolicyOutput:
        """A recurrent encoder run over time-major sequences: ``obs [L, B, ...]``, ``action [L, B, ...]``,
        ``step_type [L, B]``, ``state`` the state before step 0 (``[B, ...]``).

        The encoder's feed-forward part runs on all ``L * B`` steps at once; its core steps through time, the state
        reset to the initial state at each FIRST step (so nothing leaks across an episode boundary inside a
        sequence); the heads run on all steps at once. Returns per-step outputs flattened to ``[L * B]``, with the
        state after the last step.
        """
        features, state = self.encoder.unroll(obs, step_type, state)
        out, value = self._outputs(features.flatten(0, 1))
        action = action.flatten(0, 1)
        return PolicyOutput(action, *self._log_prob_entropy(out, action), value, state)
