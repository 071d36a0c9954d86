python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 3
export PYTHONUNBUFFERED=1 ALFISH_TEST_DEVICE=cuda
S=$(date +%s)
(timeout 165 python3 -m pytest -v -n 4 -p no:cacheprovider -rfE --tb=short --durations=15 tests/gpu --ignore=tests/gpu/test_no_recompile.py --ignore=tests/gpu/test_device_replay.py > $OUT/cuda_tests_n4.log 2>&1; echo "rc=$? wall=$(( $(date +%s) - S ))" >> $OUT/cuda_tests_n4.log) &
timeout 165 python3 -m pytest -v -p no:cacheprovider -rfE --tb=short --durations=0 tests/gpu/test_no_recompile.py -k "sac or ppo or (td3 and not critic)" > $OUT/no_recompile.log 2>&1; echo "no_recompile rc=$? wall=$(( $(date +%s) - S ))"
grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/no_recompile.log | tail -8
wait
grep -E "passed|failed|rc=" $OUT/cuda_tests_n4.log | tail -4
