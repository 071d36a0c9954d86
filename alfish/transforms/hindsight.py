"""Hindsight experience replay (Andrychowicz et al. 2017): relabel sampled sequences with goals achieved later."""
from __future__ import annotations

from typing import Any, Callable

import gin
import gymnasium as gym
import torch

from alfish.data import nest
from alfish.data.types import BatchInfo, Experience, StepType
from alfish.transforms.base import STAGE_READS_BUFFER, DataTransformer


@gin.configurable
def sparse_goal_reward(achieved_goal: torch.Tensor, desired_goal: torch.Tensor,
                       tolerance: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``reached = ||achieved - desired||_2 <= tolerance`` over the last dim; reward 0 when reached, else -1.

    Shapes ``[..., goal_dim] -> ([...], [...])`` (reward float32, reached bool).
    """
    reached = torch.linalg.vector_norm((achieved_goal - desired_goal).float(), dim=-1) <= tolerance
    return reached.to(torch.float32) - 1.0, reached


RewardFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@gin.configurable
class HindsightExperienceTransformer(DataTransformer):
    """With probability ``her_proportion`` a sampled sequence ``[L]`` gets a new desired goal: the achieved goal of a
    step drawn uniformly from the sequence's last step in its episode up to that episode's last stored step (the
    "future" strategy). Only steps of that same episode are relabelled; each of them gets the new goal and the reward
    ``reward_fn(achieved_goal, new_goal)`` (FIRST steps keep reward 0: no transition leads into them). With
    ``end_episode_on_goal`` a relabelled step that reaches the new goal becomes terminal (discount 0), matching envs
    that end an episode on success.

    Observations are dicts with ``achieved_goal_field`` and ``desired_goal_field`` (``[..., goal_dim]``). The reward of
    step ``t`` is for the transition into it, so it is computed from step ``t``'s achieved goal.
    """

    stage = STAGE_READS_BUFFER
    needs_episode_ends = True

    def __init__(self, observation_space: gym.spaces.Dict, her_proportion: float = 0.8,
                 reward_fn: RewardFn = sparse_goal_reward, end_episode_on_goal: bool = True,
                 achieved_goal_field: str = "achieved_goal", desired_goal_field: str = "desired_goal"):
        super().__init__()
        keys = list(observation_space.spaces) if isinstance(observation_space, gym.spaces.Dict) else None
        if keys is None or achieved_goal_field not in keys or desired_goal_field not in keys:
            raise ValueError(f"HindsightExperienceTransformer needs dict observations with '{achieved_goal_field}' "
                             f"and '{desired_goal_field}'; this observation space is {observation_space}")
        if not 0.0 <= her_proportion <= 1.0:
            raise ValueError(f"HindsightExperienceTransformer.her_proportion={her_proportion} must be in [0, 1]")
        self.her_proportion, self.reward_fn = her_proportion, reward_fn
        self.end_episode_on_goal = end_episode_on_goal
        self.achieved, self.desired = achieved_goal_field, desired_goal_field

    def transform_sample(self, exp: Experience, batch_info: BatchInfo, replay: Any) -> Experience:
        """Devices: which rows and steps are relabelled, and from which step, is decided on the host, from the
        sampler's host indices and the ring's host episode ends (the draws come from torch's CPU generator, as they
        always have); the relabelling itself runs on the batch's device (the storage's). The one host tensor it
        needs there, the ``[N, L]`` relabel mask, crosses once (``replay.to_storage``: non-blocking); nothing is
        read back from the device."""
        num, length = exp.step_type.shape[:2]
        env_ids, start = batch_info.env_ids, batch_info.positions
        relabel = torch.rand(num) < self.her_proportion  # [N]
        if not bool(relabel.any()):
            return exp
        episode_end = replay.episode_end(env_ids, start)  # [N], absolute
        last_in_episode = torch.minimum(start + length - 1, episode_end)
        future = last_in_episode + (torch.rand(num) * (episode_end - last_in_episode + 1)).long()
        future = torch.minimum(future, episode_end)  # rand() < 1, but float rounding must not step past the end
        new_goal = replay.gather_at(env_ids, future.unsqueeze(1)).observation[self.achieved]  # [N, 1, goal]
        index = start.unsqueeze(1) + torch.arange(length)  # [N, L]
        mask = replay.to_storage(relabel.unsqueeze(1) & (index <= episode_end.unsqueeze(1)))  # same episode only
        obs = dict(exp.observation)
        goal_mask = mask.view(mask.shape + (1,) * (obs[self.desired].dim() - 2))
        obs[self.desired] = torch.where(goal_mask, new_goal.to(obs[self.desired].dtype), obs[self.desired])
        reward, reached = self.reward_fn(obs[self.achieved], obs[self.desired])
        rewarded = mask & (exp.step_type != StepType.FIRST)
        new_reward = torch.where(rewarded, reward.to(exp.reward.dtype), exp.reward)
        discount = exp.discount
        if self.end_episode_on_goal:
            discount = torch.where(rewarded & reached, torch.zeros_like(discount), discount)
        return nest.replace_fields(exp, observation=obs, reward=new_reward, discount=discount)
