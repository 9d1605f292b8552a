"""GPU probe (issue 25): how the blocked engine's forward scales with its helper programs
(``plan.HELPERS_OVERRIDE`` 0 .. 3) and the chunk length (``plan.CHUNK_OVERRIDE``), with each
phase (spec, fix-up, repair) timed apart by the profiler and the fix-ups' positions, at genomics
shapes on random models. If a step is bound by the helpers' share of phase A, the time falls
with every helper; if by the run (phase B and the previous block's own rows), it stops falling.

    python benchmarks/probes/helpers_scaling.py $OUT/helpers_scaling.json ["B,T,K,C;..."] [log,max] [0,1,2,3]
"""
import json
import os
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_common import random_model  # noqa: E402

from torch_semimarkov.core.validation import validate_streaming_inputs  # noqa: E402
from torch_semimarkov.engines.triton import launch, parallel  # noqa: E402
from torch_semimarkov.engines.triton import plan as plan_mod  # noqa: E402

shapes = [(1, 100000, 4000, 47), (32, 3000, 960, 47)]
if len(sys.argv) > 2:
    shapes = [tuple(int(x) for x in s.split(",")) for s in sys.argv[2].split(";")]
semirings = sys.argv[3].split(",") if len(sys.argv) > 3 else ["log"]
counts = [int(h) for h in sys.argv[4].split(",")] if len(sys.argv) > 4 else [0, 1, 2, 3]
configs = [(f"h{h}", h, None) for h in counts]
extra = [("h3 chunk 1.2K", 3, 1.2), ("h1 chunk 1.2K", 1, 1.2)] if len(sys.argv) <= 2 else []
res = {"device": torch.cuda.get_device_name(), "shapes": {}}
for (B, T, K, C) in shapes:
    cum, tr, db, lengths = random_model(B, T, K, C)
    v = validate_streaming_inputs(cum.detach(), tr.detach(), db.detach(), lengths, K)
    args = (v.cum_scores, v.transition, v.duration_bias, v.lengths)
    out = {}
    for sr, (name, h, ck) in [(sr, c) for sr in semirings for c in configs + (extra if T >= 4 * K else [])]:
        name = name if sr == "log" else f"{sr} {name}"
        plan_mod.HELPERS_OVERRIDE = h
        plan_mod.CHUNK_OVERRIDE = None if ck is None else int(ck * K)
        plan = launch.plan_for(v.cum_scores, v.transition, v.K, sr, backward=False)

        def fn():
            return parallel.forward_chunked(*args, sr, None, None, plan)

        fn()
        ts = []
        for _ in range(5):
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            r = fn()
            e1.record()
            torch.cuda.synchronize()
            ts.append(e0.elapsed_time(e1))
        stats = r[3]
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        ks = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                     and "chunks_kernel" in e.name), key=lambda e: e.time_range.start)
        steps = sorted(s for s in stats.steps.flatten().tolist() if s > 0)
        out[name] = {"chunk": plan.chunk, "n_chunks": plan.n_chunks, "helpers": plan.helpers,
                     "forward_ms": statistics.median(ts), "times_ms": ts,
                     "phase_ms": [round((e.time_range.end - e.time_range.start) / 1e3, 3) for e in ks],
                     "fixup_steps_max": steps[-1] if steps else 0,
                     "fixup_steps_median": steps[len(steps) // 2] if steps else 0}
        print(f"{B},{T},{K},{C}", name, {k: out[name][k] for k in ("chunk", "n_chunks", "helpers", "forward_ms",
                                                                     "phase_ms", "fixup_steps_max")}, flush=True)
    res["shapes"][f"{B},{T},{K},{C}"] = out
plan_mod.HELPERS_OVERRIDE = None
plan_mod.CHUNK_OVERRIDE = None
json.dump(res, open(sys.argv[1], "w"), indent=1)
