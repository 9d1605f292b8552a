#!/bin/bash
# Device call of GPU_NOTES 107 (issue 25): the memory-ring entropy's sums over durations folded per
# entry and reduced over their rows once a step (_mix_entry / _mix_rows) against the per-tile
# reduction (_mix_tile, the tree in .gpu/head/src: carry .gpu). On an H200 first the
# (32, 3000, 960, 47) row of bench_genomics.py; then test_gpu.py's entropy tests on the new tree;
# then mem_entropy_time.py, old tree and new tree one process each per shape. Results under $OUT in
# one archive.
#     LIMIT=480 bash benchmarks/probes/mem_entropy_call3.sh
export PYTHONUNBUFFERED=1
OLD=$PWD/.gpu/head/src NEW=$PWD/src
t0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
if grep -q H200 $OUT/device.txt; then
  PYTHONPATH=$NEW timeout 130 python3 benchmarks/bench_genomics.py --out $OUT/genomics_e0.json --only engines \
      --shapes 0 --old-max-s 4 > $OUT/genomics_e0.log 2>&1
  echo "e0 rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
  tail -4 $OUT/genomics_e0.log
fi
PYTHONPATH=$NEW timeout ${TEST_S:-170} python3 -m pytest -v -p no:cacheprovider -p no:benchmark -o addopts="" \
    --tb=short tests/engines/triton/test_gpu.py -k "entropy_gradient_on_the_engine" > $OUT/tests_gpu_entropy.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
tail -6 $OUT/tests_gpu_entropy.log
i=0
for shape in "32,3000,960,47" "16,20000,960,47" "4,100000,960,47"; do
  for tree in old new; do
    left=$(( ${LIMIT:-480} - ($(date +%s) - t0) ))
    [ $left -lt 15 ] && break 2
    v=default; [ $tree = new ] && [ $i -lt 2 ] && v=default,rows16,rows64
    src=$OLD; [ $tree = new ] && src=$NEW
    PYTHONPATH=$src timeout $left python3 benchmarks/probes/mem_entropy_time.py $OUT/time_${i}_$tree.json $v "$shape" \
        > $OUT/time_${i}_$tree.log 2>&1
    echo "time $shape $tree rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
    grep -v "^{" $OUT/time_${i}_$tree.log | tail -4
  done
  i=$((i + 1))
done
(cd $OUT && tar czf results.tgz --exclude results.tgz --exclude device.txt --exclude phases.txt * && \
   ls | grep -v -x -e results.tgz -e device.txt -e phases.txt | xargs rm -rf)
cat $OUT/phases.txt
