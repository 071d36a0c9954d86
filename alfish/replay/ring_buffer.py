"""Per-environment ring storage of raw experience (storage only: samplers in ``samplers.py`` / ``prioritized/``).

Each environment ``e`` owns a ring of ``capacity`` slots. Slot ``i`` of env ``e`` holds the step written at absolute
index ``i`` (``write_count[e]`` counts all writes, so the ring holds indices ``[write_count - capacity, write_count)``).
A stored step is an ``Experience`` (TimeStep fields + the action chosen + rollout info); the next observation of a step
is simply the next slot, so nothing is stored twice.

A sequence read with ``gather`` lies inside one env's contiguous history (samplers never draw a start whose sequence
would wrap from the newest slot to the oldest). Episode boundaries inside a sequence are visible from the step types
(LAST followed by FIRST). With ``track_episode_ends`` the buffer also knows, for every stored step, where its episode
ends (hindsight relabelling needs it); that costs 8 bytes per slot and a back-fill when an episode's LAST step is
written.

Where the leaves live: ``device`` (host memory by default; ``MappedRingBuffer`` keeps them in files, see
``storage.py`` for the choices). The bookkeeping (write counts, oldest indices, episode ends) always stays on the CPU,
as tensors plus a Python-int bound on the most steps any env holds (``holds_sequence``), so the host can decide
whether a sample is possible without reading a tensor.

Every slot also records the training iteration whose parameters acted its step (``policy_iterations``, int32, host;
4 bytes per slot): the collectors set ``next_policy_iteration`` before they add (the current iteration for a
synchronous unroll, the iteration that published the acting parameters for an asynchronous one). Replay retirement
reads it (``retirement.py``), and ``ReplayBuffer.summary`` reports how old the sampled data's policy was.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch.utils import _pytree as pytree

from alfish.data import nest
from alfish.data.types import Experience, StepType
from alfish.replay.transfer import canonical_device, host_to_device


class RingBuffer:
    """Storage for ``num_envs`` rings of ``capacity`` steps each.

    Leaves are allocated on the first ``add`` with shape ``[num_envs, capacity, *leaf_shape]`` and the leaf's dtype,
    on ``device``; the counters stay on the CPU whatever ``device`` is.
    """

    def __init__(self, num_envs: int, capacity: int, device: str | torch.device = "cpu",
                 track_episode_ends: bool = False):
        self.num_envs = num_envs
        self.capacity = capacity
        self.device = canonical_device(device)
        self._storage: list[torch.Tensor] | None = None  # one [num_envs, capacity, ...] tensor per leaf
        # Views [num_envs * capacity, ...] of the leaves of the list ``_rows_of`` (== _storage while valid): gather
        # reads through them, and making a view costs more than the index_select of a small batch.
        self._rows: list[torch.Tensor] = []
        self._rows_of: list[torch.Tensor] | None = None
        self._spec: Any = None  # the Experience structure of the leaves
        self._lockstep: int | None = 0  # common write count while all envs are written together
        self._write_count = torch.zeros(num_envs, dtype=torch.int64)
        self._all_envs = torch.arange(num_envs)
        self._floor = torch.zeros(num_envs, dtype=torch.int64)  # steps before this index were cleared
        # Python ints, so samplers check "enough data?" without touching a tensor (see holds_sequence).
        self._max_stored = 0  # a lower bound of the most readable steps of any env (exact after a lockstep add)
        self._min_floor = 0  # min of _floor
        # Absolute index of each slot's episode's LAST step; -1 while the episode is still running.
        self._episode_end: torch.Tensor | None = (
            torch.full((num_envs, capacity), -1, dtype=torch.int64) if track_episode_ends else None)
        self._episode_begin = torch.zeros(num_envs, dtype=torch.int64)  # absolute index of each env's current FIRST
        # The iteration whose parameters acted each slot's step (see policy_iterations), and the one the next adds get.
        self._policy_iterations: torch.Tensor | None = None
        self.next_policy_iteration = 0

    @property
    def policy_iterations(self) -> torch.Tensor:
        """int32 ``[num_envs, capacity]``: the training iteration whose parameters acted each slot's step (0 where
        nobody said). Allocated on first use: an offline dataset's ring, filled once and never added to, has none."""
        if self._policy_iterations is None:
            self._policy_iterations = torch.zeros(self.num_envs, self.capacity, dtype=torch.int32)
        return self._policy_iterations

    # ---------------------------------------------------------------------------------------------------- writing --
    def add(self, exp: Experience) -> None:
        """Append one step per env: ``exp`` leaves are ``[B, ...]``; ``exp.env_id`` says which ring each row goes to."""
        # Storage must be ordinary tensors even when rollouts run under torch.inference_mode.
        with torch.inference_mode(False):
            self._add(exp)

    def _add(self, exp: Experience) -> None:
        env_ids = exp.env_id
        # env_id is not stored: it is the ring's own index (8 bytes per step saved); gather puts it back.
        stored = nest.replace_fields(exp, env_id=())
        leaves = nest.flatten(stored)  # (pytree's leaf order, without pytree's per-call cost)
        if self._storage is None:
            self._spec = pytree.tree_structure(stored)
            self._storage = [self._allocate((self.num_envs, self.capacity) + tuple(x.shape[1:]), x.dtype)
                             for x in leaves]
        if self._lockstep is not None and torch.equal(env_ids, self._all_envs):
            # Every env written at once, in order (the synchronous case): one slice write per leaf, no index tensors.
            slot = self._lockstep % self.capacity
            on_host = self.device.type == "cpu"
            for store, x in zip(self._storage, leaves):
                store.select(1, slot).copy_(x if on_host else host_to_device(x, self.device))
            self.policy_iterations.select(1, slot).fill_(self.next_policy_iteration)
            self._lockstep += 1
            self._max_stored = min(self._lockstep - self._min_floor, self.capacity)  # all write counts are equal
            if self._episode_end is not None:
                self._track_episodes(env_ids, exp.step_type)
            self._write_count += 1  # (every env, in place: cheaper than an indexed add)
            return
        self._lockstep = None
        host_flat = env_ids * self.capacity + self._write_count[env_ids] % self.capacity
        flat = host_to_device(host_flat, self.device)
        for store, x in zip(self._storage, leaves):
            store.view((-1,) + store.shape[2:])[flat] = host_to_device(x, self.device)
        self.policy_iterations.view(-1)[host_flat] = self.next_policy_iteration
        if self._episode_end is not None:
            self._track_episodes(env_ids, exp.step_type)
        self._write_count[env_ids] += 1
        # (Other adds leave _max_stored as it is: an add never lowers a count, so it stays a lower bound.)

    def add_steps(self, exp: Experience) -> None:
        """Append ``T`` steps per env at once: leaves ``[B, T, ...]`` (batch-major, as stored: ``nest.stack(steps,
        dim=1)`` of ``T`` steps ``[B, ...]``), ``exp.env_id`` ``[B, T]`` (every column the same envs). The same result
        as ``T`` calls of ``add``; when every env is written at once, in order, with ``T <= capacity`` and no episode
        ends to track, it is at most two slice copies per leaf instead of ``T`` (one unroll's steps, written after
        it: ``SyncCollector``)."""
        with torch.inference_mode(False):
            env_ids = exp.env_id
            num_steps = env_ids.shape[1]
            lockstep = (self._storage is not None and self._lockstep is not None and self._episode_end is None
                        and num_steps <= self.capacity and env_ids.shape[0] == self.num_envs
                        and torch.equal(env_ids, self._all_envs[:, None].expand_as(env_ids)))
            if not lockstep:
                for t in range(num_steps):
                    self._add(nest.map_nest(lambda x, t=t: x.select(1, t), exp))
                return
            leaves = nest.flatten(nest.replace_fields(exp, env_id=()))
            start = self._lockstep % self.capacity
            first = min(num_steps, self.capacity - start)  # steps before the ring wraps
            on_host = self.device.type == "cpu"
            for store, x in zip(self._storage, leaves):
                x = x if on_host else host_to_device(x, self.device)
                store[:, start:start + first].copy_(x[:, :first])
                if first < num_steps:
                    store[:, :num_steps - first].copy_(x[:, first:])
            self.policy_iterations[:, start:start + first] = self.next_policy_iteration
            if first < num_steps:
                self.policy_iterations[:, :num_steps - first] = self.next_policy_iteration
            self._lockstep += num_steps
            self._max_stored = min(self._lockstep - self._min_floor, self.capacity)
            self._write_count += num_steps

    def _allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A zeroed storage leaf (a subclass may place it elsewhere, e.g. in a file)."""
        return torch.zeros(shape, dtype=dtype, device=self.device)

    def _adopt(self, leaf: torch.Tensor) -> torch.Tensor:
        """A storage leaf holding ``leaf`` (from a checkpoint); ordinary memory may reuse ``leaf`` itself."""
        return leaf.to(self.device).contiguous()  # (gather reads leaves through a flat view)

    def _to_capacity(self, leaf: torch.Tensor) -> torch.Tensor:
        """A saved leaf ``[num_envs, filled, ...]`` (filled <= capacity) as a full ``[num_envs, capacity, ...]`` one,
        the unwritten slots zero."""
        if leaf.shape[1] == self.capacity:
            return leaf
        full = torch.zeros((leaf.shape[0], self.capacity) + tuple(leaf.shape[2:]), dtype=leaf.dtype)
        full[:, :leaf.shape[1]] = leaf
        return full

    def _update_mirrors(self) -> None:
        """Recompute the Python ints from the counters (after a clear or a load, which may lower the counts)."""
        self._max_stored = int(self.num_stored().max())
        self._min_floor = int(self._floor.min())

    def _track_episodes(self, env_ids: torch.Tensor, step_type: torch.Tensor) -> None:
        """Before ``_write_count`` advances: note new episodes' first steps, back-fill ended episodes' ends."""
        index = self._write_count[env_ids]
        self._episode_end[env_ids, index % self.capacity] = -1
        first = step_type == StepType.FIRST
        self._episode_begin[env_ids[first]] = index[first]
        for env, end in zip(env_ids[step_type == StepType.LAST].tolist(), index[step_type == StepType.LAST].tolist()):
            self._fill_episode_end(env, end)

    def _fill_episode_end(self, env: int, end: int) -> None:
        begin = max(int(self._episode_begin[env]), end - self.capacity + 1)
        self._episode_end[env, torch.arange(begin, end + 1) % self.capacity] = end

    def clear(self, keep_last: int = 0) -> None:
        """Forget everything except the newest ``keep_last`` steps of each env (kept at their absolute indices)."""
        # The kept steps stay in their slots; only the oldest readable index moves.
        self._floor = torch.maximum(self._floor, self._write_count - keep_last)
        self._update_mirrors()

    def forget_before(self, index: torch.Tensor) -> None:
        """Forget each env's steps before absolute index ``index`` ``[num_envs]`` (its oldest readable index moves
        there; never back)."""
        self._floor = torch.maximum(self._floor, torch.minimum(index, self._write_count))
        self._update_mirrors()

    def truncate_episodes(self, env_ids: Optional[torch.Tensor] = None) -> None:
        """Mark the newest stored step of every env (or of ``env_ids``, int64 ``[K]``) LAST (keeping its discount),
        i.e. a time-limit truncation.

        Used after a resume restarts the envs mid-episode, and where an async unroll dropped an env's steps (too old a
        policy): the next stored step is a FIRST, and the transition into it must not look like a real one. The step's
        own reward and discount stay valid, so it still bootstraps.
        """
        if self._storage is None:
            return
        if env_ids is None:
            env_ids = torch.arange(self.num_envs)
        env_ids = env_ids[self.num_stored().index_select(0, env_ids) > 0]
        slots = (self._write_count[env_ids] - 1) % self.capacity
        stored: Experience = pytree.tree_unflatten(self._storage, self._spec)  # views of the storage, no copy
        stored.step_type.view(-1)[host_to_device(env_ids * self.capacity + slots, self.device)] = StepType.LAST
        if self._episode_end is not None:
            for env in env_ids.tolist():
                self._fill_episode_end(env, int(self._write_count[env]) - 1)

    # ---------------------------------------------------------------------------------------------------- reading --
    def oldest_index(self) -> torch.Tensor:
        """Absolute index ``[num_envs]`` of the oldest readable step of each env."""
        return torch.maximum(self._write_count - self.capacity, self._floor)

    def num_stored(self) -> torch.Tensor:
        """Readable steps ``[num_envs]`` per env."""
        return self._write_count - self.oldest_index()

    def total_stored(self) -> int:
        """Readable steps summed over envs."""
        return int(self.num_stored().sum())

    def holds_sequence(self, length: int) -> bool:
        """Whether some env holds at least ``length`` readable steps (a sequence of ``length`` fits).

        Answered from a Python int that bounds the most steps any env holds from below (exact after lockstep adds,
        clears and loads; other adds only raise the counts), so once enough is stored no tensor is read; while the
        bound is short of ``length`` the CPU counters are read to refresh it (warm-up and error paths only).
        """
        if self._max_stored < length:
            self._max_stored = int(self.num_stored().max())
        return self._max_stored >= length

    def gather(self, env_ids: torch.Tensor, positions: torch.Tensor, length: int) -> Experience:
        """Sequences ``[N, length]`` starting at absolute indices ``positions`` ``[N]`` of rings ``env_ids`` ``[N]``."""
        return self.gather_at(env_ids, positions.unsqueeze(1) + torch.arange(length, device=positions.device))

    def gather_at(self, env_ids: torch.Tensor, index: torch.Tensor, out: list[torch.Tensor] | None = None
                  ) -> Experience:
        """Steps ``[N, M]`` at absolute indices ``index`` ``[N, M]`` of rings ``env_ids`` ``[N]`` (caller keeps the
        indices readable: ``oldest_index() <= index < write_count``).

        The indices may live on the CPU or on the storage's device: CPU indices for a device storage travel in one
        non-blocking copy (``transfer.host_to_device``). Indices on the device for a host storage are read back (a sync;
        keep the sampler's indices on the host for a host storage). ``out``: one tensor per stored leaf (the order of
        ``leaf_layout``), each of ``N * M * prod(leaf_shape)`` elements on the storage's device or pinned host memory
        for a host storage, that the leaves are gathered into (the staging buffers of ``BatchStager``); the returned
        leaves are views of them. ``env_id`` comes back ``[N, M]`` on the storage's device.
        """
        rows = env_ids.unsqueeze(1)
        flat = rows * self.capacity + index % self.capacity  # [N, M]: row of the [num_envs * capacity, ...] view
        on_storage = host_to_device(flat, self.device)
        flat_1d = on_storage.reshape(-1)
        if self._rows_of is not self._storage:
            self._rows = [store.view((-1,) + tuple(store.shape[2:])) for store in self._storage]
            self._rows_of = self._storage
        shape = tuple(index.shape)
        leaves = []
        for i, rows_of_store in enumerate(self._rows):
            if out is None:
                gathered = rows_of_store.index_select(0, flat_1d)
            else:
                gathered = torch.index_select(rows_of_store, 0, flat_1d,
                                              out=out[i].view((-1,) + tuple(rows_of_store.shape[1:])))
            leaves.append(gathered.unflatten(0, shape))
        exp: Experience = pytree.tree_unflatten(leaves, self._spec)
        env_id = rows.expand_as(index) if rows.device == self.device else on_storage // self.capacity
        return nest.replace_fields(exp, env_id=env_id)

    def to_storage(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (a host tensor computed from sample indices, e.g. a transformer's mask ``[N, L]``) on the storage's
        device, where ``gather_at`` returns steps: one non-blocking copy (``transfer.host_to_device``); ``x`` itself
        for a host storage."""
        return host_to_device(x, self.device)

    def leaf_layout(self) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """``(leaf_shape, dtype)`` of every stored leaf, in storage order (empty before the first add)."""
        return [(tuple(store.shape[2:]), store.dtype) for store in self._storage or []]

    def field_names(self) -> list[str]:
        """Dotted names of the stored leaves, in storage order (``step_type``, ``observation.<key>``, ``action``,
        ``rollout_info.<k>``, ...); empty before the first add. Checkpoints record them so a replay buffer can be read
        as offline data without rebuilding its algorithm."""
        if self._spec is None:
            return []
        paths, _ = pytree.tree_flatten_with_path(pytree.tree_unflatten(list(range(self._spec.num_leaves)), self._spec))
        return [".".join(str(getattr(k, "name", getattr(k, "key", getattr(k, "idx", k)))) for k in path)
                for path, _ in paths]

    def write_count(self) -> torch.Tensor:
        """Steps ever written per env ``[num_envs]`` (the absolute index the next step gets)."""
        return self._write_count.clone()

    def episode_end(self, env_ids: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Absolute index of the last stored step of the episode holding step ``index`` of ring ``env_ids`` (same
        shapes): its LAST step, or the newest stored step while the episode is still running."""
        if self._episode_end is None:
            raise RuntimeError("this RingBuffer was built without track_episode_ends=True")
        end = self._episode_end[env_ids, index % self.capacity]  # (host bookkeeping: host indices)
        return torch.where(end >= 0, end, self._write_count[env_ids] - 1)

    def gather_all(self) -> Experience:
        """Every readable step as ``[num_envs, T]`` (all envs must hold the same number of steps)."""
        counts = self.num_stored()
        if not bool((counts == counts[0]).all()):
            raise RuntimeError(f"whole-buffer training needs the same number of steps per env, got {counts.tolist()}")
        env_ids = torch.arange(self.num_envs)
        return self.gather(env_ids, self.oldest_index(), int(counts[0]))

    # ---------------------------------------------------------------------------------------------- checkpointing --
    def state_dict(self) -> dict:
        """Tensors only, all on the CPU (a checkpoint does not depend on where the storage lived): the storage leaves,
        the write counters, the oldest readable index and each slot's policy iteration.

        Until the rings wrap, only the slots written so far are saved (``[num_envs, max write count, ...]``): a 100k
        ring of Atari frames is 700 MB, most of it empty early in a run; ``load_state_dict`` pads them back.
        """
        leaves = self._storage or []
        filled = int(self._write_count.max()) if leaves else 0
        if filled < self.capacity:
            leaves = [leaf[:, :filled] for leaf in leaves]
        state = {"write_count": self._write_count.clone(), "oldest": self.oldest_index(),
                 "leaves": [leaf.to("cpu", copy=True) for leaf in leaves]}
        if self._policy_iterations is not None:
            state["policy_iterations"] = self._policy_iterations[:, :min(filled, self.capacity)].clone()
        if self._episode_end is not None:
            state.update(episode_end=self._episode_end.clone(), episode_begin=self._episode_begin.clone())
        return state

    def load_state_dict(self, state: dict, example: Experience) -> None:
        """Restore from ``state_dict``; ``example`` gives the nest structure (any Experience of the right structure)."""
        self._write_count = state["write_count"].clone()
        self._floor = state["oldest"].clone()
        counts = self._write_count.tolist()
        self._lockstep = counts[0] if len(set(counts)) == 1 else None
        self._spec = pytree.tree_flatten(nest.replace_fields(example, env_id=()))[1]
        if state["leaves"] and len(state["leaves"]) != self._spec.num_leaves:
            raise ValueError(f"the checkpoint's replay buffer holds {len(state['leaves'])} fields per step but this "
                             f"algorithm stores {self._spec.num_leaves}; it was written by another alfish version or "
                             "algorithm: resume it with that version, or start a new root_dir")
        saved = {x.shape[1] for x in state["leaves"]}
        if saved and saved != {self.capacity} and saved != {int(self._write_count.max())}:
            raise ValueError(f"the checkpoint's replay buffer has rings of {sorted(saved)} steps per env but this one "
                             f"has {self.capacity}; resume with the replay_buffer_length it was written with")
        self._storage = [self._adopt(self._to_capacity(x)) for x in state["leaves"]] or None
        # (absent from checkpoints written before the stamps: every step then counts as acted at iteration 0)
        stamps = state.get("policy_iterations")
        self._policy_iterations = self._to_capacity(stamps).clone() if stamps is not None else None
        self._update_mirrors()
        if self._episode_end is not None:
            if "episode_end" not in state:
                raise ValueError("the checkpoint's replay buffer has no episode ends, which hindsight relabelling "
                                 "needs; it was written without HindsightExperienceTransformer: start a new root_dir")
            self._episode_end = state["episode_end"].clone()
            self._episode_begin = state["episode_begin"].clone()
