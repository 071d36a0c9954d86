"""Whole episodes of a trained policy on one env, as ``play`` shows them and evaluation videos record them."""
from __future__ import annotations

from typing import Callable, Optional

import torch

from alfish.algorithms.base import Algorithm
from alfish.data.types import StepType, TimeStep
from alfish.envs.batched_env import BatchedEnv
from alfish.transforms.base import DataTransformer


def play_episodes(env: BatchedEnv, transformer: DataTransformer, algorithm: Algorithm, time_step: TimeStep,
                  num_episodes: int, epsilon_greedy: float = 0.0, frames: Optional[list] = None,
                  on_episode: Callable[[int, float, int], None] = lambda index, ret, length: None) -> list[float]:
    """Plays ``num_episodes`` episodes on env 0 of ``env`` from ``time_step`` (just after a reset) with the greedy
    (or ``epsilon_greedy``) policy, acting through the transformers with their statistics frozen; returns the episode
    returns. ``frames``: a frame (``env.render()[0]``) is appended after every step. ``on_episode(index from 1,
    return, length)`` is called at the end of each episode."""
    view = transformer.rollout_view(update_stats=False)
    returns: list[float] = []
    with torch.inference_mode():
        episode_return, episode_length = 0.0, 0
        # a recurrent policy's state, reset at each episode's FIRST step (EMPTY for a stateless one)
        state = algorithm.initial_state(env.num_envs, next(iter(algorithm.parameters())).device)
        while len(returns) < num_episodes:
            seen = view(time_step)
            alg_step = algorithm.predict_step(seen, algorithm.reset_state(state, seen.step_type),
                                              epsilon_greedy=epsilon_greedy)
            action, state = alg_step.output, alg_step.state
            time_step = env.step(action)
            if int(time_step.step_type[0]) == StepType.FIRST:
                continue  # the autoreset step after LAST: not part of any episode
            if frames is not None:
                frames.append(env.render()[0])
            episode_return += float(time_step.reward[0])
            episode_length += 1
            if int(time_step.step_type[0]) == StepType.LAST:
                returns.append(episode_return)
                on_episode(len(returns), episode_return, episode_length)
                episode_return, episode_length = 0.0, 0
    return returns


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
