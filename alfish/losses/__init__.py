from alfish.losses.returns import discounted_return, generalized_advantage_estimation, masked_standardize

__all__ = ["discounted_return", "generalized_advantage_estimation", "masked_standardize"]
