"""Suite-wide settings.

torch runs on one intra-op thread in the tests. The networks here are tiny, and on a 2-core CI machine an OpenMP team
of two threads competing with any other busy process (the env worker, a child training run, a parallel job) makes each
small matmul thousands of times slower (measured: 8 ms instead of 10 us per 2x64x3 baddbmm while the other core was
busy), which turns a 10-second learning test into minutes.
"""
import pytest
import torch

torch.set_num_threads(1)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "learning: trains an algorithm to a known return on a tiny env (seconds)")
    config.addinivalue_line("markers", "cli: runs the command-line programs in subprocesses")
