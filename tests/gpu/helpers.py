"""What the GPU tests share: the device they run on, real-valued batches there, trainers built from conf text and
started, the host-sync guard and the precision variants.

``DEVICE`` is CUDA unless ``ALFISH_TEST_DEVICE`` names another device (``cpu``: run the bodies without a GPU, to check
the tests' own code; the CUDA-only parts skip themselves with ``cuda_only``).
"""
from __future__ import annotations

import contextlib
import os
import pathlib
from typing import Any, Iterator, Sequence

import gin
import gymnasium as gym
import pytest
import torch

from alfish.config import TrainerConfig, load_conf
from alfish.data import nest
from alfish.data.types import Experience, StepType, TimeStep

#: The device every test here trains on.
DEVICE = torch.device(os.environ.get("ALFISH_TEST_DEVICE", "cuda"))
ON_CUDA = DEVICE.type == "cuda"
REPO = pathlib.Path(__file__).resolve().parents[2]

#: ``AmpPolicy.dtype`` of each precision variant (fp32: AMP off).
AMP_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
#: Updates the non-finite guard lets pass between its reads: far more than any test makes, so no read (a sync) falls
#: inside a guarded region.
NO_FINITE_READS = 1000


def skip_reason() -> str | None:
    """Why the tests cannot run on this machine (None: they can)."""
    if DEVICE.type not in ("cuda", "cpu"):
        return f"ALFISH_TEST_DEVICE={DEVICE} is not supported: use 'cuda', 'cuda:N' or 'cpu'"
    if not ON_CUDA:
        return None
    if not torch.cuda.is_available():
        return (f"needs a CUDA GPU (torch {torch.__version__}, CUDA build {torch.version.cuda}); "
                "ALFISH_TEST_DEVICE=cpu runs the test bodies on the CPU")
    if DEVICE.index is not None and DEVICE.index >= torch.cuda.device_count():
        return f"ALFISH_TEST_DEVICE={DEVICE} but only {torch.cuda.device_count()} CUDA device(s) are visible"
    return None


def cuda_only(what: str) -> pytest.MarkDecorator:
    """Skip a test (or a parameter) that only means something on CUDA when the tests run elsewhere."""
    return pytest.mark.skipif(not ON_CUDA, reason=f"{what} needs CUDA; these tests run on {DEVICE} "
                                                  "(ALFISH_TEST_DEVICE)")


#: fp32, fp16 (+ GradScaler; CUDA only) and bf16 autocast, as pytest parameters.
PRECISIONS = [pytest.param("fp32", id="fp32"),
              pytest.param("fp16", id="fp16", marks=cuda_only("fp16 autocast")),
              pytest.param("bf16", id="bf16")]


def device_bindings(precision: str = "fp32", **device_policy: str) -> str:
    """Gin lines that train on ``DEVICE`` with ``precision`` ('fp32', 'fp16', 'bf16') and any other ``DevicePolicy``
    settings (e.g. ``replay_storage='device'``). Appended to a conf, they override its earlier bindings."""
    lines = [f"DevicePolicy.device = '{DEVICE}'"]
    lines += [f"DevicePolicy.{name} = {value!r}" for name, value in device_policy.items()]
    if precision != "fp32":
        lines += ["TrainerConfig.enable_amp = True", f"AmpPolicy.dtype = '{AMP_DTYPES[precision]}'"]
    return "\n" + "\n".join(lines) + "\n"


@contextlib.contextmanager
def no_host_syncs() -> Iterator[None]:
    """Inside, any CUDA call that makes the host wait for the device raises (``torch.cuda.set_sync_debug_mode
    ('error')``: ``.item()``, ``float(t)``, ``if t:``, ``nonzero``, a blocking copy, ...). Work queued before is
    finished first, so only the guarded code is judged. On the CPU nothing can wait for a device: the body just runs
    (``alfish.learn.sync_debug.SyncCounter`` is the CPU suite's check)."""
    if not ON_CUDA:
        yield
        return
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


# ---------------------------------------------------------------------------------------- batches with values ---

def _values(space: gym.spaces.Space, shape: torch.Size, generator: torch.Generator) -> torch.Tensor:
    """Actions of ``space`` filling ``shape`` (Box: uniform in ``[low, high]``; Discrete: uniform indices)."""
    if isinstance(space, gym.spaces.Discrete):
        return torch.randint(int(space.n), tuple(shape), generator=generator)
    low, high = (torch.as_tensor(b, dtype=torch.float32) for b in (space.low, space.high))
    return low + (high - low) * torch.rand(tuple(shape), generator=generator)


def with_values(meta_nest: Any, action_space: gym.spaces.Space, seed: int = 0) -> Any:
    """A copy on ``DEVICE``, with values, of an ``Experience`` or ``TimeStep`` built on the meta device by
    ``tests/learn/test_meta_device.py``'s builders (same shapes and dtypes, whatever the layout ``[L, B]`` or
    ``[B, T]``). Float leaves ~ U(-1, 1) (observations, rollout log-probs and values), rewards ~ N(0, 1), discounts 1,
    every step MID but one LAST (``[0, -1]``: the masks are exercised), actions in ``action_space``. Drawn on the
    CPU from ``seed``, so every device gets the same values."""
    g = torch.Generator().manual_seed(seed)

    def fill(x: torch.Tensor) -> torch.Tensor:
        if x.dtype.is_floating_point:
            return torch.rand(tuple(x.shape), generator=g, dtype=x.dtype) * 2 - 1
        return torch.zeros(tuple(x.shape), dtype=x.dtype)

    real = nest.map_nest(fill, meta_nest)
    step_type = torch.full(tuple(real.step_type.shape), StepType.MID, dtype=real.step_type.dtype)
    step_type.view(-1, step_type.shape[-1])[0, -1] = StepType.LAST
    fields: dict[str, Any] = dict(step_type=step_type, reward=torch.randn(tuple(real.reward.shape), generator=g),
                                  discount=torch.ones_like(real.discount))
    if isinstance(real, Experience):
        fields["action"] = _values(action_space, real.action.shape, g)
    elif isinstance(real, TimeStep):
        fields["prev_action"] = _values(action_space, real.prev_action.shape, g)
        fields["env_id"] = torch.arange(real.env_id.numel()).view(real.env_id.shape)
    return nest.map_nest(lambda x: x.to(DEVICE), real._replace(**fields))


# -------------------------------------------------------------------------------------------------- trainers ---

@contextlib.contextmanager
def started_trainer(tmp_path: pathlib.Path, conf_text: str, params: Sequence[str] = ()) -> Iterator[Any]:
    """A ``Trainer`` built from ``conf_text`` (+ ``params``) as ``alfish.bin.train`` builds it, restored-or-started
    and warmed up (envs acting, the replay buffer holding ``initial_collect_steps``), but not run: the test drives
    its ``training`` step itself. Closed, and gin cleared, on exit."""
    from alfish.trainer.build import build_trainer

    conf = tmp_path / "conf.gin"
    conf.write_text(conf_text)
    load_conf(str(conf), list(params))
    trainer = None
    try:
        trainer = build_trainer(TrainerConfig(root_dir=str(tmp_path / "run")))
        trainer._restore_or_start()
        trainer._warm_up()
        yield trainer
    finally:
        if trainer is not None:
            trainer.close()
        gin.clear_config()


def assert_on_device(module: torch.nn.Module) -> None:
    """Every parameter and buffer of ``module`` is on ``DEVICE`` (its type: ``'cuda'`` means the current GPU)."""
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        assert t.device.type == DEVICE.type, f"{name} is on {t.device}, not {DEVICE}"
