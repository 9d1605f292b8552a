"""Plot of ``probes/helpers_scaling.py``'s results: the blocked engine's forward time against the
helper programs a run takes (``plan.HELPERS_OVERRIDE``), one line per shape and semiring. A line
that keeps falling is a step bound by the helpers' share of the block sums (one label tile each
at most); a flat one, a step bound by the run itself.

    python benchmarks/plot_helpers.py results/gpu_h200_helpers_scaling_semirings.json \\
        results/gpu_h200_helpers_scaling.json results/gpu_h200_helpers_scaling.png
"""

from __future__ import annotations

import json
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def series(paths):
    """``{(shape, semiring): {helpers: forward ms}}`` from the probe's reports (later files add the
    counts the earlier ones lack; chunk-length variants are left out)."""
    out: dict = {}
    for path in paths:
        with open(path) as fh:
            rep = json.load(fh)
        for shape, runs in rep["shapes"].items():
            for name, r in runs.items():
                m = re.fullmatch(r"(?:(max) )?h(\d+)", name)
                if m is None:
                    continue
                key = (shape, m.group(1) or "log")
                out.setdefault(key, {}).setdefault(int(m.group(2)), r["forward_ms"])
    return out


def main(paths, dst: str) -> None:
    data = series(paths)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for (shape, semiring), pts in sorted(data.items()):
        hs = sorted(pts)
        ax.plot(hs, [pts[h] for h in hs], "o-" if semiring == "log" else "s--",
                label=f"({shape}) {'log Z' if semiring == 'log' else 'Viterbi (max)'}")
    ax.set_yscale("log")
    ax.set_xticks(range(0, 4))
    ax.set_xlabel("helper programs a run")
    ax.set_ylabel("forward, ms (H200, median of 5)")
    ax.set_title("Blocked engine: forward time against helpers (B, T, K, C)", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(dst, dpi=130)
    print("wrote", dst)


if __name__ == "__main__":
    main(sys.argv[1:-1], sys.argv[-1])
