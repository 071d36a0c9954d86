"""Data transformers: functions of the data applied on the way into the algorithm (DESIGN.md §1, §3.4).

The replay buffer stores raw steps; transformers run on three views of the data:

- rollout view: each ``TimeStep`` ``[B, ...]`` before ``rollout_step`` / ``predict_step`` (training unroll, evaluation,
  play). A transformer may keep per-stream state (frame stacker: the last frames of each env); every stream gets its
  own state through ``RolloutView``.
- sample view: the raw replay sample ``[B, L]`` with where it came from (``BatchInfo``) and the buffer itself, for
  transformers that read neighbouring stored steps (frame stacking, hindsight relabelling).
- experience view: the time-major sample ``[L, B]`` (or whole buffer ``[B, T]``) before ``train_step``.

Order rule, checked when the transformers are built: ``UntransformedTimeStep`` first, then the buffer readers, then
the rest (a buffer reader needs raw data; the untransformed copy must be the raw data).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

import gymnasium as gym
from torch import nn

from alfish.data.types import BatchInfo, Experience, TimeStep

# Where a transformer must sit in the sequence (lower first).
STAGE_UNTRANSFORMED, STAGE_READS_BUFFER, STAGE_ANY = 0, 1, 2


class DataTransformer(nn.Module):
    """Base class. State that belongs to the model (running statistics) lives in registered buffers, so it is
    checkpointed; state that belongs to one stream of time steps (stacked frames) is threaded through
    ``transform_timestep``.

    ``stage``: ``STAGE_READS_BUFFER`` for transformers that read neighbouring stored steps (``transform_sample``),
    ``STAGE_UNTRANSFORMED`` for the one that keeps a raw copy; the order rule sorts by it.
    ``needs_episode_ends``: True when ``transform_sample`` asks the buffer where episodes end.
    """

    needs_episode_ends: bool = False
    stage: int = STAGE_ANY

    def output_observation_space(self, input_space: gym.Space) -> gym.Space:
        """The observation space the next transformer (and finally the algorithm) sees."""
        return input_space

    def transform_timestep(self, time_step: TimeStep, state: Any, update_stats: bool) -> tuple[TimeStep, Any]:
        """Rollout view ``[B, ...]``. ``state`` is ``None`` on a stream's first call; returns the new state.
        ``update_stats`` is True while collecting training data (not in evaluation or play)."""
        return time_step, state

    def transform_sample(self, exp: Experience, batch_info: BatchInfo, replay: Any) -> Experience:
        """Sample view: raw batch-major ``[B, L]`` sequences read from ``replay`` (a ``ReplayBuffer``) at
        ``batch_info``'s rings and positions. Only buffer-reading transformers change it.

        Devices: ``exp`` and what ``replay.gather_at`` returns are where the storage is (the training device for
        ``DevicePolicy.replay_storage='device'``); ``batch_info``'s indices and the ring's counters are on the host.
        Index arithmetic stays on the host; tensors made to meet the data are made on its device, and a host tensor
        that must meet it goes through ``replay.to_storage`` (one non-blocking copy)."""
        return exp

    def transform_experience(self, exp: Experience) -> Experience:
        """Experience view, ``[L, B, ...]`` (time-major) or ``[B, T, ...]`` (whole buffer): leaf-wise, shape-free."""
        return exp

    def begin_iteration(self) -> None:
        """Called by the trainer at the start of each training iteration, before its collection (statistics that
        must stay fixed for an iteration are frozen here: ``ObservationNormalizer``)."""


class SequentialDataTransformer(DataTransformer):
    """Transformers applied in order; validates the order rule."""

    def __init__(self, transformers: Sequence[DataTransformer]):
        super().__init__()
        check_order(transformers)
        self.transformers = nn.ModuleList(transformers)
        self.needs_episode_ends = any(t.needs_episode_ends for t in transformers)

    def output_observation_space(self, input_space: gym.Space) -> gym.Space:
        for t in self.transformers:
            input_space = t.output_observation_space(input_space)
        return input_space

    def transform_timestep(self, time_step: TimeStep, state: Any, update_stats: bool) -> tuple[TimeStep, Any]:
        states = list(state) if state is not None else [None] * len(self.transformers)
        for i, t in enumerate(self.transformers):
            time_step, states[i] = t.transform_timestep(time_step, states[i], update_stats)
        return time_step, states

    def transform_sample(self, exp: Experience, batch_info: BatchInfo, replay: Any) -> Experience:
        for t in self.transformers:
            exp = t.transform_sample(exp, batch_info, replay)
        return exp

    def transform_experience(self, exp: Experience) -> Experience:
        for t in self.transformers:
            exp = t.transform_experience(exp)
        return exp

    def begin_iteration(self) -> None:
        for t in self.transformers:
            t.begin_iteration()

    def rollout_view(self, update_stats: bool) -> "RolloutView":
        return RolloutView(self, update_stats)


class RolloutView:
    """One stream of time steps (the training unroll, an evaluation, play) through the transformers, holding that
    stream's transformer state: ``view(time_step) -> transformed time_step``."""

    def __init__(self, transformer: DataTransformer, update_stats: bool):
        self.transformer, self.update_stats = transformer, update_stats
        self.state: Any = None

    def __call__(self, time_step: TimeStep) -> TimeStep:
        time_step, self.state = self.transformer.transform_timestep(time_step, self.state, self.update_stats)
        return time_step


def _name(transformer: Any) -> str:
    return transformer.__name__ if isinstance(transformer, type) else type(transformer).__name__


def check_order(transformers: Sequence[Any]) -> None:
    """UntransformedTimeStep, then buffer readers, then the rest; a violation is an error naming both transformers.

    Takes transformers or their classes (so a wrong conf fails before anything is built).
    """
    stages = [getattr(t, "stage", STAGE_ANY) for t in transformers]
    for i, later in enumerate(transformers):
        for j, earlier in enumerate(transformers[:i]):
            if stages[j] > stages[i]:
                what = ("keeps the untransformed data" if stages[i] == STAGE_UNTRANSFORMED
                        else "reads the replay buffer")
                raise ValueError(f"data transformer {_name(later)} {what}, so it must come before "
                                 f"{_name(earlier)}; reorder TrainerConfig.data_transformer_ctor")


TransformerCtor = Callable[..., DataTransformer]


def build_transformers(ctors: Union[None, TransformerCtor, Sequence[TransformerCtor]],
                       observation_space: gym.Space) -> SequentialDataTransformer:
    """``TrainerConfig.data_transformer_ctor`` (None, one constructor or a list) -> one sequential transformer.

    Each constructor gets the observation space its predecessor outputs (e.g. a normalizer after a frame stacker
    sees stacked observations).
    """
    if ctors is None:
        ctors = []
    elif callable(ctors):
        ctors = [ctors]
    check_order(ctors)
    transformers = []
    space: Optional[gym.Space] = observation_space
    for ctor in ctors:
        transformer = ctor(observation_space=space)
        transformers.append(transformer)
        space = transformer.output_observation_space(space)
    return SequentialDataTransformer(transformers)
