"""Soft Actor-Critic (Haarnoja et al. 2018, "SAC: Algorithms and Applications"), continuous actions.

Twin critics are one ``EnsembleMLP`` (one batched matmul per layer); the entropy temperature is learned on log-alpha.
The three losses are summed into one and back-propagated once: the critic term sees the TD target computed without
gradient, the actor term reads the critics through detached weights, the alpha term sees a detached log-prob.

Shared encoder, recurrent SAC (sequence replay, as recurrent DQN): with ``encoding_network_ctor = @EncodingNetwork``
one encoder reads the observations, the actor is an MLP head on its features and the twin critics an MLP ensemble on
(features, action), as in SAC-AE and DrQ: the critic loss trains the encoder, the actor and alpha losses read
detached features. A target copy of the encoder follows it with the target critics (Polyak, together). With
``EncodingNetwork.rnn = 'gru'`` or ``'lstm'`` the encoder carries a state per env: ``rollout_step`` and
``predict_step`` take and return it (``EMPTY``: an episode's start), and with ``TrainerConfig.use_rollout_state=True``
the state each step was acted from is stored as its rollout info (``SacRolloutInfo``), so that each sampled sequence
starts from the stored state of its first step (zeros without it). The online encoder runs over the sequence from
that state (the first ``burn_in`` steps without gradient: they only warm the state up) and the target encoder over the
whole of it, the state reset at FIRST steps inside it. Every step ``t`` in ``[burn_in, L-2]`` is trained, against
``r[t+1] + gamma * discount[t+1] * (min_i Q'_i(target features[t+1], a') - alpha * log pi(a'))``, ``a'`` drawn from
the actor on the online features of step ``t+1`` (``TrainerConfig.mini_batch_length >= burn_in + 2``); a sequence's
replay priority is R2D2's ``0.9 max + 0.1 mean`` of its |TD errors|.

Box actions; a mixed action (a Tuple or Dict of one Discrete and one Box part, as ALF's SAC) is driven by the subclass
``MixedSacAlgorithm`` (``sac_mixed.py``), which ``SacAlgorithm(...)`` builds for such an action space, chosen once at
build time: the Box path has no branch for it.
"""
from __future__ import annotations

import copy
import inspect
import math
from typing import Any, Callable, NamedTuple, Optional, Sequence

import gin
import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from alfish.algorithms.base import OffPolicyAlgorithm, UpdateCounter
from alfish.algorithms.debug_stats import masked_stats
from alfish.algorithms.deferred_actor import DeferredActorBatch, check_update_order
from alfish.algorithms.network_sizes import part_hidden_sizes
from alfish.algorithms.sac_sequences import sequence_features
from alfish.data import nest
from alfish.data.state import is_empty
from alfish.data.types import EMPTY, AlgStep, Experience, LossInfo, StepType, TimeStep
from alfish.envs.mixed_actions import MixedActionBox
from alfish.errors import OneLineValueError
from alfish.networks.distributions import tanh_gaussian_sample
from alfish.networks.ensemble import EnsembleCritic
from alfish.networks.heads import build_encoder
from alfish.networks.mlp import MLP, polyak_update
from alfish.networks.sde import SdeActor, StateDependentNoise, check_sde_options, latent_size, tanh_log_det
from alfish.schedulers import Scheduler, TracedValue, as_scheduler

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # as SB3 and the SAC reference implementation


def refuse_learned_alpha_bindings(ent_coef: float) -> None:
    """An error if the conf binds a setting of the learned temperature next to a fixed ``SacAlgorithm.ent_coef`` (the
    binding would do nothing). A binding to the default is let through: a run's operative config records every
    default (``initial_log_alpha = 0.0``, ...), and play and resume rebuild from it."""
    defaults = inspect.signature(SacAlgorithm.__init__).parameters
    for param in ("initial_log_alpha", "alpha_lr", "target_entropy", "discrete_target_entropy"):
        try:
            value = gin.query_parameter(f"SacAlgorithm.{param}")
        except ValueError:  # not bound
            continue
        if value == defaults[param].default:
            continue
        raise ValueError(f"SacAlgorithm.{param} is bound, but SacAlgorithm.ent_coef={ent_coef} fixes the entropy "
                         f"temperature (nothing learns it): remove SacAlgorithm.{param}, or set ent_coef = None to "
                         "learn alpha")


class SacTrainInfo(NamedTuple):
    """Per trained transition, ``N = (L - 1 - burn_in) * B`` of a sequence batch ``[L, B]`` (``burn_in`` 0 unless
    recurrent), time-major."""
    td_error: torch.Tensor     # [N], |Q - target| averaged over the critics (replay priority)
    critic_loss: torch.Tensor  # [N]
    actor_loss: torch.Tensor   # [N]
    alpha_loss: torch.Tensor   # [N]
    log_prob: torch.Tensor     # [N]
    q: torch.Tensor            # [E, N], Q_i(s, a) of the replayed action (its graph is the critic term's; debug only)
    td_target: torch.Tensor    # [N], r + gamma * discount * soft V(s'), no gradient
    # [N], the actor and alpha terms' own mask ('critic_first': the kept batch's; None: this batch's, ``valid``)
    actor_valid: Optional[torch.Tensor] = None


class SacRolloutInfo(NamedTuple):
    state: Any  # [B, ...], the recurrent state the step was acted from (recurrent SAC with use_rollout_state)


@gin.configurable
class SacAlgorithm(DeferredActorBatch, UpdateCounter, OffPolicyAlgorithm):
    """SAC.

    Args:
        hidden_sizes: hidden layers of the actor and of each critic (each part's default, see below).
        actor_hidden_sizes, critic_hidden_sizes: SB3's ``net_arch=dict(pi=[...], qf=[...])``: the actor's and each
            critic's own hidden layers (the default MLPs, flat or over a shared encoder); ``None``: ``hidden_sizes``.
        activation: the default MLPs' activation between hidden layers (SB3's ``activation_fn``: 'relu', 'tanh',
            'elu', ... see ``alfish.networks.mlp.ACTIVATIONS``).
        actor_lr, critic_lr, alpha_lr: Adam learning rates of the three parameter groups (numbers or schedules).
        gamma: discount per env step.
        target_update_tau: Polyak factor for target critics (1 = hard copy); a number or a schedule.
        target_update_period: optimizer steps between target updates.
        initial_log_alpha: starting log of the learned entropy temperature (RL Zoo's ``ent_coef='auto_0.1'`` is
            ``initial_log_alpha = -2.302585``, i.e. log(0.1)).
        target_entropy: entropy the temperature aims for (number or schedule); ``None`` means ``-action_dim``.
        ent_coef: SB3's fixed entropy coefficient: a number > 0 is the temperature alpha itself (not its log), held
            fixed: no alpha loss, no ``alpha`` parameter group (``alpha_lr``, ``initial_log_alpha`` and
            ``target_entropy`` then have no use and binding them is an error). ``None`` (default): alpha is learned
            from ``initial_log_alpha`` towards ``target_entropy`` (SB3's ``'auto'``).
        num_critics: ensemble size; the TD target takes the minimum over members.
        actor_network_cls: ``cls(observation_space, 2 * action_dim)`` -> the actor (``obs -> [N, 2 * action_dim]``:
            mean and log-std of the pre-tanh Gaussian); ``None``: an MLP of ``hidden_sizes`` (through
            ``EncodingNetwork`` for images and dicts). See ``alfish.networks.heads`` for the contract.
        critic_network_cls: ``cls(observation_space, action_dim)`` -> one critic (``(obs, action) -> [N, 1]``); the
            ``num_critics`` members are one ``VmapEnsemble``. ``None``: MLP critics of ``hidden_sizes``.
        encoding_network_ctor: ``ctor(observation_space)`` -> an encoder (``EncodingNetwork``, which may be recurrent)
            shared by an actor head and the critic heads of ``hidden_sizes`` (module docstring); exclusive with
            ``actor_network_cls`` and ``critic_network_cls``.
        burn_in: recurrent encoder only: steps at the start of each sampled sequence that only warm the state up.
        use_sde: explore with gSDE (``alfish.networks.sde``) instead of independent Gaussian noise: the actor is an
            MLP of ``hidden_sizes`` giving the pre-tanh mean (clipped to [-2, 2], as SB3), its last hidden layer the
            latent of the state-dependent noise. Default MLP networks over flat observations only.
        sde_sample_freq: gSDE: env steps between two draws of an env's noise matrix while acting (-1: only at its
            episode's start and at each training iteration's rollout start).
        log_std_init: gSDE: initial log of the noise's sigma ``[latent_dim, action_dim]``; ``None``: SB3's -3 for SAC.
        full_std: gSDE: one sigma per (latent unit, action dim); ``False``: one per latent unit.
        discrete_target_entropy: mixed actions only (``MixedSacAlgorithm``): the entropy in nats the discrete part's
            temperature aims for (number or schedule); ``None``: ALF's default (``sac_mixed.default_discrete_entropy``).
            ``target_entropy`` is then the Box part's (default ``-d``, ``d`` its size).
        update_order: ``'joint'`` (one step for actor, critics and temperature: the actor's loss reads the critics
            before the step) or ``'critic_first'`` (the actor's loss reads the critics after their step, as SB3 and
            the SAC authors' code; its and the temperature's terms are deferred one update,
            ``alfish.algorithms.deferred_actor``). Flat observations, Box actions, no shared encoder.
    """

    rollout_module_names = ("actor",)  # async unroll ships only these to its child
    #: The subclass that drives mixed actions: ``sac_mixed.MixedSacAlgorithm`` sets it when defined (importing
    #: ``alfish.algorithms`` imports it); ``None``: mixed actions are refused (``RLAlgorithm``).
    mixed_action_class: Optional[type] = None

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Space,
                 hidden_sizes: Sequence[int] = (256, 256), actor_lr: float | Scheduler = 3e-4,
                 critic_lr: float | Scheduler = 3e-4, alpha_lr: float | Scheduler = 3e-4, gamma: float = 0.99,
                 target_update_tau: float | Scheduler = 0.005, target_update_period: int = 1,
                 initial_log_alpha: float = 0.0, target_entropy: Optional[float | Scheduler] = None,
                 num_critics: int = 2, actor_network_cls: Optional[Callable[..., nn.Module]] = None,
                 critic_network_cls: Optional[Callable[..., nn.Module]] = None,
                 encoding_network_ctor: Optional[Callable[..., nn.Module]] = None, burn_in: int = 0,
                 ent_coef: Optional[float] = None, actor_hidden_sizes: Optional[Sequence[int]] = None,
                 critic_hidden_sizes: Optional[Sequence[int]] = None, activation: str = "relu",
                 use_sde: bool = False, sde_sample_freq: int = -1, log_std_init: Optional[float] = None,
                 full_std: bool = True, discrete_target_entropy: Optional[float | Scheduler] = None,
                 update_order: str = "joint"):
        super().__init__(observation_space, action_space)
        check_update_order("SacAlgorithm", update_order, observation_space)
        if update_order == "critic_first" and (encoding_network_ctor is not None or self.action_kind == "mixed"):
            raise ValueError("SacAlgorithm.update_order='critic_first' defers the actor's term on kept observations, "
                             "which it does for a Box action and no shared encoder; this SAC has "
                             f"{'a shared encoder' if encoding_network_ctor is not None else 'mixed actions'}: use "
                             "update_order='joint'")
        self._init_update_order(update_order)
        check_sde_options("SacAlgorithm", use_sde, sde_sample_freq, log_std_init, full_std)
        log_std_init = -3.0 if log_std_init is None else log_std_init  # SB3's default for SAC+gSDE
        if self.discrete:
            raise ValueError(f"SacAlgorithm needs a Box action space, got {action_space}; use PpoAlgorithm or "
                             "A2cAlgorithm for discrete actions")
        if target_update_period < 1:
            raise ValueError(f"SacAlgorithm.target_update_period={target_update_period} must be >= 1")
        if burn_in < 0:
            raise ValueError(f"SacAlgorithm.burn_in={burn_in} must be >= 0")
        if ent_coef is not None and not ent_coef > 0:
            raise ValueError(f"SacAlgorithm.ent_coef={ent_coef} must be > 0 (the fixed entropy temperature alpha), "
                             "or None to learn alpha")
        if encoding_network_ctor is not None and (actor_network_cls is not None or critic_network_cls is not None):
            raise ValueError("SacAlgorithm.encoding_network_ctor (a shared encoder) and actor_network_cls / "
                             "critic_network_cls are exclusive; give one or the other")
        self.use_networks(actor_network_cls, critic_network_cls)
        # Plain bools (not properties over the modules): the feed-forward path pays one attribute read per branch.
        self._encoded = encoding_network_ctor is not None
        sizes = part_hidden_sizes("SacAlgorithm", hidden_sizes, dict(actor=(actor_hidden_sizes, actor_network_cls),
                                                                     critic=(critic_hidden_sizes, critic_network_cls)))
        self.use_sde = use_sde
        if use_sde:
            self.actor = self._sde_actor(actor_network_cls, critic_network_cls, encoding_network_ctor, sizes["actor"],
                                         dict(log_std_init=log_std_init, full_std=full_std,
                                              sample_freq=sde_sample_freq), activation)
            self.critics = self.build_critics(critic_network_cls, num_critics, sizes["critic"], activation)
        elif not self._encoded:
            self.actor = self.build_network(actor_network_cls, 2 * self.action_dim, sizes["actor"], activation)
            self.critics = self.build_critics(critic_network_cls, num_critics, sizes["critic"], activation)
        else:
            self.encoder = build_encoder(encoding_network_ctor, self.encoder_space(), allow_recurrent=True)
            features = self.encoder.output_size
            self.actor = MLP(features, 2 * self.action_dim, sizes["actor"], activation)
            self.critics = EnsembleCritic(num_critics, features + self.action_dim, 1, sizes["critic"], activation)
            self.target_encoder = copy.deepcopy(self.encoder).requires_grad_(False)
            # an encoder that only flattens (no fc layers, no core) has no parameters for its target to follow
            self._polyak_encoder = len(list(self.encoder.parameters())) > 0
            self.rollout_module_names = ("encoder", "actor")  # acting reads the encoder too
        self._recurrent = self._encoded and bool(getattr(self.encoder, "recurrent", False))
        # The evaluator's critic spread (eval_uncertainty) calls critics(observation, action); these read features.
        self.critics_read_observations = not self._encoded
        self.burn_in = burn_in
        if burn_in and not self._recurrent:
            raise ValueError(f"SacAlgorithm.burn_in={burn_in} warms up a recurrent state; this SAC has none (set "
                             "EncodingNetwork.rnn and SacAlgorithm.encoding_network_ctor, or burn_in = 0)")
        self.target_critics = copy.deepcopy(self.critics).requires_grad_(False)
        self._init_temperature(initial_log_alpha, ent_coef, target_entropy, discrete_target_entropy)
        self.gamma = gamma
        self.tau = as_scheduler(target_update_tau)
        self.target_update_period = target_update_period
        self._lrs = dict(actor=actor_lr, critic=critic_lr, alpha=alpha_lr)
        self._init_update_counter()  # the num_updates buffer, mirrored by a Python int (no sync in after_update)

    @property
    def skips_parameters_in_some_updates(self) -> bool:
        # in the critic-first order the first update has no actor or temperature term (DDP: find_unused_parameters)
        return self.update_order == "critic_first"

    def _set_updates_done(self, count: int) -> None:
        # Whether this update builds the actor's term, kept as a bool (UpdateCounter): 'critic_first' has none on
        # the first update, when no batch has been kept yet; a compiled update keeps one graph for each value.
        super()._set_updates_done(count)
        self.__dict__["_actor_trains"] = self.update_order != "critic_first" or count > 0

    def __new__(cls, *args: Any, **kwargs: Any) -> "SacAlgorithm":
        """``SacAlgorithm(...)`` for a mixed action space builds a ``mixed_action_class`` (its ``__init__`` is this
        class's, with the same gin bindings); any other call builds ``cls`` itself."""
        action_space = kwargs.get("action_space", args[1] if len(args) > 1 else None)
        if cls is SacAlgorithm and isinstance(action_space, MixedActionBox) and cls.mixed_action_class is not None:
            cls = cls.mixed_action_class
        return super().__new__(cls)

    def _init_temperature(self, initial_log_alpha: float, ent_coef: Optional[float],
                          target_entropy: Optional[float | Scheduler],
                          discrete_target_entropy: Optional[float | Scheduler]) -> None:
        """``log_alpha`` (learned: a parameter; a fixed ``ent_coef``: a buffer) and ``target_entropy``; the mixed
        subclass adds its discrete part's."""
        if discrete_target_entropy is not None and self.action_kind != "mixed":
            raise OneLineValueError(f"SacAlgorithm.discrete_target_entropy={discrete_target_entropy} is the target of "
                                    "a mixed action's discrete part, but this env's actions are "
                                    f"{self.action_kind}: remove it")
        # A fixed alpha is a buffer: kept in the state dict under the same name, never trained, no alpha group.
        self.learns_alpha = ent_coef is None
        if self.learns_alpha:
            self.log_alpha = nn.Parameter(torch.tensor(float(initial_log_alpha)))
        else:
            refuse_learned_alpha_bindings(ent_coef)
            self.register_buffer("log_alpha", torch.tensor(math.log(ent_coef)))
        # read inside the loss: a TracedValue, so that a schedule does not recompile compiled updates
        self.target_entropy = TracedValue(-float(self.action_dim) if target_entropy is None else target_entropy)

    def _sde_actor(self, actor_cls: Any, critic_cls: Any, encoding_ctor: Any, hidden_sizes: Sequence[int],
                   options: dict, activation: str = "relu") -> SdeActor:
        """gSDE's actor (class docstring); ``options``: ``StateDependentNoise``'s."""
        if actor_cls is not None or critic_cls is not None or encoding_ctor is not None or self.raw_observations:
            raise OneLineValueError("SacAlgorithm.use_sde=True builds its own MLP actor over flat observations; leave "
                                    "actor_network_cls, critic_network_cls and encoding_network_ctor unset")
        mlp = MLP(self.obs_dim, self.action_dim, hidden_sizes, activation)
        # as SB3's SAC actor: the mean clipped to [-2, 2], and the actor loss (entropy and Q through the noise)
        # reaches the latent features (learn_features=True; its PPO's is False)
        noise = StateDependentNoise(latent_size(self.obs_dim, hidden_sizes), self.action_dim, learn_features=True,
                                    **options)
        return SdeActor(mlp, noise, mean_clip=2.0)

    def param_groups(self) -> list[dict]:
        """Three groups (two with a fixed ``ent_coef``); a shared encoder is trained by the critic loss, so it is in the
        critic group."""
        critic = list(self.critics.parameters()) + (list(self.encoder.parameters()) if self._encoded else [])
        groups = [dict(name="actor", params=list(self.actor.parameters()), lr=self._lrs["actor"]),
                  dict(name="critic", params=critic, lr=self._lrs["critic"])]
        if self.learns_alpha:  # a fixed alpha (ent_coef) has nothing to optimize
            groups.append(dict(name="alpha", params=[self.log_alpha], lr=self._lrs["alpha"]))
        return groups

    @property
    def recurrent(self) -> bool:
        return self._recurrent

    def initial_state(self, batch_size: int, device: Optional[torch.device] = None) -> Any:
        return self.encoder.initial_state(batch_size, device) if self._recurrent else EMPTY

    def configure_recurrence(self, use_rollout_state: bool, temporally_independent_train_step: Optional[bool],
                             mini_batch_length: Optional[int] = None) -> None:
        """As ``Algorithm.configure_recurrence``; a shared encoder also needs sequences of ``burn_in + 2`` steps."""
        super().configure_recurrence(use_rollout_state, temporally_independent_train_step, mini_batch_length)
        if self._encoded and mini_batch_length is not None:
            self._check_length(mini_batch_length)

    def _check_length(self, length: int) -> None:
        if length < self.burn_in + 2:
            raise ValueError(f"SacAlgorithm with an encoder and burn_in={self.burn_in} trains on sequences of at least "
                             f"burn_in + 2 = {self.burn_in + 2} steps, got {length}; set "
                             "TrainerConfig.mini_batch_length")

    # ----------------------------------------------------------------------------------------------------- acting --
    def _policy(self, obs: torch.Tensor, greedy: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Unit-box action ``[N, action_dim]`` and its log-prob ``[N]``.

        ``hardtanh`` is ``clamp`` to [LOG_STD_MIN, LOG_STD_MAX] with a one-kernel backward (clamp's backward is five
        aten ops); the two gradients differ only where ``log_std`` sits exactly on a bound.
        """
        if self.use_sde:
            return self._sde_policy(obs, greedy)
        mean, log_std = self.actor(obs).chunk(2, dim=-1)
        return tanh_gaussian_sample(mean, F.hardtanh(log_std, LOG_STD_MIN, LOG_STD_MAX), deterministic=greedy)

    def _sde_policy(self, obs: torch.Tensor, greedy: bool, noise: Optional[torch.Tensor] = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """gSDE: ``tanh(mean + noise)`` ``[N, action_dim]`` and its log-prob ``[N]`` (Gaussian of variance
        ``latent^2 @ sigma^2``, SB3's tanh correction). ``noise [N, action_dim]``: given (acting, each env its own
        matrix); ``None``: from one matrix drawn for the batch, reparameterised (SB3 redraws it every update); greedy:
        zero."""
        mean, latent = self.actor(obs)
        sde = self.actor.noise
        if noise is None:
            noise = torch.zeros_like(mean) if greedy else sde.noise(latent, sde.draw())
        u = mean + noise
        return torch.tanh(u), sde.log_prob(u, mean, latent) - tanh_log_det(u)

    def _sde_rollout_step(self, time_step: TimeStep, state: Any) -> AlgStep:
        """Acting with each env's own noise matrix, redrawn at its FIRST steps and every ``sde_sample_freq``."""
        obs = self.network_input(time_step.observation)
        with torch.no_grad():
            mean, latent = self.actor(obs)
            action = torch.tanh(mean + self.actor.noise.acting_noise(latent, time_step.step_type))
        return AlgStep(output=self.scale_action(action), state=state)

    def after_train_iter(self) -> None:
        """gSDE: the next rollout starts with new noise matrices (SB3 redraws them at each rollout's start)."""
        super().after_train_iter()
        if self.use_sde:
            self.actor.noise.resample_all()

    def exploration_state(self) -> Any:
        return self.actor.noise.acting_state() if self.use_sde else None

    def load_exploration_state(self, state: Any) -> None:
        if self.use_sde:
            self.actor.noise.load_acting_state(state)

    def _act(self, obs: torch.Tensor, greedy: bool) -> tuple[torch.Tensor, Any]:
        unit_action, _ = self._policy(self.network_input(obs), greedy)
        return self.scale_action(unit_action), EMPTY

    def _encode_step(self, time_step: TimeStep, state: Any) -> tuple[torch.Tensor, Any, Any]:
        """Shared encoder: ``(features [B, F], next state, the state acted from)``; states ``EMPTY`` if it has none."""
        obs = self.network_input(time_step.observation)
        if not self._recurrent:
            return self.encoder(obs), state, state
        if is_empty(state):  # a caller without a state: an episode's start
            state = self.initial_state(time_step.step_type.shape[0], time_step.step_type.device)
        features, next_state = self.encoder(obs, state)
        return features, next_state, state

    def predict_step(self, time_step: TimeStep, state: Any = EMPTY, epsilon_greedy: float = 0.0) -> AlgStep:
        """Greedy action, except that each env samples from the policy with probability ``epsilon_greedy``."""
        if not self._encoded:
            return super().predict_step(time_step, state, epsilon_greedy)
        features, next_state, _ = self._encode_step(time_step, state)
        action, _ = self._policy(features, greedy=True)                          # [B, action_dim] in [-1, 1]
        if epsilon_greedy > 0.0:
            sampled, _ = self._policy(features, greedy=False)
            pick = torch.rand(action.shape[0], device=action.device) < epsilon_greedy
            action = torch.where(pick.unsqueeze(-1), sampled, action)
        return AlgStep(output=self.scale_action(action), state=next_state)

    def rollout_step(self, time_step: TimeStep, state: Any = EMPTY) -> AlgStep:
        if self.use_sde:
            return self._sde_rollout_step(time_step, state)
        if not self._encoded:
            return super().rollout_step(time_step, state)
        features, next_state, state = self._encode_step(time_step, state)
        action, _ = self._policy(features, greedy=False)
        info = SacRolloutInfo(state) if self.use_rollout_state else EMPTY
        return AlgStep(output=self.scale_action(action), state=next_state, info=info)

    # --------------------------------------------------------------------------------------------------- training --
    def train_step(self, exp: Experience, state: Any = EMPTY) -> AlgStep:
        """Losses of the ``L-1`` transitions of ``exp`` ``[L, B]``, each ``[N = (L-1) * B]`` (with a shared encoder:
        of the ``L-1-burn_in`` after the burn-in, see ``_encoded_train_step``)."""
        if self._encoded:
            return self._encoded_train_step(exp)
        obs = self.network_input(exp.observation, batch_dims=2)                # [L, B, obs_dim] (flat mode)
        obs_t, obs_next = self.steps(obs, slice(None, -1)), self.steps(obs, slice(1, None))   # [N, obs_dim]
        if self.update_order == "joint":
            return self._losses(obs_t, obs_t, obs_next, obs_next, exp.action[:-1], exp.reward[1:], exp.discount[1:])
        # critic_first: the actor and alpha terms are on the batch the previous update kept (none on the first)
        valid = self.valid_transitions(exp)
        policy_in, policy_valid = self._take_kept() if self._actor_trains else (None, torch.zeros_like(valid))
        self._keep_for_actor(obs_t.detach(), valid)
        step = self._losses(obs_t, policy_in, obs_next, obs_next, exp.action[:-1], exp.reward[1:], exp.discount[1:])
        return nest.replace_fields(step, info=nest.replace_fields(step.info, actor_valid=policy_valid))

    def _encoded_train_step(self, exp: Experience) -> AlgStep:
        """Losses of the transitions out of steps ``burn_in .. L-2`` of ``exp`` ``[L, B]``, ``N = (L-1-burn_in) B``.

        The critics read the online features with their gradient (the critic loss trains the encoder), the actor
        detached ones; the TD target reads the target encoder's features of step ``t+1`` (module docstring).
        """
        self._check_length(exp.step_type.shape[0])
        first = self.burn_in
        online, target = sequence_features(self, exp)                           # each [L - burn_in, B, F]
        detached = online.detach()
        features_t = online[:-1].flatten(0, 1)                                  # [N, F], with gradient
        return self._losses(features_t, detached[:-1].flatten(0, 1), detached[1:].flatten(0, 1),
                            target[1:].flatten(0, 1), exp.action[first:-1], exp.reward[first + 1:],
                            exp.discount[first + 1:])

    def _losses(self, critic_in: Any, policy_in: Any, next_policy_in: Any, next_target_in: Any, action: torch.Tensor,
                reward: torch.Tensor, discount: torch.Tensor) -> AlgStep:
        """The three SAC losses of ``N`` transitions, each ``[N]``.

        critic_in, policy_in: what the critics and the actor read at the transitions' first steps ``[N, ...]``
            (observations, or features: with gradient for the critics, detached for the actor); ``policy_in`` None:
            no actor and alpha terms (``'critic_first'``'s first update);
        next_policy_in, next_target_in: what the actor and the target critics read at the next steps ``[N, ...]``;
        action: ``[L', B, action_dim]`` (env scale); reward, discount: ``[L', B]`` of the next steps, ``N = L' B``.

        Written in few aten ops (each costs several microseconds on the CPU, as much as the arithmetic of a [N]
        tensor): ``addcmul`` for the TD target, ``amin`` where no gradient (hence no argmin) is needed.
        """
        act_t = self.unscale_action(action.flatten(0, 1))                      # [N, action_dim]
        reward, discount = reward.flatten(), discount.flatten()
        alpha = self.log_alpha.detach().exp()

        with torch.no_grad():
            next_action, next_log_prob = self._policy(next_policy_in, greedy=False)
            next_q = self.target_critics(next_target_in, next_action).amin(0).squeeze(-1)   # [N]
            soft_value = torch.addcmul(next_q, alpha, next_log_prob, value=-1.0)  # next_q - alpha * log_prob
            td_target = torch.addcmul(reward, discount, soft_value, value=self.gamma)

        q = self.critics(critic_in, act_t).squeeze(-1)                          # [E, N]
        td = q - td_target
        critic_loss = 0.5 * (td ** 2).sum(0)

        if policy_in is None:  # factories: no graph, so the actor and log_alpha get no gradient (Adam skips them)
            zeros = torch.zeros_like(critic_loss)
            return AlgStep(info=SacTrainInfo(td.detach().abs().mean(0), critic_loss, zeros, zeros, zeros, q, td_target))
        new_action, log_prob = self._policy(policy_in, greedy=False)
        q_new = self.critics(policy_in, new_action, detach_params=True).min(0).values.squeeze(-1)
        actor_loss = alpha * log_prob - q_new

        log_prob = log_prob.detach()
        if self.learns_alpha:
            # -log_alpha * (log_prob + target_entropy), as log_alpha * (-target_entropy - log_prob): the same floats
            alpha_loss = self.log_alpha * torch.rsub(log_prob, -self.target_entropy.value())
        else:  # a fixed alpha (ent_coef): no alpha term
            alpha_loss = torch.zeros_like(log_prob)
        return AlgStep(info=SacTrainInfo(td.detach().abs().mean(0), critic_loss, actor_loss, alpha_loss, log_prob, q,
                                         td_target))

    def calc_loss(self, exp: Experience, train_info: SacTrainInfo) -> LossInfo:
        """Per-transition loss ``[L-1-burn_in, B]``; transitions out of a LAST step (env autoreset) are masked out."""
        valid = exp.step_type[self.burn_in:-1] != StepType.LAST                 # [L-1-burn_in, B]
        shape = valid.shape
        valid = valid.flatten().to(train_info.critic_loss.dtype)
        policy_valid = train_info.actor_valid
        if policy_valid is None:
            loss = (train_info.critic_loss + train_info.actor_loss).add_(train_info.alpha_loss).mul_(valid)
        else:  # 'critic_first': the actor and alpha rows are the kept batch's, with its own mask
            loss = torch.addcmul(train_info.critic_loss * valid, train_info.actor_loss + train_info.alpha_loss,
                                 policy_valid)

        def extra() -> dict[str, torch.Tensor]:  # evaluated only when a summary is due
            terms = torch.stack([train_info.critic_loss, train_info.actor_loss, train_info.alpha_loss,
                                 -train_info.log_prob]).detach()
            masks = valid if policy_valid is None else torch.stack([valid, policy_valid, policy_valid, policy_valid])
            means = (terms * masks).sum(-1) / masks.sum(-1).clamp(min=1.0)
            out = dict(critic_loss=means[0], actor_loss=means[1], alpha_loss=means[2], entropy=means[3],
                       alpha=self.log_alpha.detach().exp())
            if self.debug_summaries:  # TrainerConfig.debug_summaries: Q over every critic, entropy per sample
                out.update(masked_stats("q", train_info.q, valid))
                out.update(masked_stats("td_target", train_info.td_target, valid))
                entropy_rows = valid if policy_valid is None else policy_valid  # (critic_first: the kept batch's)
                out.update(masked_stats("entropy", -train_info.log_prob, entropy_rows))
                out["debug/alpha"] = out["alpha"]
                out["debug/target_entropy"] = self.target_entropy.tensor_value(valid.device)
            return out

        # Replay priority of each sampled sequence [B]: its transitions' mean |TD error| (recurrent: R2D2's 0.9 max +
        # 0.1 mean over time, as recurrent DQN: a long sequence's one large error is not averaged away).
        abs_td = (train_info.td_error * valid).view(shape)
        priority = 0.9 * abs_td.amax(0) + 0.1 * abs_td.mean(0) if self._recurrent else abs_td.mean(0)
        return LossInfo(loss=loss.view(shape), extra=extra, priority=priority)

    def after_update(self) -> None:
        """Counts the optimizer step; on every ``target_update_period``-th, Polyak-averages the target critics
        towards the critics (and the target encoder towards a shared encoder, with the same factor). The period is
        decided on the Python mirror of the count: no host sync."""
        if self._count_update() % self.target_update_period == 0:
            tau = self.tau()
            polyak_update(self.target_critics, self.critics, tau)
            if self._encoded and self._polyak_encoder:
                polyak_update(self.target_encoder, self.encoder, tau)
