"""Where the children's policy copies act (``DevicePolicy.rollout_device``): resolved in the trainer, where torchrun's
``LOCAL_RANK`` is set ('cuda' is the rank's own GPU), carried in the child's picklable spec, and used there as it is
(a child has no rank variables: resolving it again there would put every rank's child on ``cuda:0``).

The children's acting parts are built here, in-process, from a spec whose device is ``meta``: every tensor of the
policy copy is then there, and acting fails at the first value read back for the env ("Cannot copy out of meta
tensor"), which shows the actions were computed on the spec's device and nowhere else.
"""
import dataclasses
import multiprocessing as mp
import os
import pickle

import gin
import pytest
import torch

from alfish.algorithms.build import build_policy
from alfish.collect.async_child import UnrollSpec, _start_acting
from alfish.collect.shared_params import ParamBlock, SharedParams, rollout_state
from alfish.config import TrainerConfig, load_conf
from alfish.envs.batched_env import environment_settings
from alfish.envs.spec import EnvSpec
from alfish.evaluate.eval_child import EvalSpec, _evaluation_parts

META = torch.device("meta")
SAC_POINT_GOAL = """
create_environment.env_name = 'alfish/PointGoal-v0'
create_environment.num_parallel_environments = 2
SacAlgorithm.hidden_sizes = (8,)
TrainerConfig.algorithm_ctor = @SacAlgorithm
"""


@pytest.fixture
def config(tmp_path):
    conf = tmp_path / "conf.gin"
    conf.write_text(SAC_POINT_GOAL)
    load_conf(str(conf))
    yield TrainerConfig(root_dir=str(tmp_path / "root"))
    gin.clear_config()


@pytest.fixture
def env():
    env = environment_settings(seed=3).create()
    yield env
    env.close()


def specs(config, env):
    """The two children's specs, made as ``build.py`` makes them (in the trainer's process)."""
    unroll = UnrollSpec(environment_settings(seed=3), gin.config_str(), config.root_dir, step_interval_s=0.0,
                        parent_pid=os.getpid())
    evaluation = EvalSpec(env_settings=environment_settings(seed=5), env_spec=EnvSpec.of(env),
                          config_text=gin.config_str(), root_dir=config.root_dir, gin_constants={}, num_episodes=1,
                          epsilon_greedy=0.0, seed=5, uncertainty=False, parent_pid=os.getpid())
    return unroll, evaluation


def on_device_only(module: torch.nn.Module, device: torch.device) -> bool:
    tensors = list(module.parameters()) + list(module.buffers())
    return bool(tensors) and all(t.device == device for t in tensors)


def test_the_specs_carry_the_rollout_device_resolved_with_the_trainers_local_rank(config, env, monkeypatch):
    """Rank 1 of a torchrun job on a 2-GPU node: its children act on cuda:1 (CUDA's presence is faked; the spec is
    only made and pickled, nothing is placed there)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "1")
    gin.bind_parameter("DevicePolicy.rollout_device", "cuda")
    for spec in specs(config, env):
        assert pickle.loads(pickle.dumps(spec)).acting_device == torch.device("cuda:1"), type(spec).__name__


def test_the_unroll_child_acts_on_its_specs_device(config, env):
    unroll_spec, _ = specs(config, env)
    spec = dataclasses.replace(unroll_spec, acting_device=META)
    transformer, algorithm = build_policy(config, EnvSpec.of(env))  # the trainer's own (CPU), publishing to the child
    shared = SharedParams(mp.get_context("spawn"))
    published = ParamBlock(shared, rollout_state(algorithm, transformer))
    try:
        published.write(rollout_state(algorithm, transformer), (0, 0, 0.0))
        acting = _start_acting(spec, config, env, EnvSpec.of(env), shared, (published.name, 3), lambda: True)
        try:
            assert acting.version == 1  # the published parameters were read into the copy on meta
            assert on_device_only(acting.unroller.algorithm, META)
            assert all(t.device == META for t in acting.tensors.values())
            with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
                acting.unroller.step()  # the action was computed on meta; the env needs its values
        finally:
            acting.block.close()
    finally:
        published.close(unlink=True)


def test_the_evaluator_child_acts_on_its_specs_device(config, env):
    _, eval_spec = specs(config, env)
    spec = dataclasses.replace(eval_spec, acting_device=META)
    algorithm, tensors, evaluator = _evaluation_parts(spec, config, env)
    assert on_device_only(algorithm, META)
    assert all(t.device == META for t in tensors.values())
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
        evaluator.evaluate(algorithm)
