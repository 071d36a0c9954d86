"""The on-policy unroll is the update's forward, so it runs under the AMP policy's autocast like an off-policy
update's forward: with ``TrainerConfig.enable_amp`` and bf16 on the CPU, A2C's networks compute in bf16 while it
unrolls (the graph the loss backpropagates through), while the actions the env receives and the trajectory's actions
keep the env's dtype. Without AMP, nothing changes (float32)."""
import pathlib

import pytest
import torch

from alfish.networks.mlp import MLP
from tests.gpu.helpers import started_trainer

A2C = """
create_environment.env_name = '{env}'
create_environment.num_parallel_environments = 2
TrainerConfig.algorithm_ctor = @A2cAlgorithm
A2cAlgorithm.hidden_sizes = (8,)
TrainerConfig.random_seed = 0
TrainerConfig.num_iterations = 1
TrainerConfig.unroll_length = 4
TrainerConfig.evaluate = False
TrainerConfig.num_checkpoints = 0
DevicePolicy.device = 'cpu'
"""
BF16 = "TrainerConfig.enable_amp = True\nAmpPolicy.dtype = 'bfloat16'\n"
ENVS = {"continuous": ("alfish/PointGoal-v0", torch.float32), "discrete": ("CartPole-v1", torch.int64)}


def unroll_once(tmp_path: pathlib.Path, conf: str) -> tuple[set[torch.dtype], torch.Tensor, list[torch.dtype]]:
    """One on-policy iteration of ``conf``: the dtypes of the networks' (MLPs') outputs computed with gradients (the
    unroll's forward), the trajectory's actions, and the dtypes of the actions the env was stepped with."""
    with started_trainer(tmp_path, conf) as trainer:
        outputs: set[torch.dtype] = set()

        def record(module, inputs, output) -> None:
            if torch.is_grad_enabled():
                outputs.add(output.dtype)

        hooks = [m.register_forward_hook(record) for m in trainer.algorithm.modules() if isinstance(m, MLP)]
        env = trainer.collector.env
        stepped, step = [], env.step
        env.step = lambda action: (stepped.append(action.dtype), step(action))[1]
        before = [p.detach().clone() for p in trainer.algorithm.parameters()]
        try:
            trainer.training.run(4)
        finally:
            env.step = step
            for hook in hooks:
                hook.remove()
        assert any(not torch.equal(a, p) for a, p in zip(before, trainer.algorithm.parameters())), "no update"
        assert all(torch.isfinite(p).all() for p in trainer.algorithm.parameters())
        return outputs, trainer.training.last_actions[0], stepped


@pytest.mark.parametrize("kind", sorted(ENVS))
def test_a2c_unrolls_under_bf16_autocast_and_the_env_gets_its_own_action_dtype(tmp_path, kind):
    env, action_dtype = ENVS[kind]
    outputs, actions, stepped = unroll_once(tmp_path, A2C.format(env=env) + BF16)
    assert outputs == {torch.bfloat16}, f"the unroll's forward ran in {outputs}, not under bf16 autocast"
    assert actions.dtype == action_dtype and set(stepped) == {action_dtype}


def test_without_amp_the_unroll_stays_float32(tmp_path):
    env, action_dtype = ENVS["continuous"]
    outputs, actions, stepped = unroll_once(tmp_path, A2C.format(env=env))
    assert outputs == {torch.float32} and actions.dtype == action_dtype and set(stepped) == {action_dtype}
