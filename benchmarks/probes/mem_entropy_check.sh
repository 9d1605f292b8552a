#!/bin/bash
# Device call (issue 25, GPU_NOTES 106): the entropy's gradient of rings too large for registers on
# the engine (entropy._ent_chunks_kernel MEM). Its compiled tests (on CUDA the whole product of the
# blocked entropy cases and the dense kernels), then engine against the float64 path at one gene
# shape (mem_entropy_check.py, plain and masked), then bench_distribution.py's forward+backward and
# entropy with gradient at the genomics shapes (the float64 path only at the small one).
#     bash benchmarks/probes/mem_entropy_check.sh      (results under $OUT)
export PYTHONUNBUFFERED=1 PYTHONPATH=${SRC:-$PWD/src}
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
t0=$(date +%s)
timeout ${TEST_S:-200} python3 -m pytest -v -p no:cacheprovider -p no:benchmark -o addopts="" --tb=short \
    tests/engines/triton/test_kernels_entropy.py tests/engines/triton/test_kernels_dense.py \
    tests/engines/triton/test_gpu.py -k "blocked or dense or entropy_gradient_on_the_engine" > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
tail -3 $OUT/tests.log
for m in plain masked; do
  timeout 120 python3 benchmarks/probes/mem_entropy_check.py $OUT/check_$m.json "${CHECK_SHAPE:-2,3000,960,47}" $m \
      > $OUT/check_$m.log 2>&1
  echo "check $m rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
done
left=$(( ${LIMIT:-560} - ($(date +%s) - t0) ))
timeout $left python3 benchmarks/bench_distribution.py --sizes 4,100000,960,47 16,20000,960,47 32,3000,960,47 \
    --only fwd_bwd,entropy_grad --repeat 3 --out $OUT/ent_bench.json > $OUT/ent_bench.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
cat $OUT/phases.txt; grep -h "rel\|_ms\|plans" $OUT/check_*.log | head -20; tail -12 $OUT/ent_bench.log
