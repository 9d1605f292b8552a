"""Plot of ``bench_genomics.py``'s results: forward time against K·C at fixed B·T (the blocked
engine against one program per sequence) and the speed-up of each genomics shape.

    python benchmarks/plot_genomics.py results/gpu_h200_genomics.json results/gpu_h200_genomics.png
"""

from __future__ import annotations

import json
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src: str, dst: str) -> None:
    with open(src) as fh:
        rep = json.load(fh)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    sw = rep["sweep"]
    kc = [r["KC"] for r in sw]
    ax1.loglog(kc, [r["old_forward_ms"] for r in sw], "o-", label="one program per sequence (before)")
    ax1.loglog(kc, [r["new_forward_ms"] for r in sw], "s-", label="this engine")
    for r in sw:
        ax1.annotate(f"K={r['K']}\n{r['kind']}", (r["KC"], r["new_forward_ms"]), fontsize=7,
                     textcoords="offset points", xytext=(4, -14))
    ax1.axvline(16384 * 47 / 64, color="grey", ls=":", lw=1)
    ax1.text(16384 * 47 / 64 * 1.03, ax1.get_ylim()[1] * 0.8, "register-ring limit", fontsize=7, color="grey")
    ax1.set_xlabel("K·C (C = 47)")
    ax1.set_ylabel("forward, ms (median)")
    B, T = sw[0]["B"], sw[0]["T"]
    ax1.set_title(f"forward at B·T = {B} x {T:,}")
    ax1.legend(fontsize=8, loc="upper left")
    rows = [r for r in rep["engines"] if "speedup" in r]
    if "gene" in rep and "speedup" in rep["gene"]:
        rows.append({**rep["gene"], "label": textwrap.fill(rep["gene"].get("label", "gene model"), 14)})
    names = [r.get("label", f"{r['B']}x{r['T']:,}\nK={r['K']}") for r in rows]
    x = range(len(rows))
    w = 0.27
    for j, (key, lab) in enumerate((("forward_ms", "forward"), ("fwd_bwd_ms", "forward+backward"),
                                    ("viterbi_ms", "Viterbi"))):
        ax2.bar([i + (j - 1) * w for i in x], [r["speedup"].get(key, 0) for r in rows], w, label=lab)
    ax2.set_xticks(list(x))
    ax2.set_xticklabels(names, fontsize=8)
    ax2.set_ylabel("speed-up over one program per sequence")
    ax2.set_yscale("log")
    ax2.set_title("genomics shapes, C = 47")
    ax2.legend(fontsize=8)
    fig.suptitle(f"{rep.get('device', '')}: blocked memory-ring engine", fontsize=10)
    fig.tight_layout()
    fig.savefig(dst, dpi=130)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
