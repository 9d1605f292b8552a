"""The entropy and the cross-entropy term ``E_p[score_q]`` on the compiled CPU engine (numba), with
their gradients: the expectation semiring of ``torch_semimarkov.api.entropy._Entropy``, per sequence, in float64,
in the factored form for a (C, C) transition (below) and in the direct form for a (K, C, C) one
(:func:`_entropy_seq_direct`: a transition per duration, K (C, C) products per position). Masks
on p are its segment limits (the windows stop there); masks on q make ``E`` -inf wherever p
weighs a segment that q forbids (q's limits in the forward windows, its forbidden starts as -inf
start scores).

A "weight" model p gives the probabilities; a "value" model q (q = p for the entropy) gives the
scores inside the expectations. Per sequence of length L (ALGORITHM.md §2-§3 for the messages):

    u_s(c)  = lse_{c'} alpha_s(c') + Tr[c', c]       EU_s(c) = E_w[Ea_s(c') + Trq[c', c]]   (s = 0: lse_{c'} Trq[c', c])
    W_s(c)  = u_s(c) + ps_s(c) - S_s(c)               EW_s(c) = EU_s(c) + psq_s(c) - Sq_s(c)
    alpha_t(c) = S_t + pe_{t-1} + lse_k (W_{t-k}(c) + D[k-1, c])
    Ea_t(c) = Sq_t + peq_{t-1} + E_k[EW_{t-k}(c) + Dq[k-1, c]]

and backward the same with v_s / EV_s (segments starting at s) and beta_s / Eb_s; ``E = E_p[score_q]``
is the expectation of Ea at the end. Every weight of an expectation is exp(x - max x) over the same
window as its log-sum-exp, so a window costs K·C vectorised exponentials, once per pass.

Gradients (``dH = -d E_p[score_p]`` up to log Z's own, see ``engines/torch/dense.py`` ``_edge_gradients``): every
edge weighs ``mu (cond - E)`` with ``cond = E[score_q | edge]``: for a segment
``EW_s + Dq + EX_{s+k}`` (``EX_t = Sq_t + peq_{t-1} + Eb_t``), for a transition at s >= 1
``Ea_s(c') + Trq[c', c] + EV_s(c)``; their sums by start and end are
``q_start(s, c) = P_start (EU_s + EV_s - E)`` and ``q_end(t, c) = P_end (Ea_t + Eb_t - E)``. The
backward also returns the plain marginals (``E_p[d score]``, the cross-entropy's gradient for q).
The first segment's transition (its phantom predecessor) is left to the host: it weighs
``q_start(0, c)`` (or ``P_start(0, c)``) times the softmax of the model being differentiated.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

from torch_semimarkov.engines.numba.common import KERNEL, REDUCE, TINY, fexp, flog, fmax, limit_window, seq_row
from torch_semimarkov.engines.numba.engine import _Inputs, _lse, _run_batch, _scaled_exp

NINF = -np.inf


@njit(**REDUCE)
def _sums(y, e0, f0, n):
    """(sum y, sum y · (e0 + f0)) over k < n, with 0 · value = 0 (a reduction LLVM may reorder)."""
    s = 0.0
    e = 0.0
    for k in range(n):
        p = y[k]
        s += p
        e += p * (e0[k] + f0[k]) if p > 0.0 else 0.0
    return s, e


@njit(**KERNEL)
def _window(x0, d0, e0, f0, n, y):
    """Over k < n: log weights x = x0[k] + d0[k] and values e0[k] + f0[k]; returns (max x, sum of
    exp(x - max), sum of exp(x - max) · value) and leaves the weights exp(x - max) in y. (fexp's
    rounding steps must not be reassociated: it runs without fast-math, the sums with.)"""
    m = NINF
    for k in range(n):
        m = fmax(m, x0[k] + d0[k])
    if m == NINF:
        return m, 0.0, 0.0
    for k in range(n):
        y[k] = fexp((x0[k] + d0[k]) - m)
    s, e = _sums(y, e0, f0, n)
    return m, s, e


@njit(**KERNEL)
def _weighs_beyond(y, nq, n, m):
    """Whether a window of n durations with weights y gives weight to a duration q forbids (k >= nq)."""
    if m == NINF:
        return False
    for k in range(nq, n):
        if y[k] > 0.0:
            return True
    return False


@njit(inline="always")
def _set_alpha(A, Ea, t, c, m, sm, e, S, pe, has_pe, Sq, peq, has_peq):
    """alpha_t(c) and Ea_t(c) from a window's (max m, scaled sum sm, weighted sum e)."""
    if m == NINF:
        A[t, c] = NINF
        Ea[t, c] = 0.0
    else:
        A[t, c] = (S[t, c] + (pe[t - 1, c] if has_pe else 0.0)) + (m + math.log(sm))
        Ea[t, c] = (Sq[t, c] + (peq[t - 1, c] if has_peq else 0.0)) + e / sm


@njit(inline="always")
def _w_entry(u, eu, s, c, S, ps, has_ps, Sq, psq, has_psq):
    """(W, EW) of start s and label c from (u, EU): W = u + ps_s(c) - S_s(c), EW = EU + psq_s(c) -
    Sq_s(c) (0 where W is -inf)."""
    w = u + ((ps[s, c] if has_ps else 0.0) - S[s, c])
    return w, (eu + ((psq[s, c] if has_psq else 0.0) - Sq[s, c]) if w != NINF else 0.0)


@njit(**KERNEL)
def _forward_arrays(L, D, Dq):
    """What both forwards start from: DT, DqT (C, K) (p's and q's duration tables, transposed), the
    messages A, Ea (L+1, C) with alpha_0 = Ea_0 = 0, and the window limits klim, klimq (C,) of p and q."""
    K, C = D.shape
    A = np.empty((L + 1, C))
    Ea = np.empty((L + 1, C))
    for c in range(C):
        A[0, c] = 0.0
        Ea[0, c] = 0.0
    klim = np.empty(C, dtype=np.int64)
    klimq = np.empty(C, dtype=np.int64)
    return np.ascontiguousarray(D.T), np.ascontiguousarray(Dq.T), A, Ea, klim, klimq


@njit(**KERNEL)
def _alpha_window(t, WR, EWR, base, DT, DqT, lim, has_lim, limq, has_limq, klim, klimq, y, A, Ea, S, pe, has_pe, Sq,
                  peq, has_peq):
    """alpha_t and Ea_t (t >= 1) from the window of W and EW by end t: label c's duration k-1 at
    WR[c, base + k - 1] (EWR likewise), k up to p's limit; a duration beyond q's limit that p
    weighs makes Ea_t(c) -inf."""
    C, K = DT.shape
    limit_window(lim, has_lim, 0, t, min(K, t), klim)
    limit_window(limq, has_limq, 0, t, min(K, t), klimq)
    for c in range(C):
        n = klim[c]
        m, sm, e = _window(WR[c, base:base + n], DT[c, :n], EWR[c, base:base + n], DqT[c, :n], n, y)
        if has_limq and _weighs_beyond(y, klimq[c], n, m):
            e = NINF
        _set_alpha(A, Ea, t, c, m, sm, e, S, pe, has_pe, Sq, peq, has_peq)


@njit(**KERNEL)
def _log_z_and_expectation(a, ea):
    """(log Z, E) from the final alpha_L and Ea_L ((-inf, 0) where every alpha_L is -inf)."""
    m = NINF
    for c in range(a.shape[0]):
        m = max(m, a[c])
    if m == NINF:
        return NINF, 0.0
    sz = 0.0
    ez = 0.0
    for c in range(a.shape[0]):
        w = math.exp(a[c] - m)
        sz += w
        ez += w * ea[c] if w > 0.0 else 0.0
    return m + math.log(sz), ez / sz


@njit(inline="always")
def _end_marginal(t, c, beta, Eb, A, Ea, S, pe, has_pe, Sq, peq, has_peq, log_z, E, XT, EXT, p_end, q_end):
    """At an end t >= 1 with beta_t(c) and Eb_t(c) (0 and 0 at t = L): X_t(c), EX_t(c) and the
    plain and weighted end marginals of position t-1; returns the plain one."""
    XT[c, t] = S[t, c] + (pe[t - 1, c] if has_pe else 0.0) + beta
    EXT[c, t] = Sq[t, c] + (peq[t - 1, c] if has_peq else 0.0) + Eb
    pend = math.exp(A[t, c] + beta - log_z) if A[t, c] != NINF and beta != NINF else 0.0
    p_end[t - 1, c] = pend
    q_end[t - 1, c] = pend * ((Ea[t, c] + Eb) - E) if pend > 0.0 else 0.0
    return pend


@njit(**KERNEL)
def _forward_end(L, A, Ea, grads, S, pe, has_pe, Sq, peq, has_peq, p_end, q_end):
    """``(log Z, E, XT, EXT, backward)`` after a forward: log Z and E from alpha_L and Ea_L, and
    whether the backward runs (``grads``, log Z > -inf and E finite). If it does, XT and EXT
    (C, L+1) (X_t and EX_t by end t) come with column L, the sequence end (beta_L = Eb_L = 0),
    filled in, and the end marginals of position L-1 are written; else they are empty."""
    log_z, E = _log_z_and_expectation(A[L], Ea[L])
    if not grads or log_z == NINF or not math.isfinite(E):
        return log_z, E, np.empty((0, 0)), np.empty((0, 0)), False
    C = A.shape[1]
    XT = np.empty((C, L + 1))
    EXT = np.zeros((C, L + 1))
    for c in range(C):
        _end_marginal(L, c, 0.0, 0.0, A, Ea, S, pe, has_pe, Sq, peq, has_peq, log_z, E, XT, EXT, p_end, q_end)
    return log_z, E, XT, EXT, True


@njit(**KERNEL)
def _entropy_seq(S, ps, pe, has_ps, has_pe, lim, has_lim, L, Tr, D, ph,
                 Sq, psq, peq, has_psq, has_peq, limq, has_limq, Trq, Dq, phq,
                 grads, p_start, p_end, q_start, q_end, g_tr, g_db, w_tr, w_db):
    """(log Z, E_p[score_q]) of one sequence and, with ``grads``, the plain and weighted marginals
    (p_start / q_start (T, C) by start, p_end / q_end (T, C) by last position, g_tr / w_tr (C, C)
    over the transitions at s >= 1, g_db / w_db (K, C)); outputs are zero on entry. ph[c] and phq[c]
    are the phantom scores lse_{c'} Tr[c', c] of p and q; ``limq`` q's segment limits (a segment
    that p weighs and q forbids makes E -inf)."""
    K, C = D.shape
    DT, DqT, A, Ea, klim, klimq = _forward_arrays(L, D, Dq)
    U = np.empty((L, C))
    EU = np.empty((L, C))
    WR = np.empty((C, L))  # W_s at index L-1-s, so a window of ends t is one ascending slice
    EWR = np.zeros((C, L))
    y = np.empty(max(K, C))
    for s in range(L):
        for c in range(C):
            if s == 0:
                U[0, c] = ph[c]
                EU[0, c] = phq[c]
            else:
                m = NINF
                for cp in range(C):
                    m = max(m, A[s, cp] + Tr[cp, c])
                sw = 0.0
                ew = 0.0
                if m != NINF:
                    for cp in range(C):
                        w = fexp((A[s, cp] + Tr[cp, c]) - m)
                        sw += w
                        ew += w * (Ea[s, cp] + Trq[cp, c]) if w > 0.0 else 0.0
                U[s, c] = m + math.log(sw) if m != NINF else NINF
                EU[s, c] = ew / sw if sw > 0.0 else 0.0
            WR[c, L - 1 - s], EWR[c, L - 1 - s] = _w_entry(U[s, c], EU[s, c], s, c, S, ps, has_ps, Sq, psq, has_psq)
        _alpha_window(s + 1, WR, EWR, L - 1 - s, DT, DqT, lim, has_lim, limq, has_limq, klim, klimq, y, A, Ea, S, pe,
                      has_pe, Sq, peq, has_peq)
    log_z, E, XT, EXT, backward = _forward_end(L, A, Ea, grads, S, pe, has_pe, Sq, peq, has_peq, p_end, q_end)
    if not backward:
        return log_z, E
    # ---- backward: X_t = S_t + pe_{t-1} + beta_t and EX_t = Sq_t + peq_{t-1} + Eb_t, ascending
    v = np.empty(C)
    EV = np.empty(C)
    AdbT = np.zeros((C, K))
    GdbT = np.zeros((C, K))
    for s in range(L - 1, -1, -1):
        limit_window(lim, has_lim, 1, s, min(K, L - s), klim)
        for c in range(C):
            n = klim[c]
            m, sm, e = _window(XT[c, s + 1:s + 1 + n], DT[c, :n], EXT[c, s + 1:s + 1 + n], DqT[c, :n], n, y)
            head = (ps[s, c] if has_ps else 0.0) - S[s, c]
            headq = (psq[s, c] if has_psq else 0.0) - Sq[s, c]
            v[c] = head + (m + math.log(sm)) if m != NINF else NINF
            EV[c] = headq + e / sm if m != NINF else 0.0
            x = U[s, c] + v[c] - log_z
            pst = math.exp(x) if x != NINF else 0.0
            if pst == 0.0:
                continue
            p_start[s, c] = pst
            q_start[s, c] = pst * ((EU[s, c] + EV[c]) - E)
            # P_seg(s, k, c) = P_start(s, c) · y[k] / sm, its condition EW_s + Dq[k] + EX_{s+k}
            w = pst / sm
            ew = EWR[c, L - 1 - s] - E
            arow = AdbT[c, :n]
            grow = GdbT[c, :n]
            xrow = EXT[c, s + 1:s + 1 + n]
            drow = DqT[c, :n]
            for k in range(n):
                mu = w * y[k]
                grow[k] += mu
                arow[k] += mu * ((ew + drow[k]) + xrow[k]) if mu > 0.0 else 0.0
        if s == 0:
            break
        for cp in range(C):
            m = NINF
            for c in range(C):
                m = max(m, Tr[cp, c] + v[c])
            sb = 0.0
            eb = 0.0
            if m != NINF:
                for c in range(C):
                    wb = fexp((Tr[cp, c] + v[c]) - m)
                    sb += wb
                    eb += wb * (Trq[cp, c] + EV[c]) if wb > 0.0 else 0.0
            beta = m + math.log(sb) if m != NINF else NINF
            Eb = eb / sb if sb > 0.0 else 0.0
            _end_marginal(s, cp, beta, Eb, A, Ea, S, pe, has_pe, Sq, peq, has_peq, log_z, E, XT, EXT, p_end, q_end)
            if A[s, cp] == NINF:
                continue
            a = A[s, cp] - log_z
            ea = Ea[s, cp] - E
            grow = g_tr[cp]
            wrow = w_tr[cp]
            trow = Tr[cp]
            tqrow = Trq[cp]
            for c in range(C):
                mu = fexp((a + trow[c]) + v[c])
                grow[c] += mu
                wrow[c] += mu * ((ea + tqrow[c]) + EV[c]) if mu > 0.0 else 0.0
    for k in range(K):
        for c in range(C):
            g_db[k, c] = GdbT[c, k]
            w_db[k, c] = AdbT[c, k]
    return log_z, E


@njit(**KERNEL)
def entropy_batch(S, ps, pe, has_ps, has_pe, lim, has_lim, lengths, Tr, D, ph, Sq, psq, peq, has_psq, has_peq,
                  limq, has_limq, Trq, Dq, phq, grads, log_z, expected, p_start, p_end, q_start, q_end, g_tr, g_db,
                  w_tr, w_db, lo, hi):
    """_entropy_seq for sequences [lo, hi); per-sequence outputs (B, ...) or (1, ...) dummies
    without ``grads``."""
    for b in range(lo, hi):
        g = min(b, p_start.shape[0] - 1)
        log_z[b], expected[b] = _entropy_seq(
            S[b], seq_row(ps, b), seq_row(pe, b), has_ps, has_pe,
            seq_row(lim, b), has_lim, lengths[b], Tr, D, ph,
            Sq[b], seq_row(psq, b), seq_row(peq, b), has_psq, has_peq,
            seq_row(limq, b), has_limq, Trq, Dq, phq,
            grads, p_start[g], p_end[g], q_start[g], q_end[g], g_tr[g], g_db[g], w_tr[g], w_db[g])


# ---------------------------------------------------------------- (K, C, C) transitions
#
# A segment's transition depends on its duration, so the predecessor sum no longer factors out of
# the duration window: per start s and duration k, U^k_s(c) = lse_{c'} alpha_s(c') + Tr[k-1, c', c]
# (EU^k_s its expectation of Ea_s(c') + Trq[k-1, c', c]), K (C, C) products per position, formed in
# the linear domain against scaled tables (exp(Tr - column max) forward, exp(Tr - row max) backward)
# with every sum below TINY recomputed exactly in the log domain. The window then runs over
# W^k_{t-k}(c) = U^k_{t-k}(c) + ps - S, kept in a ring by the end t = s + k they serve.


@njit(**KERNEL)
def _col_sums(EA, EAE, eTr, eTrTq, acc, num):
    """acc[i] = sum_{c'} EA[c'] eTr[c', i] and num[i] = sum_{c'} EA[c'] eTr[c', i] (Ea[c'] + Trq[c', i])
    over i = (k-1)·C + c (EAE = EA · Ea, finite; eTrTq = eTr · Trq, 0 where eTr is)."""
    n = acc.shape[0]
    for i in range(n):
        acc[i] = 0.0
        num[i] = 0.0
    for cp in range(EA.shape[0]):
        e = EA[cp]
        if e != 0.0:
            ee = EAE[cp]
            row = eTr[cp]
            rq = eTrTq[cp]
            for i in range(n):
                acc[i] += e * row[i]
                num[i] += ee * row[i] + e * rq[i]


@njit(**KERNEL)
def _col_logs(a, tm, acc, num, U, EU):
    """U = a + tm + log(acc) and EU = num / acc where acc >= TINY (-inf / 0 where tm is -inf);
    returns whether some entry needs the exact log-domain sum (acc < TINY with tm finite)."""
    low = False
    for i in range(acc.shape[0]):
        x = acc[i]
        ok = x >= TINY
        U[i] = (a + tm[i]) + flog(x) if ok else NINF
        EU[i] = num[i] / x if ok else 0.0
        low = low or (not ok and tm[i] != NINF)
    return low


@njit(**KERNEL)
def _col_exact(A_s, Ea_s, Trk, Trqk, c):
    """(lse_{c'} A_s(c') + Trk[c', c], its expectation of Ea_s(c') + Trqk[c', c]) in the log domain."""
    C = A_s.shape[0]
    m = NINF
    for cp in range(C):
        m = max(m, A_s[cp] + Trk[cp, c])
    if m == NINF:
        return NINF, 0.0
    sw = 0.0
    ew = 0.0
    for cp in range(C):
        w = fexp((A_s[cp] + Trk[cp, c]) - m)
        sw += w
        ew += w * (Ea_s[cp] + Trqk[cp, c]) if w > 0.0 else 0.0
    return m + math.log(sw), ew / sw


@njit(**REDUCE)
def _row_sums(a, ev, trq, EV, z):
    """z = a · ev, (sum z, sum z (trq + EV)) with 0 · value = 0."""
    s = 0.0
    e = 0.0
    for i in range(z.shape[0]):
        w = a[i] * ev[i]
        z[i] = w
        s += w
        e += w * (trq[i] + EV[i]) if w > 0.0 else 0.0
    return s, e


@njit(**KERNEL)
def _row_edges(z, sc, ea, trq, EV, g, wt, colP, colW):
    """The edges from one predecessor label: mu = z · sc into g and colP, mu (ea + trq + EV) into wt and colW."""
    for i in range(z.shape[0]):
        mu = z[i] * sc
        g[i] += mu
        colP[i] += mu
        w = mu * ((ea + trq[i]) + EV[i]) if mu > 0.0 else 0.0
        wt[i] += w
        colW[i] += w


@njit(**KERNEL)
def _entropy_seq_direct(S, ps, pe, has_ps, has_pe, lim, has_lim, L, Tr, eTrC, tmC, eTrTqC, TrR, eTrR, tmR, D, ph,
                        Sq, psq, peq, has_psq, has_peq, limq, has_limq, Trq, TrqR, Dq, phq,
                        grads, p_start, p_end, q_start, q_end, g_tr, g_db, w_tr, w_db, p0, q0):
    """_entropy_seq for a (K, C, C) transition. Tables by source row [c', (k-1)·C + c] (C, K·C):
    TrR, TrqR the transitions, eTrC = exp(TrR - tmC) with tmC (K·C,) the max over c', eTrTqC =
    eTrC · TrqR (0 where eTrC is), eTrR = exp(TrR - tmR) with tmR (C,) the row max; ph, phq (K·C,)
    the phantom scores lse_{c'} Tr[k-1, c', c]. g_tr / w_tr (K, C, C) take the transitions at
    s >= 1; p0 / q0 (K, C) the first segment's plain and weighted marginals by duration (its
    transition share is the host's)."""
    K, C = D.shape
    KC = K * C
    DT, DqT, A, Ea, klim, klimq = _forward_arrays(L, D, Dq)
    WR = np.full((K, C, K), NINF)  # [t % K, c, k-1] = W^k_{t-k}(c)
    EWR = np.zeros((K, C, K))
    U = np.empty(KC)
    EU = np.empty(KC)
    EA = np.empty(C)
    EAE = np.empty(C)
    acc = np.empty(KC)
    num = np.empty(KC)
    y = np.empty(K)
    for s in range(L):
        if s == 0:
            for i in range(KC):
                U[i] = ph[i]
                EU[i] = phq[i]
        else:
            a = NINF
            for cp in range(C):
                a = max(a, A[s, cp])
            exact = False
            for cp in range(C):
                e = fexp(A[s, cp] - a) if a != NINF else 0.0
                EA[cp] = e
                EAE[cp] = e * Ea[s, cp] if e > 0.0 else 0.0
                exact = exact or (e > 0.0 and Ea[s, cp] == NINF)
            if a == NINF:
                for i in range(KC):
                    U[i] = NINF
                    EU[i] = 0.0
            else:
                _col_sums(EA, EAE, eTrC, eTrTqC, acc, num)
                low = _col_logs(a, tmC, acc, num, U, EU)
                for i in range(KC if exact or low else 0):
                    if tmC[i] != NINF and (exact or acc[i] < TINY):
                        U[i], EU[i] = _col_exact(A[s], Ea[s], Tr[i // C], Trq[i // C], i % C)
        for k in range(K):
            j = (s + 1 + k) % K
            for c in range(C):
                WR[j, c, k], EWR[j, c, k] = _w_entry(U[k * C + c], EU[k * C + c], s, c, S, ps, has_ps, Sq, psq, has_psq)
        j = (s + 1) % K
        _alpha_window(s + 1, WR[j], EWR[j], 0, DT, DqT, lim, has_lim, limq, has_limq, klim, klimq, y, A, Ea, S, pe,
                      has_pe, Sq, peq, has_peq)
    log_z, E, XT, EXT, backward = _forward_end(L, A, Ea, grads, S, pe, has_pe, Sq, peq, has_peq, p_end, q_end)
    if not backward:
        return log_z, E
    # ---- backward: X_t = S_t + pe_{t-1} + beta_t, EX_t likewise; per start s the segment values
    # V^k(c) = ps_s - S_s + D[k-1, c] + X_{s+k}(c) (flat index k·C + c), then per source row c'
    # beta_s(c') and every edge (s, k, c', c) with mu = exp(A_s(c') + Tr + V - log Z)
    V = np.empty(KC)
    EV = np.empty(KC)
    ev = np.empty(KC)
    z = np.empty(KC)
    colP = np.empty(KC)
    colW = np.empty(KC)
    GT = np.zeros((C, KC))
    WT = np.zeros((C, KC))
    for s in range(L - 1, -1, -1):
        limit_window(lim, has_lim, 1, s, min(K, L - s), klim)
        vm = NINF
        for c in range(C):
            head = (ps[s, c] if has_ps else 0.0) - S[s, c]
            headq = (psq[s, c] if has_psq else 0.0) - Sq[s, c]
            n = klim[c]
            for k in range(K):
                i = k * C + c
                v = head + D[k, c] + XT[c, s + 1 + k] if k < n else NINF
                V[i] = v
                EV[i] = headq + Dq[k, c] + EXT[c, s + 1 + k] if v != NINF else 0.0
                vm = max(vm, v)
        for i in range(KC):
            colP[i] = 0.0
            colW[i] = 0.0
        if s == 0:
            for i in range(KC):
                x = ph[i] + V[i] - log_z
                pst = math.exp(x) if x != NINF else 0.0
                if pst > 0.0:
                    colP[i] = pst
                    colW[i] = pst * ((phq[i] + EV[i]) - E)
                p0[i // C, i % C] = colP[i]
                q0[i // C, i % C] = colW[i]
        else:
            for i in range(KC):
                ev[i] = fexp(V[i] - vm) if vm != NINF else 0.0
            for cp in range(C):
                ref, rs, rn = NINF, 0.0, 0.0
                if vm != NINF and tmR[cp] != NINF:
                    rs, rn = _row_sums(eTrR[cp], ev, TrqR[cp], EV, z)
                    ref = tmR[cp] + vm
                    if rs < TINY:  # the same sums in the log domain
                        ref, rs, rn = _window(TrR[cp], V, TrqR[cp], EV, KC, z)
                beta = ref + math.log(rs) if rs > 0.0 else NINF
                Eb = rn / rs if rs > 0.0 else 0.0
                pend = _end_marginal(s, cp, beta, Eb, A, Ea, S, pe, has_pe, Sq, peq, has_peq, log_z, E, XT, EXT, p_end,
                                     q_end)
                if pend == 0.0:
                    continue
                _row_edges(z, math.exp((A[s, cp] + ref) - log_z), Ea[s, cp] - E, TrqR[cp], EV, GT[cp], WT[cp],
                           colP, colW)
        for c in range(C):
            sp = 0.0
            sq = 0.0
            for k in range(K):
                sp += colP[k * C + c]
                sq += colW[k * C + c]
                g_db[k, c] += colP[k * C + c]
                w_db[k, c] += colW[k * C + c]
            p_start[s, c] = sp
            q_start[s, c] = sq
    for k in range(K):
        for cp in range(C):
            for c in range(C):
                g_tr[k, cp, c] = GT[cp, k * C + c]
                w_tr[k, cp, c] = WT[cp, k * C + c]
    return log_z, E


@njit(**KERNEL)
def entropy_batch_direct(S, ps, pe, has_ps, has_pe, lim, has_lim, lengths, Tr, eTrC, tmC, eTrTqC, TrR, eTrR, tmR, D,
                         ph, Sq, psq, peq, has_psq, has_peq, limq, has_limq, Trq, TrqR, Dq, phq, grads, log_z,
                         expected, p_start, p_end, q_start, q_end, g_tr, g_db, w_tr, w_db, p0, q0, lo, hi):
    """_entropy_seq_direct for sequences [lo, hi)."""
    for b in range(lo, hi):
        g = min(b, p_start.shape[0] - 1)
        log_z[b], expected[b] = _entropy_seq_direct(
            S[b], seq_row(ps, b), seq_row(pe, b), has_ps, has_pe,
            seq_row(lim, b), has_lim, lengths[b], Tr, eTrC, tmC, eTrTqC, TrR, eTrR, tmR, D, ph,
            Sq[b], seq_row(psq, b), seq_row(peq, b), has_psq, has_peq,
            seq_row(limq, b), has_limq, Trq, TrqR, Dq, phq,
            grads, p_start[g], p_end[g], q_start[g], q_end[g], g_tr[g], g_db[g], w_tr[g], w_db[g], p0[g], q0[g])


def _direct_tables(Tr: np.ndarray, Trq: np.ndarray):
    """The scaled tables of :func:`_entropy_seq_direct` for p's (K, C, C) transition Tr and q's Trq."""
    K, C, _ = Tr.shape
    row = lambda x: np.ascontiguousarray(x.transpose(1, 0, 2).reshape(C, K * C))  # noqa: E731
    TrR, TrqR = row(Tr), row(Trq)
    tmC = TrR.max(0)
    eTrC = np.ascontiguousarray(_scaled_exp(TrR, np.where(tmC == -np.inf, 0.0, tmC)[None, :]))
    with np.errstate(invalid="ignore"):
        eTrTqC = np.ascontiguousarray(np.where(eTrC > 0, eTrC * TrqR, 0.0))
    tmR = TrR.max(1)
    eTrR = np.ascontiguousarray(_scaled_exp(TrR, np.where(tmR == -np.inf, 0.0, tmR)[:, None]))
    return tmC, eTrC, eTrTqC, TrR, eTrR, tmR, TrqR


def _softmax0(Tr: np.ndarray) -> np.ndarray:
    """softmax over the source label of each column Tr[..., :, c] ((C, C) or (K, C, C)), 0 where a
    column is all -inf."""
    m = Tr.max(-2, keepdims=True)
    e = _scaled_exp(Tr, np.where(m == -np.inf, 0.0, m))
    tot = e.sum(-2, keepdims=True)
    return e / np.where(tot > 0, tot, 1.0)


def _relative(x: _Inputs) -> np.ndarray:
    """Replace ``x.S`` by ``S_t(c) - r_t`` with the per-position reference r_t = mean_c S_t(c) and
    return ``r_L - r_0`` per sequence (B,).

    Adding a constant to every label's score at a position adds it to every segment that ends
    there and subtracts it from every segment that starts there: a segmentation's score changes by
    ``r_L - r_0`` whatever it is, so the probabilities and every ``E[score | edge] - E`` stay put,
    while log Z and E move by that amount. Cumulative scores grow with t (to 3e6 at a per-position
    size of 1e4 over 300 positions); as they are, every step of the prefix and suffix expectations
    rounds a number of that size and the errors add up along the sequence (transition and duration
    gradients off by 3e-6 there). Relative to the reference the messages hold only the scores'
    spread over labels, S_t(c) - r_t is computed once per entry (exactly where the labels' scores are
    within a factor 2 of each other), and only the final sums see r_L.
    """
    S = x.S
    ref = S.mean(2)
    x.S = np.ascontiguousarray(S - ref[:, :, None])
    return ref[np.arange(x.B), x.lengths] - ref[:, 0]


def expected_score_numba(p_args, q_args=None, masks=None, grads=False, q_masks=None):
    """log Z_p and ``E_p[score_q]`` (q = p by default) on the compiled CPU engine, with the marginals.

    Args:
        p_args, q_args: ``(cum_scores, transition (C, C) or (K, C, C), duration_bias, lengths, K,
            proj_start, proj_end)`` of the weight model p and the value model q (validated CPU
            tensors of the same shapes; q = p when None).
        masks, q_masks: p's and q's segment limits ``(min_start, max_end, forbidden_start)`` or
            None. A segment that p weighs and q forbids makes ``E`` -inf.
        grads: also return the marginals.

    Returns:
        ``(log_z (B,), expected (B,))`` float64 tensors and, with ``grads``, ``(plain, weighted)``:
        each ``(p_start, p_end, g_tr, g_db)`` (B, T, C), (B, T, C), (B, C, C) or (B, K, C, C),
        (B, K, C) float64, ``plain`` the posterior marginals P with the first segment's transition
        share by q's softmax (the gradient of ``E_p[score_q]`` with respect to q's inputs),
        ``weighted`` the edge weights ``P (E[score_q | edge] - E)`` summed the same way (the first
        segment's share by p's softmax). Both are zero for a sequence whose E is not finite.

    Example:
        >>> cum = torch.nn.functional.pad(torch.randn(1, 8, 2).cumsum(1), (0, 0, 1, 0)).double()
        >>> args = (cum, torch.zeros(2, 2), torch.zeros(3, 2), torch.tensor([8]), 3, None, None)
        >>> log_z, E = expected_score_numba(args)
        >>> bool(log_z - E > 0)  # the entropy
        True
    """
    x = _Inputs(*p_args, masks=masks)
    xq = x if q_args is None and q_masks is None else _Inputs(*(p_args if q_args is None else q_args), masks=q_masks)
    # each model's scores relative to a per-position reference (see _relative): the recurrences
    # run on small numbers and log Z / E get the references' telescoped sum back at the end
    ref_p = _relative(x)
    ref_q = ref_p if xq is x else _relative(xq)
    B, T, C, K = x.B, x.T, x.C, x.K
    n = B if grads else 1
    tr_shape = tuple(x.Tr.shape)
    outs = [np.zeros((n, T, C)) for _ in range(4)] + [np.zeros((n,) + tr_shape), np.zeros((n, K, C)),
                                                     np.zeros((n,) + tr_shape), np.zeros((n, K, C))]
    log_z, expected = np.empty(B), np.empty(B)
    q_head = (xq.S, xq.ps, xq.pe, xq.has_ps, xq.has_pe, xq.lim, xq.has_lim and xq is not x)
    if x.direct:
        p0, q0 = np.zeros((n, K, C)), np.zeros((n, K, C))
        tmC, eTrC, eTrTqC, TrR, eTrR, tmR, TrqR = _direct_tables(x.Tr, xq.Tr)
        _run_batch(entropy_batch_direct, B, 3.0 * x.work(), *x.head(), x.Tr, eTrC, tmC, eTrTqC, TrR, eTrR, tmR, x.D,
                   _lse(x.Tr, 1).ravel(), *q_head, xq.Tr, TrqR, xq.D, _lse(xq.Tr, 1).ravel(), grads, log_z, expected,
                   *outs, p0, q0)
    else:
        _run_batch(entropy_batch, B, 3.0 * x.work(), *x.head(), x.Tr, x.D, _lse(x.Tr, 0), *q_head, xq.Tr, xq.D,
                   _lse(xq.Tr, 0), grads, log_z, expected, *outs)
    log_z += ref_p
    expected += ref_q
    res = (torch.from_numpy(log_z), torch.from_numpy(expected))
    if not grads:
        return res
    p_start, p_end, q_start, q_end, g_tr, g_db, w_tr, w_db = outs
    # the first segment's phantom predecessor: its marginal (by duration for (K, C, C)) times the
    # softmax over the source label of the model being differentiated
    if not x.direct:
        p0, q0 = p_start[:, 0], q_start[:, 0]
    g_tr += p0[..., None, :] * _softmax0(xq.Tr)[None]
    w_tr += q0[..., None, :] * _softmax0(x.Tr)[None]
    bad = ~np.isfinite(expected)
    for a in outs:
        a[bad] = 0.0
    t = torch.from_numpy
    return res + ((t(p_start), t(p_end), t(g_tr), t(g_db)), (t(q_start), t(q_end), t(w_tr), t(w_db)))
