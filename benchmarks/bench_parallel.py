"""GPU benchmark: the time-parallel engine against one program per sequence, in one run.

For each configuration of the issue's table it times, with both engines on the same inputs:

* forward: the public ``semi_crf_streaming_forward`` without gradients (validation + launch);
* forward+backward: the public autograd API, ``.backward()`` on a random upstream gradient;
* Viterbi labels: validation + the Viterbi launcher (max-semiring forward and on-GPU traceback into
  per-position labels and segment starts; no Python segment lists);

medians of CUDA-event timings after warm-up (a few runs for the slow sequential cases). It also
records, per engine, how many positions the fix-ups needed (forward, beta, max-semiring forward)
and how many chunks the repair redid, the exp-count floor, the cost of adversarial models that
never converge (a cyclic grammar, a reading-frame grammar), a training step (Conv encoder + head),
one sequence of T = 10^8, a sweep over T at B = 1 for the plot, and (K, C, C) transitions (section
``kcc``: B = 1, T = 10^6, K = 32, C = 8 and B = 4, T = 10^5, K = 64, C = 8, and a cyclic (K, C, C)
grammar). Inputs: float32 zero-centred scores, transition and duration bias ~ 0.1 N(0, 1), full
lengths.

    python benchmarks/bench_parallel.py --out results.json [--quick] [--no-1e8] [--only kcc]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from torch_semimarkov import SemiMarkovCRFHead, semi_crf_streaming_forward  # noqa: E402
from torch_semimarkov.engines.triton import launch, parallel  # noqa: E402
from torch_semimarkov.core.validation import validate_streaming_inputs  # noqa: E402

CONFIGS = [  # (B, T, K, C), issue targets in ms: forward, forward+backward, Viterbi labels
    ((1, 1_000_000, 64, 24), (20, 60, 40)),
    ((1, 10_000_000, 64, 8), (100, 300, 200)),
    ((4, 100_000, 1000, 8), (15, 50, 20)),
    ((16, 10_000, 100, 24), (3, 10, 4)),
    ((1024, 1000, 100, 24), (12.2, 53, 9.7)),
]
SWEEP = [1_000, 10_000, 100_000, 1_000_000, 10_000_000]  # B = 1, K = 64, C = 8
KCC_CONFIGS = [(1, 1_000_000, 32, 8), (4, 100_000, 64, 8)]  # (K, C, C) transitions


def make_inputs(B, T, K, C, seed=0, model="random", kcc=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    scores = torch.randn(B, T, C, device="cuda", generator=g)
    scores = scores - scores.mean(1, keepdim=True)
    cum = torch.nn.functional.pad(scores.cumsum(1), (0, 0, 1, 0))
    tr = 0.1 * torch.randn(C, C, device="cuda", generator=g)
    db = 0.1 * torch.randn(K, C, device="cuda", generator=g)
    if model in ("cyclic", "cyclic-strong"):  # only c -> c+1, long segments preferred
        tr = torch.full((C, C), -math.inf, device="cuda")
        idx = torch.arange(C, device="cuda")
        tr[idx, (idx + 1) % C] = 0.0
        slope = 0.5 if model == "cyclic-strong" else 0.05
        db = (torch.arange(1, K + 1, device="cuda", dtype=torch.float32)[:, None] * slope).expand(K, C).contiguous()
    elif model == "frame":  # label 0 in multiples of 3; 0 -> 1 -> 2 -> 0 and 0 -> 0
        tr = torch.full((C, C), -math.inf, device="cuda")
        tr[0, 1] = tr[1, 2] = tr[2, 0] = tr[0, 0] = 0.0
        k = torch.arange(1, K + 1, device="cuda")
        db = torch.zeros(K, C, device="cuda")
        db[k % 3 != 0, 0] = -math.inf
    if kcc:  # (K, C, C): the same allowed moves for every duration, duration-dependent scores
        k = torch.arange(1, K + 1, device="cuda", dtype=torch.float32)[:, None, None]
        tr = torch.where(torch.isfinite(tr)[None], tr[None] + 0.1 * torch.randn(K, C, C, device="cuda", generator=g)
                         + 0.05 * (k % 3), tr[None]).contiguous()
    lengths = torch.full((B,), T, device="cuda", dtype=torch.int64)
    return cum, tr, db, lengths


def median_ms(fn, min_runs=3, budget_s=3.0, warmup=1):
    """Median of CUDA-event timings: at least ``min_runs``, more while under ``budget_s``."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times, t0 = [], time.time()
    while len(times) < min_runs or (time.time() - t0 < budget_s and len(times) < 50):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def exp_rate():
    from bench_gpu import exp_rate as rate

    return rate()


def time_engine(B, T, K, C, parallel_flag, model="random", what=("forward", "fwd_bwd", "viterbi"), runs=3, num_warps=None,
                kcc=False):
    cum, tr, db, lengths = make_inputs(B, T, K, C, model=model, kcc=kcc)
    out = {}
    if "forward" in what:
        out["forward_ms"] = median_ms(lambda: semi_crf_streaming_forward(
            cum, tr, db, lengths, K, time_parallel=parallel_flag, num_warps=num_warps), min_runs=runs)
    if "fwd_bwd" in what:
        leaves = [x.detach().clone().requires_grad_(True) for x in (cum, tr, db)]
        up = torch.rand(B, device="cuda") + 0.5

        def fb():
            z = semi_crf_streaming_forward(leaves[0], leaves[1], leaves[2], lengths, K, time_parallel=parallel_flag,
                                           num_warps=num_warps)
            (z * up).sum().backward()
            for x in leaves:
                x.grad = None

        out["fwd_bwd_ms"] = median_ms(fb, min_runs=runs)
        torch.cuda.empty_cache()
    if "viterbi" in what:
        def vit():
            v = validate_streaming_inputs(cum, tr, db, lengths, K, "max")
            plan = launch.plan_for(v.cum_scores, v.transition, v.K, "max", time_parallel=parallel_flag)
            return launch.launch_viterbi(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, plan=plan)

        out["viterbi_ms"] = median_ms(vit, min_runs=runs)
    torch.cuda.empty_cache()
    return out


def fixup_stats(B, T, K, C, model="random", kcc=False):
    """Positions the fix-ups ran per chunk (forward log, max, beta) and chunks the repair redid."""
    cum, tr, db, lengths = make_inputs(B, T, K, C, model=model, kcc=kcc)
    v = validate_streaming_inputs(cum, tr, db, lengths, K)
    plan = launch.plan_for(v.cum_scores, v.transition, v.K, "log", time_parallel=True)
    if not plan.time_parallel:
        return None
    args = (v.cum_scores, v.transition, v.duration_bias, v.lengths)
    res = {"chunk": plan.chunk, "n_chunks": plan.n_chunks, "num_warps": plan.num_warps, "kind": plan.kind}
    for name, stats in (("forward", parallel.forward_chunked(*args, "log", None, None, plan)[3]),
                        ("viterbi_forward", parallel.forward_chunked(*args, "max", None, None, plan)[3]),
                        ("beta", parallel.beta_chunked(*args, None, None, plan)[2])):
        st = stats.steps.flatten().tolist()
        conv = stats.converged.flatten().tolist()
        ran = [s for s in st if s > 0]
        res[name] = {
            "steps_median": statistics.median(ran) if ran else 0,
            "steps_max": max(ran) if ran else 0,
            "converged_fraction": sum(conv) / len(conv),
            "redone_chunks": int(stats.redone.sum()),
        }
    torch.cuda.empty_cache()
    return res


def training_step(parallel_flag, B=4, T=100_000, K=500, C=12, H=64, steps=5):
    """One optimiser step of a Conv encoder + SemiMarkovCRFHead (loss, backward, step)."""
    torch.manual_seed(0)
    enc = torch.nn.Sequential(torch.nn.Conv1d(4, H, 9, padding=4), torch.nn.GELU(),
                              torch.nn.Conv1d(H, H, 9, padding=4), torch.nn.GELU()).cuda()
    head = SemiMarkovCRFHead(C, K, hidden_dim=H, time_parallel=parallel_flag).cuda()
    opt = torch.optim.Adam(list(enc.parameters()) + list(head.parameters()), lr=1e-3)
    x = torch.randn(B, 4, T, device="cuda")
    lengths = torch.full((B,), T, device="cuda")
    # gold: runs of random labels with durations up to K
    g = torch.Generator().manual_seed(1)
    labels = torch.empty(B, T, dtype=torch.long)
    for b in range(B):
        pos = 0
        while pos < T:
            k = int(torch.randint(1, K + 1, (1,), generator=g))
            labels[b, pos : pos + k] = int(torch.randint(0, C, (1,), generator=g))
            pos += k
    labels = labels.cuda()

    def step():
        opt.zero_grad(set_to_none=True)
        h = enc(x).transpose(1, 2)
        loss = head.compute_loss(h, lengths, labels)
        loss.backward()
        opt.step()

    def encoder_only():
        opt.zero_grad(set_to_none=True)
        enc(x).transpose(1, 2).square().mean().backward()

    return {"step_ms": median_ms(step, min_runs=steps, budget_s=5.0),
            "encoder_ms": median_ms(encoder_only, min_runs=steps, budget_s=2.0)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench_parallel.json")
    ap.add_argument("--quick", action="store_true", help="small configurations only")
    ap.add_argument("--no-1e8", action="store_true")
    ap.add_argument("--only", default=None, help="comma-separated sections")
    opts = ap.parse_args()
    sections = set((opts.only or "rate,configs,stats,adversarial,worst,kcc,training,sweep,1e8").split(","))
    # the default plan's chunk length unless a "tune" section overrides it
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": commit, "configs": []}
    import triton

    res["triton"] = triton.__version__
    print(res, flush=True)
    if "rate" in sections:
        res["exp_per_s"] = exp_rate()
        print(f"exp rate {res['exp_per_s']:.3e}/s", flush=True)
    configs = CONFIGS[3:] if opts.quick else CONFIGS
    if "configs" in sections:
        for (B, T, K, C), target in configs:
            row = {"B": B, "T": T, "K": K, "C": C, "target_ms": target}
            exps = B * T * (K * C + C * C)
            if "exp_per_s" in res:
                row["exp_floor_forward_ms"] = exps / res["exp_per_s"] * 1e3
            plan = launch.plan_for(torch.empty(B, T + 1, C, device="cuda"), torch.empty(C, C), K, "log")
            row["default_parallel"] = plan.time_parallel
            for name, flag in (("sequential", False), ("parallel", True)):
                t0 = time.time()
                row[name] = time_engine(B, T, K, C, flag, runs=2 if (not flag and T >= 10**6) else 3)
                print(f"  {B},{T},{K},{C} {name}: {row[name]} ({time.time() - t0:.0f}s)", flush=True)
            res["configs"].append(row)
    if "tune" in sections:
        # chunk length (multiples of K) and warps of the time-parallel engine where the default is
        # borderline: forward and forward+backward
        from torch_semimarkov.engines.triton import plan as plan_mod

        res["tune"] = []
        for B, T, K, C in ((4, 100_000, 1000, 8), (16, 10_000, 100, 24), (4, 100_000, 500, 12), (1, 1_000_000, 64, 24)):
            for mult in (2, 3, 4):
                plan_mod.CHUNK_OVERRIDE = max(mult * K, -(-T * B // (4 * 132)))
                for warps in (4, 8):
                    cum, tr, db, lengths = make_inputs(B, T, K, C)
                    try:
                        p = launch.plan_for(cum, tr, K, "log", num_warps=warps, time_parallel=True)
                    except ValueError:  # the ring does not fit in this many warps' registers
                        continue
                    if not p.time_parallel or p.kind != "reg":
                        continue
                    row = {"B": B, "T": T, "K": K, "C": C, "chunk": p.chunk, "num_warps": warps}
                    row.update(time_engine(B, T, K, C, True, what=("forward", "fwd_bwd"), runs=3, num_warps=warps))
                    print(f"  tune {row}", flush=True)
                    res["tune"].append(row)
            plan_mod.CHUNK_OVERRIDE = None
    if "stats" in sections:
        res["fixup"] = {}
        for (B, T, K, C), _ in configs:
            st = fixup_stats(B, T, K, C)
            res["fixup"][f"{B},{T},{K},{C}"] = st
            print(f"  fix-up {B},{T},{K},{C}: {st}", flush=True)
    if "adversarial" in sections:
        res["adversarial"] = []
        for model in ("cyclic", "frame"):
            B, T, K, C = (1, 100_000, 64, 8) if opts.quick else (1, 1_000_000, 64, 8)
            row = {"model": model, "B": B, "T": T, "K": K, "C": C}
            for name, flag in (("sequential", False), ("parallel", True)):
                row[name] = time_engine(B, T, K, C, flag, model=model, runs=2)
            row["fixup"] = fixup_stats(B, T, K, C, model=model)
            print(f"  adversarial {row}", flush=True)
            res["adversarial"].append(row)
    if "worst" in sections:
        # a model that never forgets its start within a chunk: the cyclic grammar with strongly
        # preferred long segments, C = 24, and chunks of 2K (far shorter than its ~1000 positions of
        # convergence), so every fix-up fails and the repair runs the sequence sequentially
        from torch_semimarkov.engines.triton import plan as plan_mod

        B, T, K, C = 1, 1_000_000, 64, 24
        row = {"model": "cyclic, duration bias 0.5 k, chunks of 2K", "B": B, "T": T, "K": K, "C": C}
        plan_mod.CHUNK_OVERRIDE = 2 * K
        for name, flag in (("sequential", False), ("parallel", True)):
            row[name] = time_engine(B, T, K, C, flag, model="cyclic-strong", runs=2)
        row["fixup"] = fixup_stats(B, T, K, C, model="cyclic-strong")
        plan_mod.CHUNK_OVERRIDE = None
        print(f"  worst case {row}", flush=True)
        res["worst"] = row
    if "kcc" in sections:
        # (K, C, C) transitions (the direct O(K·C²) recurrence): one program per sequence against the
        # time-parallel engine, its fix-up statistics, and a cyclic grammar that never converges
        res["kcc"] = []
        for B, T, K, C in KCC_CONFIGS[1:] if opts.quick else KCC_CONFIGS:
            row = {"B": B, "T": T, "K": K, "C": C}
            plan = launch.plan_for(torch.empty(B, T + 1, C, device="cuda"), torch.empty(K, C, C), K, "log")
            row["default_parallel"] = plan.time_parallel
            for name, flag in (("sequential", False), ("parallel", True)):
                t0 = time.time()
                row[name] = time_engine(B, T, K, C, flag, kcc=True, runs=1 if (not flag and T >= 10**6) else 3)
                print(f"  (K, C, C) {B},{T},{K},{C} {name}: {row[name]} ({time.time() - t0:.0f}s)", flush=True)
            row["fixup"] = fixup_stats(B, T, K, C, kcc=True)
            print(f"  (K, C, C) fix-up {B},{T},{K},{C}: {row['fixup']}", flush=True)
            res["kcc"].append(row)
        B, T, K, C = 1, 100_000, 32, 6
        row = {"model": "cyclic (K, C, C)", "B": B, "T": T, "K": K, "C": C}
        for name, flag in (("sequential", False), ("parallel", True)):
            row[name] = time_engine(B, T, K, C, flag, model="cyclic", kcc=True, runs=2)
        row["fixup"] = fixup_stats(B, T, K, C, model="cyclic", kcc=True)
        print(f"  (K, C, C) adversarial {row}", flush=True)
        res["kcc"].append(row)
    if "training" in sections and not opts.quick:
        res["training"] = {name: training_step(flag) for name, flag in (("sequential", False), ("parallel", None))}
        print(f"  training step {res['training']}", flush=True)
    if "sweep" in sections:
        res["sweep"] = []
        for T in SWEEP[:3] if opts.quick else SWEEP:
            row = {"T": T}
            for name, flag in (("sequential", False), ("parallel", True)):
                what = ("forward", "fwd_bwd") if T <= 1_000_000 or flag else ("forward",)
                row[name] = time_engine(1, T, 64, 8, flag, what=what, runs=2 if T >= 10**6 else 3)
            print(f"  sweep {row}", flush=True)
            res["sweep"].append(row)
    if "1e8" in sections and not opts.no_1e8 and not opts.quick:
        T = 100_000_000
        row = {"B": 1, "T": T, "K": 64, "C": 8}
        try:
            row["parallel"] = time_engine(1, T, 64, 8, True, what=("forward", "viterbi"), runs=1)
            row["peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
        except Exception as exc:  # noqa: BLE001 - recorded, the rest of the results still count
            row["error"] = repr(exc)[:300]
        print(f"  T=1e8 {row}", flush=True)
        res["t1e8"] = row
    with open(opts.out, "w") as f:
        json.dump(res, f, indent=1)
    print("wrote", opts.out)


if __name__ == "__main__":
    main()
