"""GPU probe: A/B of ``plan.WAVES_RULE`` (a batch whose blocked chunks would take several waves of
programs runs one chunk per sequence where ``plan.one_chunk_is_faster``) against the chunks,
through the public API on random models at genomics shapes (interleaved medians). The chunk starts
differ, so the outputs agree to float32 rounding, not bitwise: the largest relative differences
are recorded.

    python benchmarks/probes/waves_ab.py $OUT/waves_ab.json ["B,T,K,C;B,T,K,C"]
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_common import interleaved, random_model  # noqa: E402

from torch_semimarkov.engines.triton import launch  # noqa: E402
from torch_semimarkov.engines.triton import plan as plan_mod  # noqa: E402

RUNS = 7
res = {"device": torch.cuda.get_device_name(), "runs": RUNS, "shapes": {}}
settings = {"usual": lambda: setattr(plan_mod, "WAVES_RULE", False),
            "waves": lambda: setattr(plan_mod, "WAVES_RULE", True)}
SHAPES = [(128, 5318, 960, 47), (100, 8000, 960, 47), (64, 10000, 960, 47), (16, 20000, 960, 47)]
if len(sys.argv) > 2:
    SHAPES = [tuple(int(x) for x in shape.split(",")) for shape in sys.argv[2].split(";")]
for (B, T, K, C) in SHAPES:
    model = random_model(B, T, K, C)
    plans = {}
    for name, switch in settings.items():
        switch()
        p = launch.plan_for(model[0], model[1], K, "log", backward=True)
        plans[name] = {"chunk": p.chunk, "n_chunks": p.n_chunks, "beta_early": p.beta_early}
    out, times, med = interleaved(settings, model, K, RUNS)
    a, b = out["usual"], out["waves"]
    rel = lambda x, y: float((x.double() - y.double()).abs().max() / y.double().abs().max().clamp_min(1e-30))  # noqa: E731
    diff = {"log_z": rel(b[0], a[0]), **{n: rel(p, q) for n, p, q in zip(("cum", "tr", "db"), b[1], a[1])}}
    key = f"{B},{T},{K},{C}"
    res["shapes"][key] = {"plans": plans, "median_ms": med, "times_s": times, "max_rel_diff": diff,
                          "bitwise_equal": bool(torch.equal(a[0], b[0]) and all(torch.equal(p, q) for p, q in zip(a[1], b[1])))}
    print(key, plans, med, diff, flush=True)
plan_mod.WAVES_RULE = True
json.dump(res, open(sys.argv[1], "w"), indent=1)
