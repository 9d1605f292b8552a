"""CPU probe (Triton's interpreter): where along a gene-model slice the float32 forward drifts from
float64, per engine.

The slice of ``gene_slice_accuracy.py`` (``slice_inputs``: the last ``N`` bases of one locus, cum_scores re-zeroed at
its start). For every prefix length t (a multiple of ``--step``) the float64 PyTorch path gives the
prefix's log Z (``lengths = t``); each float32 engine gives it from its stored rows as
``F_t + LSE_c alpha_hat_t(c)`` in one forward. The error of the prefix log Z against t shows where
an engine's forward takes its error in (a jump at a position) or lets it grow (a drift).

    TRITON_INTERPRET=1 python benchmarks/probes/gene_prefix_drift.py /tmp/gene_inputs.pt --n 1500 \\
        --engines blocked,sequential --out results/cpu_gene_prefix_drift.json
"""
import argparse
import ast
import json
import time

import torch

from gene_slice_accuracy import engine_plan, slice_inputs

from torch_semimarkov import semi_crf_streaming_forward
from torch_semimarkov.engines.triton import launch
from torch_semimarkov.engines.triton import plan as plan_mod


def prefix_logz(engine, cum, tr, db, ps, pe, K):
    """Every prefix's log Z (T+1,) float64 from one float32 forward of ``engine``."""
    v, plan = engine_plan(engine, cum, tr, db, ps, pe, K)
    z, state = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, "log",
                                     v.proj_start, v.proj_end, plan=plan, save="all")
    saved, frames = state
    frames = frames[0] if frames.dim() == 3 else frames
    return frames[0].double() + torch.logsumexp(saved[0][0].double(), -1), float(z[0]), plan.kind


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs")
    ap.add_argument("--locus", type=int, default=4)
    ap.add_argument("--n", type=int, default=1500)
    ap.add_argument("--step", type=int, default=50, help="the float64 prefixes: every STEP positions")
    ap.add_argument("--engines", default="blocked,sequential")
    ap.add_argument("--plan", action="append", default=[], metavar="NAME=VALUE",
                    help="set a plan.py setting for the float32 runs (a Python literal), e.g. BLOCKED_LINEAR=False")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    for item in a.plan:
        name, value = item.split("=", 1)
        if not hasattr(plan_mod, name):
            raise SystemExit(f"--plan: plan.py has no setting {name!r}")
        setattr(plan_mod, name, ast.literal_eval(value))
    g = torch.load(a.inputs)
    K = g["K"]
    cum, ps, pe, s0, L = slice_inputs(g, a.locus, a.n)
    tr, db = g["transition"], g["duration_bias"]
    ts = list(range(a.step, a.n + 1, a.step))
    if ts[-1] != a.n:
        ts.append(a.n)
    B = len(ts)
    t0 = time.perf_counter()
    ref = semi_crf_streaming_forward(cum.double().expand(B, -1, -1).contiguous(), tr.double(), db.double(),
                                     torch.tensor(ts), K, proj_start=ps.double().expand(B, -1, -1).contiguous(),
                                     proj_end=pe.double().expand(B, -1, -1).contiguous(), backend="torch")
    print(f"float64 prefixes ({B}) {time.perf_counter() - t0:.1f} s", flush=True)
    res = {"locus": g["names"][a.locus], "slice": [s0, L], "plan": a.plan, "t": ts, "ref": [float(x) for x in ref], "engines": {}}
    for e in a.engines.split(","):
        t0 = time.perf_counter()
        pz, z, kind = prefix_logz(e, cum, tr, db, ps, pe, K)
        err = [float(pz[t] - ref[i]) for i, t in enumerate(ts)]
        res["engines"][e] = {"kind": kind, "seconds": time.perf_counter() - t0, "err": err,
                             "log_Z_rel": abs(z - float(ref[-1])) / abs(float(ref[-1]))}
        print(e, kind, f"{time.perf_counter() - t0:.0f} s", " ".join(f"{t}:{x:+.1e}" for t, x in zip(ts, err)),
              flush=True)
    if a.out:
        json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
