"""Deep Q-Network (Mnih et al. 2015) with double Q-learning (van Hasselt et al. 2016) and n-step returns, Discrete
actions.

Each replay sample is a sequence ``[L = n_step + 1, B]`` (``TrainerConfig.mini_batch_length = n_step + 1``); the loss
is the TD error of the transition out of its first step against the n-step target of ``n_step_targets``. Exploration
is epsilon-greedy in ``rollout_step`` (epsilon a number or a schedule); ``predict_step`` is greedy and, with
``TrainerConfig.epsilon_greedy = e``, takes a uniformly random action with probability ``e`` (ALF's eval epsilon).
The target network is a copy of the Q-network that follows it every ``target_update_period`` optimizer steps by
Polyak averaging with ``target_update_tau`` (1 = hard copy).

Recurrent DQN (R2D2-style sequence replay): with ``encoding_network_ctor = @EncodingNetwork`` and
``EncodingNetwork.rnn = 'lstm'`` or ``'gru'`` the Q-network carries a state per env. With
``TrainerConfig.use_rollout_state=True`` the state each step was acted from is stored as its rollout info
(``DqnRolloutInfo``), and each sampled sequence starts from the stored state of its first step (zeros without it).
Both networks run over the sequence, the state reset at FIRST steps inside it; the first ``burn_in`` steps only warm
the state up (no gradient, no loss), and every later step with ``n_step`` successors in the sequence is trained
(``TrainerConfig.mini_batch_length >= burn_in + n_step + 1``).
"""
from __future__ import annotations

import copy
from typing import Any, Callable, NamedTuple, Optional, Sequence

import gin
import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from alfish.algorithms.base import OffPolicyAlgorithm, UpdateCounter
from alfish.algorithms.debug_stats import masked_stats
from alfish.data import nest
from alfish.data.state import is_empty
from alfish.data.types import EMPTY, AlgStep, Experience, LossInfo, StepType, TimeStep
from alfish.networks.distributions import uniform_where
from alfish.networks.heads import EncodedHead, build_encoder
from alfish.networks.mlp import polyak_update
from alfish.schedulers import Scheduler, TracedValue, as_scheduler


def n_step_targets(reward: torch.Tensor, discount: torch.Tensor, step_type: torch.Tensor,
                   bootstrap_value: torch.Tensor, gamma: float, n_step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n-step TD targets of the transitions out of step 0 of time-major sequences, and which are valid.

    Args:
        reward, discount, step_type: ``[L, B]`` with ``L >= n_step + 1``; ``reward[k]`` and ``discount[k]`` belong to
            the transition from step ``k-1`` into step ``k`` (``discount`` 0 at a termination, 1 at a truncation).
        bootstrap_value: ``[L, B]``, the value of step ``k``'s observation (e.g. ``Q_target(obs_k, a*)``); row 0 is
            not read.
        gamma: discount per step. n_step: number of rewards summed, ``>= 1``.

    Returns:
        ``(target [B], valid [B] bool)``, with ``e = min(n_step, first k >= 1 where step k is LAST)``::

            target = sum_{k=1..e} gamma^(k-1) * prod_{j<k} discount_j * reward_k
                     + gamma^e * prod_{j<=e} discount_j * bootstrap_value_e

        so an episode ending inside the window stops the sum there and bootstraps from its LAST step (not at all on a
        termination, where its discount is 0). ``valid`` is False where step 0 is LAST: the transition out of it (env
        autoreset) is not a real one; its target is still finite.
    """
    if n_step < 1:
        raise ValueError(f"n_step must be >= 1, got {n_step}")
    if reward.shape[0] < n_step + 1:
        raise ValueError(f"n_step_targets needs sequences of at least n_step + 1 = {n_step + 1} steps, got "
                         f"{reward.shape[0]}")
    target = _n_step_targets(reward, discount, step_type, bootstrap_value[1:n_step + 1], gamma, n_step)
    return target, step_type[0] != StepType.LAST


def _n_step_targets(reward: torch.Tensor, discount: torch.Tensor, step_type: torch.Tensor,
                    later_value: torch.Tensor, gamma: float, n_step: int) -> torch.Tensor:
    """``n_step_targets``' target ``[B]``, with ``later_value [n_step, B]`` the bootstrap values of steps
    ``1..n_step`` (``reward``, ``discount``, ``step_type``: ``[>= n_step + 1, B]``).

    With ``w_k = gamma^(k-1) prod_{j<k} discount_j`` while no step among ``1..k-1`` is LAST and 0 after, the target is
    ``sum_k w_k reward_k + sum_k c_k bootstrap_k``, ``c_k = w_k gamma discount_k`` on the step ``e`` where the window
    ends (LAST, or ``n_step``) and 0 elsewhere; ``w_{k+1} = c_k`` unless step k is LAST (then 0). Folding the
    ``alive`` mask into ``w`` (rather than masking every term with ``where``) makes it ~5 aten ops per step instead of
    12, and one ``addcmul`` for ``n_step = 1``, DQN's default (each op costs microseconds on the CPU).
    """
    if n_step == 1:  # r_1 + gamma * discount_1 * bootstrap_1: no LAST can cut a one-step window
        return torch.addcmul(reward[1], discount[1], later_value[0], value=gamma)
    gamma_discount = discount[1:n_step + 1] * gamma                            # [n, B]
    ends = (step_type[1:n_step] == StepType.LAST).to(reward.dtype)           # [n-1, B]: 1 where step k is LAST
    target, weight = reward[1], None                                         # w_1 = 1
    for k in range(1, n_step + 1):
        if weight is not None:
            target = torch.addcmul(target, weight, reward[k])
        carried = gamma_discount[k - 1] if weight is None else weight * gamma_discount[k - 1]   # w_k gamma d_k
        if k == n_step:                                                      # the window ends here in any case
            return torch.addcmul(target, carried, later_value[k - 1])
        bootstrap = carried * ends[k - 1]                                    # c_k: nonzero where step k is LAST
        target = torch.addcmul(target, bootstrap, later_value[k - 1])
        weight = carried - bootstrap                                         # w_{k+1}
    raise AssertionError("unreachable")


class DqnTrainInfo(NamedTuple):
    q: torch.Tensor          # [B], Q(obs_0, action_0), with gradient ([L', B] for a recurrent Q-network)
    target: torch.Tensor     # [B], n-step target, no gradient
    valid: torch.Tensor      # [B] bool, step 0 is not LAST


class DqnRolloutInfo(NamedTuple):
    state: Any  # [B, ...], the recurrent state the step was acted from (recurrent DQN with use_rollout_state)


@gin.configurable
class DqnAlgorithm(UpdateCounter, OffPolicyAlgorithm):
    """DQN / double DQN with n-step returns.

    Args:
        hidden_sizes, activation: the Q-network's MLP.
        lr: Adam learning rate of the Q-network (number or schedule).
        gamma: discount per env step.
        n_step: rewards summed before bootstrapping; needs ``TrainerConfig.mini_batch_length = n_step + 1``.
        double_q: pick the bootstrap action with the online network and value it with the target network (else
            both with the target network).
        target_update_period: optimizer steps between target-network updates.
        target_update_tau: Polyak factor of a target update (1 = hard copy); number or schedule.
        epsilon_greedy: probability of a uniformly random action in ``rollout_step``; number or schedule.
        huber_loss: smooth L1 (delta 1) on the TD error; False: squared error / 2.
        q_network_cls: ``cls(observation_space, num_actions)`` -> the Q-network (``obs -> [N, num_actions]``);
            ``None``: an MLP of ``hidden_sizes`` (through ``EncodingNetwork`` for images and dicts).
        encoding_network_ctor: ``ctor(observation_space)`` -> an encoder (``EncodingNetwork``, which may be
            recurrent) under an MLP head of ``hidden_sizes``; exclusive with ``q_network_cls``.
        burn_in: recurrent Q-network only: steps at the start of each sampled sequence that only warm the state up.
    """

    rollout_module_names = ("q_net",)  # async unroll ships only these to its child

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Space,
                 hidden_sizes: Sequence[int] = (64, 64), activation: str = "relu", lr: float | Scheduler = 1e-3,
                 gamma: float = 0.99, n_step: int = 1, double_q: bool = True, target_update_period: int = 100,
                 target_update_tau: float | Scheduler = 1.0, epsilon_greedy: float | Scheduler = 0.1,
                 huber_loss: bool = True, q_network_cls: Optional[Callable[..., nn.Module]] = None,
                 encoding_network_ctor: Optional[Callable[..., nn.Module]] = None, burn_in: int = 0):
        super().__init__(observation_space, action_space)
        if not self.discrete:
            raise ValueError(f"DqnAlgorithm needs a Discrete action space, got {action_space}; use SacAlgorithm for "
                             "Box actions")
        if n_step < 1:
            raise ValueError(f"DqnAlgorithm.n_step={n_step} must be >= 1")
        if target_update_period < 1:
            raise ValueError(f"DqnAlgorithm.target_update_period={target_update_period} must be >= 1")
        if burn_in < 0:
            raise ValueError(f"DqnAlgorithm.burn_in={burn_in} must be >= 0")
        if encoding_network_ctor is not None and q_network_cls is not None:
            raise ValueError("DqnAlgorithm.encoding_network_ctor and q_network_cls are exclusive; give one")
        self.use_networks(q_network_cls)
        if encoding_network_ctor is not None:
            encoder = build_encoder(encoding_network_ctor, self.encoder_space(), allow_recurrent=True)
            self.q_net = EncodedHead(encoder, self.num_actions, hidden_sizes, activation)
        else:
            self.q_net = self.build_network(q_network_cls, self.num_actions, hidden_sizes, activation)
        self.burn_in = burn_in
        if burn_in and not self.recurrent:
            raise ValueError(f"DqnAlgorithm.burn_in={burn_in} warms up a recurrent state; this Q-network has none "
                             "(set EncodingNetwork.rnn and DqnAlgorithm.encoding_network_ctor, or burn_in = 0)")
        self.target_q_net = copy.deepcopy(self.q_net).requires_grad_(False)
        self.lr = lr
        self.gamma = gamma
        self.n_step = n_step
        self.double_q = double_q
        self.target_update_period = target_update_period
        self.tau = as_scheduler(target_update_tau)
        self.epsilon = TracedValue(epsilon_greedy)  # a float when acting; its summary term is built in the loss
        self.huber_loss = huber_loss
        self._init_update_counter()  # the num_updates buffer, mirrored by a Python int (no sync in after_update)

    def param_groups(self) -> list[dict]:
        return [dict(name="q", params=list(self.q_net.parameters()), lr=self.lr)]

    @property
    def recurrent(self) -> bool:
        return bool(getattr(self.q_net, "recurrent", False))

    def initial_state(self, batch_size: int, device: Optional[torch.device] = None) -> Any:
        return self.q_net.initial_state(batch_size, device) if self.recurrent else EMPTY

    def _q_step(self, time_step: TimeStep, state: Any) -> tuple[torch.Tensor, Any, Any]:
        """``(Q [B, A], next state, the state acted from)`` of a recurrent Q-network."""
        if is_empty(state):  # a caller without a state: an episode's start
            state = self.initial_state(time_step.step_type.shape[0], time_step.step_type.device)
        q, next_state = self.q_net(self.network_input(time_step.observation), state)
        return q, next_state, state

    # ----------------------------------------------------------------------------------------------------- acting --
    def _act(self, obs: torch.Tensor, greedy: bool) -> tuple[torch.Tensor, Any]:
        """Greedy action ``[B]`` (int64), or the epsilon-greedy exploration action when not ``greedy``."""
        action = self.q_net(self.network_input(obs)).argmax(-1)
        return (action if greedy else uniform_where(action, self.num_actions, self.epsilon())), EMPTY

    def predict_step(self, time_step: TimeStep, state: Any = EMPTY, epsilon_greedy: float = 0.0) -> AlgStep:
        """Greedy; with probability ``epsilon_greedy`` per env a uniformly random action (not the exploration
        epsilon's action)."""
        if self.recurrent:
            q, state, _ = self._q_step(time_step, state)
            return AlgStep(output=uniform_where(q.argmax(-1), self.num_actions, epsilon_greedy), state=state)
        action, _ = self._act(time_step.observation, greedy=True)
        return AlgStep(output=uniform_where(action, self.num_actions, epsilon_greedy), state=state)

    def rollout_step(self, time_step: TimeStep, state: Any = EMPTY) -> AlgStep:
        if not self.recurrent:
            return super().rollout_step(time_step, state)
        q, next_state, state = self._q_step(time_step, state)
        info = DqnRolloutInfo(state) if self.use_rollout_state else EMPTY
        action = uniform_where(q.argmax(-1), self.num_actions, self.epsilon())
        return AlgStep(output=action, state=next_state, info=info)

    # --------------------------------------------------------------------------------------------------- training --
    def train_step(self, exp: Experience, state: Any = EMPTY) -> AlgStep:
        """Q-value and n-step target of the transition out of step 0 of each sequence of ``exp`` ``[n_step+1, B]``
        (recurrent: of every step after ``burn_in`` that has ``n_step`` successors, ``[L', B]``)."""
        if self.recurrent:
            return self._recurrent_train_step(exp)
        length = exp.step_type.shape[0]
        if length != self.n_step + 1:
            raise ValueError(f"DqnAlgorithm with n_step={self.n_step} trains on sequences of n_step + 1 = "
                             f"{self.n_step + 1} steps, got {length}; set TrainerConfig.mini_batch_length = "
                             f"{self.n_step + 1}")
        obs = self.network_input(exp.observation, batch_dims=2)                 # [L, B, obs_dim] (flat mode)
        with torch.no_grad():
            later = self.steps(obs, slice(1, None))                              # [n * B, obs_dim]: 2-D matmuls
            target_q = self.target_q_net(later)                                  # [n * B, A]
            chooser = self.q_net(later) if self.double_q else target_q
            value = target_q.gather(-1, chooser.argmax(-1, keepdim=True)).view(self.n_step, -1)   # [n, B]
            target = _n_step_targets(exp.reward, exp.discount, exp.step_type, value, self.gamma, self.n_step)
        valid = exp.step_type[0] != StepType.LAST
        q = self.q_net(self.step_at(obs, 0)).gather(-1, exp.action[0].long().unsqueeze(-1)).squeeze(-1)  # [B]
        return AlgStep(info=DqnTrainInfo(q, target, valid))

    def _recurrent_train_step(self, exp: Experience) -> AlgStep:
        length, batch = exp.step_type.shape[:2]
        first, last = self.burn_in, length - self.n_step  # trained steps: first .. last - 1
        if last <= first:
            raise ValueError(f"recurrent DqnAlgorithm with burn_in={self.burn_in} and n_step={self.n_step} trains on "
                             f"sequences of at least burn_in + n_step + 1 = {self.burn_in + self.n_step + 1} steps, "
                             f"got {length}; set TrainerConfig.mini_batch_length")
        if self.use_rollout_state:
            start = nest.map_nest(lambda x: x[0], exp.rollout_info.state)
        else:
            start = self.initial_state(batch, exp.step_type.device)
        obs = self.network_input(exp.observation, batch_dims=2)                 # [L, B, ...]
        step_type = exp.step_type
        with torch.no_grad():
            target_q, _ = self.target_q_net.unroll(obs, step_type, start)       # [L, B, A]
            state = start
            if first:  # burn-in: the state is warmed up without gradients
                _, state = self.q_net.unroll(self.step_slice(obs, slice(0, first)), step_type[:first], start)
        q_after, _ = self.q_net.unroll(self.step_slice(obs, slice(first, None)), step_type[first:], state)
        with torch.no_grad():
            chooser = q_after.detach() if self.double_q else target_q[first:]
            value = target_q[first:].gather(-1, chooser.argmax(-1, keepdim=True)).squeeze(-1)  # [L - first, B]
            targets = [_n_step_targets(exp.reward[t:], exp.discount[t:], step_type[t:],
                                       value[t - first + 1:t - first + 1 + self.n_step], self.gamma, self.n_step)
                       for t in range(first, last)]
            target = torch.stack(targets)                                         # [L', B]
        q = q_after[:last - first].gather(-1, exp.action[first:last].long().unsqueeze(-1)).squeeze(-1)   # [L', B]
        return AlgStep(info=DqnTrainInfo(q, target, step_type[first:last] != StepType.LAST))

    def calc_loss(self, exp: Experience, train_info: DqnTrainInfo) -> LossInfo:
        """Per-sample loss ``[1, B]`` (sequences starting at a LAST step are masked out); priority ``|TD error|``."""
        q, target = train_info.q, train_info.target
        if self.huber_loss:
            per_sample = F.smooth_l1_loss(q, target, reduction="none", beta=1.0)
            abs_td = (q.detach() - target).abs_()  # for the priority only: no graph
        else:
            td = q - target
            per_sample = 0.5 * td ** 2
            abs_td = td.detach().abs()  # not in place: the square's backward reads td
        valid = train_info.valid.to(per_sample.dtype)
        loss = per_sample * valid

        def extra() -> dict[str, torch.Tensor]:  # evaluated only when a summary is due
            count = valid.sum().clamp(min=1.0)
            out = dict(td_loss=loss.detach().sum() / count,
                       q_mean=(q.detach() * valid).sum() / count,
                       epsilon=self.epsilon.tensor_value(valid.device))
            if self.debug_summaries:  # TrainerConfig.debug_summaries: Q(obs_0, action_0) and its n-step target
                out.update(masked_stats("q", q, valid))
                out.update(masked_stats("td_target", target, valid))
            return out

        priority = abs_td.mul_(valid)
        if loss.dim() == 2:  # a recurrent Q-network's [L', B]: R2D2's priority, 0.9 max + 0.1 mean over time
            return LossInfo(loss=loss, extra=extra, priority=0.9 * priority.amax(0) + 0.1 * priority.mean(0))
        return LossInfo(loss=loss.unsqueeze(0), extra=extra, priority=priority)

    def after_update(self) -> None:
        """Counts the optimizer step; on every ``target_update_period``-th, Polyak-averages the target network
        towards the Q-network. The period is decided on the Python mirror of the count: no host sync."""
        if self._count_update() % self.target_update_period == 0:
            polyak_update(self.target_q_net, self.q_net, self.tau())

    def fixed_updates_ahead(self) -> int:
        """The updates until the next target update (its loss reads the target network, fixed until then; no random
        numbers); 0 for a recurrent Q-network (not scanned: its unroll over the sequence is not written for it)."""
        if self.recurrent:
            return 0
        return self.target_update_period - self.updates_done % self.target_update_period
