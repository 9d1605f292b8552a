"""GPU probe: how far the engine's float32 log Z and gradients on the gene model are from float64
(issue 25's "equal to float32 rounding against the float64 path on gene-grammar models").

The inputs of ``probes/make_gene_inputs.py`` (a subset of its loci: ``--loci``), run four ways through
the public API: the time-parallel engine with and without the in-order repair's helpers
(``plan.REPAIR_HELPERS``), the same engine one program a sequence (``time_parallel=False``: no fix-ups,
so only float32 rounding), and the float64 PyTorch path (``backend="torch"``, the reference). For each
float32 run: log Z's largest relative error and each gradient's largest error relative to the
reference's largest value, and how many of the time-parallel run's fix-ups converged. GPU_NOTES 89
found the cum_scores gradient of the two time-parallel runs 1.2e-3 apart; this says which is nearer.

    python benchmarks/probes/gene_accuracy.py /tmp/gene_inputs.pt $OUT/gene_accuracy.json [--loci 0,1]

``--tols 1.6e-5,1e-6``: instead, the time-parallel engine (repair helpers on) at each of these fix-up
tolerances of the blocked log semiring (``plan.BLOCKED_LOG_TOL``), each timed warm (its second call).
``--variants default,one_chunk,marg_log,marg_position``: instead, the blocked engine with one plan
setting changed (:data:`VARIANTS`), to find which part of it the gradients' error comes from; each
run also says where its largest cum_scores error lies (locus, position, label, chunk).
``--rounded-ref``: the float64 reference also on the inputs rounded to float32 (what the float32 runs
see), so that the inputs' rounding and the engines' arithmetic are told apart; the float32 runs are
then measured against that one.
"""
import argparse
import json
import time

import torch

from torch_semimarkov import semi_crf_streaming_forward
from torch_semimarkov.engines.triton import plan as plan_mod


def grads(g, idx, dtype, device, rounded=False, **options):
    """log Z and its gradients (cum_scores, transition, duration_bias) for the loci ``idx``
    (``rounded``: the inputs rounded to float32 first)."""
    lengths = g["lengths"][idx]
    T = int(lengths.max())

    def arg(x, grad=True):
        x = (x.float() if rounded else x).to(device, dtype)
        return x.requires_grad_() if grad else x
    cum, tr, db = arg(g["cum_scores"][idx, :T + 1]), arg(g["transition"]), arg(g["duration_bias"])
    kw = dict(proj_start=arg(g["proj_start"][idx, :T], False), proj_end=arg(g["proj_end"][idx, :T], False))
    t0 = time.perf_counter()
    z = semi_crf_streaming_forward(cum, tr, db, lengths.to(device), g["K"], **kw, **options)
    out = (z.detach(),) + torch.autograd.grad(z.sum(), (cum, tr, db))
    if device == "cuda":
        torch.cuda.synchronize()
    return [x.double().cpu() for x in out], time.perf_counter() - t0


#: plan settings of ``--variants``: name -> {plan attribute: value}
VARIANTS = {
    "default": {},
    "one_chunk": {"CHUNK_OVERRIDE": 10**7},  # the blocked engine, one chunk a sequence: no fix-ups
    "marg_log": {"BLOCKED_MARGINALS": "log"},  # every marginal tile term by term
    "marg_position": {"BLOCKED_MARGINALS": "position"},  # the per-position marginal kernel
    "linear_off": {"BLOCKED_LINEAR": False},  # every block sum term by term
    "anchors_2048": {"ANCHOR_SPACING": 2048},  # log-Z anchors every <= 2048 positions, not every chunk
    "anchors_1024": {"ANCHOR_SPACING": 1024},
    "anchors_512": {"ANCHOR_SPACING": 512},
    "old_engine": {},  # one program a sequence (time_parallel=False: the register-ring kernels)
}
#: call options of ``--variants``
VARIANT_OPTIONS = {"old_engine": dict(time_parallel=False)}


def where_worst(got, ref, lengths, chunk):
    """Where the cum_scores gradient's error is largest, and how many entries exceed 1e-3 of scale."""
    err = (got - ref).abs() / ref.abs().max().clamp_min(1e-30)
    b, t, c = (int(i) for i in torch.nonzero(err == err.max())[0])
    return {"locus": b, "length": int(lengths[b]), "position": t, "label": c, "chunk": t // chunk,
            "in_chunk": t % chunk, "got": float(got[b, t, c]), "ref": float(ref[b, t, c]),
            "over_1e-3": int((err > 1e-3).sum()), "over_1e-4": int((err > 1e-4).sum()),
            "worst_per_locus": [float(x) for x in err.flatten(1).max(1).values]}


def errors(got, ref):
    names = ("log_Z", "grad_cum_scores", "grad_transition", "grad_duration_bias")
    res = {}
    for name, a, b in zip(names, got, ref):
        scale = b.abs().max().clamp_min(1e-30) if name != "log_Z" else b.abs().clamp_min(1e-30)
        res[name] = float(((a - b).abs() / scale).max())
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs")
    ap.add_argument("out")
    ap.add_argument("--loci", default="0", help="indices into the inputs' loci (0: the longest)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tols", default=None, help="comma-separated plan.BLOCKED_LOG_TOL values to compare")
    ap.add_argument("--variants", default=None, help="comma-separated names of VARIANTS to compare")
    ap.add_argument("--rounded-ref", action="store_true", help="the reference on float32-rounded inputs too")
    a = ap.parse_args()
    g = torch.load(a.inputs)
    idx = torch.tensor([int(i) for i in a.loci.split(",")])
    res = {"loci": [g["names"][i] for i in idx.tolist()], "lengths": g["lengths"][idx].tolist(), "runs": {}}
    ref, sec = grads(g, idx, torch.float64, a.device, backend="torch")
    res["runs"]["float64 torch"] = {"seconds": sec}
    print("float64 reference", round(sec, 1), "s", flush=True)
    if a.rounded_ref:
        ref32, sec = grads(g, idx, torch.float64, a.device, rounded=True, backend="torch")
        res["runs"]["float64 torch, inputs rounded to float32"] = {"seconds": sec, "errors": errors(ref32, ref)}
        print("float64 on rounded inputs against float64", res["runs"]["float64 torch, inputs rounded to float32"],
              flush=True)
        ref = ref32
    # each run: (name, plan settings for the call, call options)
    runs = (("time-parallel, repair helpers", {}, {}),
            ("time-parallel, no repair helpers", {"REPAIR_HELPERS": False}, {}),
            ("one program a sequence", {}, dict(time_parallel=False)))
    if a.tols:
        runs = tuple((f"time-parallel, tol {t}", {"BLOCKED_LOG_TOL": float(t)}, {}) for t in a.tols.split(","))
        runs += (("one program a sequence", {}, dict(time_parallel=False)),)
    if a.variants:
        runs = tuple((v, VARIANTS[v], VARIANT_OPTIONS.get(v, {})) for v in a.variants.split(","))
    lengths = g["lengths"][idx]
    T = int(lengths.max())
    for name, settings, options in runs:
        saved = {k: getattr(plan_mod, k) for k in settings}
        for k, v in settings.items():
            setattr(plan_mod, k, v)
        try:
            got, sec = grads(g, idx, torch.float32, a.device, **options)
            if "BLOCKED_LOG_TOL" in settings:  # timed warm
                got2, sec = grads(g, idx, torch.float32, a.device, **options)
                assert all(torch.equal(x, y) for x, y in zip(got, got2)), "not deterministic"
            res["runs"][name] = {"seconds": sec, "errors": errors(got, ref)}
            if a.variants:
                pl = plan_mod.make_plan(len(idx), T, g["K"], g["transition"].shape[-1], device=a.device,
                                        backward=True, time_parallel=options.get("time_parallel"))
                worst = where_worst(got[1], ref[1], lengths, pl.chunk)
                worst.update(chunk_length=pl.chunk, n_chunks=pl.n_chunks, kind=pl.kind)
                print("  worst", worst, flush=True)
                res["runs"][name]["worst_cum_scores"] = worst
        finally:
            for k, v in saved.items():
                setattr(plan_mod, k, v)
        print(name, round(sec, 2), "s", {k: f"{v:.2e}" for k, v in res["runs"][name]["errors"].items()}, flush=True)
        json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
