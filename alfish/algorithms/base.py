"""The algorithm contract (DESIGN.md §3.1–3.3).

An algorithm is an ``nn.Module`` that turns time steps into actions and experience into a loss. Everything else
(optimizers, replay ownership, checkpointing, summaries, the training loop) belongs to the trainer.

Call order, per iteration:
    rollout_step(time_step, state)     -> AlgStep(output=action [B, ...], state=next state,
                                              info=rollout_info [B, ...])                              (unrolling)
    preprocess_experience(exp [B, T])   -> Experience [B, T']   (whole-buffer training only, e.g. PPO's GAE)
    train_step(exp [L, B])              -> AlgStep(info=train_info)                                      (off-policy)
    calc_loss(exp [L, B], train_info)   -> LossInfo(loss=per-sample [L', B], extra={name: term})
    after_update()                      after each optimizer step (target networks)
    after_train_iter()                  once per iteration
and ``predict_step(time_step, state, epsilon_greedy)`` for evaluation and play.

Recurrent algorithms (``recurrent`` True) have a state per env: whoever steps an env (the Unroller, the Evaluator,
play) starts it at ``initial_state(B)``, passes it to ``rollout_step``/``predict_step``, keeps the returned
``AlgStep.state`` for the next step, and resets it to the initial state at every FIRST step (``reset_state``).
Stateless algorithms have ``EMPTY`` states and pay nothing.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from alfish.data import nest
from alfish.data.state import is_empty, reset_state_at_first  # noqa: F401  (re-exported)
from alfish.data.types import EMPTY, AlgStep, Experience, LossInfo, TimeStep
from alfish.envs.contract import one_line
from alfish.envs.mixed_actions import MixedActionBox
from alfish.envs.spec import MULTI_ACTION_SPACES
from alfish.errors import OneLineValueError
from alfish.networks.encoding import is_flat_space
from alfish.networks.ensemble import EnsembleCritic, VmapEnsemble
from alfish.networks.heads import CriticNetwork, FeedForwardNetwork, refuse_overridden_bindings
from alfish.networks.mlp import MLP


class Algorithm(nn.Module):
    """Base of all algorithms: the narrow contract above, with do-nothing defaults where one makes sense."""

    #: True for algorithms that train on the trajectory they just unrolled (with gradients), e.g. A2C.
    on_policy: bool = False
    #: Submodules ``rollout_step`` reads (e.g. ``("actor",)``); async unroll ships only their tensors to its child
    #: process. ``None``: all of the algorithm's state.
    rollout_module_names: Optional[tuple[str, ...]] = None
    #: True when some updates leave parameters out of the loss (TD3's delayed actor); DDP must then look for them.
    skips_parameters_in_some_updates: bool = False
    #: SB3's early stop of an iteration's epochs (whole-buffer training, ``approx_kl(exp)`` above ``1.5 *
    #: target_kl``); ``None``: no check. PPO sets it from ``PpoAlgorithm.target_kl``.
    target_kl: Optional[float] = None
    #: True when the loss takes the stored data as acted by the parameters being trained (PPO: its ratio to the
    #: stored log-probabilities, GAE from the stored values); replay learners (SAC, DQN, TD3) learn off-policy and
    #: need nothing. Such an algorithm trains from an asynchronous unroll (older parameters act) only with an
    #: ``off_policy_correction``.
    assumes_own_data: bool = False
    #: How training corrects for data acted by older parameters than the ones it trains: ``'vtrace'``
    #: (``alfish.losses.vtrace``); ``None``: none.
    off_policy_correction: Optional[str] = None
    #: Add ``debug/...`` statistics (``alfish.algorithms.debug_stats``) to ``calc_loss``'s lazy terms; the trainer sets
    #: it from ``TrainerConfig.debug_summaries`` at assembly. Read only when the terms are evaluated (a summary).
    debug_summaries: bool = False

    #: Set by ``configure_recurrence`` (TrainerConfig.use_rollout_state): store the rollout state with the experience
    #: and start training sequences from it (else from ``initial_state``).
    use_rollout_state: bool = False
    #: Set by ``configure_recurrence`` (TrainerConfig.temporally_independent_train_step, resolved): False: train_step
    #: runs over each sequence step by step, carrying the state.
    temporally_independent_train_step: bool = True
    #: Whether a recurrent network of this algorithm can also train each step alone from its stored rollout state
    #: (``temporally_independent_train_step=True``); sequence-replay algorithms (DQN, SAC) train whole sequences only.
    trains_recurrent_steps_alone: bool = False

    @property
    def recurrent(self) -> bool:
        """Whether the algorithm has a recurrent (per-env) state."""
        return False

    def initial_state(self, batch_size: int, device: Optional[torch.device] = None) -> Any:
        """The state at an episode's start, for ``batch_size`` envs; ``EMPTY`` for stateless algorithms."""
        return EMPTY

    def reset_state(self, state: Any, step_type: torch.Tensor) -> Any:
        """``state`` with the envs at a FIRST step (``step_type [B]``) set back to ``initial_state``."""
        return reset_state_at_first(state, step_type, self.initial_state)

    def exploration_state(self) -> Any:
        """Acting state kept inside the algorithm between env steps (not parameters, not the recurrent state), e.g.
        gSDE's per-env noise matrices: tensors (or None) that a checkpoint's collector state stores so that a resumed
        run acts exactly as the uninterrupted one. None: nothing."""
        return None

    def load_exploration_state(self, state: Any) -> None:
        """Put back what ``exploration_state`` returned."""

    def configure_recurrence(self, use_rollout_state: bool, temporally_independent_train_step: Optional[bool],
                             mini_batch_length: Optional[int] = None) -> None:
        """Applies TrainerConfig's ``use_rollout_state`` and ``temporally_independent_train_step`` (None: False for a
        recurrent algorithm, True otherwise); refuses combinations that cannot train a recurrent state."""
        name = type(self).__name__
        independent = (not self.recurrent) if temporally_independent_train_step is None else \
            temporally_independent_train_step
        if self.recurrent and independent and not self.trains_recurrent_steps_alone:
            raise ValueError(f"{name} trains its recurrent network over whole sequences (burn-in, then every step "
                             "from the state carried along), so TrainerConfig.temporally_independent_train_step=True "
                             "would change nothing: leave it None (or False)")
        if self.recurrent and independent and not use_rollout_state:
            raise ValueError(f"{name} is recurrent and TrainerConfig.temporally_independent_train_step=True trains "
                             "each step alone, which needs its rollout state: set TrainerConfig.use_rollout_state=True "
                             "or temporally_independent_train_step=None")
        if self.recurrent and not independent and not use_rollout_state and (mini_batch_length or 1) <= 1:
            raise ValueError(f"{name} is recurrent, but TrainerConfig.mini_batch_length={mini_batch_length} gives "
                             "sequences of one step that would all start from the zero state: set mini_batch_length "
                             "to the unroll length (or chunks of it) or TrainerConfig.use_rollout_state=True")
        if not self.recurrent and not independent:
            raise ValueError(f"TrainerConfig.temporally_independent_train_step=False needs a recurrent algorithm; "
                             f"{name} has no recurrent state (e.g. set EncodingNetwork.rnn='lstm' for a network that "
                             "has one)")
        self.use_rollout_state = bool(use_rollout_state) and self.recurrent
        self.temporally_independent_train_step = independent

    def predict_step(self, time_step: TimeStep, state: Any = EMPTY, epsilon_greedy: float = 0.0) -> AlgStep:
        raise NotImplementedError

    def rollout_step(self, time_step: TimeStep, state: Any = EMPTY) -> AlgStep:
        raise NotImplementedError

    def train_step(self, exp: Experience, state: Any = EMPTY) -> AlgStep:
        raise NotImplementedError

    def calc_loss(self, exp: Experience, train_info: Any) -> LossInfo:
        raise NotImplementedError

    def preprocess_experience(self, exp: Experience) -> Experience:
        """Whole-buffer hook on batch-major ``[B, T]`` experience; default: unchanged."""
        return exp

    def before_update(self, batch: Any) -> None:
        """Called eagerly before every update (``Learner.update``), outside any compiled region, with its batch (an
        ``Experience`` ``[L, B]`` or a ``HybridBatch``): where an algorithm allocates the state its update writes and
        keeps across updates. Memory allocated inside a compiled update with CUDA graphs (``'reduce-overhead'``)
        belongs to the graph, and its next replay overwrites it. Default: nothing."""

    def after_update(self) -> None:
        """Called after every optimizer step."""

    def fixed_updates_ahead(self) -> int:
        """How many coming updates (from the next one) may run as one compiled scan (``Learner.scan_updates``): their
        losses read nothing but the batch, the parameters the optimizer trains and values fixed over them (no
        ``after_update`` among them changes what a loss reads), every trained parameter is reached by every loss,
        and no random numbers are drawn. The default, 0, says this algorithm's updates never qualify (and
        ``scan_updates=True`` is refused for it)."""
        return 0

    def replay_refusal(self, prioritized: bool, offline: bool) -> Optional[str]:
        """Why this algorithm (as configured) cannot train from prioritized replay or with offline data mixed in, as
        one line saying what to change; None (the default): it can. Checked at build."""
        return None

    def after_train_iter(self) -> None:
        """Called once per training iteration."""

    def param_groups(self) -> list[dict]:
        """Parameter groups for the trainer's optimizer, each ``{'params': [...], 'lr': ..., 'name': ...}``."""
        raise NotImplementedError


class RLAlgorithm(Algorithm):
    """An algorithm acting in an env with Box (or dict-of-Box) observations and Box or Discrete actions (and
    MultiDiscrete / MultiBinary actions where the subclass sets ``drives_multi_actions``).

    Action attributes: ``action_kind`` (``'box' | 'discrete' | 'multi_discrete' | 'multi_binary' | 'mixed'``);
    ``discrete`` (True for a Discrete only); ``num_actions`` (Discrete, mixed: ``n``); ``action_dim`` (Box: the
    flattened size; Discrete: 1; Multi*: ``k``, the number of sub-actions; mixed: the Box part's size ``d``, the packed
    action being ``[1 + d]``); ``action_nvec`` (MultiDiscrete: the choices per sub-action, a tuple of ``k`` ints);
    ``action_low`` / ``action_high`` (Box, mixed's Box part: the bounds ``[action_dim]``).

    What its networks see (``network_input``), decided once by ``use_networks``:
      - flat mode, when the observation is a vector (or a dict of vectors) and no network constructor was given: the
        default MLPs over flat float observations ``[*batch, obs_dim]`` (``flat_obs``; a dict observation is the
        concatenation of its fields in the space's key order). The fastest path for vector envs.
      - raw mode otherwise (images, a user's network): observations in their own shape and dtype (uint8 images stay
        uint8, dicts stay dicts); the default networks encode them with ``EncodingNetwork``.

    Subclasses implement ``_act(obs, greedy) -> (action, info)``; the epsilon-greedy mix of greedy and sampled actions
    used by ``predict_step`` lives here once.
    """

    #: Whether the policy can drive MultiDiscrete / MultiBinary actions (one categorical / Bernoulli per sub-action);
    #: the others refuse those spaces when built.
    drives_multi_actions: bool = False
    #: Whether the policy can drive a mixed action (a Tuple or Dict of one Discrete and one Box part, which reaches
    #: the algorithm packed: ``alfish.envs.mixed_actions.MixedActionBox``); the others refuse it when built.
    drives_mixed_actions: bool = False

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Space):
        super().__init__()
        self.observation_space = observation_space
        self.action_space = action_space
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self._obs_keys = list(observation_space.spaces) if isinstance(observation_space, gym.spaces.Dict) else None
        self.obs_dim = int(gym.spaces.flatdim(observation_space))
        self.action_kind = "discrete" if self.discrete else "box"
        if self.discrete:
            self.num_actions = int(action_space.n)
            self.action_dim = 1
        elif isinstance(action_space, MULTI_ACTION_SPACES):
            self._use_multi_action_space(action_space)
        elif isinstance(action_space, MixedActionBox):
            self._use_mixed_action_space(action_space)
        else:
            self.action_dim = int(torch.tensor(action_space.shape).prod())
            low = torch.as_tensor(action_space.low, dtype=torch.float32).reshape(-1)
            high = torch.as_tensor(action_space.high, dtype=torch.float32).reshape(-1)
            if not (torch.isfinite(low).all() and torch.isfinite(high).all()):
                raise ValueError(f"action space {action_space} has infinite bounds; alfish needs bounded Box actions")
            self.register_buffer("action_low", low, persistent=False)
            self.register_buffer("action_high", high, persistent=False)

    def _use_multi_action_space(self, action_space: gym.Space) -> None:
        """Sets the action attributes (class docstring) of a MultiDiscrete / MultiBinary ``action_space``, or refuses
        it in one line when this algorithm cannot drive it."""
        if not self.drives_multi_actions:
            raise OneLineValueError(f"{type(self).__name__} cannot drive {type(action_space).__name__} actions "
                                    f"({one_line(action_space)}); PpoAlgorithm and A2cAlgorithm can (one categorical "
                                    "or Bernoulli per sub-action)")
        if len(action_space.shape) != 1:
            raise OneLineValueError(f"{type(self).__name__} drives {type(action_space).__name__} actions of one "
                                    f"dimension, got {one_line(action_space)} of shape {action_space.shape}")
        self.action_dim = int(action_space.shape[0])
        if isinstance(action_space, gym.spaces.MultiBinary):
            self.action_kind = "multi_binary"
        else:
            self.action_kind = "multi_discrete"
            self.action_nvec = tuple(int(n) for n in action_space.nvec)

    def _use_mixed_action_space(self, action_space: MixedActionBox) -> None:
        """Sets the action attributes of a mixed action (a Discrete and a Box, packed: ``alfish.envs.mixed_actions``):
        ``num_actions`` (the Discrete's ``n``), ``action_dim`` and the bounds of the Box part; or refuses it in one line
        when this algorithm cannot drive it."""
        if not self.drives_mixed_actions:
            space = one_line(action_space.original)
            raise OneLineValueError(f"{type(self).__name__} cannot drive mixed actions ({space}); SacAlgorithm can "
                                    "(one Discrete and one Box part)")
        self.action_kind = "mixed"
        self.num_actions = action_space.num_choices
        box = action_space.box_space
        self.action_dim = int(np.prod(box.shape))
        self.register_buffer("action_low", torch.as_tensor(box.low, dtype=torch.float32).reshape(-1), persistent=False)
        self.register_buffer("action_high", torch.as_tensor(box.high, dtype=torch.float32).reshape(-1),
                             persistent=False)

    # --- networks: built from gin constructors, or the defaults sized by hidden_sizes -------------------------------
    def use_networks(self, *network_ctors: Optional[Callable[..., nn.Module]]) -> None:
        """Decides flat or raw mode (class docstring) from the algorithm's network constructors (``None``: default)."""
        self.raw_observations = any(c is not None for c in network_ctors) or not is_flat_space(self.observation_space)

    def build_network(self, ctor: Optional[Callable[..., nn.Module]], output_dim: int, hidden_sizes: Sequence[int],
                      activation: str = "relu", output_gain: Optional[float] = None) -> nn.Module:
        """``obs -> [N, output_dim]``: ``ctor(observation_space, output_dim)``, or the default: an MLP (flat mode) or a
        ``FeedForwardNetwork`` (raw mode) with ``hidden_sizes`` and ``activation``."""
        if ctor is not None:
            return ctor(self.observation_space, output_dim)
        if not self.raw_observations:
            return MLP(self.obs_dim, output_dim, hidden_sizes, activation, output_gain)
        refuse_overridden_bindings("FeedForwardNetwork", ("hidden_sizes", "activation", "output_gain"),
                                   type(self).__name__)
        return FeedForwardNetwork(self.observation_space, output_dim, hidden_sizes, activation,
                                  output_gain=output_gain)

    def encoder_space(self) -> gym.Space:
        """What an encoder over ``network_input`` reads: the observation space in raw mode, a flat float Box of
        ``obs_dim`` in flat mode."""
        if self.raw_observations:
            return self.observation_space
        return gym.spaces.Box(-float("inf"), float("inf"), shape=(self.obs_dim,), dtype=np.float32)

    def build_critics(self, ctor: Optional[Callable[..., nn.Module]], num_critics: int,
                      hidden_sizes: Sequence[int], activation: str = "relu") -> nn.Module:
        """An ensemble of ``num_critics`` critics ``(obs, action) -> [E, N, 1]``, one batched computation: an
        ``EnsembleCritic`` (flat mode, default MLPs), else a ``VmapEnsemble`` of ``ctor(observation_space,
        action_dim)`` (default ``CriticNetwork`` with ``hidden_sizes`` and ``activation``)."""
        if ctor is None and not self.raw_observations:
            return EnsembleCritic(num_critics, self.obs_dim + self.action_dim, 1, hidden_sizes, activation)
        if ctor is None:
            refuse_overridden_bindings("CriticNetwork", ("hidden_sizes", "activation"), type(self).__name__)
        make = ctor or functools.partial(CriticNetwork, hidden_sizes=hidden_sizes, activation=activation)
        return VmapEnsemble(lambda: make(self.observation_space, self.action_dim), num_critics)

    def network_input(self, obs: Any, batch_dims: int = 1) -> Any:
        """What the networks read: ``flat_obs`` in flat mode, ``obs`` itself (``[*batch, *obs]``) in raw mode."""
        return obs if self.raw_observations else self.flat_obs(obs, batch_dims)

    @staticmethod
    def steps(obs: Any, index: slice) -> Any:
        """Time steps ``index`` of time-major ``[L, B, ...]`` observations (a tensor or a dict), batch flattened:
        ``[L', B, ...] -> [L' * B, ...]``."""
        if isinstance(obs, torch.Tensor):
            return obs[index].flatten(0, 1)
        return nest.map_nest(lambda x: x[index].flatten(0, 1), obs)

    @staticmethod
    def step_slice(obs: Any, index: slice) -> Any:
        """Time steps ``index`` of time-major observations (a tensor or a dict), kept ``[L', B, ...]``."""
        return obs[index] if isinstance(obs, torch.Tensor) else nest.map_nest(lambda x: x[index], obs)

    @staticmethod
    def step_at(obs: Any, t: int) -> Any:
        """Time step ``t`` of time-major ``[L, B, ...]`` observations (a tensor or a dict): ``[B, ...]``."""
        return obs[t] if isinstance(obs, torch.Tensor) else nest.map_nest(lambda x: x[t], obs)

    def _act(self, obs: torch.Tensor, greedy: bool) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    def predict_step(self, time_step: TimeStep, state: Any = EMPTY, epsilon_greedy: float = 0.0) -> AlgStep:
        """Greedy action, except that each env samples from the policy with probability ``epsilon_greedy``."""
        greedy, _ = self._act(time_step.observation, greedy=True)
        if epsilon_greedy > 0.0:
            sampled, _ = self._act(time_step.observation, greedy=False)
            pick = torch.rand(greedy.shape[0], device=greedy.device) < epsilon_greedy
            greedy = torch.where(pick.view((-1,) + (1,) * (greedy.dim() - 1)), sampled, greedy)
        return AlgStep(output=greedy, state=state)

    def rollout_step(self, time_step: TimeStep, state: Any = EMPTY) -> AlgStep:
        action, info = self._act(time_step.observation, greedy=False)
        return AlgStep(output=action, state=state, info=info)

    # --- action scaling for Box actions: networks work in [-1, 1], envs in [low, high] -------------------------------
    def scale_action(self, unit_action: torch.Tensor) -> torch.Tensor:
        """``[*, action_dim]`` in [-1, 1] -> [low, high]: ``low + (unit + 1) (high - low) / 2``, in one op."""
        mid, half_range, _, _ = self._action_affine()
        return torch.addcmul(mid, unit_action, half_range)

    def unscale_action(self, env_action: torch.Tensor) -> torch.Tensor:
        """``[*, action_dim]`` in [low, high] -> [-1, 1]: ``2 (a - low) / (high - low) - 1``, in one op."""
        _, _, offset, inv_half_range = self._action_affine()
        return torch.addcmul(offset, env_action, inv_half_range)

    def _action_affine(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(mid, half_range, -mid / half_range, 1 / half_range)`` of the action bounds, each ``[action_dim]``.

        Computed once per bounds tensors rather than on every call (five aten ops a call otherwise, each costing
        more than the arithmetic); ``.to(device)`` replaces the bound buffers, which recomputes them there. (Bounds
        overwritten in place would not be seen: nothing in alfish does that.) Same values as the textbook formulas up
        to float rounding.

        Inside a compiled region the maps are computed in the graph and never cached: a cache filled there would hold
        the graph's outputs, which with CUDA graphs (``'reduce-overhead'``) live in the graph's memory and are
        overwritten by the next replay (found on an H200: TD3's compiled update failed at its second graph when its
        first update was the first call).
        """
        low, high = self.action_low, self.action_high
        if torch.compiler.is_compiling():
            return _affine_maps(low, high)
        cache = self.__dict__.get("_action_affine_cache")
        if cache is None or cache[0] is not low or cache[1] is not high:
            cache = (low, high, _affine_maps(low, high))
            self.__dict__["_action_affine_cache"] = cache
        return cache[2]

    def flat_obs(self, obs: torch.Tensor, batch_dims: int = 1) -> torch.Tensor:
        """``[*batch, *obs_shape] -> [*batch, obs_dim]`` float32 (dict fields concatenated in key order).

        An observation already of that shape and dtype is returned as it is (no reshape or cast op).
        """
        if self._obs_keys is not None:
            parts = [obs[k].reshape(obs[k].shape[:batch_dims] + (-1,)) for k in self._obs_keys]
            flat = torch.cat(parts, dim=-1)
        elif obs.dim() == batch_dims + 1 and obs.shape[-1] == self.obs_dim:
            flat = obs
        else:
            flat = obs.reshape(obs.shape[:batch_dims] + (self.obs_dim,))
        return flat if flat.dtype == torch.float32 else flat.to(torch.float32)


def _affine_maps(low: torch.Tensor, high: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(mid, half_range, -mid / half_range, 1 / half_range)`` of the bounds ``low``, ``high`` ``[action_dim]``."""
    half_range = (high - low) * 0.5
    mid = low + half_range
    return mid, half_range, -mid / half_range, 1.0 / half_range


class UpdateCounter:
    """Mixin for ``nn.Module`` algorithms that count their optimizer steps (target-network periods, TD3's delay).

    The count lives twice: the ``num_updates`` buffer (int64, 0-d, on the module's device) goes into checkpoints, and
    a Python int (``updates_done``) drives every decision of the update path, which must not read a device tensor
    back (a host sync on CUDA, an error on ``meta``). The two stay equal: both start at 0 in
    ``_init_update_counter``, both advance in ``_count_update``, and ``load_state_dict`` sets the Python int from the
    loaded tensor while that is still the caller's (usually CPU) tensor, before it is copied to the device. Moving the
    module (``.to(device)``) leaves both as they are.
    """

    _updates_done: int

    def _init_update_counter(self) -> None:
        """Call once in ``__init__``, after ``nn.Module.__init__`` (and after what ``_set_updates_done`` reads)."""
        self.register_buffer("num_updates", torch.zeros((), dtype=torch.int64))
        self._set_updates_done(0)

    def _set_updates_done(self, count: int) -> None:
        """Set the Python mirror of the count. A subclass that derives a decision from the count overrides it to keep
        that decision as a small value (e.g. a bool), which compiled updates may read: torch.compile guards on the
        Python values ``train_step`` reads, so a read of the count itself would recompile the update every step.

        Written to the instance dict: ``nn.Module.__setattr__`` (which first looks for a parameter, buffer or module of
        that name) costs ~1.5 us per write, every update."""
        self.__dict__["_updates_done"] = count

    @property
    def updates_done(self) -> int:
        """Optimizer steps counted so far (the value of the ``num_updates`` buffer, without reading it)."""
        return self._updates_done

    def _count_update(self) -> int:
        """Count one optimizer step on both copies; returns the new count. No host sync."""
        self.num_updates += 1  # in place on the device
        self._set_updates_done(self._updates_done + 1)
        return self._updates_done

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        loaded = state_dict.get(prefix + "num_updates")
        # Read the source tensor, not the buffer: a checkpoint's tensor is on the CPU, so this costs no device sync,
        # and it works when the module itself is on ``meta``. A source without values (meta) leaves the count alone.
        if (isinstance(loaded, torch.Tensor) and loaded.shape == self.num_updates.shape
                and loaded.device.type != "meta"):
            self._set_updates_done(int(loaded))


class OnPolicyAlgorithm(RLAlgorithm):
    """Trains on the trajectory it just unrolled: ``rollout_step`` runs with gradients and the trainer hands the
    unroll ``[T+1, B]`` (last row: the bootstrap step, without gradients) straight to ``calc_loss``. No replay.

    An algorithm whose rollout infos are a function of the stored observation and action alone may instead unroll
    without gradients and recompute them in one batched forward pass (``recompute_rollout_info``, as SB3's A2C
    evaluates its rollout buffer): the same loss and gradients, one forward and one backward over ``(T+1) * B`` rows
    instead of ``T+1`` graphs of ``B`` rows."""

    on_policy = True
    assumes_own_data = True  # (it trains on the unroll as its own parameters acted it)
    #: True when ``recompute_rollout_info`` is implemented (the trainer then unrolls without gradients).
    recomputes_rollout_info = False

    def recompute_rollout_info(self, exp: Experience) -> Experience:
        """``exp`` (the unroll ``[T+1, B]``, taken without gradients) with its rollout infos recomputed, with
        gradients, from its observations and actions."""
        raise NotImplementedError


class OffPolicyAlgorithm(RLAlgorithm):
    """Stores raw experience in the replay buffer and trains from samples ``[L, B]`` via ``train_step`` and
    ``calc_loss`` (or from the whole buffer with ``whole_replay_buffer_training``, as PPO does)."""

    on_policy = False
