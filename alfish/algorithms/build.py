"""Building the policy of a run from its config and an EnvSpec: the data transformers, then the algorithm for the
observations they output. The trainer, the async unroll child and play all build it here, the same way."""
from __future__ import annotations

from typing import Any

from alfish.algorithms.base import Algorithm
from alfish.envs.spec import EnvSpec
from alfish.transforms.base import SequentialDataTransformer, build_transformers


def build_policy(config: Any, spec: EnvSpec) -> tuple[SequentialDataTransformer, Algorithm]:
    """``config.data_transformer_ctor`` for the env's observations, then ``config.algorithm_ctor`` for the observation
    space the last transformer outputs (e.g. stacked frames) and the env's action space. ``config``: a
    ``TrainerConfig``. The algorithm's recurrence is configured from ``use_rollout_state``,
    ``temporally_independent_train_step`` and ``mini_batch_length`` (``Algorithm.configure_recurrence``)."""
    transformer = build_transformers(config.data_transformer_ctor, spec.observation_space)
    algorithm = config.algorithm_ctor(observation_space=transformer.output_observation_space(spec.observation_space),
                                      action_space=spec.action_space)
    algorithm.configure_recurrence(getattr(config, "use_rollout_state", False),
                                   getattr(config, "temporally_independent_train_step", None),
                                   getattr(config, "mini_batch_length", None))
    return transformer, algorithm
