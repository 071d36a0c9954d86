"""The run: assembly of the parts (build.py), the flag-free loop (trainer.py) and the training strategies
(training.py, hybrid_training.py, supervised_training.py), with what the loop keeps: counters, what a checkpoint holds
and how a run resumes, summaries, the profiler, callbacks. Signals and the progress line are ``alfish.console``'s."""

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
