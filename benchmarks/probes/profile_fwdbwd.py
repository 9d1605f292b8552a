"""GPU probe: where forward+backward and Viterbi spend their time at one genomics shape (CUDA
self time per kernel, and one iteration's kernel timeline with streams, to see which kernels
overlap), through the public API on a random model.

    python benchmarks/probes/profile_fwdbwd.py $OUT/profile.json [B,T,K,C] [kcc]

``kcc``: a (K, C, C) transition (the chunked direct recurrence; its fix-up statistics are not read).
"""
import json
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_common import public_calls  # noqa: E402

SHAPE = sys.argv[2] if len(sys.argv) > 2 else "4,100000,960,47"
B, T, K, C = (int(x) for x in SHAPE.split(","))
KCC = len(sys.argv) > 3 and sys.argv[3] == "kcc"
fwdbwd, viterbi, (cum, tr, db, lengths, _) = public_calls(SHAPE, kcc=KCC)


res = {"device": torch.cuda.get_device_name(), "shape": [B, T, K, C], "kcc": KCC}
for name, fn in (("fwdbwd", fwdbwd), ("viterbi", viterbi)):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    t0 = min(e.time_range.start for e in kernels)
    timeline = sorted(([e.name[:50], getattr(e, "device_index", 0), getattr(e, "stream", None) if hasattr(e, "stream") else None,
                        round((e.time_range.start - t0) / 1e3, 3), round((e.time_range.end - t0) / 1e3, 3)]
                       for e in kernels if e.time_range.end - e.time_range.start > 20), key=lambda r: r[3])
    span = (max(e.time_range.end for e in kernels) - t0) / 1e3
    top = sorted(((e.key[:50], e.self_device_time_total / 1e3, e.count) for e in prof.key_averages()
                  if e.self_device_time_total > 0), key=lambda r: -r[1])[:15]
    res[name] = {"span_ms": span, "self_ms": top, "timeline_ms": timeline}
    print(name, "span", round(span, 2), "ms", flush=True)
    for r in top:
        print("  ", r, flush=True)
    for r in timeline[:40]:
        print("    ", r, flush=True)
if KCC:
    json.dump(res, open(sys.argv[1], "w"), indent=1)
    sys.exit(0)
# the fix-ups of the differentiated forward's plan (split chunks where they apply)
from torch_semimarkov.core.validation import validate_streaming_inputs  # noqa: E402
from torch_semimarkov.engines.triton import launch, parallel  # noqa: E402

v = validate_streaming_inputs(cum.detach(), tr.detach(), db.detach(), lengths, K)
plan = launch.plan_for(v.cum_scores, v.transition, v.K, "log", backward=True)
args = (v.cum_scores, v.transition, v.duration_bias, v.lengths)
res["fixups"] = {"chunk": plan.chunk, "n_chunks": plan.n_chunks}
for name, stats in (("forward", parallel.forward_chunked(*args, "log", None, None, plan)[3]),
                    ("beta", parallel.beta_chunked(*args, None, None, plan)[2])):
    ran = sorted(s for s in stats.steps.flatten().tolist() if s > 0)
    res["fixups"][name] = {"steps": ran, "converged_fraction": float(stats.converged.double().mean()),
                           "redone_chunks": int(stats.redone.sum())}
print("fixups", json.dumps(res["fixups"]), flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
