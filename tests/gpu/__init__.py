"""GPU tests (marker ``cuda``): learning with fp32/fp16/bf16 on CUDA, no host sync in the update path, fp16 loss
scaling, compiled (CUDA-graph) updates, what AMP keeps in float32, GPU checkpoints played and resumed on the CPU,
device errors, and data-parallel training on CUDA (``test_ddp_cuda.py``).

    python -m pytest -m cuda tests             # every CUDA test, the slow ones included (-m replaces 'not slow')
    python -m pytest tests/gpu                 # these, without the slow tier
    ALFISH_TEST_DEVICE=cpu python -m pytest -m cuda tests/gpu -p no:cacheprovider   # the bodies on the CPU

Without CUDA every test here is skipped with a reason (``conftest.py``), so CI runs none of them.
"""
