"""Compiled updates on the device (``'reduce-overhead'``: inductor and CUDA graphs on CUDA; ``'default'`` with the
cheap counting ``aot_eager`` backend when ``ALFISH_TEST_DEVICE=cpu``) compile, and record, every graph an algorithm
needs in their warm-up and never again, with every learning rate and coefficient on a changing schedule; no update
falls back to eager code, and the compiled updates are the eager ones. The body is the CPU suite's
(``tests/learn/compiled_checks.py``).

    ALFISH_TEST_DEVICE=cuda python -m pytest tests/gpu/test_no_recompile.py
"""
from __future__ import annotations

import pytest
import torch
import torch._inductor.config
from torch._dynamo.utils import counters

from tests.learn.compiled_checks import ALGORITHMS, CountingBackend, check_no_recompile

from .helpers import DEVICE, ON_CUDA

MODE = "reduce-overhead" if ON_CUDA else "default"


@pytest.fixture(autouse=True)
def same_random_numbers():
    """Inductor's random numbers from torch's own generator, as eager code draws them (the compiled updates are
    compared with eager ones); each test compiles afresh."""
    torch._dynamo.reset()
    with torch._inductor.config.patch(fallback_random=True):
        yield
    torch._dynamo.reset()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_compiled_updates_do_not_recompile_on_the_device(name):
    check_no_recompile(name, DEVICE, MODE, None if ON_CUDA else CountingBackend())
    if ON_CUDA:  # 'reduce-overhead' that skipped CUDA graphs would run the compiled kernels one launch at a time
        skips = counters["inductor"]["cudagraph_skips"]
        assert skips == 0, f"{name}: inductor skipped CUDA graphs {skips} time(s) (TORCH_LOGS=perf_hints says why)"
