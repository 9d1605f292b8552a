#!/bin/bash
# Device call (issue 25, GPU_NOTES 96): the forward and beta side by side with their launches
# interleaved and their tables made once (`parallel.blocked_forward_beta`), against the code
# before (`.gpu/src_old`, the previous commit's src: beta's three phases, then the forward's
# preparation and launches). Host gaps of both trees (`host_gaps.py`), the forward+backward A/B
# (`src_ab.py`, alternating processes), then the compiled beside tests of today's tree.
#     bash benchmarks/probes/beside_launch_check.sh      (carry .gpu; results under $OUT)
# Env: TREES (host gaps of: old, new), HG_SHAPES (theirs, default SHAPES), AB_TREES (the trees
# against A = .gpu/src_old, comma-separated, default src), AB_PARTS, AB_S, ROUNDS, TESTS, END_S.
# GPU_NOTES 97's three calls (the first ran it; the other two ran scripts since folded into it, these
# settings; the tables' one kernel v1 / v2 in .gpu/src_tables / .gpu/src_tables2):
#     TREES=new AB_PARTS=fwd,fwdbwd AB_S=230 END_S=590 TESTS="duration_tables or default_period or beside or early or linear"
#     TREES=new AB_TREES=.gpu/src_tables,src AB_PARTS=fwd,fwdbwd AB_S=260 \
#         TESTS="duration_tables or marginals_beside or default_period"
#     TREES=new HG_SHAPES=32,3000,960,47 AB_TREES=.gpu/src_tables,.gpu/src_tables2,src AB_PARTS=fwd,fwdbwd \
#         AB_S=230 END_S=440 TESTS="duration_tables or default_period"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
t0=$(date +%s)
SH=${SHAPES:-32,3000,960,47;16,20000,960,47;4,100000,960,47}
TREES=${TREES:-old new}
for tree in $TREES; do
  src=$PWD/src; [ $tree = old ] && src=$PWD/.gpu/src_old
  PYTHONPATH=$src timeout 200 python3 benchmarks/probes/host_gaps.py $OUT/host_gaps_$tree.json "${HG_SHAPES:-$SH}" 7 \
      > $OUT/host_gaps_$tree.log 2>&1
  echo "host_gaps $tree rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
done
AB_PARTS=${AB_PARTS:-fwdbwd} timeout ${AB_S:-200} python3 benchmarks/probes/src_ab.py $OUT/src_ab.json .gpu/src_old ${AB_TREES:-src} "$SH" \
    ${ROUNDS:-2} > $OUT/src_ab.log 2>&1
echo "src_ab rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
PYTHONPATH=$PWD/src timeout $(( ${END_S:-585} - ($(date +%s) - t0) )) python3 -m pytest -q -n 4 -p no:cacheprovider \
    -p no:benchmark -o addopts="" --tb=short tests/engines/triton/test_kernels_blocked.py tests/engines/triton/test_gpu.py \
    -k "${TESTS:-beside or early}" > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
cat $OUT/phases.txt
for tree in $TREES; do echo "== $tree"; grep -E "fwdbwd" $OUT/host_gaps_$tree.log; done
tail -9 $OUT/src_ab.log
grep -E "FAILED|ERROR" $OUT/tests.log | head; tail -2 $OUT/tests.log
