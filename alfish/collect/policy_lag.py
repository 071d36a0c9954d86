"""How stale the policy that acted the received steps was (parameter versions and iterations since it was
published), and how fast steps arrive: the ``async/`` scalars of an async unroll."""
from __future__ import annotations

from typing import Protocol, Sequence


class Stamped(Protocol):
    """A received step: the parameter version that acted it and the env step's wall-clock."""

    version: int
    env_step_s: float


class PolicyLag:
    """How stale the policy that collected the received steps was, and how fast steps arrive.

    Version lag: parameter versions published since the one that chose the actions. Iteration lag: iterations since
    that version was published.
    """

    def __init__(self) -> None:
        self._published_at: dict[int, int] = {}
        self.version = 0
        self._last: dict[str, float] = {}

    def published(self, version: int, iteration: int) -> None:
        self.version = version
        self._published_at[version] = iteration
        for old in [v for v in self._published_at if v < version - 10_000]:  # bounded memory on long runs
            del self._published_at[old]

    def published_iteration(self, version: int, default: int) -> int:
        """The iteration at which ``version`` was published (``default`` for one too old to be remembered)."""
        return self._published_at.get(version, default)

    def received(self, steps: Sequence[Stamped], iteration: int) -> None:
        if not steps:
            self._last = dict(steps_received=0.0)
            return
        versions = [s.version for s in steps]
        self._last = dict(
            steps_received=float(len(steps)),
            policy_lag_versions=sum(self.version - v for v in versions) / len(versions),
            policy_lag_versions_max=float(max(self.version - v for v in versions)),
            policy_lag_iterations=sum(iteration - self._published_at.get(v, iteration) for v in versions)
            / len(versions),
            env_step_ms=1000.0 * sum(s.env_step_s for s in steps) / len(steps),
        )

    def summary(self, queue_length: int) -> dict[str, float]:
        """Scalars of the last iteration's collection, for TensorBoard's ``async/``."""
        return dict(self._last, queue_length=float(queue_length), parameter_version=float(self.version))
