"""A trained run read back from its results directory (untrusted input: DESIGN.md §3.13), as every command that
acts with a trained policy (play, evaluate, collect, export) reads it: the checkpoint, the operative config it recorded
(parsed in the restricted mode), and the policy built from that config with the checkpoint's tensors loaded."""
from __future__ import annotations

import os
from typing import Optional

from alfish.algorithms.base import Algorithm
from alfish.algorithms.build import build_policy
from alfish.config import TrainerConfig, load_config_text
from alfish.console.printable import printable
from alfish.envs.batched_env import BatchedEnv
from alfish.envs.spec import EnvSpec
from alfish.rundir.checkpoint import META, Checkpointer, CheckpointError, LoadedCheckpoint
from alfish.trainer.lifecycle import BEST_DIR
from alfish.transforms.base import SequentialDataTransformer


class NoPolicyError(ValueError):
    """The run trained a supervised model: there is no policy to act with."""


def load_checkpoint(root_dir: str, step: Optional[int], best: bool = False) -> LoadedCheckpoint:
    """The checkpoint of iteration ``step`` (default: the newest that verifies), or with ``best`` the best policy
    kept in ``ROOT_DIR/checkpoints/best``."""
    if best:
        ckpt = Checkpointer(os.path.join(root_dir, BEST_DIR), root_dir=root_dir).load_latest()
        if ckpt is None:
            raise CheckpointError(f"no best checkpoint under {root_dir}/{BEST_DIR}; it is kept by runs with "
                                  "TrainerConfig.evaluate=True and Trainer.keep_best_checkpoint=True (the default)")
        return ckpt
    checkpointer = Checkpointer(os.path.join(root_dir, "checkpoints"), root_dir=root_dir)
    if step is not None:
        return checkpointer.load(step)
    ckpt = checkpointer.load_latest()
    if ckpt is None:
        raise CheckpointError(f"no valid checkpoint under {root_dir}/checkpoints; train first "
                              f"(python -m alfish.bin.train --root_dir {root_dir} ...)")
    return ckpt


def load_stored_config(root_dir: str, ckpt: LoadedCheckpoint, trusted: tuple[str, ...]) -> TrainerConfig:
    """Parses the checkpoint's operative config in the restricted mode (`trusted`: the module prefixes allowed)."""
    text = ckpt.meta.get("operative_config")
    if not isinstance(text, str):
        raise CheckpointError(f"checkpoint {ckpt.path}/{META} has no 'operative_config' text; it was not written by "
                              f"alfish's trainer")
    # Lines are counted within the operative_config string, not within the JSON file.
    load_config_text(text, f"{ckpt.path}/{META}[operative_config]", trusted)
    return TrainerConfig(root_dir=root_dir)


def load_policy_config(root_dir: str, ckpt: LoadedCheckpoint, trusted: tuple[str, ...], purpose: str) -> TrainerConfig:
    """``load_stored_config``, refusing a supervised run: ``purpose`` (e.g. 'play') says what needed a policy."""
    config = load_stored_config(root_dir, ckpt, trusted)
    if config.ml_type != "rl":
        raise NoPolicyError(f"{root_dir} trained a supervised model (TrainerConfig.ml_type={config.ml_type!r}): "
                            f"there is no policy to {purpose}")
    return config


def restore_policy(config: TrainerConfig, env: BatchedEnv,
                   ckpt: LoadedCheckpoint) -> tuple[SequentialDataTransformer, Algorithm]:
    """Builds the policy the stored config describes and loads the checkpoint's state into it."""
    transformer, algorithm = build_policy(config, EnvSpec.of(env))
    if "algorithm" not in ckpt.tensors:
        raise CheckpointError(f"checkpoint {ckpt.path} has no algorithm.pt; it was not written by alfish's trainer")
    try:
        if "transformers" in ckpt.tensors:  # e.g. the observation normalizer's statistics
            transformer.load_state_dict(ckpt.tensors["transformers"])
        algorithm.load_state_dict(ckpt.tensors["algorithm"])
    except (RuntimeError, KeyError, TypeError) as err:  # torch lists every mismatched tensor over many lines
        raise CheckpointError(f"checkpoint {ckpt.path} does not fit the policy its stored config builds "
                              f"({shortened(one_line(err))})") from None
    transformer.eval()
    algorithm.eval()
    return transformer, algorithm


def one_line(err: BaseException) -> str:
    """`err`'s message on one line (gin appends "In call to configurable ..." lines to errors it re-raises), with
    what is not printable escaped (``\x1b``): messages name files and quote content of the results directory."""
    return printable(" ".join(str(err).split())) or type(err).__name__


def shortened(text: str, limit: int = 300) -> str:
    """`text` cut to `limit` characters (torch's state-dict errors list every mismatched tensor)."""
    return text if len(text) <= limit else text[:limit - 3] + "..."
