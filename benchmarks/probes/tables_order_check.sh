#!/bin/bash
# Device call (issue 25, GPU_NOTES 97): the blocked engine's duration tables from one kernel, first
# version (.gpu/src_tables: a program per label tile) and second (.gpu/src_tables2: running
# statistics reduced once, a program per label tile and 32 rows), and today's src (the second
# version, with the forward launched before beta side by side), against the code before all three
# (.gpu/src_old). Host gaps of today's tree at (32, 3000), the A/B of the four trees (alternating
# processes), then the compiled tables tests.
#     bash benchmarks/probes/tables_order_check.sh      (carry .gpu; results under $OUT)
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
t0=$(date +%s)
SH=${SHAPES:-32,3000,960,47;16,20000,960,47;4,100000,960,47}
PYTHONPATH=$PWD/src timeout 170 python3 benchmarks/probes/host_gaps.py $OUT/host_gaps_new.json "32,3000,960,47" 7 \
    > $OUT/host_gaps_new.log 2>&1
echo "host_gaps rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
AB_PARTS=fwd,fwdbwd timeout ${AB_S:-230} python3 benchmarks/probes/src_ab.py $OUT/src_ab.json .gpu/src_old \
    .gpu/src_tables,.gpu/src_tables2,src "$SH" ${ROUNDS:-2} > $OUT/src_ab.log 2>&1
echo "src_ab rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
PYTHONPATH=$PWD/src timeout $(( ${END_S:-440} - ($(date +%s) - t0) )) python3 -m pytest -q -n 4 -p no:cacheprovider \
    -p no:benchmark -o addopts="" --tb=short tests/engines/triton/test_kernels_blocked.py \
    -k "${TESTS:-duration_tables or default_period}" > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
cat $OUT/phases.txt
grep -E "fwdbwd|_duration_tables|_blk_chunks_kernel:1" $OUT/host_gaps_new.log | head -8
tail -9 $OUT/src_ab.log
grep -E "FAILED|ERROR|passed|failed" $OUT/tests.log | head -5
