"""``NullReplay``: the replay part of a run that stores no experience (on-policy training trains on the trajectory it
just unrolled; DESIGN.md §3.3). It stands where the buffer would be, so the loop calls it as any replay buffer (the
collector's sink, the episode cut after a resume, checkpoints) and nothing happens. Its state is empty, and an empty
state is not written into checkpoints: a run without replay saves what it always saved."""
from __future__ import annotations

from typing import Any

from alfish.data.types import Experience


class NullReplay:
    """Stores nothing; every call does nothing."""

    def add(self, exp: Experience) -> None:
        """Drops the step (the collector's sink; an on-policy collector never calls it)."""

    def add_steps(self, exp: Experience) -> None:
        """Drops the steps (as ``add``)."""

    def truncate_episodes(self, env_ids: Any = None) -> None:
        """No stored episode to cut."""

    def __len__(self) -> int:
        return 0

    def summary(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        """Empty: nothing to checkpoint."""
        return {}

    def load_state_dict(self, state: dict, example: Experience) -> None:
        """Nothing to restore."""
