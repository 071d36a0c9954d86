"""The run: assembly of the parts (build.py), the flag-free loop (trainer.py) and what surrounds it: training steps,
counters, resume, evaluation, checkpoints, signals, summaries, progress."""

__all__ = ["Trainer", "build_trainer"]


def __getattr__(name: str):
    # The loop pulls in every component; import it lazily so `import alfish.rundir.checkpoint` stays light.
    if name == "Trainer":
        from alfish.trainer.trainer import Trainer

        return Trainer
    if name == "build_trainer":
        from alfish.trainer.build import build_trainer

        return build_trainer
    raise AttributeError(name)
