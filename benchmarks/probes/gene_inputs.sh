# Sourced by the device scripts (repair_helpers_check.sh, max_bounds_check.sh, genomics_refresh.sh):
# the biopython wheel carried in .whl, then the gene model's inputs in /tmp/gene_inputs.pt (the GHMM over
# GeneGrammar, order 3, smoothing 2, K = 960, the 8 longest genes.gb.test loci of .gpu/gene_data;
# probes/make_gene_inputs.py). Needs $OUT; logs to $OUT/pip.log and $OUT/gene_inputs.log.
pip install -q --no-index --no-deps --target /tmp/site .whl/biopython-*.whl > $OUT/pip.log 2>&1
echo '{"order": 3, "smoothing": 2.0, "max_duration": 960}' > /tmp/ghmm.json
timeout ${GENE_INPUTS_LIMIT:-200} python3 benchmarks/probes/make_gene_inputs.py --data .gpu/gene_data \
    --config /tmp/ghmm.json --loci 8 --out /tmp/gene_inputs.pt > $OUT/gene_inputs.log 2>&1
