"""Trainer.host_memory_cache_mb: glibc keeps freed blocks for reuse; 0 leaves malloc alone; bad values are errors."""
import sys

import pytest

from alfish.learn.host_memory import keep_freed_host_memory
from alfish.trainer.options import RunOptions


def test_zero_leaves_malloc_alone():
    assert keep_freed_host_memory(0) is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_on_linux_the_thresholds_are_raised():
    assert keep_freed_host_memory(256) is True


def test_the_run_option_defaults_to_256_mb_and_refuses_negative_values():
    assert RunOptions().host_memory_cache_mb == 256
    with pytest.raises(ValueError, match=r"Trainer.host_memory_cache_mb=-1 must be >= 0 \(0: malloc's defaults\)"):
        RunOptions(host_memory_cache_mb=-1)
