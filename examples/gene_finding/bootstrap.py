"""Paired bootstrap over test loci: is a gene finder's F1 better than another's?

Resamples the loci of ``genes.gb.test`` with replacement (both predictions of a locus move
together), recomputes exon and gene F1 of both on each resample from their per-locus counts, and
reports the 95 % percentile interval of the difference (A - B) and the share of resamples where A
is not better.

    python examples/gene_finding/bootstrap.py \\
        --a "GHMM=examples/gene_finding/results/test_ghmm.gff3" \\
        --b-augustus "AUGUSTUS (bug)=examples/gene_finding/augustus/augustus_bug.gtf.gz" \\
        --json examples/gene_finding/results/bootstrap_ghmm_vs_augustus.json
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from torch_semimarkov.genomics.evaluate import evaluate_predictions
from torch_semimarkov.genomics.genbank import load_genbank, tutorial_data
from torch_semimarkov.genomics.gff import read_cds

HERE = os.path.dirname(os.path.abspath(__file__))
KEYS = ("exon_tp", "exon_anno", "exon_pred", "gene_tp", "gene_anno", "gene_pred")


def per_locus(records, preds) -> np.ndarray:
    """(loci, 6) counts (exon TP / annotated / predicted, gene the same) per locus."""
    return np.array([[evaluate_predictions([r], {r.name: preds.get(r.name, [])})[k] for k in KEYS]
                     for r in records], dtype=np.float64)


def f1s(counts: np.ndarray) -> np.ndarray:
    """(..., 2) exon and gene F1 from summed counts (..., 6)."""
    out = []
    for tp, anno, pred in ((counts[..., 0], counts[..., 1], counts[..., 2]), (counts[..., 3], counts[..., 4], counts[..., 5])):
        sens = np.divide(tp, anno, out=np.zeros_like(tp), where=anno > 0)
        spec = np.divide(tp, pred, out=np.zeros_like(tp), where=pred > 0)
        out.append(np.divide(2 * sens * spec, sens + spec, out=np.zeros_like(tp), where=sens + spec > 0))
    return np.stack(out, -1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.join(HERE, "data"))
    ap.add_argument("--a", required=True, help="NAME=GFF3 of model A")
    ap.add_argument("--b", help="NAME=GFF3 of model B")
    ap.add_argument("--b-augustus", help="NAME=AUGUSTUS GTF of model B")
    ap.add_argument("--reps", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    records = load_genbank(tutorial_data(args.data)["test"])
    name_a, path_a = args.a.rsplit("=", 1)
    if args.b_augustus:
        name_b, path_b = args.b_augustus.rsplit("=", 1)
        preds_b = read_cds(path_b, sources=["AUGUSTUS"])
    else:
        name_b, path_b = args.b.rsplit("=", 1)
        preds_b = read_cds(path_b)
    ca, cb = per_locus(records, read_cds(path_a)), per_locus(records, preds_b)
    rng = np.random.default_rng(args.seed)
    idx = rng.integers(0, len(records), size=(args.reps, len(records)))
    diff = f1s(ca[idx].sum(1)) - f1s(cb[idx].sum(1))  # (reps, 2)
    point = f1s(ca.sum(0)) - f1s(cb.sum(0))
    out = {"a": name_a, "b": name_b, "loci": len(records), "reps": args.reps, "seed": args.seed}
    for i, level in enumerate(("exon", "gene")):
        lo, hi = np.percentile(diff[:, i], [2.5, 97.5])
        out[level] = {"f1_a": float(f1s(ca.sum(0))[i]), "f1_b": float(f1s(cb.sum(0))[i]),
                      "difference": float(point[i]), "ci95": [float(lo), float(hi)],
                      "share_a_not_better": float((diff[:, i] <= 0).mean())}
        print(f"{level} F1: {name_a} {out[level]['f1_a']:.3f} - {name_b} {out[level]['f1_b']:.3f} = "
              f"{point[i]:+.3f}, 95% interval [{lo:+.3f}, {hi:+.3f}], A not better in "
              f"{100 * out[level]['share_a_not_better']:.1f}% of {args.reps} resamples")
    if args.json:
        json.dump(out, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
