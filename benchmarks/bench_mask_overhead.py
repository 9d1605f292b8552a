"""Where the extra time of a masked forward+backward goes, on CUDA: host side or kernels.

For each size it times (medians of ``--repeat`` after a warm-up, one run):

* ``fwd_bwd``: the public unmasked log Z + gradients; ``masked`` the same with the benchmark's
  ``label_mask`` and ``boundary_mask`` (``bench_distribution._problem``), and with each alone;
* ``validate_inputs_values``, ``check_masks``, ``engine_masks``: the host-side pieces of a
  masked call (value checks, mask checks, building the limits);
* ``kernels_masked``: the engine's forward + backward launched directly with the limits;
  ``kernels_plan_nomask``: the same plan without limits; ``kernels_default_plan``: the plan of an
  unmasked call.

Then it prints a ``torch.profiler`` table of one masked and one unmasked call.

Usage: ``python benchmarks/bench_mask_overhead.py [--sizes 16,10000,100,24 1,1000000,64,24] [--out F]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def run_size(B, T, K, C, repeat, profile=True):
    from bench_distribution import _problem, _time

    from torch_semimarkov import semi_crf_streaming_forward
    from torch_semimarkov.core import validation as validation_mod
    from torch_semimarkov.engines import select
    from torch_semimarkov.engines.triton import launch
    from torch_semimarkov.core.validation import validate_streaming_inputs

    cum, tr, db, lengths, lm, bm = _problem(B, T, K, C, torch.device("cuda"))

    def fb(**m):
        c, t, d = (x.detach().requires_grad_() for x in (cum, tr, db))
        semi_crf_streaming_forward(c, t, d, lengths, K, **m).sum().backward()

    def timed(fn):
        fn()  # warm-up
        return _time(fn, cum.device, repeat)

    r = dict(B=B, T=T, K=K, C=C)
    r["fwd_bwd"] = timed(fb)
    r["masked"] = timed(lambda: fb(label_mask=lm, boundary_mask=bm))
    r["masked_label_only"] = timed(lambda: fb(label_mask=lm))
    r["masked_boundary_only"] = timed(lambda: fb(boundary_mask=bm))
    inp = validate_streaming_inputs(cum, tr, db, lengths, K)
    r["validate_inputs_values"] = timed(lambda: validate_streaming_inputs(cum, tr, db, lengths, K, check_values=True))
    r["check_masks"] = timed(lambda: validation_mod.check_masks(lm, bm, B, T, C, cum.device))
    lm2, bm2 = validation_mod.check_masks(lm, bm, B, T, C, cum.device)
    r["engine_masks"] = timed(lambda: select.engine_masks(inp, lm2, bm2))
    plan, masks, ps = select.engine_masks(inp, lm2, bm2)
    args = (inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, K)

    def kernels(masks, ps, plan):
        _, state = launch.launch_forward(*args, "log", ps, None, plan=plan, masks=masks)
        launch.launch_backward(*args, ps, None, plan=plan, state=state, masks=masks)

    r["kernels_masked"] = timed(lambda: kernels(masks, ps, plan))
    r["kernels_plan_nomask"] = timed(lambda: kernels(None, None, plan))
    default = launch.plan_for(inp.cum_scores, inp.transition, K)
    r["kernels_default_plan"] = timed(lambda: kernels(None, None, default))
    r["plans_equal"] = str(plan) == str(default)
    r["ratio_masked_over_fwd_bwd"] = r["masked"] / r["fwd_bwd"]
    print(json.dumps(r), flush=True)
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as prof
        for name, fn in (("masked", lambda: fb(label_mask=lm, boundary_mask=bm)), ("unmasked", fb)):
            with prof(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as p:
                fn()
                torch.cuda.synchronize()
            print(f"--- {name} (B={B}, T={T})")
            print(p.key_averages().table(sort_by="cuda_time_total", row_limit=20), flush=True)
    return r


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", default=["16,10000,100,24", "1,1000000,64,24"])
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--out", default="bench_mask_overhead.json")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_mask_overhead needs a CUDA device")
        return 1
    results = [run_size(*(int(x) for x in spec.split(",")), args.repeat, not args.no_profile) for spec in args.sizes]
    with open(args.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, results=results), f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
