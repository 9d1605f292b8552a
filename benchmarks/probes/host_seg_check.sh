#!/bin/bash
# Device call (issue 25, GPU_NOTES 104): three trees on the public API, forward and forward+backward
# (probes/src_ab.py, alternating processes, bitwise comparison against the first): A = the previous
# commit (.gpu/base), B = this tree (the marginal tiles' own chunks, plan.seg_chunks; forbid's scalar
# fill; value_stats in fewer operations), C = B with the forward launched before beta
# (parallel.BESIDE_FIRST = "forward", .gpu/fwd). Then host_gaps.py (HOST_MARKS_API=1) on B and C and
# host_steps.py on B at (32, 3000, 960, 47), then B's compiled tests (TESTS over test_kernels_blocked.py).
# Before the call (carry .gpu):
#     rm -rf .gpu && mkdir -p .gpu/base .gpu/fwd && git archive HEAD src | tar -x -C .gpu/base && cp -r src .gpu/fwd/ && \
#       sed -i 's/^BESIDE_FIRST = "beta"/BESIDE_FIRST = "forward"/' .gpu/fwd/src/torch_semimarkov/engines/triton/parallel.py
export PYTHONUNBUFFERED=1
SH="${SHAPES:-32,3000,960,47;8,3000,960,47;1,100000,4000,47;16,20000,960,47;4,100000,960,47}"
A=$PWD/.gpu/base/src; B=$PWD/src; C=$PWD/.gpu/fwd/src; LIMIT=${LIMIT:-560}
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
t0=$(date +%s)
PYTHONPATH=$B AB_PARTS=fwd,fwdbwd timeout ${AB_S:-330} python3 benchmarks/probes/src_ab.py $OUT/ab.json $A $B,$C "$SH" \
    ${ROUNDS:-2} > $OUT/ab.log 2>&1
echo "ab rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
for T in B C; do
  S=$B; [ $T = C ] && S=$C
  PYTHONPATH=$S HOST_MARKS_API=1 timeout 60 python3 benchmarks/probes/host_gaps.py $OUT/host_gaps_$T.json \
      "32,3000,960,47" 9 > $OUT/host_gaps_$T.log 2>&1
  echo "host $T rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
done
PYTHONPATH=$B timeout 40 python3 benchmarks/probes/host_steps.py $OUT/host_steps.json "32,3000,960,47" 200 \
    > $OUT/host_steps.log 2>&1
echo "steps rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
PYTHONPATH=$B timeout $(( LIMIT - ($(date +%s) - t0) )) python3 -m pytest -v -n 8 -p no:cacheprovider -p no:benchmark \
    -o addopts="" --tb=short tests/engines/triton/test_kernels_blocked.py \
    -k "${TESTS:-own_chunks or last_wave or marginal or beside or backward}" > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
cat $OUT/phases.txt; tail -6 $OUT/ab.log; grep -E "fwdbwd|first_launch" $OUT/host_gaps_*.log | head -4
cat $OUT/host_steps.log; grep -E "FAILED|ERROR" $OUT/tests.log | head; tail -2 $OUT/tests.log
