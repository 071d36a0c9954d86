"""Export a trained policy from its results directory as one program: raw observations in, the greedy action out.

    python -m alfish.bin.export --root_dir RUN --format pt2|onnx [--out FILE] [--checkpoint_step N | --best]
                                [--allow_import PREFIX ...] [--seed S]

What the program computes is what ``play`` does with ``--epsilon_greedy 0``: the run's data transformers with their
statistics frozen (e.g. the observation normalizer's mean and variance), ``algorithm.predict_step`` (SAC, DDPG/TD3,
BC, IQL: the deterministic action, e.g. SAC's tanh of the mean; PPO/A2C: the mean, or the argmax for Discrete
actions; DQN: argmax Q), and a Box action clipped to the env's bounds as the env clips it:

    forward(*observations, *state) -> (action, *next_state)

observations: float32 ``[B, *obs_shape]`` (a Box of integers keeps its dtype, e.g. uint8 images); a Dict observation is
one input per key, named by the key. The batch dimension B is dynamic. action: int64 ``[B]`` (Discrete) or float32
``[B, *action_shape]`` (Box). A recurrent policy (``EncodingNetwork.rnn='gru'|'lstm'``) also takes its state and
returns the next one: pass zeros (``[B, *shape]``, as the JSON lists them) at an episode's first step and the returned
state after that. Transformers with per-env rollout state (``FrameStacker``) are refused.

Formats: ``pt2`` (``torch.export.export`` + ``torch.export.save``; run it with ``torch.export.load(FILE).module()``) or
``onnx`` (the dynamo exporter, ``torch.onnx.export(..., dynamo=True)``; needs ``pip install 'alfish[export]'``). Beside
FILE, FILE.json records the inputs and outputs, the spaces, the checkpoint and the versions. Default FILE:
RUN/export/policy-<checkpoint step>.<format>.

The command then loads FILE as a deployment would (pt2: ``torch.export.load``; onnx: onnxruntime, skipped with a note
when it is not installed) and compares it with the torch policy on 1000 observations sampled from the env's
observation space and on a 200-step rollout of the env; it prints the largest absolute difference of each output, and a
difference over 1e-5 is an error. FILE is written only when the check passes.

A results directory is untrusted input (DESIGN.md 3.13): its config is parsed as play parses it (registered
configurables only; imports and 'module:EnvId' env names only with --allow_import PREFIX), and checkpoints are loaded
with ``weights_only=True``.

Exit status: 0 when FILE was written and checked; 2 for bad input (flags, a missing or damaged checkpoint, an untrusted
import, a policy export does not support, a missing package), reported in one line; 1 when tracing, the check or
writing fails.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import sys
import time
from typing import Optional, Sequence

import gymnasium as gym
import numpy as np
import torch

from alfish.algorithms.base import Algorithm
from alfish.bin.output_path import why_unwritable
from alfish.bin.play import create_env
from alfish.bin.root_dir_args import add_allow_import, add_checkpoint_choice, add_root_dir, command_parser
from alfish.bin.stored_run import load_checkpoint, load_policy_config, one_line, restore_policy, shortened
from alfish.config import ConfError
from alfish.config.untrusted import trusted_prefixes
from alfish.envs.batched_env import BatchedEnv
from alfish.envs.spec import EnvSpec
from alfish.export.formats import FORMATS, SUFFIXES, check_format_packages, export_program, load_program
from alfish.export.policy_module import ExportedPolicy
from alfish.export.verify import TOLERANCE, CheckResult, ReferencePolicy, check_rollout, check_sampled
from alfish.rundir.checkpoint import CheckpointError, LoadedCheckpoint
from alfish.rundir.safe_paths import UnsafePathError, kind_in_root, make_dirs_in_root
from alfish.transforms.base import SequentialDataTransformer

SAMPLED_OBSERVATIONS = 1000
EXPORT_DIR = "export"  # the default --out's folder, inside the results directory
ROLLOUT_STEPS = 200


class ExportError(Exception):
    """A problem with export's arguments or what they name; its message is one line saying what to change."""


class ExportFailed(Exception):
    """Tracing, checking or writing the program failed (exit status 1); the message is one line."""


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = command_parser("python -m alfish.bin.export", __doc__)
    add_root_dir(parser, help_text="the results directory (RUN) to export from")
    # Checked in check_args rather than by argparse's choices/required, so a wrong value is one line, not usage.
    parser.add_argument("--format", default=None, help="pt2 (torch.export) or onnx")
    parser.add_argument("--out", default=None, help="the file to write, ending with .pt2 or .onnx "
                                                    "(default: RUN/export/policy-<step>.<format>)")
    add_checkpoint_choice(parser, best_help="the best evaluated policy (RUN/checkpoints/best)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the sampled observations and the rollout's env")
    add_allow_import(parser)
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    """Checks what argparse does not, before anything is loaded or traced.

    Raises:
        ExportError: one line naming the argument and what to change.
        MissingPackageError: the format's exporter is not installed.
    """
    if args.format is None:
        raise ExportError(f"--format is required: {' or '.join(FORMATS)}")
    if args.format not in FORMATS:
        raise ExportError(f"--format {args.format!r} is not one of {', '.join(FORMATS)}")
    if args.best and args.checkpoint_step is not None:
        raise ExportError("--best and --checkpoint_step name different checkpoints; give one")
    if args.out is not None:
        check_out(args.out, args.format)
    check_format_packages(args.format)


def check_out(path: str, fmt: str) -> None:
    """Refuses an --out that does not end with the format's suffix, is a directory, or could not be written."""
    if not path.endswith(SUFFIXES[fmt]):
        raise ExportError(f"--out {path!r} must end with {SUFFIXES[fmt]} for --format {fmt}")
    if os.path.isdir(path):
        raise ExportError(f"--out {path!r} is a directory; give a file name ending with {SUFFIXES[fmt]}")
    reason = why_unwritable(path)
    if reason is not None:
        raise ExportError(f"--out {path!r} cannot be written: {reason}")


def export(args: argparse.Namespace) -> tuple[str, dict]:
    """Loads RUN's policy, writes it to a temporary file, checks it, then moves it into place; returns the path and
    the JSON record written beside it."""
    trusted = trusted_prefixes(args.allow_import)
    ckpt = load_checkpoint(args.root_dir, args.checkpoint_step, args.best)
    config = load_policy_config(args.root_dir, ckpt, trusted, "export")
    out = args.out or default_out(args.root_dir, f"policy-{ckpt.step}{SUFFIXES[args.format]}")
    check_out(out, args.format)
    env = create_env(argparse.Namespace(render=False, record_file=None, seed=args.seed), trusted)
    try:
        spec = EnvSpec.of(env)
        transformer, algorithm = restore_policy(config, env, ckpt)
        algorithm.requires_grad_(False)
        policy = ExportedPolicy(transformer, algorithm, spec).eval()
        make_out_dir(args, out)
        tmp = os.path.join(os.path.dirname(os.path.abspath(out)),
                           f".{os.path.basename(out)}.tmp-{os.getpid()}{SUFFIXES[args.format]}")
        created = False
        try:
            _create_new(tmp)  # the exporters write by name: into a regular file just made, never through a link
            created = True
            seconds = _trace(policy, spec, args, tmp)
            print(f"exported {ckpt.path} ({type(algorithm).__name__}{_recurrent_note(policy)}) as {args.format} in "
                  f"{seconds:.2f} s", flush=True)
            checks = _check(policy, transformer, algorithm, env, tmp, args)
            record = export_record(args, out, ckpt, env, policy, seconds, checks)
            os.replace(tmp, out)
        finally:
            if created and os.path.lexists(tmp):
                os.remove(tmp)
    finally:
        env.close()
    write_json(out + ".json", record)
    return out, record


def _check(policy: ExportedPolicy, transformer: SequentialDataTransformer, algorithm: Algorithm, env: BatchedEnv,
           path: str, args: argparse.Namespace) -> list[CheckResult]:
    """Loads the program at ``path`` as a deployment would, compares it with the torch policy (printing each
    comparison) and returns the results; none when onnxruntime is missing (said in a note).

    Raises:
        ExportFailed: the program does not load or run, or differs by more than ``TOLERANCE``.
    """
    runtime = "torch.export.load" if args.format == "pt2" else "onnxruntime"
    try:
        loaded = load_program(path, args.format)
    except Exception as err:  # noqa: BLE001  (each runtime raises its own types for a file it cannot load)
        raise ExportFailed(f"{runtime} could not load the exported program: {shortened(one_line(err))}") from None
    if loaded is None:
        print("check skipped: onnxruntime is not installed, so the ONNX file was not run (pip install "
              "'alfish[export]')", flush=True)
        return []

    def run(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        try:
            return loaded(inputs)
        except Exception as err:  # noqa: BLE001  (as above; the env's and the torch policy's errors pass through)
            raise ExportFailed(f"the program loaded by {runtime} failed to run: {shortened(one_line(err))}") from None

    reference = ReferencePolicy(transformer, algorithm, env.action_space)
    checks = [check_sampled(policy, reference, run, env.observation_space, SAMPLED_OBSERVATIONS, args.seed),
              check_rollout(policy, reference, run, env, ROLLOUT_STEPS, args.seed)]
    for check in checks:
        print(f"check: {check.describe()}", flush=True)
        if not check.worst <= TOLERANCE:  # (NaN fails too)
            output = max(check.max_abs_diff, key=lambda k: check.max_abs_diff[k])
            raise ExportFailed(f"the exported program's {output} differs from the torch policy's by "
                               f"{check.worst:.3g} (more than {TOLERANCE:g}) on the {check.name}; nothing was written")
    return checks


def _trace(policy: ExportedPolicy, spec: EnvSpec, args: argparse.Namespace, path: str) -> float:
    """Traces and writes ``policy`` to ``path``; returns the seconds it took."""
    space = spec.observation_space
    space.seed(args.seed)
    # A batch of 2: torch.export specializes a dimension it sees as 1, and the batch must stay dynamic.
    example_obs = [space.sample() for _ in range(2)]
    leaves = ([np.stack(example_obs)] if policy.observation_keys is None else
              [np.stack([o[k] for o in example_obs]) for k in policy.observation_keys])
    example = [torch.as_tensor(x.astype(s.dtype)) for x, s in zip(leaves, policy.observation_specs)]
    example += policy.initial_state(2)
    start = time.perf_counter()
    try:
        export_program(policy, example, args.format, path)
    except Exception as err:  # noqa: BLE001  (torch.export and torch.onnx raise many types for what they cannot trace)
        raise ExportFailed(f"{'torch.export' if args.format == 'pt2' else 'torch.onnx.export'} could not trace the "
                           f"policy: {shortened(one_line(err))}") from None
    return time.perf_counter() - start


def export_record(args: argparse.Namespace, out: str, ckpt: LoadedCheckpoint, env: BatchedEnv, policy: ExportedPolicy,
                  seconds: float, checks: list[CheckResult]) -> dict:
    """What FILE.json holds: how to call the program, where it came from, how it was checked."""
    return {
        "format": args.format,
        "file": os.path.basename(out),
        "inputs": [s.as_json() for s in policy.input_specs],
        "outputs": [s.as_json() for s in policy.output_specs],
        "observation_space": space_json(env.observation_space),
        "action_space": space_json(env.action_space),
        "recurrent": policy.recurrent,
        "state": {"inputs": [s.as_json() for s in policy.state_specs],
                  "at_episode_start": "zeros (the algorithm's initial_state)",
                  "next_step": "the next_state outputs of this step"} if policy.recurrent else None,
        "env_name": env.env_name,
        "checkpoint": {"root_dir": os.path.abspath(args.root_dir), "path": os.path.abspath(ckpt.path),
                       "step": ckpt.step},
        "versions": {"alfish": _alfish_version(), "torch": torch.__version__},
        "export_seconds": round(seconds, 3),
        "check": {"tolerance": TOLERANCE, "skipped": not checks,
                  "results": [{"name": c.name, "count": c.count, "max_abs_diff": c.max_abs_diff} for c in checks]},
    }


def space_json(space: gym.Space) -> dict:
    """A space's type, shape and dtype, with a Box's bounds, a Discrete's ``n`` and ``start``, a MultiDiscrete's
    ``nvec`` and ``start`` (choices per sub-action), a MultiBinary's ``n``, a Dict's keys and a Tuple's parts."""
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "spaces": {k: space_json(v) for k, v in space.spaces.items()}}
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_json(v) for v in space.spaces]}
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec.tolist(), "start": space.start.tolist()}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, gym.spaces.Box):
        return {"type": "Box", "shape": list(space.shape), "dtype": np.dtype(space.dtype).name,
                "low": space.low.tolist(), "high": space.high.tolist()}
    return {"type": type(space).__name__}


def write_json(path: str, record: dict) -> None:
    """Writes ``record`` to ``path`` through a temporary file (a reader never sees half a file) that is created new
    (``x``: a link or file already there is an error, never written through)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    created = False
    try:
        with open(tmp, "x") as f:
            created = True
            json.dump(record, f, indent=2, allow_nan=True)
            f.write("\n")
        os.replace(tmp, path)
    finally:
        if created and os.path.lexists(tmp):
            os.remove(tmp)


def default_out(root_dir: str, name: str) -> str:
    """``RUN/export/<name>``, refused when ``export/`` is a link (or not a directory) or ``name`` in it is anything
    but a regular file (a rename replaces a link, it never writes through one; a directory or FIFO there is a
    mistake to name). ``export/`` is made later, by ``make_out_dir``, once there is something to write.

    Raises:
        ExportError: one line naming the link (or what else is there) and what to do.
    """
    out = os.path.join(os.path.abspath(root_dir), EXPORT_DIR, name)
    try:
        kind = kind_in_root(root_dir, out)
    except UnsafePathError as err:
        raise ExportError(f"{err} (or give --out)") from None
    if kind not in ("missing", "file"):
        raise ExportError(f"{out} is a {kind}, not a file; remove it or give --out")
    return out


def make_out_dir(args: argparse.Namespace, out: str) -> None:
    """Create ``out``'s folder: the default one below the results directory without following a link; a folder the
    user typed (``--out``) as typed."""
    if args.out is None:
        make_dirs_in_root(args.root_dir, EXPORT_DIR)
    else:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)


def _create_new(path: str) -> None:
    """Create the empty file ``path``; an entry already there (a link included) is an error (O_EXCL)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666))


def _recurrent_note(policy: ExportedPolicy) -> str:
    if not policy.recurrent:
        return ""
    return "; recurrent, state inputs " + ", ".join(f"{s.name} {list(s.shape)}" for s in policy.state_specs)


def _alfish_version() -> str:
    try:
        return importlib.metadata.version("alfish")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        check_args(args)
        out, record = export(args)
    except (ExportError, CheckpointError, ConfError, ValueError, TypeError, KeyError, ImportError,
            gym.error.Error) as err:
        # ValueError includes a policy export does not support (NotExportableError) and an env that breaks its
        # contract; ImportError a missing package of the export extra or a trusted env module that is not installed.
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    except ExportFailed as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"error: writing the exported policy failed: {one_line(err)}", file=sys.stderr)
        return 1
    print(f"wrote {out} and {out}.json", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
