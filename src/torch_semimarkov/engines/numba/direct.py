"""Compiled CPU kernels (numba) for duration-dependent (K, C, C) transitions: the direct recurrence.

    alpha_t(c) = S_t(c) + pe_{t-1}(c) + lse_{k, c'} ( alpha_{t-k}(c') + Tr[k-1, c', c] + D[k-1, c] + ps_{t-k}(c) - S_{t-k}(c) )

Per sequence, in float64 (see :mod:`.factored` and ``docs/internals.md`` §8). The ring holds,
for each of the last K positions s, alpha_s (log), ``exp(alpha_s - a_s)`` with ``a_s = max alpha_s``,
and the scaled per-label factor ``exp(a_s + ps_s - S_s - H)``; each duration of the window is then a
(C, C) matrix-vector product with the table ``eTD[k-1, c', c] = exp(Tr[k-1, c', c] + D[k-1, c] - Mc[c])``
(K·C² multiply-adds per position, C exps). The backward runs beta the same way and gets every
marginal from ``P(s, k, c', c) = P_out(s, c') · eTD[k-1, c', c] · w_k(c) / beta_lin(c')``, with
``P_out(s, c') = exp(alpha_s(c') + beta_s(c') - log Z)``. Sums below ``TINY`` are recomputed exactly
in the log domain.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from torch_semimarkov.engines.numba.common import (
    KERNEL,
    LOW,
    TINY,
    put,
    fexp,
    flog,
    best_path,
    limit_window,
    lse_all,
    lse_finish,
    lse_update,
    prepare_ring,
    push_beta,
    rebase_low,
    ring_insert,
    ring_rebase,
    ring_rebase_all,
    seq_row,
    start_beta_ring,
    start_window,
)
from torch_semimarkov.engines.numba.factored import _max_first, down

NINF = -np.inf

# The forward ring is doubled and in descending position order (index down(s) and down(s) + K):
# Alog (2K, C) alpha_s, EA (2K, C) exp(alpha_s - a_s), and the scaled ring ZT/linT (C, 2K) of
# a_s + ps_s - S_s. Positions p, p-1, ..., p-K+1 sit at indices r, r+1, ..., r+K-1, r = down(p).


@njit(**KERNEL)
def _slot_factors(s, alpha, S, ps, has_ps, EA, zvals, j, K):
    """EA[j] = EA[j+K] = exp(alpha_s - a_s) and zvals = a_s + ps_s - S_s (all -inf if alpha_s is)."""
    C = alpha.shape[0]
    a = NINF
    for c in range(C):
        a = max(a, alpha[c])
    T = ps.shape[0]
    for c in range(C):
        if a == NINF:
            e = 0.0
            zvals[c] = NINF
        else:
            e = fexp(alpha[c] - a)
            zvals[c] = (a + (ps[s, c] if has_ps and s < T else 0.0)) - S[s, c]
        EA[j, c] = e
        EA[j + K, c] = e


@njit(**KERNEL)
def _insert_alpha(p, alpha, S, ps, has_ps, Alog, EA, ZT, linT, H, zvals):
    K = Alog.shape[0] // 2
    r = down(p, K)
    put(Alog[r], alpha)
    put(Alog[r + K], alpha)
    _slot_factors(p, alpha, S, ps, has_ps, EA, zvals, r, K)
    ring_insert(ZT, linT, H, r, zvals)


@njit(**KERNEL)
def _rebuild(p, S, ps, has_ps, Alog, EA, ZT, linT, H, zvals):
    """Recompute every ring factor from the alpha rows at position p and re-reference the ring."""
    K = Alog.shape[0] // 2
    C = Alog.shape[1]
    r = down(p, K)
    for j in range(K):
        s = p - (j - r) % K
        if s < 0:
            for c in range(C):
                EA[j, c] = 0.0
                EA[j + K, c] = 0.0
                zvals[c] = NINF
        else:
            _slot_factors(s, Alog[j], S, ps, has_ps, EA, zvals, j, K)
        for c in range(C):
            ZT[c, j] = zvals[c]
            ZT[c, j + K] = zvals[c]
    ring_rebase_all(ZT, linT, H)


@njit(**KERNEL)
def _window_forward(p, S, ps, pe, has_ps, has_pe, Tr, eTD, Mc, D, Alog, EA, linT, H, ZT, alpha, acc, mx, q, lim,
                    has_lim, klim):
    """alpha_{p+1} from the ring (positions p, p-1, ..., p-K+1), written into alpha; label c's
    window stops at klim[c] durations (segment limits)."""
    C = alpha.shape[0]
    K = Alog.shape[0] // 2
    kmax = min(K, p + 1)
    r = down(p, K)
    limit_window(lim, has_lim, 0, p + 1, kmax, klim)
    for c in range(C):
        acc[c] = 0.0
        mx[c] = 0.0
    for k in range(kmax):
        row = r + k
        for c in range(C):
            q[c] = 0.0
        for cp in range(C):
            e = EA[row, cp]
            if e != 0.0:
                for c in range(C):
                    q[c] += e * eTD[k, cp, c]
        for c in range(C):
            v = linT[c, row]
            acc[c] += v * q[c] if k < klim[c] else 0.0
            mx[c] = max(mx[c], v)
    for c in range(C):
        alpha[c] = (S[p + 1, c] + (pe[p, c] if has_pe else 0.0)) + ((H[c] + Mc[c]) + flog(acc[c]))
    for c in range(C):
        if acc[c] < TINY and H[c] != NINF and Mc[c] != NINF:
            m, sm = NINF, 0.0
            for k in range(klim[c]):
                s = p - k
                z = D[k, c] + (ps[s, c] if has_ps else 0.0) - S[s, c]
                for cp in range(C):
                    m, sm = lse_update(m, sm, Alog[r + k, cp] + Tr[k, cp, c] + z)
            alpha[c] = (S[p + 1, c] + (pe[p, c] if has_pe else 0.0)) + lse_finish(m, sm)
        if mx[c] < LOW:
            ring_rebase(ZT, linT, H, c)


@njit(**KERNEL)
def _save(ck, Alog, alpha):
    K = Alog.shape[0] // 2
    for j in range(K):
        put(ck[j], Alog[j])
    put(ck[K], alpha)


@njit(**KERNEL)
def forward_seq(S, ps, pe, has_ps, has_pe, lim, has_lim, L, Tr, eTD, Mc, D, interval, save, ck, keep, A):
    """log Z of one sequence; with ``save``, checkpoints ck[i] = (alpha ring, alpha) at i·interval;
    with ``keep`` (the sampler, :mod:`.sample`), A[p] = alpha_p for every p <= L."""
    K, C = D.shape
    Alog = np.full((2 * K, C), NINF)
    EA = np.zeros((2 * K, C))
    ZT, linT, H = prepare_ring(K, C)
    alpha = np.zeros(C)
    acc, mx, q, zvals = np.empty(C), np.empty(C), np.empty(C), np.empty(C)
    klim = np.empty(C, dtype=np.int64)
    _insert_alpha(0, alpha, S, ps, has_ps, Alog, EA, ZT, linT, H, zvals)
    for p in range(L + 1):
        if p % interval == 0:
            _rebuild(p, S, ps, has_ps, Alog, EA, ZT, linT, H, zvals)
            if save:
                _save(ck[p // interval], Alog, alpha)
        if keep:
            put(A[p], alpha)
        if p == L:
            break
        _window_forward(p, S, ps, pe, has_ps, has_pe, Tr, eTD, Mc, D, Alog, EA, linT, H, ZT, alpha, acc, mx, q, lim,
                        has_lim, klim)
        _insert_alpha(p + 1, alpha, S, ps, has_ps, Alog, EA, ZT, linT, H, zvals)
    return lse_all(alpha)


@njit(**KERNEL)
def forward_batch(S, ps, pe, has_ps, has_pe, lim, has_lim, lengths, Tr, eTD, Mc, D, interval, save, ck, keep, A, out,
                  lo, hi):
    """forward_seq for every sequence (A (B, T+1, C), or a (1, 1, C) dummy without ``keep``)."""
    for b in range(lo, hi):
        out[b] = forward_seq(S[b], seq_row(ps, b), seq_row(pe, b), has_ps, has_pe, seq_row(lim, b), has_lim,
                             lengths[b], Tr, eTD, Mc, D, interval, save, seq_row(ck, b), keep, seq_row(A, b))


@njit(**KERNEL)
def backward_seq(S, ps, pe, has_ps, has_pe, lim, has_lim, L, logZ, Tr, eTD, eTDt, Mc, D, interval, ck, grads,
                 p_start, p_end, g_tr, g_db):
    """Marginals and per-sequence gradients of one sequence (outputs start at zero)."""
    if logZ == NINF:
        return
    K, C = D.shape
    n_ck = L // interval + 1
    Alog = np.full((2 * K, C), NINF)
    EA = np.zeros((2 * K, C))
    ZT, linT, H = prepare_ring(K, C)
    YT, linyT, Hy = prepare_ring(K, C)
    alpha = np.empty(C)
    A = np.empty((interval + 1, C))
    acc, mx, q, zvals = np.empty(C), np.empty(C), np.empty(C), np.empty(C)
    gz, eg, beta, blin = np.empty(C), np.empty(C), np.empty(C), np.empty(C)
    pout, rho, vals = np.empty(C), np.empty(C), np.empty(C)
    klim = np.empty(C, dtype=np.int64)
    WK = np.empty((K, C))
    Atr = np.zeros((K, C, C))
    Gtr = np.zeros((K, C, C))
    for i in range(n_ck - 1, -1, -1):
        t0 = i * interval
        t1 = min(t0 + interval, L + 1)
        for j in range(K):
            put(Alog[j], ck[i, j])
            put(Alog[j + K], ck[i, j])
        put(alpha, ck[i, K])
        _rebuild(t0, S, ps, has_ps, Alog, EA, ZT, linT, H, zvals)
        for p in range(t0, t1):
            put(A[p - t0], alpha)
            if p < L and p + 1 < t1:
                _window_forward(p, S, ps, pe, has_ps, has_pe, Tr, eTD, Mc, D, Alog, EA, linT, H, ZT, alpha, acc, mx, q,
                                lim, has_lim, klim)
                _insert_alpha(p + 1, alpha, S, ps, has_ps, Alog, EA, ZT, linT, H, zvals)
        if t1 == L + 1:
            start_beta_ring(L, S, pe, has_pe, A[L - t0], logZ, p_end, YT, linyT, Hy, vals)
        for s in range(min(t1, L) - 1, t0 - 1, -1):
            j = s - t0
            kmax, r0 = start_window(s, L, K, lim, has_lim, klim)
            G = NINF
            for c in range(C):
                gz[c] = ((ps[s, c] if has_ps else 0.0) - S[s, c]) + (Hy[c] + Mc[c])
                G = max(G, gz[c])
            for c in range(C):
                m = 0.0
                for k in range(kmax):
                    m = max(m, linyT[c, r0 + k])
                mx[c] = m
                blin[c] = 0.0
                pout[c] = 0.0
                rho[c] = 0.0
                beta[c] = NINF
            if G != NINF:
                for c in range(C):
                    eg[c] = fexp(gz[c] - G)
                for k in range(kmax):
                    for c in range(C):
                        WK[k, c] = linyT[c, r0 + k] * eg[c] if k < klim[c] else 0.0
                # beta_lin(c') = sum_{k, c} eTD[k, c', c] · WK[k, c]
                for k in range(kmax):
                    for c in range(C):
                        wv = WK[k, c]
                        if wv != 0.0:
                            for cp in range(C):
                                blin[cp] += eTDt[k, c, cp] * wv
                for cp in range(C):
                    beta[cp] = G + flog(blin[cp])
                for cp in range(C):
                    if blin[cp] < TINY:
                        m, sm = NINF, 0.0
                        for k in range(kmax):
                            for c in range(C):
                                if k >= klim[c]:
                                    continue
                                z = D[k, c] + (ps[s, c] if has_ps else 0.0) - S[s, c] + YT[c, r0 + k]
                                m, sm = lse_update(m, sm, Tr[k, cp, c] + z)
                        beta[cp] = lse_finish(m, sm)
                for cp in range(C):
                    pout[cp] = fexp((A[j, cp] + beta[cp]) - logZ)
                    rho[cp] = pout[cp] / blin[cp] if blin[cp] >= TINY else 0.0
                # P_start(s, c) = sum_k WK[k, c] · sum_{c'} rho(c') eTD[k, c', c]
                for k in range(kmax):
                    for c in range(C):
                        q[c] = 0.0
                    for cp in range(C):
                        rv = rho[cp]
                        if rv != 0.0:
                            for c in range(C):
                                q[c] += rv * eTD[k, cp, c]
                    for c in range(C):
                        p_start[s, c] += WK[k, c] * q[c]
                if grads:
                    for k in range(kmax):
                        for cp in range(C):
                            rv = rho[cp]
                            if rv != 0.0:
                                for c in range(C):
                                    Atr[k, cp, c] += rv * WK[k, c]
                for cp in range(C):
                    if blin[cp] >= TINY or pout[cp] == 0.0:
                        continue
                    for k in range(kmax):
                        for c in range(C):
                            if k >= klim[c]:
                                continue
                            z = D[k, c] + (ps[s, c] if has_ps else 0.0) - S[s, c] + YT[c, r0 + k]
                            e = math.exp(A[j, cp] + Tr[k, cp, c] + z - logZ)
                            p_start[s, c] += e
                            Gtr[k, cp, c] += e
            if s >= 1:
                push_beta(s, S, pe, has_pe, beta, pout, p_end, YT, linyT, Hy, vals)
            rebase_low(YT, linyT, Hy, mx)
    if grads:
        for k in range(K):
            for c in range(C):
                g_db[k, c] = 0.0
            for cp in range(C):
                for c in range(C):
                    g = eTD[k, cp, c] * Atr[k, cp, c] + Gtr[k, cp, c]
                    g_tr[k, cp, c] = g
                    g_db[k, c] += g


@njit(**KERNEL)
def backward_batch(S, ps, pe, has_ps, has_pe, lim, has_lim, lengths, logZ, Tr, eTD, eTDt, Mc, D, interval, ck, grads,
                   p_start, p_end, g_tr, g_db, lo, hi):
    for b in range(lo, hi):
        bg = min(b, g_tr.shape[0] - 1)
        backward_seq(S[b], seq_row(ps, b), seq_row(pe, b), has_ps, has_pe, seq_row(lim, b), has_lim, lengths[b],
                     logZ[b], Tr, eTD, eTDt, Mc, D, interval, ck[b], grads, p_start[b], p_end[b], g_tr[bg], g_db[bg])


@njit(**KERNEL)
def viterbi_seq(S, ps, pe, has_ps, has_pe, lim, has_lim, L, Tr, ph, D, store, bp_k, bp_c, labels, starts):
    """Best score of one sequence; backpointers bp_k[t-1, c] (duration - 1) and bp_c[t-1, c]
    (predecessor label), ties toward the lexicographically smallest (k, c'), and with ``store`` the
    best segmentation traced back into labels / starts. ph[k-1, c] is the first segment's
    marginalised phantom predecessor."""
    K, C = D.shape
    Alog = np.full((2 * K, C), NINF)
    alpha = np.zeros(C)
    put(Alog[0], alpha)
    put(Alog[K], alpha)
    best = np.empty(C)
    seg = np.empty(C)
    argk = np.zeros(C, dtype=np.int64)
    argc = np.zeros(C, dtype=np.int64)
    tmp = np.empty(C)
    klim = np.empty(C, dtype=np.int64)
    # TrT[k, c] = Tr[k, :, c], by loops: numba's transpose with axes compiles a shape-error path
    TrT = np.empty((K, C, C))
    for k in range(K):
        for a in range(C):
            for c in range(C):
                TrT[k, c, a] = Tr[k, a, c]
    for p in range(L):
        for c in range(C):
            best[c] = NINF
            argk[c] = 0
            argc[c] = 0
        r = down(p, K)
        limit_window(lim, has_lim, 0, p + 1, min(K, p + 1), klim)
        for k in range(min(K, p + 1)):
            s = p - k
            arow = Alog[r + k]
            for c in range(C):
                seg[c] = ((S[p + 1, c] - S[s, c]) + D[k, c]) + (ps[s, c] if has_ps else 0.0)
            for c in range(C):
                if k >= klim[c]:
                    continue
                if s == 0:
                    m, a = ph[k, c], 0
                else:
                    trow = TrT[k, c]
                    for cp in range(C):
                        tmp[cp] = arow[cp] + trow[cp]
                    m, a = _max_first(tmp, C)
                val = m + seg[c]
                # strict: among equal scores the smallest k (then the smallest c') is kept
                if val > best[c]:
                    best[c] = val
                    argk[c] = k
                    argc[c] = a
        for c in range(C):
            alpha[c] = best[c] + (pe[p, c] if has_pe else 0.0)
        r1 = down(p + 1, K)
        put(Alog[r1], alpha)
        put(Alog[r1 + K], alpha)
        if store:
            for c in range(C):
                bp_k[p, c] = argk[c]
                bp_c[p, c] = argc[c]
    return best_path(alpha, L, store, bp_k, bp_c, True, labels, starts)


@njit(**KERNEL)
def viterbi_batch(S, ps, pe, has_ps, has_pe, lim, has_lim, lengths, Tr, ph, D, store, bp_k, bp_c, scores, labels,
                  starts, lo, hi):
    for b in range(lo, hi):
        scores[b] = viterbi_seq(S[b], seq_row(ps, b), seq_row(pe, b), has_ps, has_pe, seq_row(lim, b), has_lim,
                                lengths[b], Tr, ph, D, store, seq_row(bp_k, b), seq_row(bp_c, b), seq_row(labels, b),
                                seq_row(starts, b))
