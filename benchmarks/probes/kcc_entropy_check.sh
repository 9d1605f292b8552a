#!/bin/bash
# Device call (issue 25): the entropy's value of a (K, C, C) transition on the engine (one forward +
# backward, E[score] from the marginals, the first segment's phantom weighted by
# `api/entropy._first_segments`). The compiled entropy tests (the interpreter's cases compiled, the
# CUDA / CPU test of test_gpu.py for both transition shapes), then `bench_distribution.py --kcc`
# (the engine's value against the float64 path's, one run).
#     bash benchmarks/probes/kcc_entropy_check.sh      (results under $OUT)
# Env: SIZES (bench_distribution --sizes, default "4,10000,64,8 2,20000,200,24"), END_S.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
t0=$(date +%s)
timeout 300 python3 -m pytest -q -n 4 -p no:cacheprovider -p no:benchmark -o addopts="" --tb=short \
    tests/engines/triton/test_kernels_entropy.py tests/engines/triton/test_gpu.py \
    -k "${TESTS:-entropy}" > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
timeout $(( ${END_S:-560} - ($(date +%s) - t0) )) python3 benchmarks/bench_distribution.py --kcc \
    --sizes ${SIZES:-4,10000,64,8 2,20000,200,24} --only entropy,entropy_torch --repeat 5 \
    --out $OUT/distribution_kcc_entropy.json > $OUT/distribution_kcc_entropy.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
cat $OUT/phases.txt
grep -E "FAILED|ERROR" $OUT/tests.log | head; tail -2 $OUT/tests.log
cat $OUT/distribution_kcc_entropy.log
