"""``Steps``: offline data in alfish's step convention (DESIGN.md §3.5, §3.14), whatever file it came from.

Every source (an alfish run's replay buffer, an alfish dataset, Minari, D4RL arrays) is turned into ``Steps``: one
array per stored field, episodes one after another, each episode ``FIRST, MID..., LAST``. The reward of a step belongs
to the previous action; ``discount`` is 0 only at the LAST step of a terminated episode (a time-limit truncation or the
cut end of the data is LAST with discount 1, and is bootstrapped). The arrays may be memory-mapped (read-only).

``check_steps`` validates that convention with vectorised numpy (1 byte per step read for the step types), so a
malformed dataset is a one-line error before training, not a silently wrong bootstrap.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Union

import gymnasium as gym
import numpy as np

from alfish.data.types import StepType

Observation = Union[np.ndarray, dict[str, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class Steps:
    """Steps ``[T]`` (numpy arrays, possibly memory-mapped), episodes one after another.

    step_type:   int8 [T], ``StepType``.
    reward:      float32 [T], of the previous step's action (0 at FIRST).
    discount:    float32 [T], 0 only at the LAST step of a terminated episode.
    observation: [T, *obs] or a dict of such arrays (dict observation spaces).
    action:      [T, *act], the action chosen at each step (the action of a LAST step is never trained on).
    dropped:     transitions the source held that could not be stored (D4RL data without ``next_observations``).
    num_episodes: episodes in the data.
    observation_space, action_space: the spaces the data was recorded in, when the source stores them.
    source:      where the data came from (for messages).
    """

    step_type: np.ndarray
    reward: np.ndarray
    discount: np.ndarray
    observation: Observation
    action: np.ndarray
    dropped: int = 0
    num_episodes: int = 0
    observation_space: Optional[gym.Space] = None
    action_space: Optional[gym.Space] = None
    source: str = "dataset"

    def __len__(self) -> int:
        return len(self.step_type)

    def arrays(self) -> dict[str, np.ndarray]:
        """Every stored array by field name (a dict observation as ``observation.<key>``)."""
        out = dict(step_type=self.step_type, reward=self.reward, discount=self.discount, action=self.action)
        if isinstance(self.observation, dict):
            out.update({f"observation.{key}": value for key, value in self.observation.items()})
        else:
            out["observation"] = self.observation
        return out

    def head(self, length: int) -> "Steps":
        """The first ``length`` steps (views of the arrays); if that cuts an episode, its newest kept step becomes LAST
        (a truncation: discount kept, so it is bootstrapped), and the count of episodes is recounted. A cut right after
        an episode's FIRST step keeps one step less (that episode would hold no transition)."""
        if length >= len(self):
            return self
        if self.step_type[length - 1] == StepType.FIRST:
            length -= 1  # (a lone FIRST step: its episode has no transition in what is kept)
        if length < 2:
            raise ValueError(f"{self.source}: offline_buffer_length={length} keeps no transition; keep 2 steps or more")
        step_type = np.array(self.step_type[:length])  # (a copy: the source may be a read-only map)
        if step_type[-1] != StepType.LAST:
            step_type[-1] = StepType.LAST
        observation = ({k: v[:length] for k, v in self.observation.items()} if isinstance(self.observation, dict)
                       else self.observation[:length])
        return dataclasses.replace(self, step_type=step_type, reward=self.reward[:length],
                                   discount=self.discount[:length], observation=observation,
                                   action=self.action[:length],
                                   num_episodes=int(np.count_nonzero(step_type == StepType.LAST)))


def check_fields(arrays: dict, reference: str, source: str) -> int:
    """Every array of ``arrays`` numeric (no object dtype: that would need pickle, which alfish never loads) and as
    long as ``arrays[reference]``; returns that length. One-line ValueErrors naming ``source`` and the field."""
    n = len(arrays[reference])
    for name, value in arrays.items():
        if value.dtype == object:
            raise ValueError(f"{source}: field '{name}' has dtype object; store plain numeric arrays (objects would "
                             "need pickle, which alfish never loads)")
        if len(value) != n:
            raise ValueError(f"{source}: field '{name}' has {len(value)} rows but '{reference}' has {n}; the data is "
                             "truncated or its fields do not belong together")
    return n


def check_steps(steps: Steps) -> None:
    """Raise a one-line ValueError unless ``steps`` follow the convention of the module docstring."""
    src, n = steps.source, len(steps)
    if n < 2:
        raise ValueError(f"{src}: {n} step(s) hold no transition; a dataset needs at least one whole episode")
    check_fields(steps.arrays(), "step_type", src)
    st = steps.step_type
    if st[0] != StepType.FIRST or st[-1] != StepType.LAST:
        raise ValueError(f"{src}: the data must start with a FIRST step and end with a LAST step (whole episodes), "
                         f"got {int(st[0])} ... {int(st[-1])}")
    for lo in range(0, n, CHECK_CHUNK):  # in chunks: a mapped dataset larger than memory stays mapped
        hi = min(n, lo + CHECK_CHUNK + 1)  # (one step of overlap: the boundary between chunks is checked too)
        _check_chunk(np.asarray(st[lo:hi]), np.asarray(steps.discount[lo:hi]), lo, src)


CHECK_CHUNK = 1 << 22  # steps checked at a time


def _check_chunk(st: np.ndarray, discount: np.ndarray, offset: int, src: str) -> None:
    if not ((st == StepType.FIRST) | (st == StepType.MID) | (st == StepType.LAST)).all():
        raise ValueError(f"{src}: step_type holds values other than FIRST=0, MID=1, LAST=2")
    last_then, first_next = st[:-1] == StepType.LAST, st[1:] == StepType.FIRST
    if (last_then != first_next).any():
        bad = offset + int(np.flatnonzero(last_then != first_next)[0])
        raise ValueError(f"{src}: episode boundary broken at step {bad}: every LAST step must be followed by a FIRST "
                         "step and every FIRST step preceded by a LAST one")
    zero_not_last = (discount == 0) & (st != StepType.LAST)
    if zero_not_last.any():
        bad = offset + int(np.flatnonzero(zero_not_last)[0])
        raise ValueError(f"{src}: step {bad} has discount 0 but is not a LAST step; only a termination ends the "
                         "bootstrap")


def check_spaces(steps: Steps, observation_space: gym.Space, action_space: gym.Space, against: str) -> None:
    """Raise a one-line ValueError unless the data's shapes (and stored spaces) fit ``against``'s spaces."""
    src = steps.source
    obs = steps.observation
    if isinstance(observation_space, gym.spaces.Dict):
        if not isinstance(obs, dict) or set(obs) != set(observation_space.spaces):
            have = sorted(obs) if isinstance(obs, dict) else "an array"
            raise ValueError(f"{src}: observations are {have} but {against} observes a dict of "
                             f"{sorted(observation_space.spaces)}")
        pairs = [(f"observation '{k}'", obs[k], observation_space.spaces[k]) for k in sorted(obs)]
    else:
        if isinstance(obs, dict):
            raise ValueError(f"{src}: observations are a dict of {sorted(obs)} but {against} observes an array of "
                             f"shape {observation_space.shape}")
        pairs = [("observation", obs, observation_space)]
    for name, array, space in pairs:
        if tuple(array.shape[1:]) != tuple(space.shape):
            raise ValueError(f"{src}: {name} has shape {tuple(array.shape[1:])} but {against}'s space has "
                             f"{tuple(space.shape)}; the data was recorded in another env")
    act = steps.action
    if isinstance(action_space, gym.spaces.Discrete):
        if act.ndim != 1 or not np.issubdtype(act.dtype, np.integer):
            raise ValueError(f"{src}: actions are {act.dtype} of shape {tuple(act.shape[1:])} but {against} has "
                             f"discrete actions (Discrete({action_space.n})): store integer actions [T]")
    elif tuple(act.shape[1:]) != tuple(action_space.shape):
        raise ValueError(f"{src}: actions have shape {tuple(act.shape[1:])} but {against}'s action space has "
                         f"{tuple(action_space.shape)}; the data was recorded in another env")
    for name, stored, wanted in (("observation", steps.observation_space, observation_space),
                                 ("action", steps.action_space, action_space)):
        if stored is not None and not spaces_match(stored, wanted):
            raise ValueError(f"{src}: the data's {name} space {stored} differs from {against}'s {wanted}")


def spaces_match(a: gym.Space, b: gym.Space) -> bool:
    """Same kind, shape and bounds (dtypes may differ: the data is cast to what the env produces)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, gym.spaces.Dict):
        return set(a.spaces) == set(b.spaces) and all(spaces_match(a[k], b[k]) for k in a.spaces)
    if isinstance(a, gym.spaces.Discrete):
        return int(a.n) == int(b.n) and int(a.start) == int(b.start)
    if isinstance(a, gym.spaces.Box):
        return (a.shape == b.shape and np.allclose(a.low, b.low, equal_nan=True)
                and np.allclose(a.high, b.high, equal_nan=True))
    return a == b


def infer_spaces(steps: Steps) -> tuple[gym.Space, gym.Space]:
    """Spaces for data that stores none (D4RL arrays): unbounded float Boxes (integer arrays keep their dtype) for
    observations; integer actions -> ``Discrete(max + 1)``, float ones -> a Box over ``[-1, 1]`` when every action
    lies there (D4RL's convention), else over the data's range."""
    def obs_space(array: np.ndarray) -> gym.spaces.Box:
        if np.issubdtype(array.dtype, np.integer):
            info = np.iinfo(array.dtype)
            return gym.spaces.Box(info.min, info.max, shape=array.shape[1:], dtype=array.dtype)
        return gym.spaces.Box(-np.inf, np.inf, shape=array.shape[1:], dtype=np.float32)

    obs = steps.observation
    observation_space = (gym.spaces.Dict({k: obs_space(v) for k, v in obs.items()}) if isinstance(obs, dict)
                         else obs_space(obs))
    act = steps.action
    if np.issubdtype(act.dtype, np.integer):
        return observation_space, gym.spaces.Discrete(int(act.max()) + 1)
    low, high = float(np.min(act)), float(np.max(act))
    if low >= -1.0 and high <= 1.0:
        low, high = -1.0, 1.0
    return observation_space, gym.spaces.Box(low, high, shape=act.shape[1:], dtype=np.float32)


# ----------------------------------------------------------------------------------------------- spaces as JSON ----
def space_to_json(space: gym.Space) -> dict[str, Any]:
    """A Box, Discrete, MultiDiscrete, MultiBinary or Dict of them as plain JSON (bounds as lists; infinities as
    strings)."""
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "spaces": {k: space_to_json(v) for k, v in space.spaces.items()}}
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):  # a checkpointed PPO/A2C run's replay layout
        return {"type": "MultiDiscrete", "nvec": space.nvec.tolist()}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "n": list(space.shape)}
    if isinstance(space, gym.spaces.Box):
        return {"type": "Box", "shape": list(space.shape), "dtype": np.dtype(space.dtype).name,
                "low": _json_array(space.low), "high": _json_array(space.high)}
    raise ValueError(f"offline datasets support Box, Discrete and Dict spaces, not {type(space).__name__}")


def space_from_json(data: Any, where: str) -> gym.Space:
    """The inverse of ``space_to_json``; anything else is a one-line ValueError naming ``where``."""
    try:
        kind = data["type"]
        if kind == "Dict":
            return gym.spaces.Dict({str(k): space_from_json(v, where) for k, v in data["spaces"].items()})
        if kind == "Discrete":
            return gym.spaces.Discrete(int(data["n"]), start=int(data.get("start", 0)))
        if kind == "MultiDiscrete":
            return gym.spaces.MultiDiscrete(_positive_ints(data["nvec"]))
        if kind == "MultiBinary":
            return gym.spaces.MultiBinary(_positive_ints(data["n"]))
        if kind == "Box":
            dtype = np.dtype(str(data["dtype"]))
            if dtype.kind not in "biuf":
                raise ValueError(f"dtype {dtype} is not numeric")
            shape = tuple(int(s) for s in data["shape"])
            low = np.asarray(data["low"], dtype=np.float64).reshape(shape).astype(dtype)
            high = np.asarray(data["high"], dtype=np.float64).reshape(shape).astype(dtype)
            return gym.spaces.Box(low, high, shape=shape, dtype=dtype)
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{where}: unreadable space description ({err})") from None
    raise ValueError(f"{where}: unknown space type {kind!r}; expected Box, Discrete, MultiDiscrete, MultiBinary or "
                     "Dict")


def _positive_ints(values: Any) -> list[int]:
    """A non-empty list of positive ints (a MultiDiscrete's nvec, a MultiBinary's shape); else a ValueError."""
    ints = [int(n) for n in values]
    if not ints or min(ints) <= 0:
        raise ValueError(f"{values!r} is not a non-empty list of positive integers")
    return ints


def _json_array(values: np.ndarray) -> list:
    return np.asarray(values, dtype=np.float64).tolist()  # (json writes inf as Infinity, which json reads back)
