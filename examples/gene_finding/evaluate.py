"""Nucleotide / exon / gene accuracy of GFF3 (or GTF) gene predictions against a GenBank annotation.

    python examples/gene_finding/evaluate.py --annotation genes.gb.test \\
        --pred semi-CRF=runs/test_semicrf.gff3 --pred softmax=runs/test_softmax.gff3 \\
        --augustus "AUGUSTUS (bug)=examples/gene_finding/augustus/augustus_bug.gtf"

``--pred NAME=FILE`` reads every CDS of a GFF3/GTF file; ``--augustus NAME=FILE`` reads AUGUSTUS's
own GTF output, keeping only its predictions (source ``AUGUSTUS``; it also echoes the input
annotation as source ``database``). Definitions: :mod:`torch_semimarkov.genomics.evaluate`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import OrderedDict

from torch_semimarkov.genomics.evaluate import evaluate_predictions, format_table
from torch_semimarkov.genomics.genbank import load_genbank, tutorial_data
from torch_semimarkov.genomics.gff import read_cds

HERE = os.path.dirname(os.path.abspath(__file__))


def _pairs(items):
    out = []
    for item in items or []:
        if "=" not in item:
            raise SystemExit(f"expected NAME=FILE, got {item!r}")
        out.append(item.rsplit("=", 1))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--annotation", help="GenBank file with the true genes (default: the tutorial's genes.gb.test)")
    p.add_argument("--data", default=os.path.join(HERE, "data"), help="where the tutorial data live (see train.py)")
    p.add_argument("--download", action="store_true")
    p.add_argument("--pred", action="append", help="NAME=GFF3 or GTF file of predictions (repeatable)")
    p.add_argument("--augustus", action="append", help="NAME=AUGUSTUS GTF output (repeatable)")
    p.add_argument("--json", help="write all metrics (counts included) here")
    p.add_argument("--markdown", help="write the Markdown table here")
    args = p.parse_args(argv)
    annotation = args.annotation or tutorial_data(args.data, download=args.download)["test"]
    records = load_genbank(annotation)
    rows = OrderedDict()
    for name, path in _pairs(args.pred):
        rows[name] = evaluate_predictions(records, read_cds(path))
    for name, path in _pairs(args.augustus):
        rows[name] = evaluate_predictions(records, read_cds(path, sources=["AUGUSTUS"]))
    if not rows:
        raise SystemExit("nothing to evaluate: pass --pred and/or --augustus")
    table = format_table(rows)
    print(f"{os.path.basename(annotation)}: {len(records)} loci, {sum(len(r.genes) for r in records)} genes")
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
