from alfish.transforms.base import (
                                    DataTransformer,
                                    RolloutView,
                                    SequentialDataTransformer,
                                    build_transformers,
                                    check_order,
)
from alfish.transforms.frame_stacker import FrameStacker
from alfish.transforms.hindsight import HindsightExperienceTransformer, sparse_goal_reward
from alfish.transforms.image import ImageScaleTransformer
from alfish.transforms.normalizers import ObservationNormalizer, RewardNormalizer, RunningMeanStd
from alfish.transforms.rewards import RewardClipping, RewardScaling
from alfish.transforms.untransformed import UntransformedTimeStep

__all__ = ["DataTransformer", "FrameStacker", "HindsightExperienceTransformer", "ImageScaleTransformer",
           "ObservationNormalizer", "RewardClipping", "RewardNormalizer", "RewardScaling", "RolloutView",
           "RunningMeanStd", "SequentialDataTransformer", "UntransformedTimeStep", "build_transformers",
           "check_order", "sparse_goal_reward"]
