"""``validate_confs.py --peer sb3``: the translation of a conf to Stable-Baselines3's arguments (values from the
confs' headers, by hand), its refusals, and the table built from canned runs (IQM by hand). SB3 itself is not needed
here: the translation is plain data, and the one test that trains both frameworks is slow and skips without SB3."""
import json
import math
import pathlib
import re
import sys

import gin
import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import peer_suite  # noqa: E402
import sb3_translate  # noqa: E402

CONFS = REPO / "confs"
WARM_UP = "Trainer.random_warm_up_actions=True"  # SB3's learning_starts: sac_pendulum.gin binds no warm-up policy


@pytest.fixture(autouse=True)
def _clear_gin():
    yield
    gin.clear_config()


def test_sac_mujoco_conf_translates_to_sb3s_arguments():
    job = sb3_translate.translate(CONFS / "sac_halfcheetah.gin", ["TrainerConfig.random_seed=3"])
    assert (job.algo, job.env_name, job.n_envs, job.seed, job.env_steps) == ("SAC", "HalfCheetah-v5", 1, 3, 1000000)
    assert (job.eval_every, job.eval_episodes, job.activation, job.normalize) == (10000, 5, "ReLU", None)
    assert job.kwargs == dict(learning_rate=3e-4, buffer_size=1000000, learning_starts=10000, batch_size=256,
                              tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1, ent_coef="auto_1",
                              policy_kwargs=dict(net_arch=dict(pi=[256, 256], qf=[256, 256]), n_critics=2))
    # alfish's update order has no SB3 argument (SB3 runs the critic-first order; sb3_peer.py --update_order emulates
    # the joint one): the same job in either
    critic_first = sb3_translate.translate(CONFS / "sac_halfcheetah.gin", ["TrainerConfig.random_seed=3",
                                                                            "SacAlgorithm.update_order='critic_first'"])
    assert critic_first.kwargs == job.kwargs


def test_sac_fixed_entropy_coefficient_initial_alpha_and_gsde_translate():
    job = sb3_translate.translate(CONFS / "sac_pendulum.gin", [
        "SacAlgorithm.ent_coef=0.1", "SacAlgorithm.use_sde=True", "SacAlgorithm.sde_sample_freq=4",
        "SacAlgorithm.log_std_init=-3.0", "SacAlgorithm.actor_hidden_sizes=(64, 64)", WARM_UP])
    assert job.kwargs["ent_coef"] == 0.1 and job.kwargs["use_sde"] and job.kwargs["sde_sample_freq"] == 4
    assert job.kwargs["policy_kwargs"]["log_std_init"] == -3.0 and "full_std" not in job.kwargs["policy_kwargs"]
    assert job.kwargs["policy_kwargs"]["net_arch"]["pi"] == [64, 64]
    job = sb3_translate.translate(CONFS / "sac_pendulum.gin", [f"SacAlgorithm.initial_log_alpha={math.log(0.1)}",
                                                                   WARM_UP])
    assert job.kwargs["ent_coef"] == "auto_0.1"  # RL Zoo's 'auto_0.1': learned, starting at 0.1


def test_td3_conf_translates_with_its_gaussian_exploration_noise():
    job = sb3_translate.translate(CONFS / "td3_hopper.gin")
    assert (job.algo, job.env_name, job.action_noise_sigma, job.activation) == ("TD3", "Hopper-v5", 0.1, "ReLU")
    assert job.kwargs["learning_rate"] == 1e-3 and job.kwargs["policy_delay"] == 2
    assert job.kwargs["target_policy_noise"] == 0.2 and job.kwargs["target_noise_clip"] == 0.5
    assert job.kwargs["policy_kwargs"]["net_arch"] == dict(pi=[400, 300], qf=[400, 300])


def test_ppo_translation_reads_trainer_optimizer_and_network_settings():
    job = sb3_translate.translate(CONFS / "ppo_cartpole.gin", [
        "PpoAlgorithm.ortho_init=True", "OptimizerConfig.max_grad_norm=0.5", "PpoAlgorithm.clip_range_vf=0.3",
        "PpoAlgorithm.target_kl=0.02", "ActorCriticNetworks.initial_log_std=-1.0"])
    assert job.algo == "PPO" and job.n_envs == 8 and job.eval_every % (8 * 32) == 0
    kwargs = job.kwargs
    assert (kwargs["n_steps"], kwargs["batch_size"], kwargs["n_epochs"]) == (32, 256, 20)
    assert (kwargs["gamma"], kwargs["gae_lambda"], kwargs["clip_range"]) == (0.98, 0.8, 0.2)
    assert (kwargs["clip_range_vf"], kwargs["target_kl"], kwargs["max_grad_norm"]) == (0.3, 0.02, 0.5)
    policy = kwargs["policy_kwargs"]
    assert policy["ortho_init"] is True and policy["log_std_init"] == -1.0
    assert policy["optimizer_kwargs"] == {"eps": 1e-5}  # the conf's OptimizerConfig.eps
    unbound = sb3_translate.translate(CONFS / "ppo_cartpole.gin", ["PpoAlgorithm.ortho_init=False",
                                                                   "OptimizerConfig.eps=None",
                                                                   "OptimizerConfig.max_grad_norm=None"])
    assert unbound.kwargs["max_grad_norm"] == float("inf") and not unbound.kwargs["policy_kwargs"]["ortho_init"]
    assert unbound.kwargs["policy_kwargs"]["optimizer_kwargs"] == {"eps": 1e-8}  # torch's Adam default, as alfish


def test_dqn_conf_translates_its_epsilon_schedule_and_target_period_in_env_steps():
    job = sb3_translate.translate(CONFS / "dqn_lunarlander.gin")
    assert (job.algo, job.env_name, job.eval_every) == ("DQN", "LunarLander-v3", 1250 * 4)
    assert job.kwargs == dict(  # RL Zoo's dqn.yml LunarLander entry, as the conf's header translates it
        learning_rate=6.3e-4, buffer_size=50000, learning_starts=128, batch_size=128, tau=1.0, gamma=0.99,
        train_freq=4, gradient_steps=4, target_update_interval=250, max_grad_norm=10.0,
        policy_kwargs=dict(net_arch=[256, 256]), exploration_initial_eps=1.0, exploration_final_eps=0.1,
        exploration_fraction=0.12)
    # 2 updates per 4 env steps: a target update every 250 updates is one every 500 env steps
    assert sb3_translate.translate(CONFS / "dqn_lunarlander.gin", ["TrainerConfig.num_updates_per_train_iter=2"]
                                   ).kwargs["target_update_interval"] == 500
    with pytest.raises(sb3_translate.TranslateError, match="double_q = True: SB3's DQN has no double-Q"):
        sb3_translate.translate(CONFS / "dqn_lunarlander.gin", ["DqnAlgorithm.double_q=True"])
    with pytest.raises(sb3_translate.TranslateError, match="linear from the start"):
        sb3_translate.translate(CONFS / "dqn_lunarlander.gin",
                                ["epsilon/LinearScheduler.schedule=[(0, 1.0), (0.1, 0.5), (0.2, 0.1)]"])


@pytest.mark.parametrize("params, named", [
    (["SacAlgorithm.burn_in=2"], "SacAlgorithm.burn_in has no SB3 translation"),
    (["SacAlgorithm.critic_lr=1e-3"], "SB3 uses one learning rate"),
    (["Trainer.random_warm_up_actions=False"], "bind Trainer.random_warm_up_actions = True"),
    (["create_environment.num_parallel_environments=2"], "covers one env"),
    (["OptimizerConfig.max_grad_norm=1.0"], "OptimizerConfig bindings are translated for PPO and DQN only"),
])
def test_a_setting_sb3_cannot_reproduce_is_a_one_line_error(params, named):
    with pytest.raises(sb3_translate.TranslateError, match=named) as err:
        sb3_translate.translate(CONFS / "sac_halfcheetah.gin", params)
    assert "\n" not in str(err.value)


def test_ppo_without_an_explicit_ortho_init_and_unknown_transformers_are_refused(tmp_path):
    with pytest.raises(sb3_translate.TranslateError, match="bind it to True or False"):
        sb3_translate.translate(CONFS / "ppo_cartpole.gin")
    with pytest.raises(sb3_translate.TranslateError, match="schedule"):
        sb3_translate.translate(CONFS / "sac_pendulum.gin", ["SacAlgorithm.actor_lr=@LinearScheduler()",
                                                             "SacAlgorithm.critic_lr=@LinearScheduler()",
                                                             "SacAlgorithm.alpha_lr=@LinearScheduler()", WARM_UP,
                                                             "LinearScheduler.schedule=[(0, 1e-3), (1, 1e-4)]",
                                                             "LinearScheduler.progress_type='percent'"])


def _canned(out: pathlib.Path, framework: str, seed: int, curve: list, wall_s: float, task: str = "task",
            env_steps: int = 1000) -> None:
    root = out / task / framework / f"seed-{seed}"
    root.mkdir(parents=True)
    run = peer_suite.PeerRun(framework, seed, env_steps, wall_s, curve)
    (root / "run.json").write_text(json.dumps(peer_suite.dataclasses.asdict(run)))


def test_table_rows_from_canned_runs(tmp_path):
    conf = tmp_path / "task.gin"
    conf.write_text("# Published (RL Zoo benchmark.md, sac Task-v3, 1M steps, one run): 9535 +- 100\n")
    finals = {"alfish": [100.0, 400.0, 200.0, 300.0], "sb3": [50.0, 70.0]}
    for framework, values in finals.items():
        for seed, final in enumerate(values):
            _canned(tmp_path, framework, seed, [(500, final / 2), (1000, final)], wall_s=10.0 * (seed + 1))
    runs = [peer_suite.run_one(fw, conf, seed, 1000, tmp_path, [], 1.0)  # read back: nothing is trained
            for fw, values in finals.items() for seed in range(len(values))]
    alfish, sb3 = peer_suite.task_rows(conf, runs, 1000)
    # IQM of 4: the mean of the middle two (200, 300); at half budget the same over the halves
    assert alfish[:3] == ["task", "alfish", "4"] and alfish[3].startswith("250 [") and alfish[4].startswith("125 [")
    low, high = (float(v) for v in alfish[3][5:-1].split(", "))
    assert 100 <= low <= 250 <= high <= 400
    assert alfish[5] == "25 s" and alfish[6] == "9535 ± 100"  # median of 10, 20, 30, 40
    assert sb3[3].startswith("60 [") and sb3[5] == "15 s"  # fewer than 4 runs: the plain mean
    table = peer_suite.markdown_table([alfish, sb3])
    assert table.splitlines()[0].startswith("| task | framework | seeds | final IQM") and table.count("\n") == 3


def test_a_finished_run_at_another_budget_is_refused_not_mixed(tmp_path):
    _canned(tmp_path, "alfish", 0, [(1000, 1.0)], 1.0)
    conf = tmp_path / "task.gin"
    conf.write_text("")
    with pytest.raises(ValueError, match="holds a run of 1000 env steps, not 2000"):
        peer_suite.run_one("alfish", conf, 0, 2000, tmp_path, [], 1.0)


def test_return_at_equal_env_steps_takes_the_last_evaluation_before():
    run = peer_suite.PeerRun("sb3", 0, 30, 1.0, [(10, 1.0), (20, 2.0), (30, 3.0)])
    assert (run.return_at(25), run.return_at(5), run.final_return) == (2.0, None, 3.0)
    assert np.isclose(run.return_at(30), 3.0)


@pytest.mark.slow  # two framework processes with their imports and a few hundred SAC updates: ~60 s
def test_both_frameworks_train_a_conf_and_the_table_has_both(tmp_path):
    pytest.importorskip("stable_baselines3")
    sys.modules.setdefault("validate_confs", None)
    import importlib.util

    spec = importlib.util.spec_from_file_location("validate_confs", REPO / "scripts" / "validate_confs.py")
    validate_confs = importlib.util.module_from_spec(spec)
    sys.modules["validate_confs"] = validate_confs
    spec.loader.exec_module(validate_confs)
    assert validate_confs.main([str(CONFS / "sac_pendulum.gin"), "--peer", "sb3", "--env_steps", "600", "--seeds",
                                "1", "--out", str(tmp_path), "--conf_param", "TrainerConfig.initial_collect_steps=200",
                                "--conf_param", "TrainerConfig.eval_interval=200", "--conf_param", WARM_UP]) == 0
    table = (tmp_path / "peer_table.md").read_text()
    assert "| sac_pendulum | alfish | 1 |" in table and "| sac_pendulum | sb3 | 1 |" in table
    for framework in peer_suite.FRAMEWORKS:
        steps = [json.loads(line)["env_steps"] for line in
                 (tmp_path / "sac_pendulum" / framework / "seed-0" / "eval_log.jsonl").read_text().splitlines()]
        assert steps[-1] == 600 and 400 in steps  # evaluated at the same env steps


@pytest.mark.slow  # SB3 trains 600 steps twice: ~60 s
def test_the_sb3_peer_resumes_from_its_checkpoint(tmp_path):
    pytest.importorskip("stable_baselines3")
    import subprocess

    command = [sys.executable, str(REPO / "scripts" / "sb3_peer.py"), "--conf", str(CONFS / "sac_pendulum.gin"),
               "--root_dir", str(tmp_path), "--checkpoint_every", "300"]
    for param in ("TrainerConfig.num_env_steps=600", "TrainerConfig.initial_collect_steps=100",
                  "TrainerConfig.eval_interval=200", WARM_UP):
        command += ["--conf_param", param]
    results = []
    for _ in range(2):  # the first run leaves its checkpoint at 300 steps; the second resumes from it
        out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600).stdout
        results.append(json.loads(out.split("RESULT ", 1)[1]))
    assert [r["resumed_from"] for r in results] == [0, 300] and results[1]["env_steps"] == 600
    records = [json.loads(line) for line in (tmp_path / "eval_log.jsonl").read_text().splitlines()]
    assert [r["env_steps"] for r in records] == [300, 500, 600]  # alfish's points: 100 + 200 k, and the budget
    assert records[0]["elapsed_s"] < records[1]["elapsed_s"] < records[2]["elapsed_s"]
    # SB3's own training statistics, one CSV per start (SAC: its losses and entropy coefficient)
    for start in ("from-0", "from-300"):
        header = (tmp_path / "sb3_log" / start / "progress.csv").read_text().splitlines()[0].split(",")
        assert {"train/actor_loss", "train/critic_loss", "time/total_timesteps"} <= set(header), header


def test_a_signal_is_noted_not_fatal_while_the_peer_trains_and_the_handlers_come_back():
    import os
    import signal

    import sb3_peer

    before = signal.getsignal(signal.SIGTERM)
    with sb3_peer.StopOnSignal() as stop:
        assert stop.signal_number is None
        os.kill(os.getpid(), signal.SIGTERM)  # handled at once (the main thread), noted for the callback
        assert stop.signal_number == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.slow  # SB3 trains up to 800 steps twice: ~40 s
def test_a_sigterm_saves_the_sb3_peer_and_the_same_command_resumes_it(tmp_path):
    pytest.importorskip("stable_baselines3")
    import signal
    import subprocess
    import time

    command = [sys.executable, str(REPO / "scripts" / "sb3_peer.py"), "--conf", str(CONFS / "sac_pendulum.gin"),
               "--root_dir", str(tmp_path), "--checkpoint_every", "0"]  # (no periodic checkpoint: the signal's only)
    for param in ("TrainerConfig.num_env_steps=800", "TrainerConfig.initial_collect_steps=100",
                  "TrainerConfig.eval_interval=100", WARM_UP):
        command += ["--conf_param", param]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "eval_log.jsonl"
    deadline = time.monotonic() + 300
    while not (log.exists() and log.read_text().strip()) and time.monotonic() < deadline:  # the first evaluation
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    saved = json.loads((tmp_path / "sb3_state.json").read_text())["num_timesteps"]
    assert 200 <= saved < 800 and f"stopped by signal {int(signal.SIGTERM)} at {saved} env steps" in err
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600).stdout
    result = json.loads(out.split("RESULT ", 1)[1])
    assert (result["resumed_from"], result["env_steps"]) == (saved, 800)
    steps = [json.loads(line)["env_steps"] for line in log.read_text().splitlines()]
    assert steps == list(range(200, 900, 100))  # every evaluation once: none lost to the stop, none repeated


def test_recorded_runs_add_up_across_out_dirs_and_a_damaged_record_is_one_line(tmp_path):
    """``--record``: a finished run's record is kept in the record dir; a later suite with a fresh ``--out`` (a new
    session's machine) reads it back instead of training, with its curve in OUT for the plot."""
    conf = tmp_path / "task.gin"
    conf.write_text("")
    first, record_dir = tmp_path / "session1", tmp_path / "records"
    _canned(first, "sb3", 0, [(500, 1.0), (1000, 3.0)], wall_s=7.0)
    run = peer_suite.run_one("sb3", conf, 0, 1000, first, [], 1.0, record_dir)  # read from OUT, kept in the record
    kept = record_dir / "task" / "sb3" / "seed-0" / "run.json"
    assert json.loads(kept.read_text())["curve"] == [[500, 1.0], [1000, 3.0]]
    second = tmp_path / "session2"
    again = peer_suite.run_one("sb3", conf, 0, 1000, second, [], 1.0, record_dir)  # nothing trains (timeout 1 s)
    assert (again.final_return, again.wall_s) == (run.final_return, 7.0)
    logged = [json.loads(line) for line in (second / "task" / "sb3" / "seed-0" / "eval_log.jsonl").read_text()
              .splitlines()]
    assert [(r["env_steps"], r["average_return"]) for r in logged] == [(500, 1.0), (1000, 3.0)]
    with pytest.raises(ValueError, match="holds a run of 1000 env steps, not 2000"):
        peer_suite.run_one("sb3", conf, 0, 2000, tmp_path / "session3", [], 1.0, record_dir)
    kept.write_text('{"framework": "sb3", "seed"')  # damaged: one line naming the file, no training
    with pytest.raises(ValueError, match=r"run\.json is not a run record .*delete it"):
        peer_suite.run_one("sb3", conf, 0, 1000, tmp_path / "session4", [], 1.0, record_dir)


def test_a_run_record_names_the_commit_that_ran_it():
    commit = peer_suite.git_commit()
    assert commit is None or re.fullmatch(r"[0-9a-f]{4,40}(\+dirty)?", commit)


def test_record_without_peer_is_refused():
    import validate_confs

    assert validate_confs.main(["--record", "somewhere", str(CONFS / "ppo_cartpole.gin")]) == 2


def test_table_only_prints_the_recorded_seeds_and_trains_nothing(tmp_path, capsys):
    import validate_confs

    records = tmp_path / "records"
    for framework, final in (("alfish", 3000.0), ("sb3", 2000.0)):  # seed 0 recorded; seed 1 not yet
        _canned(records, framework, 0, [(500, final / 2), (1000, final)], wall_s=5.0, task="td3_halfcheetah")
    code = validate_confs.main([str(CONFS / "td3_halfcheetah.gin"), "--peer", "sb3", "--seeds", "2", "--env_steps",
                                "1000", "--record", str(records), "--out", str(tmp_path / "out"), "--table_only"])
    assert code == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| td3_halfcheetah")]
    assert [row.split(" | ")[1:4] for row in rows] == [["alfish", "1", "3000"],
                                                       ["sb3", "1", "2000"]]  # one seed: the value itself
    assert not (tmp_path / "out" / "td3_halfcheetah" / "alfish" / "seed-1").exists()  # nothing trained
    assert (tmp_path / "out" / "td3_halfcheetah.png").is_file()  # the curves, from the records' eval logs


def test_first_seed_leaves_the_earlier_seeds_out_and_bad_values_are_refused(tmp_path, capsys):
    import validate_confs

    records = tmp_path / "records"
    for seed in (0, 1):
        _canned(records, "alfish", seed, [(1000, 100.0 * (seed + 1))], wall_s=1.0, task="td3_halfcheetah")
    common = [str(CONFS / "td3_halfcheetah.gin"), "--peer", "sb3", "--env_steps", "1000", "--record", str(records),
              "--out", str(tmp_path / "out"), "--table_only"]
    assert validate_confs.main([*common, "--seeds", "2", "--first_seed", "1"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| td3_halfcheetah | alfish"))
    assert row.split(" | ")[2:4] == ["1", "200"]  # seed 1 only
    assert validate_confs.main([*common, "--seeds", "2", "--first_seed", "2"]) == 2
    assert validate_confs.main([str(CONFS / "td3_halfcheetah.gin"), "--first_seed", "1"]) == 2  # without --peer


def test_train_only_trains_one_framework_and_tables_the_others_records(tmp_path, capsys):
    """``--train_only alfish``: alfish's missing run is started (here it fails at once: an empty conf), SB3's missing
    run is not; SB3's recorded seed is still tabled."""
    import validate_confs

    conf = tmp_path / "task.gin"
    conf.write_text("")
    records, out = tmp_path / "records", tmp_path / "out"
    _canned(records, "sb3", 0, [(1000, 50.0)], wall_s=1.0)
    rows = peer_suite.run_suite([peer_suite.PeerTask(conf, 2, 1000)], out, [], 120.0, 1, records,
                                train_frameworks=["alfish"])
    assert [row[1:3] for row in rows] == [["alfish", "0 (2 failed)"], ["sb3", "1"]]
    assert (out / "task" / "alfish" / "seed-1").is_dir()  # tried
    assert not (out / "task" / "sb3" / "seed-1").exists()  # not trained
    assert validate_confs.main([str(CONFS / "ppo_cartpole.gin"), "--train_only", "alfish"]) == 2  # without --peer
    assert "--train_only is about the runs of --peer sb3 only" in capsys.readouterr().err


def test_a_suite_of_tasks_tables_each_at_its_own_budget_in_order(tmp_path):
    """Several confs in one suite (their runs queued together): each task's rows, in the tasks' order, read at the
    task's own budget."""
    records = tmp_path / "records"
    _canned(records, "alfish", 0, [(500, 1.0), (1000, 10.0)], wall_s=1.0, task="a")
    _canned(records, "sb3", 0, [(2000, 20.0)], wall_s=1.0, task="b", env_steps=2000)
    for name in ("a", "b"):
        (tmp_path / f"{name}.gin").write_text("")  # (read for a published figure: none)
    tasks = [peer_suite.PeerTask(tmp_path / "b.gin", 1, 2000), peer_suite.PeerTask(tmp_path / "a.gin", 1, 1000)]
    rows = peer_suite.run_suite(tasks, tmp_path / "out", [], 1.0, 2, records, train=False)
    assert [row[:4] for row in rows] == [["b", "alfish", "0", "-"], ["b", "sb3", "1", "20"],
                                         ["a", "alfish", "1", "10"], ["a", "sb3", "0", "-"]]
