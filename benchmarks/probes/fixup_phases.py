"""GPU probe: the blocked engine's phases (spec, fix-up, repair) timed apart, forward and beta, with
the linear block sums on and off, and the tiles the linear sums recomputed term by term
(``parallel.RECOMPUTED``), at one genomics shape on a random model.

    python benchmarks/probes/fixup_phases.py $OUT/fixup_phases.json [B,T,K,C]
"""
import json
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_common import random_model  # noqa: E402

from torch_semimarkov.core.validation import validate_streaming_inputs  # noqa: E402
from torch_semimarkov.engines.triton import launch, parallel  # noqa: E402
from torch_semimarkov.engines.triton import plan as plan_mod  # noqa: E402

B, T, K, C = (int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "4,100000,960,47").split(","))
cum, tr, db, lengths = random_model(B, T, K, C)
v = validate_streaming_inputs(cum.detach(), tr.detach(), db.detach(), lengths, K)
args = (v.cum_scores, v.transition, v.duration_bias, v.lengths)
res = {"device": torch.cuda.get_device_name(), "shape": [B, T, K, C], "runs": {}}
for linear in (None, False):
    plan_mod.BLOCKED_LINEAR = linear
    for backward in (True, False):
        plan = launch.plan_for(v.cum_scores, v.transition, v.K, "log", backward=backward)
        for name, fn in (("forward", lambda: parallel.forward_chunked(*args, "log", None, None, plan)[3]),
                         ("beta", lambda: parallel.beta_chunked(*args, None, None, plan)[2])):
            fn()
            parallel.RECOMPUTED = []
            stats = fn()
            torch.cuda.synchronize()
            rec = [(int(a), int(b)) for a, b in parallel.RECOMPUTED]
            parallel.RECOMPUTED = None
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            ks = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                         and "chunks_kernel" in e.name), key=lambda e: e.time_range.start)
            phases = [round((e.time_range.end - e.time_range.start) / 1e3, 3) for e in ks]
            steps = sorted(s for s in stats.steps.flatten().tolist() if s > 0)
            key = f"linear={linear} backward={backward} {name}"
            res["runs"][key] = {"chunk": plan.chunk, "n_chunks": plan.n_chunks, "linear": plan.linear,
                                "phase_ms": phases, "recomputed_tiles_per_pass": rec,
                                "fixup_steps_max": steps[-1] if steps else 0,
                                "fixup_steps_median": steps[len(steps) // 2] if steps else 0}
            print(key, res["runs"][key], flush=True)
plan_mod.BLOCKED_LINEAR = None
json.dump(res, open(sys.argv[1], "w"), indent=1)
