"""Check the Triton kernels on a CUDA GPU against the float64 PyTorch path; exit non-zero on failure.

Checks, each printed as one PASS/FAIL line:

* moderate sizes (ragged lengths, boundaries, K = 1 / 2 / K > T, C not a power of two, (K, C, C)
  transitions, float64 inputs): log Z, P_start, P_end, per-sequence transition and duration
  gradients, Viterbi score and segmentation, all against the float64 PyTorch reference on the CPU;
* T = 10^5 (K = 64, C = 8): log Z and every gradient against the float64 reference;
* T = 10^6 (K = 64, C = 8): log Z within 1e-6 relative of the float64 reference, gradients finite
  and consistent (sum of P_end at the last position = 1, sum of start = sum of duration marginals);
* determinism: 10 repeated forward + backward runs give bitwise-identical outputs;
* checkpointed recompute: the backward's recomputation from the forward's checkpoints reproduces a
  save-all forward bitwise (register ring, memory ring, (K, C, C); intervals 1, 7, default, > T),
  and the gradients are bitwise the same for every interval;
* every check above with one program per sequence and with the time-parallel engine, and the two
  engines against each other at T = 10^6 (marginals, Viterbi) and on adversarial models (a cyclic
  and a reading-frame grammar that the fix-up cannot rely on), for both transition shapes;
* (K, C, C) transitions at T = 10^5 (K = 32, C = 8) against the float64 reference and at T = 10^6
  (log Z against float64, gradients consistent, the two engines against each other);
* the public API (``semi_crf_streaming_forward`` with autograd) on CUDA against the PyTorch path,
  (C, C) and (K, C, C), default engine and ``time_parallel=True``.

The float64 references of the long sequences run in worker processes on the CPU while the GPU
checks run. Usage: ``python scripts/gpu_check.py [--skip-1e6]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import multiprocessing as mp
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))


def make_case(B, T, K, C, seed, lengths=None, proj=False, kcc=False, scale=1.0):
    """Float32 inputs on the CPU: zero-centred per-position scores, params ~ 0.5 N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, T, C, generator=g, dtype=torch.float64) * scale
    scores = scores - scores.mean(1, keepdim=True)
    cum = torch.zeros(B, T + 1, C, dtype=torch.float64)
    cum[:, 1:] = scores.cumsum(1)
    tr = torch.randn((K, C, C) if kcc else (C, C), generator=g, dtype=torch.float64) * 0.5
    db = torch.randn(K, C, generator=g, dtype=torch.float64) * 0.5
    if lengths == "ragged":
        lens = [T] + torch.randint(1, T + 1, (B - 1,), generator=g).tolist()
    else:
        lens = [T] * B
    ps = torch.randn(B, T, C, generator=g, dtype=torch.float64) * 0.5 if proj else None
    pe = torch.randn(B, T, C, generator=g, dtype=torch.float64) * 0.5 if proj else None
    f32 = lambda x: None if x is None else x.float()  # noqa: E731
    return dict(cum_scores=f32(cum), transition=f32(tr), duration_bias=f32(db),
                lengths=torch.tensor(lens, dtype=torch.long), K=K, proj_start=f32(ps), proj_end=f32(pe))


def reference(case_args, with_backward=True, with_viterbi=False):
    """float64 PyTorch-path results on the CPU for make_case(*case_args)."""
    torch.set_num_threads(1)
    from torch_semimarkov.engines.torch import reference as ref
    from torch_semimarkov.core.validation import validate_streaming_inputs

    args, kwargs = case_args
    inp = make_case(*args, **kwargs)
    d64 = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in inp.items()}
    v = validate_streaming_inputs(**d64)
    common = (v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K)
    t0 = time.time()
    z, ring, interval, norms = ref.semi_crf_streaming_forward_pytorch(*common, "log", v.proj_start, v.proj_end)
    out = {"log_z": z, "t_fwd": time.time() - t0}
    if with_backward:
        out["grads"] = ref.semi_crf_streaming_backward_pytorch(
            *common, z, ring, interval, norms, v.proj_start, v.proj_end)
    if with_viterbi:
        out["viterbi"] = ref.semi_crf_streaming_viterbi_pytorch(*common, v.proj_start, v.proj_end)
    out["t_total"] = time.time() - t0
    return out


MODERATE = [
    ((4, 300, 12, 6, 1), dict(lengths="ragged", proj=True)),
    ((3, 200, 40, 24, 2), dict()),
    ((5, 150, 1, 5, 3), dict(lengths="ragged")),
    ((4, 120, 2, 7, 4), dict(proj=True)),
    ((3, 40, 64, 3, 5), dict(lengths="ragged")),  # K > T
    ((2, 500, 200, 9, 6), dict()),  # several K blocks
    ((3, 80, 6, 5, 7), dict(lengths="ragged", proj=True, kcc=True)),
    ((64, 100, 10, 4, 8), dict(lengths="ragged")),
    ((3, 600, 16, 6, 9), dict(lengths="ragged", proj=True, kcc=True)),  # (K, C, C), several chunks
    ((2, 300, 1, 5, 10), dict(kcc=True)),  # (K, C, C), K = 1
]
LONG_1E5 = ((1, 100_000, 64, 8, 11), dict())
LONG_1E6 = ((1, 1_000_000, 64, 8, 12), dict())
LONG_KCC_1E5 = ((1, 100_000, 32, 8, 13), dict(kcc=True))
LONG_KCC_1E6 = ((1, 1_000_000, 32, 8, 14), dict(kcc=True))


class Checker:
    def __init__(self):
        self.failures = []
        self.rows = []

    def check(self, name, ok, detail=""):
        line = f"{'PASS' if ok else 'FAIL'} {name} {detail}"
        print(line, flush=True)
        self.rows.append(line)
        if not ok:
            self.failures.append(name)


def rel_err(a, b):
    a = a.detach().double().cpu()
    b = b.detach().double().cpu()
    if not bool(torch.isfinite(a).all()):
        return math.inf
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def abs_err(a, b):
    a = a.detach().double().cpu()
    b = b.detach().double().cpu()
    if not bool(torch.isfinite(a).all()):
        return math.inf
    return float((a - b).abs().max()) if a.numel() else 0.0


def run_gpu(inp, dev, dtype=torch.float32, viterbi=False, parallel=False):
    """Forward, backward (and Viterbi) with one engine; None where the time-parallel engine does
    not run this case."""
    from torch_semimarkov.engines.triton import launch
    from torch_semimarkov.core.validation import validate_streaming_inputs

    g = {k: (v.to(dev, dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else
             (v.to(dev) if isinstance(v, torch.Tensor) else v)) for k, v in inp.items()}
    v = validate_streaming_inputs(**g)
    common = (v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K)
    try:
        plan = launch.plan_for(v.cum_scores, v.transition, v.K, "log", time_parallel=parallel)
    except ValueError:
        return None
    if parallel and not plan.time_parallel:
        return None
    z, state = launch.launch_forward(*common, "log", v.proj_start, v.proj_end, plan=plan)
    grads = launch.launch_backward(*common, v.proj_start, v.proj_end, plan=plan, state=state)
    rows = torch.arange(z.shape[0], device=dev)
    # the kernel's float64 log Z (the public one is rounded to the input dtype)
    if plan.time_parallel:
        saved, frames = state
    else:
        from torch_semimarkov.engines.triton.recompute import recompute_forward_state

        saved, frames = recompute_forward_state(*common[:4], v.proj_start, v.proj_end, plan, *state)
    z64 = frames[rows, v.lengths] + torch.logsumexp(saved[0][rows, v.lengths].double(), -1)
    del saved, frames, state
    out = {"log_z": z.to(dtype), "log_z64": z64, "grads": grads}
    if viterbi:
        vplan = launch.plan_for(v.cum_scores, v.transition, v.K, "max", time_parallel=parallel)
        out["viterbi"] = launch.launch_viterbi(*common, v.proj_start, v.proj_end, plan=vplan)
    torch.cuda.synchronize()
    return out


def compare(ck, name, got, exp, inp, tol_rel=1e-6, tol_marg=2e-5, tol_par=2e-4):
    """Marginals: max abs error; parameter gradients: max abs error over max(1, max |ref|)."""
    ck.check(f"{name} logZ", rel_err(got["log_z"], exp["log_z"]) < tol_rel,
             f"rel {rel_err(got['log_z'], exp['log_z']):.2e}")
    names = ("P_start", "P_end", "grad_transition", "grad_duration_bias")
    for nm, a, e in zip(names, got["grads"], exp["grads"]):
        if nm.startswith("P_"):
            err = abs_err(a, e)
            ok = err < tol_marg
        else:
            err = abs_err(a, e) / max(1.0, float(e.abs().max()))
            ok = err < tol_par
        ck.check(f"{name} {nm}", ok, f"err {err:.2e}")
    if "viterbi" in exp and "viterbi" in got:
        from torch_semimarkov.oracle import segmentation_score
        from torch_semimarkov.core.segments import segments_from_boundaries

        s_g, l_g, st_g = got["viterbi"]
        s_e, l_e, st_e = exp["viterbi"]
        ck.check(f"{name} viterbi score", rel_err(s_g, s_e) < tol_rel, f"rel {rel_err(s_g, s_e):.2e}")
        same = bool(torch.equal(l_g.cpu(), l_e.cpu())) and bool(torch.equal(st_g.cpu(), st_e.cpu()))
        if not same:
            # a float64 tie may be broken differently by float32 rounding: compare scores
            worst = 0.0
            for b, L in enumerate(inp["lengths"].tolist()):
                segs = segments_from_boundaries(l_g[b].cpu().numpy(), st_g[b].cpu().numpy(), L)
                row = lambda t: None if t is None else t[b]  # noqa: E731
                sc = segmentation_score(inp["cum_scores"][b], inp["transition"], inp["duration_bias"], segs,
                                        row(inp["proj_start"]), row(inp["proj_end"]))
                worst = max(worst, abs(sc - float(s_e[b])) / max(1.0, abs(float(s_e[b]))))
            same = worst < 1e-6
        ck.check(f"{name} viterbi segments", same)


def determinism(ck, dev):
    for args, kw in (((8, 2000, 32, 12, 21), dict(lengths="ragged", proj=True)),
                     ((2, 3000, 5, 4, 22), dict(kcc=True)),
                     ((2, 20000, 32, 12, 23), dict(lengths="ragged", proj=True))):
        inp = make_case(*args, **kw)
        for parallel in (False, True):
            first = run_gpu(inp, dev, parallel=parallel)
            if first is None:
                continue
            same = True
            for _ in range(9):
                again = run_gpu(inp, dev, parallel=parallel)
                same &= bool(torch.equal(again["log_z"], first["log_z"]))
                same &= all(bool(torch.equal(a, b)) for a, b in zip(again["grads"], first["grads"]))
            engine = "parallel" if parallel else "sequential"
            ck.check(f"determinism x10 {engine} {args[:4]} {'KCC' if kw.get('kcc') else ''}", same)


def recompute_bitwise(ck, dev):
    """The sequential backward's recompute from checkpoints equals a save-all forward, bitwise;
    gradients are bitwise identical for every checkpoint interval."""
    from torch_semimarkov.engines.triton import launch, plan as plan_mod
    from torch_semimarkov.engines.triton.recompute import recompute_forward_state
    from torch_semimarkov.core.validation import validate_streaming_inputs

    cases = [((6, 700, 24, 8, 41), dict(lengths="ragged", proj=True), False),
             ((6, 700, 24, 8, 41), dict(lengths="ragged", proj=True), True),  # memory ring
             ((3, 900, 100, 24, 42), dict(lengths="ragged"), False),
             ((3, 200, 7, 5, 43), dict(lengths="ragged", proj=True, kcc=True), False)]
    for args, kw, force_mem in cases:
        plan_mod.FORCE_MEMORY_RING = force_mem
        try:
            inp = make_case(*args, **kw)
            g = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}
            v = validate_streaming_inputs(**g)
            common = (v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K)

            def plan(interval=None):
                return launch.plan_for(v.cum_scores, v.transition, v.K, "log", time_parallel=False,
                                       checkpoint_interval=interval)

            z_all, (saved, frames) = launch.launch_forward(*common, "log", v.proj_start, v.proj_end, plan=plan(),
                                                           save="all")
            T = args[1]
            same_state, same_grads, first = True, True, None
            diffs = {"logZ": 0.0, "alpha_hat": 0.0, "U_hat": 0.0, "frames": 0.0}

            def note(key, a, e):
                nonlocal same_state
                if not bool(torch.equal(a, e)):
                    same_state = False
                    diffs[key] = max(diffs[key], float((a.double() - e.double()).abs().max()))

            for interval in (1, 7, None, T + 5):
                p = plan(interval)
                z, state = launch.launch_forward(*common, "log", v.proj_start, v.proj_end, plan=p)
                note("logZ", z, z_all)
                got, got_f = recompute_forward_state(*common[:4], v.proj_start, v.proj_end, p, *state)
                for b, L in enumerate(inp["lengths"].tolist()):
                    note("alpha_hat", got[0, b, :L + 1], saved[0, b, :L + 1])
                    note("frames", got_f[b, :L + 1], frames[b, :L + 1])
                    if got.shape[0] > 1:
                        note("U_hat", got[1, b, :L], saved[1, b, :L])
                grads = launch.launch_backward(*common, v.proj_start, v.proj_end, plan=p, state=state)
                if first is None:
                    first = grads
                else:
                    same_grads &= all(bool(torch.equal(a, b)) for a, b in zip(grads, first))
            name = f"{args[:4]}{' KCC' if kw.get('kcc') else ''}{' memory ring' if force_mem else ''}"
            ck.check(f"recompute == save-all forward, bitwise {name}", same_state,
                     "" if same_state else f"max abs diffs {diffs}")
            ck.check(f"gradients identical for intervals 1, 7, default, > T {name}", same_grads)
        finally:
            plan_mod.FORCE_MEMORY_RING = False


def adversarial(ck, dev):
    """Models the fix-up cannot rely on converging (a cyclic grammar, a reading-frame grammar): the
    time-parallel engine equals the sequential one (log Z, marginals, Viterbi), for both
    transition shapes."""
    for kind in ("cyclic", "frame"):
        for kcc in (False, True):
            shape = "(K, C, C)" if kcc else "(C, C)"
            inp = adversarial_case(kind, 2, 20000 if not kcc else 8000, 64 if not kcc else 24, 6, 51, kcc=kcc)
            seq = run_gpu(inp, dev, viterbi=True, parallel=False)
            par = run_gpu(inp, dev, viterbi=True, parallel=True)
            err = rel_err(par["log_z"], seq["log_z"])
            ck.check(f"adversarial {kind} {shape}: parallel log Z == sequential", err < 1e-6, f"rel {err:.2e}")
            for name, a, e in zip(("P_start", "P_end"), par["grads"], seq["grads"]):
                e_ = abs_err(a, e)
                ck.check(f"adversarial {kind} {shape}: parallel {name} == sequential", e_ < 1e-4, f"err {e_:.2e}")
            same = all(bool(torch.equal(a.cpu(), b.cpu())) for a, b in zip(par["viterbi"][1:], seq["viterbi"][1:]))
            ck.check(f"adversarial {kind} {shape}: parallel Viterbi == sequential", same)


def adversarial_case(kind, B, T, K, C, seed, kcc=False):
    """``"cyclic"``: only c -> c+1 (mod C), long segments preferred; ``"frame"``: label 0 only in
    multiples of 3, 0 -> 1 -> 2 -> 0 and 0 -> 0, every other move -inf. ``kcc``: a (K, C, C)
    transition, the same grammar for every duration with duration-dependent allowed scores."""
    inp = make_case(B, T, K, C, seed, lengths="ragged", scale=0.3)
    tr = torch.full((C, C), -math.inf)
    if kind == "cyclic":
        for c in range(C):
            tr[c, (c + 1) % C] = 0.0
        inp["duration_bias"] = (torch.arange(1, K + 1, dtype=torch.float32)[:, None] * 0.05).expand(K, C).contiguous()
    else:
        tr[0, 1] = tr[1, 2] = tr[2, 0] = tr[0, 0] = 0.0
        db = torch.zeros(K, C)
        for k in range(1, K + 1):
            if k % 3:
                db[k - 1, 0] = -math.inf
        inp["duration_bias"] = db
    if kcc:
        k = torch.arange(1, K + 1, dtype=torch.float32)[:, None, None]
        tr = torch.where(torch.isfinite(tr)[None], 0.1 * (k % 3), tr[None]).contiguous()
    inp["transition"] = tr
    return inp


def public_api(ck, dev):
    from torch_semimarkov.streaming import autograd as api

    for kcc, time_parallel in ((False, None), (True, None), (True, True)):
        inp = make_case(3, 257, 9, 5, 31, lengths="ragged", proj=True, kcc=kcc)
        grads = {}
        for use_triton in (True, False):
            d = {k: (v.to(dev).detach().clone().requires_grad_(v.is_floating_point()) if isinstance(v, torch.Tensor)
                     else v) for k, v in inp.items()}
            z = api.semi_crf_streaming_forward(**d, use_triton=use_triton, time_parallel=time_parallel)
            up = torch.linspace(0.5, 1.5, z.shape[0], device=dev)
            (z * up).sum().backward()
            grads[use_triton] = [z.detach()] + [d[k].grad for k in ("cum_scores", "transition", "duration_bias",
                                                                      "proj_start", "proj_end")]
        errs = [abs_err(a, b) for a, b in zip(grads[True], grads[False])]
        name = f"public API triton vs pytorch (autograd){' (K, C, C)' if kcc else ''} time_parallel={time_parallel}"
        ck.check(name, max(errs) < 5e-4, f"max err {max(errs):.2e}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-1e6", action="store_true")
    ap.add_argument("--json", default=None)
    opts = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    ctx = mp.get_context("spawn")
    pool = cf.ProcessPoolExecutor(max_workers=min(12, os.cpu_count() or 2), mp_context=ctx)
    jobs = {}
    if not opts.skip_1e6:
        jobs["T1e6"] = pool.submit(reference, LONG_1E6, False)
    jobs["T1e5"] = pool.submit(reference, LONG_1E5, True, True)
    jobs["KCC1e5"] = pool.submit(reference, LONG_KCC_1E5, True, True)
    if not opts.skip_1e6:
        jobs["KCC1e6"] = pool.submit(reference, LONG_KCC_1E6, False)
    for i, case in enumerate(MODERATE):
        jobs[f"moderate{i}"] = pool.submit(reference, case, True, True)
    dev = torch.device("cuda")
    ck = Checker()
    t0 = time.time()

    for i, (args, kw) in enumerate(MODERATE):
        inp = make_case(*args, **kw)
        for parallel in (False, True):
            got = run_gpu(inp, dev, viterbi=True, parallel=parallel)
            if got is not None:
                engine = "parallel" if parallel else "sequential"
                compare(ck, f"{engine} moderate B,T,K,C={args[:4]} {kw}", got, jobs[f"moderate{i}"].result(), inp)
    # float64 inputs: computed in float32 inside, returned in float64
    args, kw = MODERATE[0]
    inp = make_case(*args, **kw)
    got = run_gpu(inp, dev, dtype=torch.float64)
    ck.check("float64 inputs keep their dtype", got["log_z"].dtype == torch.float64 and got["grads"][0].dtype == torch.float64)
    compare(ck, "float64 inputs", got, jobs["moderate0"].result(), inp)

    determinism(ck, dev)
    recompute_bitwise(ck, dev)
    adversarial(ck, dev)
    try:
        public_api(ck, dev)
    except Exception as exc:  # noqa: BLE001 - reported as a failure, the other checks still run
        ck.check("public API triton vs pytorch (autograd)", False, repr(exc)[:300])

    inp = make_case(*LONG_1E5[0], **LONG_1E5[1])
    exp = jobs["T1e5"].result()
    for parallel in (False, True):
        engine = "parallel" if parallel else "sequential"
        t1 = time.time()
        got = run_gpu(inp, dev, viterbi=True, parallel=parallel)
        t_gpu = time.time() - t1
        # float32 recurrences accumulate rounding over 1e5 steps: looser marginal tolerances
        compare(ck, f"{engine} T=1e5 K=64 C=8", got, exp, inp, tol_marg=1e-4, tol_par=1e-3)
        err64 = abs(float(got["log_z64"][0]) - float(exp["log_z"][0]))
        print(f"  T=1e5 {engine}: kernel's float64 log Z abs err {err64:.3e}; GPU {t_gpu:.2f}s (incl. compile)")
    print(f"  T=1e5: float64 CPU reference {exp['t_total']:.1f}s")

    # (K, C, C) transitions at T = 10^5: both engines against the float64 reference
    inp = make_case(*LONG_KCC_1E5[0], **LONG_KCC_1E5[1])
    exp = jobs["KCC1e5"].result()
    for parallel in (False, True):
        engine = "parallel" if parallel else "sequential"
        t1 = time.time()
        got = run_gpu(inp, dev, viterbi=True, parallel=parallel)
        t_gpu = time.time() - t1
        compare(ck, f"{engine} (K, C, C) T=1e5 K=32 C=8", got, exp, inp, tol_marg=1e-4, tol_par=1e-3)
        print(f"  (K, C, C) T=1e5 {engine}: GPU {t_gpu:.2f}s (incl. compile)")
    print(f"  (K, C, C) T=1e5: float64 CPU reference {exp['t_total']:.1f}s")

    if not opts.skip_1e6:
        inp = make_case(*LONG_1E6[0], **LONG_1E6[1])
        exp = jobs["T1e6"].result()
        results = {}
        for parallel in (False, True):
            engine = "parallel" if parallel else "sequential"
            t1 = time.time()
            got = run_gpu(inp, dev, viterbi=True, parallel=parallel)
            t_gpu = time.time() - t1
            results[engine] = got
            err = rel_err(got["log_z"], exp["log_z"])
            ck.check(f"{engine} T=1e6 K=64 C=8 logZ rel < 1e-6", err < 1e-6,
                     f"rel {err:.2e} (ours {float(got['log_z'][0]):.6f} ref {float(exp['log_z'][0]):.6f})")
            err64 = abs(float(got["log_z64"][0]) - float(exp["log_z"][0]))
            ck.check(f"{engine} T=1e6 kernel's float64 log Z abs err < 0.25", err64 < 0.25,
                     f"abs {err64:.3e} rel {err64 / abs(float(exp['log_z'][0])):.2e}")
            p_start, p_end, g_tr, g_db = got["grads"]
            finite = all(bool(torch.isfinite(x).all()) for x in got["grads"])
            ck.check(f"{engine} T=1e6 gradients finite", finite)
            L = int(inp["lengths"][0])
            last = float(p_end[0, L - 1].double().sum())
            ck.check(f"{engine} T=1e6 sum_c P_end(L) = 1", abs(last - 1) < 1e-5, f"{last:.8f}")
            first = float(p_start[0, 0].double().sum())
            ck.check(f"{engine} T=1e6 sum_c P_start(0) = 1", abs(first - 1) < 1e-5, f"{first:.8f}")
            n_seg = float(p_start.double().sum())
            n_db = float(g_db.double().sum())
            n_tr = float(g_tr.double().sum())
            ck.check(f"{engine} T=1e6 E[#segments] agrees (start / duration / transition)",
                     abs(n_seg - n_db) < 1e-5 * n_seg and abs(n_seg - n_tr) < 1e-5 * n_seg,
                     f"{n_seg:.3f} {n_db:.3f} {n_tr:.3f}")
            print(f"  T=1e6 {engine}: GPU fwd+bwd+Viterbi {t_gpu:.2f}s")
        seq, par = results["sequential"], results["parallel"]
        for name, a, e in zip(("P_start", "P_end"), par["grads"], seq["grads"]):
            err = abs_err(a, e)
            ck.check(f"T=1e6 parallel {name} within 1e-4 of sequential", err < 1e-4, f"err {err:.2e}")
        same = all(bool(torch.equal(a.cpu(), b.cpu())) for a, b in zip(par["viterbi"][1:], seq["viterbi"][1:]))
        ck.check("T=1e6 parallel Viterbi == sequential Viterbi (labels and starts)", same)
        print(f"  T=1e6: float64 CPU reference forward {exp['t_total']:.1f}s")

        # (K, C, C) transitions at T = 10^6: log Z against float64, the two engines against each other
        inp = make_case(*LONG_KCC_1E6[0], **LONG_KCC_1E6[1])
        exp = jobs["KCC1e6"].result()
        results = {}
        for parallel in (False, True):
            engine = "parallel" if parallel else "sequential"
            t1 = time.time()
            got = run_gpu(inp, dev, viterbi=True, parallel=parallel)
            results[engine] = got
            err = rel_err(got["log_z"], exp["log_z"])
            ck.check(f"{engine} (K, C, C) T=1e6 K=32 C=8 logZ rel < 1e-6", err < 1e-6, f"rel {err:.2e}")
            p_start, p_end, g_tr, g_db = got["grads"]
            ck.check(f"{engine} (K, C, C) T=1e6 gradients finite", all(bool(torch.isfinite(x).all()) for x in got["grads"]))
            last = float(p_end[0, -1].double().sum())
            ck.check(f"{engine} (K, C, C) T=1e6 sum_c P_end(L) = 1", abs(last - 1) < 1e-5, f"{last:.8f}")
            n_seg, n_tr = float(p_start.double().sum()), float(g_tr.double().sum())
            ck.check(f"{engine} (K, C, C) T=1e6 E[#segments] agrees (start / transition)",
                     abs(n_seg - n_tr) < 1e-5 * n_seg, f"{n_seg:.3f} {n_tr:.3f}")
            print(f"  (K, C, C) T=1e6 {engine}: GPU fwd+bwd+Viterbi {time.time() - t1:.2f}s")
        seq, par = results["sequential"], results["parallel"]
        for name, a, e in zip(("P_start", "P_end"), par["grads"], seq["grads"]):
            err = abs_err(a, e)
            ck.check(f"(K, C, C) T=1e6 parallel {name} within 1e-4 of sequential", err < 1e-4, f"err {err:.2e}")
        same = all(bool(torch.equal(a.cpu(), b.cpu())) for a, b in zip(par["viterbi"][1:], seq["viterbi"][1:]))
        ck.check("(K, C, C) T=1e6 parallel Viterbi == sequential Viterbi (labels and starts)", same)
    pool.shutdown()
    print(f"{len(ck.rows) - len(ck.failures)}/{len(ck.rows)} checks passed in {time.time() - t0:.1f}s")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"rows": ck.rows, "failures": ck.failures}, f, indent=1)
    if ck.failures:
        print("FAILED:", *ck.failures, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
