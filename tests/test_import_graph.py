"""The package has no import cycle and no upward import (tools/import_graph.py reads every import, deferred ones
included; its LAYERS is the package order), and every module of alfish imports."""
import importlib
import importlib.util
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("import_graph", REPO / "tools" / "import_graph.py")
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)


def test_alfish_has_no_import_cycle():
    graph = import_graph.module_graph()
    assert "alfish.trainer.trainer" in graph and "alfish.collect.async_child" in graph  # it read the real package
    assert import_graph.cycles(graph) == []


def test_alfish_imports_only_downward():
    graph = import_graph.module_graph()
    assert "alfish.rundir.checkpoint" in graph and "alfish.evaluate.evaluator" in graph
    assert import_graph.upward_imports(graph) == []
    folded = set(import_graph.package_graph(graph))
    assert folded <= {f"alfish.{name}" for name in import_graph.LAYERS} | {"alfish"}  # every package has a layer


def test_an_upward_import_is_found_also_when_deferred(tmp_path):
    # The shape alfish had: the offline data (replay/) read a run's checkpoints through the trainer's module.
    package = tmp_path / "alfish"
    for folder in ("replay", "trainer", "rundir"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "trainer" / "checkpoint.py").write_text("")
    (package / "rundir" / "disk.py").write_text("")
    (package / "replay" / "from_run.py").write_text(
        "from alfish.rundir import disk\ndef read():\n    from alfish.trainer.checkpoint import load\n")
    graph = import_graph.module_graph(package)
    assert import_graph.upward_imports(graph) == [("alfish.replay.from_run", "alfish.trainer.checkpoint")]
    with pytest.raises(ValueError, match="no place in tools/import_graph.py LAYERS"):
        import_graph.upward_imports({"alfish.newthing.x": {"alfish.data.types"}})


def test_a_deferred_import_that_closes_a_cycle_is_found(tmp_path):
    # The shape alfish had: the loop imports the async unroller, whose child imports the loop inside a function.
    package = tmp_path / "alfish"
    (package / "trainer").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "trainer" / "__init__.py").write_text("")
    (package / "trainer" / "loop.py").write_text("from alfish.trainer.child import run\n")
    (package / "trainer" / "child.py").write_text("def run():\n    from alfish.trainer import loop\n")
    (package / "trainer" / "typed.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from alfish.trainer import loop\n")
    graph = import_graph.module_graph(package)
    assert import_graph.cycles(graph) == [["alfish.trainer.child", "alfish.trainer.loop"]]
    assert graph["alfish.trainer.typed"] == set()  # type-checking imports are not edges


@pytest.mark.parametrize("module", sorted(import_graph.module_names(REPO / "alfish")))
def test_every_module_imports(module):
    importlib.import_module(module)
