"""Same TrainerConfig.random_seed -> identical loss curves in TensorBoard; another seed -> different ones.

Runs the shipped confs in this process (shrunk to a few iterations) and reads the real event files under root_dir/tb.
"""
import pytest

from .inprocess import CONFS, run_trainer, tb_scalars

PPO_SHORT = [  # 8 envs x 32 steps: 3 iterations of 2 epochs
    "TrainerConfig.num_env_steps = 768",
    "TrainerConfig.num_updates_per_train_iter = 2",
    "TrainerConfig.summary_interval = 1",
    "TrainerConfig.evaluate = False",
    "TrainerConfig.num_checkpoints = 0",
]
SAC_SHORT = [  # 100 random-policy steps, then 200 iterations of one update; one 200-step episode ends on the way
    "TrainerConfig.num_env_steps = 300",
    "TrainerConfig.initial_collect_steps = 100",
    "SacAlgorithm.hidden_sizes = (64, 64)",
    "TrainerConfig.mini_batch_size = 64",
    "TrainerConfig.summary_interval = 50",
    "TrainerConfig.metric_min_buffer_size = 1",
    "TrainerConfig.evaluate = False",
    "TrainerConfig.num_checkpoints = 0",
]


def loss_curves(scalars):
    return {tag: values for tag, values in scalars.items() if tag.startswith("loss/")}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("conf, params, loss_tags", [
    ("ppo_cartpole.gin", PPO_SHORT, {"loss/total", "loss/policy_loss", "loss/value_loss", "loss/entropy",
                                     "loss/approx_kl", "loss/clip_fraction", "loss/grad_norm"}),
    ("sac_pendulum.gin", SAC_SHORT, {"loss/total", "loss/critic_loss", "loss/actor_loss", "loss/alpha_loss",
                                     "loss/alpha", "loss/entropy"}),
], ids=["ppo_cartpole", "sac_pendulum"])
def test_same_seed_same_losses_other_seed_other_losses(tmp_path, conf, params, loss_tags):
    runs = {}
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        root = tmp_path / name
        assert run_trainer(CONFS / conf, root, params + [f"TrainerConfig.random_seed = {seed}"]) == 0
        runs[name] = tb_scalars(root)
    a, b, c = runs["a"], runs["b"], runs["c"]
    assert loss_tags <= set(a), sorted(a)
    assert "train/episode_return" in a and len(a["train/episode_return"]) >= 1
    curves_a, curves_b, curves_c = loss_curves(a), loss_curves(b), loss_curves(c)
    assert len(curves_a["loss/total"]) >= 3  # several summary points, not a single one
    assert curves_a == curves_b  # bit-identical values at the same steps
    assert a["train/episode_return"] == b["train/episode_return"]
    assert curves_c.keys() == curves_a.keys()
    assert curves_c["loss/total"] != curves_a["loss/total"]
    assert [s for s, _ in curves_c["loss/total"]] == [s for s, _ in curves_a["loss/total"]]
