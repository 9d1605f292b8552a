#!/bin/bash
# One short device call (issue 25, GPU_NOTES 106, the session's last device time): on an H200 first
# the (32, 3000, 960, 47) row of bench_genomics.py (both engines), then mem_entropy_check.sh (the
# memory-ring entropy's compiled tests, engine against the float64 path, times), all in LIMIT
# seconds; results in one archive (a call brings back 8 files).
#     SRC=$PWD/.gpu/head/src LIMIT=420 bash benchmarks/probes/mem_entropy_call.sh   (carry .gpu)
export PYTHONUNBUFFERED=1 PYTHONPATH=${SRC:-$PWD/src}
t0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
if grep -q H200 $OUT/device.txt; then
  timeout 130 python3 benchmarks/bench_genomics.py --out $OUT/genomics_e0.json --only engines --shapes 0 \
      --old-max-s 4 > $OUT/genomics_e0.log 2>&1
  echo "e0 rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
  tail -4 $OUT/genomics_e0.log
fi
mkdir -p $OUT/mem
left=$(( ${LIMIT:-420} - ($(date +%s) - t0) ))
OUT=$OUT/mem TEST_S=${TEST_S:-140} LIMIT=$left timeout $left bash benchmarks/probes/mem_entropy_check.sh
echo "mem rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
(cd $OUT && tar czf results.tgz --exclude results.tgz --exclude device.txt --exclude phases.txt * && \
   ls | grep -v -x -e results.tgz -e device.txt -e phases.txt | xargs rm -rf)
cat $OUT/phases.txt
