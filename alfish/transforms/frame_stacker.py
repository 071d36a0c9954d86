"""Frame stacking without storing stacks: the buffer keeps single frames; stacks are rebuilt on the way out."""
from __future__ import annotations

from typing import Any, Optional

import gin
import gymnasium as gym
import numpy as np
import torch

from alfish.data import nest
from alfish.data.types import BatchInfo, Experience, StepType, TimeStep
from alfish.transforms.base import STAGE_READS_BUFFER, DataTransformer


@gin.configurable
class FrameStacker(DataTransformer):
    """The observation becomes the concatenation of the last ``stack_size`` frames along ``stack_axis`` (oldest
    first), e.g. ``[3] -> [3 * K]`` or images ``[C, H, W] -> [C * K, H, W]``.

    Frames before an episode's first step are the first frame repeated, in every view:
    - rollout: the stream's state holds each env's last ``K`` frames ``[B, K, *obs]``; a FIRST step refills it;
    - sample: the ``K - 1`` steps before each sampled sequence are read from the buffer, and frames across an episode
      start (or older than the oldest stored step) are replaced by the episode's first (the oldest stored) frame.
    The replay buffer stores single frames only (memory: one frame per step, not ``K``).
    """

    stage = STAGE_READS_BUFFER

    def __init__(self, observation_space: gym.spaces.Box, stack_size: int = 4, stack_axis: int = 0):
        super().__init__()
        if not isinstance(observation_space, gym.spaces.Box):
            raise ValueError(f"FrameStacker stacks Box observations; this observation space is {observation_space}")
        if stack_size < 1:
            raise ValueError(f"FrameStacker.stack_size={stack_size} must be >= 1")
        ndim = len(observation_space.shape)
        if not -ndim <= stack_axis < ndim:
            raise ValueError(f"FrameStacker.stack_axis={stack_axis} is out of range for observations of shape "
                             f"{observation_space.shape}")
        self.stack_size, self.stack_axis = stack_size, stack_axis % ndim

    def output_observation_space(self, input_space: gym.Space) -> gym.Space:
        reps = [1] * len(input_space.shape)
        reps[self.stack_axis] = self.stack_size
        return gym.spaces.Box(np.tile(input_space.low, reps), np.tile(input_space.high, reps),
                              dtype=input_space.dtype)

    def _concat(self, frames: torch.Tensor, batch_dims: int) -> torch.Tensor:
        """``[*batch, K, *obs] -> [*batch, *stacked_obs]``: frames concatenated along the stack axis."""
        return torch.cat(frames.unbind(batch_dims), dim=batch_dims + self.stack_axis)

    def transform_timestep(self, time_step: TimeStep, state: Optional[torch.Tensor],
                           update_stats: bool) -> tuple[TimeStep, torch.Tensor]:
        obs = time_step.observation  # [B, *obs]
        repeated = obs.unsqueeze(1).expand((-1, self.stack_size) + tuple(obs.shape[1:]))
        if state is None:
            state = repeated
        else:
            shifted = torch.cat([state[:, 1:], obs.unsqueeze(1)], dim=1)
            first = time_step.is_first().view((-1,) + (1,) * (state.dim() - 1))
            state = torch.where(first, repeated, shifted)
        return nest.replace_fields(time_step, observation=self._concat(state, batch_dims=1)), state

    def transform_sample(self, exp: Experience, batch_info: BatchInfo, replay: Any) -> Experience:
        """Devices: the window's indices are computed on the host, from the sampler's host indices and the ring's host
        counters (``gather_at`` sends them to the storage in one non-blocking copy); what reads the gathered steps
        runs on their device (the storage's), with its own index tensors made there: no host tensor meets device
        data, and nothing is read back."""
        k = self.stack_size
        if k == 1:
            return exp
        num, length = exp.step_type.shape[:2]
        window = length + k - 1
        # Absolute indices [N, W] from k-1 steps before each sequence; nothing older than the oldest stored step.
        index = batch_info.positions.unsqueeze(1) + torch.arange(-(k - 1), length)
        index = torch.maximum(index, replay.oldest_index()[batch_info.env_ids].unsqueeze(1))
        past = replay.gather_at(batch_info.env_ids, index)
        device = past.step_type.device
        # Window position of the newest episode start at or before each position (0 when none is in the window:
        # then everything from the window's start on is one episode).
        arange = torch.arange(window, device=device)
        starts = torch.where(past.step_type == StepType.FIRST, arange, 0).cummax(dim=1).values  # [N, W]
        target = arange[k - 1:]  # window positions of the sequence's steps  [L]
        frame_pos = target.unsqueeze(1) + torch.arange(-(k - 1), 1, device=device)  # [L, K], oldest first
        frame_pos = torch.maximum(frame_pos.unsqueeze(0), starts[:, target].unsqueeze(2))  # [N, L, K]
        obs = past.observation  # [N, W, *obs]
        frames = obs[torch.arange(num, device=device).view(-1, 1, 1), frame_pos]  # [N, L, K, *obs]
        return nest.replace_fields(exp, observation=self._concat(frames, batch_dims=2))
