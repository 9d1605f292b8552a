"""Compiled CPU kernels (numba) for a static (C, C) transition: the factored recurrence.

Per sequence, in float64, following ALGORITHM.md §2-§4 (``docs/internals.md`` §8 explains the
scaled rings of :mod:`.common`):

* forward: ``u_s = lse_{c'}(alpha_s(c') + Tr[c', c])`` as a (C, C) matrix-vector product on
  ``exp(alpha_s - max)``; ``V_s = u_s + ps_s - S_s`` enters a scaled ring; ``alpha_{s+1}`` is the
  window sum over the last K ring rows weighted by ``exp(D)`` (K·C multiply-adds, no exps);
* backward: the same for ``v_s`` over a ring of ``Y_t = S_t + pe_{t-1} + beta_t``, recomputing
  alpha/u interval by interval from the forward's checkpoints. The marginals reuse the window's
  terms: ``P_seg(s, k, c) = P_start(s, c) · term_k(c) / sum_k term_k(c)`` and
  ``P_trans(s, c', c) = P_start(s, c) · exp(alpha_s(c') - max) · eTr[c', c] / linu_s(c)``, so the
  duration and transition gradients cost multiply-adds, not exponentials;
* Viterbi: max and argmax in the log domain (no exps), ties toward the smallest index; the first
  segment's phantom predecessor is marginalised (``u0 = lse_{c'} Tr[c', c]``).

Arrays are C-contiguous float64 unless stated; ``-inf`` marks what is forbidden or impossible.
Each ``*_batch`` function runs the sequences [lo, hi) of a batch, one after the other; the host
(:mod:`.engine`) calls it on several threads for disjoint ranges (the kernels release the
GIL). Each sequence's work is sequential and writes only its own outputs, so results do not
depend on the thread count.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from torch_semimarkov.engines.numba.common import (
    KERNEL,
    LOW,
    REDUCE,
    TINY,
    put,
    fexp,
    flog,
    fmax,
    best_path,
    limit_window,
    lse_all,
    lse_finish,
    lse_update,
    prepare_ring,
    push_beta,
    rebase_low,
    ring_insert,
    ring_lse,
    ring_rebase,
    ring_rebase_all,
    seq_row,
    start_beta_ring,
    start_window,
    window_sums,
    window_sums_limited,
)

NINF = -np.inf


@njit(inline="always")
def down(p, K):
    """Ring index of position p in a ring written in descending position order."""
    return (K - p % K) % K


@njit(**KERNEL)
def _u_part(alpha, Tr, eTr, tmax, u, ea, linu):
    """u(c) = lse_{c'}(alpha(c') + Tr[c', c]); also ea = exp(alpha - max) and the linear sums linu.

    linu[c] < TINY marks a column computed exactly in the log domain.
    """
    C = alpha.shape[0]
    ma = NINF
    for c in range(C):
        ma = max(ma, alpha[c])
    for c in range(C):
        linu[c] = 0.0
    if ma == NINF:
        for c in range(C):
            u[c] = NINF
            ea[c] = 0.0
        return
    for c in range(C):
        ea[c] = fexp(alpha[c] - ma)
    for cp in range(C):
        e = ea[cp]
        row = eTr[cp]
        for c in range(C):
            linu[c] += e * row[c]
    for c in range(C):
        u[c] = (ma + tmax[c]) + flog(linu[c])
    for c in range(C):
        if linu[c] < TINY and tmax[c] != NINF:
            m, s = NINF, 0.0
            for cp in range(C):
                m, s = lse_update(m, s, alpha[cp] + Tr[cp, c])
            u[c] = lse_finish(m, s)


@njit(**KERNEL)
def _window_forward(p, S, pe, has_pe, VT, linT, H, D, eDT, Dm, alpha, acc, mx, lim, has_lim, klim):
    """alpha_{p+1}(c) = S_{p+1} + pe_p + lse_k (V_{p+1-k}(c) + D[k-1, c]), written into alpha;
    with segment limits (``has_lim``) the window of label c stops at ``klim[c]`` durations."""
    C, K2 = linT.shape
    K = K2 // 2
    kmax = min(K, p + 1)
    r = down(p, K)
    limit_window(lim, has_lim, 0, p + 1, kmax, klim)
    if has_lim:
        window_sums_limited(linT, r, kmax, klim, eDT, acc, mx)
    else:
        window_sums(linT, r, kmax, eDT, acc, mx)
    s1 = S[p + 1]
    for c in range(C):
        alpha[c] = s1[c] + ((H[c] + Dm[c]) + flog(acc[c]))
    if has_pe:
        pep = pe[p]
        for c in range(C):
            alpha[c] += pep[c]
    for c in range(C):
        if acc[c] < TINY and H[c] != NINF and Dm[c] != NINF:
            alpha[c] = (s1[c] + (pe[p, c] if has_pe else 0.0)) + ring_lse(VT, c, r, klim[c], D)
        if mx[c] < LOW:
            ring_rebase(VT, linT, H, c)


@njit(**KERNEL)
def _insert_v(p, S, ps, has_ps, u, VT, linT, H, vals):
    """Ring column of start position p: V_p = u_p + ps_p - S_p."""
    C, K2 = VT.shape
    for c in range(C):
        vals[c] = (u[c] + (ps[p, c] if has_ps else 0.0)) - S[p, c]
    ring_insert(VT, linT, H, down(p, K2 // 2), vals)


@njit(**KERNEL)
def _save(ck, VT, alpha):
    """Checkpoint row block (K+1, C): the ring's K log columns, then alpha."""
    K = VT.shape[1] // 2
    for j in range(K):
        put(ck[j], VT[:, j])
    put(ck[K], alpha)


@njit(**KERNEL)
def _load(ck, VT, alpha):
    K = VT.shape[1] // 2
    for j in range(K):
        put(VT[:, j], ck[j])
        put(VT[:, j + K], ck[j])
    put(alpha, ck[K])


@njit(**KERNEL)
def forward_seq(S, ps, pe, has_ps, has_pe, lim, has_lim, L, Tr, eTr, tmax, D, eDT, Dm, interval, save, ck, keep, A,
                W, Uu):
    """log Z of one sequence of length L; with ``save``, checkpoints ck[i] = (V ring, alpha) at i·interval.

    The scaled ring is re-referenced at every checkpoint position, so a recompute that starts from
    a checkpoint repeats the forward's arithmetic exactly. ``lim`` (2, T+1, C) int64 with
    ``has_lim``: segment limits (:func:`.common.limit_window`). With ``keep`` (the sampler,
    :mod:`.sample`) every message stays: A[p] = alpha_p (p <= L), W[p] = u_p + ps_p - S_p and
    Uu[p] = u_p (p < L).
    """
    K, C = D.shape
    VT, linT, H = prepare_ring(K, C)
    alpha = np.zeros(C)
    u, ea, linu = np.empty(C), np.empty(C), np.empty(C)
    acc, mx, vals = np.empty(C), np.empty(C), np.empty(C)
    klim = np.empty(C, dtype=np.int64)
    for p in range(L + 1):
        if p % interval == 0:
            ring_rebase_all(VT, linT, H)
            if save:
                _save(ck[p // interval], VT, alpha)
        if keep:
            put(A[p], alpha)
        if p == L:
            break
        _u_part(alpha, Tr, eTr, tmax, u, ea, linu)
        _insert_v(p, S, ps, has_ps, u, VT, linT, H, vals)
        if keep:
            put(W[p], vals)
            put(Uu[p], u)
        _window_forward(p, S, pe, has_pe, VT, linT, H, D, eDT, Dm, alpha, acc, mx, lim, has_lim, klim)
    return lse_all(alpha)


@njit(**KERNEL)
def forward_batch(S, ps, pe, has_ps, has_pe, lim, has_lim, lengths, Tr, eTr, tmax, D, eDT, Dm, interval, save, ck,
                  keep, A, W, Uu, out, lo, hi):
    """forward_seq for every sequence: S (B, T+1, C), ps/pe (B, T, C) or (1, 1, C) dummies, lim
    (B, 2, T+1, C) or a (1, 2, 1, 1) dummy, ck (B, N, K+1, C), A (B, T+1, C) and W, Uu (B, T, C)
    (or (1, 1, C) dummies without ``keep``)."""
    for b in range(lo, hi):
        out[b] = forward_seq(S[b], seq_row(ps, b), seq_row(pe, b), has_ps, has_pe, seq_row(lim, b), has_lim,
                             lengths[b], Tr, eTr, tmax, D, eDT, Dm, interval, save, seq_row(ck, b), keep,
                             seq_row(A, b), seq_row(W, b), seq_row(Uu, b))


@njit(**KERNEL)
def _add_outer(Atr, ea, r):
    """Atr[c', c] += ea[c'] · r[c]."""
    C = ea.shape[0]
    for cp in range(C):
        e = ea[cp]
        if e != 0.0:
            row = Atr[cp]
            for c in range(C):
                row[c] += e * r[c]


@njit(**KERNEL)
def _add_scaled_window(AT, linT, r0, klim, w):
    """AT[c, k] += linT[c, r0 + k] · w[c] for k < klim[c]."""
    for c in range(AT.shape[0]):
        wc = w[c]
        n = klim[c]
        if wc != 0.0:
            row = linT[c, r0 : r0 + n]
            arow = AT[c, :n]
            for k in range(n):
                arow[k] += row[k] * wc


@njit(**KERNEL)
def backward_seq(S, ps, pe, has_ps, has_pe, lim, has_lim, L, logZ, Tr, eTr, tmax, eTrRT, tmaxR, D, eDT, Dm,
                 interval, ck, grads, p_start, p_end, g_tr, g_db):
    """Marginals and per-sequence parameter gradients of one sequence (outputs start at zero).

    Walks the checkpoint intervals from the last; in each, recomputes alpha and u from the
    checkpoint into interval buffers, then runs the beta recurrence down through the interval with
    a scaled ring of Y_t = S_t + pe_{t-1} + beta_t (ascending positions) carried across intervals.
    eTrRT[c, c'] is exp(Tr[c', c] - tmaxR[c']) (row-normalised, stored transposed).
    """
    if logZ == NINF:
        return
    K, C = D.shape
    n_ck = L // interval + 1
    VT, linT, H = prepare_ring(K, C)
    YT, linyT, Hy = prepare_ring(K, C)
    alpha = np.empty(C)
    A = np.empty((interval + 1, C))  # alpha_s
    U = np.empty((interval + 1, C))  # u_s
    EA = np.empty((interval + 1, C))  # exp(alpha_s - max)
    LU = np.empty((interval + 1, C))  # linear sums of u_s (< TINY: exact column)
    acc, mx, vals = np.empty(C), np.empty(C), np.empty(C)
    klim = np.empty(C, dtype=np.int64)
    v, beta, ev, linb = np.empty(C), np.empty(C), np.empty(C), np.empty(C)
    w, r, pst, pend = np.empty(C), np.empty(C), np.empty(C), np.empty(C)
    Atr = np.zeros((C, C))
    Gtr = np.zeros((C, C))
    AdbT = np.zeros((C, K))
    Gdb = np.zeros((K, C))
    for i in range(n_ck - 1, -1, -1):
        t0 = i * interval
        t1 = min(t0 + interval, L + 1)
        _load(ck[i], VT, alpha)
        ring_rebase_all(VT, linT, H)
        for p in range(t0, t1):
            j = p - t0
            put(A[j], alpha)
            if p < L:
                _u_part(alpha, Tr, eTr, tmax, U[j], EA[j], LU[j])
                if p + 1 < t1:
                    _insert_v(p, S, ps, has_ps, U[j], VT, linT, H, vals)
                    _window_forward(p, S, pe, has_pe, VT, linT, H, D, eDT, Dm, alpha, acc, mx, lim, has_lim, klim)
        if t1 == L + 1:
            start_beta_ring(L, S, pe, has_pe, A[L - t0], logZ, p_end, YT, linyT, Hy, vals)
        for s in range(min(t1, L) - 1, t0 - 1, -1):
            j = s - t0
            # v_s(c) = ps_s - S_s + lse_k (D[k-1, c] + Y_{s+k}(c))
            kmax, r0 = start_window(s, L, K, lim, has_lim, klim)
            if has_lim:
                window_sums_limited(linyT, r0, kmax, klim, eDT, acc, mx)
            else:
                window_sums(linyT, r0, kmax, eDT, acc, mx)
            ss = S[s]
            for c in range(C):
                v[c] = (Hy[c] + Dm[c]) + flog(acc[c]) - ss[c]
            if has_ps:
                pss = ps[s]
                for c in range(C):
                    v[c] += pss[c]
            for c in range(C):
                if acc[c] < TINY and Hy[c] != NINF and Dm[c] != NINF:
                    v[c] = ((ps[s, c] if has_ps else 0.0) - S[s, c]) + ring_lse(YT, c, r0, klim[c], D)
            for c in range(C):
                pst[c] = fexp((U[j, c] + v[c]) - logZ)
                p_start[s, c] = pst[c]
            if grads:
                # P_seg(s, k, c) = P_start(s, c) · lin_y[s+k, c] · eD[k-1, c] / acc[c]
                for c in range(C):
                    w[c] = pst[c] / acc[c] if acc[c] >= TINY else 0.0
                _add_scaled_window(AdbT, linyT, r0, klim, w)
                for c in range(C):
                    if acc[c] >= TINY or pst[c] == 0.0:
                        continue
                    head = U[j, c] + (ps[s, c] if has_ps else 0.0) - S[s, c] - logZ
                    for k in range(klim[c]):
                        Gdb[k, c] += math.exp(head + D[k, c] + YT[c, r0 + k])
                # P_trans(s, c', c) = exp(alpha_s(c') - max) · eTr[c', c] · P_start(s, c) / linu(c)
                for c in range(C):
                    r[c] = pst[c] / LU[j, c] if LU[j, c] >= TINY else 0.0
                _add_outer(Atr, EA[j], r)
                for c in range(C):
                    if LU[j, c] >= TINY or pst[c] == 0.0:
                        continue
                    for cp in range(C):
                        Gtr[cp, c] += math.exp(A[j, cp] + Tr[cp, c] + v[c] - logZ)
            if s >= 1:
                # beta_s(c') = lse_c (Tr[c', c] + v_s(c))
                mv = NINF
                for c in range(C):
                    mv = max(mv, v[c])
                for c in range(C):
                    ev[c] = fexp(v[c] - mv)
                    linb[c] = 0.0
                if mv != NINF:
                    for c in range(C):
                        e = ev[c]
                        if e != 0.0:
                            row = eTrRT[c]
                            for cp in range(C):
                                linb[cp] += row[cp] * e
                for cp in range(C):
                    beta[cp] = (mv + tmaxR[cp]) + flog(linb[cp])
                for cp in range(C):
                    if linb[cp] < TINY and mv != NINF and tmaxR[cp] != NINF:
                        m, sm = NINF, 0.0
                        for c in range(C):
                            m, sm = lse_update(m, sm, Tr[cp, c] + v[c])
                        beta[cp] = lse_finish(m, sm)
                for c in range(C):
                    pend[c] = fexp((A[j, c] + beta[c]) - logZ)
                push_beta(s, S, pe, has_pe, beta, pend, p_end, YT, linyT, Hy, vals)
            rebase_low(YT, linyT, Hy, mx)
    if grads:
        for cp in range(C):
            for c in range(C):
                g_tr[cp, c] = eTr[cp, c] * Atr[cp, c] + Gtr[cp, c]
        for k in range(K):
            for c in range(C):
                g_db[k, c] = eDT[c, k] * AdbT[c, k] + Gdb[k, c]


@njit(**KERNEL)
def backward_batch(S, ps, pe, has_ps, has_pe, lim, has_lim, lengths, logZ, Tr, eTr, tmax, eTrRT, tmaxR, D, eDT, Dm,
                   interval, ck, grads, p_start, p_end, g_tr, g_db, lo, hi):
    """backward_seq for every sequence; p_start/p_end (B, T, C), g_tr (B, C, C), g_db (B, K, C), all zero on entry."""
    for b in range(lo, hi):
        bg = min(b, g_tr.shape[0] - 1)
        backward_seq(S[b], seq_row(ps, b), seq_row(pe, b), has_ps, has_pe, seq_row(lim, b), has_lim, lengths[b],
                     logZ[b], Tr, eTr, tmax, eTrRT, tmaxR, D, eDT, Dm, interval, ck[b], grads, p_start[b], p_end[b],
                     g_tr[bg], g_db[bg])


@njit(inline="always", **REDUCE)
def _max_first(x, n):
    """(max, smallest index of the max) of x[:n], n >= 1: a max reduction, then an index
    min-reduction (both vectorise; an early-exit scan would not)."""
    m = NINF
    for k in range(n):
        m = fmax(m, x[k])
    first = n
    for k in range(n):
        first = min(first, k if x[k] == m else n)
    return m, (0 if first == n else first)


@njit(**KERNEL)
def _window_max(UT, SRT, DT, p, r, klim, tmp, best, arg):
    """best[c] = max_{k < klim[c]} (U_{p-k}(c) + (S_{p+1}(c) - S_{p-k}(c)) + D[k, c]) and the
    smallest argmax k (-inf and 0 for an empty window).

    SRT (C, L+1) holds S reversed in time: SRT[c, L - t] = S_t(c).
    """
    L = SRT.shape[1] - 1
    for c in range(UT.shape[0]):
        n = klim[c]
        srow = SRT[c, L - p : L - p + n]
        sp = SRT[c, L - p - 1]
        urow = UT[c, r : r + n]
        drow = DT[c, :n]
        for k in range(n):
            tmp[k] = (urow[k] + (sp - srow[k])) + drow[k]
        best[c], arg[c] = _max_first(tmp, n)


@njit(**KERNEL)
def _max_argmax_over_rows(alpha, TrT, best, arg, tmp):
    """best[c] = max_{c'} (alpha[c'] + Tr[c', c]) and arg[c] its smallest maximiser (TrT = Tr.T)."""
    C = alpha.shape[0]
    for c in range(C):
        row = TrT[c]
        for cp in range(C):
            tmp[cp] = alpha[cp] + row[cp]
        best[c], arg[c] = _max_first(tmp, C)


@njit(**KERNEL)
def viterbi_seq(S, ps, pe, has_ps, has_pe, lim, has_lim, L, Tr, u0, D, store, bp_k, bp_c, labels, starts):
    """Best score of one sequence; with ``store``, backpointers bp_k[t-1, c] (duration - 1) and
    bp_c[s, c] (predecessor label of a segment starting at s), and the best segmentation's labels
    and starts traced back from them (:func:`.common.best_path`)."""
    K, C = D.shape
    UT = np.full((C, 2 * K), NINF)
    SRT = np.ascontiguousarray(S[L::-1].T)
    DT = np.ascontiguousarray(D.T)
    alpha = np.zeros(C)
    u = np.empty(C)
    best = np.empty(C)
    tmp = np.empty(max(K, C))
    arg = np.zeros(C, dtype=np.int64)
    klim = np.empty(C, dtype=np.int64)
    TrT = np.ascontiguousarray(Tr.T)
    for p in range(L):
        if p == 0:
            put(u, u0)
            arg[:] = 0
        else:
            _max_argmax_over_rows(alpha, TrT, u, arg, tmp)
        if store:
            for c in range(C):
                bp_c[p, c] = arg[c]
        r = down(p, K)
        for c in range(C):
            x = u[c] + (ps[p, c] if has_ps else 0.0)
            UT[c, r] = x
            UT[c, r + K] = x
        limit_window(lim, has_lim, 0, p + 1, min(K, p + 1), klim)
        _window_max(UT, SRT, DT, p, r, klim, tmp, best, arg)
        for c in range(C):
            alpha[c] = best[c] + (pe[p, c] if has_pe else 0.0)
        if store:
            for c in range(C):
                bp_k[p, c] = arg[c]
    return best_path(alpha, L, store, bp_k, bp_c, False, labels, starts)


@njit(**KERNEL)
def viterbi_batch(S, ps, pe, has_ps, has_pe, lim, has_lim, lengths, Tr, u0, D, store, bp_k, bp_c, scores, labels,
                  starts, lo, hi):
    """viterbi_seq for every sequence: labels (B, T) int64 filled with -1, starts (B, T) False."""
    for b in range(lo, hi):
        scores[b] = viterbi_seq(S[b], seq_row(ps, b), seq_row(pe, b), has_ps, has_pe, seq_row(lim, b), has_lim,
                                lengths[b], Tr, u0, D, store, seq_row(bp_k, b), seq_row(bp_c, b), seq_row(labels, b),
                                seq_row(starts, b))
