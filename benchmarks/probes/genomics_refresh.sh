#!/bin/bash
# Device calls (issue 25, GPU_NOTES 84): `bench_genomics.py` rerun whole on today's code, so that the
# committed genomics results and their plot are one engine's numbers (both engines in one run).
#   PART=a  engines (old engine where its forward takes at most 4 s), accuracy, fix-up counts;
#   PART=e  engines only, one process a shape (SHAPES, indices into bench_genomics.SHAPES; default
#           0,1,2,3), each its own genomics_e<i>.json, so that a call cut short keeps the shapes it ran
#   PART=b  the gene model's inputs (the GHMM over GeneGrammar, order 3, smoothing 2, K = 960, the
#           8 longest genes.gb.test loci; needs .gpu/gene_data and the biopython wheel in .whl),
#           its section, then the K·C sweep.
#     PART=a bash benchmarks/probes/genomics_refresh.sh      (carry .gpu and .whl; results under $OUT)
# SRC: the package's source to measure (default ./src; e.g. .gpu/head/src, a committed tree carried beside a
# working tree in progress)
export PYTHONUNBUFFERED=1 PYTHONPATH=${SRC:-$PWD/src}:/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
t0=$(date +%s)
if [ "${PART:-a}" = e ]; then
  # the first shape, then (MEM_CHECK, default on) the memory-ring entropy's check in MEM_S seconds
  # (mem_entropy_check.sh, its results under $OUT/mem/), then the other shapes in the time left
  first=$(echo ${SHAPES:-0,2,1,3} | cut -d, -f1)
  timeout 150 python3 benchmarks/bench_genomics.py --out $OUT/genomics_e$first.json --only engines --shapes $first \
      --old-max-s 4 > $OUT/genomics_e$first.log 2>&1
  echo "e$first rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
  tail -4 $OUT/genomics_e$first.log
  if [ "${MEM_CHECK:-1}" = 1 ]; then
    mkdir -p $OUT/mem
    OUT=$OUT/mem TEST_S=150 LIMIT=${MEM_S:-240} timeout ${MEM_S:-240} bash benchmarks/probes/mem_entropy_check.sh
    echo "mem rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
  fi
  for i in $(echo ${SHAPES:-0,2,1,3} | cut -d, -f2- -s | tr , ' '); do
    left=$(( ${LIMIT:-570} - ($(date +%s) - t0) ))
    [ $left -lt 30 ] && break
    timeout $left python3 benchmarks/bench_genomics.py --out $OUT/genomics_e$i.json --only engines --shapes $i \
        --old-max-s 4 > $OUT/genomics_e$i.log 2>&1
    echo "e$i rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
    tail -4 $OUT/genomics_e$i.log
  done
  # at most 8 files come back from a call: everything but these two in one archive
  (cd $OUT && tar czf results.tgz --exclude results.tgz --exclude device.txt --exclude phases.txt * && \
     ls | grep -v -x -e results.tgz -e device.txt -e phases.txt | xargs rm -rf)
elif [ "${PART:-a}" = a ]; then
  timeout 570 python3 benchmarks/bench_genomics.py --out $OUT/genomics_a.json --only engines,accuracy,fixups \
      --old-max-s 4 > $OUT/genomics_a.log 2>&1
  echo "a rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
  tail -30 $OUT/genomics_a.log
else
  source benchmarks/probes/gene_inputs.sh
  echo "inputs rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
  timeout $(( 500 - ($(date +%s) - t0) )) python3 benchmarks/bench_genomics.py --out $OUT/genomics_b.json \
      --only gene,sweep --gene-inputs /tmp/gene_inputs.pt --old-max-s 4 > $OUT/genomics_b.log 2>&1
  echo "b rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
  # the old engine warm at the two smaller shapes (PART=a timed its first backward cold)
  timeout $(( 585 - ($(date +%s) - t0) )) python3 benchmarks/bench_genomics.py --out $OUT/genomics_c.json \
      --only engines --shapes 0,1 --old-max-s 4 > $OUT/genomics_c.log 2>&1
  echo "c rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/phases.txt
  tail -3 $OUT/gene_inputs.log; tail -12 $OUT/genomics_b.log; tail -6 $OUT/genomics_c.log
fi
cat $OUT/phases.txt
