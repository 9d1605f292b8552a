"""Compiled CPU kernels (numba) for duration-dependent (K, C, C) transitions: the direct recurrence.

    alpha_t(c) = S_t(c) + pe_{t-1}(c) + lse_{k, c'} ( alpha_{t-k}(c') + Tr[k-1, c', c] + D[k-1, c] + ps_{t-k}(c) - S_{t-k}(c) )

Per sequence, in float64 (see :mod:`.numba_factored` and ``docs/internals.md`` §8). The ring holds,
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
from numba import njit, prange

from .numba_common import (
    LOW,
    TINY,
    fexp,
    lse_finish,
    lse_update,
    prepare_ring,
    ring_insert,
    ring_rebase,
    ring_rebase_all,
    traceback_seq,
)

NINF = -np.inf


@njit(cache=True)
def _slot_factors(p, alpha, S, ps, has_ps, EA, Zlog, slot):
    """exp(alpha_p - a_p) into EA[slot] and a_p + ps_p - S_p into Zlog[slot] (all -inf if alpha_p is)."""
    C = alpha.shape[0]
    a = NINF
    for c in range(C):
        a = max(a, alpha[c])
    T = ps.shape[0]
    for c in range(C):
        if a == NINF:
            EA[slot, c] = 0.0
            Zlog[slot, c] = NINF
        else:
            EA[slot, c] = fexp(alpha[c] - a)
            Zlog[slot, c] = (a + (ps[p, c] if has_ps and p < T else 0.0)) - S[p, c]


@njit(cache=True)
def _insert_alpha(p, alpha, S, ps, has_ps, Alog, EA, Zlog, lin, H):
    K = Alog.shape[0]
    slot = p % K
    Alog[slot] = alpha
    _slot_factors(p, alpha, S, ps, has_ps, EA, Zlog, slot)
    ring_insert(Zlog, lin, H, slot, Zlog[slot].copy())


@njit(cache=True)
def _rebuild(p, S, ps, has_ps, Alog, EA, Zlog, lin, H):
    """Recompute every ring factor from the alpha rows at position p and re-reference the ring."""
    K, C = Alog.shape
    for j in range(K):
        s = p - ((p - j) % K)
        if s < 0:
            for c in range(C):
                EA[j, c] = 0.0
                Zlog[j, c] = NINF
        else:
            _slot_factors(s, Alog[j], S, ps, has_ps, EA, Zlog, j)
    ring_rebase_all(Zlog, lin, H)


@njit(cache=True)
def _window_forward(p, S, ps, pe, has_ps, has_pe, Tr, eTD, Mc, D, Alog, EA, Zlog, lin, H, alpha, acc, mx, q):
    """alpha_{p+1} from the ring (positions p, p-1, ..., p-K+1), written into alpha."""
    K, C = Alog.shape
    kmax = min(K, p + 1)
    for c in range(C):
        acc[c] = 0.0
        mx[c] = 0.0
    slot = p % K
    for k in range(kmax):
        for c in range(C):
            q[c] = 0.0
        for cp in range(C):
            e = EA[slot, cp]
            if e != 0.0:
                for c in range(C):
                    q[c] += e * eTD[k, cp, c]
        for c in range(C):
            v = lin[slot, c]
            acc[c] += v * q[c]
            mx[c] = max(mx[c], v)
        slot = slot - 1 if slot > 0 else K - 1
    for c in range(C):
        base = S[p + 1, c] + (pe[p, c] if has_pe else 0.0)
        if Mc[c] == NINF:
            alpha[c] = NINF
        elif acc[c] >= TINY:
            alpha[c] = base + H[c] + Mc[c] + math.log(acc[c])
        else:
            m, sm = NINF, 0.0
            slot = p % K
            for k in range(kmax):
                s = p - k
                z = D[k, c] + (ps[s, c] if has_ps else 0.0) - S[s, c]
                for cp in range(C):
                    m, sm = lse_update(m, sm, Alog[slot, cp] + Tr[k, cp, c] + z)
                slot = slot - 1 if slot > 0 else K - 1
            alpha[c] = base + lse_finish(m, sm)
        if mx[c] < LOW:
            ring_rebase(Zlog, lin, H, c)


@njit(cache=True)
def forward_seq(S, ps, pe, has_ps, has_pe, L, Tr, eTD, Mc, D, interval, save, ck):
    """log Z of one sequence; with ``save``, checkpoints ck[i] = (alpha ring, alpha) at i·interval."""
    K, C = D.shape
    Alog = np.full((K, C), NINF)
    EA = np.zeros((K, C))
    Zlog, lin, H = prepare_ring(K, C)
    alpha = np.zeros(C)
    acc, mx, q = np.empty(C), np.empty(C), np.empty(C)
    _insert_alpha(0, alpha, S, ps, has_ps, Alog, EA, Zlog, lin, H)
    for p in range(L + 1):
        if p % interval == 0:
            _rebuild(p, S, ps, has_ps, Alog, EA, Zlog, lin, H)
            if save:
                i = p // interval
                ck[i, :K] = Alog
                ck[i, K] = alpha
        if p == L:
            break
        _window_forward(p, S, ps, pe, has_ps, has_pe, Tr, eTD, Mc, D, Alog, EA, Zlog, lin, H, alpha, acc, mx, q)
        _insert_alpha(p + 1, alpha, S, ps, has_ps, Alog, EA, Zlog, lin, H)
    m, s = NINF, 0.0
    for c in range(C):
        m, s = lse_update(m, s, alpha[c])
    return lse_finish(m, s)


@njit(cache=True, parallel=True)
def forward_batch(S, ps, pe, has_ps, has_pe, lengths, Tr, eTD, Mc, D, interval, save, ck, out):
    for i in prange(S.shape[0]):
        b = np.int64(i)
        bp = min(b, ps.shape[0] - 1)
        be = min(b, pe.shape[0] - 1)
        bc = min(b, ck.shape[0] - 1)
        out[b] = forward_seq(S[b], ps[bp], pe[be], has_ps, has_pe, lengths[b], Tr, eTD, Mc, D, interval, save, ck[bc])


@njit(cache=True)
def backward_seq(S, ps, pe, has_ps, has_pe, L, logZ, Tr, eTD, eTDt, Mc, D, interval, ck, grads,
                 p_start, p_end, g_tr, g_db):
    """Marginals and per-sequence gradients of one sequence (outputs start at zero)."""
    if logZ == NINF:
        return
    K, C = D.shape
    n_ck = L // interval + 1
    Alog = np.full((K, C), NINF)
    EA = np.zeros((K, C))
    Zlog, lin, H = prepare_ring(K, C)
    Ylog, liny, Hy = prepare_ring(K, C)
    alpha = np.empty(C)
    A = np.empty((interval + 1, C))
    acc, mx, q = np.empty(C), np.empty(C), np.empty(C)
    gz, eg, beta, blin = np.empty(C), np.empty(C), np.empty(C), np.empty(C)
    pout, rho, vals = np.empty(C), np.empty(C), np.empty(C)
    ok = np.empty(C, dtype=np.bool_)
    WK = np.empty((K, C))
    Atr = np.zeros((K, C, C))
    Gtr = np.zeros((K, C, C))
    for i in range(n_ck - 1, -1, -1):
        t0 = i * interval
        t1 = min(t0 + interval, L + 1)
        Alog[:] = ck[i, :K]
        alpha[:] = ck[i, K]
        _rebuild(t0, S, ps, has_ps, Alog, EA, Zlog, lin, H)
        for p in range(t0, t1):
            A[p - t0, :] = alpha
            if p < L and p + 1 < t1:
                _window_forward(p, S, ps, pe, has_ps, has_pe, Tr, eTD, Mc, D, Alog, EA, Zlog, lin, H, alpha, acc, mx, q)
                _insert_alpha(p + 1, alpha, S, ps, has_ps, Alog, EA, Zlog, lin, H)
        for s in range(t1 - 1, t0 - 1, -1):
            j = s - t0
            if s == L:
                for c in range(C):
                    vals[c] = S[L, c] + (pe[L - 1, c] if has_pe else 0.0)
                    p_end[L - 1, c] = math.exp(A[j, c] - logZ)
                ring_insert(Ylog, liny, Hy, L % K, vals)
                continue
            kmax = min(K, L - s)
            G = NINF
            for c in range(C):
                gz[c] = (ps[s, c] if has_ps else 0.0) - S[s, c] + Hy[c] + Mc[c]
                G = max(G, gz[c])
            for c in range(C):
                mx[c] = 0.0
                blin[c] = 0.0
            slot = (s + 1) % K
            for k in range(kmax):
                for c in range(C):
                    y = liny[slot, c]
                    mx[c] = max(mx[c], y)
                slot = slot + 1 if slot < K - 1 else 0
            if G == NINF:
                for c in range(C):
                    beta[c] = NINF
                    ok[c] = True
                    rho[c] = 0.0
                    pout[c] = 0.0
            else:
                for c in range(C):
                    eg[c] = fexp(gz[c] - G)
                slot = (s + 1) % K
                for k in range(kmax):
                    for c in range(C):
                        WK[k, c] = liny[slot, c] * eg[c]
                    slot = slot + 1 if slot < K - 1 else 0
                # beta_lin(c') = sum_{k, c} eTD[k, c', c] · WK[k, c]
                for k in range(kmax):
                    for c in range(C):
                        wv = WK[k, c]
                        if wv != 0.0:
                            for cp in range(C):
                                blin[cp] += eTDt[k, c, cp] * wv
                for cp in range(C):
                    ok[cp] = blin[cp] >= TINY
                    if ok[cp]:
                        beta[cp] = G + math.log(blin[cp])
                    else:
                        m, sm = NINF, 0.0
                        slot = (s + 1) % K
                        for k in range(kmax):
                            for c in range(C):
                                z = D[k, c] + (ps[s, c] if has_ps else 0.0) - S[s, c] + Ylog[slot, c]
                                m, sm = lse_update(m, sm, Tr[k, cp, c] + z)
                            slot = slot + 1 if slot < K - 1 else 0
                        beta[cp] = lse_finish(m, sm)
                for cp in range(C):
                    pout[cp] = fexp(A[j, cp] + beta[cp] - logZ)
                    rho[cp] = pout[cp] / blin[cp] if ok[cp] else 0.0
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
                    if ok[cp] or pout[cp] == 0.0:
                        continue
                    slot = (s + 1) % K
                    for k in range(kmax):
                        for c in range(C):
                            z = D[k, c] + (ps[s, c] if has_ps else 0.0) - S[s, c] + Ylog[slot, c]
                            e = math.exp(A[j, cp] + Tr[k, cp, c] + z - logZ)
                            p_start[s, c] += e
                            Gtr[k, cp, c] += e
                        slot = slot + 1 if slot < K - 1 else 0
            if s >= 1:
                for c in range(C):
                    p_end[s - 1, c] = pout[c]
                    vals[c] = S[s, c] + (pe[s - 1, c] if has_pe else 0.0) + beta[c]
                ring_insert(Ylog, liny, Hy, s % K, vals)
            for c in range(C):
                if mx[c] < LOW:
                    ring_rebase(Ylog, liny, Hy, c)
    if grads:
        for k in range(K):
            for c in range(C):
                g_db[k, c] = 0.0
            for cp in range(C):
                for c in range(C):
                    g = eTD[k, cp, c] * Atr[k, cp, c] + Gtr[k, cp, c]
                    g_tr[k, cp, c] = g
                    g_db[k, c] += g


@njit(cache=True, parallel=True)
def backward_batch(S, ps, pe, has_ps, has_pe, lengths, logZ, Tr, eTD, eTDt, Mc, D, interval, ck, grads,
                   p_start, p_end, g_tr, g_db):
    for i in prange(S.shape[0]):
        b = np.int64(i)
        bp = min(b, ps.shape[0] - 1)
        be = min(b, pe.shape[0] - 1)
        bg = min(b, g_tr.shape[0] - 1)
        backward_seq(S[b], ps[bp], pe[be], has_ps, has_pe, lengths[b], logZ[b], Tr, eTD, eTDt, Mc, D, interval,
                     ck[b], grads, p_start[b], p_end[b], g_tr[bg], g_db[bg])


@njit(cache=True)
def viterbi_seq(S, ps, pe, has_ps, has_pe, L, Tr, ph, D, store, bp_k, bp_c):
    """Best score of one sequence; backpointers bp_k[t-1, c] (duration - 1) and bp_c[t-1, c]
    (predecessor label), ties toward the lexicographically smallest (k, c'). ph[k-1, c] is the
    first segment's marginalised phantom predecessor. Returns (score, final label)."""
    K, C = D.shape
    Alog = np.full((K, C), NINF)
    alpha = np.zeros(C)
    Alog[0] = alpha
    best = np.empty(C)
    seg = np.empty(C)
    argk = np.empty(C, dtype=np.int32)
    argc = np.empty(C, dtype=np.int32)
    for p in range(L):
        for c in range(C):
            best[c] = NINF
            argk[c] = 0
            argc[c] = 0
        slot = p % K
        for k in range(min(K, p + 1)):
            s = p - k
            for c in range(C):
                seg[c] = ((S[p + 1, c] - S[s, c]) + D[k, c]) + (ps[s, c] if has_ps else 0.0)
            if s == 0:
                for c in range(C):
                    val = ph[k, c] + seg[c]
                    if val > best[c]:
                        best[c] = val
                        argk[c] = k
                        argc[c] = 0
            else:
                for cp in range(C):
                    a = Alog[slot, cp]
                    for c in range(C):
                        val = (a + Tr[k, cp, c]) + seg[c]
                        if val > best[c]:
                            best[c] = val
                            argk[c] = k
                            argc[c] = cp
            slot = slot - 1 if slot > 0 else K - 1
        for c in range(C):
            alpha[c] = best[c] + (pe[p, c] if has_pe else 0.0)
        Alog[(p + 1) % K] = alpha
        if store:
            bp_k[p] = argk
            bp_c[p] = argc
    score, label = NINF, 0
    for c in range(C):
        if alpha[c] > score:
            score = alpha[c]
            label = c
    return score, label


@njit(cache=True, parallel=True)
def viterbi_batch(S, ps, pe, has_ps, has_pe, lengths, Tr, ph, D, store, bp_k, bp_c, scores, labels, starts):
    for i in prange(S.shape[0]):
        b = np.int64(i)
        bp = min(b, ps.shape[0] - 1)
        be = min(b, pe.shape[0] - 1)
        bs = min(b, bp_k.shape[0] - 1)
        score, label = viterbi_seq(S[b], ps[bp], pe[be], has_ps, has_pe, lengths[b], Tr, ph, D, store,
                                   bp_k[bs], bp_c[bs])
        scores[b] = score
        if store and score != NINF:
            traceback_seq(bp_k[b], bp_c[b], label, lengths[b], True, labels[b], starts[b])
