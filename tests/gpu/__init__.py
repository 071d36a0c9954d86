"""GPU tests (marker ``cuda``): learning with fp32/fp16/bf16 on CUDA, no host sync in the update path, fp16 loss
scaling, compiled (CUDA-graph) updates, what AMP keeps in float32, GPU checkpoints played and resumed on the CPU,
device errors, data-parallel training on CUDA (``test_ddp_cuda.py``), compiled updates that never recompile after
their warm-up, for every algorithm (``test_no_recompile.py``), and replay on the device with frame stacking,
hindsight relabelling, RLPD mixing and ALF-style hybrid training (``test_device_replay.py``).
``python -m alfish.tools.gpu_check`` runs them with the other GPU checks and writes one report.

    python -m pytest -m cuda tests             # every CUDA test, the slow ones included (-m replaces 'not slow')
    python -m pytest tests/gpu                 # these, without the slow tier
    ALFISH_TEST_DEVICE=cpu python -m pytest -m cuda tests/gpu -p no:cacheprovider   # the bodies on the CPU

Without CUDA every test here is skipped with a reason (``conftest.py``), so CI runs none of them.
"""
