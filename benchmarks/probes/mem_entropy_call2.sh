#!/bin/bash
# The second device call of GPU_NOTES 107 (issue 25): on an H200 first the (32, 3000, 960, 47) row of
# bench_genomics.py (both engines); then the CUDA tests of the entropy's gradient on the engine
# (test_gpu.py, a (K, C, C) model and a 512 x 64 memory ring, plain and masked); then the memory-ring
# entropy's times at the genomics shapes with three tile sizes (mem_entropy_time.py). Results under
# $OUT, packed in one archive.
#     LIMIT=430 bash benchmarks/probes/mem_entropy_call2.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=${SRC:-$PWD/src}
t0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
if grep -q H200 $OUT/device.txt; then
  timeout 130 python3 benchmarks/bench_genomics.py --out $OUT/genomics_e0.json --only engines --shapes 0 \
      --old-max-s 4 > $OUT/genomics_e0.log 2>&1
  echo "e0 rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
  tail -4 $OUT/genomics_e0.log
fi
timeout ${TEST_S:-170} python3 -m pytest -v -p no:cacheprovider -p no:benchmark -o addopts="" --tb=short \
    tests/engines/triton/test_gpu.py -k "entropy_gradient_on_the_engine" > $OUT/tests_gpu_entropy.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
tail -6 $OUT/tests_gpu_entropy.log
left=$(( ${LIMIT:-430} - ($(date +%s) - t0) ))
timeout $left python3 benchmarks/probes/mem_entropy_time.py $OUT/mem_entropy_time.json default,rows16,rows64 \
    > $OUT/mem_entropy_time.log 2>&1
echo "time rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
cat $OUT/mem_entropy_time.log | grep -v "^{"
(cd $OUT && tar czf results.tgz --exclude results.tgz --exclude device.txt --exclude phases.txt * && \
   ls | grep -v -x -e results.tgz -e device.txt -e phases.txt | xargs rm -rf)
cat $OUT/phases.txt
