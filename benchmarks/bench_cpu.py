"""CPU benchmark: the compiled CPU engine (numba), the streaming PyTorch path and flash-semicrf 0.2.0.

All three run in one process on the same inputs (float32, full-length sequences):

* forward: log Z with no input requiring grad;
* forward+backward: log Z, then ``log_z.sum().backward()`` into cum_scores, transition and
  duration_bias;
* Viterbi: ours ``semi_crf_streaming_viterbi`` (score, per-position labels and segments);
  flash-semicrf ``semi_crf_streaming_viterbi_with_backpointers`` (score and backpointers);
* marginals: ours ``semi_crf_streaming_marginals`` (start/end/position/boundary posteriors; flash-semicrf
  has no streaming equivalent).

Ours runs through the public API with ``backend="numba"`` and ``backend="torch"``. flash-semicrf is
installed from the registry (``pip install --no-deps flash-semicrf==0.2.0``) and called as a black
box with ``use_triton=False``; it is skipped at T >= 10^5 (``--flash-max-t``), where one of its
forward+backward calls takes many minutes. Each time is the median over ``--repeats`` runs after one
warm-up run (the numba kernels are compiled and loaded before any timing); the PyTorch path and
flash-semicrf at T >= 10^5 are timed once (``--slow-repeats``). Log Z and gradients are compared once
per configuration. A threads section times the numba engine with 1 and 2 engine threads
(``numba.set_num_threads``) and with 1 and 2 torch intra-op threads. The machine's load average is
recorded, since the CPU may be shared.

``--beyond`` times instead what issue 24 asks of the compiled engine, as multiples of its own
forward+backward (or Viterbi) in the same run: a label-masked forward+backward, 16 samples, the
entropy with its gradient (``backend="numba"``) and top-5 (``backend="numba"``, of its Viterbi), at
``BEYOND_CONFIGS``, and at the first of them the entropy with its gradient for a (K, C, C) transition
(over the engine's forward+backward with that transition); it writes results/cpu_beyond.{json,md}.

``--threads-loop`` times a user-style training loop (a two-layer Conv1d encoder, ``SemiMarkovCRFHead``
and Adam, ``LOOP_SHAPE`` = (B, T, K, C) = (4, 2000, 32, 8)) with 1 and 2 torch intra-op threads,
each run in a fresh process (``--loop-steps`` timed steps after 3 warm-up steps; the thread counts
alternate over ``--loop-reps`` rounds), for a small and a larger encoder (hidden sizes
``LOOP_HIDDEN``); each process also times the head alone (``compute_loss`` + backward on fixed
features) and the encoder alone, the engine's backward alone and right after a torch operation, and
the last two with ``torch.set_num_threads(1)`` around the head's / engine's work (the option of a
library that limits torch's threads itself). It writes results/cpu_threads_loop.{json,md}.

Usage:
    python benchmarks/bench_cpu.py                       # everything, writes results/cpu_latest.{json,md}
    python benchmarks/bench_cpu.py --quick --no-flash    # small configuration only
    python benchmarks/bench_cpu.py --beyond              # masks, samples, entropy, top-k (issue 24)
    python benchmarks/bench_cpu.py --threads-loop        # training loop at 1 and 2 torch threads
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

import numba
import torch

from torch_semimarkov import (
    semi_crf_streaming_forward,
    semi_crf_streaming_marginals,
    semi_crf_streaming_viterbi,
)

CONFIGS = [(4, 500, 32, 8), (2, 2000, 100, 24), (1, 100000, 64, 8)]
MODES = ("forward", "fwd_bwd", "viterbi", "marginals")
LABELS = {"forward": "forward", "fwd_bwd": "forward+backward", "viterbi": "Viterbi", "marginals": "marginals"}
#: Targets of issue 12: numba engine over the PyTorch path.
TARGETS = {(4, 500, 32, 8): {"fwd_bwd": 20.0, "viterbi": 10.0, "marginals": 10.0},
           (2, 2000, 100, 24): {"fwd_bwd": 20.0, "viterbi": 10.0, "marginals": 10.0},
           (1, 100000, 64, 8): {"fwd_bwd": 10.0, "viterbi": 10.0, "marginals": 10.0}}


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


def timed(fn, repeats, warmup=True):
    """Median wall time (ms) of fn over repeats (after one warm-up call if asked); also the last result."""
    out = fn() if warmup else None
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


def ours(backend):
    def forward(cum, tr, db, lengths, K):
        return semi_crf_streaming_forward(cum, tr, db, lengths, K, backend=backend)

    def viterbi(cum, tr, db, lengths, K):
        return semi_crf_streaming_viterbi(cum, tr, db, lengths, K, backend=backend)

    def marginals(cum, tr, db, lengths, K):
        return semi_crf_streaming_marginals(cum, tr, db, lengths, K, backend=backend)

    return {"forward": forward, "viterbi": viterbi, "marginals": marginals}


def flash_module():
    try:
        import flash_semicrf.streaming as fs
    except ImportError:
        return None
    return fs


def flash(fs):
    def forward(cum, tr, db, lengths, K):
        return fs.semi_crf_streaming_forward(cum, tr, db, lengths, K, use_triton=False)

    def viterbi(cum, tr, db, lengths, K):
        return fs.semi_crf_streaming_viterbi_with_backpointers(cum, tr, db, lengths, K)

    return {"forward": forward, "viterbi": viterbi}


def time_impl(fns, args, repeats, warmup):
    """Times of every mode an implementation has: {mode_ms, mode_runs_ms}, plus log Z and gradients."""
    rec = {}
    with torch.no_grad():
        ms, runs, z = timed(lambda: fns["forward"](*args), repeats, warmup)
    rec.update(forward_ms=ms, forward_runs_ms=runs)
    ms, runs, (_, grads) = timed(lambda: fwd_bwd(fns["forward"], *args), repeats, warmup)
    rec.update(fwd_bwd_ms=ms, fwd_bwd_runs_ms=runs)
    ms, runs, _ = timed(lambda: fns["viterbi"](*args), repeats, warmup)
    rec.update(viterbi_ms=ms, viterbi_runs_ms=runs)
    if "marginals" in fns:
        ms, runs, _ = timed(lambda: fns["marginals"](*args), repeats, warmup)
        rec.update(marginals_ms=ms, marginals_runs_ms=runs)
    return rec, z, grads


def agreement(z_a, g_a, z_b, g_b):
    return {
        "log_z_max_rel": float(((z_a.double() - z_b.double()).abs() / z_b.double().abs()).max()),
        "grad_max_abs": {name: float((a.double() - b.double()).abs().max())
                         for name, a, b in zip(("cum_scores", "transition", "duration_bias"), g_a, g_b)},
    }


def run_config(B, T, K, C, fs, opts):
    args = (*make_inputs(B, T, K, C), K)
    rec = {"B": B, "T": T, "K": K, "C": C, "dtype": "float32"}
    slow = T >= 100_000
    line = lambda name, r: print(f"  {name:<6} B{B} T{T} K{K} C{C}: " + ", ".join(  # noqa: E731
        f"{LABELS[m]} {r[f'{m}_ms']:.1f} ms" for m in MODES if f"{m}_ms" in r), flush=True)
    rec["numba"], z_n, g_n = time_impl(ours("numba"), args, opts.repeats, True)
    line("numba", rec["numba"])
    reps = opts.slow_repeats if slow else opts.repeats
    rec["torch"], z_t, g_t = time_impl(ours("torch"), args, reps, not slow)
    line("torch", rec["torch"])
    rec["agreement_numba_torch"] = agreement(z_n, g_n, z_t, g_t)
    rec["speedup_vs_torch"] = {m: rec["torch"][f"{m}_ms"] / rec["numba"][f"{m}_ms"] for m in MODES}
    if fs is not None and T <= opts.flash_max_t:
        reps = opts.slow_repeats if slow else opts.flash_repeats
        rec["flash"], z_f, g_f = time_impl(flash(fs), args, reps, not slow)
        line("flash", rec["flash"])
        rec["agreement_numba_flash"] = agreement(z_n, g_n, z_f, g_f)
        rec["speedup_vs_flash"] = {m: rec["flash"][f"{m}_ms"] / rec["numba"][f"{m}_ms"] for m in ("forward", "fwd_bwd", "viterbi")}
    s = rec["speedup_vs_torch"]
    print("         numba over torch: " + ", ".join(f"{LABELS[m]} {s[m]:.1f}x" for m in MODES), flush=True)
    return rec


def run_threads(configs, opts):
    """numba engine forward+backward with 1 and 2 engine threads, and with 1 and 2 torch threads."""
    out = []
    fns = ours("numba")
    torch_threads = torch.get_num_threads()
    numba_threads = numba.config.NUMBA_NUM_THREADS
    for B, T, K, C in configs:
        args = (*make_inputs(B, T, K, C), K)
        rec = {"B": B, "T": T, "K": K, "C": C}
        for n in (1, 2):
            numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
            # numba's threading layer also sets OpenMP's thread count, which torch reads
            torch.set_num_threads(torch_threads)
            rec[f"numba_threads_{n}_ms"] = timed(lambda a=args: fwd_bwd(fns["forward"], *a), opts.repeats)[0]
        numba.set_num_threads(numba_threads)
        torch.set_num_threads(torch_threads)
        for n in (1, 2):
            torch.set_num_threads(n)
            rec[f"torch_threads_{n}_ms"] = timed(lambda a=args: fwd_bwd(fns["forward"], *a), opts.repeats)[0]
        torch.set_num_threads(torch_threads)
        print(f"  threads B{B} T{T} K{K} C{C}: engine threads 1 / 2: {rec['numba_threads_1_ms']:.1f} / "
              f"{rec['numba_threads_2_ms']:.1f} ms; torch threads 1 / 2: {rec['torch_threads_1_ms']:.1f} / "
              f"{rec['torch_threads_2_ms']:.1f} ms", flush=True)
        out.append(rec)
    return out


BEYOND_CONFIGS = [(2, 4000, 64, 8), (1, 100000, 64, 8)]
#: Targets of issue 24: multiples of the engine's forward+backward ("top5": of its Viterbi).
BEYOND_TARGETS = {"masked_fwd_bwd": 1.5, "samples16": 3.0, "entropy_grad": 3.0, "top5": 3.0, "entropy_grad_kcc": 3.0}
#: The time each ratio divides by ("fwd_bwd_kcc": forward+backward with a (K, C, C) transition).
BEYOND_BASE = {"top5": "viterbi", "entropy_grad_kcc": "fwd_bwd_kcc"}


def run_beyond(opts):
    """Masked forward+backward, 16 samples, entropy + gradient and top-5 against the engine's own
    forward+backward and Viterbi, one configuration at a time (medians over --repeats)."""
    from torch_semimarkov import semi_crf_streaming_entropy, semi_crf_streaming_sample, semi_crf_streaming_topk

    out = []
    for B, T, K, C in BEYOND_CONFIGS:
        cum, tr, db, lengths = make_inputs(B, T, K, C)
        g = torch.Generator().manual_seed(1)
        lab = torch.randint(0, C, (B, T), generator=g)
        # partial labels: 30% of (position, label) pairs forbidden, the reference labels kept
        lm = (torch.rand(B, T, C, generator=g) < 0.7) | torch.nn.functional.one_hot(lab, C).bool()

        def grad_of(fn, transition=tr, **kw):
            def run():
                leaves = [x.clone().requires_grad_() for x in (cum, transition, db)]
                fn(*leaves, lengths, K, backend="numba", **kw).sum().backward()
            return run

        fns = {
            "fwd_bwd": grad_of(semi_crf_streaming_forward),
            "viterbi": lambda: semi_crf_streaming_viterbi(cum, tr, db, lengths, K, backend="numba"),
            "masked_fwd_bwd": grad_of(semi_crf_streaming_forward, label_mask=lm),
            "samples16": lambda: semi_crf_streaming_sample(cum, tr, db, lengths, K, num_samples=16, backend="numba",
                                                           generator=torch.Generator().manual_seed(0)),
            "entropy_grad": grad_of(semi_crf_streaming_entropy),
        }
        if (B, T, K, C) == BEYOND_CONFIGS[0]:
            # duration-dependent transitions: the same scores, a transition per duration
            tr_k = 0.1 * torch.randn(K, C, C, generator=g)
            fns["fwd_bwd_kcc"] = grad_of(semi_crf_streaming_forward, transition=tr_k)
            fns["entropy_grad_kcc"] = grad_of(semi_crf_streaming_entropy, transition=tr_k)
        row = {"B": B, "T": T, "K": K, "C": C, "ms": {}}
        for name, fn in fns.items():
            row["ms"][name] = timed(fn, opts.repeats)[0]
            print(f"B{B} T{T} K{K} C{C} {name}: {row['ms'][name]:.1f} ms", flush=True)
        row["ms"]["top5"] = timed(lambda: semi_crf_streaming_topk(cum, tr, db, lengths, K, k=5, backend="numba"),
                                  opts.repeats)[0]
        print(f"B{B} T{T} K{K} C{C} top5: {row['ms']['top5']:.1f} ms", flush=True)
        row["ratio"] = {m: row["ms"][m] / row["ms"][BEYOND_BASE.get(m, "fwd_bwd")] for m in BEYOND_TARGETS
                        if m in row["ms"]}
        row["met"] = {m: row["ratio"][m] <= BEYOND_TARGETS[m] for m in row["ratio"]}
        out.append(row)
    return out


def beyond_markdown(res):
    lines = [f"# Compiled CPU engine beyond log Z (issue 24), {res['date']}, commit {res['commit']}", "",
             f"torch {res['torch']} ({res['torch_threads']} intra-op threads), numba {res['numba']} "
             f"({res['numba_threads']} threads), {res['cpu_count']} cores, load {res['load_before']} -> "
             f"{res['load_after']}. Medians of {res['repeats']} runs.", "",
             "| B, T, K, C | fwd+bwd ms | Viterbi ms | masked fwd+bwd | 16 samples | entropy + grad | top-5 "
             "| (K, C, C) fwd+bwd ms | (K, C, C) entropy + grad |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        cell = lambda m: (f"{r['ms'][m]:.1f} ms = {r['ratio'][m]:.2f}x ({'met' if r['met'][m] else 'unmet'}, "  # noqa: E731
                          f"<= {BEYOND_TARGETS[m]:g}x)") if m in r["ms"] else "not run"
        kcc = f"{r['ms']['fwd_bwd_kcc']:.1f}" if "fwd_bwd_kcc" in r["ms"] else "not run"
        lines.append(f"| {r['B']}, {r['T']}, {r['K']}, {r['C']} | {r['ms']['fwd_bwd']:.1f} | {r['ms']['viterbi']:.1f} | "
                     + " | ".join(cell(m) for m in ("masked_fwd_bwd", "samples16", "entropy_grad", "top5"))
                     + f" | {kcc} | {cell('entropy_grad_kcc')} |")
    lines += ["", "Ratios: masked forward+backward, samples and entropy over the engine's forward+backward; "
              "top-5 (the compiled k-best Viterbi, numba_kbest.py) over its Viterbi; the (K, C, C) entropy over "
              "the engine's forward+backward with the same (K, C, C) transition.", ""]
    return "\n".join(lines)


LOOP_SHAPE = (4, 2000, 32, 8)
LOOP_HIDDEN = (32, 128)
LOOP_IN = 16


def loop_worker(hidden, threads, steps):
    """One training run at ``threads`` torch threads (set before any torch work): step times of
    encoder + head + Adam, then the head alone and the encoder alone; prints one JSON line."""
    torch.set_num_threads(threads)
    from torch import nn

    from torch_semimarkov import SemiMarkovCRFHead

    B, T, K, C = LOOP_SHAPE
    torch.manual_seed(0)
    enc = nn.Sequential(nn.Conv1d(LOOP_IN, hidden, 5, padding=2), nn.ReLU(), nn.Conv1d(hidden, hidden, 5, padding=2))
    head = SemiMarkovCRFHead(num_classes=C, max_duration=K, hidden_dim=hidden)
    opt = torch.optim.Adam(list(enc.parameters()) + list(head.parameters()), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, LOOP_IN, T, generator=g)
    # gold segmentations: runs of 1..K positions with random labels
    labels = torch.empty(B, T, dtype=torch.long)
    for b in range(B):
        t = 0
        while t < T:
            d = int(torch.randint(1, K + 1, (1,), generator=g))
            labels[b, t:t + d] = int(torch.randint(0, C, (1,), generator=g))
            t += d
    lengths = torch.full((B,), T, dtype=torch.long)

    def step():
        loss = head.compute_loss(enc(x).transpose(1, 2), lengths, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss.detach())

    for _ in range(3):
        step()
    times, t_all = [], time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step()
        times.append((time.perf_counter() - t0) * 1e3)
    total_s = time.perf_counter() - t_all
    features = enc(x).transpose(1, 2).detach().contiguous()

    def head_only():
        h = features.clone().requires_grad_()
        head.compute_loss(h, lengths, labels).backward()

    def encoder_only():
        enc(x).sum().backward()

    # the engine's backward alone, and right after one torch operation on B·(T+1)·C elements (large
    # enough for torch to run it on its intra-op threads)
    from torch_semimarkov.engines.numba import engine as ne

    out = head.build(features, lengths)
    args = [t.detach() for t in (out.cum_scores, out.transition, out.duration_bias)] + [lengths, K]
    fwd = ne.semi_crf_streaming_forward_numba(*args)
    scratch = torch.randn(B, T + 1, C)

    def engine_bw():
        ne.semi_crf_streaming_backward_numba(*args, *fwd)

    def engine_bw_after_op():
        scratch.mul_(1.0)
        engine_bw()

    def one_thread(fn):
        """fn with torch limited to one thread around it (the option of a head or engine that
        limits torch's threads around its own work)."""
        def run():
            n = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                fn()
            finally:
                torch.set_num_threads(n)
        return run

    def engine_bw_after_op_limited():
        scratch.mul_(1.0)
        one_thread(engine_bw)()

    def head_limited():
        h = features.clone().requires_grad_()
        one_thread(lambda: head.compute_loss(h, lengths, labels).backward())()

    rec = {"hidden": hidden, "torch_threads": torch.get_num_threads(), "steps": steps, "total_s": total_s,
           "step_ms": statistics.median(times), "step_mean_ms": statistics.mean(times), "final_loss": loss,
           "head_ms": timed(head_only, 20)[0], "encoder_ms": timed(encoder_only, 20)[0],
           "engine_bw_ms": timed(engine_bw, 20)[0], "engine_bw_after_op_ms": timed(engine_bw_after_op, 20)[0],
           "engine_bw_after_op_limited_ms": timed(engine_bw_after_op_limited, 20)[0],
           "head_limited_ms": timed(head_limited, 20)[0]}
    print(json.dumps(rec), flush=True)


def run_threads_loop(opts):
    """Training loop at 1 and 2 torch threads, each in a fresh process, alternating order."""
    runs = []
    for hidden in LOOP_HIDDEN:
        for rep in range(opts.loop_reps):
            for threads in ((1, 2) if rep % 2 == 0 else (2, 1)):
                load = [round(x, 2) for x in os.getloadavg()]
                out = subprocess.run([sys.executable, __file__, "--loop-worker", str(hidden), str(threads),
                                      str(opts.loop_steps)], capture_output=True, text=True, check=True)
                rec = json.loads(out.stdout.strip().splitlines()[-1])
                rec["load_before"] = load
                runs.append(rec)
                print(f"  hidden {hidden}, torch threads {threads}: {opts.loop_steps} steps {rec['total_s']:.2f} s, "
                      f"step {rec['step_ms']:.1f} ms (head {rec['head_ms']:.1f} ms, encoder {rec['encoder_ms']:.1f} ms, "
                      f"engine backward {rec['engine_bw_ms']:.1f} ms, after a torch op {rec['engine_bw_after_op_ms']:.1f} ms, "
                      f"limited {rec['engine_bw_after_op_limited_ms']:.1f} ms; head limited {rec['head_limited_ms']:.1f} ms), "
                      f"load {load[0]}", flush=True)
    return runs


def threads_loop_markdown(res):
    lines = [f"# Training loop at 1 and 2 torch threads (issue 24), {res['date']}, commit {res['commit']}", "",
             f"torch {res['torch']}, numba {res['numba']} ({res['numba_threads']} engine threads), "
             f"{res['cpu_count']} cores, load {res['load_before']} -> {res['load_after']}. "
             f"(B, T, K, C) = {tuple(LOOP_SHAPE)}: Conv1d({LOOP_IN}, H, 5) + ReLU + Conv1d(H, H, 5), "
             "SemiMarkovCRFHead(hidden_dim=H), Adam; each row one fresh process; step: median of "
             f"{res['loop_steps']} steps (after 3 warm-up steps); head: compute_loss + backward on fixed "
             "features; encoder: forward + backward; engine bwd: the compiled engine's backward alone, and "
             "right after one torch operation on B·(T+1)·C elements; 'limited': the same with "
             "torch.set_num_threads(1) around the engine's backward / around the head's compute_loss + "
             "backward (restored after); all medians of 20 calls.", "",
             "| H | torch threads | load before | total s | step ms | head ms | head limited ms | encoder ms | "
             "engine bwd ms | engine bwd after a torch op ms | same, limited ms | final loss |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["loop"]:
        lines.append(f"| {r['hidden']} | {r['torch_threads']} | {r['load_before'][0]} | {r['total_s']:.2f} | "
                     f"{r['step_ms']:.1f} | {r['head_ms']:.1f} | {r['head_limited_ms']:.1f} | {r['encoder_ms']:.1f} | "
                     f"{r['engine_bw_ms']:.1f} | {r['engine_bw_after_op_ms']:.1f} | "
                     f"{r['engine_bw_after_op_limited_ms']:.1f} | {r['final_loss']:.4f} |")
    lines.append("")
    return "\n".join(lines)


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
        f"commit {res['commit']}; torch {res['torch']} ({res['torch_threads']} threads), numba {res['numba']} "
        f"({res['numba_threads']} engine threads) on {res['cpu_count']} cores; flash-semicrf {res['flash_semicrf']}; "
        f"load average before / after: {res['load_before']} / {res['load_after']}.",
        "Median ms over repeats after one warm-up (float32, full-length sequences); at T = 10^5 the PyTorch path "
        "is timed once. Speedups are the PyTorch path's (and flash-semicrf's) time over the numba engine's.",
        "",
        "| B | T | K | C | mode | numba (ms) | PyTorch path (ms) | vs PyTorch | flash-semicrf (ms) | vs flash |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in res["configs"]:
        for m in MODES:
            fl = r.get("flash", {}).get(f"{m}_ms")
            sf = r.get("speedup_vs_flash", {}).get(m)
            lines.append(
                f"| {r['B']} | {r['T']} | {r['K']} | {r['C']} | {LABELS[m]} | {r['numba'][f'{m}_ms']:.1f} | "
                f"{r['torch'][f'{m}_ms']:.1f} | {r['speedup_vs_torch'][m]:.1f}x | "
                + (f"{fl:.1f} | {sf:.1f}x |" if fl is not None and sf is not None else "- | - |")
            )
    if res.get("threads"):
        lines += ["", "Threads (numba engine, forward+backward, ms):", "",
                  "| B | T | K | C | 1 engine thread | 2 engine threads | 1 torch thread | 2 torch threads |",
                  "|---|---|---|---|---:|---:|---:|---:|"]
        for r in res["threads"]:
            lines.append(f"| {r['B']} | {r['T']} | {r['K']} | {r['C']} | {r['numba_threads_1_ms']:.1f} | "
                         f"{r['numba_threads_2_ms']:.1f} | {r['torch_threads_1_ms']:.1f} | {r['torch_threads_2_ms']:.1f} |")
    lines += ["", "Targets (numba over the PyTorch path): forward+backward 20x at the first two configurations and 10x "
              "at T = 10^5; Viterbi and marginals 10x.", ""]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "cpu_latest.json"))
    ap.add_argument("--repeats", type=int, default=7, help="timed runs per mode (numba engine, PyTorch path)")
    ap.add_argument("--flash-repeats", type=int, default=3, help="timed runs of flash-semicrf per mode")
    ap.add_argument("--slow-repeats", type=int, default=1, help="timed runs of the slow paths at T >= 10^5")
    ap.add_argument("--flash-max-t", type=int, default=10_000, help="largest T at which flash-semicrf is timed")
    ap.add_argument("--quick", action="store_true", help="only the small configuration")
    ap.add_argument("--no-flash", action="store_true", help="skip flash-semicrf")
    ap.add_argument("--beyond", action="store_true", help="masks, samples, entropy, top-k (issue 24)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads (default: torch's own choice); the engine's are numba's")
    ap.add_argument("--threads-loop", action="store_true", help="training loop at 1 and 2 torch threads")
    ap.add_argument("--loop-steps", type=int, default=100, help="timed training steps per run (--threads-loop)")
    ap.add_argument("--loop-reps", type=int, default=2, help="rounds of 1 and 2 threads per encoder (--threads-loop)")
    ap.add_argument("--loop-worker", nargs=3, type=int, metavar=("HIDDEN", "THREADS", "STEPS"), help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    if opts.loop_worker:
        loop_worker(*opts.loop_worker)
        return
    if opts.threads is not None:
        torch.set_num_threads(opts.threads)

    fs = None if opts.no_flash else flash_module()
    if fs is None and not opts.no_flash:
        print("flash-semicrf is not installed (pip install --no-deps flash-semicrf==0.2.0): skipping it")
    configs = CONFIGS[:1] if opts.quick else CONFIGS
    # compile (or load from numba's cache) every kernel before timing anything
    t0 = time.perf_counter()
    for transition in (torch.zeros(2, 2), torch.zeros(2, 2, 2)):
        small = torch.zeros(1, 5, 2), transition, torch.zeros(2, 2), torch.tensor([4]), 2
        fwd_bwd(ours("numba")["forward"], *small)
        ours("numba")["viterbi"](*small)
    load_s = time.perf_counter() - t0
    res = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "torch": torch.__version__,
        "numba": numba.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "numba_threads": numba.config.NUMBA_NUM_THREADS,
        "cpu_count": os.cpu_count(),
        "flash_semicrf": None if fs is None else getattr(sys.modules.get("flash_semicrf"), "__version__", "?"),
        "kernel_load_s": load_s,
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "repeats": opts.repeats,
        "configs": [],
    }
    print(f"numba kernels compiled or loaded in {load_s:.1f} s")
    if opts.threads_loop:
        res["loop_steps"] = opts.loop_steps
        res["loop"] = run_threads_loop(opts)
        res["load_after"] = [round(x, 2) for x in os.getloadavg()]
        out = Path(opts.out).with_name("cpu_threads_loop.json")
        out.write_text(json.dumps(res, indent=2) + "\n")
        out.with_suffix(".md").write_text(threads_loop_markdown(res))
        print(f"wrote {out} and {out.with_suffix('.md')}")
        return
    if opts.beyond:
        res["rows"] = run_beyond(opts)
        res["load_after"] = [round(x, 2) for x in os.getloadavg()]
        out = Path(opts.out).with_name("cpu_beyond.json")
        out.write_text(json.dumps(res, indent=2) + "\n")
        out.with_suffix(".md").write_text(beyond_markdown(res))
        print(f"wrote {out} and {out.with_suffix('.md')}")
        return
    for B, T, K, C in configs:
        res["configs"].append(run_config(B, T, K, C, fs, opts))
    res["threads"] = run_threads([c for c in configs if c[0] >= 2], opts)
    res["load_after"] = [round(x, 2) for x in os.getloadavg()]

    print("\nsummary: numba engine over the PyTorch path (targets in parentheses)")
    ok = True
    for r in res["configs"]:
        for m, target in TARGETS.get((r["B"], r["T"], r["K"], r["C"]), {}).items():
            sp = r["speedup_vs_torch"][m]
            ok &= sp >= target
            print(f"  B{r['B']} T{r['T']} K{r['K']} C{r['C']} {LABELS[m]}: {sp:.1f}x ({target:.0f}x)")
    res["targets_met"] = ok
    out = Path(opts.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(res))
    print(f"wrote {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
