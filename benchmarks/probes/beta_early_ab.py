"""GPU probe: A/B of ``plan.beta_early`` (the beta recurrence on a second stream beside the forward,
the backward only the marginals) against the usual order, through the public API on random models
at genomics shapes (interleaved medians; log Z and gradients must be bitwise equal).

    python benchmarks/probes/beta_early_ab.py $OUT/beta_early_ab.json ["B,T,K,C;B,T,K,C"]
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
# None: the plan's own choice
settings = {"usual": lambda: setattr(plan_mod, "BETA_EARLY_OVERRIDE", False),
            "beside": lambda: setattr(plan_mod, "BETA_EARLY_OVERRIDE", None)}
SHAPES = [(32, 3000, 960, 47), (64, 3000, 960, 47), (8, 8000, 960, 47), (16, 20000, 960, 47)]
if len(sys.argv) > 2:
    SHAPES = [tuple(int(x) for x in shape.split(",")) for shape in sys.argv[2].split(";")]
for (B, T, K, C) in SHAPES:
    model = random_model(B, T, K, C)
    plan = launch.plan_for(model[0], model[1], K, "log")
    out, times, med = interleaved(settings, model, K, RUNS)
    a, b = out["usual"], out["beside"]
    same = bool(torch.equal(a[0], b[0]) and all(torch.equal(p, q) for p, q in zip(a[1], b[1])))
    key = f"{B},{T},{K},{C}"
    res["shapes"][key] = {"plan": {"n_chunks": plan.n_chunks, "beta_early": plan.beta_early},
                          "median_ms": med, "times_s": times, "bitwise_equal": same}
    print(key, res["shapes"][key]["plan"], med, "bitwise equal:", same, flush=True)
plan_mod.BETA_EARLY_OVERRIDE = None
json.dump(res, open(sys.argv[1], "w"), indent=1)
