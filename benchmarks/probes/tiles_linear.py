"""Tile / warp sweep of the blocked forward, linear-space and log-space block sums."""
import json, os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_parallel import make_inputs, median_ms
from torch_semimarkov import semi_crf_streaming_forward
from torch_semimarkov.engines.triton import plan as plan_mod
OUT = os.environ.get("OUT", "/tmp")
res = []
configs = [(True, (16, 32, 16), 8), (False, (16, 32, 16), 8),
           (True, (32, 64, 16), 8), (False, (32, 64, 16), 8), (False, (32, 32, 16), 8), (False, (16, 64, 16), 8),
           (True, (32, 128, 16), 8), (True, (64, 64, 16), 8), (True, (32, 64, 32), 8), (True, (32, 64, 16), 16),
           (True, (64, 32, 16), 8), (True, (64, 128, 16), 16)]
for B, T, K, C in [(4, 100000, 960, 47), (16, 20000, 960, 47), (32, 3000, 960, 47)]:
    cum, tr, db, lengths = make_inputs(B, T, K, C)
    ref = None
    for lin, tile, warps in configs:
        plan_mod.BLOCKED_LINEAR = lin; plan_mod.BLOCK_OVERRIDE = tile; plan_mod.BLOCKED_WARPS = warps
        try:
            z = semi_crf_streaming_forward(cum, tr, db, lengths, K)
            ref = z if ref is None else ref
            row = {"linear": lin, "tile": tile, "warps": warps, "shape": [B, T, K, C],
                   "forward_ms": median_ms(lambda: semi_crf_streaming_forward(cum, tr, db, lengths, K), min_runs=3, budget_s=1.0),
                   "logZ_rel": float(((z.double() - ref.double()).abs() / ref.double().abs()).max())}
        except Exception as e:
            row = {"linear": lin, "tile": tile, "warps": warps, "shape": [B, T, K, C], "error": str(e)[:300]}
        print(row, flush=True); res.append(row)
        json.dump(res, open(OUT + "/tiles_linear.json", "w"), indent=1)
