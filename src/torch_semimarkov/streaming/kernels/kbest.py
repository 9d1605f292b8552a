"""The k smallest-deficit in-edges of every node, for the engine's k-best lists
(``streaming/kbest.py``): one program per (sequence, block of positions), no recurrence.

For node (t, c) an in-edge is the segment ``[t - k, t)`` of label c after the j-th best
predecessor label of position ``t - k`` (``V[t - k, j, c]``, from the max-semiring forward), with
deficit ``alpha(t, c) - (W[t - k, j, c] + D[k - 1, c] + E[t, c])``, where ``W`` holds ``V`` minus
``S_{t-k}`` plus the start projection and ``E`` holds ``S_t`` plus the end projection. The
backpointer edge is left out. Selection by rounds: round r takes the smallest (deficit, index) pair
above round r-1's (the index ``(k - 1) * KK + j`` breaks ties), so nothing is stored but the
previous pick.
"""

from __future__ import annotations

import torch

from .common import HAS_TRITON, next_pow2, tl, triton

if HAS_TRITON:

    @triton.jit
    def _in_edges_kernel(
        w_ptr,  # (B, T+1, KK, C) float64: V - S_s + ps_s (-inf: no such predecessor)
        vc_ptr,  # (B, T+1, KK, C) int32: the predecessor label of V (C: the sequence start)
        db_ptr,  # (K, C) float64 duration bias (-inf: forbidden)
        a_ptr,  # (B, T+1, C) float64 alpha (-inf: unreachable)
        e_ptr,  # (B, T+1, C) float64: S_t + pe_{t-1}
        bp_ptr,  # (B, T+1, C) int32 packed backpointers k << 16 | c_prev
        len_ptr,  # (B,) int64
        d_ptr,  # (B, T+1, C, NSEL) float64 out: deficits, +inf where fewer edges exist
        k_ptr,  # (B, T+1, C, NSEL) int64 out: durations
        p_ptr,  # (B, T+1, C, NSEL) int64 out: predecessor labels
        T, C, K,
        KK: tl.constexpr,
        NSEL: tl.constexpr,
        BT: tl.constexpr,
        K_PAD: tl.constexpr,
        C_PAD: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        t_lo = tl.program_id(1) * BT + 1
        L = tl.load(len_ptr + b)
        ok_k = tl.arange(0, K_PAD)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        inf = float("inf")
        big = 1 << 30
        for t in range(t_lo, tl.minimum(t_lo + BT, T + 1)):
            row = (b * (T + 1) + t) * C
            a = tl.load(a_ptr + row + oc, mask=mc, other=-inf)
            e = tl.load(e_ptr + row + oc, mask=mc, other=0.0)
            packed = tl.load(bp_ptr + row + oc, mask=mc, other=0)
            bk = packed >> 16
            bc = packed & 65535
            live = (a > -inf) & mc & (t <= L)
            k = ok_k + 1
            s = t - k
            vk = (k <= K) & (s >= 0)
            m2 = vk[:, None] & mc[None, :]
            d = tl.load(db_ptr + (k[:, None] - 1) * C + oc[None, :], mask=m2, other=-inf)
            prev_d = tl.full([C_PAD], -inf, tl.float64)
            prev_i = tl.full([C_PAD], -1, tl.int32)
            out = ((b * (T + 1) + t) * C + oc) * NSEL
            for r in tl.static_range(NSEL):
                best_d = tl.full([C_PAD], inf, tl.float64)
                best_i = tl.full([C_PAD], big, tl.int32)
                for j in tl.static_range(KK):
                    base = ((b * (T + 1) + s) * KK + j) * C
                    w = tl.load(w_ptr + base[:, None] + oc[None, :], mask=m2, other=-inf)
                    pc = tl.load(vc_ptr + base[:, None] + oc[None, :], mask=m2, other=-1)
                    dl = a[None, :] - (w + d + e[None, :])
                    first_j = (ok_k * 0 + j) == 0
                    is_bp = (k[:, None] == bk[None, :]) & (((s[:, None] > 0) & (pc == bc[None, :]))
                                                          | ((s[:, None] == 0) & first_j[:, None]))
                    dl = tl.where(m2 & (w > -inf) & (d > -inf) & ~is_bp & live[None, :], dl, inf)
                    idx = ((k - 1) * KK + j).to(tl.int32)[:, None] + tl.zeros([K_PAD, C_PAD], tl.int32)
                    above = (dl > prev_d[None, :]) | ((dl == prev_d[None, :]) & (idx > prev_i[None, :]))
                    dl = tl.where(above, dl, inf)
                    idx = tl.where(above, idx, big)
                    m = tl.min(dl, 0)
                    mi = tl.min(tl.where(dl == m[None, :], idx, big), 0)
                    better = (m < best_d) | ((m == best_d) & (mi < best_i))
                    best_d = tl.where(better, m, best_d)
                    best_i = tl.where(better, mi, best_i)
                found = best_d < inf
                dur = best_i // KK + 1
                jj = best_i % KK
                src = t - dur
                pl = tl.load(vc_ptr + ((b * (T + 1) + src) * KK + jj) * C + oc, mask=mc & found, other=0)
                tl.store(d_ptr + out + r, tl.where(found, best_d, inf), mask=mc)
                tl.store(k_ptr + out + r, tl.where(found, dur, 0).to(tl.int64), mask=mc)
                tl.store(p_ptr + out + r, pl.to(tl.int64), mask=mc)
                prev_d = best_d
                prev_i = best_i


def in_edges(W, Vc, D, alpha, E, bp, lengths, K: int, k: int):
    """``(delta, dur, prev)`` (B, T+1, C, k) of :func:`_in_edges_kernel` (row 0: +inf / 0)."""
    B, T1, KK, C = W.shape
    T = T1 - 1
    dev = W.device
    delta = torch.full((B, T1, C, k), float("inf"), dtype=torch.float64, device=dev)
    dur = torch.zeros((B, T1, C, k), dtype=torch.int64, device=dev)
    prev = torch.zeros((B, T1, C, k), dtype=torch.int64, device=dev)
    if T == 0:
        return delta, dur, prev
    BT = 16
    K_eff = max(1, min(K, T))
    _in_edges_kernel[(B, -(-T // BT))](
        w_ptr=W.contiguous(), vc_ptr=Vc.to(torch.int32).contiguous(), db_ptr=D[:K_eff].contiguous(),
        a_ptr=alpha.contiguous(), e_ptr=E.contiguous(), bp_ptr=bp.contiguous(), len_ptr=lengths,
        d_ptr=delta, k_ptr=dur, p_ptr=prev, T=T, C=C, K=K_eff, KK=KK, NSEL=k, BT=BT,
        K_PAD=max(2, next_pow2(K_eff)), C_PAD=max(2, next_pow2(C)), num_warps=4)
    return delta, dur, prev
