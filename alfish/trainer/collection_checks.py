"""The collection settings (``Trainer.num_unroll_processes``, ``unroll_min_fraction``, ``max_policy_lag``, and replay
retirement's ``replay_max_use`` / ``replay_max_staleness``) checked against the rest of the run, each a one-line
ValueError naming the parameters; before the children start, and again once the algorithm is built (``algorithm``:
its class, or the built one)."""
from __future__ import annotations

from typing import Optional

from alfish.algorithms.base import Algorithm
from alfish.config.trainer_config import TrainerConfig
from alfish.trainer.options import RunOptions


def check_collection(config: TrainerConfig, options: RunOptions,
                     algorithm: Optional[Algorithm | type[Algorithm]] = None) -> None:
    shaped = options.num_unroll_processes != 1 or options.unroll_min_fraction != 1.0 or (
        options.max_policy_lag is not None)
    if shaped and not config.async_unroll:
        raise ValueError("Trainer.num_unroll_processes, unroll_min_fraction and max_policy_lag shape an asynchronous "
                         "unroll: set TrainerConfig.async_unroll=True, or remove them")
    if options.unroll_min_fraction != 1.0 and (options.num_unroll_processes == 1 or config.unroll_length == 0):
        raise ValueError(f"Trainer.unroll_min_fraction={options.unroll_min_fraction} lets an iteration start before "
                         "every unroll process delivered its unroll_length steps: it needs "
                         "Trainer.num_unroll_processes > 1 and TrainerConfig.unroll_length > 0 (with unroll_length = 0 "
                         "an iteration takes what has arrived anyway)")
    retires = options.replay_max_use is not None or options.replay_max_staleness is not None
    if retires and config.whole_replay_buffer_training:
        raise ValueError("Trainer.replay_max_use / replay_max_staleness retire samples of sampled replay; "
                         "TrainerConfig.whole_replay_buffer_training=True trains on everything stored: set it to "
                         "False, or remove them")
    if algorithm is None:  # (a constructor function: checked again once built)
        return
    if retires and algorithm.on_policy:
        name = algorithm.__name__ if isinstance(algorithm, type) else type(algorithm).__name__
        raise ValueError(f"Trainer.replay_max_use / replay_max_staleness retire replay samples; {name} trains "
                         "on-policy without replay: remove them")
    if algorithm.on_policy:
        if options.unroll_min_fraction != 1.0:
            name = algorithm.__name__ if isinstance(algorithm, type) else type(algorithm).__name__
            raise ValueError(f"Trainer.unroll_min_fraction={options.unroll_min_fraction}: {name} trains on whole "
                             "unrolls of every env, so every unroll process must deliver its share; set it to 1")
        return
    uneven = config.unroll_length == 0 or options.unroll_min_fraction != 1.0
    if config.async_unroll and config.whole_replay_buffer_training and options.num_unroll_processes > 1 and uneven:
        raise ValueError("TrainerConfig.whole_replay_buffer_training=True trains on the same number of steps of every "
                         "env, so with Trainer.num_unroll_processes > 1 every process must deliver unroll_length steps "
                         "each iteration: set TrainerConfig.unroll_length > 0 and Trainer.unroll_min_fraction = 1")
