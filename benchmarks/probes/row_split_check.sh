#!/bin/bash
# Device calls (issue 25, GPU_NOTES 81-82): the helpers that split rows (this tree) against the code
# before them (.gpu/pre_split/src, `git archive <rev> src`).
#   PART=ab    both trees compiled side by side (the Triton cache is shared; a blocked variant takes
#              tens of seconds cold), then the A/B timed alone, then the long-segment helper check;
#   PART=tests the compiled helper / beside / blocked tests on this tree (run it right after PART=ab,
#              while the machine is warm, so that most variants are compiled already).
#     PART=ab bash benchmarks/probes/row_split_check.sh      (carry .gpu; results under $OUT)
export PYTHONUNBUFFERED=1
SH="${SHAPES:-1,100000,4000,47;32,3000,960,47;4,100000,960,47}"
A=$PWD/.gpu/pre_split/src; B=$PWD/src
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
t0=$(date +%s)
if [ "${PART:-ab}" = ab ]; then
  (PYTHONPATH=$A timeout 300 python3 benchmarks/probes/src_ab.py --worker "$SH" 1 /tmp/wa.pt > $OUT/warm_a.log 2>&1; echo "A rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt) &
  (PYTHONPATH=$B timeout 300 python3 benchmarks/probes/src_ab.py --worker "$SH" 1 /tmp/wb.pt > $OUT/warm_b.log 2>&1; echo "B rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt) &
  wait
  PYTHONPATH=$B timeout 180 python3 benchmarks/probes/src_ab.py $OUT/ab.json $A $B "$SH" 2 > $OUT/ab.log 2>&1
  echo "ab rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
  PYTHONPATH=$B timeout $(( 570 - ($(date +%s) - t0) )) python3 benchmarks/probes/helpers_check.py $OUT/helpers_check.json > $OUT/helpers_check.log 2>&1
  echo "check rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
  cat $OUT/phases.txt; tail -8 $OUT/ab.log; tail -3 $OUT/helpers_check.log
else
  PYTHONPATH=$B timeout 560 python3 -m pytest -v -n 8 -p no:cacheprovider -p no:benchmark -o addopts="" --tb=short \
      tests/engines/triton/test_kernels_blocked.py tests/engines/triton/test_gpu.py \
      -k "helper or beside or multiprocessors or linear or blocked" > $OUT/tests.log 2>&1
  echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
  cat $OUT/phases.txt; grep -E "FAILED|ERROR" $OUT/tests.log | head; tail -3 $OUT/tests.log
fi
