"""Every test under tests/gpu is marked ``cuda`` and, where CUDA is not usable, skipped with the reason.

``ALFISH_TEST_DEVICE=cpu`` runs them on the CPU instead (see ``helpers.DEVICE``); CI sets nothing, so without a GPU
it skips them all.
"""
import pathlib

import pytest

from .helpers import skip_reason

HERE = pathlib.Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook applies `-m cuda` to the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The hook sees the whole session's items: only those under this folder are GPU tests.
    reason = skip_reason()
    for item in items:
        if HERE in pathlib.Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.cuda)
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))
