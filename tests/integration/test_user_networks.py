"""A user's own network classes, defined in a module the conf imports, given to SAC through gin under ALF's names
(``actor_network_cls``, ``critic_network_cls``): training with async unroll (the child process builds the same
networks), checkpointing, resuming, and playing once the user trusts the module with --allow_import."""
import pathlib
import subprocess
import sys

import pytest

from .test_play_untrusted import child_env  # the user's package dir and the repo on PYTHONPATH, no display

pytestmark = [pytest.mark.cli]

MODULE = "user_test_networks"
MODULE_SOURCE = '''\
"""A user's networks: a tanh actor and a LayerNorm critic (the contract of alfish.networks.heads)."""
import gin
import torch
from torch import nn


@gin.configurable
class TinyActor(nn.Module):
    def __init__(self, observation_space, output_dim, width=32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(observation_space.shape[0], width), nn.Tanh(),
                                 nn.Linear(width, output_dim))

    def forward(self, obs):
        return self.net(obs)


@gin.configurable
class TinyCritic(nn.Module):
    def __init__(self, observation_space, action_dim, width=32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(observation_space.shape[0] + action_dim, width), nn.LayerNorm(width),
                                 nn.ReLU(), nn.Linear(width, 1))

    def forward(self, obs, action):
        return self.net(torch.cat([obs, action], -1))
'''
CONF = f"""\
import {MODULE}
create_environment.env_name = 'alfish/PointGoal-v0'
create_environment.num_parallel_environments = 1
SacAlgorithm.actor_network_cls = @{MODULE}.TinyActor
SacAlgorithm.critic_network_cls = @{MODULE}.TinyCritic
TinyActor.width = 24
TrainerConfig.algorithm_ctor = @SacAlgorithm
TrainerConfig.random_seed = 0
TrainerConfig.unroll_length = 1
TrainerConfig.initial_collect_steps = 50
TrainerConfig.replay_buffer_length = 1000
TrainerConfig.mini_batch_size = 32
TrainerConfig.mini_batch_length = 2
TrainerConfig.async_unroll = True
TrainerConfig.unroll_parameter_update_period = 1
TrainerConfig.evaluate = False
TrainerConfig.num_checkpoints = 2
"""


def run(work: pathlib.Path, module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"alfish.bin.{module}", *args], cwd=work,
                          env=child_env(work / "pkgs"), capture_output=True, text=True, timeout=180)


@pytest.mark.timeout(300)
def test_user_networks_train_async_resume_and_play(tmp_path):
    (tmp_path / "pkgs").mkdir()
    (tmp_path / "pkgs" / f"{MODULE}.py").write_text(MODULE_SOURCE)
    (tmp_path / "user.gin").write_text(CONF)
    first = run(tmp_path, "train", "--conf", "user.gin", "--root_dir", "root",
                "--conf_param", "TrainerConfig.num_env_steps = 150")
    assert first.returncode == 0, first.stderr[-3000:]

    import torch

    ckpts = sorted((tmp_path / "root" / "checkpoints").glob("ckpt-*"), key=lambda p: int(p.name.split("-")[1]))
    state = torch.load(ckpts[-1] / "algorithm.pt", weights_only=True)
    # The user's networks are what was trained: a 24-wide actor, two stacked LayerNorm critics (one vmap ensemble).
    assert tuple(state["actor.net.0.weight"].shape) == (24, 1)
    assert tuple(state["critics.members.net__1__weight"].shape) == (2, 32)  # [E, width]: the LayerNorm's weight
    assert tuple(state["target_critics.members.net__0__weight"].shape) == (2, 32, 2)

    resumed = run(tmp_path, "train", "--conf", "user.gin", "--root_dir", "root",
                  "--conf_param", "TrainerConfig.num_env_steps = 250")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr

    refused = run(tmp_path, "play", "--root_dir", "root", "--num_episodes", "1")
    assert refused.returncode == 2 and f"--allow_import {MODULE}" in refused.stderr, refused.stderr[-2000:]
    played = run(tmp_path, "play", "--root_dir", "root", "--num_episodes", "1", "--allow_import", MODULE)
    assert played.returncode == 0, played.stderr[-3000:]
    assert "episode 1: return" in played.stdout


# slow: the user network trains async, resumes and plays in the default run; DDP parity is tested on the shipped
# networks
@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(150)
def test_user_networks_train_under_ddp_with_identical_parameters_on_both_ranks(tmp_path):
    (tmp_path / "pkgs").mkdir()
    (tmp_path / "pkgs" / f"{MODULE}.py").write_text(MODULE_SOURCE)
    conf = CONF.replace("TrainerConfig.async_unroll = True", "TrainerConfig.async_unroll = False")
    (tmp_path / "user.gin").write_text(conf)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "alfish.bin.train", "--conf", "user.gin", "--root_dir", "root",
                           "--conf_param", "TrainerConfig.num_env_steps = 120",
                           # every iteration, the ranks compare parameter checksums (a mismatch is an error)
                           "--conf_param", "TrainerConfig.ddp_paras_check_interval = 1"],
                          cwd=tmp_path, env=child_env(tmp_path / "pkgs"), capture_output=True, text=True, timeout=140)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        assert f"[rank {rank}] INFO training finished" in proc.stderr, proc.stderr[-3000:]
