#!/bin/bash
# Device call (issue 25): samples of a (K, C, C) transition on the engine (the end-node walk,
# `traceback._draw_kcc`). The compiled sampling tests (the kernel walk against the reference walk,
# the chi-square test of the engine's samples on CUDA for both transition shapes, the CUDA / CPU
# test of test_gpu.py), then `bench_distribution.py --kcc` (the engine's samples against the
# PyTorch path's, one run).
#     bash benchmarks/probes/kcc_sample_check.sh      (results under $OUT)
# Env: SIZES (bench_distribution --sizes, default "4,10000,64,8 2,20000,200,24"), END_S.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
t0=$(date +%s)
timeout 300 python3 -m pytest -q -n 4 -p no:cacheprovider -p no:benchmark -o addopts="" --tb=short \
    tests/engines/triton/test_kernels_sample.py tests/api/test_distribution.py tests/engines/triton/test_gpu.py \
    -k "${TESTS:-kernel_walk or kcc or samples_follow or topk_samples_entropy or public_sampling}" > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
timeout $(( ${END_S:-560} - ($(date +%s) - t0) )) python3 benchmarks/bench_distribution.py --kcc \
    --sizes ${SIZES:-4,10000,64,8 2,20000,200,24} --only sample16,sample16_torch --repeat 5 \
    --out $OUT/distribution_kcc.json > $OUT/distribution_kcc.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
cat $OUT/phases.txt
grep -E "FAILED|ERROR" $OUT/tests.log | head; tail -2 $OUT/tests.log
cat $OUT/distribution_kcc.log
