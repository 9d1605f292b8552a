"""Times of the entropy with its gradient on the engine for rings too large for registers (the
memory-ring entropy recurrences, GPU_NOTES 106-107) at the genomics shapes, with variants of the
tile (``plan.entropy_mem_rows``, durations per tile): the forward+backward of log Z beside it,
medians of ``REPEAT`` after one warm-up, all in one process.

    python benchmarks/probes/mem_entropy_time.py OUT.json [VARIANTS] [SHAPES]
      VARIANTS: comma-separated, of default | rowsN (N durations a tile)  (default: default)
      SHAPES:   semicolon-separated B,T,K,C     (default: 32,3000,960,47;16,20000,960,47;4,100000,960,47)
"""
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
from bench_distribution import _problem  # noqa: E402

from torch_semimarkov import semi_crf_streaming_entropy, semi_crf_streaming_forward  # noqa: E402
from torch_semimarkov.engines.triton import plan as P  # noqa: E402

REPEAT = int(os.environ.get("REPEAT", "3"))
ROWS = P.entropy_mem_rows


def variant(name):
    P.entropy_mem_rows = ROWS
    if name.startswith("rows"):
        P.entropy_mem_rows = lambda c_pad, r=int(name[4:]): r
    elif name != "default":
        raise ValueError(f"unknown variant {name!r}")


def timed(fn):
    fn()
    ts = []
    for _ in range(REPEAT):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(ts), ts


def main():
    out = sys.argv[1]
    variants = (sys.argv[2] if len(sys.argv) > 2 else "default").split(",")
    shapes = [tuple(int(x) for x in s.split(",")) for s in
              (sys.argv[3] if len(sys.argv) > 3 else "32,3000,960,47;16,20000,960,47;4,100000,960,47").split(";")]
    res = {"device": torch.cuda.get_device_name(), "repeat": REPEAT, "rows": []}
    for B, T, K, C in shapes:
        cum, tr, db, lengths, _, _ = _problem(B, T, K, C, torch.device("cuda"))

        def grad(f):
            def run():
                leaves = [x.detach().clone().requires_grad_() for x in (cum, tr, db)]
                f(*leaves, lengths, K).sum().backward()
                return [x.grad for x in leaves]
            return run

        row = {"shape": [B, T, K, C]}
        row["fwd_bwd_ms"], _ = timed(grad(semi_crf_streaming_forward))
        ref = None
        for v in variants:
            variant(v)
            row[f"entropy_grad_{v}_ms"], row[f"entropy_grad_{v}_all"] = timed(grad(semi_crf_streaming_entropy))
            g = grad(semi_crf_streaming_entropy)()
            if ref is None:
                ref = g
            else:
                row[f"{v}_grad_max_diff"] = max(float((a - b).abs().max()) for a, b in zip(g, ref))
            print(B, T, K, C, v, f"{row[f'entropy_grad_{v}_ms']:.1f} ms", flush=True)
        variant("default")
        print(json.dumps(row), flush=True)
        res["rows"].append(row)
        json.dump(res, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
