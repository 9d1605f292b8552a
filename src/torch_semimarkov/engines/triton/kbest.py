"""The k smallest-deficit in-edges of every node, for the engine's k-best lists
(``engines/triton/topk.py``): two kernels, parallel over positions (no recurrence).

For node (t, c) an in-edge is the segment ``[t - k, t)`` of label c after the j-th best
predecessor label of position ``s = t - k``: ``V[s, j, c]``, the j-th largest
``alpha(s, c') + Tr[c', c]`` over c'. Its deficit is ``alpha(t, c) - (W[s, j, c] + D[k - 1, c] +
E[t, c])`` with ``W = V - S_s + ps_s`` and ``E = S_t + pe_{t-1}``; the backpointer edge is left out.

1. ``_top_pred_kernel`` writes ``W`` and the predecessor labels for KK = k + 1 ranks j (one more
   than k: the backpointer edge may be among them): a (positions, C', C) tile per program, KK
   rounds of "the largest remaining".
2. ``_in_edges_kernel`` keeps, for a block of nodes, the k smallest deficits seen so far in a
   (positions, labels, k) buffer in registers. It reads the candidates duration by duration, and
   within a duration in order of j: the deficits ascend in j (``V`` descends), so a duration's
   list is left at its first candidate that does not enter the buffer. Each node reads a few
   candidates per duration, not all K·KK.

The in-edges kernel keeps "the n smallest of a stream" with :func:`_keep_smallest` (an entering
candidate replaces the buffer's worst entry) and emits them in order with :func:`_pop_smallest`.
Ties go to the smaller index (``c'`` for ``V``; ``(k - 1)·KK + j`` for the in-edges, the order in
which the candidates are seen), as the stable sorts of the PyTorch blocks in ``engines/triton/topk.py``.
Positions are the first grid axis (up to 2^31 - 1 programs; the second allows 65535).
"""

from __future__ import annotations

import torch

from torch_semimarkov.engines.triton.common import HAS_TRITON, tl, triton
from torch_semimarkov.engines.triton import plan as plan_mod

if HAS_TRITON:

    @triton.jit
    def _keep_smallest(buf_d, buf_i, worst_d, worst_i, cand, cidx):
        """Enter ``cand`` (P, C) with index ``cidx`` (P, C) into the buffer of the n smallest
        (P, C, N) where it is smaller than the buffer's worst (``worst_d`` / the worst's index
        ``worst_i``), replacing the worst. Unused padding slots hold -inf (never the worst).
        Returns the buffer, its new worst and where ``cand`` entered."""
        better = cand < worst_d
        if tl.max(tl.max(better.to(tl.int32), 1), 0) > 0:
            hit = (buf_i == worst_i[:, :, None]) & better[:, :, None]
            buf_d = tl.where(hit, cand[:, :, None], buf_d)
            buf_i = tl.where(hit, cidx[:, :, None], buf_i)
            worst_d = tl.max(buf_d, 2)
            worst_i = tl.max(tl.where(buf_d == worst_d[:, :, None], buf_i, -(1 << 30)), 2)
        return buf_d, buf_i, worst_d, worst_i, better

    @triton.jit
    def _empty_buffer(P: tl.constexpr, C_PAD: tl.constexpr, N_PAD: tl.constexpr, N):
        """A buffer of N slots (+inf: empty; distinct negative indices) padded to N_PAD (-inf)."""
        on = tl.arange(0, N_PAD)
        real = (on < N)[None, None, :]
        zero = tl.zeros([P, C_PAD, N_PAD], tl.float64)
        buf_d = tl.where(real, zero + float("inf"), zero - float("inf"))
        buf_i = tl.where(real, -2 - on[None, None, :], -(1 << 29) - on[None, None, :]) \
            + tl.zeros([P, C_PAD, N_PAD], tl.int32)
        worst_d = tl.zeros([P, C_PAD], tl.float64) + float("inf")
        worst_i = tl.zeros([P, C_PAD], tl.int32) - 2
        return buf_d, buf_i, worst_d, worst_i

    @triton.jit
    def _pop_smallest(buf_d, buf_i):
        """The smallest (value, index) of the buffer, ties by index, and the buffer without it
        (+inf where the buffer had fewer entries)."""
        d = tl.where(buf_d > -float("inf"), buf_d, float("inf"))
        m = tl.min(d, 2)
        mi = tl.min(tl.where(d == m[:, :, None], buf_i, 1 << 30), 2)
        taken = buf_i == mi[:, :, None]
        buf_d = tl.where(taken, float("inf"), buf_d)
        buf_i = tl.where(taken, 1 << 30, buf_i)
        return m, mi, buf_d, buf_i

    @triton.jit
    def _top_pred_kernel(
        a_ptr,  # (B, T+1, C) float64 alpha (-inf: unreachable)
        tr_ptr,  # (C, C) float64 transition (-inf: forbidden)
        s_ptr,  # (B, T+1, C) float64 cumulative scores
        ps_ptr,  # (B, T, C) float64 start projection (HAS_PS)
        w_ptr,  # (B, T+1, NV, C) float64 out: V - S_s + ps_s (-inf: no such predecessor)
        vc_ptr,  # (B, T+1, NV, C) int32 out: the predecessor label of V
        T, C,
        NV: tl.constexpr,
        P: tl.constexpr,
        C_PAD: tl.constexpr,
        HAS_PS: tl.constexpr,
    ):
        b = tl.program_id(1).to(tl.int64)
        s = tl.program_id(0) * P + tl.arange(0, P)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        m2 = (s <= T)[:, None] & mc[None, :]
        ptr = (b * (T + 1) + s[:, None]) * C + oc[None, :]
        a = tl.load(a_ptr + ptr, mask=m2, other=-float("inf"))
        tr = tl.load(tr_ptr + oc[:, None] * C + oc[None, :], mask=mc[:, None] & mc[None, :], other=-float("inf"))
        x = a[:, :, None] + tr[None, :, :]  # (P, C', C)
        idx = oc[None, :, None] + tl.zeros([P, C_PAD, C_PAD], tl.int32)
        shift = -tl.load(s_ptr + ptr, mask=m2, other=0.0)
        if HAS_PS:
            shift += tl.load(ps_ptr + (b * T + s[:, None]) * C + oc[None, :], mask=m2 & (s < T)[:, None], other=0.0)
        out = ((b * (T + 1) + s[:, None]) * NV) * C + oc[None, :]
        # rank j: the largest remaining, ties to the smallest c' (the stable sort's order)
        for j in range(NV):
            m = tl.max(x, 1)
            mi = tl.min(tl.where(x == m[:, None, :], idx, 1 << 30), 1)
            found = m > -float("inf")
            tl.store(w_ptr + out + j * C, tl.where(found, m + shift, -float("inf")), mask=m2)
            tl.store(vc_ptr + out + j * C, tl.where(found, mi, 0), mask=m2)
            x = tl.where(idx == mi[:, None, :], -float("inf"), x)

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
        N_PAD: tl.constexpr,
        P: tl.constexpr,
        C_PAD: tl.constexpr,
    ):
        b = tl.program_id(1).to(tl.int64)
        t = tl.program_id(0) * P + 1 + tl.arange(0, P)
        L = tl.load(len_ptr + b)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        inf = float("inf")
        m2 = (t <= L)[:, None] & mc[None, :]
        row = (b * (T + 1) + t) * C
        ptr = row[:, None] + oc[None, :]
        a = tl.load(a_ptr + ptr, mask=m2, other=-inf)
        e = tl.load(e_ptr + ptr, mask=m2, other=0.0)
        packed = tl.load(bp_ptr + ptr, mask=m2, other=0)
        bk = packed >> 16
        bc = packed & 65535
        live = m2 & (a > -inf)
        buf_d, buf_i, worst_d, worst_i = _empty_buffer(P, C_PAD, N_PAD, NSEL)
        for k in range(1, K + 1):
            s = t - k
            d = tl.load(db_ptr + (k - 1) * C + oc, mask=mc, other=-inf)
            act = live & (s >= 0)[:, None] & (d > -inf)[None, :]
            j = k * 0
            # the list of duration k: until no node's next candidate enters its buffer
            while (j < KK) & (tl.max(tl.max(act.to(tl.int32), 1), 0) > 0):
                src = ((b * (T + 1) + s) * KK + j) * C
                w = tl.load(w_ptr + src[:, None] + oc[None, :], mask=act, other=-inf)
                pc = tl.load(vc_ptr + src[:, None] + oc[None, :], mask=act, other=-1)
                # at s = 0 the single edge (j = 0) is the backpointer edge of any predecessor
                is_bp = (bk == k) & (((s == 0)[:, None] & (pc * 0 + j == 0)) | ((s > 0)[:, None] & (pc == bc)))
                ok = act & (w > -inf) & ~is_bp
                cand = tl.where(ok, a - (w + d[None, :] + e), inf)
                buf_d, buf_i, worst_d, worst_i, better = _keep_smallest(
                    buf_d, buf_i, worst_d, worst_i, cand, pc * 0 + (k - 1) * KK + j)
                act = act & (w > -inf) & (better | is_bp)
                j += 1
        out = (row[:, None] + oc[None, :]) * NSEL
        for r in range(NSEL):
            m, mi, buf_d, buf_i = _pop_smallest(buf_d, buf_i)
            found = m2 & (m < inf)
            dur = mi // KK + 1
            pl = tl.load(vc_ptr + ((b * (T + 1) + t[:, None] - dur) * KK + mi % KK) * C + oc[None, :],
                         mask=found, other=0)
            tl.store(d_ptr + out + r, tl.where(found, m, inf), mask=m2)
            tl.store(k_ptr + out + r, tl.where(found, dur, 0).to(tl.int64), mask=m2)
            tl.store(p_ptr + out + r, pl.to(tl.int64), mask=m2)


def in_edges(alpha, S, ps, pe, tr, D, bp, lengths, K: int, k: int):
    """``(delta, dur, prev)`` (B, T+1, C, k) of the in-edges (row 0: +inf / 0), from alpha
    (B, T+1, C), the cumulative scores S (B, T+1, C), the projections (B, T, C) or None, the
    transition (C, C) and duration bias (K, C) (float64, -inf forbidden), the packed backpointers
    (B, T+1, C) int32 and the lengths (B,)."""
    B, T1, C = alpha.shape
    T = T1 - 1
    dev = alpha.device
    delta = torch.full((B, T1, C, k), float("inf"), dtype=torch.float64, device=dev)
    dur = torch.zeros((B, T1, C, k), dtype=torch.int64, device=dev)
    prev = torch.zeros((B, T1, C, k), dtype=torch.int64, device=dev)
    if T == 0:
        return delta, dur, prev
    kk = k + 1
    C_PAD = plan_mod.label_pad(C)
    W = torch.empty((B, T1, kk, C), dtype=torch.float64, device=dev)
    Vc = torch.empty((B, T1, kk, C), dtype=torch.int32, device=dev)
    alpha, S = alpha.contiguous(), S.contiguous()
    P = plan_mod.kbest_rows(C_PAD, C_PAD)
    _top_pred_kernel[(-(-T1 // P), B)](
        a_ptr=alpha, tr_ptr=tr.contiguous(), s_ptr=S, ps_ptr=S if ps is None else ps.contiguous(),
        w_ptr=W, vc_ptr=Vc, T=T, C=C, NV=kk, P=P, C_PAD=C_PAD, HAS_PS=ps is not None,
        num_warps=plan_mod.KBEST_WARPS)
    # position 0: the first segment's single edge, logsumexp_{c'} Tr[c', c], from the start (C)
    W[:, 0] = -float("inf")
    W[:, 0, 0] = torch.logsumexp(tr, 0)[None] - S[:, 0] + (0.0 if ps is None else ps[:, 0])
    Vc[:, 0] = C
    E = S.clone()
    if pe is not None:
        E[:, 1:] += pe
    K_eff = max(1, min(K, T))
    N_PAD = plan_mod.label_pad(k)
    P = plan_mod.kbest_rows(C_PAD, N_PAD, plan_mod.IN_EDGES_BUFFER)
    _in_edges_kernel[(-(-T // P), B)](
        w_ptr=W, vc_ptr=Vc, db_ptr=D[:K_eff].contiguous(), a_ptr=alpha, e_ptr=E, bp_ptr=bp.contiguous(),
        len_ptr=lengths, d_ptr=delta, k_ptr=dur, p_ptr=prev, T=T, C=C, K=K_eff, KK=kk, NSEL=k, N_PAD=N_PAD,
        P=P, C_PAD=C_PAD, num_warps=plan_mod.IN_EDGES_WARPS)
    return delta, dur, prev
