"""``tools/bench/probe_td3_update_order.py`` on a real short TD3 run: it reads the run's checkpoint (algorithm, Adam
moments, replay) and measures the two update orders against the batch-to-batch noise."""
import json
import pathlib
import sys

from tests.integration.inprocess import OFF_POLICY_POINT_GOAL, run_trainer_from_text

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "bench"))
import probe_td3_update_order as probe  # noqa: E402

TD3 = OFF_POLICY_POINT_GOAL + """
Td3Algorithm.hidden_sizes = (32, 32)
TrainerConfig.algorithm_ctor = @Td3Algorithm
Trainer.num_threads = 1
TrainerConfig.num_env_steps = 400
TrainerConfig.eval_interval = 1000
TrainerConfig.num_checkpoints = 1
TrainerConfig.async_eval = False
"""


def test_the_probe_reads_a_td3_checkpoint_and_one_critic_step_moves_the_actor_less_than_another_batch(tmp_path,
                                                                                                      capsys):
    root = run_trainer_from_text(tmp_path, TD3)
    step = max(int(p.name.split("-")[1]) for p in (root / "checkpoints").glob("ckpt-*"))
    algorithm, _, columns = probe.load_checkpoint(root / "checkpoints" / f"ckpt-{step}")
    assert [m.out_features for m in algorithm.actor if hasattr(m, "out_features")][:2] == [32, 32]
    assert columns["observation"].shape[0] == columns["action"].shape[0] > 100  # the saved replay, as episodes
    assert probe.main([str(root), "--steps", str(step), "--batches", "5", "--batch", "64", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])[str(step)]
    for key, value in result.items():
        assert (-1.0 <= value <= 1.0) if "cos" in key else value >= 0.0, (key, value)
    # one Adam step of the critic changes the actor's step less than drawing another batch does
    assert result["step_rel_order"] < result["step_rel_batch"]
    assert result["step_cos_order"] > result["step_cos_batch"]
