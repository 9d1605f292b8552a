"""CPU probe: how many numbers does a model remember about where a chunk started? (float64, no GPU)

The time-parallel engine starts each chunk from a guess and needs the forward state to forget the
guess up to one constant (a fix-up converges when the rerun's rows differ from the stored ones by
one offset; GPU_NOTES 57 found the gene finder's model does not forget inside giant introns). The
forward is linear in ``exp(state)``: the ring of the last K rows U at position t is
``M(a -> t) exp(ring at a)``. If the rows reachable from any start state span r dimensions after L
positions, r speculative runs combined with nonnegative weights would replace the one guess of
today's scheme (a rank-r chunk state) -- r = 1 is the forgetting that today's scheme relies on.

This probe runs the exact recurrence (the engine's conventions, ``docs/internals.md``: U_0 the
phantom ``LSE_c' Tr`` + ps_0; ``alpha_t = pe_{t-1} + S_t + LSE_k (U_{t-k} - S_{t-k} + D[k-1])``;
``U_t = LSE_c' (alpha_t(c') + Tr[c', c]) + ps_t``; checked against ``semi_crf_streaming_forward``)
from the true ring at a chunk start a and from ``--runs`` perturbed rings (every row of the true
ring plus independent N(0, spread^2) noise per entry, and the fresh start a spec run uses), then
prints, at offsets L after a, the singular values (relative to the largest) of the runs' rings
(each row in its own frame, ``U_r - S_r``; each run's ``exp(. - max)``, unit norm): the numerical rank at 1e-4 / 1e-8 and the distance of
the true ring from the span of the others.

    python benchmarks/probes/make_gene_inputs.py --checkpoint feature_crf.pt --loci 2 --float64 --out g.pt
    python benchmarks/probes/memory_rank.py --inputs g.pt --locus 0 --start 7680 --out rank.json
    python benchmarks/probes/memory_rank.py --random --out rank_random.json   # a random model, same shape

``--classes`` (gene models) tests the remembered part directly: the labels are grouped into classes
(intergenic; the introns of each strand and phase with their tail, end and continuation pieces;
exons), the true ring is split by class (the runs from the parts sum exactly to the true run:
the recurrence is linear in exp(ring)), and each part's run is compared with the run from the
fresh start restricted to the same class. When every part with mass forgets its start up to one
constant, the true state is a nonnegative combination of the fresh class runs, one weight per
class: a chunk state of one number per class.
"""

import argparse
import json
import time

import torch

from torch_semimarkov import semi_crf_streaming_forward

OFFSETS = (120, 240, 480, 960, 1440, 1920, 2880, 3840)


def _lse(x, dim):
    m = x.amax(dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    return (m + torch.log(torch.exp(x - m).sum(dim, keepdim=True))).squeeze(dim)


def run(cum, tr, db, ps, pe, K, ring, t0, t1, record=()):
    """Advance rings (R, K, C) holding U_{t0-K+1} .. U_{t0} (oldest first) to t1; returns the final
    ring, alpha_{t1} (R, C) and ``{t: ring - S}`` (each row in its own frame) at the positions in
    ``record``."""
    kept = {}
    D = db.flip(0)  # D[K-1-j]: duration K-j for ring slot j (slot K-1 = the newest row, duration 1)
    alpha = None
    for t in range(t0 + 1, t1 + 1):
        # S_{t-k} for k = K .. 1 (rows before position 0 are impossible: their slots hold -inf)
        s_rows = cum[torch.arange(t - K, t).clamp(min=0)]
        x = ring - s_rows[None] + D[None]
        alpha = pe[t - 1][None] + cum[t][None] + _lse(x, 1)
        u = _lse(alpha[:, :, None] + tr[None], 1) + ps[t][None] if t < ps.shape[0] else None
        if u is None:
            break
        ring = torch.cat([ring[:, 1:], u[:, None]], 1)
        if t in record:
            # in each row's own frame (U_r - S_r, as phase A reads it): what a row adds to a later
            # position's sum no longer grows with the row's position
            kept[t] = ring - cum[torch.arange(t - K + 1, t + 1).clamp(min=0)][None]
    return ring, alpha, kept


def initial_ring(tr, ps, K, R=1):
    """The ring at position 0: U_0 = LSE_c' Tr[c', c] + ps_0, the rows before it impossible."""
    C = tr.shape[0]
    ring = torch.full((R, K, C), float("-inf"), dtype=tr.dtype)
    lse = torch.logsumexp(tr, 0)
    ring[:, -1] = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse)) + ps[0]
    return ring


def spectrum(rings):
    """Singular values (relative) of the runs' unit-norm exp(ring - max), and each run's relative
    distance from the span of the others (least squares)."""
    X = rings.reshape(rings.shape[0], -1)
    X = torch.exp(X - X.amax(1, keepdim=True))
    X = torch.nan_to_num(X, nan=0.0)
    X = X / X.norm(dim=1, keepdim=True)
    s = torch.linalg.svdvals(X)
    s = (s / s[0]).tolist()
    A, y = X[1:].T, X[0]
    coef = torch.linalg.lstsq(A, y).solution
    resid = float((A @ coef - y).norm())
    return s, resid


def label_class(name: str) -> str:
    """The class of a GeneGrammar label name: intergenic, ``<strand>intron <phase>``, or exon."""
    if name == "N" or name.endswith("cont[N]"):
        return "intergenic"
    if "intron" in name:
        return name[0] + "intron " + name[name.index("intron") + 7 if "(" in name else -2]
    return "exon"


def offset_spread(x, y, window=30.0):
    """max - min of x - y over the entries where x is within ``window`` nats of its maximum (the
    entries that matter); 0 when y is x plus one constant there, inf where y is impossible."""
    sig = x > x.max() - window
    d = (x - y)[sig]
    return float(d.max() - d.min()) if torch.isfinite(d).all() else float("inf")


def classes_report(cum, tr, db, ps, pe, K, ring_a, a, end, labels):
    """Split the true ring at a by label class; per class, the run from its part against the run
    from the fresh start restricted to that class (module docstring)."""
    names = sorted({label_class(n) for n in labels})
    cls = [label_class(n) for n in labels]
    lse = torch.logsumexp(tr, 0)
    fresh = torch.full_like(ring_a, float("-inf"))
    fresh[:, -1] = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse)) + ps[a]
    parts, guesses = [], []
    for k in names:
        keep = torch.tensor([c == k for c in cls])
        parts.append(torch.where(keep, ring_a, torch.full_like(ring_a, float("-inf"))))
        guesses.append(torch.where(keep, fresh, torch.full_like(fresh, float("-inf"))))
    W = ring_a[0] - cum[torch.arange(a - K + 1, a + 1).clamp(min=0)]
    mass = torch.logsumexp(torch.stack([torch.where(torch.tensor([c == k for c in cls]), W, torch.full_like(W, float("-inf"))).flatten()
                                        for k in names]), 1)
    share = torch.softmax(mass, 0).tolist()
    targets = [a + o for o in OFFSETS]
    _, _, kept = run(cum, tr, db, ps, pe, K, torch.cat(parts + guesses, 0), a, end, record=set(targets))
    out = {"classes": names, "mass_share_at_start": dict(zip(names, share)), "rows": []}
    print("mass share at the start: " + ", ".join(f"{k} {s:.1e}" for k, s in zip(names, share)), flush=True)
    n = len(names)
    for o, t in zip(OFFSETS, targets):
        sp = [offset_spread(kept[t][i], kept[t][n + i]) if share[i] > 1e-12 else None for i in range(n)]
        # the true run against the sum of the class parts (exact by linearity: a check)
        out["rows"].append({"offset": o, "spread": dict(zip(names, sp))})
        print(f"a + {o:5d}: class part vs fresh class start, spread of the offset (nats): "
              + ", ".join(f"{k} {s:.1e}" for k, s in zip(names, sp) if s is not None), flush=True)
    return out


def random_inputs(T, K, C, seed):
    g = torch.Generator().manual_seed(seed)
    em = torch.randn(1, T, C, generator=g, dtype=torch.float64)
    cum = torch.cat([torch.zeros(1, 1, C, dtype=torch.float64), em.cumsum(1)], 1)
    return dict(cum_scores=cum, transition=torch.randn(C, C, generator=g, dtype=torch.float64),
                duration_bias=torch.randn(K, C, generator=g, dtype=torch.float64) - 0.01 * torch.arange(K)[:, None],
                proj_start=torch.zeros(1, T, C, dtype=torch.float64), proj_end=torch.zeros(1, T, C, dtype=torch.float64),
                lengths=torch.tensor([T]), K=K, names=["random"], model=f"random (seed {seed})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", default=None, help="a float64 file of make_gene_inputs.py")
    ap.add_argument("--random", action="store_true", help="a random model of the gene model's shape instead")
    ap.add_argument("--locus", type=int, default=0)
    ap.add_argument("--start", type=int, default=7680, help="the chunk start a")
    ap.add_argument("--runs", type=int, default=24, help="perturbed starts")
    ap.add_argument("--spread", type=float, default=10.0, help="std (nats) of the perturbation")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--classes", action="store_true", help="the class decomposition test (gene models)")
    ap.add_argument("--check", type=int, default=600, help="positions of the check against the engine")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    g = random_inputs(args.start + OFFSETS[-1] + 1, 960, 59, args.seed) if args.random else torch.load(args.inputs)
    b, K = (0 if args.random else args.locus), int(g["K"])
    cum, tr, db, ps, pe = (g[k][b].double() if g[k].dim() == 3 else g[k].double()
                           for k in ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end"))
    a, end = args.start, args.start + OFFSETS[-1]
    if end > int(g["lengths"][b]):
        raise SystemExit(f"--start {a}: the locus has {int(g['lengths'][b])} positions, fewer than a + {OFFSETS[-1]}")
    # the recurrence against the engine on a prefix
    n = args.check
    _, alpha, _ = run(cum, tr, db, ps, pe, K, initial_ring(tr, ps, K), 0, n)
    ref = semi_crf_streaming_forward(cum[None, :n + 1], tr, db, torch.tensor([n]), K, proj_start=ps[None, :n],
                                     proj_end=pe[None, :n], backend="numba", validate=False)
    mine = torch.logsumexp(alpha[0], 0)
    print(f"check: log Z of the first {n} positions {float(mine):.6f}, engine {float(ref[0]):.6f}", flush=True)
    assert abs(float(mine - ref[0])) < 1e-6 * max(1.0, abs(float(ref[0]))), (float(mine), float(ref[0]))
    t0 = time.perf_counter()
    ring_a, _, _ = run(cum, tr, db, ps, pe, K, initial_ring(tr, ps, K), 0, a)
    if args.classes:
        rep_ = classes_report(cum, tr, db, ps, pe, K, ring_a, a, end, g["labels"])
        json.dump({"inputs": args.inputs, "model": g.get("model"), "locus": g["names"][b], "K": K, "start": a,
                   "seconds": time.perf_counter() - t0, **rep_}, open(args.out, "w"), indent=1)
        return
    gen = torch.Generator().manual_seed(args.seed)
    noise = torch.randn((args.runs,) + ring_a.shape[1:], generator=gen, dtype=torch.float64) * args.spread
    fresh = torch.full_like(ring_a, float("-inf"))
    lse = torch.logsumexp(tr, 0)
    fresh[:, -1] = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse)) + ps[a]
    rings = torch.cat([ring_a, ring_a + noise, fresh], 0)  # run 0: the truth
    targets = [a + o for o in OFFSETS]
    _, _, kept = run(cum, tr, db, ps, pe, K, rings, a, end, record=set(targets))
    rows = []
    for o, t in zip(OFFSETS, targets):
        s, resid = spectrum(kept[t])
        r4 = sum(x > 1e-4 for x in s)
        r8 = sum(x > 1e-8 for x in s)
        rows.append({"offset": o, "singular_values": s, "rank_1e-4": r4, "rank_1e-8": r8, "true_residual": resid})
        print(f"a + {o:5d}: rank {r4} (1e-4) / {r8} (1e-8), singular values "
              + " ".join(f"{x:.1e}" for x in s[:8]) + f"; the true ring off the others' span by {resid:.1e}",
              flush=True)
    # the rank-r scheme's question: weights fitted at one offset (least squares of the true ring on
    # the other runs' rings, one common scale per offset) still give the true ring later?
    fits = []
    for o1, t1 in zip(OFFSETS, targets):
        if o1 < 480:
            continue
        X = {t: kept[t].reshape(kept[t].shape[0], -1) for t in targets if t >= t1}
        m = {t: x.max() for t, x in X.items()}
        E = {t: torch.nan_to_num(torch.exp(x - m[t]), nan=0.0) for t, x in X.items()}
        coef = torch.linalg.lstsq(E[t1][1:].T, E[t1][0]).solution
        errs = []
        for t in X:
            pred, true = E[t][1:].T @ coef, E[t][0]
            sig = true > 1e-10 * true.max()
            ratio = pred[sig] / true[sig]
            errs.append(float((ratio - 1).abs().max()) if (ratio > 0).all() else float("inf"))
        fits.append({"fit_offset": o1, "later_offsets": [o for o, t in zip(OFFSETS, targets) if t >= t1],
                     "max_relative_error": errs})
        print(f"weights fitted at a + {o1}: largest relative error of the true ring's entries (within 1e-10 of "
              f"its largest) at a + {fits[-1]['later_offsets']}: " + " ".join(f"{e:.1e}" for e in errs), flush=True)
    json.dump({"inputs": "random" if args.random else args.inputs, "fits": fits, "model": g.get("model"),
               "locus": g["names"][b], "K": K, "start": a, "runs": args.runs, "spread": args.spread,
               "seconds": time.perf_counter() - t0, "rows": rows}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
