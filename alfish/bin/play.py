"""Play a trained policy from its results directory: print each episode's return and length, optionally record it.

    python -m alfish.bin.play --root_dir runs/sac [--checkpoint_step N | --best] [--num_episodes K]
                              [--record_file out.mp4|out.gif] [--epsilon_greedy E] [--render]
                              [--allow_import PREFIX ...]

Everything is rebuilt from the checkpoint alone: its tensors (loaded with ``weights_only=True``) and the operative gin
config it recorded. A results directory is untrusted input, so that config is parsed in a restricted mode: it may
name only alfish's registered configurables, import nothing and make gymnasium import nothing. To play a run of your
own env or network package, trust it with --allow_import PREFIX (its imports, configurables and 'module:EnvId' env
names); --allow_import '*' trusts the results directory completely.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from typing import Optional, Sequence

import gymnasium as gym

from alfish.algorithms.base import Algorithm
from alfish.bin.root_dir_args import add_allow_import, add_checkpoint_choice, add_root_dir, command_parser
from alfish.bin.stored_run import load_checkpoint, load_policy_config, one_line, restore_policy
from alfish.config import ConfError
from alfish.config.untrusted import check_env_names, trusted_prefixes
from alfish.data.types import TimeStep
from alfish.envs.batched_env import BatchedEnv, EnvSettings, environment_settings
from alfish.evaluate import episodes
from alfish.evaluate.acting import GreedyPolicy
from alfish.rundir.checkpoint import CheckpointError
from alfish.transforms.base import SequentialDataTransformer

VIDEO_SUFFIXES = (".mp4", ".gif")
_RENDER_EXTRA = "pip install 'alfish[render]'"


class PlayError(Exception):
    """A problem with play's arguments or what they name; its message is one line saying what to change."""


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = command_parser("python -m alfish.bin.play", __doc__)
    add_root_dir(parser)
    add_checkpoint_choice(parser, best_help="the policy of the best evaluation (ROOT_DIR/checkpoints/best, kept by "
                                            "Trainer.keep_best_checkpoint)")
    parser.add_argument("--num_episodes", type=int, default=1)
    parser.add_argument("--record_file", default=None, help="write a video: .mp4 (imageio-ffmpeg) or .gif")
    parser.add_argument("--epsilon_greedy", type=float, default=0.0,
                        help="probability of sampling from the policy instead of taking its greedy action")
    parser.add_argument("--render", action="store_true", help="show the env in a window (needs a display)")
    parser.add_argument("--fps", type=int, default=None, help="video frame rate (default: the env's render_fps)")
    parser.add_argument("--seed", type=int, default=0)
    add_allow_import(parser)
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    """Checks what argparse cannot, before anything is loaded or played.

    Raises:
        PlayError: one line naming the argument and what to change.
    """
    if args.num_episodes < 1:
        raise PlayError(f"--num_episodes {args.num_episodes} must be >= 1")
    if args.best and args.checkpoint_step is not None:
        raise PlayError("--best and --checkpoint_step name different checkpoints; give one")
    if args.record_file:
        check_record_file(args.record_file)


def check_record_file(path: str) -> None:
    """Refuses a --record_file that could not be written once the episodes are played.

    The extension must be supported, the directory must exist or be creatable and be writable (probed with a
    temporary file, which also holds for root and read-only file systems), and imageio must be installed (with its
    ffmpeg plugin for .mp4).

    Raises:
        PlayError: one line saying what to change.
    """
    if not path.endswith(VIDEO_SUFFIXES):
        raise PlayError(f"--record_file {path!r} must end with one of {', '.join(VIDEO_SUFFIXES)}")
    if os.path.isdir(path):
        raise PlayError(f"--record_file {path!r} is a directory; give a file name ending with .mp4 or .gif")
    directory = os.path.dirname(os.path.abspath(path))
    existing = directory
    while not os.path.exists(existing):  # the nearest ancestor that exists: the missing part is created later
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise PlayError(f"--record_file {path!r} cannot be written: {existing} is a file, not a directory")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise PlayError(f"--record_file {path!r} cannot be written: {existing} is not writable ({err.strerror}); "
                        f"choose another directory") from None
    try:
        import imageio.v2  # noqa: F401  (the 'render' extra)
    except ImportError:
        raise PlayError(f"--record_file needs imageio, which is not installed: {_RENDER_EXTRA}") from None
    if path.endswith(".mp4"):
        try:
            import imageio_ffmpeg

            imageio_ffmpeg.get_ffmpeg_exe()
        except (ImportError, RuntimeError):  # RuntimeError: the package is there but has no ffmpeg executable
            raise PlayError(f"--record_file {path!r} needs imageio's ffmpeg plugin, which is not installed: "
                            f"{_RENDER_EXTRA} (or record a .gif)") from None


def create_env(args: argparse.Namespace, trusted: tuple[str, ...]) -> BatchedEnv:
    """The one env play steps, after checking that the env names the stored config gives import nothing untrusted."""
    render_mode = "human" if args.render else ("rgb_array" if args.record_file else None)
    return env_settings(args.seed, render_mode, trusted).create()


def env_settings(seed: int, render_mode: Optional[str], trusted: tuple[str, ...]) -> EnvSettings:
    """The settings of one env (in this process) of the stored config just parsed (``load_policy_config``), after
    checking that the env names it gives import nothing untrusted (``alfish.load_policy`` builds its env from them).

    The names are checked again here, resolved (macros and references evaluated), before gymnasium sees them.
    """
    settings = environment_settings(num_parallel_environments=1, seed=seed, vectorization="sync",
                                    render_mode=render_mode)
    check_env_names({"create_environment.env_name": settings.env_name,
                     "create_environment.env_kwargs": settings.env_kwargs}, trusted)
    return settings


write_video = episodes.write_video  # (kept importable from here)


def play_episodes(args: argparse.Namespace, env: BatchedEnv, transformer: SequentialDataTransformer,
                  algorithm: Algorithm, time_step: TimeStep, frames: list) -> list[float]:
    """Plays `args.num_episodes` episodes from `time_step` (after reset), printing each; returns their returns.

    With a --record_file, a frame is appended to `frames` after every step.
    """
    def report(index: int, episode_return: float, length: int) -> None:
        print(f"episode {index}: return {episode_return:.2f} length {length}", flush=True)

    policy = GreedyPolicy.frozen(transformer, algorithm, args.epsilon_greedy)
    return episodes.play_episodes(env, policy, time_step, args.num_episodes, frames if args.record_file else None,
                                  report)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    env = None
    try:
        check_args(args)
        trusted = trusted_prefixes(args.allow_import)
        ckpt = load_checkpoint(args.root_dir, args.checkpoint_step, args.best)
        config = load_policy_config(args.root_dir, ckpt, trusted, "play")
        env = create_env(args, trusted)
        transformer, algorithm = restore_policy(config, env, ckpt)
        time_step = env.reset()
        # The first frame is rendered before any step, so a missing render dependency fails before any episode.
        frames: list = [env.render()[0]] if args.record_file else []
        returns = play_episodes(args, env, transformer, algorithm, time_step, frames)
    except (PlayError, CheckpointError, ConfError, ValueError, TypeError, KeyError, ImportError,
            gym.error.Error) as err:
        # ValueError includes an env that breaks its contract (EnvContractError) during an episode; ImportError a
        # trusted (--allow_import) env module that is not installed.
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    finally:
        if env is not None:
            env.close()
    print(f"average return over {len(returns)} episodes: {sum(returns) / len(returns):.2f} "
          f"(checkpoint {ckpt.path})", flush=True)
    if args.record_file:
        fps = args.fps or int(env._venv.metadata.get("render_fps") or 30)
        write_video(args.record_file, frames, fps)
        print(f"recorded {len(frames)} frames to {args.record_file}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
