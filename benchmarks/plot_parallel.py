"""Plot bench_parallel.py's T sweep: time against T at B = 1 (K = 64, C = 8), one program per
sequence against the time-parallel engine.

    python benchmarks/plot_parallel.py results.json out.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src: str, dst: str) -> None:
    with open(src) as f:
        res = json.load(f)
    rows = res["sweep"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=False)
    for ax, key, title in ((axes[0], "forward_ms", "forward"), (axes[1], "fwd_bwd_ms", "forward + backward")):
        for engine, style in (("sequential", "o-"), ("parallel", "s-")):
            pts = [(r["T"], r[engine][key]) for r in rows if key in r[engine]]
            ax.loglog([p[0] for p in pts], [p[1] for p in pts], style, label=engine)
        ax.set_xlabel("T (positions, one sequence)")
        ax.set_ylabel("ms (median)")
        ax.set_title(f"{title}, B = 1, K = 64, C = 8")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(f"{res.get('device', '')}: one program per sequence vs parallel over time")
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
