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
"""
import argparse
import json
import time

import torch

from torch_semimarkov import semi_crf_streaming_forward
from torch_semimarkov.engines.triton import plan as plan_mod


def grads(g, idx, dtype, device, **options):
    """log Z and its gradients (cum_scores, transition, duration_bias) for the loci ``idx``."""
    lengths = g["lengths"][idx]
    T = int(lengths.max())
    cum = g["cum_scores"][idx, :T + 1].to(device, dtype).requires_grad_()
    tr = g["transition"].to(device, dtype).requires_grad_()
    db = g["duration_bias"].to(device, dtype).requires_grad_()
    kw = dict(proj_start=g["proj_start"][idx, :T].to(device, dtype), proj_end=g["proj_end"][idx, :T].to(device, dtype))
    t0 = time.perf_counter()
    z = semi_crf_streaming_forward(cum, tr, db, lengths.to(device), g["K"], **kw, **options)
    out = (z.detach(),) + torch.autograd.grad(z.sum(), (cum, tr, db))
    if device == "cuda":
        torch.cuda.synchronize()
    return [x.double().cpu() for x in out], time.perf_counter() - t0


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
    a = ap.parse_args()
    g = torch.load(a.inputs)
    idx = torch.tensor([int(i) for i in a.loci.split(",")])
    res = {"loci": [g["names"][i] for i in idx.tolist()], "lengths": g["lengths"][idx].tolist(), "runs": {}}
    ref, sec = grads(g, idx, torch.float64, a.device, backend="torch")
    res["runs"]["float64 torch"] = {"seconds": sec}
    print("float64 reference", round(sec, 1), "s", flush=True)
    runs = (("time-parallel, repair helpers", dict(), True), ("time-parallel, no repair helpers", dict(), False),
            ("one program a sequence", dict(time_parallel=False), True))
    for name, options, repair in runs:
        plan_mod.REPAIR_HELPERS = repair
        got, sec = grads(g, idx, torch.float32, a.device, **options)
        res["runs"][name] = {"seconds": sec, "errors": errors(got, ref)}
        print(name, round(sec, 2), "s", {k: f"{v:.2e}" for k, v in res["runs"][name]["errors"].items()}, flush=True)
        json.dump(res, open(a.out, "w"), indent=1)
    plan_mod.REPAIR_HELPERS = True
    json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
