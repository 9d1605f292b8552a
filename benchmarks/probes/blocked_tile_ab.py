"""GPU probe: A/B of the blocked engine's log-semiring tile, the default (16, 32, 32) against (16, 16, 64),
on random models at three genomics shapes (interleaved medians of 5, log Z and gradient differences).

    python benchmarks/probes/blocked_tile_ab.py $OUT/tile_ab.json
"""
import json
import statistics
import sys
import time

import torch

from torch_semimarkov import semi_crf_streaming_forward
from torch_semimarkov.engines.triton import plan as plan_mod
res = {"device": torch.cuda.get_device_name(), "shapes": {}}
tiles = {"16x32x32": (16, 32, 32), "16x16x64": (16, 16, 64)}
for (B, T, K, C) in [(4, 100000, 960, 47), (32, 3000, 960, 47), (16, 20000, 960, 47)]:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(B, T, C, device="cuda", generator=g) * 0.5
    cum = torch.nn.functional.pad(x.cumsum(1), (0, 0, 1, 0)).requires_grad_()
    tr = (torch.randn(C, C, device="cuda", generator=g) * 0.3).requires_grad_()
    db = (torch.randn(K, C, device="cuda", generator=g) * 0.3).requires_grad_()
    lengths = torch.full((B,), T, device="cuda")
    out, times = {}, {n: {"fwd": [], "fwdbwd": []} for n in tiles}
    def step(name, back):
        plan_mod.BLOCK_OVERRIDE = tiles[name]
        torch.cuda.synchronize(); t0 = time.perf_counter()
        z = semi_crf_streaming_forward(cum, tr, db, lengths, K)
        grads = torch.autograd.grad(z.sum(), (cum, tr, db)) if back else None
        torch.cuda.synchronize()
        return time.perf_counter() - t0, z.detach(), grads
    for n in tiles:  # warm-up, outputs
        step(n, True)
        _, z, gr = step(n, True)
        out[n] = (z, gr)
    for r in range(5):
        for n in tiles:
            times[n]["fwd"].append(step(n, False)[0])
            times[n]["fwdbwd"].append(step(n, True)[0])
    a, b = out["16x32x32"], out["16x16x64"]
    diff = {"logZ_max_abs": float((a[0] - b[0]).abs().max()),
            "grad_rel": [float((x - y).abs().max() / x.abs().max().clamp(min=1e-30)) for x, y in zip(a[1], b[1])]}
    res["shapes"][f"{B},{T},{K},{C}"] = {"median_ms": {n: {k: 1e3 * statistics.median(v) for k, v in d.items()} for n, d in times.items()},
                                         "times_s": times, "diff": diff}
    print(B, T, K, C, res["shapes"][f"{B},{T},{K},{C}"]["median_ms"], diff, flush=True)
plan_mod.BLOCK_OVERRIDE = None
json.dump(res, open(sys.argv[1], "w"), indent=1)
