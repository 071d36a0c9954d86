"""Verify alfish checkpoints against their manifests and say what each holds.

    python -m alfish.tools.verify_checkpoint runs/sac                           # every checkpoint of a run
    python -m alfish.tools.verify_checkpoint runs/sac/checkpoints/ckpt-2000 --tensors

PATH is a results directory (its checkpoints/ folder), a folder of ckpt-N directories (checkpoints/, or a
checkpoints.damaged-<time>/ that a resume set aside) or one ckpt-N directory. Each checkpoint is verified as training
and play verify it (alfish.rundir.checkpoint.Checkpointer: every file's size and sha256 against the manifest, then
the tensors loaded with torch.load(weights_only=True), memory-mapped; nothing from PATH is executed or written) and
described: its iteration, env steps and world size; each tensor file's tensors (how many, their elements, dtypes and
bytes, the largest; --tensors lists every one with its shape); the keys of meta.json; whether it holds a replay buffer
and how many steps that holds.

Exit status: 0 when every checkpoint verifies; 1 when one does not (one line each saying what is wrong); 2 for a PATH
that is none of the above.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Iterator, Optional, Sequence

import torch

from alfish.console.printable import printable
from alfish.rundir.checkpoint import MANIFEST, META, Checkpointer, CheckpointError, LoadedCheckpoint
from alfish.tools.cli import ToolError, report

LARGEST_SHOWN = 3  # tensors named per file without --tensors


def locate(path: str) -> tuple[Checkpointer, list[int]]:
    """The Checkpointer of the folder holding the checkpoints ``path`` names, and their steps (ascending).

    Raises:
        ToolError: ``path`` is not a results directory, a folder of checkpoints or a checkpoint directory.
    """
    full = os.path.abspath(path)
    if not os.path.isdir(full):
        raise ToolError(f"{path} is not a directory; give a results directory, its checkpoints folder or one ckpt-N "
                        "directory")
    try:
        parent = Checkpointer(os.path.dirname(full))
        if os.path.basename(full) in {os.path.basename(parent.path_of(s)) for s in parent.steps()}:
            return parent, [int(os.path.basename(full)[len("ckpt-"):])]
        for folder in (os.path.join(full, "checkpoints"), full):
            checkpointer = Checkpointer(folder, root_dir=full)  # PATH as typed; no link followed below it
            if checkpointer.steps():
                return checkpointer, checkpointer.steps()
    except CheckpointError as err:  # a folder that cannot be listed
        raise ToolError(str(err)) from None
    raise ToolError(f"{path} holds no ckpt-N checkpoint directory, and neither does {path}/checkpoints (was the run "
                    "trained with TrainerConfig.num_checkpoints=0?)")


def leaves(nest: Any) -> Iterator[tuple[str, Any]]:
    """``(dotted path, leaf)`` for every tensor or python value in a checkpoint nest, depth first. Iterative: a nest
    from an untrusted file may be deeper than Python's recursion limit."""
    pending = [("", nest)]
    while pending:
        path, node = pending.pop()
        if isinstance(node, dict):
            items = list(node.items())
        elif isinstance(node, (list, tuple)):
            items = list(enumerate(node))
        else:
            yield path, node
            continue
        pending += [(f"{path}.{key}" if path else str(key), value) for key, value in reversed(items)]


def data_bytes(tensor: torch.Tensor) -> int:
    """The bytes of ``tensor``'s elements (a view counts its own elements)."""
    return tensor.numel() * tensor.element_size()


def size(n: float) -> str:
    """Bytes for people: '512 B', '4.8 KiB', '1.2 MiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def describe_group(name: str, nest: Any, file_bytes: int, list_all: bool) -> list[str]:
    """Lines describing one tensor file: its tensors' count, elements, dtypes and bytes, then the largest (or, with
    ``list_all``, every) tensor with its shape."""
    found = list(leaves(nest))
    tensors = [(path, t) for path, t in found if isinstance(t, torch.Tensor)]
    dtypes: dict[str, int] = {}
    for _, t in tensors:
        dtype = str(t.dtype).removeprefix("torch.")
        dtypes[dtype] = dtypes.get(dtype, 0) + 1
    others = len(found) - len(tensors)
    if not tensors:
        return [f"  {name}.pt ({size(file_bytes)}): no tensors" + (f", {others} other values" if others else "")]
    line = (f"  {name}.pt ({size(file_bytes)}): {len(tensors)} tensors, {sum(t.numel() for _, t in tensors):,} "
            f"elements, {size(sum(data_bytes(t) for _, t in tensors))} "
            f"({', '.join(f'{d} x{n}' for d, n in sorted(dtypes.items()))})"
            + (f"; {others} other values" if others else ""))
    shown = tensors if list_all else sorted(tensors, key=lambda item: -data_bytes(item[1]))[:LARGEST_SHOWN]
    lead = "" if list_all else "largest: "
    return [line] + [f"    {lead if i == 0 else ' ' * len(lead)}{path or '(top)'} {list(t.shape)} "
                     f"{str(t.dtype).removeprefix('torch.')} {size(data_bytes(t))}"
                     for i, (path, t) in enumerate(shown)]


def describe_replay(replay: Any) -> str:
    """Whether a checkpoint holds a replay buffer and how much: the steps its rings can still be read (per env,
    written minus the oldest readable), the steps ever written, and its bytes."""
    if replay is None:
        return "no (on-policy, or Trainer.save_replay_buffer=False)"
    total = size(sum(data_bytes(t) for _, t in leaves(replay) if isinstance(t, torch.Tensor)))
    online = replay.get("online", replay) if isinstance(replay, dict) else None  # a hybrid run's online part
    storage = online.get("storage") if isinstance(online, dict) else None
    if storage is None:
        return f"yes, {total}, without online storage (a purely offline run)"
    counts, oldest = (storage.get(k) if isinstance(storage, dict) else None for k in ("write_count", "oldest"))
    if not (isinstance(counts, torch.Tensor) and isinstance(oldest, torch.Tensor) and counts.shape == oldest.shape):
        return f"yes, {total}, in a layout this alfish does not know (no write_count/oldest of one shape)"
    readable = int((counts - oldest).clamp(min=0).sum())
    return (f"yes, {readable:,} steps readable over {counts.numel()} env(s) ({int(counts.sum()):,} written), {total}"
            + (" (hybrid: online part; offline data too)" if "online" in replay else ""))


def describe(ckpt: LoadedCheckpoint, list_all: bool = False) -> list[str]:
    """Lines saying what the verified checkpoint ``ckpt`` holds."""
    meta = ckpt.meta
    world = meta.get("world_size")
    lines = [f"  iteration {_shown(meta.get('iteration', ckpt.step))}, env steps {_shown(meta.get('env_steps'))}, "
             f"world size {_shown(world) if world is not None else '1 (not recorded)'}, "
             f"elapsed {_shown(meta.get('elapsed_s'))} s, layout {_shown(meta.get('layout', 1))}"]
    for name in sorted(ckpt.tensors):
        lines += describe_group(name, ckpt.tensors[name], os.path.getsize(os.path.join(ckpt.path, f"{name}.pt")),
                                list_all)
    lines.append(f"  {META} keys: {printable(', '.join(sorted(meta)))}")
    lines.append(f"  replay buffer: {describe_replay(ckpt.tensors.get('replay'))}")
    listed = {f"{name}.pt" for name in ckpt.tensors} | {META, MANIFEST}
    unlisted = sorted(set(os.listdir(ckpt.path)) - listed)
    if unlisted:  # never read by alfish, but not what the trainer wrote
        lines.append(f"  not in the manifest (never read): {printable(', '.join(unlisted))}")
    return lines


def _shown(value: Any, limit: int = 40) -> str:
    """A meta value (untrusted JSON) on one short line."""
    if isinstance(value, float):
        return f"{value:.1f}"
    text = printable(" ".join(str(value)[:4 * limit].split())) if value is not None else "?"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m alfish.tools.verify_checkpoint", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", metavar="PATH", help="a results directory, a checkpoints folder or a ckpt-N directory")
    parser.add_argument("--tensors", action="store_true", help="list every tensor with its shape, dtype and bytes")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        checkpointer, steps = locate(args.path)
    except ToolError as err:
        return report(err)
    failed = 0
    for step in steps:
        name = os.path.basename(checkpointer.path_of(step))
        try:
            ckpt = checkpointer.load(step)
        except CheckpointError as err:
            failed += 1
            print(f"{name}: FAILED: {printable(' '.join(str(err).split()))}", flush=True)
            continue
        print(f"{name}: verified ({ckpt.path})")
        print("\n".join(describe(ckpt, args.tensors)), flush=True)
    print(f"{len(steps)} checkpoint{'s' if len(steps) != 1 else ''}: {len(steps) - failed} verified, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
