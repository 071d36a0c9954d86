python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 3
export PYTHONUNBUFFERED=1
(ALFISH_TEST_DEVICE=cuda timeout 330 python3 -m pytest -v -rfE --tb=short -p no:cacheprovider --timeout 120 --durations=0 tests/gpu/test_ddp_cuda.py tests/gpu/test_device_errors.py tests/gpu/test_learning_on_device.py tests/gpu/test_no_host_sync.py tests/gpu/test_compiled_updates.py > $OUT/cuda_tests_rest.log 2>&1; echo "rc=$?" >> $OUT/cuda_tests_rest.log) &
timeout 120 python3 .diag/compile_diag.py supervised sac > $OUT/compile_diag.log 2>&1; echo "diag rc=$?"
grep -E "^(BARE|ALFISH)" $OUT/compile_diag.log
timeout 170 python3 tools/bench/bench_gpu.py --device cuda --quick --algos sac td3 ppo --variants fp32 tf32 compiled --skip_updates --json $OUT/bench.json > $OUT/bench.log 2>&1; echo "bench rc=$?"; tail -30 $OUT/bench.log
wait
tail -60 $OUT/cuda_tests_rest.log
