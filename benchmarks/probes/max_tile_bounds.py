"""CPU probe (float64): how many of the blocked engine's max-semiring phase-A tiles could be skipped
by a bound, exactly.

Phase A of a block (positions q0 + i, i = 1 .. BT) takes, per label c, the largest of
``x[i, rho, c] = V[rho, c] + D[i + rho - 1, c]`` over the rows older than the block (rho = 0 .. K-1,
row r = q0 - rho, ``V = U_r - S_r``; the block's own S_{q0+i} is added later), tile by tile of RB
rows in increasing rho, CB labels at a time, keeping the running maximum ``run_m[i, c]`` and its
smallest duration. A tile whose bound ``max_rho (V[rho, c] + max_{i} D[i + rho - 1, c])`` is at most
``run_m[i, c]`` for every position and label of the tile cannot raise any maximum, nor win a tie
(its durations are longer than every earlier tile's): skipping it leaves every value and argmax as
they are. This probe runs the exact max recurrence in float64 and counts, over the blocks after the
first K positions, the tiles such a test would skip, for the benchmarks' random models and, with
``--gene FILE`` (``probes/make_gene_inputs.py --float64``), a gene model.

    python benchmarks/probes/max_tile_bounds.py [--T 4000] [--gene gene_inputs.pt] [--group 16] [--out results.json]
"""
import argparse
import json
import math

import torch


def bench_model(T, K, C, seed=0, kind="bench"):
    g = torch.Generator().manual_seed(seed)
    if kind == "bench":  # bench_parallel.make_inputs / bench_genomics
        x = torch.randn(1, T, C, generator=g, dtype=torch.float64)
        x = x - x.mean(1, keepdim=True)
        tr = 0.1 * torch.randn(C, C, generator=g, dtype=torch.float64)
        db = 0.1 * torch.randn(K, C, generator=g, dtype=torch.float64)
    else:  # probes/ab_common.random_model
        x = torch.randn(1, T, C, generator=g, dtype=torch.float64) * 0.5
        tr = torch.randn(C, C, generator=g, dtype=torch.float64) * 0.3
        db = torch.randn(K, C, generator=g, dtype=torch.float64) * 0.3
    cum = torch.nn.functional.pad(x.cumsum(1), (0, 0, 1, 0))[0]
    return cum, tr, db, None, None


def max_rows(cum, tr, db, ps, pe, T, K, semiring="max"):
    """U_s (s = 0 .. T-1) of the max (or log) recurrence (u_0 = LSE_c' Tr, the engine's phantom start)."""
    C = cum.shape[1]
    U = torch.full((T, C), -math.inf, dtype=torch.float64)
    alpha = torch.zeros(C, dtype=torch.float64)
    red = (lambda x: x.max(0).values) if semiring == "max" else (lambda x: torch.logsumexp(x, 0))
    for t in range(1, T + 1):
        s = t - 1
        u = torch.logsumexp(tr, 0) if s == 0 else red(alpha[:, None] + tr)
        U[s] = u + (ps[s] if ps is not None else 0.0)
        k = torch.arange(1, min(t, K) + 1)
        x = U[t - k] + db[k - 1] + cum[t] - cum[t - k]
        alpha = red(x) + (pe[s] if pe is not None else 0.0)
    return U


def skipped(U, cum, db, T, K, BT, RB, CB, start, margin=0.0, group=0):
    """(skippable tiles, tiles) over the blocks q0 = start, start + BT, ... < T - BT.

    ``group`` > 0: the cheaper bound a kernel could test without loading a tile's rows: per label
    the largest V of each aligned group of ``group`` positions (kept as the rows are written), the
    largest over the groups a tile's rows touch, plus the largest duration bias any of its rows
    meets (rho + 1 .. rho + RB - 1 + BT)."""
    C = U.shape[1]
    n_skip = n_all = 0
    V_all = U - cum[:T]  # V[r] = U_r - S_r
    nt = -(-K // RB)
    ii = torch.arange(1, BT + 1)
    for q0 in range(start, T - BT, BT):
        rho = torch.arange(K)
        r = q0 - rho
        V = torch.where((r >= 0)[:, None], V_all[r.clamp(min=0)], torch.tensor(-math.inf, dtype=torch.float64))
        kk = ii[:, None] + rho[None, :]  # (BT, K) durations
        ok = kk <= K
        x = V[None, :, :] + torch.where(ok[:, :, None], db[(kk - 1).clamp(max=K - 1)], torch.tensor(-math.inf,
                                                                                                     dtype=torch.float64))
        pad = nt * RB - K
        x = torch.nn.functional.pad(x, (0, 0, 0, pad), value=-math.inf).view(BT, nt, RB, C)
        tile_max = x.max(2).values  # (BT, nt, C)
        run_before = torch.cat([torch.full((BT, 1, C), -math.inf, dtype=torch.float64),
                                tile_max.cummax(1).values[:, :-1]], 1)
        # the kernel's bound (blocked._tile_exact): per row, the largest bias of the durations
        # rho + 1 .. rho + BT it meets (parallel.max_bound_table), then the largest over the tile
        dpad = torch.nn.functional.pad(db, (0, 0, 0, BT), value=-math.inf)
        wd = dpad.unfold(0, BT, 1)[:K].amax(-1)  # (K, C): durations rho + 1 .. rho + BT
        rowb = torch.nn.functional.pad(V + wd, (0, 0, 0, pad), value=-math.inf).view(nt, RB, C).max(1).values
        if group:
            # per aligned group of positions the largest V; a tile takes its groups' maxima
            ng = -(-T // group)
            Vg = torch.nn.functional.pad(V_all, (0, 0, 0, ng * group - T), value=-math.inf).view(ng, group, C)
            Vg = Vg.max(1).values  # (ng, C)
            wt = torch.nn.functional.pad(wd, (0, 0, 0, pad), value=-math.inf).view(nt, RB, C).max(1).values
            rowb = torch.full((nt, C), -math.inf, dtype=torch.float64)
            for t in range(nt):
                hi_r, lo_r = q0 - t * RB, q0 - min(t * RB + RB - 1, K - 1)  # rows of the tile
                if hi_r < 0:
                    continue
                g0, g1 = max(lo_r, 0) // group, hi_r // group
                rowb[t] = Vg[g0:g1 + 1].max(0).values + wt[t]
        fine = (rowb[None] <= run_before - margin) | torch.isinf(rowb)[None]  # (BT, nt, C)
        for c0 in range(0, C, CB):
            s = fine[:, :, c0:c0 + CB].all(2).all(0)  # (nt,)
            n_skip += int(s.sum())
            n_all += nt
    return n_skip, n_all


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=4000)
    ap.add_argument("--K", type=int, default=960)
    ap.add_argument("--C", type=int, default=47)
    ap.add_argument("--tiles", default="16,32,16", help="BT,RB,CB of Viterbi's phase A (plan.MAX_TILE)")
    ap.add_argument("--gene", default=None)
    ap.add_argument("--locus", type=int, default=0)
    ap.add_argument("--semiring", default="max", help="max, or log: a tile counts where its bound is at least "
                    "--margin below the running maximum (its terms then add less than float32 resolves)")
    ap.add_argument("--margin", type=float, default=0.0)
    ap.add_argument("--group", type=int, default=0, help="the cheaper bound of aligned position groups (skipped())")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    BT, RB, CB = (int(x) for x in a.tiles.split(","))
    models = {"bench": bench_model(a.T, a.K, a.C, kind="bench"), "ab_common": bench_model(a.T, a.K, a.C, kind="ab")}
    K_of = {"bench": a.K, "ab_common": a.K}
    if a.gene:
        g = torch.load(a.gene)
        i = a.locus
        L = int(g["lengths"][i])
        T = min(a.T, L)
        f = lambda name: g[name][i].double() if g[name] is not None else None  # noqa: E731
        models["gene"] = (f("cum_scores"), g["transition"].double(), g["duration_bias"].double(), f("proj_start"),
                          f("proj_end"))
        K_of["gene"] = int(g["K"])
    out = {"tiles": [BT, RB, CB], "T": a.T, "semiring": a.semiring, "margin": a.margin, "group": a.group,
           "results": {}}
    for name, (cum, tr, db, ps, pe) in models.items():
        K = K_of[name]
        T = min(a.T, cum.shape[0] - 1)
        U = max_rows(cum, tr, db, ps, pe, T, K, a.semiring)
        n_skip, n_all = skipped(U, cum, db, T, K, BT, RB, CB, start=K, margin=a.margin, group=a.group)
        out["results"][name] = {"K": K, "C": cum.shape[1], "T": T, "skippable": n_skip, "tiles": n_all,
                                "fraction": n_skip / max(n_all, 1)}
        print(name, out["results"][name], flush=True)
    if a.out:
        json.dump(out, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
