"""Time training steps and whole-locus decoding of the gene finders on this machine (no training).

    python examples/gene_finding/time_steps.py --data DIR [--configs 32x3000,64x3000]

Prints, per model and batch configuration (batch size x window length), the median seconds of one
optimiser step (forward + backward + update), and the seconds to decode the longest training loci.
Used to size the time budgets of ``train.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from torch_semimarkov.genomics.batches import locus_batches, prepare_loci, window_batches
from torch_semimarkov.genomics.genbank import load_genbank, tutorial_data
from torch_semimarkov.genomics.models import build_model


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="data")
    p.add_argument("--configs", default="32x3000,64x3000,32x6000")
    p.add_argument("--max-duration", type=int, default=960)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    recs = load_genbank(tutorial_data(args.data)["train"])
    for kind in ("semicrf", "crf", "softmax"):
        torch.manual_seed(0)
        model = build_model(kind, max_duration=args.max_duration, hidden=args.hidden) if kind == "semicrf" else build_model(kind, hidden=args.hidden)
        model.to(dev)
        K = args.max_duration if kind == "semicrf" else max(len(r) for r in recs)
        loci = prepare_loci(recs, K)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for cfg in args.configs.split(","):
            B, W = (int(v) for v in cfg.split("x"))
            rng = np.random.default_rng(0)
            times = []
            t_first = None
            for i, batch in enumerate(window_batches(loci, W, B, rng)):
                if i > args.steps:
                    break
                batch = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
                sync()
                t0 = time.perf_counter()
                opt.zero_grad()
                loss = model.loss(batch)
                loss.backward()
                opt.step()
                sync()
                dt = time.perf_counter() - t0
                if i == 0:
                    t_first = dt
                else:
                    times.append(dt)
            n_win = sum(1 for _ in window_batches(loci, W, B, np.random.default_rng(0)))
            med = statistics.median(times)
            print(f"{kind:8s} B={B:3d} W={W:5d}: first step {t_first:.2f}s (compile), median step {med:.3f}s, "
                  f"{n_win} steps/epoch of all 486 loci -> {n_win * med:.1f}s/epoch", flush=True)
        longest = sorted(recs, key=len)[-16:]
        model.eval()
        for n in (1, 16):
            idx, batch = next(locus_batches(longest[-n:], max_tokens=10**9))
            sync()
            t0 = time.perf_counter()
            model.predict_genes(batch["codes"].to(dev), batch["lengths"].to(dev))
            sync()
            print(f"{kind:8s} decode {n} longest loci (max {int(batch['lengths'].max())} bp): {time.perf_counter() - t0:.2f}s", flush=True)


if __name__ == "__main__":
    main()
