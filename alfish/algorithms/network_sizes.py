"""SB3's ``net_arch=dict(pi=[...], qf=[...])`` for the actor-critic algorithms with an actor and critics (SAC,
DDPG/TD3): each part's hidden sizes, defaulting to the algorithm's shared ``hidden_sizes``."""
from __future__ import annotations

from typing import Any, Optional, Sequence


def part_hidden_sizes(owner: str, hidden_sizes: Sequence[int], parts: dict[str, tuple[Optional[Sequence[int]], Any]]
                      ) -> dict[str, Sequence[int]]:
    """The hidden sizes of each part: ``parts`` maps a part's name (``'actor'``, ``'critic'``) to ``(its own sizes or
    None, its network constructor or None)``; a part without its own sizes gets ``hidden_sizes``.

    Raises ValueError when a part has both its own sizes and a constructor (the constructor sizes itself: the sizes
    would do nothing)."""
    sizes = {}
    for part, (own, ctor) in parts.items():
        if own is not None and ctor is not None:
            raise ValueError(f"{owner}.{part}_hidden_sizes={tuple(own)} sizes the default {part} network, but a "
                             f"{part} network constructor is given, which sizes itself: set the sizes on that network "
                             f"(e.g. its hidden_sizes), or remove {owner}.{part}_hidden_sizes")
        sizes[part] = hidden_sizes if own is None else own
    return sizes
