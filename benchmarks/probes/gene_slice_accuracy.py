"""CPU probe (Triton's interpreter): the gene model's float32 error against float64 on one short slice,
so that GPU_NOTES 92's finding can be worked on without a GPU.

The last ``N`` bases of one locus of ``probes/make_gene_inputs.py``'s inputs (cum_scores re-zeroed at
the slice's start; the model's own proj_start / proj_end, duration bias and transition), run through
the engine's launches in float32 and through the float64 PyTorch path: log Z's relative error and the
cum_scores gradient's largest error relative to its largest value, and where it lies.

    make_gene_inputs.py --data DIR --config ghmm.json --loci 8 --out /tmp/gene_inputs.pt
    TRITON_INTERPRET=1 python benchmarks/probes/gene_slice_accuracy.py /tmp/gene_inputs.pt --n 1500 \\
        --engine blocked [--anchor-spacing 250]

``--engine blocked`` forces the blocked memory-ring engine (one chunk: ``DEFAULT_SMS = 1``),
``sequential`` the one-program-a-sequence kernels. On the 26 kb test locus (index 4) with N = 1500:
about 4 minutes a run on one core.
"""
import argparse
import json
import time

import torch

from torch_semimarkov import semi_crf_streaming_forward
from torch_semimarkov.core.validation import validate_streaming_inputs
from torch_semimarkov.engines.interface import scale_grads
from torch_semimarkov.engines.triton import launch
from torch_semimarkov.engines.triton import plan as plan_mod


def slice_inputs(g, locus, n):
    """The last ``n`` bases of locus ``locus`` of ``make_gene_inputs.py``'s inputs, cum_scores re-zeroed at
    the slice's start: ``(cum (1, n+1, C), proj_start (1, n, C), proj_end (1, n, C), s0, L)``."""
    L = int(g["lengths"][locus])
    s0 = L - n
    cum = (g["cum_scores"][locus, s0:L + 1] - g["cum_scores"][locus, s0])[None]
    ps, pe = g["proj_start"][locus, s0:L][None], g["proj_end"][locus, s0:L][None]
    return cum, ps, pe, s0, L


def engine_plan(engine, cum, tr, db, ps, pe, K):
    """The validated inputs and the log-semiring plan of ``engine``: "blocked" forces the blocked memory-ring
    engine with one chunk (``DEFAULT_SMS = 1``), "sequential" one program a sequence."""
    plan_mod.FORCE_BLOCKED = engine == "blocked"
    plan_mod.DEFAULT_SMS = 1
    v = validate_streaming_inputs(cum_scores=cum, transition=tr, duration_bias=db,
                                  lengths=torch.tensor([cum.shape[1] - 1]), K=K, semiring="log", proj_start=ps,
                                  proj_end=pe)
    plan = launch.plan_for(v.cum_scores, v.transition, v.K, "log", backward=True,
                           time_parallel=None if engine == "blocked" else False)
    return v, plan


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs")
    ap.add_argument("--locus", type=int, default=4, help="index into the inputs' loci (4: chr2R_2749462-2775931)")
    ap.add_argument("--n", type=int, default=1500, help="the slice: the locus' last N bases")
    ap.add_argument("--engine", choices=("blocked", "sequential"), default="blocked")
    ap.add_argument("--anchor-spacing", type=int, default=None, help="plan.ANCHOR_SPACING")
    ap.add_argument("--out", default=None, help="a JSON file for the result")
    a = ap.parse_args()
    g = torch.load(a.inputs)
    K, n = g["K"], a.n
    cum, ps, pe, s0, L = slice_inputs(g, a.locus, n)
    tr, db, lengths = g["transition"], g["duration_bias"], torch.tensor([n])

    t0 = time.perf_counter()
    c64 = cum.double().requires_grad_()
    z_ref = semi_crf_streaming_forward(c64, tr.double(), db.double(), lengths, K, proj_start=ps.double(),
                                       proj_end=pe.double(), backend="torch")
    g_ref = torch.autograd.grad(z_ref.sum(), c64)[0]
    z_ref = z_ref.detach()
    print(f"float64 reference {time.perf_counter() - t0:.1f} s", flush=True)

    plan_mod.ANCHOR_SPACING = a.anchor_spacing
    t0 = time.perf_counter()
    v, plan = engine_plan(a.engine, cum, tr, db, ps, pe, K)
    z, state = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, "log",
                                     v.proj_start, v.proj_end, plan=plan)
    p_s, p_e, _, _ = launch.launch_backward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K,
                                            v.proj_start, v.proj_end, plan=plan, state=state)
    # the engine's own turn of the marginals into the cum_scores gradient
    got = scale_grads(g_ref, (True, False, False, False, False), torch.ones(1, dtype=torch.float64),
                      p_s.double(), p_e.double(), None, None)[0]
    err = (got - g_ref).abs() / g_ref.abs().max()
    worst = [int(i) for i in torch.nonzero(err == err.max())[0]]
    res = {"locus": g["names"][a.locus], "slice": [s0, L], "engine": a.engine, "kind": plan.kind,
           "anchor_spacing": plan_mod.anchor_spacing(plan, n), "seconds": time.perf_counter() - t0,
           "log_Z": float(z_ref[0]), "log_Z_rel": float(((z.double() - z_ref).abs() / z_ref.abs())[0]),
           "grad_cum_scores": float(err.max()), "worst": {"position": worst[1], "label": worst[2],
                                                          "got": float(got[tuple(worst)]),
                                                          "ref": float(g_ref[tuple(worst)])},
           "over_1e-3": int((err > 1e-3).sum()), "over_1e-4": int((err > 1e-4).sum()),
           "proj_range": [float(ps[ps > -1e29].min()), float(ps[ps > -1e29].max())]}
    print(json.dumps(res), flush=True)
    if a.out:
        json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
