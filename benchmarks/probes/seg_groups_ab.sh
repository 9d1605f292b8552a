#!/bin/bash
# Device call (issue 25, GPU_NOTES 86): the marginal tiles split over label groups
# (plan.seg_label_groups) against the tree before it (.gpu/pre_lg/src, `git archive <rev> src`):
# both trees compiled side by side (the tiles' kernel differs: two cold compiles at once), the A/B
# (probes/src_ab.py, 2 rounds of 5 a tree), then the compiled blocked backward tests of this tree.
#     bash benchmarks/probes/seg_groups_ab.sh      (carry .gpu; results under $OUT)
export PYTHONUNBUFFERED=1
SH="${SHAPES:-4,100000,960,47;32,3000,960,47;16,20000,960,47}"
A=$PWD/.gpu/pre_lg/src; B=$PWD/src
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
t0=$(date +%s)
(PYTHONPATH=$A timeout 230 python3 benchmarks/probes/src_ab.py --worker "$SH" 1 /tmp/wa.pt > $OUT/warm_a.log 2>&1; echo "A rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt) &
(PYTHONPATH=$B timeout 230 python3 benchmarks/probes/src_ab.py --worker "$SH" 1 /tmp/wb.pt > $OUT/warm_b.log 2>&1; echo "B rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt) &
wait
PYTHONPATH=$B timeout 150 python3 benchmarks/probes/src_ab.py $OUT/ab.json $A $B "$SH" 2 > $OUT/ab.log 2>&1
echo "ab rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
PYTHONPATH=$B timeout $(( 400 - ($(date +%s) - t0) )) python3 -m pytest -v -n 8 -p no:cacheprovider -p no:benchmark \
    -o addopts="" --tb=short tests/engines/triton/test_kernels_blocked.py \
    -k "label_groups or own_chunks or backward or marginal" > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
cat $OUT/phases.txt; tail -5 $OUT/ab.log; grep -E "FAILED|ERROR" $OUT/tests.log | head; tail -2 $OUT/tests.log
