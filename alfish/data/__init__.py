from alfish.data.types import AlgStep, BatchInfo, Experience, LossInfo, StepType, TimeStep

__all__ = ["AlgStep", "BatchInfo", "Experience", "LossInfo", "StepType", "TimeStep"]
