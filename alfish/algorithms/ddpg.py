"""DDPG (Lillicrap et al. 2016) and TD3 (Fujimoto et al. 2018, "Addressing Function Approximation Error in
Actor-Critic Methods"), continuous actions.

TD3 is DDPG with three additions, each one constructor argument of ``DdpgAlgorithm``:
  1. clipped double Q: ``num_critics=2`` critics (one ``EnsembleMLP``), the TD target takes their minimum;
  2. target policy smoothing: ``target_policy_noise`` (clipped to ``target_noise_clip``) on the target action;
  3. delayed policy updates: ``policy_delay`` -- the actor and the targets are updated every ``policy_delay``-th
     optimizer step only.
``Td3Algorithm`` is ``DdpgAlgorithm`` with the paper's values of those three as defaults.

One total loss, one backward (DESIGN.md §3.2): the critic term sees the TD target computed without gradient, the
actor term reads the critic through detached weights. Actions live in the unit box [-1, 1] inside the networks
(actor output tanh) and in [low, high] in the env; noise scales are in unit-box units.

The update order (``update_order``). ``'joint'`` (default): one total loss and one optimizer step per update, so
on an update that trains the actor, its loss reads the critic as it was before that update's critic step.
``'critic_first'``: the actor's loss reads the critic *after* that step, as Stable-Baselines3 and the TD3 authors'
code do (critic step, then actor step on the same batch). Still one loss and one step per update: the actor's term
is deferred by one update. On an update where the actor is due, only the critic term is built and the batch's
observations (and validity mask) are kept; the next update adds the actor's term on those observations, read
through that update's critic before its step, which is the critic after the previous step: the actor's gradient is
the reference order's, one update later. The target networks move after the update that trained the actor, so they
(and the exploring actor) lag the reference by one update (at tau = 0.005, a 0.5% difference in the targets' step).
The kept observations are buffers (``deferred_observations``, ``deferred_valid``): a checkpoint resumes exactly.
Not with prioritized replay or offline data (the deferred rows would be weighted by, or mixed into, another
batch's rows; refused at build), nor a ``Dict`` observation space.

Policy delay and Adam. On a step where the actor is not due, the actor term is not built at all (a constant 0 with
no graph), so the actor's parameters get no gradient (``grad is None`` after the trainer's
``zero_grad(set_to_none=True)``) and torch's Adam skips them entirely: no step, no moment decay, no step-count
increment -- exactly as if the actor's optimizer had not been called, which is what the reference implementation
does with its separate actor optimizer. (Multiplying the term by 0 instead would hand Adam zero gradients, and Adam
would still move the actor with its decaying first moment.) Under DDP this needs ``find_unused_parameters=True``
when ``policy_delay > 1``.
"""
from __future__ import annotations

import copy
import inspect
from typing import Any, Callable, NamedTuple, Optional, Sequence

import gin
import gymnasium as gym
import torch
from torch import nn

from alfish.algorithms.base import OffPolicyAlgorithm, UpdateCounter
from alfish.algorithms.debug_stats import masked_stats
from alfish.algorithms.deferred_actor import DeferredActorBatch, check_update_order
from alfish.algorithms.network_sizes import part_hidden_sizes
from alfish.data.types import EMPTY, AlgStep, Experience, LossInfo
from alfish.networks.mlp import polyak_update
from alfish.schedulers import Scheduler, as_scheduler


class DdpgTrainInfo(NamedTuple):
    td_error: torch.Tensor     # [N], |Q - target| averaged over the critics (replay priority)
    critic_loss: torch.Tensor  # [N]
    actor_loss: torch.Tensor   # [N]; zeros (no graph) on steps where the delayed actor is not due
    q: torch.Tensor            # [N], mean over the critics of Q(s, a) of the stored action (detached)
    td_target: torch.Tensor    # [N], r + gamma * discount * min_i Q_target_i(s', a'), no gradient
    actor_valid: Optional[torch.Tensor] = None  # [N], the actor term's own mask (critic_first: the kept batch's)


@gin.configurable
class DdpgAlgorithm(DeferredActorBatch, UpdateCounter, OffPolicyAlgorithm):
    """DDPG, and TD3 with ``num_critics=2, target_policy_noise=0.2, target_noise_clip=0.5, policy_delay=2``.

    Args:
        hidden_sizes: hidden layers of the actor and of each critic (each part's default, see below).
        actor_hidden_sizes, critic_hidden_sizes: SB3's ``net_arch=dict(pi=[...], qf=[...])``: the actor's and each
            critic's own hidden layers (the default MLPs); ``None``: ``hidden_sizes``.
        activation: the default MLPs' activation between hidden layers (SB3's ``activation_fn``: 'relu', 'tanh',
            'elu', ... see ``alfish.networks.mlp.ACTIVATIONS``).
        actor_lr, critic_lr: Adam learning rates of the two parameter groups (numbers or schedules).
        gamma: discount per env step.
        target_update_tau: Polyak factor for the target actor and critics (1 = hard copy); number or schedule.
        target_update_period: target updates happen every ``target_update_period`` actor updates (so every
            ``policy_delay * target_update_period`` optimizer steps).
        exploration_noise: std of the Gaussian added to the actor's unit-box action in ``rollout_step`` (the sum is
            clipped to [-1, 1]); number or schedule.
        num_critics: critic ensemble size; the TD target takes the minimum over the target critics.
        target_policy_noise: std of the smoothing noise on the target action (0: none), unit-box units.
        target_noise_clip: the smoothing noise is clipped to [-target_noise_clip, target_noise_clip].
        policy_delay: optimizer steps per actor (and target) update.
        actor_network_ctor: ``ctor(observation_space, action_dim)`` -> the actor (``obs -> [N, action_dim]``, squashed
            by tanh here); ``None``: an MLP of ``hidden_sizes`` (through ``EncodingNetwork`` for images and dicts).
        critic_network_ctor: ``ctor(observation_space, action_dim)`` -> one critic (``(obs, action) -> [N, 1]``); the
            ``num_critics`` members are one ``VmapEnsemble``. ``None``: MLP critics of ``hidden_sizes``.
        update_order: ``'joint'`` (one step for actor and critics: the actor's loss reads the critic before the
            step) or ``'critic_first'`` (the actor's loss reads the critic after its step, as SB3 and the TD3
            authors' code; see the module docstring).
    """

    rollout_module_names = ("actor",)  # async unroll ships only these to its child

    @property
    def skips_parameters_in_some_updates(self) -> bool:
        # the delayed actor is left out of most updates; in the critic-first order out of the first one at least
        return self.policy_delay > 1 or self.update_order == "critic_first"

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Space,
                 hidden_sizes: Sequence[int] = (256, 256), actor_lr: float | Scheduler = 1e-3,
                 critic_lr: float | Scheduler = 1e-3, gamma: float = 0.99,
                 target_update_tau: float | Scheduler = 0.005, target_update_period: int = 1,
                 exploration_noise: float | Scheduler = 0.1, num_critics: int = 1,
                 target_policy_noise: float = 0.0, target_noise_clip: float = 0.5, policy_delay: int = 1,
                 actor_network_ctor: Optional[Callable[..., nn.Module]] = None,
                 critic_network_ctor: Optional[Callable[..., nn.Module]] = None,
                 actor_hidden_sizes: Optional[Sequence[int]] = None,
                 critic_hidden_sizes: Optional[Sequence[int]] = None, activation: str = "relu",
                 update_order: str = "joint"):
        super().__init__(observation_space, action_space)
        check_update_order(type(self).__name__, update_order, observation_space)
        if self.discrete:
            raise ValueError(f"{type(self).__name__} needs a Box action space, got {action_space}; use "
                             "DqnAlgorithm, PpoAlgorithm or A2cAlgorithm for discrete actions")
        if policy_delay < 1 or target_update_period < 1 or num_critics < 1:
            raise ValueError(f"policy_delay={policy_delay}, target_update_period={target_update_period} and "
                             f"num_critics={num_critics} must all be >= 1")
        self.use_networks(actor_network_ctor, critic_network_ctor)
        sizes = part_hidden_sizes(type(self).__name__, hidden_sizes,
                                  dict(actor=(actor_hidden_sizes, actor_network_ctor),
                                       critic=(critic_hidden_sizes, critic_network_ctor)))
        self.actor = self.build_network(actor_network_ctor, self.action_dim, sizes["actor"], activation)
        self.critics = self.build_critics(critic_network_ctor, num_critics, sizes["critic"], activation)
        self.target_actor = copy.deepcopy(self.actor).requires_grad_(False)
        self.target_critics = copy.deepcopy(self.critics).requires_grad_(False)
        self.gamma = gamma
        self.tau = as_scheduler(target_update_tau)
        self.exploration_noise = as_scheduler(exploration_noise)
        self.target_policy_noise, self.target_noise_clip = target_policy_noise, target_noise_clip
        self.policy_delay, self.target_update_period = policy_delay, target_update_period
        self._lrs = dict(actor=actor_lr, critic=critic_lr)
        self._init_update_order(update_order)  # (the kept batch's buffers, for 'critic_first')
        # Optimizer steps done: a buffer so checkpoints keep the delay's phase, mirrored by a Python int so the
        # delay and target decisions cost no host sync (set from the loaded tensor by load_state_dict).
        self._init_update_counter()

    def param_groups(self) -> list[dict]:
        return [dict(name="actor", params=list(self.actor.parameters()), lr=self._lrs["actor"]),
                dict(name="critic", params=list(self.critics.parameters()), lr=self._lrs["critic"])]

    # ----------------------------------------------------------------------------------------------------- acting --
    def _act(self, obs: torch.Tensor, greedy: bool) -> tuple[torch.Tensor, Any]:
        unit_action = torch.tanh(self.actor(self.network_input(obs)))
        if not greedy:
            noise = torch.randn_like(unit_action) * self.exploration_noise()
            unit_action = (unit_action + noise).clamp(-1.0, 1.0)
        return self.scale_action(unit_action), EMPTY

    def actor_due(self) -> bool:
        """Whether the coming optimizer step (the ``updates_done + 1``-th) is due to train the actor (in the
        ``'critic_first'`` order its term is built by the step after it)."""
        return self._actor_due

    def actor_trains(self) -> bool:
        """Whether the coming optimizer step's loss has the actor's term: the step the actor is due at (``'joint'``),
        or the one after it (``'critic_first'``), which moves the target networks too."""
        return self._actor_trains

    def _set_updates_done(self, count: int) -> None:
        # The delay's phase is kept as bools, set whenever the count changes: train_step branches on them, and
        # compiled updates (Learner.compile_mode) then keep two graphs, actor trained and not, where a branch on the
        # count itself would make dynamo guard on the count and recompile every update (until its recompile limit,
        # after which it silently runs eagerly).
        super()._set_updates_done(count)
        due = (count + 1) % self.policy_delay == 0
        if self.update_order == "critic_first":  # the step after a due one; none before the first due step
            trains = count >= self.policy_delay and count % self.policy_delay == 0
        else:
            trains = due
        self.__dict__["_actor_due"] = due  # (not nn.Module.__setattr__: see super)
        self.__dict__["_actor_trains"] = trains

    def smoothing_noise(self, like: torch.Tensor) -> torch.Tensor:
        """TD3's target policy smoothing: N(0, target_policy_noise) clipped to +-target_noise_clip."""
        return (torch.randn_like(like) * self.target_policy_noise).clamp_(-self.target_noise_clip,
                                                                          self.target_noise_clip)

    # --------------------------------------------------------------------------------------------------- training --
    def train_step(self, exp: Experience, state: Any = EMPTY) -> AlgStep:
        """Losses of the ``L-1`` transitions of ``exp`` ``[L, B]``, each ``[N = (L-1) * B]``."""
        obs = self.network_input(exp.observation, batch_dims=2)                # [L, B, obs_dim] (flat mode)
        obs_t, obs_next = self.steps(obs, slice(None, -1)), self.steps(obs, slice(1, None))   # [N, obs_dim]
        act_t = self.unscale_action(exp.action[:-1].flatten(0, 1))             # [N, action_dim]
        reward, discount = exp.reward[1:].flatten(), exp.discount[1:].flatten()

        with torch.no_grad():
            next_action = torch.tanh(self.target_actor(obs_next))
            if self.target_policy_noise > 0:
                next_action = next_action.add_(self.smoothing_noise(next_action)).clamp_(-1.0, 1.0)
            # amin, not min: no gradient here, so no argmin is needed
            next_q = self.target_critics(obs_next, next_action).amin(0).squeeze(-1)  # [N]
            td_target = torch.addcmul(reward, discount, next_q, value=self.gamma)  # r + gamma * discount * next_q

        q = self.critics(obs_t, act_t).squeeze(-1)                              # [E, N]
        td = q - td_target
        critic_loss = 0.5 * (td ** 2).sum(0)

        actor_valid = None  # (joint order: the actor's rows are this batch's)
        if self.actor_trains():  # the first critic scores the actor (TD3 paper; the only one for DDPG)
            actor_obs = obs_t
            if self.update_order == "critic_first":  # the batch kept by the previous step (module docstring)
                actor_obs, actor_valid = self._take_kept()
            new_action = torch.tanh(self.actor(actor_obs))
            # Only member 0 is evaluated: the other critics would cost a forward and a backward for nothing.
            q_new = self.critics(actor_obs, new_action, detach_params=True, members=slice(0, 1))
            actor_loss = -q_new.view(-1)
        else:
            actor_loss = torch.zeros_like(critic_loss)  # a factory: no graph, no detach needed
        if self.update_order == "critic_first" and self.actor_due():  # keep this batch for the next step's actor
            self._keep_for_actor(obs_t.detach(), self.valid_transitions(exp))
        td = td.detach()
        return AlgStep(info=DdpgTrainInfo(td.abs().mean(0), critic_loss, actor_loss, q.detach().mean(0), td_target,
                                          actor_valid))

    def calc_loss(self, exp: Experience, train_info: DdpgTrainInfo) -> LossInfo:
        """Per-transition loss ``[L-1, B]``; transitions out of a LAST step (env autoreset) are masked out."""
        shape = exp.step_type[:-1].shape                                         # [L-1, B]
        valid = self.valid_transitions(exp).to(train_info.critic_loss.dtype)    # [N]
        if train_info.actor_valid is None:
            loss = (train_info.critic_loss + train_info.actor_loss).mul_(valid)
        else:  # the actor's rows are the kept batch's, with its own mask
            loss = train_info.critic_loss * valid + train_info.actor_loss * train_info.actor_valid

        def extra() -> dict[str, torch.Tensor]:  # evaluated only when a summary is due
            terms = torch.stack([train_info.critic_loss, train_info.actor_loss, train_info.q]).detach()
            actor_valid = valid if train_info.actor_valid is None else train_info.actor_valid  # (its own rows)
            masks = torch.stack([valid, actor_valid, valid])
            means = (terms * masks).sum(-1) / masks.sum(-1).clamp(min=1.0)
            # actor_loss reads 0 on summaries that fall on a step where the delayed actor was not trained.
            out = dict(critic_loss=means[0], actor_loss=means[1], q_mean=means[2])
            if self.debug_summaries:  # TrainerConfig.debug_summaries: Q is the critics' mean per sample
                out.update(masked_stats("q", train_info.q, valid))
                out.update(masked_stats("td_target", train_info.td_target, valid))
            return out

        priority = (train_info.td_error * valid).view(shape).mean(0)  # [B]: mean |TD error| of each sequence
        return LossInfo(loss=loss.view(shape), extra=extra, priority=priority)

    def after_update(self) -> None:
        """Counts the optimizer step; on every ``policy_delay * target_update_period``-th step that trained the actor
        (``'critic_first'``: one step after the ``'joint'`` order's), Polyak-averages the target actor and critics
        towards the online ones."""
        trained_actor = self.actor_trains()
        count = self._count_update()
        if self.update_order == "critic_first":
            count -= 1  # the step the actor was due at
        if trained_actor and count % (self.policy_delay * self.target_update_period) == 0:
            tau = self.tau()
            polyak_update(self.target_actor, self.actor, tau)
            polyak_update(self.target_critics, self.critics, tau)


#: TD3's values of the three additions (Fujimoto et al. 2018); every other default is DDPG's.
TD3_DEFAULTS = dict(num_critics=2, target_policy_noise=0.2, policy_delay=2)


def with_defaults(function: Callable, defaults: dict[str, Any]) -> inspect.Signature:
    """``function``'s signature with other ``defaults`` for some of its parameters (a subclass constructor's)."""
    signature = inspect.signature(function)  # (through gin's wrapper to the function itself)
    return signature.replace(parameters=[p.replace(default=defaults.get(name, p.default))
                                         for name, p in signature.parameters.items()])


_TD3_SIGNATURE = with_defaults(DdpgAlgorithm.__init__, TD3_DEFAULTS)


@gin.configurable
class Td3Algorithm(DdpgAlgorithm):
    """TD3: ``DdpgAlgorithm`` with twin critics, target policy smoothing and delayed policy updates (paper values).

    All of ``DdpgAlgorithm``'s arguments apply; the defaults differ only in the three TD3 additions
    (``TD3_DEFAULTS``). The constructor's signature is DDPG's with those defaults (``__signature__``): gin reads it,
    so every ``Td3Algorithm.<DDPG parameter>`` binding is checked, used and recorded as DDPG's are.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        bound = _TD3_SIGNATURE.bind(self, *args, **kwargs)
        bound.apply_defaults()  # TD3's defaults, passed explicitly: no DdpgAlgorithm binding applies to a TD3
        super().__init__(*bound.args[1:], **bound.kwargs)

    __init__.__signature__ = _TD3_SIGNATURE  # what gin, help and the conf checks read


