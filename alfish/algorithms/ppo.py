"""Proximal Policy Optimization (Schulman et al. 2017), clipped objective, GAE, discrete or Box actions.

PPO trains through the off-policy path as ALF does: the unroll is stored in the replay buffer, and with
``whole_replay_buffer_training=True`` + ``clear_replay_buffer=True`` each iteration computes GAE over the whole buffer
(``preprocess_experience``) and then runs ``num_updates_per_train_iter`` epochs of shuffled mini-batches.

Recurrent PPO: with a recurrent shared encoder (``ActorCriticNetworks.encoding_network_ctor = @EncodingNetwork`` and
``EncodingNetwork.rnn = 'lstm'`` or ``'gru'``) the policy carries a state per env. With
``TrainerConfig.use_rollout_state=True`` the state each step was acted from is stored in its rollout info
(``PpoRolloutInfo.state``); mini-batches hold whole sequences of ``TrainerConfig.mini_batch_length`` steps (the unroll
length, or chunks of it), and ``train_step`` runs over each sequence step by step from the stored state of its first
step (zeros without ``use_rollout_state``), resetting the state at FIRST steps inside it
(``temporally_independent_train_step`` None or False). With ``temporally_independent_train_step=True`` each step is
evaluated alone from its own stored state.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Sequence

import gin
import gymnasium as gym
import torch
from torch import nn

from alfish.algorithms.actor_critic import ActorCriticNetworks, ActorCriticParams
from alfish.algorithms.base import OffPolicyAlgorithm
from alfish.algorithms.debug_stats import explained_variance, masked_stats
from alfish.algorithms.sde_actor_critic import SdeActorCriticNetworks
from alfish.data import nest
from alfish.data.types import EMPTY, AlgStep, Experience, LossInfo, StepType
from alfish.losses.returns import generalized_advantage_estimation, masked_standardize
from alfish.losses.vtrace import VTraceSettings, vtrace_returns
from alfish.networks.initialization import init_policy_value
from alfish.networks.sde import check_sde_options
from alfish.schedulers import Scheduler, TracedValue


class PpoRolloutInfo(NamedTuple):
    log_prob: torch.Tensor  # [B], of the stored action under the rollout policy
    value: torch.Tensor     # [B], V(obs) under the rollout policy
    state: Any = EMPTY      # [B, ...], the recurrent state the step was acted from (with use_rollout_state only)


class PpoTrainInfo(NamedTuple):
    log_prob: torch.Tensor
    entropy: torch.Tensor
    value: torch.Tensor


class PpoExperienceInfo(NamedTuple):
    """Rollout info after ``preprocess_experience``: adds GAE advantages and value targets."""

    log_prob: torch.Tensor
    value: torch.Tensor
    advantage: torch.Tensor
    value_target: torch.Tensor
    state: Any = EMPTY


@gin.configurable
class PpoAlgorithm(ActorCriticParams, OffPolicyAlgorithm):
    """PPO-clip.

    Args:
        hidden_sizes / activation: policy and value MLPs.
        lr: Adam learning rate. gamma, gae_lambda: GAE. clip_range: ratio clip epsilon.
        value_loss_coef, entropy_coef: weights of the value and entropy terms.
        lr, clip_range and entropy_coef may be schedules (alfish.schedulers), e.g. RL Zoo's linear decay.
        normalize_advantages: standardize advantages within each mini-batch (as SB3).
        actor_network_ctor, value_network_ctor: ``ctor(observation_space, output_dim)`` -> the policy network
            (logits, or the Gaussian mean) and the value network (``output_dim`` 1); ``None``: MLPs of
            ``hidden_sizes`` (for images and dicts, heads over one shared ``EncodingNetwork``). See
            ``ActorCriticNetworks``.
        clip_range_vf: SB3's value clipping, in the units of the value (the return): the predicted value is clipped
            to ``old value +- clip_range_vf`` before its squared error with the value target (SB3's form: no max with
            the unclipped error). A number > 0 or a schedule; ``None`` (default): no clipping.
        target_kl: SB3's early stop: before each mini-batch update, the approximate KL ``mean((r - 1) - log r)`` of
            the mini-batch (``r`` the probability ratio to the rollout policy, under the current parameters) is
            computed; above ``1.5 * target_kl`` that update and every remaining one of this iteration's epochs are
            skipped (``WholeBufferTraining``). ``None`` (default): no check. When set, each mini-batch costs one
            more forward without gradient and one host sync (reading the KL), and under DDP one small all-reduce
            (every rank stops together); without it, nothing.
        ortho_init: SB3's ``ortho_init``: ``True``: orthogonal weights, zero biases (gain sqrt(2) for the encoder and
            hidden layers, 0.01 for the policy output, 1 for the value output); ``False``: PyTorch's default init
            everywhere; ``None`` (default): alfish's init (PyTorch's default hidden layers, orthogonal outputs of gain
            0.01 and 1). See ``alfish.networks.initialization``. SB3's ``log_std_init`` (Box actions) is
            ``ActorCriticNetworks.initial_log_std``.
        use_sde: explore with gSDE (``alfish.networks.sde``) instead of a state-independent Gaussian: the noise is
            the policy's last hidden layer times a noise matrix (``SdeActorCriticNetworks``). Box actions, flat
            observations and default networks only.
        sde_sample_freq: gSDE: env steps between two draws of an env's noise matrix while acting (-1: only at its
            episode's start and at each training iteration's rollout start).
        log_std_init: gSDE: initial log of the noise's sigma ``[latent_dim, action_dim]``; ``None``: SB3's 0 for PPO.
        full_std: gSDE: one sigma per (latent unit, action dim); ``False``: one per latent unit.
        off_policy_correction: ``'vtrace'``: the value targets and advantages are V-trace's (``alfish.losses.vtrace``:
            ``value_target`` and ``advantage``, the latter leaving each step's own importance weight to the
            surrogate's ratio; ``gae_lambda`` as its lambda), from the log-probabilities and values of the current
            parameters, computed once per iteration before the epochs: data acted by older parameters
            (``TrainerConfig.async_unroll``) is corrected. The surrogate's ratio stays relative to the acting
            policy's stored log-probabilities. On data the current parameters acted: GAE's values (one more forward
            pass over the buffer, without gradient). ``None`` (default): GAE from the stored values, and an
            asynchronous unroll is refused.
        vtrace_clip_rho, vtrace_clip_c: V-trace's truncation levels rho-bar and c-bar (IMPALA's 1 and 1).
    """

    trains_recurrent_steps_alone = True  # (temporally_independent_train_step=True: each step from its stored state)
    assumes_own_data = True  # (the surrogate's ratio and GAE read the stored log-probs and values)

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Space,
                 hidden_sizes: Sequence[int] = (64, 64), activation: str = "tanh", lr: float | Scheduler = 3e-4,
                 gamma: float = 0.99, gae_lambda: float = 0.95, clip_range: float | Scheduler = 0.2,
                 value_loss_coef: float = 0.5, entropy_coef: float | Scheduler = 0.0,
                 normalize_advantages: bool = True, actor_network_ctor: Optional[Callable[..., nn.Module]] = None,
                 value_network_ctor: Optional[Callable[..., nn.Module]] = None,
                 clip_range_vf: Optional[float | Scheduler] = None, target_kl: Optional[float] = None,
                 ortho_init: Optional[bool] = None, use_sde: bool = False, sde_sample_freq: int = -1,
                 log_std_init: Optional[float] = None, full_std: bool = True,
                 off_policy_correction: Optional[str] = None, vtrace_clip_rho: float = 1.0, vtrace_clip_c: float = 1.0):
        super().__init__(observation_space, action_space)
        self.use_off_policy_correction(off_policy_correction, vtrace_clip_rho, vtrace_clip_c)
        if target_kl is not None and not target_kl > 0:
            raise ValueError(f"PpoAlgorithm.target_kl={target_kl} must be > 0, or None for no early stop")
        check_sde_options("PpoAlgorithm", use_sde, sde_sample_freq, log_std_init, full_std)
        log_std_init = 0.0 if log_std_init is None else log_std_init  # SB3's default for PPO+gSDE
        self.use_networks(actor_network_ctor, value_network_ctor)
        self.use_sde = use_sde
        if use_sde:
            self.net = SdeActorCriticNetworks(self, hidden_sizes, activation, log_std_init, full_std, sde_sample_freq)
        else:
            self.net = ActorCriticNetworks(self, hidden_sizes, activation, actor_network_ctor=actor_network_ctor,
                                           value_network_ctor=value_network_ctor)
        init_policy_value(ortho_init, self.net.policy, self.net.value_net, self.net.encoder)
        self.lr, self.gamma, self.gae_lambda = lr, gamma, gae_lambda
        # read inside the loss: TracedValues, so that schedules do not recompile compiled updates
        self.clip_range, self.entropy_coef = TracedValue(clip_range), TracedValue(entropy_coef)
        self.value_loss_coef = value_loss_coef
        self.normalize_advantages = normalize_advantages
        self.clip_range_vf = None if clip_range_vf is None else TracedValue(clip_range_vf)
        self.target_kl = target_kl

    @property
    def recurrent(self) -> bool:
        return self.net.recurrent

    def initial_state(self, batch_size: int, device: Optional[torch.device] = None) -> Any:
        return self.net.initial_state(batch_size, device)

    def _act(self, obs: torch.Tensor, greedy: bool) -> tuple[torch.Tensor, Any]:
        out = self.net.act(self.network_input(obs), greedy)
        return out.action, PpoRolloutInfo(out.log_prob, out.value)

    def rollout_step(self, time_step: Any, state: Any = EMPTY) -> AlgStep:
        if self.use_sde:  # each env explores with its own noise matrix (alfish.networks.sde)
            out = self.net.act_exploring(self.network_input(time_step.observation), time_step.step_type)
            return AlgStep(output=out.action, state=state, info=PpoRolloutInfo(out.log_prob, out.value))
        if not self.recurrent:
            return super().rollout_step(time_step, state)
        if isinstance(state, tuple) and len(state) == 0:  # a caller without a state: an episode's start
            state = self.initial_state(time_step.step_type.shape[0], time_step.step_type.device)
        out = self.net.act(self.network_input(time_step.observation), False, state)
        info = PpoRolloutInfo(out.log_prob, out.value, state if self.use_rollout_state else EMPTY)
        return AlgStep(output=out.action, state=out.state, info=info)

    def after_train_iter(self) -> None:
        """gSDE: the next rollout starts with new noise matrices (SB3 redraws them at each rollout's start)."""
        super().after_train_iter()
        if self.use_sde:
            self.net.policy.noise.resample_all()

    def exploration_state(self) -> Any:
        return self.net.policy.noise.acting_state() if self.use_sde else None

    def load_exploration_state(self, state: Any) -> None:
        if self.use_sde:
            self.net.policy.noise.load_acting_state(state)

    def predict_step(self, time_step: Any, state: Any = EMPTY, epsilon_greedy: float = 0.0) -> AlgStep:
        if not self.recurrent:
            return super().predict_step(time_step, state, epsilon_greedy)
        obs = self.network_input(time_step.observation)
        greedy = self.net.act(obs, True, state)
        action = greedy.action
        if epsilon_greedy > 0.0:
            sampled = self.net.act(obs, False, state).action
            pick = torch.rand(action.shape[0], device=action.device) < epsilon_greedy
            action = torch.where(pick.view((-1,) + (1,) * (action.dim() - 1)), sampled, action)
        return AlgStep(output=action, state=greedy.state)

    def preprocess_experience(self, exp: Experience) -> Experience:
        """``[B, T]`` -> ``[B, T-1]`` with advantages; the newest step of each env only bootstraps."""
        info: PpoRolloutInfo = exp.rollout_info
        tm = lambda x: x.transpose(0, 1)  # noqa: E731  (the returns run time-major)
        if self.off_policy_correction == "vtrace":
            log_prob, values = self._evaluate_stored(exp)  # [B, T] each, under the current parameters
            out = vtrace_returns(tm(log_prob - info.log_prob), tm(exp.reward), tm(values), tm(exp.step_type),
                                 tm(exp.discount), VTraceSettings(self.gamma, self.gae_lambda, self.vtrace_clip_rho,
                                                                  self.vtrace_clip_c, clip_pg_rho=None))
            value, adv, value_target = values[:, :-1], tm(out.advantage), tm(out.value_target)
        else:
            adv = generalized_advantage_estimation(tm(exp.reward), tm(info.value), tm(exp.step_type),
                                                   tm(exp.discount), self.gamma, self.gae_lambda).transpose(0, 1)
            value = info.value[:, :-1]
            value_target = adv + value
        trimmed = nest.map_nest(lambda x: x[:, :-1], nest.replace_fields(exp, rollout_info=EMPTY))
        state = nest.map_nest(lambda x: x[:, :-1], info.state)
        info = PpoExperienceInfo(info.log_prob[:, :-1], value, adv, value_target, state)
        return nest.replace_fields(trimmed, rollout_info=info)

    def _evaluate_stored(self, exp: Experience) -> tuple[torch.Tensor, torch.Tensor]:
        """The log-probabilities of the stored actions and the values, ``[B, T]`` each, of ``exp`` ``[B, T]`` under
        the current parameters (no gradient)."""
        batch, length = exp.step_type.shape
        with torch.no_grad():
            out: PpoTrainInfo = self.train_step(nest.map_nest(lambda x: x.transpose(0, 1), exp)).info
        return out.log_prob.view(length, batch).transpose(0, 1), out.value.view(length, batch).transpose(0, 1)

    def train_step(self, exp: Experience, state: Any = EMPTY) -> AlgStep:
        """Log-probs, entropies and values ``[L * B]`` of the mini-batch ``[L, B]``. Recurrent: over time from the
        stored state of step 0 (``use_rollout_state``) or the initial state, reset at FIRST steps; or each step from
        its own stored state (``temporally_independent_train_step=True``)."""
        if self.recurrent and not self.temporally_independent_train_step:
            stored = exp.rollout_info.state
            if self.use_rollout_state:
                start = nest.map_nest(lambda x: x[0], stored)
            else:
                start = self.initial_state(exp.step_type.shape[1], exp.step_type.device)
            out = self.net.evaluate_sequence(self.network_input(exp.observation, batch_dims=2), exp.action,
                                             exp.step_type, start)
            return AlgStep(info=PpoTrainInfo(out.log_prob, out.entropy, out.value))
        obs = self.steps(self.network_input(exp.observation, batch_dims=2), slice(None))
        step_state = EMPTY
        if self.recurrent:  # temporally independent: each step from its own rollout state
            step_state = nest.map_nest(lambda x: x.flatten(0, 1), exp.rollout_info.state)
        out = self.net.evaluate(obs, exp.action.flatten(0, 1), step_state)
        return AlgStep(info=PpoTrainInfo(out.log_prob, out.entropy, out.value))

    def loss_terms(self, exp: Experience, train_info: PpoTrainInfo) -> dict[str, torch.Tensor]:
        """Per-step terms ``[L*B]`` (with gradients): policy (clipped surrogate), value (squared error), entropy.

        Also returns ``valid`` (1 except at LAST steps, which have no successor) and the probability ``ratio``.
        """
        old: PpoExperienceInfo = exp.rollout_info
        valid = (exp.step_type != StepType.LAST).flatten().to(train_info.log_prob.dtype)
        adv = old.advantage.flatten()
        if self.normalize_advantages:
            adv = masked_standardize(adv, valid)
        ratio = torch.exp(train_info.log_prob - old.log_prob.flatten())
        clip = self.clip_range.value()
        policy = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
        predicted = train_info.value
        if self.clip_range_vf is not None:  # SB3: old + clamp(new - old, -c, c)
            old_value, clip_vf = old.value.flatten(), self.clip_range_vf.value()
            predicted = old_value + (predicted - old_value).clamp(-clip_vf, clip_vf)
        value = (old.value_target.flatten() - predicted) ** 2
        return dict(policy_loss=policy, value_loss=value, entropy=train_info.entropy, ratio=ratio, valid=valid)

    def approx_kl(self, exp: Experience) -> torch.Tensor:
        """SB3's approximate KL of the mini-batch ``exp`` ``[L, B]`` from the rollout policy to the current one, without
        gradient: ``mean((r - 1) - log r)`` over its valid (not LAST) steps, ``r`` the probability ratio; 0-d."""
        with torch.no_grad():
            log_ratio = self.train_step(exp).info.log_prob - exp.rollout_info.log_prob.flatten()
            valid = (exp.step_type != StepType.LAST).flatten().to(log_ratio.dtype)
            return ((torch.expm1(log_ratio) - log_ratio) * valid).sum() / valid.sum().clamp(min=1.0)

    def calc_loss(self, exp: Experience, train_info: PpoTrainInfo) -> LossInfo:
        """Per-step loss ``[L, B]``; LAST steps (no successor) are masked out."""
        terms = self.loss_terms(exp, train_info)
        valid = terms["valid"]
        loss = (terms["policy_loss"] + self.value_loss_coef * terms["value_loss"]
                - self.entropy_coef.value() * terms["entropy"]) * valid

        def extra() -> dict[str, torch.Tensor]:  # evaluated only when a summary is due
            with torch.no_grad():
                count = valid.sum().clamp(min=1.0)
                ratio = terms["ratio"]
                out = {k: (terms[k] * valid).sum() / count for k in ("policy_loss", "value_loss", "entropy")}
                out["approx_kl"] = (((ratio - 1) - torch.log(ratio)) * valid).sum() / count
                out["clip_fraction"] = (((ratio - 1).abs() > self.clip_range.value()).float() * valid).sum() / count
                if self.debug_summaries:  # TrainerConfig.debug_summaries: GAE advantages before any standardizing
                    old: PpoExperienceInfo = exp.rollout_info
                    out.update(masked_stats("advantage", old.advantage.flatten(), valid, ("mean", "std")))
                    out["debug/explained_variance"] = explained_variance(train_info.value,
                                                                         old.value_target.flatten(), valid)
                return out

        return LossInfo(loss=loss.view(exp.step_type.shape), extra=extra)
