"""Figure of one test locus: annotation, the GHMM's Viterbi parse, AUGUSTUS, and the GHMM's posteriors.

    python examples/gene_finding/plot_locus.py                     # writes results/test_locus_ghmm.png (+ .json)
    python examples/gene_finding/plot_locus.py --locus NAME --max-duration 960 --out /tmp/locus.png

The generalised HMM is fitted on genes.gb.train with the configuration 5-fold cross-validation chose
(``results/ghmm_cv.json``: order-3 chains, smoothing 2, K = 8000), as ``ghmm.py`` fitted it for the
test predictions. On the chosen locus (4.5 kb) K = 8000 runs on one CPU thread in seconds (the
marginals took 2.4 s), so no smaller K is needed; ``--max-duration`` changes it, and the figure's
title states the K used.

**The locus** is chosen by a rule fixed before looking at any prediction (the rule ``figure.py``
uses for the CNN semi-CRF's figure): the test locus with the most annotated exons among those
shorter than 8 kb (ties: the shorter). That is a medium-size multi-exon gene, short enough for the
exon structure to be readable at the figure's width: chr2R_4710987-4715522 (4536 bp, one gene, 10
exons).

``--feature-crf MODEL.pt`` draws a trained feature semi-CRF instead of the GHMM (``train_crf.py``'s
``feature_crf.pt``; the gene finder's selected model is ``results/feature_crf_site_scores.pt``), over
the GHMM refitted with the configuration saved in it (K = 960 with intron tails); ``--mea KAPPA`` draws
its parse decoded by posteriors (the selection: 0.6) instead of its Viterbi parse:

    python examples/gene_finding/plot_locus.py --feature-crf examples/gene_finding/results/feature_crf_site_scores.pt \
        --mea 0.6 --out examples/gene_finding/results/test_locus_selected.png

``--rule least-certain`` picks instead the locus (shorter than 8 kb) whose Viterbi parse the GHMM
itself finds least probable, ``exp(score - log Z)``: where the posteriors have something to show.
It reads no annotation, so it does not pick the GHMM's errors on purpose (written to
``results/test_locus_ghmm_uncertain.png``).

**What is drawn**, all computed with the library's engine on the GHMM's inputs:

* the annotation (genes.gb.test's CDS exons), the GHMM's Viterbi parse (the compiled CPU engine) and
  AUGUSTUS trained on the same genes (``augustus/augustus_bug.gtf.gz``, committed);
* per-exon posteriors: every exon that occurs in at least 1 % of ``--samples`` exact samples
  (forward filtering, backward sampling), at the height of the fraction of samples that hold it
  (an unbiased estimate of its posterior probability), green when it is an annotated exon, red
  otherwise; the Viterbi exons' ``min(P(start), P(end))`` from the marginals (an upper bound of
  their posterior) as black ticks;
* per-position posteriors of coding (+ and - strand), intron and intergenic from the marginals
  (one forward-backward pass), summed over the labels of each kind.

The distribution is made one segmentation per labelling first (``posteriors.ghmm_inputs``:
intergenic runs as one-base pieces, no split introns on a locus no longer than K); Viterbi runs on
the GHMM's own inputs, as in ``ghmm.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

from torch_semimarkov.genomics.genbank import load_genbank, tutorial_data
from torch_semimarkov.genomics.feature_crf import FeatureCRF, pack
from torch_semimarkov.genomics.ghmm import GHMM, EngineInputs, GHMMConfig
from torch_semimarkov.genomics.gff import read_cds

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import posteriors as post  # noqa: E402  (the example's module beside this script)
from figure import draw_genes  # noqa: E402  (the semi-CRF figure's gene track)


def choose_locus(records, max_length: int):
    """The rule of the module docstring: most annotated exons among loci shorter than max_length."""
    return max((r for r in records if len(r) < max_length),
               key=lambda r: (sum(len(g.exons) for g in r.genes), -len(r)))


def least_certain_locus(model, records, max_length: int):
    """``--rule least-certain``: the locus shorter than max_length whose Viterbi parse has the smallest
    posterior probability ``exp(score - log Z)`` (the model's own uncertainty; the annotation is not
    read), and ``{name: probability}`` of every candidate."""
    from torch_semimarkov import semi_crf_streaming_forward

    probs = {}
    for r in records:
        if len(r) >= max_length:
            continue
        _, score = model.decode_segments(r)
        inp = post.ghmm_inputs(model, r)
        log_z = float(semi_crf_streaming_forward(inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths,
                                                 inp.K, proj_start=inp.proj_start, proj_end=inp.proj_end,
                                                 backend="numba")[0])
        probs[r.name] = float(np.exp(score - log_z))
    name = min(probs, key=lambda n: (probs[n], n))
    return next(r for r in records if r.name == name), probs


def crf_inputs(crf: FeatureCRF, ghmm: GHMM, rec) -> EngineInputs:
    """A feature CRF's engine inputs of one locus (float64, CPU), from the GHMM's features of it."""
    batch = pack([ghmm.features(rec)], dtype=torch.float64)
    with torch.no_grad():
        cum, tr, db, ps, pe = crf.engine_inputs(batch, torch.float64)
    return EngineInputs(cum, tr, db, ps, pe, batch.lengths, crf.K)


def crf_viterbi(inp: EngineInputs):
    """``([(start, end, label)], score)`` of the best segmentation of engine inputs (B = 1)."""
    from torch_semimarkov import numba_available, semi_crf_streaming_viterbi

    out = semi_crf_streaming_viterbi(inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, inp.K,
                                     proj_start=inp.proj_start, proj_end=inp.proj_end,
                                     backend="numba" if numba_available() else "torch")
    segs = [(int(s), int(e), int(c)) for s, e, c in zip(out.segment_starts, out.segment_ends, out.segment_labels)]
    return segs, float(out.scores[0])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=os.path.join(HERE, "data"))
    p.add_argument("--download", action="store_true", help="fetch augustus-doc if the data are missing")
    p.add_argument("--locus", help="LOCUS name (default: --rule)")
    p.add_argument("--rule", choices=("most-exons", "least-certain"), default="most-exons",
                   help="most-exons: the docstring's rule; least-certain: the locus whose Viterbi parse the GHMM "
                        "finds least probable (its own posterior, not the annotation)")
    p.add_argument("--max-length", type=int, default=8000)
    p.add_argument("--order", type=int, default=3)
    p.add_argument("--smoothing", type=float, default=2.0)
    p.add_argument("--max-duration", type=int, default=8000)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--augustus", default=os.path.join(HERE, "augustus", "augustus_bug.gtf.gz"))
    p.add_argument("--out", default=os.path.join(HERE, "results", "test_locus_ghmm.png"))
    p.add_argument("--feature-crf", metavar="MODEL_PT", help="draw this trained feature CRF (train_crf.py's "
                   "feature_crf.pt) over the GHMM refitted with its saved configuration, instead of the GHMM")
    p.add_argument("--mea", type=float, default=None, metavar="KAPPA",
                   help="with --feature-crf: draw its parse decoded by posteriors at this threshold, not Viterbi")
    args = p.parse_args(argv)
    if args.mea is not None and args.feature_crf is None:
        p.error("--mea draws a feature CRF's posterior decoding: use it with --feature-crf")
    if args.feature_crf is not None and args.rule == "least-certain" and not args.locus:
        p.error("--rule least-certain ranks the loci by the GHMM; with --feature-crf give --locus or the default rule")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    torch.set_num_threads(1)
    try:
        import numba

        numba.set_num_threads(1)
    except ImportError:
        pass
    paths = tutorial_data(args.data, download=args.download)
    test = load_genbank(paths["test"])
    times = {}
    t = time.perf_counter()
    cfg = GHMMConfig(order=args.order, smoothing=args.smoothing, max_duration=args.max_duration)
    if args.feature_crf:
        cfg = FeatureCRF.saved_config(args.feature_crf)
    model = GHMM.fit(load_genbank(paths["train"]), cfg)
    crf = FeatureCRF.load(args.feature_crf, model) if args.feature_crf else None
    times["fit"] = time.perf_counter() - t
    candidates = None
    if args.locus:
        rec = next(r for r in test if r.name == args.locus)
    elif args.rule == "least-certain":
        t = time.perf_counter()
        rec, candidates = least_certain_locus(model, test, args.max_length)
        times["choosing the locus"] = time.perf_counter() - t
    else:
        rec = choose_locus(test, args.max_length)
    g = model.grammar
    t = time.perf_counter()
    if crf is None:
        segs, vscore = model.decode_segments(rec)
        inp = post.ghmm_inputs(model, rec)
    else:
        inp = crf_inputs(crf, model, rec)
        segs, vscore = crf_viterbi(inp)
    times["viterbi"] = time.perf_counter() - t
    t = time.perf_counter()
    m = post.marginals(inp)
    times["marginals"] = time.perf_counter() - t
    decoder = "Viterbi"
    if args.mea is not None:
        from torch_semimarkov.genomics.feature_crf import mea_decode

        coding = [lab.coding for lab in g.labels]
        segs = mea_decode(inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, inp.K, coding, [args.mea],
                          proj_start=inp.proj_start, proj_end=inp.proj_end, marginals=m)[args.mea][0]
        decoder = f"posteriors {args.mea:g}"
    viterbi = g.decode(segs)
    kinds = post.kind_posteriors(m.position[0], g)
    bounds = post.exon_bounds(m, segs, g)
    t = time.perf_counter()
    parses, weights = post.sample_parses(inp, args.samples, args.seed)
    times["samples"] = time.perf_counter() - t
    sampled = [g.decode(s) for s in parses]
    freq = post.exon_frequencies(sampled, weights)
    _, tx_weight = post.alternatives(viterbi, sampled, weights, 0, "samples")
    viterbi_keys = [post.transcript_key(x) for x in viterbi]
    augustus = read_cds(args.augustus, sources=["AUGUSTUS"]).get(rec.name, []) if os.path.exists(args.augustus) else None
    gold = {(x.strand, e.start, e.end) for x in rec.genes for e in x.exons}
    L = len(rec)

    name = "GHMM" if crf is None else "feature CRF\n(GHMM + site scores)"
    rows = [("annotation", rec.genes, "black"), (f"{name},\n{decoder}", viterbi, "#1f77b4")]
    if augustus is not None:
        rows.append(("AUGUSTUS (trained\non genes.gb.train)", augustus, "#7f7f7f"))
    heights = [1] * len(rows) + [1.6, 2.6]
    fig, axes = plt.subplots(len(rows) + 2, 1, figsize=(12, 1.0 * len(rows) + 5.0), sharex=True,
                             gridspec_kw={"height_ratios": heights})
    for ax, (name, genes, color) in zip(axes, rows):
        draw_genes(ax, genes, L, color, name)
    # per-exon posteriors
    ax = axes[len(rows)]
    shown = sorted((k for k, v in freq.items() if v >= 0.01), key=lambda k: (k[1], k[2]))
    for strand, s, e in shown:
        v = freq[(strand, s, e)]
        ax.plot([s, e], [v, v], lw=3, solid_capstyle="butt",
                color="#2ca02c" if (strand, s, e) in gold else "#d62728")
    for (strand, s, e), b in bounds.items():
        ax.plot([s, e], [b, b], lw=0, marker="|", markersize=7, color="black")
    ax.set_ylim(-0.05, 1.45)
    ax.set_yticks([0, 0.5, 1])
    ax.set_ylabel(f"exon posterior\n({args.samples} samples)", rotation=0, ha="right", va="center", fontsize=9)
    from matplotlib.lines import Line2D

    ax.legend(handles=[Line2D([], [], color="#2ca02c", lw=3, label="annotated exon"),
                       Line2D([], [], color="#d62728", lw=3, label="other exon"),
                       Line2D([], [], color="black", lw=0, marker="|", label=f"{decoder} exon: min(P(start), P(end))")],
              loc="upper right", fontsize=7, ncol=3, frameon=False)
    # per-position posteriors
    ax = axes[-1]
    x = np.arange(L)
    for name, color in (("coding +", "#1f77b4"), ("coding -", "#9467bd"), ("intron", "#ff7f0e"),
                        ("intergenic", "#2ca02c")):
        ax.plot(x, kinds[name], lw=0.8, color=color, label=f"P({name})")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel(f"position in {rec.name} ({L} bp)")
    ax.set_ylabel("position\nposterior", rotation=0, ha="right", va="center", fontsize=9)
    ax.legend(loc="center right", fontsize=8)
    what = (f"the generative GHMM (order {cfg.order}, smoothing {cfg.smoothing:g}, K = {cfg.max_duration})" if crf is None
            else f"the feature CRF (GHMM + site scores, K = {cfg.max_duration})")
    fig.suptitle(f"{rec.name}: annotated and predicted coding exons (+ strand above, - below); {what} trained on "
                 f"genes.gb.train,\nits per-exon posteriors from exact samples and per-position posteriors from "
                 f"the engine's marginals", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=130)

    viterbi_exons = sorted({(x.strand, e.start, e.end) for x in viterbi for e in x.exons}, key=lambda k: k[1])
    summary = {
        "locus": rec.name, "length": L, "annotated_exons": len(gold), "config": cfg.to_dict(),
        "model": args.feature_crf or "GHMM",
        "decoder": decoder,  # the viterbi_* entries below describe the drawn parse (viterbi_score: the best parse's)
        "command": "python " + " ".join([os.path.relpath(__file__)] + list(argv if argv is not None else sys.argv[1:])),
        "seconds": {k: round(v, 2) for k, v in times.items()}, "samples": args.samples, "seed": args.seed,
        "log_Z": float(m.log_Z[0]), "viterbi_score": vscore,
        "viterbi_parse_probability": float(np.exp(vscore - float(m.log_Z[0]))),
        "viterbi_transcripts": [{"strand": k[0], "exons": [[a + 1, b] for a, b in k[1]],
                                 "sampled_probability": tx_weight.get(k, 0.0)} for k in viterbi_keys],
        "viterbi_exons": [{"strand": k[0], "start": k[1] + 1, "end": k[2], "annotated": k in gold,
                           "sampled": round(freq.get(k, 0.0), 4), "marginal_bound": round(bounds.get(k, float("nan")), 4)}
                          for k in viterbi_exons],
        "annotated_exons_sampled": {f"{k[0]}{k[1] + 1}-{k[2]}": round(freq.get(k, 0.0), 4) for k in sorted(gold, key=lambda k: k[1])},
        "augustus_exons_correct": None if augustus is None else
        sum((x.strand, e.start, e.end) in gold for x in augustus for e in x.exons),
        "viterbi_exons_correct": sum(k in gold for k in viterbi_exons),
        "rule": "--locus" if args.locus else args.rule,
        "candidates_viterbi_parse_probability": candidates,
    }
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump(summary, f, indent=1)
    print(f"{rec.name} ({L} bp, {len(gold)} annotated exons), K = {cfg.max_duration}: "
          + ", ".join(f"{k} {v:.1f}s" for k, v in times.items()) + f" -> {args.out}")
    print(f"{decoder} exons {len(viterbi_exons)} ({summary['viterbi_exons_correct']} annotated); "
          f"Viterbi parse probability {summary['viterbi_parse_probability']:.3g}")


if __name__ == "__main__":
    main()
