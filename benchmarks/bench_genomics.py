"""GPU benchmark, genomics shapes: the blocked memory-ring engine against one program per sequence.

Rings of more than 16,384 padded K·C elements (gene grammars: C ~ 50 labels, K ~ 10^3) ran one
program per sequence with the ring in memory (``time_parallel=False`` still selects that engine);
they now run the blocked engine (``kernels/blocked.py``), parallel over time. In one run, on the
same inputs (float32 zero-centred scores, transition and duration bias ~ 0.1 N(0, 1), full
lengths; ``bench_parallel.make_inputs``), this script records:

* ``engines``: forward, forward+backward and Viterbi labels through the public API (medians of
  CUDA-event timings after warm-up) for the new engine and the old one (fewer runs where one old
  call takes seconds; ``--old-max-s`` skips the old engine where its forward alone would exceed it);
  the exp-count floor B·T·(K·C + C²) / rate;
* ``accuracy``: log Z and gradients of the new engine against the old one (both float32 kernels)
  and, at the small shape, against the float64 PyTorch path;
* ``fixups``: positions the fix-ups ran (forward, Viterbi forward, beta) and repaired chunks;
* ``gene``: the same on a gene-grammar model (``--gene-inputs``: a GHMM over ``GeneGrammar``,
  C = 47, K = 960, on real ``genes.gb.test`` loci, made by ``.gpu/make_gene_inputs.py``);
* ``sweep``: forward time against K·C at B·T = 16 x 10^4, C = 47, both engines (for the plot);
* ``kcc``: ``engines`` for a (K, C, C) transition (``KCC_SHAPES``; ``--kcc-shapes`` picks some): the
  chunked direct recurrence against one program per sequence.

    python benchmarks/bench_genomics.py --out results/gpu_h200_genomics.json [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from bench_parallel import exp_rate, fixup_stats, make_inputs, median_ms  # noqa: E402

from torch_semimarkov import semi_crf_streaming_forward  # noqa: E402
from torch_semimarkov.engines.triton import launch  # noqa: E402
from torch_semimarkov.core.validation import validate_streaming_inputs  # noqa: E402

SHAPES = [  # (B, T, K, C), issue targets in ms (forward, forward+backward, Viterbi; None: none)
    ((32, 3000, 960, 47), (None, 20, None)),
    ((16, 20000, 960, 47), (None, None, None)),
    ((4, 100_000, 960, 47), (30, 90, 40)),
    ((1, 100_000, 4000, 47), (120, None, None)),
]
SWEEP_K = [128, 256, 512, 960, 2000]
#: (K, C, C) transitions (``bench_parallel.make_inputs(kcc=True)``): states of more than 16,384
#: padded K·C values once ran one program per sequence; they now run the chunked direct recurrence
KCC_SHAPES = [(1, 20_000, 500, 47), (4, 20_000, 960, 47), (1, 100_000, 960, 47)]


def log(*a):
    print(*a, flush=True)


def calls(cum, tr, db, lengths, K, flag, ps=None, pe=None):
    """forward, forward+backward and Viterbi-labels closures of one engine on these inputs."""
    B = cum.shape[0]
    leaves = [x.detach().clone().requires_grad_(True) for x in (cum, tr, db)]
    up = torch.rand(B, device=cum.device, generator=torch.Generator(device=cum.device).manual_seed(1)) + 0.5

    def fwd():
        return semi_crf_streaming_forward(cum, tr, db, lengths, K, proj_start=ps, proj_end=pe, time_parallel=flag)

    def fb():
        z = semi_crf_streaming_forward(leaves[0], leaves[1], leaves[2], lengths, K, proj_start=ps, proj_end=pe,
                                       time_parallel=flag)
        (z * up).sum().backward()
        grads = [x.grad for x in leaves]
        for x in leaves:
            x.grad = None
        return z.detach(), grads

    def vit():
        v = validate_streaming_inputs(cum, tr, db, lengths, K, "max", proj_start=ps, proj_end=pe)
        plan = launch.plan_for(v.cum_scores, v.transition, v.K, "max", time_parallel=flag)
        return launch.launch_viterbi(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, v.proj_start,
                                     v.proj_end, plan=plan)

    return fwd, fb, vit


def compare(new, old):
    """Largest relative differences of log Z and of each gradient (relative to the gradient's scale)."""
    (z1, g1), (z2, g2) = new, old
    out = {"log_z_rel": float(((z1 - z2).abs() / z2.abs().clamp(min=1)).max())}
    for name, a, b in zip(("cum_scores", "transition", "duration_bias"), g1, g2):
        out[f"grad_{name}_rel"] = float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1e-30))
    return out


def time_both(B, T, K, C, opts, inputs=None):
    cum, tr, db, lengths = inputs[:4] if inputs else make_inputs(B, T, K, C)
    ps, pe = (inputs[4], inputs[5]) if inputs else (None, None)
    res = {"B": B, "T": T, "K": K, "C": C}
    plan = launch.plan_for(cum, tr, K, "log")
    res["plan"] = {"kind": plan.kind, "time_parallel": plan.time_parallel, "chunk": plan.chunk,
                   "n_chunks": plan.n_chunks, "num_warps": plan.num_warps, "bt": plan.bt, "rb": plan.rb, "cb": plan.cb,
                   "helpers": plan.helpers}
    # a differentiated forward's plan (chunks for beta beside it, helpers) and Viterbi's; "helpers" is the
    # plan's count, of which linear-space sums take only what they need at launch (plan.linear_helpers)
    pb, pv = launch.plan_for(cum, tr, K, "log", backward=True), launch.plan_for(cum, tr, K, "max")
    res["plan_fwd_bwd"] = {"chunk": pb.chunk, "n_chunks": pb.n_chunks, "beta_early": pb.beta_early,
                           "helpers": pb.helpers}
    res["plan_viterbi"] = {"chunk": pv.chunk, "n_chunks": pv.n_chunks, "helpers": pv.helpers}
    f, fb, vit = calls(cum, tr, db, lengths, K, None, ps, pe)
    res["new"] = {"forward_ms": median_ms(f), "fwd_bwd_ms": median_ms(fb), "viterbi_ms": median_ms(vit)}
    torch.cuda.empty_cache()
    log("  new", res["new"])
    # one old forward first: its cost decides how many old runs fit (timed on a second call, the
    # first compiles; a long forward is timed cold, its compilation a small part of it)
    f_old, fb_old, vit_old = calls(cum, tr, db, lengths, K, False, ps, pe)
    for _ in range(2):
        t0 = time.time()
        f_old()
        torch.cuda.synchronize()
        est = time.time() - t0
        if est > opts.old_max_s:
            break
    if est > opts.old_max_s:
        # the one forward is the old engine's forward time (wall clock, synchronised)
        res["old"] = {"forward_ms": 1e3 * est, "runs": 1,
                      "skipped": f"forward+backward and Viterbi: one forward took {est:.1f} s > --old-max-s"}
        res["speedup"] = {"forward_ms": res["old"]["forward_ms"] / res["new"]["forward_ms"]}
    else:
        # the forward is warm; forward+backward and Viterbi take one warm-up call each (compilation)
        runs = 1 if est > 1.0 else 3
        res["old"] = {"forward_ms": median_ms(f_old, min_runs=runs, budget_s=0, warmup=0),
                      "fwd_bwd_ms": median_ms(fb_old, min_runs=runs, budget_s=0, warmup=1),
                      "viterbi_ms": median_ms(vit_old, min_runs=runs, budget_s=0, warmup=1)}
        res["old"]["runs"] = runs
        res["speedup"] = {k: res["old"][k] / res["new"][k] for k in ("forward_ms", "fwd_bwd_ms", "viterbi_ms")}
        res["accuracy_vs_old"] = compare(fb(), fb_old())
        s1, l1, _ = vit()
        s2, l2, _ = vit_old()
        res["accuracy_vs_old"]["viterbi_score_rel"] = float(((s1 - s2).abs() / s2.abs().clamp(min=1)).max())
        res["accuracy_vs_old"]["viterbi_label_agreement"] = float((l1 == l2).double().mean())
        log("  old", res["old"], res["accuracy_vs_old"])
    torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="the two smaller shapes only")
    ap.add_argument("--old-max-s", type=float, default=4.0)
    ap.add_argument("--gene-inputs", default=None)
    ap.add_argument("--only", default=None, help="comma-separated sections")
    ap.add_argument("--shapes", default=None, help="engines: comma-separated indices into SHAPES (default: all)")
    ap.add_argument("--kcc-shapes", default=None, help="kcc: comma-separated indices into KCC_SHAPES (default: all)")
    opts = ap.parse_args()
    only = set(opts.only.split(",")) if opts.only else None
    rate = exp_rate()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "exp_per_s": rate}
    import triton

    report["triton"] = triton.__version__

    def save():
        with open(opts.out, "w") as fh:
            json.dump(report, fh, indent=1)

    if only is None or "engines" in only:
        report["engines"] = []
        shapes = SHAPES[:2] if opts.quick else SHAPES
        if opts.shapes:
            shapes = [SHAPES[int(i)] for i in opts.shapes.split(",")]
        for (B, T, K, C), targets in shapes:
            log(f"shape {(B, T, K, C)}")
            r = time_both(B, T, K, C, opts)
            r["targets_ms"] = dict(zip(("forward_ms", "fwd_bwd_ms", "viterbi_ms"), targets))
            r["exp_floor_ms"] = 1e3 * B * T * (K * C + C * C) / rate
            report["engines"].append(r)
            save()
    if only is None or "accuracy" in only:
        B, T, K, C = SHAPES[0][0]
        cum, tr, db, lengths = make_inputs(B, T, K, C)
        z32 = semi_crf_streaming_forward(cum, tr, db, lengths, K)
        z64 = semi_crf_streaming_forward(cum.double(), tr.double(), db.double(), lengths, K, backend="torch")
        report["accuracy_vs_float64_torch"] = {"shape": [B, T, K, C],
                                               "log_z_rel": float(((z32 - z64).abs() / z64.abs()).max()),
                                               "log_z_abs": float((z32 - z64).abs().max())}
        log("float64", report["accuracy_vs_float64_torch"])
        save()
    if only is None or "fixups" in only:
        report["fixups"] = []
        for (B, T, K, C), _ in SHAPES[:3]:
            report["fixups"].append({"shape": [B, T, K, C], **(fixup_stats(B, T, K, C) or {})})
            log("fixups", report["fixups"][-1])
            save()
    if opts.gene_inputs and (only is None or "gene" in only):
        g = torch.load(opts.gene_inputs)
        dev = "cuda"
        inp = [g[k].to(dev) for k in ("cum_scores", "transition", "duration_bias", "lengths", "proj_start", "proj_end")]
        B, T1, C = inp[0].shape
        log(f"gene model {B} x {T1 - 1}, C {C}, K {g['K']}, loci {g['names']}")
        r = time_both(B, T1 - 1, g["K"], C, opts, inputs=inp)
        r["loci"] = g["names"]
        r["lengths"] = g["lengths"].tolist()
        v = validate_streaming_inputs(*inp[:4], g["K"], proj_start=inp[4], proj_end=inp[5])
        plan = launch.plan_for(v.cum_scores, v.transition, v.K, "log")
        from torch_semimarkov.engines.triton import parallel

        st = parallel.forward_chunked(v.cum_scores, v.transition, v.duration_bias, v.lengths, "log", v.proj_start,
                                      v.proj_end, plan)[3]
        ran = [s for s in st.steps.flatten().tolist() if s > 0]
        r["fixup_forward"] = {"steps": sorted(ran), "K": g["K"], "converged_fraction": float(st.converged.double().mean()),
                              "redone_chunks": int(st.redone.sum())}
        report["gene"] = r
        log("gene", r)
        save()
    if only is not None and "kcc" in only:  # not by default: the old engine's (K, C, C) forwards take seconds
        report["kcc"] = []
        picked = [KCC_SHAPES[int(i)] for i in opts.kcc_shapes.split(",")] if opts.kcc_shapes else KCC_SHAPES
        for B, T, K, C in picked:
            log(f"kcc {(B, T, K, C)}")
            r = time_both(B, T, K, C, opts, inputs=make_inputs(B, T, K, C, kcc=True) + (None, None))
            r["exp_floor_ms"] = 1e3 * B * T * K * C * C / rate
            report["kcc"].append(r)
            save()
    if only is None or "sweep" in only:
        report["sweep"] = []
        B, T, C = 16, 10_000, 47
        for K in SWEEP_K:
            cum, tr, db, lengths = make_inputs(B, T, K, C)
            f_new = lambda: semi_crf_streaming_forward(cum, tr, db, lengths, K)  # noqa: E731
            f_old = lambda: semi_crf_streaming_forward(cum, tr, db, lengths, K, time_parallel=False)  # noqa: E731
            row = {"B": B, "T": T, "K": K, "C": C, "KC": K * C, "kind": launch.plan_for(cum, tr, K, "log").kind,
                   "new_forward_ms": median_ms(f_new), "old_forward_ms": median_ms(f_old, min_runs=2, budget_s=0)}
            report["sweep"].append(row)
            log("sweep", row)
            save()
    save()


if __name__ == "__main__":
    main()
