"""Videos of evaluation episodes (``Trainer.eval_video_interval = K``: every K-th evaluation; the trainer's
``EvalVideoCallback`` in ``alfish/trainer/lifecycle.py`` calls ``EvalVideo``).

Each video is one greedy episode of the evaluated policy (with ``async_eval``, the evaluated snapshot), written to
``ROOT_DIR/videos/eval-<evaluated iteration>.mp4`` (``Trainer.eval_video_format = 'gif'`` for a GIF) on rank 0. The
episode runs in the training process on an env of its own (the ``eval``-scoped ``create_environment`` bindings, one
env, ``render_mode='rgb_array'``) and a copy of the policy: training waits for it, one episode per K evaluations.
Needs the 'render' extra (imageio; imageio-ffmpeg for .mp4), checked when the run is built.

imageio writes by file name, so the video goes to a new temporary name in ``videos/`` (a real folder inside the
root_dir: ``safe_paths.make_dirs_in_root`` refuses a symlinked one) and is renamed into place; an ``eval-<N>`` that
exists as anything but a regular file (a symlink, ...) is refused, never written through.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import os
import secrets
import time
from typing import Any, Optional

import gin
from torch import nn

from alfish.envs.batched_env import BatchedEnv, create_environment
from alfish.evaluate.acting import GreedyPolicy
from alfish.evaluate.episodes import play_episodes, write_video
from alfish.evaluate.evaluator import policy_snapshot
from alfish.rundir.safe_paths import make_dirs_in_root, remove_tree_in_root, rename_in_root, require_kind_in_root

VIDEO_FORMATS = ("mp4", "gif")
RENDER_EXTRA = "pip install 'alfish[render]'"


def check_video_support(video_format: str) -> None:
    """A one-line error now, rather than at the first video, when the video cannot be written."""
    if video_format not in VIDEO_FORMATS:
        raise ValueError(f"Trainer.eval_video_format={video_format!r} is not one of {VIDEO_FORMATS}")
    try:
        import imageio.v2  # noqa: F401
        if video_format == "mp4":
            import imageio_ffmpeg

            imageio_ffmpeg.get_ffmpeg_exe()
    except (ImportError, RuntimeError):
        raise ValueError(f"Trainer.eval_video_interval needs imageio{' and imageio-ffmpeg' * (video_format == 'mp4')}"
                         f", which is not installed: {RENDER_EXTRA} (or Trainer.eval_video_format = 'gif')") from None


class EvalVideo:
    """Records one greedy episode every ``interval`` evaluations (module docstring); the trainer calls it from its
    lifecycle callback (``alfish/trainer/lifecycle.py``) with each recorded evaluation."""

    def __init__(self, root_dir: str, interval: int, video_format: str = "mp4", seed: int = 0):
        check_video_support(video_format)
        self.root_dir = root_dir
        self.directory = os.path.join(os.path.abspath(root_dir), "videos")
        self.interval, self.video_format, self.seed = interval, video_format, seed
        self.count = 0
        self.last_written: Optional[tuple[int, str]] = None  # (evaluated iteration, path) of the newest video
        self.env: Optional[BatchedEnv] = None
        self.policy: Optional[tuple[Any, Any]] = None  # (transformer, algorithm) copies the episodes act with

    def after_evaluation(self, algorithm: nn.Module, transformer: nn.Module, iteration: int,
                         snapshot: Optional[dict[str, Any]]) -> None:
        """One evaluation was recorded: ``iteration`` is the evaluated one, ``snapshot`` its parameters (``None``:
        the current ones of ``algorithm`` and ``transformer``)."""
        self.count += 1
        if self.count % self.interval:
            return
        start = time.monotonic()
        if self.env is None:
            with gin.config_scope("eval"):
                self.env = create_environment(num_parallel_environments=1, seed=self.seed, vectorization="sync",
                                              render_mode="rgb_array")
            self.policy = (copy.deepcopy(transformer).cpu(), copy.deepcopy(algorithm).cpu())
        own_transformer, own_algorithm = self.policy
        snapshot = snapshot or policy_snapshot(algorithm, transformer)
        own_transformer.load_state_dict(snapshot["transformers"])
        own_algorithm.load_state_dict(snapshot["algorithm"])
        own_transformer.eval(), own_algorithm.eval()
        time_step = self.env.reset(seed=self.seed + self.count)
        frames = [self.env.render()[0]]
        returns = play_episodes(self.env, GreedyPolicy.frozen(own_transformer, own_algorithm), time_step, 1,
                                frames=frames)
        path = os.path.join(self.directory, f"eval-{iteration}.{self.video_format}")
        self._write(path, frames, int(self.env._venv.metadata.get("render_fps") or 30))
        self.last_written = (iteration, path)
        logging.info("evaluation video (return %.2f, %d frames, %.1f s): %s", returns[0], len(frames),
                     time.monotonic() - start, path)

    def _write(self, path: str, frames: list, fps: int) -> None:
        """``write_video`` to a new temporary name in ``videos/``, renamed to ``path`` (see the module docstring)."""
        make_dirs_in_root(self.root_dir, self.directory)
        require_kind_in_root(self.root_dir, path, "file")
        tmp = os.path.join(self.directory, f".tmp-{secrets.token_hex(4)}-{os.path.basename(path)}")
        require_kind_in_root(self.root_dir, tmp, "file")
        try:
            write_video(tmp, frames, fps)
            rename_in_root(self.root_dir, tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):  # the write's own error is the one to report
                remove_tree_in_root(self.root_dir, tmp)
            raise

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None
