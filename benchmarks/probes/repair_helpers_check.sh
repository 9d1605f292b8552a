#!/bin/bash
# Device call (issue 25, GPU_NOTES 89): the in-order repair's own helpers (plan.REPAIR_HELPERS) timed
# against none in one process (probes/repair_helpers_ab.py: the gene model of probes/make_gene_inputs.py,
# then random models), then the compiled helper / repair tests.
#     bash benchmarks/probes/repair_helpers_check.sh      (carry .gpu and .whl; results under $OUT)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
t0=$(date +%s)
source benchmarks/probes/gene_inputs.sh
# the compiled tests first, in the background on the same GPU (their timings are not the point)
timeout 400 python3 -m pytest -v -n 6 -p no:cacheprovider -p no:benchmark -o addopts="" --tb=short \
    tests/engines/triton/test_kernels_blocked.py -k "repair or helpers or never_converge" > $OUT/tests.log 2>&1 &
tp=$!
wait $tp
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
timeout $(( 570 - ($(date +%s) - t0) )) python3 benchmarks/probes/repair_helpers_ab.py $OUT/repair_helpers_ab.json \
    --gene /tmp/gene_inputs.pt --shapes "${SHAPES:-4,100000,960,47;16,20000,960,47}" --rounds ${ROUNDS:-5} \
    > $OUT/repair_helpers_ab.log 2>&1
echo "ab rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
cat $OUT/phases.txt; tail -14 $OUT/repair_helpers_ab.log; grep -E "FAILED|ERROR" $OUT/tests.log | head; tail -2 $OUT/tests.log
