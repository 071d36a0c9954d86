"""The assembled trainer's hot paths, counted on the CPU with ``SyncCounter`` (calls that would wait for a GPU):

- the update path of an iteration (sample -> transform -> to the device -> loss -> backward -> clip -> fused Adam ->
  target update -> priorities) makes none, for SAC, TD3 and DQN with prioritized replay, N iterations in a row
  between summaries;
- the rollout makes exactly one per env step: the action handed to the env (``BatchedEnv`` turns it into numpy; on
  a GPU that is the one device-to-host copy of a step). The episode statistics and the replay's add also read values,
  but of the env's own host tensors (step types, env ids), which never were on a device: they are listed apart.
"""
import gin
import pytest

from alfish.config import TrainerConfig, load_conf
from alfish.learn.sync_debug import SyncCounter
from tests.integration.inprocess import OFF_POLICY_POINT_GOAL

ALGORITHMS = {
    "sac": "TrainerConfig.algorithm_ctor = @SacAlgorithm\nSacAlgorithm.hidden_sizes = (16,)\n"
           "OptimizerConfig.max_grad_norm = 1.0\nSacAlgorithm.target_update_period = 2\n",
    "td3": "TrainerConfig.algorithm_ctor = @Td3Algorithm\nDdpgAlgorithm.hidden_sizes = (16,)\n",
    "dqn_per": "create_environment.env_name = 'alfish/Chain-v0'\nTrainerConfig.algorithm_ctor = @DqnAlgorithm\n"
               "DqnAlgorithm.hidden_sizes = (16,)\nTrainerConfig.priority_replay = True\n",
}
# These read the env's host tensors (step types, rewards, env ids), never a device's.
HOST_BOOKKEEPING = ("alfish/collect/episode_stats.py", "alfish/replay/ring_buffer.py")


@pytest.fixture
def trainer(tmp_path, request):
    from alfish.trainer.build import build_trainer

    conf = tmp_path / "conf.gin"
    conf.write_text(OFF_POLICY_POINT_GOAL + ALGORITHMS[request.param] + "TrainerConfig.mini_batch_size = 16\n"
                    "TrainerConfig.initial_collect_steps = 20\nLearner.finite_check_interval = 1000\n")
    load_conf(str(conf), [])
    built = build_trainer(TrainerConfig(root_dir=str(tmp_path / "root")))
    built._restore_or_start()
    built._warm_up()
    built.training.run(1)  # the first update creates the optimizer state and the guard's latch
    yield built
    built.close()
    gin.clear_config()


@pytest.mark.parametrize("trainer", list(ALGORITHMS), indirect=True)
def test_updates_between_summaries_make_no_syncing_call(trainer):
    with SyncCounter() as syncs:
        for _ in range(8):
            trainer.training._train()
    assert syncs.calls == [], syncs.report()
    trainer.learner.check_finite()


@pytest.mark.parametrize("trainer", ["sac"], indirect=True)
def test_the_rollout_crosses_to_the_host_once_per_env_step(trainer):
    steps = 12
    with SyncCounter() as syncs:
        trainer.collector.collect(steps)
    crossings = [(name, site) for name, site in zip(syncs.calls, syncs.sites)
                 if not site.split(":")[0].endswith(HOST_BOOKKEEPING)]
    assert len(crossings) == steps, syncs.report()
    assert all(name == "numpy" and "alfish/envs/batched_env.py" in site for name, site in crossings)
