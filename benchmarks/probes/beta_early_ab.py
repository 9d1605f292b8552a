"""GPU probe: A/B of ``plan.beta_early`` (the beta recurrence on a second stream beside the forward,
the backward only the marginals) against the usual order, through the public API on random models
at genomics shapes (interleaved medians; log Z and gradients must be bitwise equal).

    python benchmarks/probes/beta_early_ab.py $OUT/beta_early_ab.json
"""
import json
import statistics
import sys
import time

import torch

from torch_semimarkov import semi_crf_streaming_forward
from torch_semimarkov.engines.triton import launch
from torch_semimarkov.engines.triton import plan as plan_mod

RUNS = 7
res = {"device": torch.cuda.get_device_name(), "runs": RUNS, "shapes": {}}
modes = {"usual": False, "beside": None}  # None: the plan's own choice
for (B, T, K, C) in [(32, 3000, 960, 47), (64, 3000, 960, 47), (8, 8000, 960, 47), (16, 20000, 960, 47)]:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(B, T, C, device="cuda", generator=g) * 0.5
    cum = torch.nn.functional.pad(x.cumsum(1), (0, 0, 1, 0)).requires_grad_()
    tr = (torch.randn(C, C, device="cuda", generator=g) * 0.3).requires_grad_()
    db = (torch.randn(K, C, device="cuda", generator=g) * 0.3).requires_grad_()
    lengths = torch.full((B,), T, device="cuda")
    plan = launch.plan_for(cum, tr, K, "log")
    out, times = {}, {n: {"fwd": [], "fwdbwd": []} for n in modes}

    def step(name, back):
        plan_mod.BETA_EARLY_OVERRIDE = modes[name]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        z = semi_crf_streaming_forward(cum, tr, db, lengths, K) if back else \
            semi_crf_streaming_forward(cum.detach(), tr.detach(), db.detach(), lengths, K)
        grads = torch.autograd.grad(z.sum(), (cum, tr, db)) if back else None
        torch.cuda.synchronize()
        return time.perf_counter() - t0, z.detach(), grads

    for n in modes:  # warm-up, outputs
        step(n, True)
        _, z, gr = step(n, True)
        out[n] = (z, gr)
    for r in range(RUNS):
        for n in modes:
            times[n]["fwd"].append(step(n, False)[0])
            times[n]["fwdbwd"].append(step(n, True)[0])
    a, b = out["usual"], out["beside"]
    same = bool(torch.equal(a[0], b[0]) and all(torch.equal(p, q) for p, q in zip(a[1], b[1])))
    key = f"{B},{T},{K},{C}"
    res["shapes"][key] = {"plan": {"n_chunks": plan.n_chunks, "beta_early": plan.beta_early},
                          "median_ms": {n: {k: 1e3 * statistics.median(v) for k, v in d.items()} for n, d in times.items()},
                          "times_s": times, "bitwise_equal": same}
    print(key, res["shapes"][key]["plan"], res["shapes"][key]["median_ms"], "bitwise equal:", same, flush=True)
plan_mod.BETA_EARLY_OVERRIDE = None
json.dump(res, open(sys.argv[1], "w"), indent=1)
