"""What a checkpoint holds and how the parts are restored from one: a function of the parts and the checkpoint
(no envs, no processes), so resuming is testable on its own.

Layout 2 (this alfish): tensors ``algorithm``, ``transformers``, ``learner`` (optimizer, AMP scaler, update count),
``rng`` and, with ``Trainer.save_replay_buffer``, ``replay`` (storage and sampler); meta: ``layout``, the counters,
the seed, the episode count, the RNG's JSON half, the operative config, versions and the job's ``world_size`` (DDP
ranks). Play reads only ``algorithm``, ``transformers`` and the operative config, which layout 1 had too.

A checkpoint resumes only with the world size that wrote it: each rank has its own envs, env seeds and replay buffer
(per-rank ``num_parallel_environments``), and the counters advance by the job's total envs, so another world size
would be a different run. A layout-2 checkpoint without ``world_size`` was written before alfish recorded it and is
read as a 1-rank job: multi-rank jobs then split the conf's envs and batch across ranks, so such a job cannot be
continued under today's per-rank settings anyway.

Choosing the resume point (``choose_resume_point``) never costs a checkpoint: the newest one that verifies is
resumed; newer ones that do not verify are moved to ``<root_dir>/checkpoints.damaged-<time>/`` (with a warning) so
that no later save replaces a file nobody could read; when checkpoints exist and none verifies, the run refuses to
start and names them. ``--fresh`` (``fresh=True``) starts over: the previous run's checkpoints, TensorBoard events and
evaluation log are moved to ``<root_dir>/before-fresh-<time>/`` first. Nothing is ever deleted.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Iterator, Optional

import gin
import torch
import torch.distributed as dist

from alfish.algorithms.base import Algorithm
from alfish.collect.collector import example_experience
from alfish.collect.episode_stats import EpisodeStats
from alfish.envs.episode_log import MAX_LOGGED_ACTIONS
from alfish.envs.spec import EnvSpec
from alfish.learn.distributed import DistContext, broadcast_object
from alfish.learn.learner import Learner
from alfish.replay.null_replay import NullReplay
from alfish.replay.offline.steps import space_to_json
from alfish.replay.replay_buffer import ReplayBuffer
from alfish.rundir.checkpoint import Checkpointer, CheckpointError, CheckpointWriteError, LoadedCheckpoint
from alfish.rundir.disk import write_failure
from alfish.rundir.rng import capture_rng_state, restore_rng_state
from alfish.rundir.set_aside import aside_path, start_over
from alfish.seeding import reseed, seed_everything
from alfish.trainer.counters import Counters
from alfish.transforms.base import DataTransformer

CHECKPOINT_LAYOUT = 2
# What a run leaves in its root_dir that a run started over would mix with its own (``--fresh`` moves them aside).
_MAX_LISTED = 4  # damaged checkpoints named in the refusal, the rest counted
# What ``restore`` reads from meta (its numbers are checked in range when the checkpoint is read:
# alfish.rundir.checkpoint_meta).
_RESUMED_META = ("iteration", "env_steps", "unroll_credit", "seed", "rng")


def check_resumable(ckpt: LoadedCheckpoint, world_size: Optional[int] = None) -> None:
    """CheckpointError unless ``ckpt`` was written with this alfish's checkpoint layout and, when ``world_size`` is
    given, by a job of that many ranks (a checkpoint without the record counts as 1 rank)."""
    layout = ckpt.count("layout", 1)
    if layout != CHECKPOINT_LAYOUT:
        raise CheckpointError(f"checkpoint {ckpt.path} was made by an older alfish (checkpoint layout {layout}, this "
                              f"version reads {CHECKPOINT_LAYOUT}); resume it with the alfish that wrote it, or "
                              "train into a new root_dir (play still reads it)")
    written_by = ckpt.count("world_size", 1)
    if world_size is not None and world_size != written_by:
        launch = (f"{written_by} ranks (e.g. torchrun --nproc_per_node={written_by})" if written_by > 1
                  else "a single process (python -m alfish.bin.train, without torchrun)")
        raise CheckpointError(f"checkpoint {ckpt.path} was written by a {written_by}-rank job and this job has "
                              f"{world_size}; resume it with {launch} (replay buffers and env seeds are per rank), or "
                              "train into a new root_dir")


def job_world_size() -> int:
    """The number of ranks of the process group this process is in (1 outside torchrun)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


@dataclasses.dataclass(frozen=True)
class CheckpointedParts:
    """The parts whose state a checkpoint holds and ``restore`` puts back. ``replay``: the buffer, left out of the
    checkpoint when ``None`` or when its state is empty (``NullReplay``: a run that stores no experience); ``spec``:
    the env's spaces (recorded with the buffer's field names, ``meta['replay_layout']``, so that the buffer can be
    read as an offline dataset)."""

    algorithm: Algorithm
    transformer: DataTransformer
    learner: Learner
    counters: Counters
    stats: EpisodeStats
    replay: Optional[ReplayBuffer | NullReplay]
    spec: EnvSpec


def checkpoint_contents(parts: CheckpointedParts, seed: int, world_size: Optional[int] = None,
                        collector_state: Optional[dict] = None,
                        pending_evaluations: Optional[list] = None) -> tuple[dict, dict]:
    """``(tensors, meta)`` for ``Checkpointer.save``. ``world_size``: the job's number of ranks (``None``: read from
    the process group). ``collector_state``: the envs' episodes in flight and the unroll's state
    (``Collector.state_dict``), for an exact resume. ``pending_evaluations``: asynchronous evaluations sent and not
    yet recorded (re-run on resume)."""
    rng_tensors, rng_meta = capture_rng_state()
    tensors = dict(algorithm=parts.algorithm.state_dict(), transformers=parts.transformer.state_dict(),
                   learner=parts.learner.state_dict(), rng=rng_tensors)
    replay_state = parts.replay.state_dict() if parts.replay is not None else {}
    if replay_state:
        tensors["replay"] = replay_state
    if collector_state is not None:
        tensors["collector"] = collector_state
    if pending_evaluations:
        tensors["pending_evaluations"] = pending_evaluations
    meta = dict(run_meta(parts.counters, seed, world_size), num_episodes=parts.stats.num_episodes, rng=rng_meta,
                reproducibility=reproducibility_settings(parts.learner))
    if replay_state:
        meta["replay_layout"] = replay_layout(parts.replay, parts.spec)
    return tensors, meta


def run_meta(counters: Counters, seed: int, world_size: Optional[int] = None) -> dict:
    """What every checkpoint's meta holds, the best policy's too: the layout, the counters, the seed, the operative
    config (what play and export rebuild the policy from), the torch version, the job's world size."""
    return dict(layout=CHECKPOINT_LAYOUT, **counters.state_dict(), seed=seed,
                operative_config=gin.operative_config_str(), versions=dict(torch=torch.__version__),
                world_size=job_world_size() if world_size is None else int(world_size))


def reproducibility_settings(learner: Learner) -> dict:
    """What an exact resume needs to be the same as when the checkpoint was written (a resume under other settings
    warns): the training device type, torch's thread count, the compile mode, deterministic algorithms."""
    return dict(device=learner.device.type, threads=torch.get_num_threads(),
                compile_mode=getattr(learner, "compile_mode", None),
                deterministic_algorithms=torch.are_deterministic_algorithms_enabled())


def warn_on_other_settings(ckpt: LoadedCheckpoint, learner: Learner) -> None:
    recorded, now = ckpt.meta.get("reproducibility"), reproducibility_settings(learner)
    if not isinstance(recorded, dict):
        return
    changed = [f"{k} {recorded.get(k)!r} -> {now[k]!r}" for k in now if recorded.get(k) != now[k]]
    if changed:
        logging.warning("resuming under other settings than %s was written with (%s): the run continues, but not "
                        "tensor for tensor as it would have without the stop", ckpt.path, ", ".join(changed))


def replay_layout(replay: ReplayBuffer, spec: EnvSpec) -> dict:
    """The stored fields' names (in the order of the checkpoint's leaves) and the env's spaces, as JSON."""
    return {"fields": replay.storage.field_names(), "observation_space": space_to_json(spec.observation_space),
            "action_space": space_to_json(spec.action_space)}


def restore(ckpt: LoadedCheckpoint, parts: CheckpointedParts, rank: int = 0, rank_seed: int = 0) -> Optional[dict]:
    """Load every part's state from ``ckpt``, the global RNGs last; returns the collector's state (the envs'
    episodes in flight), for ``Collector.start(resume=...)``, or None. A replay buffer absent from the checkpoint
    stays empty. When the collector cannot be put back exactly, the caller cuts the stored episodes
    (``replay.truncate_episodes``): the envs restart. Rank ``r > 0`` of a DDP job, which loads rank 0's checkpoint,
    continues on an RNG stream of its own (and its envs restart)."""
    check_resumable(ckpt)
    missing = [key for key in _RESUMED_META if key not in ckpt.meta]
    if missing:
        raise CheckpointError(f"checkpoint {ckpt.path}/meta.json has no {', '.join(missing)} (the trainer's "
                              "checkpoints have them): it was altered or not written by alfish's trainer; move it "
                              "away to resume from an older one")
    meta, tensors = ckpt.meta, ckpt.tensors
    # the example first: building it draws an action, which must come before the RNG is restored
    example = example_experience(parts.algorithm, parts.transformer, parts.spec)
    parts.algorithm.load_state_dict(tensors["algorithm"])
    parts.transformer.load_state_dict(tensors["transformers"])
    parts.learner.load_state_dict(tensors["learner"])
    parts.counters.load_state_dict(dict(iteration=ckpt.count("iteration"), env_steps=ckpt.count("env_steps"),
                                        unroll_credit=ckpt.real("unroll_credit"), elapsed_s=ckpt.real("elapsed_s", 0)))
    parts.stats.num_episodes = ckpt.count("num_episodes", 0)
    if parts.replay is not None and "replay" in tensors:
        parts.replay.load_state_dict(tensors["replay"], example)
    restore_rng_state(tensors["rng"], meta["rng"])
    if rank > 0:
        seed_everything(reseed(rank_seed, parts.counters.iteration))
    logging.info("resumed from %s: iteration %d, env steps %d", ckpt.path, parts.counters.iteration,
                 parts.counters.env_steps)
    warn_on_other_settings(ckpt, parts.learner)
    if rank > 0 or ckpt.count("world_size", 1) != 1:
        return None
    return checked_collector_state(tensors.get("collector"), parts.counters.env_steps, ckpt.path)


def checked_collector_state(state: Any, env_steps: int, path: str) -> Optional[dict]:
    """The collector's state as read from checkpoint ``path`` (``state``), or None with one warning when it is
    damaged (``collector_state_problem``): the envs then restart instead of replaying their episodes in flight,
    as for an env that is not deterministic (an inexact resume; the checkpoint's other parts are intact)."""
    if state is None:
        return None
    problem = collector_state_problem(state, env_steps)
    if problem is None:
        return state
    logging.warning("checkpoint %s: its record of the envs' episodes in flight is damaged (%s); the envs restart "
                    "instead of replaying them (the resume is not exact)", path, problem)
    return None


def collector_state_problem(state: Any, env_steps: int) -> Optional[str]:
    """What makes a checkpoint's collector state unusable (None: nothing). Every tensor must hold the elements it
    claims (a stride-0 or overlapping tensor, or one larger than its storage, can make a few KB on disk stand for
    gigabytes); each env's action log must be contiguous and hold at most ``MAX_LOGGED_ACTIONS`` actions, and at most
    the env steps each env took by the checkpoint's counters (``env_steps`` over the number of envs)."""
    if not isinstance(state, dict) or not isinstance(state.get("envs"), list) or not state["envs"]:
        return "it has no list of env states"
    for where, tensor in _tensor_leaves(state, "collector"):
        problem = tensor_layout_problem(tensor)
        if problem is not None:
            return f"{where}: {problem}"
    per_env = max(0, int(env_steps)) // len(state["envs"])
    bound = min(MAX_LOGGED_ACTIONS, per_env)
    for index, env in enumerate(state["envs"]):
        actions = env.get("actions") if isinstance(env, dict) else None
        if not isinstance(actions, torch.Tensor) or actions.dim() < 1 or not actions.is_contiguous():
            return f"env {index}: its actions are not a contiguous tensor of at least one dimension"
        if actions.shape[0] > bound:
            return (f"env {index}: it claims {actions.shape[0]} logged actions, more than the {bound} its "
                    f"{per_env} env steps (and the log's cap, {MAX_LOGGED_ACTIONS}) allow")
    return None


def tensor_layout_problem(tensor: torch.Tensor) -> Optional[str]:
    """Why ``tensor`` does not hold the elements its shape claims, each once (None: it does): a broadcast
    (stride-0) dimension, more elements than its storage holds, or a view reaching past its storage."""
    if tensor.numel() == 0:
        return None
    if any(stride == 0 and size > 1 for stride, size in zip(tensor.stride(), tensor.shape)):
        return f"a broadcast tensor (shape {list(tensor.shape)}, strides {list(tensor.stride())})"
    if any(stride < 0 for stride in tensor.stride()):
        return f"negative strides {list(tensor.stride())}"
    held = tensor.untyped_storage().nbytes() // max(1, tensor.element_size())
    extent = tensor.storage_offset() + 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape,
                                                                                            tensor.stride()))
    if tensor.numel() > held or extent > held:
        return (f"a tensor of shape {list(tensor.shape)} (strides {list(tensor.stride())}) over a storage of {held} "
                "elements")
    return None


def _tensor_leaves(nest: Any, where: str) -> Iterator[tuple[str, torch.Tensor]]:
    """``(path, tensor)`` for every tensor in a nest of dicts, lists and tuples (as a checkpoint holds them)."""
    if isinstance(nest, torch.Tensor):
        yield where, nest
    elif isinstance(nest, dict):
        for key, value in nest.items():
            yield from _tensor_leaves(value, f"{where}[{key!r}]")
    elif isinstance(nest, (list, tuple)):
        for index, value in enumerate(nest):
            yield from _tensor_leaves(value, f"{where}[{index}]")


def choose_resume_point(root_dir: str, checkpointer: Checkpointer, dist_ctx: DistContext,
                        fresh: bool = False) -> Optional[LoadedCheckpoint]:
    """The checkpoint this run resumes from (None: it starts at iteration 0), the same on every rank.

    Rank 0 decides: with ``fresh`` it first moves the previous run aside (``start_over``); then it resumes from the
    newest checkpoint that verifies, moving newer damaged ones aside, and refuses when checkpoints exist but none
    verifies. The other ranks load the step rank 0 chose (or raise its error), so no rank reads a checkpoint that
    rank 0 is moving.

    Raises:
        CheckpointError: every checkpoint is damaged (one line naming them and the choices), or the chosen one cannot
            be resumed by this job (``check_resumable``).
    """
    if dist_ctx.is_main:
        error: Optional[BaseException] = None
        try:
            ckpt = _choose_on_main(root_dir, checkpointer, fresh)
            decision = ("resume", ckpt.step) if ckpt is not None else ("start", None)
        except OSError as e:  # moving checkpoints aside failed (permissions, a read-only or full disk)
            ckpt, error = None, CheckpointWriteError(write_failure("", e.filename or root_dir, e))
            error.__cause__ = e
            decision = ("error", str(error))
        except Exception as e:  # noqa: BLE001  (the other ranks must hear of any failure, not wait for a timeout)
            ckpt, error, decision = None, e, ("error", " ".join(str(e).split()))
        broadcast_object(decision, dist_ctx)
        if error is not None:
            raise error
    else:
        decision = broadcast_object(None, dist_ctx)
        if decision[0] == "error":
            raise CheckpointError(f"rank 0 could not choose the checkpoint to resume from: {decision[1]}")
        ckpt = checkpointer.load(decision[1]) if decision[0] == "resume" else None
    if ckpt is not None:
        check_resumable(ckpt, dist_ctx.world_size)
    return ckpt


def _choose_on_main(root_dir: str, checkpointer: Checkpointer, fresh: bool) -> Optional[LoadedCheckpoint]:
    if fresh:
        start_over(root_dir)
    scan = checkpointer.scan()
    if scan.latest is None and scan.damaged:
        raise CheckpointError(refusal_message(root_dir, checkpointer, scan.damaged))
    if scan.damaged:  # newer than the one resumed: keep them, out of the way of this run's saves
        dest = aside_path(root_dir, "checkpoints.damaged")
        checkpointer.set_aside([step for step, _ in scan.damaged], dest)
        logging.warning("moved %d checkpoint(s) that do not verify (newer than step %d) to %s; nothing was deleted",
                        len(scan.damaged), scan.latest.step, dest)
    return scan.latest


def refusal_message(root_dir: str, checkpointer: Checkpointer,
                    damaged: list[tuple[int, CheckpointError]]) -> str:
    """One line: which checkpoints fail verification (their first bad file), and what the user can do."""
    listed = [e.file or checkpointer.path_of(step) for step, e in damaged[:_MAX_LISTED]]
    more = f" and {len(damaged) - _MAX_LISTED} more" if len(damaged) > _MAX_LISTED else ""
    return (f"none of the {len(damaged)} checkpoint(s) in {checkpointer.ckpt_root} verifies (damaged: "
            f"{', '.join(listed)}{more}; the warnings above say why); to start from iteration 0 rerun with --fresh "
            f"(moves them to {os.path.join(root_dir, 'before-fresh-<time>')}, deletes nothing), or put intact "
            "copies back to resume")
