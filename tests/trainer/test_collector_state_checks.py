"""The collector's state read back from a checkpoint (the envs' episodes in flight, replayed on resume) is checked
before any of it is used: tensors must hold the elements they claim, and each env's action log is bounded by
``MAX_LOGGED_ACTIONS`` and by the env steps the checkpoint's counters say were taken. Damage means an inexact
resume (the envs restart) with one warning, never a long replay or a memory blow-up."""
import logging
import time

import torch

from alfish.envs.episode_log import MAX_LOGGED_ACTIONS
from alfish.trainer.resume import checked_collector_state, collector_state_problem, tensor_layout_problem


def _state(*actions: torch.Tensor) -> dict:
    return {"time_step": {"env_id": torch.arange(len(actions))}, "prev_done": torch.zeros(len(actions), dtype=bool),
            "envs": [{"start": {"seed": torch.tensor(i)}, "actions": a, "last_observation": torch.zeros(4),
                      "ended": torch.tensor(False)} for i, a in enumerate(actions)]}


def test_an_intact_state_passes():
    assert collector_state_problem(_state(torch.zeros(7, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)),
                                   env_steps=14) is None


def test_a_stride_0_log_of_ten_million_actions_is_refused_quickly(caplog):
    forged = torch.zeros(1, 1).expand(10_000_000, 1)  # 4 bytes of storage
    start = time.monotonic()
    with caplog.at_level(logging.WARNING):
        assert checked_collector_state(_state(forged), env_steps=10**9, path="ROOT/checkpoints/ckpt-9") is None
    assert time.monotonic() - start < 1.0
    (message,) = [r.getMessage() for r in caplog.records]
    assert message == ("checkpoint ROOT/checkpoints/ckpt-9: its record of the envs' episodes in flight is damaged "
                       "(collector['envs'][0]['actions']: a broadcast tensor (shape [10000000, 1], strides [0, 1])); "
                       "the envs restart instead of replaying them (the resume is not exact)")


def test_more_actions_than_the_counters_allow_are_refused():
    # 2 envs, 20 env steps in all: at most 10 actions per env
    assert collector_state_problem(_state(torch.zeros(10), torch.zeros(10)), env_steps=20) is None
    assert collector_state_problem(_state(torch.zeros(11), torch.zeros(2)), env_steps=20) == (
        "env 0: it claims 11 logged actions, more than the 10 its 10 env steps (and the log's cap, "
        f"{MAX_LOGGED_ACTIONS}) allow")
    many = torch.zeros(MAX_LOGGED_ACTIONS + 1, dtype=torch.uint8)
    assert "more than the 200000" in collector_state_problem(_state(many), env_steps=10**9)


def test_overlapping_and_out_of_storage_tensors_are_refused():
    base = torch.zeros(10)
    assert "over a storage of 10 elements" in tensor_layout_problem(base.as_strided((9, 2), (1, 1)))
    assert "negative" not in (tensor_layout_problem(base[2:]) or "")
    assert tensor_layout_problem(base.t()) is None and tensor_layout_problem(torch.zeros(0)) is None
    state = _state(torch.zeros(3))
    state["envs"][0]["last_observation"] = torch.zeros(1).expand(10**8)
    assert "last_observation" in collector_state_problem(state, env_steps=10)
    assert collector_state_problem({"envs": []}, 10) == "it has no list of env states"
    assert "not a contiguous tensor" in collector_state_problem(_state(torch.zeros(4, 2).t()), env_steps=100)
