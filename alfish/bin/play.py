"""Play a trained policy from its results directory: print each episode's return and length, optionally record it.

    python -m alfish.bin.play --root_dir runs/sac [--checkpoint_step N] [--num_episodes K]
                              [--record_file out.mp4|out.gif] [--epsilon_greedy E] [--render]

Everything is rebuilt from the checkpoint alone: its tensors (loaded with ``weights_only=True``) and the operative gin
config it recorded. No Python from the results directory is executed: the stored config may only import alfish
modules (or the prefixes given with --allow_import).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Optional, Sequence

import torch

from alfish.algorithms.build import build_policy
from alfish.config import ConfError, TrainerConfig, load_config_text
from alfish.data.types import StepType
from alfish.envs.batched_env import create_environment
from alfish.envs.spec import EnvSpec
from alfish.trainer.checkpoint import Checkpointer, CheckpointError, LoadedCheckpoint

VIDEO_SUFFIXES = (".mp4", ".gif")


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m alfish.bin.play", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root_dir", required=True)
    parser.add_argument("--checkpoint_step", type=int, default=None,
                        help="iteration of the checkpoint (default: newest)")
    parser.add_argument("--num_episodes", type=int, default=1)
    parser.add_argument("--record_file", default=None, help="write a video: .mp4 (imageio-ffmpeg) or .gif")
    parser.add_argument("--epsilon_greedy", type=float, default=0.0,
                        help="probability of sampling from the policy instead of taking its greedy action")
    parser.add_argument("--render", action="store_true", help="show the env in a window (needs a display)")
    parser.add_argument("--fps", type=int, default=None, help="video frame rate (default: the env's render_fps)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--allow_import", action="append", default=[],
                        help="module prefix the stored config may import (your own env/network package)")
    args = parser.parse_args(argv)
    if args.record_file and not args.record_file.endswith(VIDEO_SUFFIXES):
        parser.error(f"--record_file {args.record_file!r} must end with one of {VIDEO_SUFFIXES}")
    if args.num_episodes < 1:
        parser.error("--num_episodes must be >= 1")
    return args


def load_checkpoint(root_dir: str, step: Optional[int]) -> LoadedCheckpoint:
    checkpointer = Checkpointer(os.path.join(root_dir, "checkpoints"))
    if step is not None:
        return checkpointer.load(step)
    ckpt = checkpointer.load_latest()
    if ckpt is None:
        raise CheckpointError(f"no valid checkpoint under {root_dir}/checkpoints; train first "
                              f"(python -m alfish.bin.train --root_dir {root_dir} ...)")
    return ckpt


def write_video(path: str, frames: list, fps: int) -> None:
    import imageio.v2 as imageio  # the 'render' extra

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if path.endswith(".gif"):
        imageio.mimsave(path, frames, duration=1000.0 / fps, loop=0)
    else:
        imageio.mimsave(path, frames, fps=fps, macro_block_size=1)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        ckpt = load_checkpoint(args.root_dir, args.checkpoint_step)
        load_config_text(ckpt.meta["operative_config"], f"{ckpt.path}/meta.json",
                         allowed_import_prefixes=("alfish", *args.allow_import))
        config = TrainerConfig(root_dir=args.root_dir)
    except (CheckpointError, ConfError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    render_mode = "human" if args.render else ("rgb_array" if args.record_file else None)
    env = create_environment(num_parallel_environments=1, seed=args.seed, vectorization="sync",
                             render_mode=render_mode)
    transformer, algorithm = build_policy(config, EnvSpec.of(env))
    if "transformers" in ckpt.tensors:  # e.g. the observation normalizer's statistics
        transformer.load_state_dict(ckpt.tensors["transformers"])
    transformer.eval()
    view = transformer.rollout_view(update_stats=False)
    algorithm.load_state_dict(ckpt.tensors["algorithm"])
    algorithm.eval()
    fps = args.fps or int(env._venv.metadata.get("render_fps") or 30)
    frames: list = []
    returns = []
    with torch.inference_mode():
        time_step = env.reset()
        episode_return, episode_length = 0.0, 0
        if args.record_file:
            frames.append(env.render()[0])
        while len(returns) < args.num_episodes:
            seen = view(time_step)
            action = algorithm.predict_step(seen, epsilon_greedy=args.epsilon_greedy).output
            time_step = env.step(action)
            if int(time_step.step_type[0]) == StepType.FIRST:
                continue  # the autoreset step after LAST: not part of any episode
            if args.record_file:
                frames.append(env.render()[0])
            episode_return += float(time_step.reward[0])
            episode_length += 1
            if int(time_step.step_type[0]) == StepType.LAST:
                returns.append(episode_return)
                print(f"episode {len(returns)}: return {episode_return:.2f} length {episode_length}", flush=True)
                episode_return, episode_length = 0.0, 0
    env.close()
    print(f"average return over {len(returns)} episodes: {sum(returns) / len(returns):.2f} "
          f"(checkpoint {ckpt.path})", flush=True)
    if args.record_file:
        write_video(args.record_file, frames, fps)
        print(f"recorded {len(frames)} frames to {args.record_file}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
