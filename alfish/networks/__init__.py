from alfish.networks.mlp import MLP, EnsembleMLP

__all__ = ["MLP", "EnsembleMLP"]
