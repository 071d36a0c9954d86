from alfish.envs import toy  # noqa: F401  (registers the alfish/* toy envs)
from alfish.envs.batched_env import BatchedEnv, create_environment

__all__ = ["BatchedEnv", "create_environment"]
