"""Draw the package's layers (docs/_static/layers.png): each layer imports only from those below it.

Run: python docs/draw_layers.py
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

# (name, what it holds, its files), from the top floor down
LAYERS = [
    ("applications", "genomics/ (gene finder), demo.py, lightning.py, __main__.py", "#d9d2e9"),
    ("nn", "nn.py (SemiMarkovCRFHead), durations.py, scores.py", "#cfe2f3"),
    ("distribution", "crf.py (SemiMarkovCRF), streaming/ (the historical face of api/)", "#d0e0e3"),
    ("api/", "partition.py  viterbi.py  marginals.py  topk.py  sample.py  entropy.py  constrained.py", "#d9ead3"),
    ("ops.py", "torch.ops.torch_semimarkov.forward / backward / viterbi (+ fake kernels, registered backward)", "#fff2cc"),
    ("engines/", "select.py (the one dispatcher)  interface.py (Engine: forward / backward / score / viterbi)\n"
                 "torch/ (reference.py, dense.py)   numba/ (engine, factored, direct, entropy, sample, kbest)\n"
                 "triton/ (plan, launch, parallel, forward, beta, blocked, marginals, traceback, entropy, ...)", "#fce5cd"),
    ("core/", "validation.py  masks.py  segments.py  results.py  gold.py  cumsum.py  constants.py  signature.py", "#f4cccc"),
]


def main(out: Path = Path(__file__).parent / "_static" / "layers.png") -> Path:
    heights = [1.35 if "\n" in what else 0.85 for _, what, _ in LAYERS]
    gap = 0.35
    total = sum(heights) + gap * (len(LAYERS) - 1)
    fig, ax = plt.subplots(figsize=(11, 1.0 + 0.95 * total))
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.1, total + 0.1)
    ax.axis("off")
    y = total
    centres = []
    for (name, what, colour), h in zip(LAYERS, heights):
        y -= h
        ax.add_patch(FancyBboxPatch((0.2, y), 9.0, h, boxstyle="round,pad=0.02,rounding_size=0.12", fc=colour,
                                    ec="#555555"))
        ax.text(0.4, y + h - 0.25, name, fontsize=12, fontweight="bold", va="center")
        ax.text(0.4, y + (h - 0.4) / 2, what, fontsize=8.6, va="center", family="monospace")
        centres.append((y, h))
        y -= gap
    for (y_hi, _), (y_lo, h_lo) in zip(centres, centres[1:]):
        ax.add_patch(FancyArrowPatch((9.55, y_hi), (9.55, y_lo + h_lo), arrowstyle="-|>", mutation_scale=14,
                                     color="#333333"))
    ax.text(9.65, centres[0][0] + 0.4, "imports\nonly\ndown", fontsize=8, va="top")
    ax.set_title("torch-semimarkov: each layer imports only from the layers below it", fontsize=12)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    return out


if __name__ == "__main__":
    print(main())
