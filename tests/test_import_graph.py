"""The package has no import cycle (tools/import_graph.py reads every import, deferred ones included), and every
module of alfish imports."""
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
