"""The body of the no-recompile tests, shared by the CPU suite (``tests/learn/test_compiled_no_recompile.py``:
``'default'`` mode, a counting ``aot_eager`` backend) and the GPU tier (``tests/gpu/test_no_recompile.py``:
``'reduce-overhead'``, inductor and CUDA graphs, on ``ALFISH_TEST_DEVICE``).

dynamo guards on every Python value the compiled forward (``train_step`` + ``calc_loss``) reads. A value that changes
between updates -- an update counter (TD3's policy delay), a scheduled coefficient (PPO's clip range and entropy
coefficient, SAC's target entropy, DQN's epsilon in its summary term) -- recompiles the update every time, and after
``recompile_limit`` (8) compiles dynamo runs it eagerly without a word. ``check_no_recompile`` builds one algorithm
small, with every learning rate and every schedulable coefficient on a schedule that changes at each update (progress
reported as the trainer reports it), runs warm-up updates (which compile every graph the algorithm needs: TD3 has two,
actor due and not due), then many more under ``error_on_recompile`` and asserts that nothing compiled again, that no
update fell back to eager code, and that the compiled updates are the eager ones.
"""
from __future__ import annotations

import copy
import logging
from typing import Any, Callable, Iterator, Optional

import gymnasium as gym
import torch
import torch._dynamo
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters

from alfish.algorithms import (
    A2cAlgorithm,
    BcAlgorithm,
    DdpgAlgorithm,
    DqnAlgorithm,
    IqlAlgorithm,
    PpoAlgorithm,
    SacAlgorithm,
    Td3Algorithm,
)
from alfish.algorithms.ppo import PpoExperienceInfo
from alfish.algorithms.supervised import SupervisedBatch, SupervisedModel
from alfish.data import nest
from alfish.data.types import Experience, StepType
from alfish.learn.learner import Learner
from alfish.learn.optim import OptimizerConfig
from alfish.schedulers import LinearScheduler, reset_progress, traced_values, update_progress

OBS = gym.spaces.Box(-1.0, 1.0, shape=(3,))
BOX = gym.spaces.Box(-2.0, 2.0, shape=(1,))
DISCRETE = gym.spaces.Discrete(3)
B = 4
WARM_UP, MEASURED = 4, 12  # TD3's two graphs compile within 2 updates; 12 more cover several delay/target periods


def changing(start: float, end: float) -> LinearScheduler:
    """A schedule whose value changes at every iteration reported (progress type 'iterations')."""
    return LinearScheduler("iterations", [(0, start), (1000, end)])


def lrs(*names: str) -> dict[str, LinearScheduler]:
    return {f"{name}_lr" if name else "lr": changing(1e-3, 1e-4) for name in names}


#: name -> (constructor with changing schedules, action space, sequence length L of a batch).
ALGORITHMS: dict[str, tuple[Callable[[], Any], gym.Space, int]] = {
    "sac": (lambda: SacAlgorithm(OBS, BOX, hidden_sizes=(8,), target_update_period=2, target_update_tau=changing(
        0.005, 0.01), target_entropy=changing(-1.0, -2.0), **lrs("actor", "critic", "alpha")), BOX, 3),
    # SAC in SB3's order: the actor's and temperature's terms deferred one update (the kept batch, as TD3's)
    "sac_critic_first": (lambda: SacAlgorithm(OBS, BOX, hidden_sizes=(8,), target_update_period=2,
                                              target_update_tau=changing(0.005, 0.01),
                                              target_entropy=changing(-1.0, -2.0), update_order="critic_first",
                                              **lrs("actor", "critic", "alpha")), BOX, 3),
    "ddpg": (lambda: DdpgAlgorithm(OBS, BOX, hidden_sizes=(8,), target_update_tau=changing(0.005, 0.01),
                                   exploration_noise=changing(0.1, 0.05), **lrs("actor", "critic")), BOX, 3),
    "td3": (lambda: Td3Algorithm(OBS, BOX, hidden_sizes=(8,), target_update_tau=changing(0.005, 0.01),
                                 exploration_noise=changing(0.1, 0.05), **lrs("actor", "critic")), BOX, 3),
    # TD3 in SB3's order: the actor's term deferred one update (a kept batch in buffers, copied in place)
    "td3_critic_first": (lambda: Td3Algorithm(OBS, BOX, hidden_sizes=(8,), target_update_tau=changing(0.005, 0.01),
                                              exploration_noise=changing(0.1, 0.05), update_order="critic_first",
                                              **lrs("actor", "critic")), BOX, 3),
    "dqn": (lambda: DqnAlgorithm(OBS, DISCRETE, hidden_sizes=(8,), n_step=2, target_update_period=3,
                                 target_update_tau=changing(1.0, 0.5), epsilon_greedy=changing(0.1, 0.01),
                                 **lrs("")), DISCRETE, 3),
    "ppo": (lambda: PpoAlgorithm(OBS, DISCRETE, hidden_sizes=(8,), clip_range=changing(0.2, 0.1),
                                 entropy_coef=changing(0.01, 0.001), **lrs("")), DISCRETE, 2),
    "bc": (lambda: BcAlgorithm(OBS, BOX, hidden_sizes=(8,), **lrs("")), BOX, 2),
    "iql": (lambda: IqlAlgorithm(OBS, BOX, hidden_sizes=(8,), target_update_tau=changing(0.005, 0.01),
                                 **lrs("actor", "critic", "value")), BOX, 2),
    "supervised": (lambda: SupervisedModel(OBS, BOX, hidden_sizes=(8,), lr=changing(1e-3, 1e-4)), BOX, 0),
}
#: On-policy algorithms: their loss is built while unrolling, never by the compiled loss module.
ON_POLICY = {"a2c": lambda: A2cAlgorithm(OBS, DISCRETE, hidden_sizes=(8,), entropy_coef=changing(0.01, 0.0))}


class CountingBackend:
    """``aot_eager`` (AOTAutograd, no code generation) that counts the runs of the forward graphs it compiled:
    one run per update proves every update ran compiled code, in one graph (no eager fallback, no graph break)."""

    def __init__(self) -> None:
        self.forward_runs = 0
        self._backend = aot_autograd(fw_compiler=self._forward, bw_compiler=_boxed)

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list) -> Callable:
        return self._backend(graph, example_inputs)

    def _forward(self, graph: torch.fx.GraphModule, example_inputs: list) -> Callable:
        run = _boxed(graph, example_inputs)

        def counted(args: list) -> Any:
            self.forward_runs += 1
            return run(args)

        counted._boxed_call = True
        return counted


def _boxed(graph: torch.fx.GraphModule, example_inputs: list) -> Callable:
    from functorch.compile import make_boxed_func
    return make_boxed_func(graph.forward)


def batches(name: str, device: torch.device, count: int = 4) -> list:
    """``count`` different batches for algorithm ``name`` on ``device``: ``[L, B]`` experiences (every step MID but
    one LAST, so the masks are exercised; PPO's with GAE infos), or supervised pairs."""
    _, space, length = ALGORITHMS[name]
    out = []
    for seed in range(count):
        g = torch.Generator().manual_seed(seed)
        if name == "supervised":
            out.append(SupervisedBatch(torch.rand(B, 3, generator=g), torch.rand(B, 1, generator=g)))
            continue
        shape = (length, B)
        if isinstance(space, gym.spaces.Discrete):
            action = torch.randint(int(space.n), shape, generator=g)
        else:
            action = torch.rand(shape + space.shape, generator=g) * 4 - 2
        step_type = torch.full(shape, int(StepType.MID), dtype=torch.int8)
        step_type[0, -1] = StepType.LAST
        info = ()
        if name == "ppo":
            info = PpoExperienceInfo(*(torch.randn(shape, generator=g) for _ in range(4)))
        out.append(Experience(step_type=step_type, reward=torch.randn(shape, generator=g),
                              discount=torch.ones(shape), observation=torch.rand(shape + OBS.shape, generator=g),
                              action=action, env_id=torch.zeros(shape, dtype=torch.int64), rollout_info=info))
    return [nest.map_nest(lambda x: x.to(device), b) for b in out]


class Warnings(logging.Handler):
    """Collects the warnings logged while it is installed (a fallback to eager updates logs one)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def updates(learners: list[Learner], data: list, steps: range) -> Iterator[int]:
    """Update every learner once per step, as the trainer does (progress, learning rates, update), each drawing the
    same random numbers; yields each step after its updates."""
    for step in steps:
        update_progress(iterations=step)
        for learner in learners:
            learner.update_learning_rates()
            torch.manual_seed(step)
            learner.update(data[step % len(data)])
        yield step


def flat(params: list[torch.nn.Parameter]) -> torch.Tensor:
    return torch.cat([p.detach().flatten().float() for p in params])


def check_no_recompile(name: str, device: torch.device, mode: str, backend: Optional[Any],
                       scope: Optional[str] = None) -> None:
    """Warm-up updates, then ``MEASURED`` more with ``error_on_recompile``: nothing recompiles, no update runs eagerly,
    the schedules really changed, the compiled updates match eager ones (and TD3's delayed actor gets no step on the
    updates it is not due). ``scope``: ``Learner.compile_scope`` (None: by device). ``backend``: a
    ``CountingBackend`` (its forward runs are counted too) or ``None`` (inductor)."""
    torch._dynamo.reset()
    reset_progress()
    make, _, _ = ALGORITHMS[name]
    torch.manual_seed(0)
    algorithm = make()
    eager = Learner(copy.deepcopy(algorithm), OptimizerConfig(), device=device)  # (before the compiled one tracks)
    compiled = Learner(algorithm, OptimizerConfig(), device=device, compile_mode=mode, compile_backend=backend,
                       compile_scope=scope)
    start, data = flat(eager.params), batches(name, device)
    traced = [value for value in traced_values(compiled.algorithm) if not value.schedule.constant]
    for _ in updates([compiled, eager], data, range(WARM_UP)):
        pass
    graphs, lr_before = counters["stats"]["unique_graphs"], compiled.optimizer.param_groups[0]["lr"]
    runs_before = backend.forward_runs if isinstance(backend, CountingBackend) else None
    due = []  # DDPG, TD3, critic-first SAC: whether each update stepped the actor (its parameters moved)
    actor = (flat(list(compiled.algorithm.actor.parameters())) if name.startswith(("ddpg", "td3", "sac_critic"))
             else None)
    handler = Warnings()
    logging.getLogger().addHandler(handler)
    try:
        with torch._dynamo.config.patch(error_on_recompile=True):
            for _ in updates([compiled, eager], data, range(WARM_UP, WARM_UP + MEASURED)):
                if actor is not None:
                    moved_actor = flat(list(compiled.algorithm.actor.parameters()))
                    due.append(bool((moved_actor != actor).any()))
                    actor = moved_actor
    finally:
        logging.getLogger().removeHandler(handler)
    stats = compiled.compile_stats()
    assert stats["compiled"] and not handler.messages, f"{name}: an update fell back to eager: {handler.messages}"
    assert not stats["recompile_limit_hit"], f"{name}: dynamo hit its recompile limit and ran the update eagerly"
    assert counters["stats"]["unique_graphs"] == graphs, f"{name}: the compiled update recompiled after the warm-up"
    if runs_before is not None:
        assert backend.forward_runs - runs_before == MEASURED, \
            f"{name}: {backend.forward_runs - runs_before} compiled forwards in {MEASURED} updates (1 each expected)"
    assert compiled.optimizer.param_groups[0]["lr"] != lr_before, "the learning-rate schedule did not change"
    for value in traced:  # a scheduled value the loss reads is a tensor kept equal to its schedule
        assert float(value.tensor) == torch.tensor(value(), dtype=torch.float32).item(), value
    if name == "td3":  # policy_delay 2: the actor trains on every other update only, compiled as eagerly
        assert due == [(WARM_UP + k + 1) % 2 == 0 for k in range(MEASURED)], due
    elif name == "td3_critic_first":  # ... one update later in the critic-first order
        assert due == [(WARM_UP + k) % 2 == 0 for k in range(MEASURED)], due
    elif name in ("ddpg", "sac_critic_first"):  # (the critic-first SAC's actor sat out only the first update)
        assert all(due)
    moved = (flat(eager.params) - start).norm().item()
    gap = (flat(compiled.params) - flat(eager.params)).norm().item()
    assert 0 < moved and gap <= 1e-2 * moved, f"{name}: compiled and eager parameters differ by {gap:.3g} ({moved:.3g})"
