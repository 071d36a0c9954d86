"""``nest.replace_fields``: ``NamedTuple._replace`` that ``torch.compile`` traces on every supported torch.

torch 2.11's dynamo miscompiles a ``_replace`` whose result leaves the compiled region (an empty tuple for a record
passed in, a bare ``AssertionError`` for one made inside; found on the H200 machine, where every compiled update fell
back to eager). alfish therefore builds records with ``replace_fields`` only, and this file keeps it so.
"""
from __future__ import annotations

import ast
import pathlib
from typing import Any, NamedTuple

import pytest
import torch

from alfish.data import nest

ALFISH = pathlib.Path(__file__).resolve().parents[1] / "alfish"


class Record(NamedTuple):
    loss: Any
    extra: Any = ()
    priority: Any = ()


def test_replace_fields_changes_the_named_fields_and_keeps_the_others_and_the_type():
    record = Record(1.0, {"a": 2.0}, 3.0)
    out = nest.replace_fields(record, extra={"b": 4.0}, priority=5.0)
    assert type(out) is Record
    assert out == Record(1.0, {"b": 4.0}, 5.0)
    assert record == Record(1.0, {"a": 2.0}, 3.0)  # a new record; the old one is unchanged
    assert nest.replace_fields(record) == record


def test_an_unknown_field_is_an_error_naming_it():
    with pytest.raises(ValueError, match="Record has no field lost"):
        nest.replace_fields(Record(1.0), lost=2.0)


def passed_in(x: torch.Tensor, record: Record) -> Record:
    return nest.replace_fields(record, loss=x.sum())


def made_inside(x: torch.Tensor) -> Record:
    return nest.replace_fields(Record(x.sum(), {}), extra={"mean": x.mean()})


def test_a_compiled_region_returns_the_replaced_record_whole():
    """Traced in one graph (fullgraph), the record comes out with every field: the cases torch 2.11 broke."""
    x = torch.tensor([1.0, 2.0, 3.0])
    torch._dynamo.reset()
    out = torch.compile(passed_in, backend="eager", fullgraph=True)(x, Record(torch.zeros(()), {"k": 1}, 7))
    assert type(out) is Record and len(out) == 3
    assert out.loss.item() == 6.0 and out.extra == {"k": 1} and out.priority == 7
    torch._dynamo.reset()
    out = torch.compile(made_inside, backend="eager", fullgraph=True)(x)
    assert type(out) is Record and out.loss.item() == 6.0 and out.extra["mean"].item() == 2.0 and out.priority == ()
    torch._dynamo.reset()


def replace_calls(path: pathlib.Path) -> list[int]:
    """The line of every ``<expr>._replace(...)`` call in the Python file ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_replace"]


def test_the_scan_finds_a_replace_call_and_not_a_function_of_that_name(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("z = _replace(q)\nx = y.z._replace(a=1)\n")
    assert replace_calls(probe) == [2]


def test_alfish_calls_no_namedtuple_replace():
    found = [f"{path.relative_to(ALFISH.parent).as_posix()}:{line}"
             for path in sorted(ALFISH.rglob("*.py")) for line in replace_calls(path)]
    assert not found, f"use nest.replace_fields(record, ...) instead of record._replace(...) (torch 2.11): {found}"
