from alfish.transforms.base import DataTransformer, SequentialDataTransformer, build_transformers, check_order
from alfish.transforms.normalizers import ObservationNormalizer, RewardNormalizer, RunningMeanStd
from alfish.transforms.rewards import RewardClipping, RewardScaling

__all__ = ["DataTransformer", "ObservationNormalizer", "RewardClipping", "RewardNormalizer", "RewardScaling",
           "RunningMeanStd", "SequentialDataTransformer", "build_transformers", "check_order"]
