"""GPU probe: A/B of the blocked engine's log-semiring tile, the default (16, 32, 32) against (16, 16, 64),
on random models at three genomics shapes (interleaved medians of 5, log Z and gradient differences).

    python benchmarks/probes/blocked_tile_ab.py $OUT/tile_ab.json
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_common import interleaved, random_model  # noqa: E402

from torch_semimarkov.engines.triton import plan as plan_mod  # noqa: E402

res = {"device": torch.cuda.get_device_name(), "shapes": {}}
tiles = {"16x32x32": (16, 32, 32), "16x16x64": (16, 16, 64)}
settings = {n: (lambda t=t: setattr(plan_mod, "BLOCK_OVERRIDE", t)) for n, t in tiles.items()}
for (B, T, K, C) in [(4, 100000, 960, 47), (32, 3000, 960, 47), (16, 20000, 960, 47)]:
    # (the committed results' forwards took leaves that require grad: detached_forward=False)
    out, times, med = interleaved(settings, random_model(B, T, K, C), K, runs=5, detached_forward=False)
    a, b = out["16x32x32"], out["16x16x64"]
    diff = {"logZ_max_abs": float((a[0] - b[0]).abs().max()),
            "grad_rel": [float((x - y).abs().max() / x.abs().max().clamp(min=1e-30)) for x, y in zip(a[1], b[1])]}
    res["shapes"][f"{B},{T},{K},{C}"] = {"median_ms": med, "times_s": times, "diff": diff}
    print(B, T, K, C, med, diff, flush=True)
plan_mod.BLOCK_OVERRIDE = None
json.dump(res, open(sys.argv[1], "w"), indent=1)
