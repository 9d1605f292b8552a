"""GPU probe: the fix-ups' convergence tolerance (offsets agreeing to within tol * (1 + |value|))
against the fix-up lengths, the times and the accuracy, on random models. One tolerance for every
engine and semiring (both ``plan.FIXUP_TOL`` and ``plan.BLOCKED_LOG_TOL``), as in the run of
GPU_NOTES 68, which set the one constant the engine then had.

A fix-up stops once its last K rows all agree with the stored ones up to one offset. If a row
misses by a few float32 ulps (the two runs' frames differ, so their roundings do), the window
cannot close until that row has left it, K positions later. The slowest chunk sets the fix-up
phase's time. Per shape and TOL: the fix-up steps of the forward and beta (max, median, and how
many chunks needed more than 1.5·K), interleaved medians of the public forward, forward+backward
and Viterbi, and log Z and the gradients against the float64 PyTorch path (where given).

    python benchmarks/probes/tol_ab.py $OUT/tol_ab.json
"""
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_common import random_model  # noqa: E402

from torch_semimarkov import semi_crf_streaming_forward, semi_crf_streaming_viterbi  # noqa: E402
from torch_semimarkov.core.validation import validate_streaming_inputs  # noqa: E402
from torch_semimarkov.engines.triton import launch, parallel  # noqa: E402
from torch_semimarkov.engines.triton import plan as plan_mod  # noqa: E402

TOLS = [1e-6, 4e-6, 1.6e-5]
SHAPES = [((4, 100000, 960, 47), False), ((16, 20000, 960, 47), True), ((16, 10000, 100, 24), True),
          ((2, 50000, 960, 47), False)]
out = {"device": torch.cuda.get_device_name(), "tols": TOLS, "shapes": {}}
def set_tol(tol):
    plan_mod.FIXUP_TOL = plan_mod.BLOCKED_LOG_TOL = tol


rel = lambda x, y: float((x.double() - y.double()).abs().max() / y.double().abs().max().clamp_min(1e-30))  # noqa: E731

for (B, T, K, C), ref64 in SHAPES:
    key = f"{B},{T},{K},{C}"
    cum, tr, db, lengths = random_model(B, T, K, C)
    v = validate_streaming_inputs(cum.detach(), tr.detach(), db.detach(), lengths, K)
    a4 = (v.cum_scores, v.transition, v.duration_bias, v.lengths)
    row = {"steps": {}, "median_ms": {}, "vs_float64": {}, "vs_first_tol": {}}
    for tol in TOLS:
        set_tol(tol)
        st = {}
        for sr, backward in (("log", True), ("log", False), ("max", False)):
            plan = launch.plan_for(v.cum_scores, v.transition, v.K, sr, backward=backward)
            runs = [("forward", lambda: parallel.forward_chunked(*a4, sr, None, None, plan)[3])]
            if sr == "log" and backward:
                runs.append(("beta", lambda: parallel.beta_chunked(*a4, None, None, plan)[2]))
            for name, fn in runs:
                stats = fn()
                s = sorted(x for x in stats.steps.flatten().tolist() if x > 0)
                st[f"{sr} backward={backward} {name}"] = {
                    "n_chunks": plan.n_chunks, "chunk": plan.chunk, "max": s[-1] if s else 0,
                    "median": s[len(s) // 2] if s else 0, "over_1.5K": sum(x > 1.5 * K for x in s),
                    "not_converged": int((~stats.converged).sum()), "redone": int(stats.redone.sum())}
        row["steps"][str(tol)] = st
        print(key, tol, st, flush=True)
    # interleaved timings and outputs
    times = {str(t): {"fwd": [], "fwdbwd": [], "viterbi": []} for t in TOLS}
    outs = {}

    def call(tol, what):
        set_tol(tol)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if what == "fwd":
            r = semi_crf_streaming_forward(cum.detach(), tr.detach(), db.detach(), lengths, K)
        elif what == "viterbi":
            r = semi_crf_streaming_viterbi(cum.detach(), tr.detach(), db.detach(), lengths, K)
        else:
            z = semi_crf_streaming_forward(cum, tr, db, lengths, K)
            r = (z.detach(), *torch.autograd.grad(z.sum(), (cum, tr, db)))
        torch.cuda.synchronize()
        return time.perf_counter() - t0, r

    for tol in TOLS:
        for what in ("fwd", "fwdbwd", "viterbi"):
            call(tol, what)
        outs[str(tol)] = (call(tol, "fwdbwd")[1], call(tol, "viterbi")[1])
    for _ in range(5):
        for tol in TOLS:
            for what in ("fwd", "fwdbwd", "viterbi"):
                times[str(tol)][what].append(call(tol, what)[0])
    row["median_ms"] = {t: {w: 1e3 * statistics.median(x) for w, x in d.items()} for t, d in times.items()}
    base = outs[str(TOLS[0])]
    for t, (g, vit) in outs.items():
        row["vs_first_tol"][t] = {**{n: rel(p, q) for n, p, q in zip(("log_z", "cum", "tr", "db"), g, base[0])},
                                  "viterbi_labels_equal": float((vit.labels == base[1].labels).float().mean()),
                                  "viterbi_score": rel(vit.scores, base[1].scores)}
    if ref64:
        c64, t64, d64 = (x.detach().double().requires_grad_() for x in (cum, tr, db))
        z64 = semi_crf_streaming_forward(c64, t64, d64, lengths, K, backend="torch")
        g64 = (z64.detach(), *torch.autograd.grad(z64.sum(), (c64, t64, d64)))
        for t, (g, _) in outs.items():
            row["vs_float64"][t] = {n: rel(p, q) for n, p, q in zip(("log_z", "cum", "tr", "db"), g, g64)}
    out["shapes"][key] = row
    print(key, row["median_ms"], row["vs_first_tol"], row["vs_float64"], flush=True)
    set_tol(TOLS[0])
    json.dump(out, open(sys.argv[1], "w"), indent=1)
