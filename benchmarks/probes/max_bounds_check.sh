#!/bin/bash
# Device call (issue 25, GPU_NOTES 87): the max semiring's tile bounds (plan.MAX_BOUNDS) timed
# against no bounds in one process (probes/max_bounds_ab.py: random models at the genomics shapes,
# then the gene model of probes/make_gene_inputs.py), then the compiled Viterbi / bounds tests.
# VARIANTS / GENE_VARIANTS: the bound modes and phases to time (max_bounds_ab.py --variants).
#     bash benchmarks/probes/max_bounds_check.sh      (carry .gpu and .whl; results under $OUT)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
t0=$(date +%s)
source benchmarks/probes/gene_inputs.sh
timeout 400 python3 benchmarks/probes/max_bounds_ab.py $OUT/max_bounds_ab.json --gene /tmp/gene_inputs.pt \
    --variants "${VARIANTS:-0;1;1:12}" --gene-variants "${GENE_VARIANTS:-0;1;1:12}" \
    > $OUT/max_bounds_ab.log 2>&1
echo "ab rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
timeout $(( 580 - ($(date +%s) - t0) )) python3 -m pytest -v -n 8 -p no:cacheprovider -p no:benchmark -o addopts="" \
    --tb=short tests/engines/triton/test_kernels_blocked.py -k "viterbi or max_tile or max_bound" > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
cat $OUT/phases.txt; tail -20 $OUT/max_bounds_ab.log; grep -E "FAILED|ERROR" $OUT/tests.log | head; tail -2 $OUT/tests.log
