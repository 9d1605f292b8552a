#!/bin/bash
# The next device call for the memory-ring entropy (issue 25, GPU_NOTES 107-109). On an H200 first the
# (32, 3000, 960, 47) row of bench_genomics.py (both engines: the 20 ms target); then test_gpu.py's
# entropy tests (the 512 x 64 memory-ring cases have not run compiled); then a profile of one
# entropy-with-gradient call by kernel (mem_entropy_profile.py); then mem_entropy_time.py, this tree
# (anchors split over programs, note 108; the recurrences' own chunks, note 109) against 7eed512
# (neither) at two genomics shapes, one process per tree and shape. Results in one archive under $OUT.
#     rm -rf .gpu/head && mkdir -p .gpu/head && git archive 7eed512 src | tar -x -C .gpu/head
#     LIMIT=520 bash benchmarks/probes/mem_entropy_call4.sh          (carry .gpu; timeout_s ~580)
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
PYTHONPATH=$NEW timeout ${TEST_S:-150} python3 -m pytest -v -p no:cacheprovider -p no:benchmark -o addopts="" \
    --tb=short tests/engines/triton/test_gpu.py -k "entropy_gradient_on_the_engine" > $OUT/tests_gpu_entropy.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
tail -6 $OUT/tests_gpu_entropy.log
PYTHONPATH=$NEW timeout 60 python3 benchmarks/probes/mem_entropy_profile.py $OUT/profile.json > $OUT/profile.log 2>&1
echo "profile rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
head -30 $OUT/profile.log
i=0
for shape in "32,3000,960,47" "16,20000,960,47"; do
  for tree in old new; do
    left=$(( ${LIMIT:-520} - ($(date +%s) - t0) ))
    [ $left -lt 15 ] && break 2
    src=$OLD; [ $tree = new ] && src=$NEW
    PYTHONPATH=$src timeout $left python3 benchmarks/probes/mem_entropy_time.py $OUT/time_${i}_$tree.json default \
        "$shape" > $OUT/time_${i}_$tree.log 2>&1
    echo "time $shape $tree rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
    grep -v "^{" $OUT/time_${i}_$tree.log | tail -2
  done
  i=$((i + 1))
done
(cd $OUT && tar czf results.tgz --exclude results.tgz --exclude device.txt --exclude phases.txt * && \
   ls | grep -v -x -e results.tgz -e device.txt -e phases.txt | xargs rm -rf)
cat $OUT/phases.txt
