"""The RL Zoo benchmark confs (issue 30) in the fast tier: each builds from its shipped file and trains 3 iterations in
this process, at its own networks and hyperparameters, with only the run's sizes shrunk (few env steps, a small
replay buffer, short training bursts, no evaluation). Confs whose env package is missing skip with the install line
(tests/shipped_confs.py). The full checkpoint/resume/play cycle of each runs in the slow tier
(tests/integration/test_cli.py)."""
import pytest

from alfish.rundir.checkpoint import Checkpointer
from tests.shipped_confs import BOX2D_CONFS, CLASSIC_CONTROL_CONFS, MUJOCO_CONFS, skip_unless_installed

from .inprocess import CONFS, run_trainer

ITERATIONS = 3
# Eager updates: a conf's compiled whole update costs 13-26 s of compiling, for 3 iterations; the compiled updates of
# SAC, TD3, DQN and PPO are tested in tests/learn (test_whole_update.py, test_compiled_no_recompile.py)
SMALL_RUN = [f"TrainerConfig.num_iterations={ITERATIONS}", "TrainerConfig.num_env_steps=0",
             "TrainerConfig.evaluate=False", "TrainerConfig.num_checkpoints=1", "TrainerConfig.summary_interval=1",
             "Learner.compile_mode=None"]
# off-policy (SAC, TD3, DQN): one batch of warm-up steps (the confs' 256 or 128) and a small buffer
OFF_POLICY = ["TrainerConfig.initial_collect_steps=256", "TrainerConfig.replay_buffer_length=1000"]
# on-policy (PPO): 16 steps per env per iteration, 2 epochs of mini-batches of 16
ON_POLICY = ["TrainerConfig.unroll_length=16", "TrainerConfig.replay_buffer_length=17",
             "TrainerConfig.mini_batch_size=16", "TrainerConfig.num_updates_per_train_iter=2"]
# SAC with gSDE trains in bursts (32 or 64 env steps, then as many updates): 8 steps and 2 updates per iteration here
BURSTS = {"sac_mountaincar_continuous.gin", "sac_bipedalwalker.gin"}
SHORT_BURSTS = ["TrainerConfig.unroll_length=8", "TrainerConfig.num_updates_per_train_iter=2"]
BENCHMARK_CONFS = sorted(MUJOCO_CONFS + BOX2D_CONFS + CLASSIC_CONTROL_CONFS)


def shrink(conf: str) -> list[str]:
    return SMALL_RUN + (ON_POLICY if conf.startswith("ppo_") else OFF_POLICY) + (SHORT_BURSTS if conf in BURSTS else [])


def test_every_benchmark_conf_is_shipped_and_checked_here():
    shipped = {p.name for p in CONFS.glob("*.gin")}
    assert set(BENCHMARK_CONFS) <= shipped
    # a conf on a MuJoCo or Box2D env that is missing from those lists would fail (not skip) where they are missing
    for path in CONFS.glob("*.gin"):
        env = next((line.split("=")[1].strip(" '") for line in path.read_text().splitlines()
                    if line.startswith("create_environment.env_name")), "")
        needs_extra = env.split("-")[0] in ("HalfCheetah", "Hopper", "Walker2d", "Ant", "LunarLander",
                                            "LunarLanderContinuous", "BipedalWalker")
        assert needs_extra <= (path.name in BENCHMARK_CONFS), path.name


@pytest.mark.timeout(60)
@pytest.mark.parametrize("conf", BENCHMARK_CONFS)
def test_benchmark_conf_builds_and_trains_a_few_iterations(tmp_path, conf):
    skip_unless_installed(conf)
    root = tmp_path / "root"
    assert run_trainer(CONFS / conf, root, shrink(conf)) == 0
    checkpointer = Checkpointer(str(root / "checkpoints"))
    assert checkpointer.steps() == [ITERATIONS]
    meta = checkpointer.load(ITERATIONS).meta
    assert meta["iteration"] == ITERATIONS and meta["env_steps"] > 0
    operative = meta["operative_config"]
    conf_text = (CONFS / conf).read_text()
    for binding in ("create_environment.env_name", "hidden_sizes"):  # the conf's own, not a default
        line = next((ln for ln in conf_text.splitlines() if binding in ln and not ln.startswith("#")), None)
        if line is not None:
            assert line.split("=")[1].strip() in operative, (conf, line)
