"""Schedules (alfish.schedulers) driving hyperparameters during a real training run, as a conf writes them."""
import pytest

from .inprocess import run_trainer_from_text, tb_scalars

PPO_CHAIN_SCHEDULED = """
create_environment.env_name = 'alfish/Chain-v0'
create_environment.num_parallel_environments = 2
PpoAlgorithm.hidden_sizes = (8,)
PpoAlgorithm.lr = @lr/LinearScheduler()
lr/LinearScheduler.progress_type = 'percent'
lr/LinearScheduler.schedule = [(0, 1e-3), (1, 0)]
PpoAlgorithm.clip_range = @clip/StepScheduler()
clip/StepScheduler.progress_type = 'iterations'
clip/StepScheduler.schedule = [(0, 0.3), (5, 0.1)]
TrainerConfig.algorithm_ctor = @PpoAlgorithm
TrainerConfig.random_seed = 0
TrainerConfig.num_iterations = 10
TrainerConfig.unroll_length = 4
TrainerConfig.replay_buffer_length = 5
TrainerConfig.mini_batch_length = 1
TrainerConfig.num_updates_per_train_iter = 1
TrainerConfig.summary_interval = 1
TrainerConfig.num_checkpoints = 0
"""


@pytest.mark.timeout(60)
def test_learning_rate_and_clip_range_follow_their_schedules(tmp_path):
    root = run_trainer_from_text(tmp_path, PPO_CHAIN_SCHEDULED)
    scalars = tb_scalars(root)
    lr = dict(scalars["optimizer/lr.actor_critic"])
    # Iteration k (summarized at step k) trains with the lr set before it, at fraction (k - 1) / 10:
    # 1e-3 * (1 - (k - 1) / 10) -> step 1: 1e-3, step 5: 6e-4, step 10: 1e-4.
    assert lr[1] == pytest.approx(1e-3)
    assert lr[5] == pytest.approx(6e-4)
    assert lr[10] == pytest.approx(1e-4)
    # The step schedule switches from 0.3 to 0.1 once 5 iterations are done (read before iteration 6).
    clip = dict(scalars["schedule/PpoAlgorithm.clip_range"])
    assert clip[5] == pytest.approx(0.3) and clip[6] == pytest.approx(0.1)
