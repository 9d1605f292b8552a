#!/bin/bash
# Device calls (issue 25, after GPU_NOTES 89): the gene model with the in-order repair's helpers.
#   PART=a  its float32 log Z and gradients against the float64 PyTorch path (probes/gene_accuracy.py:
#           the time-parallel engine with and without repair helpers, and one program a sequence),
#           on the 7 shorter of the 8 loci, then on the longest (118 kb);
#   PART=b  the gene finder's training step with and without them (bench_gene_step.py "tiled%0,tiled");
#   PART=tol the accuracy on the 7 shorter loci at fix-up tolerances $TOLS (default 1.6e-5,4e-6,1e-6);
#   PART=var the same with one plan setting changed at a time ($VARIANTS, gene_accuracy.py VARIANTS;
#           $EXTRA more options, e.g. --rounded-ref);
#   PART=ab the accuracy on the 7 shorter loci, then the training step with today's defaults only.
#     PART=a bash benchmarks/probes/gene_check.sh      (carry .gpu and .whl; results under $OUT)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
t0=$(date +%s)
source benchmarks/probes/gene_inputs.sh
# accuracy NAME LIMIT ARGS...: gene_accuracy.py into $OUT/gene_accuracy_NAME.{json,log}, at most LIMIT s
accuracy() {
  local name=$1 limit=$2; shift 2
  timeout $limit python3 benchmarks/probes/gene_accuracy.py /tmp/gene_inputs.pt $OUT/gene_accuracy_$name.json \
      "$@" > $OUT/gene_accuracy_$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
}
# step UNTIL MODES: the training step (bench_gene_step.py) until UNTIL s after the start
step() {
  timeout $(( $1 - ($(date +%s) - t0) )) python3 benchmarks/bench_gene_step.py --data .gpu/gene_data \
      --modes "$2" --runs 3 --out $OUT/gene_step.json > $OUT/gene_step.log 2>&1
  echo "step rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
}
SHORT="--loci 1,2,3,4,5,6,7"
if [ "${PART:-a}" = tol ]; then
  accuracy tols 500 $SHORT --tols ${TOLS:-1.6e-5,4e-6,1e-6}
  cat $OUT/phases.txt $OUT/gene_accuracy_tols.log
elif [ "${PART:-a}" = var ]; then
  accuracy variants 500 $SHORT --variants ${VARIANTS:-default,one_chunk,marg_log,marg_position,linear_off} $EXTRA
  cat $OUT/phases.txt $OUT/gene_accuracy_variants.log
elif [ "${PART:-a}" = ab ]; then
  accuracy short 300 $SHORT
  step 585 tiled
  cat $OUT/phases.txt $OUT/gene_accuracy_short.log; tail -12 $OUT/gene_step.log
elif [ "${PART:-a}" = a ]; then
  accuracy short 280 $SHORT
  accuracy long $(( 580 - ($(date +%s) - t0) )) --loci 0
  cat $OUT/phases.txt $OUT/gene_accuracy_short.log $OUT/gene_accuracy_long.log
else
  step 580 "tiled%0,tiled"
  cat $OUT/phases.txt; tail -12 $OUT/gene_step.log
fi
