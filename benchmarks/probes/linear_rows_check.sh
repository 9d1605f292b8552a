#!/bin/bash
# Device call (issue 25, GPU_NOTES 95): the blocked engine's linear-space block sums without a
# reduction over each tile's rows (`blocked._linear_rows`: two passes, the rows' largest value and
# the products kept per row slot and reduced once), against the code before, at the linear tiles
# each tree sets (`plan.LINEAR_TILE`). Trees (made by the caller, see GPU_NOTES 95):
#   A .gpu/src_old  the previous commit's src, its default tile (32, 64, 16)
#   B .gpu/src_b    today's src, (32, 32, 16)     C .gpu/src_c  today's, (64, 16, 16)
#   D .gpu/src_d    the previous commit's src, (64, 32, 16) (GPU_NOTES 94's candidate)
# then the compiled linear-sum tests of today's tree.
#     bash benchmarks/probes/linear_rows_check.sh      (carry .gpu; results under $OUT)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
t0=$(date +%s)
AB_PARTS=${AB_PARTS:-fwd,fwdbwd} timeout ${AB_S:-470} python3 benchmarks/probes/src_ab.py $OUT/src_ab.json .gpu/src_old \
    ${TREES:-.gpu/src_b,.gpu/src_c,.gpu/src_d} \
    "${SHAPES:-4,100000,960,47;16,20000,960,47;32,3000,960,47;1,100000,4000,47}" ${ROUNDS:-2} > $OUT/src_ab.log 2>&1
echo "src_ab rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
timeout $(( 585 - ($(date +%s) - t0) )) python3 -m pytest -q -n 6 -p no:cacheprovider -p no:benchmark -o addopts="" \
    --tb=short tests/engines/triton/test_kernels_blocked.py tests/engines/triton/test_gpu.py \
    -k "${TESTS:-linear or oracle}" > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
cat $OUT/phases.txt; tail -8 $OUT/src_ab.log
grep -E "FAILED|ERROR" $OUT/tests.log | head; tail -2 $OUT/tests.log
