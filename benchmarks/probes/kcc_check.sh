#!/bin/bash
# Device call (issue 25, GPU_NOTES 98): (K, C, C) transitions with states of more than 16,384 padded
# K·C values on the chunked direct recurrence. The compiled tests of the new (2, 3000, 520, 17) case
# and the plan, then `bench_genomics.py --only kcc` (the chunked engine against one program per
# sequence on the same inputs, the old engine skipped past --old-max-s).
#     bash benchmarks/probes/kcc_check.sh      (results under $OUT)
# Env: KCC_SHAPES (indices into bench_genomics.KCC_SHAPES, default 0,1), OLD_MAX_S (default 8), END_S.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
t0=$(date +%s)
timeout 240 python3 -m pytest -q -n 4 -p no:cacheprovider -p no:benchmark -o addopts="" --tb=short \
    tests/engines/triton/test_gpu.py tests/engines/triton/test_kernels_plan.py -k "520 or plan or duration_transitions" \
    > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
timeout $(( ${END_S:-585} - ($(date +%s) - t0) )) python3 benchmarks/bench_genomics.py --out $OUT/genomics_kcc.json \
    --only kcc --kcc-shapes ${KCC_SHAPES:-0,1} --old-max-s ${OLD_MAX_S:-8} > $OUT/genomics_kcc.log 2>&1
echo "kcc rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
cat $OUT/phases.txt
grep -E "FAILED|ERROR" $OUT/tests.log | head; tail -2 $OUT/tests.log
tail -12 $OUT/genomics_kcc.log
