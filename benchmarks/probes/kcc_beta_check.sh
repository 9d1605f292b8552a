#!/bin/bash
# Device call (issue 25): the (K, C, C) beta step from a transposed transition (GPU_NOTES 102), A/B
# against the previous tree, against 8 warps and against per-entry running sums (TREES: .gpu/ew, the
# direct steps' log-semiring sums kept per tile entry, reduced once a position, 8 warps), then the
# compiled tests of the (K, C, C) masks and entropy (GPU_NOTES 101) and their timings.
#     rm -rf .gpu && mkdir -p .gpu/pre .gpu/w8 && git archive <rev> src | tar -x -C .gpu/pre
#     cp -r src .gpu/w8/ && sed -i 's/^DUR_PARALLEL_WARPS = 4/DUR_PARALLEL_WARPS = 8/' .gpu/w8/src/torch_semimarkov/engines/triton/plan.py
#     bash benchmarks/probes/kcc_beta_check.sh      (carry .gpu; results under $OUT)
# Env: SHAPES (src_ab's, KCC), ROUNDS, TESTS (pytest -k), SMALL (bench_distribution --sizes), END_S.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
t0=$(date +%s)
AB_KCC=1 AB_PARTS=${AB_PARTS:-fwd,fwdbwd} AB_WARM=1 AB_RUNS=3 timeout 240 python3 benchmarks/probes/src_ab.py \
    $OUT/beta_ab.json .gpu/pre/src ${TREES:-src,.gpu/w8/src,.gpu/ew/src} "${SHAPES:-2,6000,200,47}" ${ROUNDS:-2} \
    > $OUT/beta_ab.log 2>&1
echo "ab rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
timeout 250 python3 -m pytest -q -n 6 -p no:cacheprovider -p no:benchmark -o addopts="" --tb=short \
    tests/engines/triton/test_kernels_masks.py tests/engines/triton/test_kernels_entropy.py \
    tests/engines/triton/test_gpu.py tests/engines/triton/test_kernels_backward.py \
    -k "${TESTS:-duration or masks or kcc or KCC or gradient or entropy}" > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
timeout $(( ${END_S:-560} - ($(date +%s) - t0) )) python3 benchmarks/bench_distribution.py --kcc \
    --sizes ${SMALL:-4,5000,64,8} --repeat 5 \
    --only entropy,entropy_grad,masked_fwd_bwd,masked_entropy,entropy_torch,entropy_grad_torch,masked_fwd_bwd_torch \
    --out $OUT/distribution_kcc_masks_small.json > $OUT/distribution_kcc_masks.log 2>&1
echo "bench small rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
cat $OUT/phases.txt; cat $OUT/beta_ab.log | tail -4
grep -E "FAILED|ERROR" $OUT/tests.log | head -20; tail -3 $OUT/tests.log
cat $OUT/distribution_kcc_masks.log | tail -20
