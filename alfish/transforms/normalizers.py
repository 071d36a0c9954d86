"""Running-statistics normalizers of observations and rewards.

Under DDP (``torchrun``) every rank updates its statistics from its own envs (or its own replay samples), so the ranks
would normalize differently. ``RunningMeanStd`` therefore also keeps, on each rank, the statistics at the last merge
(identical on every rank) and the statistics of the data this rank saw since then;
``alfish.learn.distributed.merge_statistics_across_ranks`` gathers those per-rank deltas in one collective and folds
them, in rank order, into the merged statistics on every rank, so all ranks then hold the same numbers: those of one
process that saw all ranks' data. A single process keeps no deltas and its numbers are those of the plain update.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import gin
import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist

from alfish.data import nest
from alfish.data.types import Experience, StepType, TimeStep
from alfish.errors import OneLineValueError
from alfish.transforms.base import DataTransformer


def _fold(count: torch.Tensor, mean: torch.Tensor, m2: torch.Tensor, n: Union[int, torch.Tensor],
          other_mean: torch.Tensor, other_m2: torch.Tensor) -> None:
    """Fold the statistics ``(n, other_mean, other_m2)`` of other values into ``(count, mean, m2)`` in place (Chan et
    al.'s parallel update: no sums of squares, so no cancellation). ``n`` is a positive int or a count tensor (which
    may be 0: nothing is folded then)."""
    total = count + n
    delta = other_mean - mean
    safe_total = total if isinstance(n, int) else total.clamp(min=1.0)  # an int n >= 1: the plain update's ops
    mean += delta * (n / safe_total)
    m2 += other_m2 + delta ** 2 * (count * n / safe_total)
    count.copy_(total)


def _in_multi_rank_job() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class RunningMeanStd(torch.nn.Module):
    """Mean and variance over every value seen, merged batch by batch (Chan et al.'s parallel update), float64.

    ``shape``: the shape of one value; batches are ``[N, *shape]``. ``count`` (values seen), ``mean`` and ``m2`` (sum
    of squared deviations from the mean), of shape ``[]``, ``shape``, ``shape``, are the checkpointed state.

    Built inside a multi-rank job (after ``init_distributed``), it also keeps two non-checkpointed copies of that
    triple: ``base_*``, the statistics at the last merge across ranks (or the last load), and ``delta_*``, the
    statistics of the values this rank saw since then (``tracks_rank_deltas``). Between two merges ``count/mean/m2``
    are ``base`` with this rank's own values folded in, as in a single process.

    ``prior_count``: start as if ``prior_count`` values of mean 0 and variance 1 had been seen (SB3's
    ``RunningMeanStd(epsilon=1e-4)`` starts so); 0 (the default) starts from nothing.
    """

    def __init__(self, shape: tuple[int, ...], prior_count: float = 0.0):
        super().__init__()
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("m2", torch.zeros(shape, dtype=torch.float64))
        for prefix in ("base_", "delta_"):
            self.register_buffer(prefix + "count", torch.zeros((), dtype=torch.float64), persistent=False)
            self.register_buffer(prefix + "mean", torch.zeros(shape, dtype=torch.float64), persistent=False)
            self.register_buffer(prefix + "m2", torch.zeros(shape, dtype=torch.float64), persistent=False)
        self.tracks_rank_deltas = _in_multi_rank_job()
        if prior_count:  # the prior is the merge base on every rank, so a merge counts it once
            self._set_base(torch.tensor(float(prior_count), dtype=torch.float64), self.mean.clone(),
                           torch.full_like(self.m2, float(prior_count)))

    @torch.no_grad()
    def update(self, batch: torch.Tensor) -> None:
        batch = batch.reshape((-1,) + tuple(self.mean.shape)).double()
        n = batch.shape[0]
        if n == 0:
            return
        batch_mean = batch.mean(0)
        batch_m2 = ((batch - batch_mean) ** 2).sum(0)
        _fold(self.count, self.mean, self.m2, n, batch_mean, batch_m2)
        if self.tracks_rank_deltas:
            _fold(self.delta_count, self.delta_mean, self.delta_m2, n, batch_mean, batch_m2)

    @torch.no_grad()
    def update_where(self, batch: torch.Tensor, keep: torch.Tensor) -> None:
        """``update(batch[keep])`` without the data-dependent shape (so no host sync on CUDA): ``batch``
        ``[N, *shape]``, ``keep`` bool ``[N]``; nothing changes when no value is kept."""
        batch = batch.reshape((-1,) + tuple(self.mean.shape)).double()
        weight = keep.reshape((-1,) + (1,) * self.mean.dim()).double()
        n = weight.sum()
        batch_mean = (batch * weight).sum(0) / n.clamp(min=1.0)
        batch_m2 = ((batch - batch_mean) ** 2 * weight).sum(0)
        _fold(self.count, self.mean, self.m2, n, batch_mean, batch_m2)
        if self.tracks_rank_deltas:
            _fold(self.delta_count, self.delta_mean, self.delta_m2, n, batch_mean, batch_m2)

    def variance(self) -> torch.Tensor:
        """Population variance (1 before anything was seen)."""
        return torch.where(self.count > 0, self.m2 / self.count.clamp(min=1.0), torch.ones_like(self.m2))

    # ------------------------------------------------------------------------------------- merging across ranks ----
    def delta_vector(self) -> torch.Tensor:
        """This rank's statistics since the last merge, flattened: ``[count, *mean, *m2]`` (``1 + 2 * prod(shape)``
        float64 values on the statistics' device)."""
        return torch.cat([self.delta_count.reshape(1), self.delta_mean.reshape(-1), self.delta_m2.reshape(-1)])

    @torch.no_grad()
    def fold_rank_deltas(self, deltas: Sequence[torch.Tensor]) -> None:
        """Set the statistics to ``base`` with every rank's ``delta_vector()`` (``deltas``, in rank order) folded in;
        the same inputs in the same order give the same numbers on every rank. Starts a new delta."""
        count, mean, m2 = self.base_count.clone(), self.base_mean.clone(), self.base_m2.clone()
        size = self.mean.numel()
        for delta in deltas:
            _fold(count, mean, m2, delta[0], delta[1:1 + size].view_as(mean), delta[1 + size:].view_as(m2))
        self._set_base(count, mean, m2)

    def _set_base(self, count: torch.Tensor, mean: torch.Tensor, m2: torch.Tensor) -> None:
        """The statistics and the merge base become ``(count, mean, m2)``; the delta restarts from nothing."""
        for name, value in (("count", count), ("mean", mean), ("m2", m2)):
            getattr(self, name).copy_(value)
            getattr(self, "base_" + name).copy_(value)
            getattr(self, "delta_" + name).zero_()

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        # Every rank loads the same checkpoint: the loaded statistics are the new merge base.
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        with torch.no_grad():
            self._set_base(self.count.clone(), self.mean.clone(), self.m2.clone())


@gin.configurable
class ObservationNormalizer(DataTransformer):
    """``(obs - mean) / sqrt(var + eps)``, clipped to ``[-clip_value, clip_value]`` (0: no clipping).

    Statistics are updated from the rollout (every collected time step, ``update_mode='rollout'``) or from each replay
    sample (``'replay'``); evaluation and play only read them. Checkpointed with the model. Under DDP the ranks' updates
    are merged once per iteration, after the collection (module docstring): with ``'rollout'`` every rank's training
    step then normalizes with the same statistics; with ``'replay'`` each rank's samples move its own copy until the
    next merge.

    With ``'rollout'``, one training iteration normalizes with the statistics as they stood at its start (frozen by
    ``begin_iteration``): its rollout and its training batches see a stored observation normalized alike, although the
    rollout's steps update the statistics as they come (they count from the next iteration on). Otherwise PPO's
    stored log-probabilities, taken on the rollout's normalization, would not be those of its training batches,
    normalized after the rollout moved the statistics: with ``confs/ppo_halfcheetah.gin`` (policy std e^-2), in 15 of
    the first 56 iterations more than 10% of the rollout's samples (up to 62%) were outside the clip range before any
    update, and PPO learned HalfCheetah at a fraction of SB3's pace (``tests/algorithms/test_ppo_normalized_ratio.py``;
    README, Standard benchmarks). SB3's VecNormalize stores the normalized observations, to the same effect.
    Evaluation and play read the newest statistics (those the next iteration will use).
    ``fields``: for dict observations, the keys to normalize (default: all); must be None for Box observations.
    """

    def __init__(self, observation_space: gym.Space, clip_value: float = 5.0, epsilon: float = 1e-8,
                 update_mode: str = "rollout", fields: Optional[Sequence[str]] = None):
        super().__init__()
        if update_mode not in ("rollout", "replay"):
            raise ValueError(f"ObservationNormalizer.update_mode='{update_mode}' must be 'rollout' or 'replay'")
        self.clip_value, self.epsilon, self.update_mode = clip_value, epsilon, update_mode
        self.fields: Optional[list[str]] = None
        if isinstance(observation_space, gym.spaces.Dict):
            keys = list(observation_space.spaces)
            self.fields = list(fields) if fields is not None else keys
            unknown = [f for f in self.fields if f not in keys]
            if unknown:
                raise ValueError(f"ObservationNormalizer.fields={unknown} are not keys of the observation "
                                 f"space; its keys are {keys}")
            self.field_stats = torch.nn.ModuleDict(
                {f: RunningMeanStd(tuple(observation_space[f].shape)) for f in self.fields})
        elif fields is not None:
            raise ValueError(f"ObservationNormalizer.fields={list(fields)} needs dict observations; this "
                             f"observation space is {observation_space}: leave fields unset")
        else:
            self.stats = RunningMeanStd(tuple(observation_space.shape))
        # The (mean, std) of each statistics (key None for Box observations) frozen by begin_iteration; None before
        # the first iteration and after a load (the live statistics are read then). Not checkpointed: a resumed run
        # freezes the loaded statistics at its first iteration, as the uninterrupted run froze the same numbers.
        self._frozen: Optional[dict[Optional[str], tuple[torch.Tensor, torch.Tensor]]] = None

    def _moments(self, stats: RunningMeanStd) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, sqrt(var + epsilon))`` of ``stats``, float64, of the observation's shape."""
        return stats.mean, torch.sqrt(stats.variance() + self.epsilon)

    def begin_iteration(self) -> None:
        """Freeze the statistics this training iteration normalizes with (``'rollout'`` mode; class docstring)."""
        if self.update_mode != "rollout":
            return
        every = {None: self.stats} if self.fields is None else dict(self.field_stats.items())
        self._frozen = {}
        for key, stats in every.items():
            mean, std = self._moments(stats)
            self._frozen[key] = (mean.clone(), std)  # (mean is the live buffer; std is a new tensor)

    def _normalize_one(self, key: Optional[str], stats: RunningMeanStd, obs: torch.Tensor, update: bool,
                       frozen: bool) -> torch.Tensor:
        if update:
            stats.update(obs)
        mean, std = self._frozen[key] if frozen and self._frozen is not None else self._moments(stats)
        out = ((obs.double() - mean) / std).to(torch.float32)
        return out.clamp(-self.clip_value, self.clip_value) if self.clip_value else out

    def _normalize(self, obs: Any, update: bool, frozen: bool = False) -> Any:
        if self.fields is None:
            return self._normalize_one(None, self.stats, obs, update, frozen)
        return {k: self._normalize_one(k, self.field_stats[k], v, update, frozen) if k in self.field_stats else v
                for k, v in obs.items()}

    def normalize(self, obs: Any) -> Any:
        """Normalize with the newest statistics, without touching them."""
        return self._normalize(obs, update=False)

    def transform_timestep(self, time_step: TimeStep, state: Any, update_stats: bool) -> tuple[TimeStep, Any]:
        # The training rollout (update_stats) reads the iteration's frozen statistics; evaluation and play the newest.
        update = update_stats and self.update_mode == "rollout"
        observation = self._normalize(time_step.observation, update, frozen=update)
        return nest.replace_fields(time_step, observation=observation), state

    def transform_experience(self, exp: Experience) -> Experience:
        update = self.training and self.update_mode == "replay"
        return nest.replace_fields(exp, observation=self._normalize(exp.observation, update, frozen=True))

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._frozen = None  # loaded statistics: read live until the next iteration freezes them


#: SB3's ``RunningMeanStd`` starts as if this many values of mean 0 and variance 1 had been seen (its ``epsilon``).
SB3_PRIOR_COUNT = 1e-4


@gin.configurable
class RewardNormalizer(DataTransformer):
    """Divides rewards by a running standard deviation (no mean shift, so the sign of a reward is kept), then clips
    them to ``[-clip_value, clip_value]``. Changes the data the algorithm learns from (rollout and experience views);
    returns in TensorBoard and evaluation stay the env's own. Rewards ``[B]`` (rollout) or ``[L, B]`` / ``[B, T]``
    (experience), in the env's units before and in units of that standard deviation after.

    ``gamma``: which standard deviation.
      - None (the default): that of the rewards themselves, every rollout step's (FIRST steps' 0 included).
      - a discount in (0, 1]: that of the discounted return, as SB3's ``VecNormalize(norm_reward=True, gamma=...)``.
        Each env of the training rollout keeps ``ret = ret * gamma + reward`` (float64, the rollout stream's
        transformer state ``[B]``); each step the statistics take every env's ``ret`` (one value per env), the reward
        is divided by ``sqrt(var(ret) + epsilon)``, and ``ret`` restarts at 0 after a LAST step (terminated or
        truncated, as VecNormalize's ``dones``). The statistics start as SB3's (a 1e-4 prior count of variance 1).
        One difference, of timing only: alfish's next-step autoreset gives an env a FIRST step (reward 0, no action
        behind it) after each LAST; it is not counted (VecNormalize never sees it), so that env's next return enters
        the statistics one step later than in SB3, while the values counted over a run are the same. The running
        returns are checkpointed with the unroll (exact resume); where the episodes in flight restart instead (or
        the rollout runs in the async unroll child), they restart at 0 with the episodes, as VecNormalize's after
        ``load``.
    ``epsilon``: added to the variance, in the squared units of the reward (SB3's 1e-8).
    """

    def __init__(self, observation_space: Optional[gym.spaces.Box] = None, clip_value: float = 10.0,
                 epsilon: float = 1e-8, gamma: Optional[float] = None):
        super().__init__()
        if gamma is not None and not 0.0 < gamma <= 1.0:
            raise OneLineValueError(f"RewardNormalizer.gamma={gamma} must be a discount in (0, 1] (the conf's "
                                    f"gamma, for VecNormalize's return-based scaling) or None (the rewards' own std)")
        self.gamma = gamma
        self.stats = RunningMeanStd((), prior_count=0.0 if gamma is None else SB3_PRIOR_COUNT)
        self.clip_value, self.epsilon = clip_value, epsilon

    def transform_timestep(self, time_step: TimeStep, state: Any, update_stats: bool) -> tuple[TimeStep, Any]:
        if update_stats:
            if self.gamma is None:
                self.stats.update(time_step.reward)
            else:
                state = self._update_return_stats(time_step, state)
        return nest.replace_fields(time_step, reward=self._normalize(time_step.reward)), state

    def _update_return_stats(self, time_step: TimeStep, running_return: Optional[torch.Tensor]) -> torch.Tensor:
        """VecNormalize's ``_update_reward`` and its reset at ``dones``: returns the running returns ``[B]`` (float64)
        to carry to the next step."""
        reward = time_step.reward.double()
        if running_return is None:
            running_return = torch.zeros_like(reward)
        counted = ~time_step.is_first()
        running_return = torch.where(counted, running_return * self.gamma + reward, 0.0)
        self.stats.update_where(running_return, counted)
        return torch.where(time_step.is_last(), 0.0, running_return)

    @torch.no_grad()
    def update_from_episodes(self, step_type: np.ndarray, reward: np.ndarray, running_return: float = 0.0) -> float:
        """Feed stored steps ``[T]`` (episodes one after another, ``FIRST, MID..., LAST``; offline data) to the
        statistics as the rollout would: the rewards of the non-FIRST steps, or with ``gamma`` their running
        returns. ``running_return`` carries a return from the previous chunk of the same data; returns the one to
        carry to the next."""
        counted = step_type != StepType.FIRST
        if self.gamma is None:
            values = np.asarray(reward[counted], np.float32)
        else:
            values = np.empty(len(reward), np.float64)
            for i, (first, value) in enumerate(zip((~counted).tolist(), reward.tolist())):
                running_return = 0.0 if first else running_return * self.gamma + value
                values[i] = running_return
            values = values[counted]
        if len(values):
            self.stats.update(torch.from_numpy(np.ascontiguousarray(values)))
        return running_return

    def _normalize(self, reward: torch.Tensor) -> torch.Tensor:
        std = torch.sqrt(self.stats.variance() + self.epsilon).float()
        return (reward / std).clamp(-self.clip_value, self.clip_value)

    def transform_experience(self, exp: Experience) -> Experience:
        return nest.replace_fields(exp, reward=self._normalize(exp.reward))
