from alfish.algorithms.a2c import A2cAlgorithm
from alfish.algorithms.base import Algorithm, OffPolicyAlgorithm, OnPolicyAlgorithm, RLAlgorithm
from alfish.algorithms.bc import BcAlgorithm
from alfish.algorithms.ddpg import DdpgAlgorithm, Td3Algorithm
from alfish.algorithms.dqn import DqnAlgorithm
from alfish.algorithms.iql import IqlAlgorithm
from alfish.algorithms.ppo import PpoAlgorithm
from alfish.algorithms.sac import SacAlgorithm
from alfish.algorithms.sac_mixed import MixedSacAlgorithm
from alfish.algorithms.supervised import SupervisedModel

__all__ = ["A2cAlgorithm", "Algorithm", "BcAlgorithm", "DdpgAlgorithm", "DqnAlgorithm", "IqlAlgorithm",
           "MixedSacAlgorithm", "OffPolicyAlgorithm", "OnPolicyAlgorithm", "PpoAlgorithm", "RLAlgorithm",
           "SacAlgorithm", "SupervisedModel", "Td3Algorithm"]
