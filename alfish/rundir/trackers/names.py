"""Which trackers exist (``Trainer.trackers``) and what each needs installed: checked before anything starts."""
from __future__ import annotations

import importlib.util
from typing import Any

#: The tracker names ``Trainer.trackers`` takes, in the order they are started.
TRACKERS = ("wandb", "mlflow")
#: name -> (the module it imports, the alfish extra that installs it).
PACKAGES = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}


def check_tracker_names(names: Any) -> None:
    """A one-line ValueError unless ``names`` is a list (or tuple) of distinct known tracker names."""
    known = ", ".join(repr(n) for n in TRACKERS)
    if isinstance(names, (str, bytes)) or not isinstance(names, (list, tuple)):
        raise ValueError(f"Trainer.trackers={names!r} must be a list of tracker names, e.g. ['wandb'] (known: "
                         f"{known})")
    for name in names:
        if name not in TRACKERS:
            raise ValueError(f"Trainer.trackers: {name!r} is not a tracker; the known ones are {known}")
    if len(set(names)) != len(names):
        raise ValueError(f"Trainer.trackers={list(names)!r} names a tracker twice")


def check_tracker_packages(names: Any) -> None:
    """A one-line ValueError naming the extra to install when a package of ``names`` is missing (it looks the
    package up without importing it: wandb and MLflow take a second to import)."""
    for name in names:
        module, extra = PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"Trainer.trackers={list(names)!r} needs {module}: pip install 'alfish[{extra}]'")
