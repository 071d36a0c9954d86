"""The actor-critic networks of PPO with gSDE (``alfish.networks.sde``): the policy MLP's last hidden layer is the
latent of the state-dependent noise, its output the Gaussian's mean (unsquashed, as SB3's PPO); a learned sigma
``[latent_dim, action_dim]`` replaces the state-independent ``log_std``."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from alfish.algorithms.actor_critic import ActorCriticNetworks, PolicyOutput
from alfish.data.types import EMPTY
from alfish.errors import OneLineValueError
from alfish.networks.sde import SdeActor, StateDependentNoise, latent_size


class SdeActorCriticNetworks(ActorCriticNetworks):
    """``ActorCriticNetworks`` (flat mode, default MLPs, Box actions) whose policy is an ``SdeActor``.

    The policy output passed between the methods is ``(mean [N, action_dim], latent [N, latent_dim])``.
    Parameters: ``policy.mlp.*``, ``policy.noise.log_std``, ``value_net.*``.
    """

    def __init__(self, algorithm: Any, hidden_sizes: Sequence[int], activation: str, log_std_init: float,
                 full_std: bool, sample_freq: int):
        owner = type(algorithm).__name__
        if algorithm.discrete or algorithm.raw_observations:
            raise OneLineValueError(f"{owner}.use_sde=True needs Box actions and flat observations with the default "
                                    "MLP networks; leave actor_network_ctor and value_network_ctor unset")
        super().__init__(algorithm, hidden_sizes, activation)
        if self.encoder is not None:  # e.g. ActorCriticNetworks.encoding_network_ctor bound in the conf
            raise OneLineValueError(f"{owner}.use_sde=True reads the policy MLP's last hidden layer over flat "
                                    "observations; unbind ActorCriticNetworks.encoding_network_ctor")
        del self.log_std  # gSDE's sigma replaces it
        noise = StateDependentNoise(latent_size(algorithm.obs_dim, hidden_sizes), algorithm.action_dim, log_std_init,
                                    full_std, sample_freq)  # learn_features=False, as SB3's PPO
        self.policy = SdeActor(self.policy, noise)

    def _log_prob_entropy(self, out: tuple[torch.Tensor, torch.Tensor],
                          action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, latent = out
        return self.policy.noise.log_prob(action, mean, latent), self.policy.noise.entropy(latent)

    def act(self, obs: Any, greedy: bool, state: Any = EMPTY) -> PolicyOutput:
        """The mean (greedy), or the mean plus the noise of one matrix drawn for the batch (not the acting
        matrices: see ``act_exploring``)."""
        (mean, latent), value, state = self._heads(obs, state)
        noise = self.policy.noise
        action = mean if greedy else mean + noise.noise(latent, noise.draw())
        action = action.detach()  # the score-function gradient reads the mean through the log-prob only
        return PolicyOutput(action, *self._log_prob_entropy((mean, latent), action), value, state)

    def act_exploring(self, obs: Any, step_type: torch.Tensor) -> PolicyOutput:
        """Acting in envs ``[B]``: the mean plus each env's noise (``StateDependentNoise.acting_noise``)."""
        (mean, latent), value, _ = self._heads(obs)
        action = (mean + self.policy.noise.acting_noise(latent, step_type)).detach()
        return PolicyOutput(action, *self._log_prob_entropy((mean, latent), action), value)
