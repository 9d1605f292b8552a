#!/bin/bash
# Device call: this tree against an earlier one (PRE, e.g. `git archive <rev> src | tar -x -C .gpu/pre`)
# on the public API: both trees compiled side by side (probes/src_ab.py workers; the Triton cache is
# shared, so kernels whose source did not change compile once), then the A/B (probes/src_ab.py,
# ROUNDS rounds of 5 a tree, alternating processes), then this tree's compiled tests (TESTS, a -k
# expression over test_kernels_blocked.py). GPU_NOTES 85: PRE=.gpu/pre_pos ROUNDS=3 TESTS="own_chunks
# or backward or marginal or beside"; GPU_NOTES 86: PRE=.gpu/pre_lg SHAPES=<the first three> ROUNDS=2
# TESTS="label_groups or own_chunks or backward or marginal" LIMIT=400.
#     PRE=.gpu/pre bash benchmarks/probes/tree_ab.sh      (carry .gpu; results under $OUT)
export PYTHONUNBUFFERED=1
SH="${SHAPES:-4,100000,960,47;32,3000,960,47;16,20000,960,47;1,100000,4000,47}"
A=$PWD/${PRE:-.gpu/pre}/src; B=$PWD/src; LIMIT=${LIMIT:-575}
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
t0=$(date +%s)
for T in A B; do
  S=$A; [ $T = B ] && S=$B
  (PYTHONPATH=$S timeout 300 python3 benchmarks/probes/src_ab.py --worker "$SH" 1 /tmp/w$T.pt > $OUT/warm_$T.log 2>&1
   echo "$T rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt) &
done
wait
PYTHONPATH=$B timeout 240 python3 benchmarks/probes/src_ab.py $OUT/ab.json $A $B "$SH" ${ROUNDS:-3} > $OUT/ab.log 2>&1
echo "ab rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
PYTHONPATH=$B timeout $(( LIMIT - ($(date +%s) - t0) )) python3 -m pytest -v -n 8 -p no:cacheprovider -p no:benchmark \
    -o addopts="" --tb=short tests/engines/triton/test_kernels_blocked.py -k "${TESTS:-backward or marginal}" \
    > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
cat $OUT/phases.txt; tail -5 $OUT/ab.log; grep -E "FAILED|ERROR" $OUT/tests.log | head; tail -2 $OUT/tests.log
