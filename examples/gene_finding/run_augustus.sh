#!/usr/bin/env bash
# AUGUSTUS on the tutorial split, as the AUGUSTUS training tutorial does it, from Debian packages
# unpacked into a private prefix (no root): trains species "bug" on genes.gb.train with etraining,
# predicts genes.gb.test with it and with the shipped fly parameters, and keeps the GTF outputs
# (gzipped), AUGUSTUS's own accuracy reports and run times under $OUTDIR. Takes about 2 minutes.
#
#   bash examples/gene_finding/run_augustus.sh [PREFIX] [OUTDIR]
set -euo pipefail
PREFIX=${1:-${TMPDIR:-/tmp}/augustus-prefix}
OUTDIR=${2:-examples/gene_finding/augustus}
mkdir -p "$PREFIX/debs" "$PREFIX/root" "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
cd "$PREFIX/debs"
if ! ls augustus_*.deb >/dev/null 2>&1; then
    apt-get download augustus augustus-data augustus-doc \
        libgsl27 libgslcblas0 libcolamd2 libsuitesparseconfig5 libmariadb3 libmysql++3v5
fi
for f in *.deb; do dpkg -x "$f" "$PREFIX/root"; done
R="$PREFIX/root"
export LD_LIBRARY_PATH="$R/usr/lib/x86_64-linux-gnu:$R/usr/lib:${LD_LIBRARY_PATH:-}"
export PATH="$R/usr/bin:$PATH"
# a writable copy of the configuration: etraining writes the species parameters into it
CFG="$PREFIX/config"
rm -rf "$CFG" && cp -r "$R/usr/share/augustus/config" "$CFG" && chmod -R u+w "$CFG"
export AUGUSTUS_CONFIG_PATH="$CFG"
DATA="$R/usr/share/doc/augustus/tutorial/results"
cd "$PREFIX"
augustus --version 2>&1 | head -1 | tee "$OUTDIR/augustus_version.txt"

# 1. species "bug" from the generic template, stop codon excluded from the CDS (the tutorial's edit)
rm -rf "$CFG/species/bug"
perl "$R/usr/share/augustus/scripts/new_species.pl" --species=bug --AUGUSTUS_CONFIG_PATH="$CFG" > /dev/null
sed -i 's/^stopCodonExcludedFromCDS.*/stopCodonExcludedFromCDS true/' "$CFG/species/bug/bug_parameters.cfg"
grep '^stopCodonExcludedFromCDS' "$CFG/species/bug/bug_parameters.cfg"

# 2. train on genes.gb.train, predict genes.gb.test (the sequences only; AUGUSTUS reports its accuracy)
etraining --species=bug "$DATA/genes.gb.train" > "$OUTDIR/etraining.log" 2>&1
/usr/bin/time -p augustus --species=bug "$DATA/genes.gb.test" > "$OUTDIR/augustus_bug.gtf" 2> "$OUTDIR/augustus_bug.time"

# 3. the shipped fly parameters
/usr/bin/time -p augustus --species=fly --stopCodonExcludedFromCDS=true --UTR=off "$DATA/genes.gb.test" \
    > "$OUTDIR/augustus_fly.gtf" 2> "$OUTDIR/augustus_fly.time"

for sp in bug fly; do
    grep -A 22 Evaluation "$OUTDIR/augustus_$sp.gtf" | tee "$OUTDIR/augustus_${sp}_report.txt"
    gzip -9f "$OUTDIR/augustus_$sp.gtf"
done
