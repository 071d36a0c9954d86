"""The import graph of the alfish package, from the source, and its cycles.

    python tools/import_graph.py            # package-level graph: which folder imports which
    python tools/import_graph.py --modules  # every module's alfish imports

Every import is an edge, also one inside a function (a deferred import that closes a cycle is still a cycle: the two
modules cannot be understood or tested apart); only imports under ``if TYPE_CHECKING:`` are not.

The packages form layers (``LAYERS``, lowest first): a package imports only packages of the layers below it, so each
can be read and tested with only what lies beneath it. ``tests/test_import_graph.py`` fails when the graph has a
cycle or an upward import; this script prints both and exits 1.
"""
from __future__ import annotations

import argparse
import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: The package order, lowest first: ``alfish.<name>`` may import only names before it (and itself). The top-level
#: ``alfish`` package (its version) and the top-level modules ``errors`` and ``seeding`` are the floor; ``console``
#: (signals, the crash question, the progress line) imports nothing of alfish either.
LAYERS = ("alfish", "errors", "seeding", "console", "data", "config", "schedulers", "networks", "losses", "envs",
          "transforms", "rundir", "algorithms", "replay", "learn", "collect", "evaluate", "export", "trainer", "bin",
          "api", "tools")


def module_names(package_dir: pathlib.Path) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every module of the package (packages by their ``__init__.py``)."""
    names = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _imports(tree: ast.Module) -> list[ast.stmt]:
    """Every import statement of the module, except those under ``if TYPE_CHECKING:``."""
    found, pending = [], [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            pending += node.orelse
        else:
            pending += list(ast.iter_child_nodes(node))
    return found


def module_graph(package_dir: pathlib.Path = ROOT / "alfish") -> dict[str, set[str]]:
    """``{module: {alfish modules it imports}}`` for the package in ``package_dir``."""
    modules = module_names(package_dir)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative import
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + [base]).strip(".")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, result = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    sys.setrecursionlimit(max(1000, 4 * len(graph)))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return result


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph folded to ``alfish.<folder>`` (top-level modules stay themselves)."""
    def fold(name: str) -> str:
        return ".".join(name.split(".")[:2])

    folded: dict[str, set[str]] = {}
    for module, edges in graph.items():
        folded.setdefault(fold(module), set()).update(fold(e) for e in edges if fold(e) != fold(module))
    return folded


def layer_of(package: str, layers: tuple[str, ...] = LAYERS) -> int:
    """The index in ``layers`` of a folded package name (``alfish`` or ``alfish.<name>``)."""
    name = package.partition(".")[2] or package
    if name not in layers:
        raise ValueError(f"{package} has no place in tools/import_graph.py LAYERS: add it where it belongs")
    return layers.index(name)


def upward_imports(graph: dict[str, set[str]], layers: tuple[str, ...] = LAYERS) -> list[tuple[str, str]]:
    """Every ``(module, imported module)`` whose import runs upward: to a package of a higher layer."""
    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    return sorted((module, target) for module, edges in graph.items() for target in edges
                  if layer_of(package(target), layers) > layer_of(package(module), layers))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modules", action="store_true", help="one line per module instead of per folder")
    parser.add_argument("--package_dir", default=str(ROOT / "alfish"), help="the alfish folder to read")
    args = parser.parse_args()
    graph = module_graph(pathlib.Path(args.package_dir))
    shown = graph if args.modules else package_graph(graph)
    order = {name: layer_of(".".join(name.split(".")[:2])) for name in shown}
    for name in sorted(shown, key=lambda n: (order[n], n)):
        print(f"{name} -> {', '.join(sorted(shown[name], key=lambda n: (order.get(n, 0), n))) or '(nothing)'}")
    found = cycles(graph)
    for cycle in found:
        print("CYCLE:", " <-> ".join(cycle))
    upward = upward_imports(graph)
    for module, target in upward:
        print(f"UPWARD: {module} imports {target}")
    return 1 if found or upward else 0


if __name__ == "__main__":
    sys.exit(main())
