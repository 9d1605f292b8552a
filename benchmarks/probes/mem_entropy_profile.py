"""Where the entropy with its gradient spends its time on a GPU, by kernel launch (issue 25, GPU_NOTES
107: the memory-ring entropy at the genomics shapes is ~34x its forward+backward and the per-entry
fold of its sums gained only 17%): one call after a warm-up under ``torch.profiler``, every CUDA kernel
in launch order (name, µs) and the totals by name, with the wall time beside it.

    python benchmarks/probes/mem_entropy_profile.py OUT.json [B,T,K,C]      (default 32,3000,960,47)
"""
import json
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "benchmarks")
from bench_distribution import _problem  # noqa: E402

from torch_semimarkov import semi_crf_streaming_entropy  # noqa: E402


def main():
    out = sys.argv[1]
    B, T, K, C = (int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "32,3000,960,47").split(","))
    cum, tr, db, lengths, _, _ = _problem(B, T, K, C, torch.device("cuda"))

    def call():
        leaves = [x.detach().clone().requires_grad_() for x in (cum, tr, db)]
        semi_crf_streaming_entropy(*leaves, lengths, K).sum().backward()

    call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    call()
    torch.cuda.synchronize()
    wall = 1e3 * (time.perf_counter() - t0)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    launches = [(e.name, e.time_range.start, e.time_range.elapsed_us()) for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA]
    launches.sort(key=lambda x: x[1])
    t_first = launches[0][1] if launches else 0
    totals = {}
    for name, _, us in launches:
        totals[name] = totals.get(name, 0.0) + us
    res = {"device": torch.cuda.get_device_name(), "shape": [B, T, K, C], "wall_ms": wall,
           "launches": [{"name": n[:80], "start_us": s - t_first, "us": us} for n, s, us in launches],
           "totals_us": dict(sorted(totals.items(), key=lambda kv: -kv[1]))}
    print(f"{B, T, K, C}: wall {wall:.1f} ms, {len(launches)} kernels")
    for n, us in list(res["totals_us"].items())[:12]:
        print(f"  {us / 1e3:9.2f} ms  {n[:90]}")
    for row in res["launches"]:
        if row["us"] > 1000:
            print(f"  at {row['start_us'] / 1e3:8.2f} ms  {row['us'] / 1e3:8.2f} ms  {row['name']}")
    json.dump(res, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
