"""Compiled CPU kernels (numba) for a static (C, C) transition: the factored recurrence.

Per sequence, in float64, following ALGORITHM.md §2-§4 (``docs/internals.md`` §8 explains the
scaled rings of :mod:`.numba_common`):

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
Each ``*_batch`` function runs its sequences in parallel (``prange``); each sequence's work is
sequential and writes only its own outputs, so results do not depend on the thread count.
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
        for c in range(C):
            linu[c] += e * eTr[cp, c]
    for c in range(C):
        if tmax[c] == NINF:
            u[c] = NINF
        elif linu[c] >= TINY:
            u[c] = ma + tmax[c] + math.log(linu[c])
        else:
            m, s = NINF, 0.0
            for cp in range(C):
                m, s = lse_update(m, s, alpha[cp] + Tr[cp, c])
            u[c] = lse_finish(m, s)


@njit(cache=True)
def _window_forward(p, S, pe, has_pe, Vlog, lin, H, D, eD, Dm, alpha, acc, mx):
    """alpha_{p+1}(c) = S_{p+1} + pe_p + lse_k (V_{p+1-k}(c) + D[k-1, c]), written into alpha."""
    K, C = lin.shape
    kmax = min(K, p + 1)
    for c in range(C):
        acc[c] = 0.0
        mx[c] = 0.0
    slot = p % K
    for k in range(kmax):
        for c in range(C):
            v = lin[slot, c]
            acc[c] += v * eD[k, c]
            mx[c] = max(mx[c], v)
        slot = slot - 1 if slot > 0 else K - 1
    for c in range(C):
        base = S[p + 1, c] + (pe[p, c] if has_pe else 0.0)
        if Dm[c] == NINF:
            alpha[c] = NINF
        elif acc[c] >= TINY:
            alpha[c] = base + H[c] + Dm[c] + math.log(acc[c])
        else:
            m, s = NINF, 0.0
            slot = p % K
            for k in range(kmax):
                m, s = lse_update(m, s, Vlog[slot, c] + D[k, c])
                slot = slot - 1 if slot > 0 else K - 1
            alpha[c] = base + lse_finish(m, s)
        if mx[c] < LOW:
            ring_rebase(Vlog, lin, H, c)


@njit(cache=True)
def _insert_v(p, S, ps, has_ps, u, Vlog, lin, H, vals):
    """Ring row of start position p: V_p = u_p + ps_p - S_p."""
    K, C = Vlog.shape
    for c in range(C):
        vals[c] = (u[c] + (ps[p, c] if has_ps else 0.0)) - S[p, c]
    ring_insert(Vlog, lin, H, p % K, vals)


@njit(cache=True)
def forward_seq(S, ps, pe, has_ps, has_pe, L, Tr, eTr, tmax, D, eD, Dm, interval, save, ck):
    """log Z of one sequence of length L; with ``save``, checkpoints ck[i] = (V ring, alpha) at i·interval.

    The scaled ring is re-referenced at every checkpoint position, so a recompute that starts from
    a checkpoint repeats the forward's arithmetic exactly.
    """
    K, C = D.shape
    Vlog, lin, H = prepare_ring(K, C)
    alpha = np.zeros(C)
    u, ea, linu = np.empty(C), np.empty(C), np.empty(C)
    acc, mx, vals = np.empty(C), np.empty(C), np.empty(C)
    for p in range(L + 1):
        if p % interval == 0:
            if p > 0:
                ring_rebase_all(Vlog, lin, H)
            if save:
                i = p // interval
                ck[i, :K] = Vlog
                ck[i, K] = alpha
        if p == L:
            break
        _u_part(alpha, Tr, eTr, tmax, u, ea, linu)
        _insert_v(p, S, ps, has_ps, u, Vlog, lin, H, vals)
        _window_forward(p, S, pe, has_pe, Vlog, lin, H, D, eD, Dm, alpha, acc, mx)
    m, s = NINF, 0.0
    for c in range(C):
        m, s = lse_update(m, s, alpha[c])
    return lse_finish(m, s)


@njit(cache=True, parallel=True)
def forward_batch(S, ps, pe, has_ps, has_pe, lengths, Tr, eTr, tmax, D, eD, Dm, interval, save, ck, out):
    """forward_seq for every sequence: S (B, T+1, C), ps/pe (B, T, C) or (1, 1, C) dummies, ck (B, N, K+1, C)."""
    for i in prange(S.shape[0]):
        b = np.int64(i)
        bp = min(b, ps.shape[0] - 1)
        be = min(b, pe.shape[0] - 1)
        bc = min(b, ck.shape[0] - 1)
        out[b] = forward_seq(S[b], ps[bp], pe[be], has_ps, has_pe, lengths[b], Tr, eTr, tmax, D, eD, Dm,
                             interval, save, ck[bc])


@njit(cache=True)
def backward_seq(S, ps, pe, has_ps, has_pe, L, logZ, Tr, eTr, tmax, eTrRT, tmaxR, D, eD, Dm, interval, ck,
                 grads, p_start, p_end, g_tr, g_db):
    """Marginals and per-sequence parameter gradients of one sequence (outputs start at zero).

    Walks the checkpoint intervals from the last; in each, recomputes alpha and u from the
    checkpoint into interval buffers, then runs the beta recurrence down through the interval with
    a scaled ring of Y_t = S_t + pe_{t-1} + beta_t carried across intervals. eTrRT[c, c'] is
    exp(Tr[c', c] - tmaxR[c']) (row-normalised, stored transposed for a vectorised product).
    """
    if logZ == NINF:
        return
    K, C = D.shape
    n_ck = L // interval + 1
    Vlog, lin, H = prepare_ring(K, C)
    Ylog, liny, Hy = prepare_ring(K, C)
    alpha = np.empty(C)
    A = np.empty((interval + 1, C))  # alpha_s
    U = np.empty((interval + 1, C))  # u_s
    EA = np.empty((interval + 1, C))  # exp(alpha_s - max)
    LU = np.empty((interval + 1, C))  # linear sums of u_s (< TINY: exact column)
    acc, mx, vals = np.empty(C), np.empty(C), np.empty(C)
    v, beta, ev, linb = np.empty(C), np.empty(C), np.empty(C), np.empty(C)
    w, r, pst = np.empty(C), np.empty(C), np.empty(C)
    ok = np.empty(C, dtype=np.bool_)
    Atr = np.zeros((C, C))
    Gtr = np.zeros((C, C))
    Adb = np.zeros((K, C))
    Gdb = np.zeros((K, C))
    for i in range(n_ck - 1, -1, -1):
        t0 = i * interval
        t1 = min(t0 + interval, L + 1)
        Vlog[:] = ck[i, :K]
        alpha[:] = ck[i, K]
        ring_rebase_all(Vlog, lin, H)
        for p in range(t0, t1):
            j = p - t0
            A[j, :] = alpha
            if p < L:
                _u_part(alpha, Tr, eTr, tmax, U[j], EA[j], LU[j])
                if p + 1 < t1:
                    _insert_v(p, S, ps, has_ps, U[j], Vlog, lin, H, vals)
                    _window_forward(p, S, pe, has_pe, Vlog, lin, H, D, eD, Dm, alpha, acc, mx)
        for s in range(t1 - 1, t0 - 1, -1):
            j = s - t0
            if s == L:
                for c in range(C):
                    vals[c] = S[L, c] + (pe[L - 1, c] if has_pe else 0.0)
                    p_end[L - 1, c] = math.exp(A[j, c] - logZ)
                ring_insert(Ylog, liny, Hy, L % K, vals)
                continue
            # v_s(c) = ps_s - S_s + lse_k (D[k-1, c] + Y_{s+k}(c))
            kmax = min(K, L - s)
            for c in range(C):
                acc[c] = 0.0
                mx[c] = 0.0
            slot = (s + 1) % K
            for k in range(kmax):
                for c in range(C):
                    y = liny[slot, c]
                    acc[c] += y * eD[k, c]
                    mx[c] = max(mx[c], y)
                slot = slot + 1 if slot < K - 1 else 0
            for c in range(C):
                base = (ps[s, c] if has_ps else 0.0) - S[s, c]
                ok[c] = False
                if Dm[c] == NINF:
                    v[c] = NINF
                elif acc[c] >= TINY:
                    v[c] = base + Hy[c] + Dm[c] + math.log(acc[c])
                    ok[c] = True
                else:
                    m, sm = NINF, 0.0
                    slot = (s + 1) % K
                    for k in range(kmax):
                        m, sm = lse_update(m, sm, Ylog[slot, c] + D[k, c])
                        slot = slot + 1 if slot < K - 1 else 0
                    v[c] = base + lse_finish(m, sm)
            for c in range(C):
                pst[c] = fexp(U[j, c] + v[c] - logZ)
                p_start[s, c] = pst[c]
            if grads:
                # duration gradient: P_seg(s, k, c) = P_start(s, c) · lin_y[s+k, c] · eD[k-1, c] / acc[c]
                for c in range(C):
                    w[c] = pst[c] / acc[c] if ok[c] else 0.0
                slot = (s + 1) % K
                for k in range(kmax):
                    for c in range(C):
                        Adb[k, c] += liny[slot, c] * w[c]
                    slot = slot + 1 if slot < K - 1 else 0
                for c in range(C):
                    if ok[c] or pst[c] == 0.0:
                        continue
                    head = U[j, c] + (ps[s, c] if has_ps else 0.0) - S[s, c] - logZ
                    slot = (s + 1) % K
                    for k in range(kmax):
                        Gdb[k, c] += math.exp(head + D[k, c] + Ylog[slot, c])
                        slot = slot + 1 if slot < K - 1 else 0
                # transition gradient: P_trans(s, c', c) = exp(alpha_s(c') - max) · eTr[c', c] · P_start(s, c) / linu(c)
                for c in range(C):
                    r[c] = pst[c] / LU[j, c] if LU[j, c] >= TINY else 0.0
                for cp in range(C):
                    e = EA[j, cp]
                    for c in range(C):
                        Atr[cp, c] += e * r[c]
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
                if mv == NINF:
                    for c in range(C):
                        beta[c] = NINF
                else:
                    for c in range(C):
                        ev[c] = fexp(v[c] - mv)
                        linb[c] = 0.0
                    for c in range(C):
                        e = ev[c]
                        for cp in range(C):
                            linb[cp] += eTrRT[c, cp] * e
                    for cp in range(C):
                        if tmaxR[cp] == NINF:
                            beta[cp] = NINF
                        elif linb[cp] >= TINY:
                            beta[cp] = mv + tmaxR[cp] + math.log(linb[cp])
                        else:
                            m, sm = NINF, 0.0
                            for c in range(C):
                                m, sm = lse_update(m, sm, Tr[cp, c] + v[c])
                            beta[cp] = lse_finish(m, sm)
                for c in range(C):
                    p_end[s - 1, c] = fexp(A[j, c] + beta[c] - logZ)
                    vals[c] = S[s, c] + (pe[s - 1, c] if has_pe else 0.0) + beta[c]
                ring_insert(Ylog, liny, Hy, s % K, vals)
            for c in range(C):
                if mx[c] < LOW:
                    ring_rebase(Ylog, liny, Hy, c)
    if grads:
        for cp in range(C):
            for c in range(C):
                g_tr[cp, c] = eTr[cp, c] * Atr[cp, c] + Gtr[cp, c]
        for k in range(K):
            for c in range(C):
                g_db[k, c] = eD[k, c] * Adb[k, c] + Gdb[k, c]


@njit(cache=True, parallel=True)
def backward_batch(S, ps, pe, has_ps, has_pe, lengths, logZ, Tr, eTr, tmax, eTrRT, tmaxR, D, eD, Dm, interval, ck,
                   grads, p_start, p_end, g_tr, g_db):
    """backward_seq for every sequence; p_start/p_end (B, T, C), g_tr (B, C, C), g_db (B, K, C), all zero on entry."""
    for i in prange(S.shape[0]):
        b = np.int64(i)
        bp = min(b, ps.shape[0] - 1)
        be = min(b, pe.shape[0] - 1)
        bg = min(b, g_tr.shape[0] - 1)
        backward_seq(S[b], ps[bp], pe[be], has_ps, has_pe, lengths[b], logZ[b], Tr, eTr, tmax, eTrRT, tmaxR,
                     D, eD, Dm, interval, ck[b], grads, p_start[b], p_end[b], g_tr[bg], g_db[bg])


@njit(cache=True)
def viterbi_seq(S, ps, pe, has_ps, has_pe, L, Tr, u0, D, store, bp_k, bp_c):
    """Best score of one sequence; with ``store``, backpointers bp_k[t-1, c] (duration - 1) and
    bp_c[s, c] (predecessor label of a segment starting at s). Returns (score, final label)."""
    K, C = D.shape
    Uring = np.full((K, C), NINF)
    alpha = np.zeros(C)
    u = np.empty(C)
    best = np.empty(C)
    arg = np.empty(C, dtype=np.int32)
    for p in range(L):
        if p == 0:
            u[:] = u0
            arg[:] = 0
        else:
            for c in range(C):
                best[c] = NINF
                arg[c] = 0
            for cp in range(C):
                a = alpha[cp]
                for c in range(C):
                    val = a + Tr[cp, c]
                    if val > best[c]:
                        best[c] = val
                        arg[c] = cp
            u[:] = best
        if store:
            bp_c[p] = arg
        slot = p % K
        for c in range(C):
            Uring[slot, c] = u[c] + (ps[p, c] if has_ps else 0.0)
        for c in range(C):
            best[c] = NINF
            arg[c] = 0
        for k in range(min(K, p + 1)):
            s = p - k
            for c in range(C):
                val = (Uring[slot, c] + (S[p + 1, c] - S[s, c])) + D[k, c]
                if val > best[c]:
                    best[c] = val
                    arg[c] = k
            slot = slot - 1 if slot > 0 else K - 1
        for c in range(C):
            alpha[c] = best[c] + (pe[p, c] if has_pe else 0.0)
        if store:
            bp_k[p] = arg
    score, label = NINF, 0
    for c in range(C):
        if alpha[c] > score:
            score = alpha[c]
            label = c
    return score, label


@njit(cache=True, parallel=True)
def viterbi_batch(S, ps, pe, has_ps, has_pe, lengths, Tr, u0, D, store, bp_k, bp_c, scores, labels, starts):
    """viterbi_seq and traceback for every sequence: labels (B, T) int64 filled with -1, starts (B, T) False."""
    for i in prange(S.shape[0]):
        b = np.int64(i)
        bp = min(b, ps.shape[0] - 1)
        be = min(b, pe.shape[0] - 1)
        bs = min(b, bp_k.shape[0] - 1)
        score, label = viterbi_seq(S[b], ps[bp], pe[be], has_ps, has_pe, lengths[b], Tr, u0, D, store,
                                   bp_k[bs], bp_c[bs])
        scores[b] = score
        if store and score != NINF:
            traceback_seq(bp_k[b], bp_c[b], label, lengths[b], False, labels[b], starts[b])
