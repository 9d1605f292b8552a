"""Engine inputs of the gene finder's trained model on real loci, for ``bench_genomics.py --gene-inputs``.

The feature CRF saved by ``examples/gene_finding/train_crf.py --stage final`` (``feature_crf.pt``:
its weights and the GHMM configuration) over the GHMM refitted on ``genes.gb.train`` (the fit is
deterministic), scored on the ``--loci`` longest loci of ``genes.gb.test``; without ``--checkpoint``
the generative GHMM itself (weights 1). Saves ``cum_scores``, ``transition``, ``duration_bias``,
``lengths``, ``proj_start``, ``proj_end`` (float32; ``--float64`` for CPU probes), ``K`` and the loci's
``names``.

    python benchmarks/probes/make_gene_inputs.py --data DIR --checkpoint feature_crf.pt --out gene_inputs.pt
"""

import argparse
import json

import torch

from torch_semimarkov.genomics.feature_crf import FeatureCRF, pack
from torch_semimarkov.genomics.genbank import load_genbank, tutorial_data
from torch_semimarkov.genomics.ghmm import GHMM, GHMMConfig


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="examples/gene_finding/data")
    ap.add_argument("--checkpoint", default=None, help="feature_crf.pt of train_crf.py (default: the plain GHMM)")
    ap.add_argument("--config", default=None, help="JSON of GHMMConfig fields when there is no checkpoint")
    ap.add_argument("--loci", type=int, default=8, help="how many of the longest test loci")
    ap.add_argument("--float64", action="store_true", help="float64 inputs (CPU probes) instead of float32")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    paths = tutorial_data(args.data)
    ckpt = torch.load(args.checkpoint, map_location="cpu") if args.checkpoint else None
    fields = ckpt["config"] if ckpt else ({} if args.config is None else json.load(open(args.config)))
    ghmm = GHMM.fit(load_genbank(paths["train"]), GHMMConfig(**fields))
    crf = FeatureCRF(ghmm)
    if ckpt:
        crf.load_state_dict(ckpt["state"])
    loci = sorted(load_genbank(paths["test"]), key=len, reverse=True)[:args.loci]
    dtype = torch.float64 if args.float64 else torch.float32
    batch = pack([ghmm.features(r) for r in loci], dtype=dtype)
    with torch.no_grad():
        cum, tr, db, ps, pe = crf.engine_inputs(batch, dtype)
    torch.save({"cum_scores": cum, "transition": tr, "duration_bias": db, "lengths": batch.lengths,
                "proj_start": ps, "proj_end": pe, "K": crf.K, "names": [r.name for r in loci],
                "labels": [lab.name for lab in crf.grammar.labels],
                "model": "feature CRF " + args.checkpoint if ckpt else "GHMM"}, args.out)
    print(f"{len(loci)} loci ({[len(r) for r in loci]} bases), C = {crf.C}, K = {crf.K} -> {args.out}")


if __name__ == "__main__":
    main()
