"""The training loop and what it owns: optimizer, replay, summaries, evaluation, checkpoints."""
from alfish.trainer.optim import OptimizerConfig

__all__ = ["OptimizerConfig", "Trainer"]


def __getattr__(name: str):
    # Trainer pulls in every component; import it lazily so `import alfish.trainer.checkpoint` stays light.
    if name == "Trainer":
        from alfish.trainer.trainer import Trainer

        return Trainer
    raise AttributeError(name)
