"""An alfish results directory (or one of its checkpoints) as offline data: the replay buffer it saved.

A checkpoint stores the buffer's rings (``replay/storage``: leaves ``[num_envs, slots, ...]``, write counts, oldest
readable indices) and, in ``meta.json``, ``replay_layout``: the stored fields' names and the env's spaces. Each env's
readable history becomes whole episodes: steps before its first FIRST (an episode the ring had already partly
overwritten) are skipped, and an episode still running at the checkpoint ends at its newest step, marked LAST with its
discount kept (a truncation: bootstrapped). Rollout info (an algorithm's own per-step data) is not offline data and is
left out. The checkpoint is verified against its manifest and loaded with ``torch.load(weights_only=True)``; its
stored config is never read, so nothing from the directory is executed.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from alfish.data.types import StepType
from alfish.replay.offline.steps import Steps, space_from_json
from alfish.rundir.checkpoint import Checkpointer, LoadedCheckpoint
from alfish.rundir.checkpoint_meta import step_of_dir_name

_CORE = ("step_type", "reward", "discount", "action")


def is_alfish_run(path: str | os.PathLike) -> bool:
    path = Path(path)
    return (path / "checkpoints").is_dir() or is_checkpoint_dir(path)


def is_checkpoint_dir(path: Path) -> bool:
    return step_of_dir_name(path.name) is not None and (path / "manifest.json").is_file()


def load_run_checkpoint(path: str | os.PathLike) -> LoadedCheckpoint:
    """The newest verified checkpoint of results directory ``path``, or the checkpoint directory ``path`` itself
    (read below the folder that holds it, as typed: nothing inside is followed through a link)."""
    path = Path(path)
    step = step_of_dir_name(path.name)
    if step is not None and (path / "manifest.json").is_file():
        return Checkpointer(str(path.parent)).load(step)
    ckpt = Checkpointer(str(path / "checkpoints"), root_dir=str(path)).load_latest()
    if ckpt is None:
        raise ValueError(f"{path}: no valid checkpoint under {path / 'checkpoints'} to read a replay buffer from")
    return ckpt


def read_run(path: str | os.PathLike) -> Steps:
    """The replay buffer saved in the newest checkpoint of ``path`` (or checkpoint directory ``path``) as ``Steps``."""
    ckpt = load_run_checkpoint(path)
    where = ckpt.path
    layout = ckpt.meta.get("replay_layout")
    replay = ckpt.tensors.get("replay")
    if replay is None:
        raise ValueError(f"{where}: the checkpoint holds no replay buffer (the run was on-policy, or trained with "
                         "Trainer.save_replay_buffer=False); nothing to load as offline data")
    if not isinstance(layout, dict) or not isinstance(layout.get("fields"), list):
        raise ValueError(f"{where}: the checkpoint does not record its replay layout (written by an older alfish); "
                         "resume it once with this version to write a new checkpoint, then load that")
    if "storage" not in replay and "online" not in replay:
        raise ValueError(f"{where}: the run trained purely offline and saved no replay data of its own; load the "
                         "offline data it trained on (its TrainerConfig.offline_buffer_dir) instead")
    storage = replay["storage"] if "storage" in replay else replay["online"]["storage"]
    names = [str(n) for n in layout["fields"]]
    leaves = storage["leaves"]
    if len(leaves) != len(names) or any(f not in names for f in _CORE):
        raise ValueError(f"{where}: replay_layout names {len(names)} fields {names} but the buffer holds "
                         f"{len(leaves)}; the checkpoint is inconsistent")
    fields = dict(zip(names, leaves))
    write_count, oldest = storage["write_count"].tolist(), storage["oldest"].tolist()
    pieces: dict[str, list[np.ndarray]] = {name: [] for name in names if not name.startswith("rollout_info")}
    step_types: list[np.ndarray] = []
    for env, (begin, end) in enumerate(zip(oldest, write_count)):
        if end <= begin:
            continue
        width = leaves[0].shape[1]
        slots = np.arange(begin, end)
        if end > width:  # the ring wrapped: all its slots were saved
            slots = slots % width
        st = fields["step_type"][env].numpy()[slots]
        firsts = np.flatnonzero(st == StepType.FIRST)
        if len(firsts) == 0:
            continue  # no episode starts inside what is left of this ring
        slots, st = slots[firsts[0]:], st[firsts[0]:].copy()
        if st[-1] == StepType.FIRST:  # the newest step began an episode (an autoreset): it has no transition yet
            slots, st = slots[:-1], st[:-1]
        if len(slots) < 2:
            continue
        st[-1] = StepType.LAST  # a running episode ends as a truncation (its discount is kept)
        step_types.append(st)
        for name in pieces:
            pieces[name].append(fields[name][env].numpy()[slots])
    if not step_types:
        raise ValueError(f"{where}: the saved replay buffer holds no whole episode start; train longer before "
                         "using it as offline data")
    arrays = {name: np.concatenate(parts) for name, parts in pieces.items()}
    step_type = np.concatenate(step_types).astype(np.int8)
    obs_keys = sorted(n[len("observation."):] for n in arrays if n.startswith("observation."))
    observation = {k: arrays[f"observation.{k}"] for k in obs_keys} if obs_keys else arrays["observation"]
    return Steps(step_type=step_type, reward=arrays["reward"].astype(np.float32, copy=False),
                 discount=arrays["discount"].astype(np.float32, copy=False), observation=observation,
                 action=arrays["action"], num_episodes=int(np.count_nonzero(step_type == StepType.LAST)),
                 observation_space=space_from_json(layout.get("observation_space"), f"{where} replay_layout"),
                 action_space=space_from_json(layout.get("action_space"), f"{where} replay_layout"),
                 source=str(path))


