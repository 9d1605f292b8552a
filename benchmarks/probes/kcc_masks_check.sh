#!/bin/bash
# Device call (issue 25): masks and the entropy (value and gradient) of a (K, C, C) transition on the engine.
# The compiled tests (the interpreter's (K, C, C) mask and entropy cases compiled; the CUDA tests of
# test_gpu.py for masks and the distribution calls), then `bench_distribution.py --kcc`: the
# engine's masked forward+backward and entropy against the float64 PyTorch path at the smaller
# size, the engine alone at the larger (the float64 path takes minutes there); then where a (K, C, C)
# forward+backward spends its time (`profile_fwdbwd.py ... kcc`, CUDA time per kernel).
#     bash benchmarks/probes/kcc_masks_check.sh      (results under $OUT)
# Env: TESTS (pytest -k), SMALL / LARGE (bench_distribution --sizes), PROFILE (B,T,K,C), END_S.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
t0=$(date +%s)
timeout 330 python3 -m pytest -q -n 4 -p no:cacheprovider -p no:benchmark -o addopts="" --tb=short \
    tests/engines/triton/test_kernels_masks.py tests/engines/triton/test_kernels_entropy.py \
    tests/engines/triton/test_gpu.py -k "${TESTS:-duration or masks or topk_samples or kcc or KCC or gradient}" > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
timeout $(( ${END_S:-540} - ($(date +%s) - t0) )) python3 benchmarks/bench_distribution.py --kcc \
    --sizes ${SMALL:-4,5000,64,8} --repeat 5 \
    --only entropy,entropy_torch,entropy_grad,entropy_grad_torch,masked_fwd_bwd,masked_fwd_bwd_torch,masked_entropy \
    --out $OUT/distribution_kcc_masks_small.json > $OUT/distribution_kcc_masks.log 2>&1
echo "bench small rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
timeout $(( ${END_S:-540} - ($(date +%s) - t0) )) python3 benchmarks/bench_distribution.py --kcc \
    --sizes ${LARGE:-2,20000,200,24} --repeat 5 --only entropy,entropy_grad,masked_fwd_bwd,masked_entropy \
    --out $OUT/distribution_kcc_masks_large.json >> $OUT/distribution_kcc_masks.log 2>&1
echo "bench large rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
timeout $(( ${END_S:-540} - ($(date +%s) - t0) )) python3 benchmarks/probes/profile_fwdbwd.py \
    $OUT/kcc_profile.json ${PROFILE:-1,10000,500,47} kcc > $OUT/kcc_profile.log 2>&1
echo "profile rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
cat $OUT/phases.txt
grep -E "FAILED|ERROR" $OUT/tests.log | head -20; tail -3 $OUT/tests.log
cat $OUT/distribution_kcc_masks.log
head -30 $OUT/kcc_profile.log
