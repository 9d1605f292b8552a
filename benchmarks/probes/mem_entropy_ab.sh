#!/bin/bash
# Device call for the memory-ring entropy (issue 25, GPU_NOTES 107-109): an A/B of this tree against
# an older one in .gpu/head/src (carry .gpu). On an H200 first the (32, 3000, 960, 47) row of
# bench_genomics.py (both engines: the 20 ms target); then test_gpu.py's entropy tests on this tree;
# then, with PROFILE=1, a profile of one entropy-with-gradient call by kernel (mem_entropy_profile.py);
# then mem_entropy_time.py, old tree and new tree one process each per shape (SHAPES, space-separated;
# NEW_VARIANTS: the new tree's tile variants). Results in one archive under $OUT.
#   The next call (notes 108-109 against 7eed512, with the profile):
#     rm -rf .gpu/head && mkdir -p .gpu/head && git archive 7eed512 src | tar -x -C .gpu/head
#     LIMIT=520 bash benchmarks/probes/mem_entropy_ab.sh                    (timeout_s ~580)
#   The call of note 107 (the per-entry sums against 37900af's per-tile ones; it gave the tile variants
#   to the first two shapes only):
#     PROFILE=0 NEW_VARIANTS=default,rows16,rows64 SHAPES="32,3000,960,47 16,20000,960,47 4,100000,960,47" \
#         TEST_S=170 LIMIT=480 bash benchmarks/probes/mem_entropy_ab.sh
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
if [ "${PROFILE:-1}" = 1 ]; then
  PYTHONPATH=$NEW timeout 60 python3 benchmarks/probes/mem_entropy_profile.py $OUT/profile.json > $OUT/profile.log 2>&1
  echo "profile rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
  head -30 $OUT/profile.log
fi
i=0
for shape in ${SHAPES:-32,3000,960,47 16,20000,960,47}; do
  for tree in old new; do
    left=$(( ${LIMIT:-520} - ($(date +%s) - t0) ))
    [ $left -lt 15 ] && break 2
    v=default; [ $tree = new ] && v=${NEW_VARIANTS:-default}
    src=$OLD; [ $tree = new ] && src=$NEW
    PYTHONPATH=$src timeout $left python3 benchmarks/probes/mem_entropy_time.py $OUT/time_${i}_$tree.json $v \
        "$shape" > $OUT/time_${i}_$tree.log 2>&1
    echo "time $shape $tree rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
    grep -v "^{" $OUT/time_${i}_$tree.log | tail -4
  done
  i=$((i + 1))
done
(cd $OUT && tar czf results.tgz --exclude results.tgz --exclude device.txt --exclude phases.txt * && \
   ls | grep -v -x -e results.tgz -e device.txt -e phases.txt | xargs rm -rf)
cat $OUT/phases.txt
