"""Generalized state-dependent exploration (gSDE; Raffin et al. 2021, "Smooth Exploration for Robotic RL").

The policy's exploration noise is a linear function of its last hidden layer ``latent(s)`` ``[N, latent_dim]``:
``noise(s) = latent(s) @ theta``, with a noise matrix ``theta ~ N(0, sigma^2)`` ``[latent_dim, action_dim]`` held
fixed between resamplings, so the same state gets the same noise and close states close noise (smooth exploration).
``sigma = exp(log_std)`` is learned: ``[latent_dim, action_dim]`` (``full_std``) or ``[latent_dim, 1]`` (one sigma
per latent unit, shared by the action dims). Given the state, the pre-squash action is Gaussian with mean ``mu(s)``
and per-dimension variance ``latent(s)^2 @ sigma^2`` (``[N, action_dim]``); the log-prob and entropy use that
variance (plus SB3's 1e-6), never the noise matrix. As SB3 (``StateDependentNoiseDistribution`` with
``learn_features=False``) the latent is detached in the noise and the variance: sigma's gradient does not train the
layers below it.

Acting (``acting_noise``): one matrix per env ``[B, latent_dim, action_dim]``, redrawn for an env at its episode's
start (a FIRST step), every ``sample_freq`` of its steps (``-1``: never on a count), and for all envs at the first
acting step after ``resample_all()`` (the start of a rollout: the algorithms call it after each training iteration).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from alfish.errors import OneLineValueError
from alfish.networks.mlp import MLP

SDE_EPSILON = 1e-6  # SB3's: added to the variance (and inside the tanh correction's log)
HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def check_sde_options(owner: str, use_sde: bool, sde_sample_freq: int, log_std_init: Optional[float],
                      full_std: bool) -> None:
    """One-line errors for the gSDE options of the algorithm ``owner``: a bad ``sde_sample_freq``, and gSDE options
    set without ``use_sde`` (they would do nothing)."""
    if sde_sample_freq != -1 and sde_sample_freq < 1:
        raise OneLineValueError(f"{owner}.sde_sample_freq={sde_sample_freq} must be -1 (a new noise matrix only at "
                                "episode and rollout starts) or a number of env steps >= 1")
    unused = [name for name, is_set in (("sde_sample_freq", sde_sample_freq != -1), ("full_std", not full_std),
                                        ("log_std_init", log_std_init is not None)) if is_set]
    if unused and not use_sde:
        raise OneLineValueError(f"{owner}.{unused[0]} is a gSDE option and does nothing without gSDE: set "
                                f"{owner}.use_sde = True, or leave {unused[0]} unset")


def forward_with_latent(mlp: MLP, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``mlp``'s output ``[N, out_dim]`` and the input of its last Linear, the latent ``[N, latent_dim]``."""
    *body, last = mlp._modules.values()
    for layer in body:
        x = F.linear(x, layer.weight, layer.bias) if type(layer) is nn.Linear else layer(x)
    return F.linear(x, last.weight, last.bias), x


def gaussian_log_prob_var(x: torch.Tensor, mean: torch.Tensor, variance: torch.Tensor) -> torch.Tensor:
    """Log density of a diagonal Gaussian given its variance, summed over the last dim: ``[N, D] -> [N]``."""
    return (-0.5 * (x - mean) ** 2 / variance - 0.5 * torch.log(variance) - HALF_LOG_2PI).sum(-1)


def tanh_log_det(u: torch.Tensor) -> torch.Tensor:
    """SB3's tanh correction ``sum_d log(1 - tanh(u)^2 + 1e-6)``: ``[N, D] -> [N]``."""
    return torch.log(1.0 - torch.tanh(u) ** 2 + SDE_EPSILON).sum(-1)


class StateDependentNoise(nn.Module):
    """gSDE's learned sigma and the acting noise matrices.

    Args:
        latent_dim: size of the latent the noise is a function of (the policy's last hidden layer).
        action_dim: number of action dimensions.
        log_std_init: initial ``log(sigma)`` of every entry (SB3: -3 for SAC, 0 for PPO).
        full_std: ``True``: sigma ``[latent_dim, action_dim]``; ``False``: ``[latent_dim, 1]``.
        sample_freq: env steps between two draws of an env's matrix while acting; -1: only at episode (and
            rollout) starts.
        learn_features: whether the losses reach the latent through the noise's variance and the training noise
            (SB3's ``learn_features``: True in its SAC, False in its PPO); False detaches the latent there.

    Parameters: ``log_std``. The acting matrices are plain tensors, not state-dict entries (see ``acting_noise``);
    a checkpoint stores them with the collector's state (``acting_state``).
    """

    def __init__(self, latent_dim: int, action_dim: int, log_std_init: float, full_std: bool, sample_freq: int,
                 learn_features: bool = False):
        super().__init__()
        self.latent_dim, self.action_dim, self.sample_freq = latent_dim, action_dim, sample_freq
        self.learn_features = learn_features
        self.log_std = nn.Parameter(torch.full((latent_dim, action_dim if full_std else 1), float(log_std_init)))
        self.matrices: Optional[torch.Tensor] = None  # [B, latent_dim, action_dim], one per env, while acting
        self.steps: Optional[torch.Tensor] = None     # [B] int64, acting steps since each env's matrix was drawn

    def std(self) -> torch.Tensor:
        """sigma ``[latent_dim, action_dim]``."""
        return torch.exp(self.log_std).expand(self.latent_dim, self.action_dim)

    def _features(self, latent: torch.Tensor) -> torch.Tensor:
        return (latent if self.learn_features else latent.detach()).float()

    def variance(self, latent: torch.Tensor) -> torch.Tensor:
        """``latent(s)^2 @ sigma^2 + 1e-6`` ``[N, action_dim]``; the latent ``[N, latent_dim]`` detached unless
        ``learn_features``."""
        return (self._features(latent) ** 2) @ (self.std() ** 2) + SDE_EPSILON

    def log_prob(self, u: torch.Tensor, mean: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        """Log density ``[N]`` of the pre-squash actions ``u`` ``[N, action_dim]``."""
        return gaussian_log_prob_var(u.float(), mean.float(), self.variance(latent))

    def entropy(self, latent: torch.Tensor) -> torch.Tensor:
        """Entropy ``[N]`` of the (unsquashed) Gaussian."""
        return (0.5 * torch.log(self.variance(latent)) + 0.5 + HALF_LOG_2PI).sum(-1)

    def draw(self, *batch: int) -> torch.Tensor:
        """Noise matrices ``[*batch, latent_dim, action_dim]`` ``= sigma * N(0, 1)`` (reparameterised)."""
        std = self.std()
        return std * torch.randn(*batch, *std.shape, device=std.device)

    def noise(self, latent: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
        """``latent [N, latent_dim] @ matrix [latent_dim, action_dim]`` -> ``[N, action_dim]``; the latent detached
        unless ``learn_features``."""
        return self._features(latent) @ matrix

    def resample_all(self) -> None:
        """The next ``acting_noise`` draws every env's matrix anew (the start of a rollout)."""
        self.matrices = None

    def acting_state(self) -> Optional[dict]:
        """The acting matrices ``[B, latent_dim, action_dim]`` and the steps each has served ``[B]`` (None: none
        drawn yet), for an exact resume: a checkpoint's collector state carries them
        (``Algorithm.exploration_state``)."""
        if getattr(self, "matrices", None) is None:
            return None
        return dict(matrices=self.matrices, steps=self.steps)

    def load_acting_state(self, state: Optional[dict]) -> None:
        """Put back what ``acting_state`` returned (None: draw anew at the next step)."""
        if state is None:
            self.matrices = None
            return
        self.matrices = state["matrices"].to(self.log_std.device)
        self.steps = state["steps"].to(self.log_std.device)

    @torch.no_grad()
    def acting_noise(self, latent: torch.Tensor, step_type: torch.Tensor) -> torch.Tensor:
        """Each env's noise ``[B, action_dim]`` from its own matrix, for ``latent [B, latent_dim]`` at time steps of
        ``step_type [B]``; first redraws the matrices of the envs at a FIRST step or whose matrix has served
        ``sample_freq`` steps (all of them after ``resample_all`` or when the number of envs changed)."""
        batch = latent.shape[0]
        if self.matrices is None or self.matrices.shape[0] != batch or self.matrices.device != latent.device:
            self.matrices = self.draw(batch)
            self.steps = torch.zeros(batch, dtype=torch.int64, device=latent.device)
        else:
            redraw = step_type == 0  # StepType.FIRST
            if self.sample_freq > 0:
                redraw = redraw | (self.steps >= self.sample_freq)
            self.matrices = torch.where(redraw.view(-1, 1, 1), self.draw(batch), self.matrices)
            self.steps = torch.where(redraw, 0, self.steps)
        self.steps = self.steps + 1
        return torch.bmm(latent.float().unsqueeze(1), self.matrices).squeeze(1)


class SdeActor(nn.Module):
    """A gSDE policy over flat observations: an MLP ``obs [N, obs_dim] -> mean [N, action_dim]`` whose last hidden
    layer is the latent, and the ``StateDependentNoise`` over it. ``forward`` -> ``(mean, latent [N, latent_dim])``.

    ``mean_clip``: the mean is clipped to ``[-mean_clip, mean_clip]`` (SB3's SAC ``clip_mean=2.0`` with gSDE, which
    keeps tanh out of saturation); ``None``: not clipped (PPO). ``noise``: over the MLP's last hidden layer (its
    ``latent_dim`` is ``latent_size`` of the MLP's input and hidden sizes).
    """

    def __init__(self, mlp: MLP, noise: StateDependentNoise, mean_clip: Optional[float] = None):
        super().__init__()
        self.mlp = mlp
        self.noise = noise
        self.mean_clip = mean_clip

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, latent = forward_with_latent(self.mlp, obs)
        if self.mean_clip is not None:
            mean = F.hardtanh(mean, -self.mean_clip, self.mean_clip)
        return mean, latent


def latent_size(in_dim: int, hidden_sizes: Sequence[int]) -> int:
    """The latent's size: the last hidden layer's, the input's without hidden layers."""
    return hidden_sizes[-1] if hidden_sizes else in_dim
