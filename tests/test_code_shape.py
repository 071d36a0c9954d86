"""The shape rules of alfish/ (issue 27), read from the source with ``ast``: no module over ``MAX_LINES`` lines, and no
function taking more than ``MAX_PARAMETERS`` parameters (``self``/``cls`` not counted, ``*args`` and ``**kwargs``
one each) unless it is a gin configurable, whose parameters are ALF's names (``@gin.configurable`` on the function,
or on the class whose ``__init__`` it is, also through an alias such as ``schedules._configurable``). Settings that
travel together go in a small frozen dataclass or as keyword arguments instead of a long positional list."""
from __future__ import annotations

import ast
import pathlib

ALFISH = pathlib.Path(__file__).resolve().parents[1] / "alfish"
MAX_LINES = 500
MAX_PARAMETERS = 7

#: Functions whose parameters are user-facing names although not a gin configurable, each with its reason.
ALLOWED_LONG_SIGNATURES: dict[str, str] = {
    # its keyword-only parameters are the ALE protocol settings users bind as ``create_environment.env_kwargs``
    # (gymnasium's and ale_py's names); they cannot change name, and they already travel as keywords.
    "alfish/envs/atari.py:make_atari": "env_kwargs names",
}


def _modules() -> list[pathlib.Path]:
    return sorted(ALFISH.rglob("*.py"))


def _name(path: pathlib.Path) -> str:
    return path.relative_to(ALFISH.parent).as_posix()


def _is_configurable(decorators: list[ast.expr]) -> bool:
    """``@gin.configurable``, ``@gin.configurable(...)`` or an alias bound to it (``@_configurable``)."""
    return any("configurable" in ast.unparse(d) for d in decorators)


def parameter_count(function: ast.FunctionDef | ast.AsyncFunctionDef, is_method: bool) -> int:
    """Parameters a caller can pass: positional, keyword-only, ``*args`` and ``**kwargs`` (one each); a method's
    first parameter (``self``/``cls``) is not counted."""
    args = function.args
    positional = args.posonlyargs + args.args
    if is_method and positional and positional[0].arg in ("self", "cls"):
        positional = positional[1:]
    return len(positional) + len(args.kwonlyargs) + int(args.vararg is not None) + int(args.kwarg is not None)


def long_signatures(tree: ast.Module, module: str) -> list[str]:
    """``module:Qualified.name (n parameters)`` for each function over the limit that is not a configurable."""
    found: list[str] = []

    def visit(node: ast.AST, prefix: str, in_class: bool, class_configurable: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", True, _is_configurable(child.decorator_list))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                count = parameter_count(child, in_class)
                exempt = _is_configurable(child.decorator_list) or (class_configurable and child.name == "__init__")
                if count > MAX_PARAMETERS and not exempt:
                    found.append(f"{module}:{prefix}{child.name} ({count} parameters)")
                visit(child, f"{prefix}{child.name}.", False, False)
            else:
                visit(child, prefix, in_class, class_configurable)

    visit(tree, "", False, False)
    return found


def _key(offender: str) -> str:
    return offender.split(" (")[0]


def test_no_function_takes_more_than_seven_parameters():
    offenders = [o for path in _modules() for o in long_signatures(ast.parse(path.read_text()), _name(path))]
    new = [o for o in offenders if _key(o) not in ALLOWED_LONG_SIGNATURES]
    assert not new, (f"functions with more than {MAX_PARAMETERS} parameters (pass a frozen dataclass or keyword "
                     "arguments): " + "; ".join(new))
    fixed = set(ALLOWED_LONG_SIGNATURES) - {_key(o) for o in offenders}
    assert not fixed, f"no longer offending, remove from ALLOWED_LONG_SIGNATURES: {sorted(fixed)}"


def test_no_module_is_longer_than_500_lines():
    lengths = {_name(path): len(path.read_text().splitlines()) for path in _modules()}
    long_files = {name: n for name, n in lengths.items() if n > MAX_LINES}
    assert not long_files, f"modules over {MAX_LINES} lines (split them by responsibility): {long_files}"


def test_the_parameter_count_ignores_self_and_counts_star_arguments_once():
    tree = ast.parse("class A:\n"
                     "    def m(self, a, b, *args, c, **kwargs): pass\n"
                     "def f(a, b, c, d, e, f, g, h): pass\n"
                     "@gin.configurable\n"
                     "def g(a, b, c, d, e, f, g, h): pass\n"
                     "@gin.configurable\n"
                     "class C:\n"
                     "    def __init__(self, a, b, c, d, e, f, g, h): pass\n"
                     "    def other(self, a, b, c, d, e, f, g, h): pass\n")
    method = tree.body[0].body[0]
    assert parameter_count(method, is_method=True) == 5
    assert long_signatures(tree, "m.py") == ["m.py:f (8 parameters)", "m.py:C.other (8 parameters)"]
