#!/bin/bash
# Device calls (issue 25, GPU_NOTES 98): (K, C, C) transitions with states of more than 16,384 padded
# K·C values on the chunked direct recurrence. The compiled tests (TESTS: a -k filter of test_gpu.py
# and test_kernels_plan.py), then `bench_genomics.py --only kcc` (the chunked engine against one
# program per sequence on the same inputs, the old engine skipped past --old-max-s), then (AB=1) the
# forward of .gpu/src_old against src at AB_SHAPE with a (K, C, C) transition (`src_ab.py`, AB_KCC=1).
#     bash benchmarks/probes/kcc_check.sh      (carry .gpu for AB=1; results under $OUT)
# Env: TESTS, KCC_SHAPES (indices into bench_genomics.KCC_SHAPES, default 0,1), OLD_MAX_S (default 8),
# KCC_S (seconds for the bench), AB, AB_SHAPE, END_S. The first call: the defaults; the second:
#     TESTS="KCC and 80 or plan" KCC_S=330 AB=1 END_S=585
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
t0=$(date +%s)
timeout 240 python3 -m pytest -q -n 4 -p no:cacheprovider -p no:benchmark -o addopts="" --tb=short \
    tests/engines/triton/test_gpu.py tests/engines/triton/test_kernels_plan.py \
    -k "${TESTS:-520 or plan or duration_transitions}" > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
timeout $(( ${KCC_S:-585} - ($(date +%s) - t0) )) python3 benchmarks/bench_genomics.py --out $OUT/genomics_kcc.json \
    --only kcc --kcc-shapes ${KCC_SHAPES:-0,1} --old-max-s ${OLD_MAX_S:-8} > $OUT/genomics_kcc.log 2>&1
echo "kcc rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
if [ "${AB:-0}" = 1 ]; then
  AB_KCC=1 AB_PARTS=fwd AB_RUNS=2 AB_WARM=1 timeout $(( ${END_S:-585} - ($(date +%s) - t0) )) \
      python3 benchmarks/probes/src_ab.py $OUT/src_ab_kcc.json .gpu/src_old src "${AB_SHAPE:-1,20000,500,47}" 2 \
      > $OUT/src_ab_kcc.log 2>&1
  echo "src_ab rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
  tail -4 $OUT/src_ab_kcc.log
fi
cat $OUT/phases.txt
grep -E "FAILED|ERROR" $OUT/tests.log | head; tail -2 $OUT/tests.log
tail -12 $OUT/genomics_kcc.log
