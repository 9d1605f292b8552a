"""GPU probe: the host time of the steps a public call takes before its first engine launch, each
timed alone on CUDA (median of N calls, the device synchronised before each), at one shape:
the input checks (``streaming_inputs``), ``forbid`` of one (C, C) tensor, the value statistics
(``value_stats``) and their read, the plan, and the chunk state's allocations. Where
``host_gaps.py`` says *when* each step runs inside one call, this says what each one costs and
what its parts cost.

    python benchmarks/probes/host_steps.py OUT.json "32,3000,960,47" [N]
"""
import json
import statistics
import sys
import time

import torch

from torch_semimarkov.core import validation, values
from torch_semimarkov.engines.triton import launch, parallel


def timed(fn, n):
    out = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return round(statistics.median(out) * 1e6, 1)


def main():
    out, shape = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    B, T, K, C = (int(x) for x in shape.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    cum = torch.nn.functional.pad((torch.randn(B, T, C, device="cuda", generator=g) * 0.5).cumsum(1),
                                  (0, 0, 1, 0)).requires_grad_()
    tr = (torch.randn(C, C, device="cuda", generator=g) * 0.3).requires_grad_()
    db = (torch.randn(K, C, device="cuda", generator=g) * 0.3).requires_grad_()
    lengths = torch.full((B,), T, device="cuda")
    inp = validation.streaming_inputs(cum, tr, db, lengths, K)
    floats = values.float_inputs(inp.cum_scores, inp.transition, inp.duration_bias, None, None)
    dev = cum.device
    steps = {
        "streaming_inputs": lambda: validation.streaming_inputs(cum, tr, db, lengths, K),
        "forbid(tr)": lambda: validation.forbid(tr),
        "tr <= NEG_INF": lambda: tr <= -1e9,
        "full_like(tr)": lambda: torch.full_like(tr, -1e30),
        "where(m, scalar, tr)": lambda: torch.where(tr <= -1e9, -1e30, tr),
        "tr.detach()": lambda: tr.detach(),
        "empty (B, n) int32": lambda: torch.empty((B, 1), device=dev, dtype=torch.int32),
        "zeros (B, n) int32": lambda: torch.zeros((B, 1), device=dev, dtype=torch.int32),
        "value_stats": lambda: values.value_stats(floats, inp.lengths),
        "value_stats + tolist": lambda: values.value_stats(floats, inp.lengths).tolist(),
        "check_input_values": lambda: values.check_input_values(inp.cum_scores, inp.transition, inp.duration_bias,
                                                                inp.lengths),
        "aminmax(cum)": lambda: torch.aminmax(inp.cum_scores.detach()),
        "plan_for": lambda: launch.plan_for(inp.cum_scores, inp.transition, K, backward=True),
        "_chunk_state": lambda: parallel._chunk_state(B, 1, K * C + 64, K + 1, 0, dev),
    }
    res = {"device": torch.cuda.get_device_name(), "shape": shape, "n": n, "us": {}}
    for name, fn in steps.items():
        for _ in range(5):
            fn()
        res["us"][name] = timed(fn, n)
        print(f"{name:>24}: {res['us'][name]:8.1f} us", flush=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
