#!/bin/bash
# Device call (issue 25, GPU_NOTES 103): the direct (K, C, C) steps' duration loops through Triton's
# software pipeliner (patches/kcc_pipelined_loads.patch: tl.range(..., num_stages=DUR_STAGES), 3
# stages, and 2 in a second tree) against this tree, forward / forward+backward / Viterbi at three
# label counts (src_ab.py; outputs must be bitwise: the pipeliner moves loads, not sums), then the
# compiled (K, C, C) tests on the 3-stage tree, then (what GPU_NOTES 102 could not run) the masks and
# the entropy of a (K, C, C) model at the larger size on this tree (the engine alone).
#     bash benchmarks/probes/kcc_stages_check.sh      (builds .gpu/s3 and .gpu/s2 here; carry .gpu)
# Run the first three lines here, before the call, then the call with carry [".gpu"]:
#     rm -rf .gpu && mkdir -p .gpu/s3 .gpu/s2 && for d in s3 s2; do cp -r src .gpu/$d/ && \
#       (cd .gpu/$d && patch -p1 < ../../benchmarks/probes/patches/kcc_pipelined_loads.patch); done
#     sed -i 's/DUR_STAGES = tl.constexpr(3)/DUR_STAGES = tl.constexpr(2)/' .gpu/s2/src/torch_semimarkov/engines/triton/common.py
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
t0=$(date +%s)
AB_KCC=1 AB_PARTS=fwd,fwdbwd,viterbi AB_WARM=1 AB_RUNS=3 timeout 300 python3 benchmarks/probes/src_ab.py \
    $OUT/stages_ab.json src .gpu/s3/src,.gpu/s2/src "${SHAPES:-4,5000,64,8;2,20000,200,24;2,6000,200,47}" \
    ${ROUNDS:-2} > $OUT/stages_ab.log 2>&1
echo "ab rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
PYTHONPATH=$PWD/.gpu/s3/src timeout $(( ${TESTS_END_S:-450} - ($(date +%s) - t0) )) python3 -m pytest -v -n 8 \
    -p no:cacheprovider -p no:benchmark -o addopts="" --tb=short \
    tests/engines/triton/test_kernels_entropy.py tests/engines/triton/test_gpu.py \
    -k "${TESTS:-duration_transition or KCC or first_segments}" > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
timeout $(( ${END_S:-570} - ($(date +%s) - t0) )) python3 benchmarks/bench_distribution.py --kcc \
    --sizes ${LARGE:-2,20000,200,24} --repeat 5 --only entropy,entropy_grad,masked_fwd_bwd,masked_entropy \
    --out $OUT/distribution_kcc_masks_large.json > $OUT/distribution_kcc_masks_large.log 2>&1
echo "bench large rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
cat $OUT/phases.txt; tail -4 $OUT/stages_ab.log
grep -E "FAILED|ERROR" $OUT/tests.log | head -20; tail -2 $OUT/tests.log
tail -12 $OUT/distribution_kcc_masks_large.log
