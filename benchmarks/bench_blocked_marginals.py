"""GPU benchmark of the blocked engine's marginal tiles (``marginals._blk_seg_kernel``) against the
per-position marginal kernel they replace for large K (``plan.BLOCKED_MARGINALS = "position"``).

In one run: precision of both against the float64 PyTorch path; the tiles' paths (linear space,
term by term, skipped) counted per shape; forward+backward medians (CUDA events after warm-up) at
the genomics shapes, the two kernels interleaved; a tile / warp sweep; a per-kernel profile of one
forward+backward. Inputs: ``bench_parallel.make_inputs`` (random models).

    python benchmarks/bench_blocked_marginals.py [--quick] [--sweep] [--profile]   # $OUT/blocked_marginals.json
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_parallel import make_inputs, median_ms  # noqa: E402

from torch_semimarkov import semi_crf_streaming_forward  # noqa: E402
from torch_semimarkov.engines.triton import launch  # noqa: E402
from torch_semimarkov.engines.triton import plan as plan_mod  # noqa: E402

SHAPES = [(32, 3000, 960, 47), (16, 20000, 960, 47), (4, 100000, 960, 47), (1, 100000, 4000, 47)]


def grads(cum, tr, db, lengths, K):
    leaves = [x.detach().clone().requires_grad_(True) for x in (cum, tr, db)]
    z = semi_crf_streaming_forward(*leaves, lengths, K)
    z.sum().backward()
    return [z.detach()] + [x.grad for x in leaves]


def rel(a, b):
    return float(((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1e-30)).item())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the first two shapes only")
    p.add_argument("--sweep", action="store_true", help="tiles and warps at (4, 10^5) and (32, 3000)")
    p.add_argument("--profile", action="store_true", help="per-kernel CUDA time of one forward+backward")
    args = p.parse_args()
    out = os.path.join(os.environ.get("OUT", "/tmp"), "blocked_marginals.json")
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "precision": [], "stats": [],
           "timings": [], "sweep": [], "profile": []}

    def save():
        json.dump(res, open(out, "w"), indent=1)

    for B, T, K, C in [(2, 3000, 300, 40), (2, 6000, 960, 47)]:
        cum, tr, db, lengths = make_inputs(B, T, K, C)
        ref = grads(cum.double().cpu(), tr.double().cpu(), db.double().cpu(), lengths.cpu(), K)
        for mode in ("position", "tiled"):
            plan_mod.BLOCKED_MARGINALS = mode
            a = grads(cum, tr, db, lengths, K)
            row = {"shape": [B, T, K, C], "marg": mode, "logZ_rel": rel(a[0].cpu(), ref[0]),
                   "grad_rel": [rel(x.cpu(), y) for x, y in zip(a[1:], ref[1:])]}
            print(row, flush=True)
            res["precision"].append(row)
    save()
    shapes = SHAPES[:2] if args.quick else SHAPES
    for B, T, K, C in shapes:
        cum, tr, db, lengths = make_inputs(B, T, K, C)
        leaves = [x.detach().clone().requires_grad_(True) for x in (cum, tr, db)]

        def fb():
            semi_crf_streaming_forward(*leaves, lengths, K).sum().backward()

        plan_mod.BLOCKED_MARGINALS = "tiled"
        launch.STATS = True
        fb()
        n = launch.LAST_MARG_STATS.sum((0, 1)).tolist()
        launch.STATS = False
        res["stats"].append({"shape": [B, T, K, C], "linear": n[0], "log": n[1], "skipped": n[2]})
        print(res["stats"][-1], flush=True)
        got = {}
        for rnd in range(2):
            for mode in ("position", "tiled"):
                plan_mod.BLOCKED_MARGINALS = mode
                got.setdefault(mode, []).append(median_ms(fb, min_runs=3, budget_s=1.5))
        row = {"shape": [B, T, K, C], **{f"fwd_bwd_ms_{m}": v for m, v in got.items()}}
        print(row, flush=True)
        res["timings"].append(row)
        save()
    if args.sweep:
        for shape in [(4, 100000, 960, 47), (32, 3000, 960, 47)]:
            B, T, K, C = shape
            cum, tr, db, lengths = make_inputs(B, T, K, C)
            leaves = [x.detach().clone().requires_grad_(True) for x in (cum, tr, db)]

            def fb():
                semi_crf_streaming_forward(*leaves, lengths, K).sum().backward()

            plan_mod.BLOCKED_MARGINALS = "tiled"
            for tile, warps in [((32, 32, 16), 4), ((32, 32, 16), 8), ((16, 32, 16), 4), ((32, 64, 16), 4),
                                ((64, 32, 16), 4), ((64, 64, 16), 8), ((32, 32, 32), 4), ((16, 16, 16), 2)]:
                plan_mod.MARG_TILE = tile
                plan_mod.MARG_WARPS = warps
                t0 = time.time()
                try:
                    ms = median_ms(fb, min_runs=3, budget_s=1.0)
                except Exception as e:  # a tile that does not compile (registers, shared memory)
                    ms = repr(e)[:200]
                row = {"shape": list(shape), "tile": tile, "warps": warps, "fwd_bwd_ms": ms,
                       "wall_s": round(time.time() - t0, 1)}
                print(row, flush=True)
                res["sweep"].append(row)
                save()
            plan_mod.MARG_TILE = (32, 32, 16)
            plan_mod.MARG_WARPS = 4
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        B, T, K, C = 4, 100000, 960, 47
        cum, tr, db, lengths = make_inputs(B, T, K, C)
        leaves = [x.detach().clone().requires_grad_(True) for x in (cum, tr, db)]
        for mode in ("position", "tiled"):
            plan_mod.BLOCKED_MARGINALS = mode
            semi_crf_streaming_forward(*leaves, lengths, K).sum().backward()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                semi_crf_streaming_forward(*leaves, lengths, K).sum().backward()
                torch.cuda.synchronize()
            rows = sorted(((e.key, e.device_time_total / 1e3) for e in prof.key_averages()), key=lambda r: -r[1])[:12]
            res["profile"].append({"marg": mode, "shape": [B, T, K, C], "kernels_ms": rows})
            print(mode, rows, flush=True)
        save()


if __name__ == "__main__":
    main()
