"""GPU benchmark: torch-semimarkov's Triton kernels against flash-semicrf 0.2.0, in one run.

For each configuration (B, T, K, C) it times forward, forward+backward and Viterbi for both
libraries on the same GPU, and records the peak memory of forward+backward above the inputs
(``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``). Inputs: float32
zero-centred cumulative scores, transition and duration bias ~ 0.1 N(0, 1), full lengths.

* ours: ``triton.testing.do_bench`` medians. forward = validation + forward launcher without
  saved state; forward+backward = the public autograd API, ``.backward()`` on a random upstream
  gradient; Viterbi = max-semiring forward + backpointers + on-GPU traceback (labels and segment
  starts); Viterbi score = the public ``semi_crf_streaming_forward(..., semiring="max")`` without
  gradients, the best score alone (what flash's ``semiring="max"`` call returns).
  Saved memory: ``torch.cuda.memory_allocated`` after the public forward with gradients enabled
  minus before (what is kept between forward and backward: the checkpoints), with the save-all
  size (every position's state) it replaces.
* flash-semicrf: ``flash_semicrf.streaming.semi_crf_streaming_forward(..., use_triton=True)``
  (its Viterbi: ``semiring="max"``, the score only). It is slow, so it is compiled on a short
  sequence with the same (B, K, C) and then timed with few repeats (median of wall-clock runs).

Also: an exp-throughput micro-benchmark, the exp-count floor of the full-GPU configuration, and
the sweeps over T and K for the plot. Usage:

    python benchmarks/bench_gpu.py --out results.json [--quick] [--no-flash]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from torch_semimarkov.engines.triton import launch  # noqa: E402
from torch_semimarkov.core.validation import validate_streaming_inputs  # noqa: E402

CONFIGS = [
    (64, 1000, 100, 24),
    (32, 1000, 500, 24),
    (16, 10000, 100, 24),
    (32, 2000, 50, 4),
    (8, 500, 32, 8),
    (1, 100000, 64, 24),
]
FULL_GPU = (1024, 1000, 100, 24)


def make_inputs(B, T, K, C, seed=0, dev="cuda"):
    g = torch.Generator(device=dev).manual_seed(seed)
    scores = torch.randn(B, T, C, device=dev, generator=g)
    scores = scores - scores.mean(1, keepdim=True)
    cum = torch.nn.functional.pad(scores.cumsum(1), (0, 0, 1, 0))
    tr = 0.1 * torch.randn(C, C, device=dev, generator=g)
    db = 0.1 * torch.randn(K, C, device=dev, generator=g)
    lengths = torch.full((B,), T, device=dev, dtype=torch.int64)
    return cum, tr, db, lengths


# ---------------------------------------------------------------- our library
def launch_streaming_triton_kernel(cum, tr, db, lengths, K, semiring="log", save_for_backward=True, num_warps=None):
    """The forward launcher with the call's default plan: ``(log Z, state, plan)``."""
    plan = launch.plan_for(cum, tr, K, semiring, num_warps=num_warps)
    z, state = launch.launch_forward(cum, tr, db, lengths, K, semiring, plan=plan, save_for_backward=save_for_backward)
    return z, state, plan


def launch_streaming_triton_backward(cum, tr, db, lengths, K, state, plan):
    return launch.launch_backward(cum, tr, db, lengths, K, None, None, plan=plan, state=state)


def launch_streaming_triton_viterbi(cum, tr, db, lengths, K, num_warps=None):
    return launch.launch_viterbi(cum, tr, db, lengths, K, plan=launch.plan_for(cum, tr, K, "max", num_warps=num_warps))


def ours_forward(cum, tr, db, lengths, K):
    v = validate_streaming_inputs(cum, tr, db, lengths, K)
    return launch_streaming_triton_kernel(v.cum_scores, v.transition, v.duration_bias, v.lengths, K,
                                          save_for_backward=False)[0]


def ours_forward_kernel(cum, tr, db, lengths, K):
    """The launcher alone (no input validation)."""
    return launch_streaming_triton_kernel(cum, tr, db, lengths, K, save_for_backward=False)[0]


def ours_fwd_bwd(cum, tr, db, lengths, K):
    from torch_semimarkov.api.partition import semi_crf_streaming_forward

    cum = cum.detach().requires_grad_(True)
    tr = tr.detach().requires_grad_(True)
    db = db.detach().requires_grad_(True)
    z = semi_crf_streaming_forward(cum, tr, db, lengths, K, use_triton=True, num_warps=None)
    z.backward(torch.ones_like(z))
    return cum.grad


def ours_fwd_bwd_launchers(cum, tr, db, lengths, K):
    """The kernel pair alone (no autograd, no gradient assembly), for the notes."""
    z, state, plan = launch_streaming_triton_kernel(cum, tr, db, lengths, K)
    return launch_streaming_triton_backward(cum, tr, db, lengths, K, state, plan)


def ours_viterbi(cum, tr, db, lengths, K):
    v = validate_streaming_inputs(cum, tr, db, lengths, K, "max")
    return launch_streaming_triton_viterbi(v.cum_scores, v.transition, v.duration_bias, v.lengths, K)


def ours_viterbi_score(cum, tr, db, lengths, K):
    """The public API's best score alone (no traceback), like flash's semiring="max"."""
    from torch_semimarkov.api.partition import semi_crf_streaming_forward

    with torch.no_grad():
        return semi_crf_streaming_forward(cum, tr, db, lengths, K, semiring="max", use_triton=True, num_warps=None)


def saved_between_mb(cum, tr, db, lengths, K):
    """MB held between the public forward (gradients enabled) and its backward, beyond the inputs
    and the returned log Z: the checkpoints."""
    from torch_semimarkov.api.partition import semi_crf_streaming_forward

    cum = cum.detach().requires_grad_(True)
    tr = tr.detach().requires_grad_(True)
    db = db.detach().requires_grad_(True)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    z = semi_crf_streaming_forward(cum, tr, db, lengths, K, use_triton=True, num_warps=None)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base
    del z
    return held / 2**20


def ours_viterbi_kernel(cum, tr, db, lengths, K):
    """Max-semiring forward + traceback alone (no input validation)."""
    return launch_streaming_triton_viterbi(cum, tr, db, lengths, K)


# ---------------------------------------------------------------- flash-semicrf (black box)
def flash_module():
    try:
        import flash_semicrf.streaming as fs
    except ImportError:
        return None
    return fs


def flash_forward(fs, cum, tr, db, lengths, K):
    with torch.no_grad():
        return fs.semi_crf_streaming_forward(cum, tr, db, lengths, K, use_triton=True)


def flash_fwd_bwd(fs, cum, tr, db, lengths, K):
    cum = cum.detach().requires_grad_(True)
    tr = tr.detach().requires_grad_(True)
    db = db.detach().requires_grad_(True)
    z = fs.semi_crf_streaming_forward(cum, tr, db, lengths, K, use_triton=True)
    z.backward(torch.ones_like(z))
    return cum.grad


def flash_viterbi(fs, cum, tr, db, lengths, K):
    with torch.no_grad():
        return fs.semi_crf_streaming_forward(cum, tr, db, lengths, K, semiring="max", use_triton=True)


# ---------------------------------------------------------------- timing helpers
def bench_ms(fn, slow_ok=False, budget_s=2.0):
    """Median milliseconds. Fast functions: do_bench. Slow ones: a few timed wall-clock runs."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    once = time.perf_counter() - t0
    if once < 0.05:
        return do_bench(fn, warmup=50, rep=300, return_mode="median")
    n = max(1, min(5, int(budget_s / once))) if slow_ok else max(3, min(10, int(budget_s / once)))
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def peak_mb(fn):
    """Peak memory (MB) of fn above what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak / 2**20


def flash_time_once(fn, warm_fn):
    """Compile flash on a short sequence (warm_fn), then a few timed runs of fn.

    Returns (median ms, runs, peak MB of the first timed run above the memory before it)."""
    warm_fn()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first = (time.perf_counter() - t0) * 1e3
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    times = [first]
    reps = 0 if first > 3000 else (1 if first > 1000 else (2 if first > 300 else 4))
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    # with one or two runs the first may include a Triton recompilation for the new length: use the
    # fastest; with more runs the median
    return (times[0] if len(times) <= 2 else times[len(times) // 2]), len(times), peak


# ---------------------------------------------------------------- exp throughput
@triton.jit
def _exp_rate_kernel(x_ptr, out_ptr, N_ITER: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for _ in range(N_ITER):
        acc += tl.exp(x)
        x = x * 0.9999 - 0.0001
    tl.store(out_ptr + offs, acc)


def exp_rate():
    """exp evaluations per second of tl.exp (float32) on this GPU."""
    n_prog, block, n_iter = 132 * 64, 1024, 1024
    x = torch.rand(n_prog * block, device="cuda") - 0.5
    out = torch.empty_like(x)
    fn = lambda: _exp_rate_kernel[(n_prog,)](x, out, N_ITER=n_iter, BLOCK=block, num_warps=8)  # noqa: E731
    ms = do_bench(fn, warmup=20, rep=200, return_mode="median")
    return n_prog * block * n_iter / (ms * 1e-3)


def exp_counts(B, T, K, C):
    """exps the factored algorithm must evaluate: forward K·C + C² per position; forward+backward
    twice that (each marginal can reuse the exps of the recurrences); ours does 3x (a separate
    marginal pass)."""
    per = K * C + C * C
    return {"forward": B * T * per, "fwd_bwd_min": 2 * B * T * per, "fwd_bwd_ours": 3 * B * T * per}


def warps_sweep():
    """Kernel times per num_warps and per ring variant (register / memory ring), one program per
    sequence."""
    from torch_semimarkov.engines.triton import plan as plan_mod

    out = []
    grid = [((1, 20000, 64, 24), (2, 4, 8)), ((64, 1000, 100, 24), (2, 4, 8)), ((1024, 1000, 100, 24), (2, 4, 8)),
            ((32, 2000, 50, 4), (1, 2, 4)), ((8, 500, 32, 8), (1, 2, 4)), ((32, 1000, 500, 24), (4, 8, 16))]
    for (B, T, K, C), warps in grid:
        cum, tr, db, lengths = make_inputs(B, T, K, C)
        for force in (False, True):
            plan_mod.FORCE_MEMORY_RING = force
            for w in warps:
                p = launch.plan_for(cum, tr, K, "log", num_warps=w, time_parallel=False)
                pm = launch.plan_for(cum, tr, K, "max", num_warps=w, time_parallel=False)

                def fb():
                    z, state = launch.launch_forward(cum, tr, db, lengths, K, plan=p)
                    return launch.launch_backward(cum, tr, db, lengths, K, None, None, plan=p, state=state)
                r = {"B": B, "T": T, "K": K, "C": C, "num_warps": w, "ring": "register" if p.kind == "reg" else "memory",
                     "forward_ms": bench_ms(lambda: launch.launch_forward(cum, tr, db, lengths, K, plan=p,
                                                                          save_for_backward=False)),
                     "fwd_bwd_kernels_ms": bench_ms(fb),
                     "viterbi_ms": bench_ms(lambda: launch.launch_viterbi(cum, tr, db, lengths, K, plan=pm))}
                print(f"  warps {r}", flush=True)
                out.append(r)
        plan_mod.FORCE_MEMORY_RING = False
    return out


# ---------------------------------------------------------------- main
def run_config(B, T, K, C, fs, flash_max_fb_ms=None, with_flash=True):
    cum, tr, db, lengths = make_inputs(B, T, K, C)
    rec = {"B": B, "T": T, "K": K, "C": C}
    ours = {}
    ours["forward_ms"] = bench_ms(lambda: ours_forward(cum, tr, db, lengths, K))
    ours["fwd_bwd_ms"] = bench_ms(lambda: ours_fwd_bwd(cum, tr, db, lengths, K))
    ours["fwd_bwd_kernels_ms"] = bench_ms(lambda: ours_fwd_bwd_launchers(cum, tr, db, lengths, K))
    ours["viterbi_ms"] = bench_ms(lambda: ours_viterbi(cum, tr, db, lengths, K))
    ours["forward_kernel_ms"] = bench_ms(lambda: ours_forward_kernel(cum, tr, db, lengths, K))
    ours["viterbi_kernel_ms"] = bench_ms(lambda: ours_viterbi_kernel(cum, tr, db, lengths, K))
    # like for like with flash's semiring="max" call: the best score only (backpointers still stored)
    ours["viterbi_score_kernel_ms"] = bench_ms(lambda: launch_streaming_triton_kernel(
        cum, tr, db, lengths, K, semiring="max", save_for_backward=False)[0])
    ours["viterbi_score_ms"] = bench_ms(lambda: ours_viterbi_score(cum, tr, db, lengths, K))
    # components of forward+backward: the checkpointing forward, the recompute from its
    # checkpoints, the whole backward launcher (recompute + beta + marginals)
    from torch_semimarkov.engines.triton.recompute import recompute_forward_state

    z, state, plan = launch_streaming_triton_kernel(cum, tr, db, lengths, K)
    ours["fwd_ckpt_kernel_ms"] = bench_ms(lambda: launch_streaming_triton_kernel(cum, tr, db, lengths, K))
    if not plan.time_parallel:
        ours["recompute_ms"] = bench_ms(lambda: recompute_forward_state(cum, tr, db, lengths, None, None, plan, *state))
    else:
        ours["recompute_ms"] = 0.0
    ours["bwd_kernels_ms"] = bench_ms(lambda: launch_streaming_triton_backward(cum, tr, db, lengths, K, state, plan))
    ours["checkpoint_interval"] = plan.interval
    ours["time_parallel"] = plan.time_parallel
    del z, state
    ours["saved_between_mb"] = saved_between_mb(cum, tr, db, lengths, K)
    # what the save-all forward kept: alpha_hat and U_hat float32 + float64 frames per position
    ours["save_all_mb"] = (2 * B * (T + 1) * C * 4 + B * (T + 1) * 8) / 2**20
    ours["fwd_bwd_peak_mb"] = peak_mb(lambda: ours_fwd_bwd(cum, tr, db, lengths, K))
    ours["forward_peak_mb"] = peak_mb(lambda: ours_forward(cum, tr, db, lengths, K))
    rec["ours"] = ours
    print(f"  ours  B{B} T{T} K{K} C{C}: fwd {ours['forward_ms']:.3f} ms (kernel {ours['forward_kernel_ms']:.3f}), "
          f"fwd+bwd {ours['fwd_bwd_ms']:.3f} ms (kernels {ours['fwd_bwd_kernels_ms']:.3f}), "
          f"viterbi {ours['viterbi_ms']:.3f} ms (kernels {ours['viterbi_kernel_ms']:.3f}, "
          f"score only {ours['viterbi_score_kernel_ms']:.3f}, public API {ours['viterbi_score_ms']:.3f}), "
          f"peak {ours['fwd_bwd_peak_mb']:.1f} MB, saved fwd->bwd {ours['saved_between_mb']:.3f} MB "
          f"(save-all {ours['save_all_mb']:.2f} MB); ckpt fwd {ours['fwd_ckpt_kernel_ms']:.3f} ms, "
          f"recompute {ours['recompute_ms']:.3f} ms, bwd launcher {ours['bwd_kernels_ms']:.3f} ms, "
          f"interval {ours['checkpoint_interval']}", flush=True)
    if fs is not None and with_flash:
        Tw = min(T, 200)
        cw, trw, dbw, lw = make_inputs(B, Tw, K, C, seed=1)
        fl = {}
        fl["forward_ms"], fl["forward_n"], fl["forward_peak_mb"] = flash_time_once(
            lambda: flash_forward(fs, cum, tr, db, lengths, K), lambda: flash_forward(fs, cw, trw, dbw, lw, K))
        fl["viterbi_ms"], fl["viterbi_n"], _ = flash_time_once(
            lambda: flash_viterbi(fs, cum, tr, db, lengths, K), lambda: flash_viterbi(fs, cw, trw, dbw, lw, K))
        fl["fwd_bwd_ms"], fl["fwd_bwd_n"], fl["fwd_bwd_peak_mb"] = flash_time_once(
            lambda: flash_fwd_bwd(fs, cum, tr, db, lengths, K), lambda: flash_fwd_bwd(fs, cw, trw, dbw, lw, K))
        rec["flash"] = fl
        rec["speedup"] = {m: fl[f"{m}_ms"] / ours[f"{m}_ms"] for m in ("forward", "fwd_bwd", "viterbi")}
        # like for like: flash's semiring="max" returns the best score only
        rec["speedup"]["viterbi_score"] = fl["viterbi_ms"] / ours["viterbi_score_ms"]
        print(f"  flash B{B} T{T} K{K} C{C}: fwd {fl['forward_ms']:.1f} ms, fwd+bwd {fl['fwd_bwd_ms']:.1f} ms, "
              f"viterbi {fl['viterbi_ms']:.1f} ms, peak {fl.get('fwd_bwd_peak_mb', float('nan')):.1f} MB; "
              f"speedups fwd {rec['speedup']['forward']:.0f}x fwd+bwd {rec['speedup']['fwd_bwd']:.0f}x "
              f"viterbi {rec['speedup']['viterbi']:.0f}x (score only {rec['speedup']['viterbi_score']:.0f}x)", flush=True)
    del cum, tr, db, lengths
    torch.cuda.empty_cache()
    return rec


def sweep(fs, with_flash):
    """Forward and forward+backward time vs T (B=1, K=32, C=8) and vs K (B=8, T=500, C=8)."""
    out = {"vs_T": [], "vs_K": []}
    for key, grid in (("vs_T", [(1, T, 32, 8) for T in (500, 2000, 8000)]),
                      ("vs_K", [(8, 500, K, 8) for K in (8, 32, 128)])):
        for B, T, K, C in grid:
            cum, tr, db, lengths = make_inputs(B, T, K, C)
            r = {"B": B, "T": T, "K": K, "C": C,
                 "ours_forward_ms": bench_ms(lambda: ours_forward(cum, tr, db, lengths, K)),
                 "ours_viterbi_ms": bench_ms(lambda: ours_viterbi(cum, tr, db, lengths, K)),
                 "ours_fwd_bwd_ms": bench_ms(lambda: ours_fwd_bwd(cum, tr, db, lengths, K))}
            if fs is not None and with_flash:
                cw, trw, dbw, lw = make_inputs(B, min(T, 200), K, C, seed=1)
                r["flash_forward_ms"], _, _ = flash_time_once(
                    lambda: flash_forward(fs, cum, tr, db, lengths, K), lambda: flash_forward(fs, cw, trw, dbw, lw, K))
                r["flash_fwd_bwd_ms"], _, _ = flash_time_once(
                    lambda: flash_fwd_bwd(fs, cum, tr, db, lengths, K), lambda: flash_fwd_bwd(fs, cw, trw, dbw, lw, K))
                r["flash_viterbi_ms"], _, _ = flash_time_once(
                    lambda: flash_viterbi(fs, cum, tr, db, lengths, K), lambda: flash_viterbi(fs, cw, trw, dbw, lw, K))
            print(f"  sweep {key} {B, T, K, C}: {r}", flush=True)
            out[key].append(r)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_results.json")
    ap.add_argument("--quick", action="store_true", help="two configurations, flash on the small one")
    ap.add_argument("--no-flash", action="store_true")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--configs", default=None, help="indices into CONFIGS, comma separated")
    ap.add_argument("--warps", action="store_true", help="time the kernels at 1, 2, 4 and 8 warps")
    opts = ap.parse_args()
    fs = None if opts.no_flash else flash_module()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "flash_semicrf": None if fs is None else getattr(sys.modules.get("flash_semicrf"), "__version__", "?"),
           "configs": []}
    print(res, flush=True)
    rate = exp_rate()
    res["exp_per_s"] = rate
    print(f"exp throughput: {rate / 1e12:.2f} T exp/s", flush=True)
    if opts.warps:
        res["warps"] = warps_sweep()
    def save():
        with open(opts.out, "w") as f:
            json.dump(res, f, indent=1)

    B, T, K, C = FULL_GPU
    full = run_config(B, T, K, C, fs, with_flash=False)
    cnt = exp_counts(B, T, K, C)
    full["exp_floor_ms"] = {k: v / rate * 1e3 for k, v in cnt.items()}
    full["exp_counts"] = cnt
    full["ratio_to_floor"] = {"forward": full["ours"]["forward_kernel_ms"] / full["exp_floor_ms"]["forward"],
                              "fwd_bwd": full["ours"]["fwd_bwd_kernels_ms"] / full["exp_floor_ms"]["fwd_bwd_min"]}
    res["full_gpu"] = full
    print(f"full GPU {FULL_GPU}: floor fwd {full['exp_floor_ms']['forward']:.2f} ms "
          f"(kernel x{full['ratio_to_floor']['forward']:.1f}), fwd+bwd {full['exp_floor_ms']['fwd_bwd_min']:.2f} ms "
          f"(kernels x{full['ratio_to_floor']['fwd_bwd']:.1f})", flush=True)
    save()
    if opts.quick:
        res["configs"].append(run_config(8, 500, 32, 8, fs))
        res["configs"].append(run_config(64, 1000, 100, 24, fs, with_flash=False))
        res["configs"].append(run_config(1, 100000, 64, 24, fs, with_flash=False))
    else:
        if not opts.no_sweep:
            res["sweep"] = sweep(fs, not opts.no_flash)
            save()
        idx = range(len(CONFIGS)) if opts.configs is None else [int(i) for i in opts.configs.split(",")]
        for i in idx:
            res["configs"].append(run_config(*CONFIGS[i], fs))
            save()
    save()
    print("\nsummary (ms; ours / flash / ratio)")
    for r in res["configs"]:
        o, fl = r["ours"], r.get("flash", {})
        line = f"B{r['B']:>4} T{r['T']:>6} K{r['K']:>3} C{r['C']:>2} |"
        for m in ("forward", "fwd_bwd", "viterbi"):
            if f"{m}_ms" in fl:
                line += f" {m} {o[m + '_ms']:.2f}/{fl[m + '_ms']:.1f}/{fl[m + '_ms'] / o[m + '_ms']:.0f}x |"
            else:
                line += f" {m} {o[m + '_ms']:.2f} |"
        if "viterbi_ms" in fl:
            line += f" viterbi score {o['viterbi_score_ms']:.2f}/{fl['viterbi_ms'] / o['viterbi_score_ms']:.0f}x |"
        line += f" peak {o['fwd_bwd_peak_mb']:.0f}/{fl.get('fwd_bwd_peak_mb', math.nan):.0f} MB"
        line += f" saved {o['saved_between_mb']:.2f}/{o['save_all_mb']:.1f} MB"
        print(line)


if __name__ == "__main__":
    main()
