#!/bin/bash
# Device call (issue 25, GPU_NOTES 93): the blocked engine's phase B summed in the previous position's
# frame, and the log semiring's block frame the least of the previous block's frames (blocked.py),
# against the code before, a copy of the package's src at the previous commit in $SRC_OLD
# (default .gpu/src_old: `git archive REV src | tar -x -C /tmp && mv /tmp/src .gpu/src_old`):
#   1. the gene model's float32 log Z and gradients against float64 on the 7 shorter loci: today's
#      blocked engine and one program a sequence (gene_accuracy.py --variants default,old_engine),
#      then the previous source's blocked engine;
#   2. random models: the previous source (A) against today's (B), in alternating processes
#      (src_ab.py: timings, and B's outputs against A's);
#   3. the compiled blocked-engine tests.
#     bash benchmarks/probes/frames_check.sh      (carry .gpu and .whl; results under $OUT)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:/tmp/site
OLD=${SRC_OLD:-.gpu/src_old}
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
t0=$(date +%s)
source benchmarks/probes/gene_inputs.sh
echo "inputs rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
SHORT="--loci 1,2,3,4,5,6,7"
timeout 200 python3 benchmarks/probes/gene_accuracy.py /tmp/gene_inputs.pt $OUT/gene_accuracy_new.json $SHORT \
    --variants default,old_engine > $OUT/gene_accuracy_new.log 2>&1
echo "accuracy new rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
PYTHONPATH=$PWD/$OLD:/tmp/site timeout 150 python3 benchmarks/probes/gene_accuracy.py /tmp/gene_inputs.pt \
    $OUT/gene_accuracy_prev.json $SHORT --variants default > $OUT/gene_accuracy_prev.log 2>&1
echo "accuracy prev rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
timeout $(( 480 - ($(date +%s) - t0) )) python3 benchmarks/probes/src_ab.py $OUT/src_ab.json $OLD src \
    "${SHAPES:-4,100000,960,47;16,20000,960,47;32,3000,960,47}" ${ROUNDS:-2} > $OUT/src_ab.log 2>&1
echo "src_ab rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
timeout $(( 585 - ($(date +%s) - t0) )) python3 -m pytest -q -n 6 -p no:cacheprovider -p no:benchmark -o addopts="" \
    --tb=short tests/engines/triton/test_kernels_blocked.py -k "${TESTS:-oracle or repair or helpers or sequential}" \
    > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
cat $OUT/phases.txt; tail -4 $OUT/gene_accuracy_new.log $OUT/gene_accuracy_prev.log; tail -4 $OUT/src_ab.log
grep -E "FAILED|ERROR" $OUT/tests.log | head; tail -2 $OUT/tests.log
