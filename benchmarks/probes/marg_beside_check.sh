#!/bin/bash
# Device call (issue 25, GPU_NOTES 97): the blocked engine's duration tables from one kernel
# (`tables.duration_tables`, tree .gpu/src_tables) and, on top of it, the backward's per-position
# marginal kernel beside the marginal tiles (`plan.marg_beside`, today's src), against the code
# before both (`.gpu/src_old`). Host gaps of today's tree, the A/B of the three trees (alternating
# processes), then the compiled tests of both changes.
#     bash benchmarks/probes/marg_beside_check.sh      (carry .gpu; results under $OUT)
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
t0=$(date +%s)
SH=${SHAPES:-32,3000,960,47;16,20000,960,47;4,100000,960,47}
PYTHONPATH=$PWD/src timeout 200 python3 benchmarks/probes/host_gaps.py $OUT/host_gaps_new.json "$SH" 7 \
    > $OUT/host_gaps_new.log 2>&1
echo "host_gaps rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
AB_PARTS=fwd,fwdbwd timeout ${AB_S:-260} python3 benchmarks/probes/src_ab.py $OUT/src_ab.json .gpu/src_old \
    .gpu/src_tables,src "$SH" ${ROUNDS:-2} > $OUT/src_ab.log 2>&1
echo "src_ab rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
PYTHONPATH=$PWD/src timeout $(( ${END_S:-585} - ($(date +%s) - t0) )) python3 -m pytest -q -n 4 -p no:cacheprovider \
    -p no:benchmark -o addopts="" --tb=short tests/engines/triton/test_kernels_blocked.py tests/engines/triton/test_gpu.py \
    -k "${TESTS:-duration_tables or marginals_beside or default_period}" > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
cat $OUT/phases.txt
grep -E "fwdbwd" $OUT/host_gaps_new.log
tail -8 $OUT/src_ab.log
grep -E "FAILED|ERROR|passed|failed" $OUT/tests.log | head; tail -2 $OUT/tests.log
