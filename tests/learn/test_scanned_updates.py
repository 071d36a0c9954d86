"""An iteration's updates as one compiled scan (``Learner.scan_updates``, ``alfish.learn.scanned_updates``): the same
updates as the whole update one by one (parameters, Adam state, the target network, priorities, the last loss and its
terms, bit for bit), a non-finite loss stopping the scan where single updates would stop, an iteration whose target
changes inside it updated one by one, and where it is refused. aot_eager: the graphs without generating code."""
from __future__ import annotations

import logging

import gymnasium as gym
import numpy as np
import pytest
import torch

from alfish.algorithms import DqnAlgorithm, SacAlgorithm
from alfish.data import nest
from alfish.data.types import BatchInfo, Experience
from alfish.errors import NonFiniteLossError, OneLineValueError
from alfish.learn.learner import Learner
from alfish.learn.optim import OptimizerConfig

OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
K, B, L = 4, 8, 2  # updates per iteration, mini-batch size, sequence length (n_step 1)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def dqn(period: int = K) -> DqnAlgorithm:
    torch.manual_seed(0)
    return DqnAlgorithm(OBS, gym.spaces.Discrete(2), hidden_sizes=(16, 16), lr=1e-2, target_update_period=period)


def learner(algorithm, scan: bool) -> Learner:
    return Learner(algorithm, OptimizerConfig(max_grad_norm=1.0), compile_mode="default", compile_backend="aot_eager",
                   scan_updates=scan)


def sample(seed: int, nan_at: int | None = None, weighted: bool = True) -> tuple[Experience, BatchInfo]:
    """K mini-batches of B sequences drawn at once: ``[L, K * B]`` (the layout of ``sample_batch(num_batches=K)``),
    importance weights ``[K * B]`` (``weighted``: else None, uniform replay); ``nan_at``: a NaN reward in that
    mini-batch."""
    g = torch.Generator().manual_seed(seed)
    reward = torch.randn(L, K * B, generator=g)
    if nan_at is not None:
        reward[1, nan_at * B] = float("nan")
    batch = Experience(step_type=torch.ones(L, K * B, dtype=torch.int8), reward=reward,
                       discount=torch.ones(L, K * B), observation=torch.randn(L, K * B, 4, generator=g),
                       action=torch.randint(0, 2, (L, K * B), generator=g),
                       env_id=torch.zeros(L, K * B, dtype=torch.int64))
    return batch, BatchInfo(env_ids=torch.zeros(K * B, dtype=torch.int64), positions=torch.arange(K * B),
                            importance_weights=torch.rand(K * B, generator=g) + 0.5 if weighted else None)


def one_by_one(single: Learner, batch: Experience, info: BatchInfo) -> torch.Tensor:
    """The K updates as the training step makes them without a scan; their priorities in update order."""
    priorities = []
    for k in range(K):
        part = slice(k * B, (k + 1) * B)
        loss_info = single.update(nest.map_nest(lambda x, part=part: x[:, part], batch),
                                  BatchInfo(*(None if x is None else x[part] for x in info)))
        priorities.append(loss_info.priority)
    return torch.cat(priorities)


def assert_same_state(a: Learner, b: Learner) -> None:
    for (name, p), q in zip(a.algorithm.state_dict().items(), b.algorithm.state_dict().values()):
        assert torch.equal(p, q), name  # the Q-network, the target network, the update count
    for p, q in zip(a.params, b.params):
        sa, sb = a.optimizer.state[p], b.optimizer.state[q]
        assert all(torch.equal(sa[k], sb[k]) for k in ("step", "exp_avg", "exp_avg_sq"))
    assert a.num_updates == b.num_updates and a.algorithm.updates_done == b.algorithm.updates_done


@pytest.mark.parametrize("weighted", [True, False], ids=["prioritized", "uniform"])
def test_scanned_updates_are_the_updates_one_by_one(weighted):
    single, scanned = learner(dqn(), scan=False), learner(dqn(), scan=True)
    graphs = []
    for iteration in range(3):  # the target network is copied after each iteration's 4th update (period 4)
        batch, info = sample(seed=iteration, weighted=weighted)
        priorities = one_by_one(single, batch, info)
        graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
        out = scanned.update_scanned(batch, info, K)
        assert out is not None and scanned._scan.scans == iteration + 1
        assert torch.equal(out.priority, priorities)  # [K * B], in update order
        assert_same_state(single, scanned)
        assert torch.equal(scanned._last_loss.loss, single._last_loss.loss)
        assert scanned._last_loss.extra.keys() == {"td_loss", "q_mean", "epsilon"}
        assert all(torch.equal(v, single._last_loss.extra[k]) for k, v in scanned._last_loss.extra.items())
        assert torch.equal(scanned._last_grad_norm, single._last_grad_norm)
    assert not torch.equal(scanned.algorithm.q_net[0].weight, dqn().q_net[0].weight)  # (it did train)
    assert graphs[1] == graphs[2]  # the scan compiled once, in the first iteration: no recompile after it


def test_a_non_finite_loss_stops_the_scan_where_single_updates_stop():
    single, scanned = learner(dqn(), scan=False), learner(dqn(), scan=True)
    batch, info = sample(seed=0, nan_at=2)
    with pytest.raises(NonFiniteLossError, match=r"^loss is nan at update 2; non-finite loss terms: td_loss"):
        one_by_one(single, batch, info)
    with pytest.raises(NonFiniteLossError, match=r"^loss is nan at update 2; non-finite loss terms: td_loss"):
        scanned.update_scanned(batch, info, K)
    assert scanned.num_updates == 2
    assert_same_state(single, scanned)  # updates 0 and 1 made, 2 and 3 changed nothing


def test_an_iteration_whose_target_changes_inside_it_updates_one_by_one(caplog):
    scanned = learner(dqn(period=2), scan=True)  # the target is copied after every 2nd update: not fixed for 4
    batch, info = sample(seed=0)
    with caplog.at_level(logging.WARNING):
        assert scanned.update_scanned(batch, info, K) is None
        assert scanned.update_scanned(batch, info, K) is None
    assert [r.getMessage() for r in caplog.records] == [
        "Learner.scan_updates=True: an iteration's 4 updates span a change of what DqnAlgorithm's losses read (e.g. "
        "a target network update); such iterations update one by one (a target_update_period that is a multiple of "
        "the updates per iteration avoids them)"]  # once
    assert scanned.num_updates == 0 and scanned._scan.scans == 0


def test_scan_updates_is_refused_where_it_cannot_run():
    with pytest.raises(OneLineValueError, match=r"^Learner.scan_updates=True: it runs the compiled whole update K "
                                                r"times in one call: it needs Learner.compile_mode set"):
        Learner(dqn(), scan_updates=True)
    sac = SacAlgorithm(OBS, gym.spaces.Box(-1.0, 1.0, (1,)), hidden_sizes=(8,))
    with pytest.raises(OneLineValueError, match=r"^Learner.scan_updates=True: SacAlgorithm's losses read values that "
                                                r"change from one update to the next"):
        learner(sac, scan=True)
