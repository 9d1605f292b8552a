"""Plot a bench_gpu.py result file: time vs T and vs K for both libraries, and the speed-ups.

flash-semicrf's forward+backward is left out of the sweep panels: in the 2026-11-21 run its one or
two timed runs included a recompilation for each new length (see benchmarks/GPU_NOTES.md).

Usage: python benchmarks/plot_gpu.py benchmarks/results/gpu_h200.json benchmarks/results/gpu_h200.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src: str, dst: str) -> None:
    res = json.load(open(src))
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    sweep = res.get("sweep", {})
    for ax, key, var, title in ((axes[0], "vs_T", "T", "B=1, K=32, C=8"), (axes[1], "vs_K", "K", "B=8, T=500, C=8")):
        rows = sweep.get(key, [])
        xs = [r[var] for r in rows]
        for name, style in (("ours_forward_ms", "o-"), ("ours_fwd_bwd_ms", "s-"), ("ours_viterbi_ms", "^-"),
                            ("flash_forward_ms", "o--"), ("flash_viterbi_ms", "^--")):
            ys = [r.get(name) for r in rows]
            if xs and all(y is not None for y in ys):
                lib, mode = name.split("_", 1)
                label = ("torch-semimarkov " if lib == "ours" else "flash-semicrf ") + mode[:-3].replace("_", "+")
                ax.plot(xs, ys, style, label=label, color="C0" if lib == "ours" else "C3",
                        alpha={"forward": 1.0, "fwd_bwd": 0.7, "viterbi": 0.45}[mode[:-3]])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(var)
        ax.set_ylabel("median time (ms)")
        ax.set_title(f"time vs {var} ({title})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[2]
    cfgs = [r for r in res.get("configs", []) if "flash" in r]
    labels = [f"{r['B']},{r['T']},{r['K']},{r['C']}" for r in cfgs]
    width = 0.27
    for i, mode in enumerate(("forward", "fwd_bwd", "viterbi")):
        ratios = [r["flash"][f"{mode}_ms"] / r["ours"][f"{mode}_ms"] for r in cfgs]
        ax.bar([j + (i - 1) * width for j in range(len(cfgs))], ratios, width, label=mode.replace("_", "+"))
    ax.axhline(50, color="C1", lw=0.8, ls="--")
    ax.axhline(30, color="C0", lw=0.8, ls=":")
    ax.axhline(10, color="C2", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_xticks(range(len(cfgs)))
    ax.set_xticklabels(labels, rotation=30, fontsize=7)
    ax.set_ylabel("speed-up over flash-semicrf 0.2.0 (x)")
    ax.set_title(f"(B, T, K, C) on {res.get('device', '?')}")
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
