"""Evaluation, play, collect and the export check act as one policy (``alfish.evaluate.acting.GreedyPolicy``).

A recurrent SAC (a GRU encoder) with an observation normalizer is trained for two iterations on
alfish/MemoryCueContinuous-v0, then each of the four commands runs on its checkpoint with its env wrapped: every reset
starts from the same seed, and the action of every step is recorded. Continuous actions of a barely trained network
differ in their last digits with any change of input, so a path acting otherwise (other transforms or statistics, a
state not carried or not reset at FIRST, sampling instead of the greedy action) records other numbers.
"""
import gin
import numpy as np
import pytest
import torch

from alfish.bin import collect, evaluate, export, play
from tests.integration.inprocess import run_trainer_from_text
from tests.integration.test_recurrent_learning import RECURRENT_SAC_MEMORY_CUE

pytestmark = [pytest.mark.timeout(120)]

SEED = 7
TINY_RECURRENT_SAC = RECURRENT_SAC_MEMORY_CUE.replace(
    "num_parallel_environments = 8", "num_parallel_environments = 2").replace(
    "num_iterations = 300", "num_iterations = 2").replace(
    "initial_collect_steps = 128", "initial_collect_steps = 32").replace(
    "TrainerConfig.evaluate = True", "TrainerConfig.evaluate = False").replace(
    "num_eval_environments = 4", "num_eval_environments = 1").replace(
    "num_checkpoints = 0", "num_checkpoints = 1") + "TrainerConfig.data_transformer_ctor = [@ObservationNormalizer]\n"


class RecordingEnv:
    """``env`` (one env), reset from ``SEED`` whatever the caller asks; records env 0's action at each step, clipped to
    the bounds as the env executes it."""

    def __init__(self, env, actions: list):
        assert env.num_envs == 1
        self.env, self.actions = env, actions
        self.bounds = env.action_space.low, env.action_space.high

    def reset(self, seed=None, **kwargs):
        return self.env.reset(seed=SEED, **kwargs)

    def step(self, action):
        self.actions.append(np.clip(torch.as_tensor(action)[0].numpy(), *self.bounds).copy())
        return self.env.step(action)

    def __getattr__(self, name):
        return getattr(self.env, name)


def recording(monkeypatch, module, factory: str, actions: list) -> None:
    """``module.factory`` (the env a command steps) wrapped in a ``RecordingEnv`` that appends to ``actions``."""
    original = getattr(module, factory)
    monkeypatch.setattr(module, factory, lambda *args, **kwargs: RecordingEnv(original(*args, **kwargs), actions))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    try:
        return run_trainer_from_text(tmp_path_factory.mktemp("run"), TINY_RECURRENT_SAC)
    finally:
        gin.clear_config()


def actions_of(monkeypatch, module, factory: str, main, argv: list) -> np.ndarray:
    """The actions ``module``'s command ``main(argv)`` took (exit status 0), env 0, step after step."""
    actions: list = []
    with monkeypatch.context() as patch:
        recording(patch, module, factory, actions)
        try:
            assert main([str(a) for a in argv]) == 0
        finally:
            gin.clear_config()
    return np.stack(actions)


def test_evaluation_play_collect_and_the_export_check_take_the_same_actions(run, tmp_path, monkeypatch, capsys):
    paths = {
        "evaluate": actions_of(monkeypatch, evaluate, "create_eval_env", evaluate.main,
                               ["--root_dir", run, "--num_episodes", 4, "--out_dir", tmp_path / "evaluations"]),
        "play": actions_of(monkeypatch, play, "create_env", play.main, ["--root_dir", run, "--num_episodes", 4]),
        "collect": actions_of(monkeypatch, collect, "create_env", collect.main,
                              ["--root_dir", run, "--num_steps", 40, "--out", tmp_path / "dataset"]),
        "export": actions_of(monkeypatch, export, "create_env", export.main,
                             ["--root_dir", run, "--format", "pt2", "--out", tmp_path / "policy.pt2"]),
    }
    reference = paths["evaluate"]
    assert len(reference) >= 20 and len(np.unique(reference)) >= 5  # the actions vary from step to step
    for name, actions in paths.items():
        n = min(len(actions), len(reference))
        assert n >= 20, (name, len(actions))
        np.testing.assert_array_equal(actions[:n], reference[:n], err_msg=f"{name} acted otherwise than evaluation")

    # The comparison sees a path that acts otherwise: play sampling its policy instead of taking the greedy action.
    sampled = actions_of(monkeypatch, play, "create_env", play.main,
                         ["--root_dir", run, "--num_episodes", 4, "--epsilon_greedy", 1])
    assert not np.array_equal(sampled[:20], reference[:20])

