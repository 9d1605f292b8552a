"""CPU benchmark: torch-semimarkov's streaming PyTorch path against flash-semicrf 0.2.0's CPU path.

Both libraries run in the same process on the same inputs (float32, full-length sequences):

* forward: log Z with no input requiring grad;
* forward+backward: log Z, then ``log_z.sum().backward()`` into cum_scores, transition and
  duration_bias;
* Viterbi: ours ``semi_crf_streaming_viterbi`` (score, per-position labels and segments);
  flash-semicrf ``semi_crf_streaming_viterbi_with_backpointers`` (score and backpointers).

flash-semicrf is installed from the registry (``pip install --no-deps flash-semicrf==0.2.0``) and
called as a black box through its public functions with ``use_triton=False``. Each time is the
median over ``--repeats`` runs after one warm-up run. The log Z and gradients of the two libraries
are compared once per configuration, and the machine's load average is recorded, since the CPU
may be shared.

Usage:
    python benchmarks/bench_cpu.py                       # both configurations, writes results
    python benchmarks/bench_cpu.py --quick --no-flash    # small configuration, ours only
    python benchmarks/bench_cpu.py --threads 1           # one intra-op thread for both libraries
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from torch_semimarkov import semi_crf_streaming_forward, semi_crf_streaming_viterbi

CONFIGS = [(4, 500, 32, 8), (2, 2000, 100, 24)]
TARGET_FWD_BWD_SPEEDUP = 20.0


def make_inputs(B, T, K, C, seed=0):
    """float32 inputs: zero-centred per-position scores, their cumsum, small random parameters."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, T, C, generator=g)
    scores = scores - scores.mean(dim=1, keepdim=True)
    cum = torch.zeros(B, T + 1, C)
    cum[:, 1:] = scores.double().cumsum(1).float()
    transition = torch.randn(C, C, generator=g) * 0.1
    duration_bias = torch.randn(K, C, generator=g) * 0.1
    lengths = torch.full((B,), T, dtype=torch.long)
    return cum, transition, duration_bias, lengths


def timed(fn, repeats):
    """Median wall time (ms) of fn over repeats, after one warm-up call; also the last result."""
    out = fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), times, out


def fwd_bwd(forward, cum, tr, db, lengths, K):
    leaves = [t.detach().clone().requires_grad_(True) for t in (cum, tr, db)]
    log_z = forward(*leaves, lengths, K)
    log_z.sum().backward()
    return log_z.detach(), [t.grad for t in leaves]


# ---------------------------------------------------------------- ours
def ours_forward(cum, tr, db, lengths, K):
    return semi_crf_streaming_forward(cum, tr, db, lengths, K, use_triton=False)


def ours_viterbi(cum, tr, db, lengths, K):
    return semi_crf_streaming_viterbi(cum, tr, db, lengths, K, use_triton=False)


# ---------------------------------------------------------------- flash-semicrf (black box)
def flash_module():
    try:
        import flash_semicrf.streaming as fs
    except ImportError:
        return None
    return fs


def flash_forward_fn(fs):
    def forward(cum, tr, db, lengths, K):
        return fs.semi_crf_streaming_forward(cum, tr, db, lengths, K, use_triton=False)

    return forward


def flash_viterbi_fn(fs):
    def viterbi(cum, tr, db, lengths, K):
        return fs.semi_crf_streaming_viterbi_with_backpointers(cum, tr, db, lengths, K)

    return viterbi


def run_config(B, T, K, C, fs, repeats, flash_repeats):
    cum, tr, db, lengths = make_inputs(B, T, K, C)
    rec = {"B": B, "T": T, "K": K, "C": C, "dtype": "float32"}
    with torch.no_grad():
        ms, runs, z_ours = timed(lambda: ours_forward(cum, tr, db, lengths, K), repeats)
    rec["ours"] = {"forward_ms": ms, "forward_runs_ms": runs}
    ms, runs, (z_fb, g_ours) = timed(lambda: fwd_bwd(ours_forward, cum, tr, db, lengths, K), repeats)
    rec["ours"].update(fwd_bwd_ms=ms, fwd_bwd_runs_ms=runs)
    ms, runs, _ = timed(lambda: ours_viterbi(cum, tr, db, lengths, K), repeats)
    rec["ours"].update(viterbi_ms=ms, viterbi_runs_ms=runs)
    print(f"ours  B{B} T{T} K{K} C{C}: forward {rec['ours']['forward_ms']:.1f} ms, "
          f"fwd+bwd {rec['ours']['fwd_bwd_ms']:.1f} ms, viterbi {rec['ours']['viterbi_ms']:.1f} ms", flush=True)
    if fs is None:
        return rec
    ffwd, fvit = flash_forward_fn(fs), flash_viterbi_fn(fs)
    with torch.no_grad():
        ms, runs, z_flash = timed(lambda: ffwd(cum, tr, db, lengths, K), flash_repeats)
    rec["flash"] = {"forward_ms": ms, "forward_runs_ms": runs}
    ms, runs, (_, g_flash) = timed(lambda: fwd_bwd(ffwd, cum, tr, db, lengths, K), flash_repeats)
    rec["flash"].update(fwd_bwd_ms=ms, fwd_bwd_runs_ms=runs)
    ms, runs, _ = timed(lambda: fvit(cum, tr, db, lengths, K), flash_repeats)
    rec["flash"].update(viterbi_ms=ms, viterbi_runs_ms=runs)
    print(f"flash B{B} T{T} K{K} C{C}: forward {rec['flash']['forward_ms']:.1f} ms, "
          f"fwd+bwd {rec['flash']['fwd_bwd_ms']:.1f} ms, viterbi {rec['flash']['viterbi_ms']:.1f} ms", flush=True)
    rec["speedup"] = {m: rec["flash"][f"{m}_ms"] / rec["ours"][f"{m}_ms"] for m in ("forward", "fwd_bwd", "viterbi")}
    # the two libraries compute the same quantity: record how closely they agree
    rec["agreement"] = {
        "log_z_max_rel": float(((z_ours.double() - z_flash.double()).abs() / z_flash.double().abs()).max()),
        "grad_max_abs": {name: float((a.double() - b.double()).abs().max())
                         for name, a, b in zip(("cum_scores", "transition", "duration_bias"), g_ours, g_flash)},
    }
    s = rec["speedup"]
    print(f"      speedup (flash / ours): forward {s['forward']:.1f}x, fwd+bwd {s['fwd_bwd']:.1f}x, "
          f"viterbi {s['viterbi']:.1f}x; log Z rel diff {rec['agreement']['log_z_max_rel']:.1e}", flush=True)
    return rec


def git_commit():
    """The repository's HEAD commit, when the script runs from a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def markdown(res):
    lines = [
        f"# CPU benchmark ({res['date']})",
        "",
        f"commit {res['commit']}; torch {res['torch']}, {res['threads']} threads on {res['cpu_count']} cores; flash-semicrf "
        f"{res['flash_semicrf']}; load average before / after: {res['load_before']} / {res['load_after']}.",
        "Median ms over repeats after one warm-up (float32, full-length sequences).",
        "",
        "| B | T | K | C | mode | ours (ms) | flash-semicrf (ms) | speedup |",
        "|---|---|---|---|---|---:|---:|---:|",
    ]
    for r in res["configs"]:
        for m, label in (("forward", "forward"), ("fwd_bwd", "forward+backward"), ("viterbi", "Viterbi")):
            fl = r.get("flash", {}).get(f"{m}_ms")
            sp = r.get("speedup", {}).get(m)
            lines.append(
                f"| {r['B']} | {r['T']} | {r['K']} | {r['C']} | {label} | {r['ours'][f'{m}_ms']:.1f} | "
                + (f"{fl:.1f} | {sp:.1f}x |" if fl is not None else "- | - |")
            )
    lines += ["", f"Target: forward+backward at least {TARGET_FWD_BWD_SPEEDUP:.0f}x faster than flash-semicrf at both configurations.", ""]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "cpu_latest.json"))
    ap.add_argument("--repeats", type=int, default=7, help="timed runs of ours per mode")
    ap.add_argument("--flash-repeats", type=int, default=3, help="timed runs of flash-semicrf per mode")
    ap.add_argument("--quick", action="store_true", help="only the small configuration")
    ap.add_argument("--no-flash", action="store_true", help="time ours only")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads for both libraries (default: torch's own choice); on a "
                         "shared, loaded machine 1 thread avoids oversubscription stalls")
    opts = ap.parse_args(argv)
    if opts.threads is not None:
        torch.set_num_threads(opts.threads)

    fs = None if opts.no_flash else flash_module()
    if fs is None and not opts.no_flash:
        print("flash-semicrf is not installed (pip install --no-deps flash-semicrf==0.2.0): timing ours only")
    res = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "flash_semicrf": None if fs is None else getattr(sys.modules.get("flash_semicrf"), "__version__", "?"),
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "repeats": opts.repeats,
        "flash_repeats": opts.flash_repeats,
        "configs": [],
    }
    for B, T, K, C in CONFIGS[:1] if opts.quick else CONFIGS:
        res["configs"].append(run_config(B, T, K, C, fs, opts.repeats, opts.flash_repeats))
    res["load_after"] = [round(x, 2) for x in os.getloadavg()]

    print("\nsummary: forward+backward speedup over flash-semicrf (target >= %.0fx)" % TARGET_FWD_BWD_SPEEDUP)
    ok = True
    for r in res["configs"]:
        if "speedup" in r:
            sp = r["speedup"]["fwd_bwd"]
            ok &= sp >= TARGET_FWD_BWD_SPEEDUP
            print(f"  B{r['B']} T{r['T']} K{r['K']} C{r['C']}: {sp:.1f}x "
                  f"({r['flash']['fwd_bwd_ms']:.0f} ms / {r['ours']['fwd_bwd_ms']:.0f} ms)")
    res["target_met"] = ok if fs is not None else None
    out = Path(opts.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(res))
    print(f"wrote {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
