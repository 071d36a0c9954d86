"""Fixtures of the analysis tools' tests."""
import pytest

from tests.tools.synthetic import real_runs as _real_runs


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    """Two real short SAC runs (2 seeds), trained once per test module."""
    return _real_runs(tmp_path_factory.mktemp("runs"))
