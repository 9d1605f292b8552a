"""GPU probe: the in-order repair with and without helper programs of its own
(``plan.REPAIR_HELPERS``, ``KernelPlan.repair_helpers``), interleaved in one process: forward, forward+
backward and Viterbi through the public API on the gene model of ``probes/make_gene_inputs.py`` (whose
fix-ups do not converge, so the repair is most of its time: GPU_NOTES 88) and on random models at
genomics shapes (whose repair has nothing to do); medians, each phase of the gene model's calls timed
alone once (``max_bounds_ab.phase_times``), and how far the outputs are apart.

    python benchmarks/probes/repair_helpers_ab.py $OUT/repair_helpers_ab.json --gene FILE [--shapes "B,T,K,C;..."]
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from ab_common import gene_model, random_model  # noqa: E402
from max_bounds_ab import phase_times  # noqa: E402

from torch_semimarkov import semi_crf_streaming_forward, semi_crf_streaming_viterbi  # noqa: E402
from torch_semimarkov.engines.triton import plan as plan_mod  # noqa: E402

SHAPES = "4,100000,960,47;16,20000,960,47"


def calls(cum, tr, db, lengths, K, kw):
    """The three timed calls of one model: name -> callable returning what is compared."""
    def fwd():
        return (semi_crf_streaming_forward(cum.detach(), tr.detach(), db.detach(), lengths, K, **kw),)

    def fwdbwd():
        z = semi_crf_streaming_forward(cum, tr, db, lengths, K, **kw)
        return (z.detach(),) + torch.autograd.grad(z.sum(), (cum, tr, db))

    def viterbi():
        r = semi_crf_streaming_viterbi(cum.detach(), tr.detach(), db.detach(), lengths, K, **kw)
        return r.scores, r.labels

    return {"fwd": fwd, "fwdbwd": fwdbwd, "viterbi": viterbi}


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def apart(a, b):
    """The largest difference of each output relative to its largest value (labels: the share that differ)."""
    res = []
    for x, y in zip(a, b):
        if x.dtype in (torch.int64, torch.int32, torch.bool):
            res.append(float((x != y).float().mean()))
        else:
            res.append(float((x.double() - y.double()).abs().max() / x.double().abs().max().clamp_min(1e-30)))
    return res


def run(name, model, kw, K, rounds, res, phases=False):
    cum, tr, db, lengths = model
    fns = calls(cum, tr, db, lengths, K, kw)
    settings = (False, True)
    outs, times = {}, {s: {c: [] for c in fns} for s in settings}
    entry = {"median_ms": {}, "apart": {}, "phase_ms": {}}
    for s in settings:
        plan_mod.REPAIR_HELPERS = s
        for c, fn in fns.items():
            fn()
            outs[(s, c)] = timed(fn)[1]
            if phases and c != "fwdbwd":
                entry["phase_ms"][f"{c} {'on' if s else 'off'}"] = phase_times(fn)
    for _ in range(rounds):
        for c, fn in fns.items():
            for s in settings:
                plan_mod.REPAIR_HELPERS = s
                times[s][c].append(timed(fn)[0])
    for c in fns:
        entry["median_ms"][c] = {("on" if s else "off"): 1e3 * statistics.median(times[s][c]) for s in settings}
        entry["apart"][c] = apart(outs[(False, c)], outs[(True, c)])
    entry["times_s"] = {("on" if s else "off"): times[s] for s in settings}
    res["runs"][name] = entry
    print(name, {c: {k: round(v, 1) for k, v in m.items()} for c, m in entry["median_ms"].items()},
          "apart", entry["apart"], flush=True)
    for k, v in entry["phase_ms"].items():
        print("   ", k, {p: round(x, 1) for p, x in v.items()}, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--gene", default=None)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    res = {"device": torch.cuda.get_device_name(), "runs": {}}
    if a.gene:
        model, kw, K = gene_model(a.gene)
        run(f"gene {tuple(model[0].shape)}", model, kw, K, a.rounds, res, phases=True)
        json.dump(res, open(a.out, "w"), indent=1)
    for s in filter(None, a.shapes.split(";")):
        B, T, K, C = (int(x) for x in s.split(","))
        run(s, random_model(B, T, K, C), {}, K, a.rounds, res)
        json.dump(res, open(a.out, "w"), indent=1)
    plan_mod.REPAIR_HELPERS = False
    json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
