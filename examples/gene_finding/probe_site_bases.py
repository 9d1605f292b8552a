"""Probe (CPU): does a discriminative position weight matrix at the splice / start / stop sites help
the GHMM when it is actually fitted?

In the GPU CV of ``train_crf.py --params weights,offset,site_bases`` the site scores stayed below
0.013: L-BFGS over all parameters at once moves along the stiff per-base offsets (curvature in the
thousands) and hardly along the site scores (curvature ~0.5). This probe fits the site scores
*alone* (weights 1, offsets 0: the generative GHMM plus the site scores) on out-of-fold features of
short training loci of one CV fold's training part, and decodes that fold by Viterbi with and
without them.

With ``--fold 0`` the site scores fit on short loci of all of ``genes.gb.train`` and
``genes.gb.test`` is decoded (the final stage); ``--merge`` joins fold files into CV means.

Usage: python examples/gene_finding/probe_site_bases.py --fold J --out results/probe_site_bases_fJ.json
       python examples/gene_finding/probe_site_bases.py --merge f1.json ... f5.json --out cv.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from torch_semimarkov.genomics.evaluate import evaluate_predictions
from torch_semimarkov.genomics.feature_crf import FeatureCRF, pack
from torch_semimarkov.genomics.gff import write_gff3
from torch_semimarkov.genomics.genbank import load_genbank, tutorial_data
from torch_semimarkov.genomics.ghmm import GHMM, GHMMConfig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="examples/gene_finding/data")
    ap.add_argument("--out", required=True)
    ap.add_argument("--fold", type=int, default=1,
                    help="the held-out fold (1-based) of train_crf.py's 5 folds; 0: fit on all, decode the test set")
    ap.add_argument("--thresholds", default="0.5,0.6,0.7", help="also decode by posteriors at these thresholds")
    ap.add_argument("--merge", nargs="*", default=None, help="fold JSON files to join into CV means")
    ap.add_argument("--train-loci", type=int, default=120, help="short training loci the site scores fit on")
    ap.add_argument("--max-length", type=int, default=3000)
    ap.add_argument("--max-iter", type=int, default=12)
    ap.add_argument("--reg", type=float, default=0.05)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.merge is not None:
        rows = [json.load(open(p)) for p in args.merge]
        keys = [k for k in rows[0]["metrics"] if all(k in r["metrics"] for r in rows)]  # decoders every fold ran
        mean = {k: {m: float(np.mean([r["metrics"][k][m] for r in rows])) for m in ("exon_f1", "gene_f1")}
                for k in keys}
        for k, v in mean.items():
            print(f"CV mean {k}: exon F1 {v['exon_f1']:.4f}, gene F1 {v['gene_f1']:.4f}")
        json.dump({"folds": [r["fold"] for r in rows], "cv_mean": mean,
                   "per_fold_exon_f1": {k: [r["metrics"][k]["exon_f1"] for r in rows] for k in keys}},
                  open(args.out, "w"), indent=1)
        return
    thresholds = [float(x) for x in args.thresholds.split(",") if x]
    t00 = time.perf_counter()
    paths = tutorial_data(args.data)
    recs = load_genbank(paths["train"])
    folds = np.random.default_rng(0).permutation(len(recs)) % 5  # train_crf.py's folds
    j = args.fold - 1 if args.fold else "all"
    cfg = GHMMConfig(order=3, smoothing=2.0, max_duration=960, intron_tail=960, signal_bases=True)
    models = {f: GHMM.fit([r for r, g in zip(recs, folds) if g != f], cfg) for f in range(5)}
    if j == "all":
        models["all"] = GHMM.fit(recs, cfg)
    rng = np.random.default_rng(1)
    pool = [i for i in range(len(recs)) if folds[i] != j and len(recs[i]) <= args.max_length]
    use = sorted(rng.choice(pool, min(args.train_loci, len(pool)), replace=False).tolist())
    # out-of-fold features (each locus scored by the GHMM fitted without its own fold)
    feats = [models[int(folds[i])].features(recs[i]) for i in use]
    batch = pack(feats, [recs[i].genes for i in use], dtype=torch.float64, grammar=models[j].grammar)
    crf = FeatureCRF(models[j])
    for name, p in crf.named_parameters():
        p.requires_grad_(name.startswith("site_bases"))
    params = [p for p in crf.parameters() if p.requires_grad]
    opt = torch.optim.LBFGS(params, lr=1.0, max_iter=1, max_eval=20, history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        nll = crf.nll(batch, torch.float64)
        ok = torch.isfinite(nll)
        loss = nll[ok].sum() / ok.sum() + args.reg * crf.penalty()
        loss.backward()
        return loss

    history = []
    t0 = time.perf_counter()
    for it in range(args.max_iter):
        history.append(float(opt.step(closure)))
        print(f"iteration {it + 1}: loss {history[-1]:.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
        if len(history) > 2 and abs(history[-2] - history[-1]) < 1e-5:  # (train_crf.py's rule)
            break
    theta = {k: v.detach().numpy().round(4).tolist() for k, v in crf.site_bases.items()}
    if j == "all":
        hrecs = load_genbank(paths["test"])
    else:
        hrecs = [recs[i] for i in range(len(recs)) if folds[i] == j]
    ghmm = FeatureCRF(models[j])
    out = {"fold": args.fold, "train_loci": len(use), "train_bases": int(sum(len(recs[i]) for i in use)),
           "loss": history, "theta_max": {k: float(np.abs(np.array(v)).max()) for k, v in theta.items()},
           "theta": theta}
    t0 = time.perf_counter()
    names = [f"{kind}{dec}" for kind in ("ghmm", "ghmm+site_bases") for dec in [""] + [f"+mea:{k:g}" for k in thresholds]]
    preds = {n: {} for n in names}
    grammar = models[j].grammar
    for rec in hrecs:
        b = pack([models[j].features(rec)], dtype=torch.float64)
        for kind, model in (("ghmm", ghmm), ("ghmm+site_bases", crf)):
            found = {"": model.decode(b, torch.float64)}
            if thresholds:
                found.update({f"+mea:{k:g}": v for k, v in model.decode_mea(b, thresholds, torch.float64).items()})
            for dec, segs in found.items():
                preds[kind + dec][rec.name] = grammar.decode(segs[0], prefix=f"{rec.name}.g")
    out["decode_seconds"] = time.perf_counter() - t0
    if j == "all":
        stem = args.out[:-5] if args.out.endswith(".json") else args.out
        for name in [n for n in names if n.startswith("ghmm+site_bases")]:
            decoder = name[len("ghmm+site_bases") + 1:] or "viterbi"
            write_gff3(f"{stem}{'' if decoder == 'viterbi' else '_' + decoder.replace(':', '')}.gff3", preds[name],
                       sequences={r.name: r.sequence for r in hrecs}, source="torch-semimarkov-ghmm+site_bases",
                       header=[f"GHMM + site scores ({decoder} decoding) trained on genes.gb.train: "
                               f"python {' '.join(sys.argv)}"])
    out["metrics"] = {k: evaluate_predictions(hrecs, p) for k, p in preds.items()}
    for k, m in out["metrics"].items():
        print(f"fold {args.fold} {k}: exon F1 {m['exon_f1']:.3f} (sens {m['exon_sens']:.3f}, spec "
              f"{m['exon_spec']:.3f}), gene F1 {m['gene_f1']:.3f}", flush=True)
    out["seconds"] = time.perf_counter() - t00
    json.dump(out, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
