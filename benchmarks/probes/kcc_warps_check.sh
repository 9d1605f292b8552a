#!/bin/bash
# Device call (issue 25): warps of the (K, C, C) engine's time-parallel programs (GPU_NOTES 102),
# 4 (.gpu/w4, the tree with DUR_PARALLEL_WARPS = 4) against this tree's, at three label counts,
# forward / forward+backward / Viterbi; then the compiled (K, C, C) entropy and mask tests, and the
# masks and the entropy timed at the larger size (the engine alone: the float64 path takes minutes).
#     rm -rf .gpu && mkdir -p .gpu/w4 && cp -r src .gpu/w4/
#     sed -i 's/^DUR_PARALLEL_WARPS = 8/DUR_PARALLEL_WARPS = 4/' .gpu/w4/src/torch_semimarkov/engines/triton/plan.py
#     bash benchmarks/probes/kcc_warps_check.sh      (carry .gpu; results under $OUT)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
t0=$(date +%s)
AB_KCC=1 AB_PARTS=fwd,fwdbwd,viterbi AB_WARM=1 AB_RUNS=3 timeout 200 python3 benchmarks/probes/src_ab.py \
    $OUT/warps_ab.json .gpu/w4/src src "${SHAPES:-4,5000,64,8;2,20000,200,24;2,6000,200,47}" ${ROUNDS:-2} \
    > $OUT/warps_ab.log 2>&1
echo "ab rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
timeout 150 python3 -m pytest -v -n 8 -p no:cacheprovider -p no:benchmark -o addopts="" --tb=short \
    tests/engines/triton/test_kernels_entropy.py tests/engines/triton/test_gpu.py \
    -k "${TESTS:-duration_transition or KCC}" > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
timeout $(( ${END_S:-480} - ($(date +%s) - t0) )) python3 benchmarks/bench_distribution.py --kcc \
    --sizes ${LARGE:-2,20000,200,24} --repeat 5 --only entropy,entropy_grad,masked_fwd_bwd,masked_entropy \
    --out $OUT/distribution_kcc_masks_large.json > $OUT/distribution_kcc_masks_large.log 2>&1
echo "bench large rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
cat $OUT/phases.txt; tail -4 $OUT/warps_ab.log
grep -E "FAILED|ERROR" $OUT/tests.log | head -20; tail -2 $OUT/tests.log
tail -12 $OUT/distribution_kcc_masks_large.log
