"""Whole episodes of a trained policy on one env, as ``play`` shows them and evaluation videos record them."""
from __future__ import annotations

from typing import Callable, Optional

import torch

from alfish.data.types import TimeStep
from alfish.envs.batched_env import BatchedEnv
from alfish.evaluate.acting import EpisodeWatcher, GreedyPolicy, run_episodes


class _Show(EpisodeWatcher):
    """Renders env 0 after each of its counted steps into ``frames`` (if given); reports each episode's end."""

    def __init__(self, env: BatchedEnv, frames: Optional[list], on_episode: Callable[[int, float, int], None]):
        self.env, self.frames, self.on_episode = env, frames, on_episode

    def stepped(self, time_step: TimeStep, counted: torch.Tensor) -> None:
        if self.frames is not None and bool(counted[0]):
            self.frames.append(self.env.render()[0])

    def episode_ended(self, index: int, episode_return: float, length: int) -> None:
        self.on_episode(index, episode_return, length)


def play_episodes(env: BatchedEnv, policy: GreedyPolicy, time_step: TimeStep, num_episodes: int,
                  frames: Optional[list] = None,
                  on_episode: Callable[[int, float, int], None] = lambda index, ret, length: None) -> list[float]:
    """Plays ``num_episodes`` episodes on ``env`` (one env) from ``time_step`` (just after a reset) with ``policy`` (a
    ``GreedyPolicy``: greedy or epsilon-greedy, through the transformers with their statistics frozen); returns the
    episode returns. ``frames``: a frame (``env.render()[0]``) is appended after every step that belongs to an episode.
    ``on_episode(index from 1, return, length)`` is called at the end of each episode."""
    if env.num_envs != 1:
        raise ValueError(f"play_episodes plays one env; got {env.num_envs}")
    return run_episodes(env, policy, time_step, num_episodes, watcher=_Show(env, frames, on_episode)).returns


def write_video(path: str, frames: list, fps: int) -> None:
    """``frames`` (HxWx3 uint8 arrays) to ``path``: ``.gif``, or ``.mp4`` through imageio's ffmpeg (the 'render'
    extra)."""
    import os

    import imageio.v2 as imageio  # the 'render' extra

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if path.endswith(".gif"):
        imageio.mimsave(path, frames, duration=1000.0 / fps, loop=0)
    else:
        imageio.mimsave(path, frames, fps=fps, macro_block_size=1)
