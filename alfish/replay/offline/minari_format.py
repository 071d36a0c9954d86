"""Minari datasets (Farama's successor of D4RL) <-> alfish steps (DESIGN.md §3.5, §3.14), through ``minari``.

A local Minari dataset is a directory ``DIR/data/`` holding ``metadata.json`` (the spaces, serialized as JSON, and the
dataset id) and ``main_data.hdf5`` (one group per episode). An episode of ``T`` transitions stores ``T + 1``
observations and ``T`` actions, rewards, terminations and truncations. alfish's steps (``steps.py``) map to it as:
  - step 0: FIRST, ``observations[0]``, reward 0, discount 1, action ``actions[0]``;
  - step t (1 .. T-1): MID, ``observations[t]``, reward ``rewards[t-1]``, discount 1, action ``actions[t]``;
  - step T: LAST, ``observations[T]``, reward ``rewards[T-1]``, discount 0 if ``terminations[T-1]`` (a termination)
    else 1 (a truncation, or the cut end of the data: bootstrapped), a zero action (never trained on).
``write_minari`` is the inverse. Observations are a Box or a Dict of Boxes, actions a Box or a Discrete.

Safety: nothing is unpickled (h5py arrays, JSON metadata). A dataset that stores no spaces is refused rather than
read the way minari would (by building its environment with ``gym.make``, which imports code named by the file).
Writing needs neither ``minari[create]`` nor jax: episodes go straight into a ``MinariStorage``, written in a
temporary sibling directory renamed into place, and never through ``MINARI_DATASETS_PATH``. Images are stored raw
(``jpeg_encoding=False``): Minari's default JPEG encoding is lossy.

The env: data rolled out in a registered gymnasium env records that env's spec (``EnvSpec.to_json()`` under the
metadata key ``env_spec``, as Minari's own ``DataCollector`` writes it), so ``MinariDataset.recover_environment()``
(which d3rlpy's Minari loader calls) rebuilds it. Data whose env has no such spec (alfish's Atari preprocessing, an
unregistered env, a replay buffer exported without its config) records why under ``alfish_no_env_spec`` instead;
alfish reads both alike (it needs only the stored spaces).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec as GymEnvSpec

from alfish.data.types import StepType
from alfish.envs.atari import is_atari
from alfish.replay.offline.steps import Steps, check_spaces, check_steps

MISSING_MINARI = "reading Minari datasets needs the minari package: pip install 'alfish[offline]'"
SUPPORTED = "alfish reads Minari datasets with Box or Dict-of-Box observations and Box or Discrete actions"
DATA_DIR = "data"
METADATA = "metadata.json"
MAIN_FILE = "main_data.hdf5"
NO_ENV_SPEC = "alfish_no_env_spec"  # the metadata key saying why a dataset records no env_spec
# What minari and h5py raise for a file that is not what it should be (OSError: h5py's unreadable or truncated file;
# KeyError: a missing group; AssertionError: minari's own checks; PIL's image errors are OSErrors).
_READ_ERRORS = (OSError, ValueError, KeyError, TypeError, IndexError, AssertionError, NotImplementedError,
                RuntimeError, json.JSONDecodeError)


def _import_minari():
    try:
        import minari  # noqa: F401
        from minari.dataset.minari_storage import MinariStorage
    except ImportError:
        raise ImportError(MISSING_MINARI) from None
    return minari, MinariStorage


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def _data_dir(path: Path) -> Path:
    """``DIR/data`` for a dataset directory ``DIR``; ``path`` itself when given the ``data`` directory."""
    if not (path / DATA_DIR / METADATA).is_file() and (path / METADATA).is_file():
        return path
    return path / DATA_DIR


# ---------------------------------------------------------------------------------------------------- reading ----
def read_minari(path: str | os.PathLike) -> Steps:
    """The steps of the local Minari dataset directory ``path`` (the one holding ``data/main_data.hdf5`` and
    ``data/metadata.json``), in memory; see the module docstring for the mapping.

    Float observations and actions become float32, Discrete actions int64; integer observations (images) keep their
    dtype. Raises ImportError without ``minari``, and a one-line ValueError naming ``path`` for anything that is not a
    readable Minari dataset of supported spaces.
    """
    minari, _ = _import_minari()
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{path}: not a directory; give a Minari dataset directory (holding data/{METADATA} and "
                         f"data/{MAIN_FILE})")
    data = _data_dir(path)
    meta = _read_metadata(path, data)
    try:
        dataset = minari.MinariDataset(data)
    except ImportError as err:  # a storage format whose package is missing (pyarrow for 'arrow'/'parquet')
        raise ImportError(f"{path}: reading this Minari dataset (data_format {meta.get('data_format')!r}) needs a "
                          f"package that is missing ({_first_line(err)})") from None
    except _READ_ERRORS as err:
        raise ValueError(f"{path}: not a readable Minari dataset ({_first_line(err)})") from None
    observation_space, action_space = dataset.observation_space, dataset.action_space
    _check_supported(observation_space, action_space, str(path))
    try:
        num_episodes = int(dataset.total_episodes)
        capacity = int(dataset.total_steps) + num_episodes
    except _READ_ERRORS as err:
        raise ValueError(f"{path}: unreadable Minari metadata ({_first_line(err)})") from None
    if num_episodes <= 0 or capacity <= num_episodes:
        raise ValueError(f"{path}: the Minari dataset holds no transition ({num_episodes} episode(s), "
                         f"{capacity - num_episodes} step(s))")

    is_dict = isinstance(observation_space, gym.spaces.Dict)
    obs_spaces = dict(observation_space.spaces) if is_dict else {"": observation_space}
    obs_out = {k: np.zeros((capacity,) + tuple(s.shape), _stored_dtype(s.dtype, False)) for k, s in obs_spaces.items()}
    action = np.zeros((capacity,) + tuple(action_space.shape), _stored_dtype(action_space.dtype, True))
    step_type = np.full(capacity, StepType.MID, np.int8)
    reward = np.zeros(capacity, np.float32)
    discount = np.ones(capacity, np.float32)

    filled = episodes = 0
    problem = None  # a one-line description of what is wrong with the file, raised once the file is closed
    try:
        episode_iter = dataset.storage.get_episodes(dataset.episode_indices)
        try:
            for episode in episode_iter:
                rewards = np.asarray(episode["rewards"]).reshape(-1)
                t = len(rewards)
                if t == 0:
                    continue  # no transition to store
                if filled + t + 1 > capacity:
                    problem = (f"the episodes hold more steps than {METADATA}'s total_steps "
                               f"({capacity - num_episodes}); the dataset is inconsistent")
                    break
                obs = episode["observations"] if is_dict else {"": episode["observations"]}
                acts = np.asarray(episode["actions"])
                terminations = np.asarray(episode["terminations"]).reshape(-1).astype(bool)
                problem = _episode_problem(episode.get("id", episodes), t, obs, obs_spaces, acts, terminations,
                                           np.asarray(episode["truncations"]).reshape(-1))
                if problem:
                    break
                sl = slice(filled, filled + t + 1)
                for key, value in obs.items():
                    obs_out[key][sl] = value
                action[filled:filled + t] = acts.reshape((t,) + action.shape[1:])
                step_type[filled], step_type[filled + t] = StepType.FIRST, StepType.LAST
                reward[filled + 1:filled + t + 1] = rewards
                discount[filled + t] = 0.0 if terminations[-1] else 1.0
                filled += t + 1
                episodes += 1
        finally:
            close = getattr(episode_iter, "close", None)  # (hdf5: a generator holding the file open)
            if close is not None:
                close()
    except _READ_ERRORS as err:
        raise ValueError(f"{path}: cannot read the Minari episodes ({_first_line(err)}); the file is truncated or "
                         "corrupt") from None
    if problem:
        raise ValueError(f"{path}: {problem}")
    if episodes == 0:
        raise ValueError(f"{path}: every Minari episode is empty; there is no transition to store")
    observation = {k: v[:filled] for k, v in obs_out.items()}
    steps = Steps(step_type=step_type[:filled], reward=reward[:filled], discount=discount[:filled],
                  observation=observation if is_dict else observation[""], action=action[:filled], dropped=0,
                  num_episodes=episodes, observation_space=observation_space, action_space=action_space,
                  source=str(path))
    check_steps(steps)
    return steps


def _episode_problem(episode_id: Any, t: int, obs: Any, obs_spaces: dict, acts: np.ndarray,
                     terminations: np.ndarray, truncations: np.ndarray) -> str | None:
    """What is wrong with one episode of ``t`` rewards read from the file, or None."""
    where = f"episode {episode_id}"
    if not isinstance(obs, dict) or set(obs) != set(obs_spaces):
        have = sorted(obs) if isinstance(obs, dict) else type(obs).__name__
        return f"{where}: observations hold {have}, the observation space {sorted(obs_spaces)}"
    lengths = {"actions": len(acts), "terminations": len(terminations), "truncations": len(truncations)}
    lengths.update({f"observations{'.' + k if k else ''} - 1": len(v) - 1 for k, v in obs.items()})
    bad = {name: n for name, n in lengths.items() if n != t}
    if bad:
        return f"{where}: {t} rewards but {bad}; the file is truncated or inconsistent"
    if terminations[:-1].any():
        return (f"{where}: terminates at transition {int(np.flatnonzero(terminations)[0])} before its end "
                f"({t} transitions); a Minari episode ends at its termination")
    return None


def _read_metadata(path: Path, data: Path) -> dict[str, Any]:
    """``data/metadata.json``, checked before minari sees it: a dataset without stored spaces is refused (minari
    would build its environment to learn them, importing whatever code the file names)."""
    file = data / METADATA
    if not file.is_file():
        raise ValueError(f"{path}: not a Minari dataset: no {DATA_DIR}/{METADATA} (a Minari dataset directory holds "
                         f"{DATA_DIR}/{METADATA} and {DATA_DIR}/{MAIN_FILE})")
    try:
        meta = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: unreadable Minari metadata {file.name} ({_first_line(err)})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: {file.name} is not a JSON object; not a Minari dataset")
    missing = [k for k in ("observation_space", "action_space") if not isinstance(meta.get(k), str)]
    if missing:
        raise ValueError(f"{path}: the Minari dataset stores no {' nor '.join(missing)}; alfish does not rebuild "
                         "the environment to learn it (which would run code the file names); re-create the "
                         "dataset storing both spaces")
    return meta


def _check_supported(observation_space: gym.Space, action_space: gym.Space, where: str) -> None:
    obs_ok = isinstance(observation_space, gym.spaces.Box) or (
        isinstance(observation_space, gym.spaces.Dict) and len(observation_space.spaces) > 0
        and all(isinstance(s, gym.spaces.Box) for s in observation_space.spaces.values()))
    act_ok = isinstance(action_space, (gym.spaces.Box, gym.spaces.Discrete))
    if not (obs_ok and act_ok):
        raise ValueError(f"{where}: observation space {observation_space} and action space {action_space} are not "
                         f"supported; {SUPPORTED}")


def _stored_dtype(dtype: Any, is_action: bool) -> np.dtype:
    dtype = np.dtype(dtype)
    if np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.bool_):
        return np.dtype(np.float32)
    return np.dtype(np.int64) if is_action else dtype


# ---------------------------------------------------------------------------------------------------- writing ----
def registered_env_spec(env_name: str, env_kwargs: Optional[dict] = None) -> tuple[Optional[GymEnvSpec], str]:
    """The gymnasium spec that ``gym.make(env_name, **env_kwargs)`` makes the env from (as alfish's ``EnvFactory``
    makes it), and ``""``; or None and why there is none (a phrase, for the ``alfish_no_env_spec`` metadata).

    ``env_name`` may be ``module:EnvId`` (its module already imported by whoever made the env). The spec is checked to
    serialize as JSON, as ``MinariDataset.recover_environment`` needs it.
    """
    if is_atari(env_name):
        return None, (f"{env_name} was made with alfish's Atari preprocessing (alfish.envs.atari.make_atari), which no "
                      "registered gymnasium spec reproduces")
    spec = gym.registry.get(env_name.rpartition(":")[2])
    if spec is None:
        return None, f"env {env_name!r} is not a registered gymnasium id"
    entry_point = spec.entry_point if isinstance(spec.entry_point, str) else _import_name(spec.entry_point)
    spec = dataclasses.replace(spec, entry_point=entry_point or spec.entry_point,
                               kwargs={**spec.kwargs, **(env_kwargs or {})})
    try:
        spec.to_json()
    except (TypeError, ValueError) as err:  # (a callable entry point; kwargs JSON cannot hold)
        return None, f"the gymnasium spec of {env_name!r} cannot be stored as JSON ({_first_line(err)})"
    return spec, ""


def _import_name(entry_point: Any) -> Optional[str]:
    """``module:name`` for a class or function registered as an entry point (alfish's toys register classes), when
    importing that module and taking that name gives it back (gymnasium's ``load_env_creator`` does exactly that);
    else None (a lambda, a nested class, ``__main__``)."""
    module, name = getattr(entry_point, "__module__", None), getattr(entry_point, "__qualname__", "")
    if not module or module == "__main__" or not name.isidentifier():
        return None
    return f"{module}:{name}" if getattr(sys.modules.get(module), name, None) is entry_point else None


def write_minari(steps: Steps, out_dir: str | os.PathLike, dataset_id: str = "alfish/dataset-v0",
                 env_spec: Optional[GymEnvSpec] = None, no_env_spec: str = "the env it came from was not given",
                 ) -> Path:
    """Write ``steps`` (checked first) as a Minari dataset directory ``out_dir`` (``out_dir/data/main_data.hdf5`` and
    ``out_dir/data/metadata.json``, readable by ``minari.MinariDataset(out_dir / 'data')``); returns ``out_dir``.

    Needs ``steps.observation_space`` and ``steps.action_space``. ``dataset_id`` is Minari's
    ``(namespace/)name-v(version)``. ``env_spec`` (``registered_env_spec``), when given, is stored as Minari stores it,
    so ``recover_environment()`` works; else ``no_env_spec`` (why there is none) is stored under
    ``alfish_no_env_spec``. The dataset is written in a temporary sibling directory renamed into place.
    """
    _, MinariStorage = _import_minari()
    import minari
    from minari.data_collector import EpisodeBuffer
    from minari.dataset.minari_dataset import parse_dataset_id

    out_dir = Path(out_dir).absolute()  # (minari joins a relative data path twice)
    src = steps.source
    if steps.observation_space is None or steps.action_space is None:
        raise ValueError(f"{src}: writing a Minari dataset needs the data's spaces; pass observation_space and "
                         "action_space (e.g. dataclasses.replace(steps, observation_space=env.observation_space, "
                         "action_space=env.action_space))")
    _check_supported(steps.observation_space, steps.action_space, src)
    check_steps(steps)
    check_spaces(steps, steps.observation_space, steps.action_space, "its own spaces")
    try:
        parse_dataset_id(dataset_id)
    except (ValueError, TypeError):
        raise ValueError(f"dataset_id {dataset_id!r} is not a Minari id: use (namespace/)name-v(version), e.g. "
                         "'alfish/dataset-v0'") from None
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} already exists; choose a new directory for the dataset")

    st = np.asarray(steps.step_type)
    firsts = np.flatnonzero(st == StepType.FIRST)
    lasts = np.flatnonzero(st == StepType.LAST)
    obs, obs_space = steps.observation, steps.observation_space
    discrete = isinstance(steps.action_space, gym.spaces.Discrete)
    act_dtype = np.int64 if discrete else np.dtype(steps.action_space.dtype)

    def episode_buffer(s: int, e: int) -> Any:
        t = e - s
        terminated = bool(steps.discount[e] == 0)
        terminations = np.zeros(t, bool)
        truncations = np.zeros(t, bool)
        terminations[-1], truncations[-1] = terminated, not terminated
        observations = ({k: np.asarray(v[s:e + 1], dtype=obs_space[k].dtype) for k, v in obs.items()}
                        if isinstance(obs, dict) else np.asarray(obs[s:e + 1], dtype=obs_space.dtype))
        return EpisodeBuffer(observations=observations,
                             actions=np.ascontiguousarray(steps.action[s:e], dtype=act_dtype),
                             rewards=np.asarray(steps.reward[s + 1:e + 1], dtype=np.float32),
                             terminations=terminations, truncations=truncations,
                             infos={})  # (an empty infos group: minari readers expect a dict, not None)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        # (with both spaces given, minari stores env_spec.to_json() without making the env)
        storage = MinariStorage.new(tmp / DATA_DIR, observation_space=steps.observation_space,
                                    action_space=steps.action_space, env_spec=env_spec, data_format="hdf5",
                                    jpeg_encoding=False)
        no_spec = {} if env_spec is not None else {NO_ENV_SPEC: f"{no_env_spec}; recover_environment() cannot "
                                                                "rebuild the env"}
        storage.update_metadata({"dataset_id": dataset_id, "minari_version": minari.__version__,
                                 "algorithm_name": "alfish",
                                 "description": f"written by alfish from {src}", **no_spec})
        # A generator: one episode in memory at a time, and minari opens the file once for all of them.
        storage.update_episodes(episode_buffer(s, e) for s, e in zip(firsts.tolist(), lasts.tolist()))
        os.rename(tmp, out_dir)  # out_dir: the --out the user typed (trusted as typed), not a path in a root_dir
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
