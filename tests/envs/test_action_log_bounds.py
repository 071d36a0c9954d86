"""Recorded action logs read back from a checkpoint are untrusted (DESIGN.md §3.13): a damaged one (a broadcast
array claiming millions of actions, more actions than an episode log holds, another action shape) is not replayed
(that env restarts, with one warning), quickly and in bounded memory; and a replay gives up when a stop signal is
pending."""
import logging
import resource
import signal
import time

import numpy as np
import torch

from alfish.console.signals import SignalRequests
from alfish.envs.batched_env import BatchedEnv
from alfish.envs.episode_log import MAX_LOGGED_ACTIONS, action_log_problem


def _states_after(env: BatchedEnv, steps: int) -> list[dict]:
    env.reset()
    for i in range(steps):
        env.step(torch.tensor([i % 2] * env.num_envs))
    return env.resume_states()


def test_a_broadcast_log_claiming_ten_million_actions_is_refused_at_once(caplog):
    env = BatchedEnv("CartPole-v1", 2, seed=1)
    states = _states_after(env, 5)
    forged = dict(states[1], actions=np.broadcast_to(np.zeros((1,), np.int64), (10_000_000,)))  # 8 bytes, stride 0
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    with caplog.at_level(logging.WARNING):
        matched = env.restore([states[0], forged], np.zeros(2, bool))
    assert time.monotonic() - start < 2.0
    assert matched == [True, False]  # env 0 replayed exactly; env 1 restarted
    (warning,) = [r.getMessage() for r in caplog.records if "exact resume" in r.getMessage()]
    assert warning == (f"exact resume: the recorded episode of env(s) [1] of 'CartPole-v1' is damaged (env 1: it "
                       f"claims 10000000 actions, more than the {MAX_LOGGED_ACTIONS} an episode log may hold); those "
                       "envs restart instead of replaying it")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 100_000  # KB: nothing materialized
    env.close()


def test_each_kind_of_damage_is_named():
    good = dict(start={"seed": 1}, actions=np.zeros((3,), np.int64), last_observation=np.zeros(4, np.float32),
                ended=False)
    assert action_log_problem(good) is None
    strided = np.broadcast_to(np.zeros((1, 2)), (4, 2))
    assert "not contiguous" in action_log_problem(dict(good, actions=strided))
    assert "not contiguous" in action_log_problem(dict(good, actions=np.zeros((6, 2))[::2]))
    assert "more than the 2" in action_log_problem(good, max_actions=2)
    assert "numeric array" in action_log_problem(dict(good, actions=np.array(["a"])))
    assert "stride-0" in action_log_problem(dict(good, last_observation=np.broadcast_to(np.zeros(1), (10**6,))))
    assert action_log_problem({"start": None}) == "not a recorded env state"


def test_actions_of_another_shape_are_not_replayed():
    env = BatchedEnv("CartPole-v1", 1, seed=1)
    states = _states_after(env, 4)
    assert env.restore([dict(states[0], actions=np.zeros((4, 3), np.int64))], np.zeros(1, bool)) == [False]
    assert env.restore([dict(states[0], last_observation=np.zeros(7, np.float32))], np.zeros(1, bool)) == [False]
    assert env.restore(states, np.zeros(1, bool)) == [True]
    env.close()


def test_a_pending_stop_ends_the_replay():
    env = BatchedEnv("CartPole-v1", 1, seed=1)
    states = _states_after(env, 20)
    with SignalRequests() as sig:
        signal.raise_signal(signal.SIGTERM)
        assert sig.stop_requested
        assert env.restore(states, np.zeros(1, bool)) == [False]  # replayed nothing: the run is stopping
        assert len(env.resume_states()[0]["actions"]) == 0
    assert env.restore(states, np.zeros(1, bool)) == [True]
    env.close()
