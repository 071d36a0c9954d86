"""How one env of a batch is made, in this process or in an env worker process.

``EnvFactory`` is picklable: under ``vectorization='async'`` it travels to each worker, a forkserver child, which gets
the trainer's ``sys.path`` from multiprocessing but none of its imports. So the factory carries the modules the conf
imported (a conf line ``import my_envs`` whose module calls ``gymnasium.register``) and imports them before making the
env: an env id the trainer knows from its conf is known in the worker too. Only what the trainer process already
imported is imported again; the trust decision (which conf imports are allowed) was taken when the conf was parsed.
"""
from __future__ import annotations

import dataclasses
import importlib
import multiprocessing
import os
from typing import Optional

import gin.config
import gymnasium as gym

from alfish.envs.atari import is_atari, make_atari
from alfish.envs.contract import ContractCheck, EnvContractError
from alfish.envs.episode_log import EpisodeLog
from alfish.envs.mixed_actions import MIXED_ACTION_SPACES, MixedActionPacking
from alfish.envs.mujoco_camera import follow_the_robot
from alfish.envs.sdl_runtime import ensure_runtime_dir


def conf_imports() -> tuple[str, ...]:
    """The modules named by ``import`` lines of the gin config parsed in this process, in the order of the lines."""
    statements = getattr(gin.config, "_IMPORTS", ())  # gin keeps them to write them into the operative config
    ordered = sorted(statements, key=lambda s: (s.location.filename or "", s.location.line_num or 0))
    return tuple(dict.fromkeys(s.module for s in ordered if not s.module.startswith("__gin__")))


@dataclasses.dataclass(frozen=True)
class EnvFactory:
    """Makes one env: ``gymnasium.make(env_name, render_mode=..., **env_kwargs)`` (``make_atari`` for ``ALE/...``
    names) wrapped in ``ContractCheck`` and ``EpisodeLog`` (how each episode began and its actions, for exact
    resume); a mixed action space (a Tuple or Dict of a Discrete and a Box) also in ``MixedActionPacking`` between
    them, so that the env takes packed float actions (``alfish.envs.mixed_actions``).

    imports: modules to import first (``conf_imports()`` of the building process); they may register ``env_name``.
    parent_pid: the building process, to tell a worker's "env id not registered" from a plain unknown id.
    entry_module: the module of the env's entry point as registered in the building process (named in that error).
    """

    env_name: str
    env_kwargs: dict
    render_mode: Optional[str]
    imports: tuple[str, ...] = ()
    parent_pid: int = 0
    entry_module: str = "my_envs"

    @staticmethod
    def here(env_name: str, env_kwargs: Optional[dict], render_mode: Optional[str]) -> "EnvFactory":
        """A factory that makes the env as this process would (with its conf imports)."""
        return EnvFactory(env_name, dict(env_kwargs or {}), render_mode, conf_imports(), os.getpid(),
                          _entry_module(env_name))

    def __call__(self) -> gym.Env:
        self._import_like_the_parent()
        # (the log outside the contract check: what it records has been checked)
        env = ContractCheck(self._make(), self.env_name)
        if isinstance(env.action_space, MIXED_ACTION_SPACES):  # the log and all above it see packed actions
            env = MixedActionPacking(env)
        return EpisodeLog(env)

    def _import_like_the_parent(self) -> None:
        import alfish.envs.toy  # noqa: F401  (registers the alfish/* ids)

        for name in self.imports:
            try:
                importlib.import_module(name)
            except ModuleNotFoundError:
                if "." not in name:
                    raise
                importlib.import_module(name.rpartition(".")[0])  # `from package import name` of a non-module

    def _make(self) -> gym.Env:
        if self.render_mode is not None:  # (pygame's SDL prints an error line without a valid XDG_RUNTIME_DIR)
            ensure_runtime_dir()
        try:
            if is_atari(self.env_name):  # ALE games, preprocessed as alfish trains on them (alfish/envs/atari.py)
                return make_atari(self.env_name, render_mode=self.render_mode, **self.env_kwargs)
            # gymnasium's PassiveEnvChecker is left out: ContractCheck checks every step, and raises instead of warning
            env = gym.make(self.env_name, render_mode=self.render_mode, disable_env_checker=True, **self.env_kwargs)
            if self.render_mode is not None:
                follow_the_robot(env, self.env_kwargs)  # (HalfCheetah's and Ant's videos would lose the robot)
            return env
        except gym.error.Error as err:
            bare_id = self.env_name.rpartition(":")[2]
            if os.getpid() != self.parent_pid and ":" not in self.env_name and bare_id not in gym.registry:
                module = self.entry_module
                raise EnvContractError(f"env '{self.env_name}' is registered in the trainer process but not in its "
                                       f"env workers (vectorization='async'): register it in a module the conf imports "
                                       f"(a line `import {module}`) or name it '{module}:{bare_id}'") from None
            close = gym.envs.registration.find_highest_version(None, bare_id.split("-v")[0]) \
                if "-v" in bare_id else None
            hint = f" (latest registered version: v{close})" if close is not None else ""
            if multiprocessing.parent_process() is not None and ":" not in self.env_name and close is None:
                # a child of the run (async evaluation or unroll: spawn) knows only the envs of the conf's imports;
                # an env registered in a notebook or a script's own code is unknown there
                hint = ("; if your script or notebook registers it, register it in a module the conf imports instead "
                        "(a line `import my_envs`: this child process of the run knows only those)")
            raise ValueError(f"cannot make gymnasium env '{self.env_name}': {err}{hint}") from None


def _entry_module(env_name: str) -> str:
    """The module that defines the entry point of ``env_name`` in this process's registry ('my_envs' if unknown)."""
    spec = gym.registry.get(env_name.rpartition(":")[2])
    entry = getattr(spec, "entry_point", None)
    module = entry.partition(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", None)
    return module if module and module != "__main__" else "my_envs"
