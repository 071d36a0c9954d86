"""Data-parallel training with torchrun on CPU (gloo, two processes): gradients equal a single process on the
concatenated batch; SAC, PPO and TD3 in the critic-first order end with identical parameters on both ranks and only
rank 0 writes; a killed rank ends the job quickly with the root cause; a hung rank is named in it; the parameter check
names a differing parameter; a checkpoint write longer than the collective timeout is waited for, and one that hangs
ends the job with a line saying so.

The confs use alfish's (ALF's) per-rank settings: ``num_parallel_environments`` and ``mini_batch_size`` are each
rank's, ``num_env_steps`` and ``initial_collect_steps`` the job's totals."""
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

from tests.trainer.ddp_batches import build_algorithm_and_batch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(REPO, "tests", "trainer", "ddp_worker.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")

pytestmark = [pytest.mark.timeout(180), pytest.mark.distributed]

SAC = """
create_environment.env_name = 'alfish/PointGoal-v0'
create_environment.num_parallel_environments = 1  # per rank: 2 envs over the job
SacAlgorithm.hidden_sizes = (16,)
TrainerConfig.algorithm_ctor = @SacAlgorithm
Trainer.num_threads = 1
TrainerConfig.random_seed = 3
TrainerConfig.num_iterations = 60
TrainerConfig.unroll_length = 1
TrainerConfig.initial_collect_steps = 20  # over the job: 10 steps of each rank's env
TrainerConfig.whole_replay_buffer_training = False
TrainerConfig.replay_buffer_length = 1000
TrainerConfig.mini_batch_size = 8  # per rank: each update averages the gradients of 16 sequences
TrainerConfig.mini_batch_length = 2
TrainerConfig.summary_interval = 20
TrainerConfig.evaluate = True
TrainerConfig.eval_interval = 30
TrainerConfig.num_eval_episodes = 1
TrainerConfig.num_eval_environments = 1
TrainerConfig.num_checkpoints = 2
TrainerConfig.ddp_paras_check_interval = 10
"""

# TD3 in the critic-first order: each rank keeps its own batch for the deferred actor term, and DDP must be told to
# look for unused parameters even with no policy delay (the actor sits out the first update: without the flag, DDP
# fails the second with "Expected to have finished reduction in the prior iteration")
TD3_CRITIC_FIRST = (SAC.replace("SacAlgorithm", "Td3Algorithm")
                    + "Td3Algorithm.update_order = 'critic_first'\nTd3Algorithm.policy_delay = 1\n")
SAC_CRITIC_FIRST = SAC + "SacAlgorithm.update_order = 'critic_first'\n"  # (its actor and alpha sit out update 1)
RANK_LOCAL = ("deferred_observations", "deferred_valid")  # the critic-first order's kept batch: rank-local by design

PPO = """
create_environment.env_name = 'alfish/Chain-v0'
create_environment.num_parallel_environments = 2  # per rank: 4 envs over the job
PpoAlgorithm.hidden_sizes = (16,)
TrainerConfig.algorithm_ctor = @PpoAlgorithm
Trainer.num_threads = 1
TrainerConfig.random_seed = 3
TrainerConfig.num_iterations = 6
TrainerConfig.unroll_length = 8
TrainerConfig.whole_replay_buffer_training = True
TrainerConfig.clear_replay_buffer = True
TrainerConfig.replay_buffer_length = 16
TrainerConfig.mini_batch_size = 4  # per rank: 8 sequences per update over the job
TrainerConfig.mini_batch_length = 1
TrainerConfig.num_updates_per_train_iter = 2
TrainerConfig.summary_interval = 2
TrainerConfig.evaluate = True
TrainerConfig.eval_interval = 3
TrainerConfig.num_eval_episodes = 1
TrainerConfig.num_eval_environments = 1
TrainerConfig.num_checkpoints = 2
TrainerConfig.ddp_paras_check_interval = 1
"""


def torchrun(*args, timeout=150):
    return subprocess.run(TORCHRUN + list(args), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)


def check_ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"


# DDPG (two optimizer groups) runs in the slow tier: the same DDP wrapper and gradient averaging as DQN's.
@pytest.mark.parametrize("algo", ["dqn", pytest.param("ddpg", marks=pytest.mark.slow)])
def test_one_ddp_update_gives_the_gradients_of_one_process_on_the_concatenated_batch(tmp_path, algo):
    check_ok(torchrun(WORKER, "grads", str(tmp_path), algo))
    algorithm, batch = build_algorithm_and_batch(algo)
    train_info = algorithm.train_step(batch).info
    algorithm.calc_loss(batch, train_info).loss.mean().backward()
    expected = {n: p.grad for n, p in algorithm.named_parameters() if p.grad is not None}
    assert expected
    for rank in (0, 1):
        got = torch.load(tmp_path / f"grads-rank{rank}.pt", weights_only=True)
        assert set(got) == set(expected)
        for name, grad in expected.items():
            # float32 sums over the batch in another order: equal to rounding (stated tolerance 1e-6 abs, 1e-5 rel)
            torch.testing.assert_close(got[name], grad, atol=1e-6, rtol=1e-5, msg=f"rank {rank}: {name}")


@pytest.mark.parametrize("conf_text, expected_evals, checkpoints",
                         [(SAC, 2, ["ckpt-30", "ckpt-60"]),
                          # slow: PPO on two ranks also ends with identical parameters and rank 0's checkpoint in the
                          # default run's checkpoint-barrier test below and in test_torchrun_confs' PPO conf
                          pytest.param(PPO, 2, ["ckpt-3", "ckpt-6"], marks=pytest.mark.slow),
                          pytest.param(TD3_CRITIC_FIRST, 2, ["ckpt-30", "ckpt-60"], marks=pytest.mark.slow),
                          pytest.param(SAC_CRITIC_FIRST, 2, ["ckpt-30", "ckpt-60"], marks=pytest.mark.slow)],
                         ids=["sac", "ppo", "td3_critic_first", "sac_critic_first"])
def test_ranks_end_with_identical_parameters_and_only_rank_0_writes(tmp_path, conf_text, expected_evals, checkpoints):
    conf, root = tmp_path / "conf.gin", tmp_path / "root"
    conf.write_text(conf_text)
    proc = torchrun(WORKER, "train", str(tmp_path), str(conf), str(root))
    check_ok(proc)
    params = [torch.load(tmp_path / f"params-rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert params[0].keys() == params[1].keys()
    for name in params[0]:
        if name not in RANK_LOCAL:
            assert torch.equal(params[0][name], params[1][name]), name
    if "deferred_observations" in params[0]:  # each rank kept a batch of its own rows, not rank 0's
        assert not torch.equal(params[0]["deferred_observations"], params[1]["deferred_observations"])
    # written by rank 0 alone: one event file, one evaluation record per evaluation, no rank-1 lines in the log
    events = [f for _, _, files in os.walk(root / "tb") for f in files if f.startswith("events.out")]
    assert len(events) == 1, events
    assert len((root / "eval_log.jsonl").read_text().splitlines()) == expected_evals
    assert "[rank 1]" not in (root / "log.txt").read_text()
    assert "[rank 1]" in proc.stderr  # rank 1 did run (and logged to stderr only)
    assert sorted(os.listdir(root / "checkpoints")) == ["best"] + checkpoints  # (best: the best evaluated policy)


SHORT_PPO = """
create_environment.env_name = 'alfish/Chain-v0'
create_environment.num_parallel_environments = 1
PpoAlgorithm.hidden_sizes = (8,)
TrainerConfig.algorithm_ctor = @PpoAlgorithm
Trainer.num_threads = 1
TrainerConfig.random_seed = 3
TrainerConfig.num_iterations = 4
TrainerConfig.unroll_length = 4
TrainerConfig.whole_replay_buffer_training = True
TrainerConfig.clear_replay_buffer = True
TrainerConfig.replay_buffer_length = 8
TrainerConfig.mini_batch_size = 2
TrainerConfig.mini_batch_length = 1
TrainerConfig.evaluate = False
TrainerConfig.num_checkpoints = 1
init_distributed.timeout_s = 3
"""


def test_a_checkpoint_write_longer_than_the_collective_timeout_is_waited_for_not_taken_for_a_hung_rank(tmp_path):
    """Rank 0 takes 6 s to write the checkpoint (as a multi-GB replay buffer on a slow disk would) and the collective
    timeout is 3 s: rank 1 waits for it in the checkpoint barrier, and the job ends normally with the checkpoint."""
    conf, root = tmp_path / "conf.gin", tmp_path / "root"
    conf.write_text(SHORT_PPO)
    start = time.monotonic()
    proc = torchrun(WORKER, "slow_save", str(tmp_path), "6", "write", str(conf), str(root))
    check_ok(proc)
    assert time.monotonic() - start > 6  # the write was slow
    assert sorted(os.listdir(root / "checkpoints")) == ["ckpt-4"]
    params = [torch.load(tmp_path / f"params-rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert all(torch.equal(params[0][name], params[1][name]) for name in params[0])


# slow: a second 2-rank job (19 s here); tests/learn/test_checkpoint_barrier.py checks the line in the default run
@pytest.mark.slow
def test_a_checkpoint_write_that_hangs_still_ends_the_job_with_a_line_that_says_so(tmp_path):
    """The checkpoint hangs (60 s here; the checkpoint timeout is 2 s): rank 1 gives up waiting for it with a one-line
    error naming rank 0's write, and the job ends (torchrun stops rank 0: it hangs where a hard exit need not wait,
    within ``Trainer.stop_grace_s``)."""
    conf = tmp_path / "conf.gin"
    conf.write_text(SHORT_PPO + "init_distributed.checkpoint_timeout_s = 2\nTrainer.stop_grace_s = 1\n")
    start = time.monotonic()
    proc = torchrun(WORKER, "slow_save", str(tmp_path), "60", "contents", str(conf), str(tmp_path / "root"),
                    timeout=60)
    assert proc.returncode != 0 and time.monotonic() - start < 50
    assert re.search(r"\[rank1\]: alfish\.learn\.checkpoint_barrier\.CheckpointWaitError: rank 1 waited 2 s "
                     r"\(init_distributed\.checkpoint_timeout_s\) for rank 0 to write the checkpoint of iteration 4; "
                     r"rank 0 has been writing the checkpoint of iteration 4 for [23] s; if writes of this size take "
                     r"longer", proc.stderr), proc.stderr[-3000:]


SLOW = SAC.replace("'alfish/PointGoal-v0'", "'alfish/Latency-v0'").replace(
    "TrainerConfig.num_iterations = 60", "TrainerConfig.num_iterations = 100000") + """
create_environment.env_kwargs = {'env_name': 'alfish/PointGoal-v0', 'latency_s': 0.01}
Trainer.progress_log_interval_s = 1
"""


def start_slow_job(tmp_path, extra=""):
    """A 2-rank job on a slow env; returns (torchrun process, {rank: worker}) once both ranks train."""
    conf = tmp_path / "slow.gin"
    conf.write_text(SLOW + extra)
    proc = subprocess.Popen(TORCHRUN + ["-m", "alfish.bin.train", "--conf", str(conf), "--root_dir",
                                        str(tmp_path / "root")], cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    workers = {}
    deadline = time.monotonic() + 90
    while len(workers) < 2 and time.monotonic() < deadline:
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                rank = child.environ().get("RANK")
                if rank in ("0", "1") and (tmp_path / "root" / "tb").exists():
                    workers[int(rank)] = child
            except psutil.Error:
                pass
        time.sleep(0.5)
    assert len(workers) == 2, "the ranks never started"
    # Both ranks train (not merely started) once rank 0 logged iteration 2 or later: it passed iteration 1's stop-flag
    # all-reduce, which rank 1 joins only after recording its progress (the heartbeat a hung rank is named by).
    log, iterations, deadline = tmp_path / "root" / "log.txt", [], time.monotonic() + 90
    while max(iterations, default=0) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
        iterations = [int(i) for i in re.findall(r" INFO iteration (\d+)/", log.read_text() if log.exists() else "")]
    assert max(iterations, default=0) >= 2, "the ranks never trained"
    return proc, workers


def test_a_killed_rank_ends_the_job_within_a_minute_with_the_root_cause(tmp_path):
    proc, ranks = start_slow_job(tmp_path)
    victim = ranks[1]
    workers = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    os.kill(victim.pid, signal.SIGKILL)
    start = time.monotonic()
    _, stderr = proc.communicate(timeout=90)
    assert time.monotonic() - start < 60
    assert proc.returncode != 0
    assert "Root Cause" in stderr and f"exitcode  : -9 (pid: {victim.pid})" in stderr, stderr[-3000:]
    time.sleep(1.0)
    assert not [pid for pid in workers if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]  # no orphans


def test_parameter_check_names_the_first_differing_parameter(tmp_path):
    proc = torchrun(WORKER, "check", str(tmp_path), "dqn")
    assert proc.returncode != 0
    for rank in (0, 1):
        assert (f"rank {rank}: DDP ranks hold different parameters: 'q_net.2.bias' differs between rank 0 and rank 1"
                in proc.stdout), proc.stdout[-2000:] + proc.stderr[-2000:]


# slow: waits out the 10 s collective timeout twice over (54 s); the killed-rank test keeps the root-cause path in the
# default run
@pytest.mark.slow
def test_a_hung_rank_ends_the_job_within_a_minute_and_the_root_cause_names_it(tmp_path):
    proc, ranks = start_slow_job(tmp_path, "init_distributed.timeout_s = 10\n")
    os.kill(ranks[1].pid, signal.SIGSTOP)  # hangs: alive, but never answers a collective again
    start = time.monotonic()
    ranks[0].wait(timeout=60)  # rank 0 gives up after the collective timeout (psutil.TimeoutExpired otherwise)
    assert time.monotonic() - start < 60
    _, stderr = proc.communicate(timeout=90)  # torchrun then kills the hung rank
    assert proc.returncode != 0
    assert f"rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: {ranks[0].pid})" in stderr, stderr[-3000:]
    # torchrun's Root Cause names the rank that stopped, not the rank that timed out waiting for it
    root_cause = stderr[stderr.index("Root Cause"):]
    assert re.search(r"error_file: .*\n  traceback : RankStoppedError: rank 1 \(last progress: iteration \d+, \d+ s "
                     r"ago\) stopped making progress", root_cause), root_cause[:3000]
    assert not psutil.pid_exists(ranks[1].pid) or ranks[1].status() == psutil.STATUS_ZOMBIE
