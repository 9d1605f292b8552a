"""Figure of one locus: annotated vs predicted gene structure, with the semi-CRF's posteriors underneath.

    python examples/gene_finding/figure.py --checkpoint runs/semicrf.pt --out locus.png \\
        [--locus NAME] [--pred softmax=runs/test_softmax.gff3 --pred "linear CRF=runs/test_crf.gff3"]

Without ``--locus`` the locus is chosen by a rule fixed in advance, not by the result: the test locus
with the most exons among those shorter than ``--max-length`` bases. The posteriors (probability
that a position is coding, intronic or intergenic, summed over the labels of each kind) come from
``head.marginals``, one forward-backward pass of the streaming engine.
"""

from __future__ import annotations

import argparse
import os

import torch

from torch_semimarkov.genomics.genbank import load_genbank, tutorial_data
from torch_semimarkov.genomics.gff import read_cds
from torch_semimarkov.genomics.pipeline import load_checkpoint
from torch_semimarkov.genomics.records import encode_dna

HERE = os.path.dirname(os.path.abspath(__file__))


def draw_genes(ax, genes, L, color, label):
    from matplotlib.patches import Rectangle

    ax.set_xlim(0, L)
    ax.set_ylim(-1, 1)
    ax.set_yticks([])
    ax.set_ylabel(label, rotation=0, ha="right", va="center", fontsize=9)
    for spine in ("top", "right", "left"):
        ax.spines[spine].set_visible(False)
    for g in genes:
        y = 0.35 if g.strand == "+" else -0.35
        ax.plot([g.start, g.end], [y, y], color=color, lw=1)
        for ex in g.exons:
            ax.add_patch(Rectangle((ex.start, y - 0.25), len(ex), 0.5, color=color))
        if len(genes) <= 10:  # strand arrows only where they stay readable
            ax.text(g.end if g.strand == "+" else g.start, y, " >" if g.strand == "+" else "< ", va="center",
                    ha="left" if g.strand == "+" else "right", fontsize=8, color=color)
    if not genes:
        ax.text(L / 2, 0, "(no gene)", ha="center", va="center", fontsize=8, color=color)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="the semi-CRF checkpoint (semicrf.pt)")
    p.add_argument("--annotation", help="GenBank file (default: the tutorial's genes.gb.test)")
    p.add_argument("--data", default=os.path.join(HERE, "data"))
    p.add_argument("--locus", help="LOCUS name (default: the rule above)")
    p.add_argument("--max-length", type=int, default=8000)
    p.add_argument("--pred", action="append", default=[], help="NAME=GFF3 of another model's predictions to draw")
    p.add_argument("--out", default="gene_locus.png")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    torch.set_num_threads(1)
    records = load_genbank(args.annotation or tutorial_data(args.data)["test"])
    if args.locus:
        rec = next(r for r in records if r.name == args.locus)
    else:
        rec = max((r for r in records if len(r) < args.max_length), key=lambda r: (sum(len(g.exons) for g in r.genes), -len(r)))
    model = load_checkpoint(args.checkpoint)
    codes = torch.as_tensor(encode_dna(rec.sequence)).long()[None]
    lengths = torch.tensor([len(rec)])
    pred = model.predict_genes(codes, lengths)[0]
    post = model.posteriors(codes, lengths)[0].numpy()
    others = []
    for item in args.pred:
        name, path = item.rsplit("=", 1)
        others.append((name, read_cds(path).get(rec.name, [])))
    L = len(rec)
    rows = 2 + len(others)
    fig, axes = plt.subplots(rows + 1, 1, figsize=(12, 1.0 * rows + 2.6), sharex=True,
                             gridspec_kw={"height_ratios": [1] * rows + [2.6]})
    draw_genes(axes[0], rec.genes, L, "black", "annotation")
    draw_genes(axes[1], pred, L, "#1f77b4", "semi-CRF")
    for ax, (name, genes) in zip(axes[2:], others):
        draw_genes(ax, genes, L, "#7f7f7f", name)
    ax = axes[-1]
    x = range(L)
    for i, (name, color) in enumerate((("coding", "#1f77b4"), ("intron", "#ff7f0e"), ("intergenic", "#2ca02c"))):
        ax.plot(x, post[:, i], lw=0.8, color=color, label=f"P({name})")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel(f"position in {rec.name} ({L} bp)")
    ax.set_ylabel("posterior", fontsize=9)
    ax.legend(loc="center right", fontsize=8)
    fig.suptitle(f"{rec.name}: annotated and predicted coding exons (boxes; + strand above, - below) "
                 "and the semi-CRF's posterior marginals", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=130)
    print(f"{rec.name} ({L} bp, {sum(len(g.exons) for g in rec.genes)} annotated exons) -> {args.out}")


if __name__ == "__main__":
    main()
