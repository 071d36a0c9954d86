"""Every algorithm's update path runs on the ``meta`` device (DESIGN.md §3.12, §6).

A meta tensor has a shape, a dtype and a device but no values, so anything in the update path that reads a value
back to the host (``.item()``, ``float(t)``, ``bool(t)``/``if t:``, ``.tolist()``, ``.cpu()``) raises, and so does
mixing in a (non-scalar) tensor created on another device. Running full updates there proves the path is free of
host syncs and places every tensor it creates where its inputs live.

One update here is what the Learner does, written out: loss (mean of the per-sample loss, times importance weights
where the batch has them), backward, ``OptimizerConfig.clip`` (by value, then by norm), a step of a non-fused,
non-foreach Adam, ``after_update()``; plus the ``priority`` the replay buffer would receive.

Adam: fused Adam refuses meta parameters, and so does ``capturable=True`` (its device check allows only accelerators
such as cuda/xpu). Stock non-capturable Adam keeps each parameter's ``step`` counter as a 0-d CPU tensor and reads it
on the host; that read is of CPU memory, not a device sync, on meta as on CUDA. So the tests use
``capturable=False`` and expect ``exp_avg``/``exp_avg_sq`` on meta and ``step`` on the CPU.
"""
from __future__ import annotations

from typing import Any, Callable

import gymnasium as gym
import pytest
import torch

from alfish.algorithms import (
    A2cAlgorithm,
    DdpgAlgorithm,
    DqnAlgorithm,
    PpoAlgorithm,
    RLAlgorithm,
    SacAlgorithm,
    Td3Algorithm,
)
from alfish.algorithms.ppo import PpoRolloutInfo
from alfish.data import nest
from alfish.data.types import EMPTY, BatchInfo, Experience, LossInfo, StepType, TimeStep
from alfish.learn.optim import OptimizerConfig
from alfish.replay.batching import WholeBufferBatches

META = torch.device("meta")
OBS = gym.spaces.Box(-1.0, 1.0, shape=(3,))
BOX = gym.spaces.Box(-2.0, 2.0, shape=(1,))
DISCRETE = gym.spaces.Discrete(3)
L_, B_ = 3, 4  # off-policy samples are time-major [L, B]
CLIP = OptimizerConfig(fused=False, max_grad_norm=1.0, max_grad_value=0.5)


# ---------------------------------------------------------------------------------------------------- builders ---

def on_meta(cls: type, action_space: gym.spaces.Space, **kwargs: Any) -> RLAlgorithm:
    """``cls`` with small networks, built on the CPU (as the trainer does) and then moved to meta."""
    torch.manual_seed(0)
    kwargs.setdefault("hidden_sizes", (8, 8))
    return cls(OBS, action_space, **kwargs).to(META)


def meta_actions(action_space: gym.spaces.Space, *shape: int) -> torch.Tensor:
    """Actions ``[*shape, 1]`` float32 (Box) or ``[*shape]`` int64 (Discrete), on meta."""
    if isinstance(action_space, gym.spaces.Discrete):
        return torch.empty(shape, dtype=torch.int64, device=META)
    return torch.empty(shape + action_space.shape, device=META)


def meta_experience(action_space: gym.spaces.Space, *shape: int, rollout_info: Any = EMPTY) -> Experience:
    """An Experience of ``shape`` (``[L, B]`` time-major or ``[B, T]`` batch-major) on meta."""
    return Experience(step_type=torch.full(shape, StepType.MID, dtype=torch.int8, device=META),
                      reward=torch.empty(shape, device=META), discount=torch.ones(shape, device=META),
                      observation=torch.empty(shape + OBS.shape, device=META),
                      action=meta_actions(action_space, *shape),
                      env_id=torch.zeros(shape, dtype=torch.int64, device=META), rollout_info=rollout_info)


def meta_time_step(batch: int, action_space: gym.spaces.Space) -> TimeStep:
    """A TimeStep ``[B]`` on meta."""
    return TimeStep(step_type=torch.full((batch,), StepType.MID, dtype=torch.int8, device=META),
                    reward=torch.empty(batch, device=META), discount=torch.ones(batch, device=META),
                    observation=torch.empty((batch,) + OBS.shape, device=META),
                    prev_action=meta_actions(action_space, batch),
                    env_id=torch.arange(batch, device=META))


def adam(alg: RLAlgorithm) -> torch.optim.Adam:
    """Non-fused, non-foreach, non-capturable Adam over the algorithm's groups (see the module docstring)."""
    groups = [dict(g) for g in alg.param_groups()]
    return torch.optim.Adam(groups, fused=False, foreach=False, capturable=False)


# ------------------------------------------------------------------------------------------------- one update ---

def apply_update(alg: RLAlgorithm, optimizer: torch.optim.Optimizer, loss_info: LossInfo,
                 weights: torch.Tensor | None = None) -> torch.Tensor:
    """Learner's step without the Learner: weighted mean of ``loss_info.loss [..., B]`` (``weights [B]``),
    backward, clip, Adam, ``after_update``. Returns the 0-d loss."""
    per_sample = loss_info.loss if weights is None else loss_info.loss * weights
    loss = per_sample.mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    CLIP.clip([p for g in optimizer.param_groups for p in g["params"]])
    optimizer.step()
    alg.after_update()
    return loss


def off_policy_update(alg: RLAlgorithm, optimizer: torch.optim.Optimizer, exp: Experience,
                      weights: torch.Tensor | None) -> LossInfo:
    """``train_step`` + ``calc_loss`` on ``exp [L, B]``, then ``apply_update``; returns the LossInfo."""
    loss_info = alg.calc_loss(exp, alg.train_step(exp).info)
    assert apply_update(alg, optimizer, loss_info, weights).device == META
    return loss_info


class LerpCounter:
    """Wraps ``torch._foreach_lerp_`` (how the algorithms move target networks) to record which tensors moved."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.calls: list[set[int]] = []
        original: Callable = torch._foreach_lerp_

        def lerp(targets: list[torch.Tensor], sources: list[torch.Tensor], weight: Any) -> None:
            assert all(t.device == META and s.device == META for t, s in zip(targets, sources))
            self.calls.append({id(t) for t in targets})
            original(targets, sources, weight)

        monkeypatch.setattr(torch, "_foreach_lerp_", lerp)


def ids(module: torch.nn.Module) -> set[int]:
    return {id(p) for p in module.parameters()}


# ---------------------------------------------------------------------------------------------------- checks ---

def assert_all_on_meta(alg: RLAlgorithm, optimizer: torch.optim.Optimizer) -> None:
    """Parameters, buffers and Adam's moments are on meta; Adam's step counters on the CPU (not capturable)."""
    for name, t in list(alg.named_parameters()) + list(alg.named_buffers()):
        assert t.device == META, name
    assert optimizer.state, "Adam took no step"
    for state in optimizer.state.values():
        assert state["exp_avg"].device == META and state["exp_avg_sq"].device == META
        assert state["step"].device == torch.device("cpu")


def assert_extra_on_meta(loss_info: LossInfo) -> None:
    """The summary terms (evaluated only when a summary is due) also work on meta and stay there."""
    extra = loss_info.extra()
    assert extra
    for name, value in extra.items():
        assert isinstance(value, torch.Tensor) and value.device == META and value.dim() == 0, name


def assert_priority(loss_info: LossInfo) -> None:
    assert loss_info.priority.shape == (B_,) and loss_info.priority.device == META
    assert not loss_info.priority.requires_grad


# ------------------------------------------------------------------------------------------------ off-policy ---

@pytest.mark.parametrize("period", [1, 2])
def test_sac_updates_on_meta(monkeypatch, period):
    alg = on_meta(SacAlgorithm, BOX, target_update_period=period)
    optimizer, lerps = adam(alg), LerpCounter(monkeypatch)
    weights = torch.ones(B_, device=META)
    for _ in range(4):
        loss_info = off_policy_update(alg, optimizer, meta_experience(BOX, L_, B_), weights)
        assert loss_info.loss.shape == (L_ - 1, B_)
        assert_priority(loss_info)
    assert alg.updates_done == 4 and alg.num_updates.shape == () and alg.num_updates.device == META
    assert lerps.calls == [ids(alg.target_critics)] * (4 // period)
    assert_all_on_meta(alg, optimizer)
    assert_extra_on_meta(loss_info)


def test_sac_with_gsde_updates_on_meta():
    """gSDE (``use_sde=True``): the noise matrix drawn in each update and sigma's parameter stay on meta."""
    alg = on_meta(SacAlgorithm, BOX, use_sde=True)
    optimizer = adam(alg)
    for _ in range(2):
        loss_info = off_policy_update(alg, optimizer, meta_experience(BOX, L_, B_), torch.ones(B_, device=META))
        assert_priority(loss_info)
    assert alg.actor.noise.log_std.grad is not None
    assert_all_on_meta(alg, optimizer)
    assert_extra_on_meta(loss_info)


@pytest.mark.parametrize("n_step, period", [(1, 1), (2, 3)])
def test_dqn_updates_on_meta_with_priorities(monkeypatch, n_step, period):
    alg = on_meta(DqnAlgorithm, DISCRETE, n_step=n_step, target_update_period=period, target_update_tau=0.5)
    optimizer, lerps = adam(alg), LerpCounter(monkeypatch)
    weights = torch.rand(B_, device=META)  # prioritized replay's importance weights
    for _ in range(6):
        loss_info = off_policy_update(alg, optimizer, meta_experience(DISCRETE, n_step + 1, B_), weights)
        assert loss_info.loss.shape == (1, B_)
        assert_priority(loss_info)
    assert alg.updates_done == 6
    assert lerps.calls == [ids(alg.target_q_net)] * (6 // period)
    assert_all_on_meta(alg, optimizer)
    assert_extra_on_meta(loss_info)


@pytest.mark.parametrize("cls, delay, period", [(DdpgAlgorithm, 1, 3), (Td3Algorithm, 2, 1), (Td3Algorithm, 2, 2)])
def test_ddpg_td3_updates_on_meta(monkeypatch, cls, delay, period):
    """8 updates: the actor trains on every ``delay``-th, the targets move on every ``delay * period``-th."""
    alg = on_meta(cls, BOX, policy_delay=delay, target_update_period=period)
    optimizer, lerps = adam(alg), LerpCounter(monkeypatch)
    actor_trained = []
    for _ in range(8):
        loss_info = off_policy_update(alg, optimizer, meta_experience(BOX, L_, B_), torch.ones(B_, device=META))
        assert loss_info.loss.shape == (L_ - 1, B_)
        assert_priority(loss_info)
        actor_trained.append(all(p.grad is not None for p in alg.actor.parameters()))
        assert all(p.grad is not None for p in alg.critics.parameters())
    assert actor_trained == [(k + 1) % delay == 0 for k in range(8)]
    assert alg.updates_done == 8
    targets = [ids(alg.target_actor), ids(alg.target_critics)]
    assert lerps.calls == targets * (8 // (delay * period))
    assert_all_on_meta(alg, optimizer)
    assert_extra_on_meta(loss_info)


@pytest.mark.parametrize("cls, action_space", [(SacAlgorithm, BOX), (DqnAlgorithm, DISCRETE), (Td3Algorithm, BOX)])
def test_update_count_survives_load_state_dict_onto_meta(cls, action_space):
    """The Python mirror of ``num_updates`` is read from the loaded (CPU) tensor, so the periods' and the delay's
    phase is right after loading a checkpoint into a module on meta -- which could never read its own buffer."""
    torch.manual_seed(0)
    trained = cls(OBS, action_space, hidden_sizes=(8,))
    trained.after_update()
    state = trained.state_dict()
    assert state["num_updates"].dtype == torch.int64 and int(state["num_updates"]) == 1  # checkpoints keep it
    fresh = on_meta(cls, action_space, hidden_sizes=(8,))
    assert fresh.updates_done == 0
    fresh.load_state_dict(state, assign=True)  # a meta module takes the CPU tensors themselves
    assert fresh.updates_done == 1
    if cls is Td3Algorithm:  # policy_delay 2: one update done, so the next one trains the actor
        assert fresh.actor_due()


# ------------------------------------------------------------------------------------------------- on-policy ---

@pytest.mark.parametrize("action_space, use_sde", [(BOX, False), (DISCRETE, False), (BOX, True)],
                         ids=["box", "discrete", "box_gsde"])
def test_ppo_updates_on_meta(action_space, use_sde):
    """``preprocess_experience`` on a batch-major ``[B, T]`` buffer, then two epochs of shuffled mini-batches."""
    alg = on_meta(PpoAlgorithm, action_space, **(dict(use_sde=True) if use_sde else {}))
    optimizer = adam(alg)
    steps = 5
    info = PpoRolloutInfo(log_prob=torch.empty(B_, steps, device=META), value=torch.empty(B_, steps, device=META))
    exp = alg.preprocess_experience(meta_experience(action_space, B_, steps, rollout_info=info))
    assert exp.step_type.shape == (B_, steps - 1) and exp.rollout_info.advantage.shape == (B_, steps - 1)
    updates = 0
    for _ in range(2):
        for batch in WholeBufferBatches(exp, length=1, batch_size=6).epoch():
            loss_info = alg.calc_loss(batch, alg.train_step(batch).info)
            assert loss_info.loss.shape == batch.step_type.shape and loss_info.loss.device == META
            apply_update(alg, optimizer, loss_info)
            updates += 1
    assert updates == 2 * 3  # 16 steps in batches of 6
    assert_all_on_meta(alg, optimizer)
    assert_extra_on_meta(loss_info)


@pytest.mark.parametrize("action_space", [BOX, DISCRETE], ids=["box", "discrete"])
def test_a2c_updates_on_meta(action_space):
    """Unroll ``T + 1`` steps with ``rollout_step`` (with gradients), ``calc_loss`` on the trajectory, update."""
    alg = on_meta(A2cAlgorithm, action_space, normalize_advantages=True)
    optimizer = adam(alg)
    steps = 4
    for _ in range(3):
        unrolled = []
        for _ in range(steps + 1):
            time_step = meta_time_step(B_, action_space)
            alg_step = alg.rollout_step(time_step)
            unrolled.append(Experience.from_time_step(time_step, alg_step.output, alg_step.info))
        trajectory = nest.stack(unrolled)
        loss_info = alg.calc_loss(trajectory, None)
        assert loss_info.loss.shape == (steps, B_) and loss_info.loss.requires_grad
        apply_update(alg, optimizer, loss_info)
    assert_all_on_meta(alg, optimizer)
    assert_extra_on_meta(loss_info)


# ----------------------------------------------------------------------------------------------- the Learner ---

@pytest.mark.parametrize("cls, action_space", [(SacAlgorithm, BOX), (DqnAlgorithm, DISCRETE)], ids=["sac", "dqn"])
def test_learner_update_on_meta(cls, action_space):
    """The trainer's own update path (``Learner.update``), with prioritized-replay weights, on meta."""
    from alfish.learn.learner import Learner

    alg = on_meta(cls, action_space)
    learner = Learner(alg, OptimizerConfig(fused=False), device=META, finite_check_interval=10**9)
    length = 2 if cls is DqnAlgorithm else L_
    batch_info = BatchInfo(env_ids=torch.arange(B_, device=META), positions=torch.zeros(B_, dtype=torch.int64,
                                                                                           device=META),
                           importance_weights=torch.rand(B_, device=META))
    for _ in range(3):
        loss_info = learner.update(meta_experience(action_space, length, B_), batch_info)
        assert loss_info.loss.device == META
        assert_priority(loss_info)
    assert alg.updates_done == 3
    assert all(p.device == META for p in alg.parameters())


# -------------------------------------------------------------------------------- the test catches host syncs ---

def syncing_update(w: torch.nn.Parameter, how: str) -> None:
    """A toy update that checks its loss the forbidden ways, or builds a tensor on the CPU."""
    loss = (w * 2.0).pow(2).sum()
    if how == "isfinite":
        if not torch.isfinite(loss):  # bool() of a device tensor: a host sync
            raise FloatingPointError
    elif how == "float":
        float(loss.detach())
    elif how == "item":
        loss.item()
    elif how == "cpu_tensor":
        loss = loss + torch.zeros(3)  # made on the CPU: the wrong device for w
    loss.sum().backward()


@pytest.mark.parametrize("how", ["isfinite", "float", "item", "cpu_tensor"])
def test_meta_device_catches_host_syncs_and_misplaced_tensors(how):
    syncing_update(torch.nn.Parameter(torch.ones(3)), how)  # fine on the CPU
    with pytest.raises(RuntimeError, match="meta"):
        syncing_update(torch.nn.Parameter(torch.ones(3, device=META)), how)
