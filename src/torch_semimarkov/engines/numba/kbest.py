"""k-best segmentations on the compiled CPU engine (numba): the PyTorch path's k-best Viterbi, compiled.

:func:`topk_numba` runs, per sequence, exactly the recurrence of the float64 PyTorch path of
:func:`~torch_semimarkov.semi_crf_streaming_topk` on the same padded float64 model
(:class:`torch_semimarkov.engines.torch.dense._Model`: segment scores summed in the same order, masks as the same
smallest starts, the first segment's phantom predecessor C): each (position, label) keeps its k
best prefixes. Of the K·(C+1) (duration, predecessor label) pairs, the k with the best first
entries (ties toward the smaller pair) give the k·k candidates, of which the k best are kept (ties
toward the smaller (pair, rank) index); at the end the k best over (label, rank) (ties toward the
smaller index), traced back through the backpointers. So scores, labels and ties equal the
PyTorch path's, bit for bit. For a (C, C) transition, durations whose bound cannot reach the
current k-th candidate are skipped (:func:`_kbest_seq_factored`). Sequences run in parallel (:func:`.engine._run_batch`); each
is computed start to end by one call, so results do not depend on the thread count.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from torch_semimarkov.engines.numba.common import KERNEL, REDUCE, fmax
from torch_semimarkov.engines.numba.engine import _run_batch


@njit(**KERNEL)
def _better(va, ia, vb, ib):
    """(va, ia) ranks before (vb, ib): larger value, then smaller index."""
    return va > vb or (va == vb and ia < ib)


@njit(**KERNEL)
def _kbest_seq(S, ps, pe, D, TrK, sa, ea, min_start, has_min, L, k, V, bp, seg, e, heads, pairs, cv, ci, sl):
    """The k-best forward of one sequence (padded index p + K): the k best prefix scores of each
    (position, label) in V, a ring (K+1, C+1, k) indexed by p % (K+1) (column C: the phantom start
    at position 0), their backpointers in bp (P, C, k) up to position L."""
    K, C = D.shape
    C1 = C + 1
    n_pairs = K * C1
    kp = min(k, n_pairs)
    R = V.shape[0]  # a ring of K + 1 positions: p is read only by p + 1 .. p + K
    V[:] = -np.inf
    V[K % R, C, 0] = 0.0
    for t in range(1, L + 1):
        i = t + K
        wi = i % R
        V[wi, C, :] = -np.inf  # the slot's old position may have been 0 (the phantom start)
        for kk in range(K):  # the ring slot of position t - kk - 1 (no division in the loop)
            x = wi - (kk + 1)
            sl[kk] = x if x >= 0 else x + R
        for kk in range(K):
            s = i - (kk + 1)
            for c in range(C):
                x = S[i, c] - S[s, c] + D[kk, c] + ps[s, c] + pe[i, c]
                x = x + sa[s] + ea[i]
                if has_min and t - (kk + 1) < min_start[i, c]:
                    x = -np.inf
                seg[kk, c] = x
        for c in range(C):
            # edges and heads of every pair (duration kk+1, predecessor cp), pair = kk*(C+1) + cp
            for kk in range(K):
                s = i - (kk + 1)
                for cp in range(C1):
                    j = kk * C1 + cp
                    e[j] = seg[kk, c] + TrK[kk, cp, c]
                    heads[j] = V[sl[kk], cp, 0] + e[j]
            # the kp best pairs by head (ties: the smaller pair), then in ascending pair order
            n = 0
            for j in range(n_pairs):
                if n == kp and not _better(heads[j], j, heads[pairs[n - 1]], pairs[n - 1]):
                    continue
                m = n if n < kp else kp - 1
                while m > 0 and _better(heads[j], j, heads[pairs[m - 1]], pairs[m - 1]):
                    pairs[m] = pairs[m - 1]
                    m -= 1
                pairs[m] = j
                if n < kp:
                    n += 1
            pairs[:kp].sort()
            # the k best of their kp·k candidates (ties: the smaller (pair, rank) flat index)
            n = 0
            for jj in range(kp):
                j = pairs[jj]
                kk = j // C1
                cp = j - kk * C1
                s = i - (kk + 1)
                for r in range(k):
                    v = V[sl[kk], cp, r] + e[j]
                    f = j * k + r
                    if n == k and not _better(v, f, cv[n - 1], ci[n - 1]):
                        continue
                    n = _insert(v, f, n, k, cv, ci)
            for r in range(k):
                V[wi, c, r] = cv[r]
                bp[i, c, r] = ci[r]


@njit(**KERNEL)
def _insert(v, f, n, k, cv, ci):
    """Insert candidate (v, f) into the sorted list cv / ci of its n <= k best entries (when n == k,
    the caller has checked that it beats the k-th, which drops out); returns the new n."""
    m = n if n < k else k - 1
    while m > 0 and _better(v, f, cv[m - 1], ci[m - 1]):
        cv[m] = cv[m - 1]
        ci[m] = ci[m - 1]
        m -= 1
    cv[m] = v
    ci[m] = f
    return n + 1 if n < k else n


@njit(**KERNEL)
def _take_segment(kk, c, x, n, k, TrK, V, sl, cv, ci):
    """Insert the candidates of duration kk + 1 (segment score x) into label c's list of its n
    best; returns the new n."""
    C1 = TrK.shape[1]
    s = sl[kk]
    for cp in range(C1):
        ep = x + TrK[kk, cp, c]
        j = kk * C1 + cp
        for r in range(k):
            v = V[s, cp, r] + ep
            if v == -np.inf:
                break
            f = j * k + r
            if n == k and not _better(v, f, cv[k - 1], ci[k - 1]):
                break  # the later ranks of this pair are no better
            n = _insert(v, f, n, k, cv, ci)
    return n


@njit(**KERNEL)
def _segment_rows(SRf, psRf, saR, DTf, Mf, P, q0, K, C, S_end, pe_end, ea_end, first, has_min, min_s, segf, bndf,
                  plain):
    """Every label's segment scores of durations 1..K ending at one position, and their bounds, into
    segf / bndf (C·K, label-major): reversed-time rows (index q0 + kk of a label's row is the start
    of duration kk + 1), added in the PyTorch path's order; starts before ``min_s[c]`` are -inf
    (``first`` is the start of duration 1). Offsets are unsigned, so that numba checks no negative
    index and the loop vectorises. ``plain``: the projections and the start / end additions are
    all zero, and adding those zeros one after the other gives what adding one zero does (-0.0
    becomes 0.0, nothing else changes)."""
    uK = np.uint64(K)
    for c in range(C):
        row = np.uint64(c * P + q0)
        out = np.uint64(c * K)
        se = S_end[c]
        pe_c = pe_end[c]
        ms = min_s[c]
        for kk in range(uK):
            q = row + kk
            d = out + kk
            if plain:
                x = (se - SRf[q] + DTf[d]) + 0.0
                x = x if first - np.int64(kk) >= 0 else -np.inf  # a start before the sequence's
            else:
                x = se - SRf[q] + DTf[d] + psRf[q] + pe_c
                x = x + saR[np.uint64(q0) + kk] + ea_end
            if has_min:
                x = x if first - np.int64(kk) >= ms else -np.inf
            segf[d] = x
            bndf[d] = Mf[q] + x


@njit(**REDUCE)
def _row_max(x, n):
    """max of x[:n] (exact in any order)."""
    m = -np.inf
    for j in range(n):
        m = fmax(m, x[j])
    return m


@njit(**REDUCE)
def _row_absmax(x, n):
    """The largest finite |x[j]|, j < n (0 if none)."""
    m = 0.0
    for j in range(n):
        a = abs(x[j])
        m = fmax(m, a if a < np.inf else 0.0)
    return m


@njit(**REDUCE)
def _row_count_ge(x, n, lim):
    """How many x[j] >= lim, j < n."""
    h = 0
    for j in range(n):
        h += 1 if x[j] >= lim else 0
    return h


@njit(**KERNEL)
def _kbest_seq_factored(S, ps, pe, D, TrK, tr_abs, sa, ea, min_start, has_min, L, k, V, bp, M, Mi, seg, bnd, cv, ci,
                        sl, best, SR, psR, saR, DT):
    """:func:`_kbest_seq` for a (C, C) transition (every row of TrK the same), pruned: a start
    position s bounds every candidate of duration t - s by ``M[s, c] + seg`` with
    ``M[s, c] = max_c' V[s, c', 0] + Tr[c', c]``, so a duration whose bound is below the current
    k-th candidate by more than a margin is skipped. The margin, 1e-9 times bounds of the
    magnitudes involved (vmax: the largest finite ``|V[s, c', 0]|`` so far; smax: twice the largest
    finite ``|S|`` plus those of D, the projections and the start / end additions, a bound of every
    finite segment score; ``tr_abs`` the largest finite ``|Tr|``), is far above the rounding by
    which the bound's order of additions can differ from the candidate's (a few 1e-16 of the same
    magnitudes; a later rank of a pair is never above its first). Skipping less never changes the
    result, as the k best under (value, index) do not depend on the order of insertion. The
    candidates kept, their values (added as on the PyTorch path) and their order are the
    PyTorch path's.

    Layout: S, ps, sa and M by reversed position (SR, psR (C, P), saR (P,): q = P - 1 - p, so the
    starts of durations 1..K ending at padded index i are q0 .. q0 + K - 1 with q0 = P - i), so
    that each label's segment scores and bounds (seg, bnd (C, K)) come from contiguous rows in one
    vectorised pass (:func:`_segment_rows`); per label the first largest bound's duration goes
    first, then one counting pass tests the others against the k-th candidate, and they are
    visited one by one only when one of them passes (rarely)."""
    K, C = D.shape
    C1 = C + 1
    P = S.shape[0]
    R = V.shape[0]  # a ring of K + 1 positions: p is read only by p + 1 .. p + K
    # plain: no projections, and the start / end additions are 0 for the starts and ends of the
    # sequence and -inf only before it (every sequence of full length): a segment score then needs
    # S and D alone (and -inf for a start before position 0)
    plain = True
    for p in range(P):
        if p < K:
            plain = plain and sa[p] == -np.inf
        elif p < K + L:
            plain = plain and sa[p] == 0.0
        if K < p <= K + L:
            plain = plain and ea[p] == 0.0
        for c in range(C):
            plain = plain and ps[p, c] == 0.0 and pe[p, c] == 0.0
    for c in range(C):
        for p in range(P):
            SR[c, P - 1 - p] = S[p, c]
        if not plain:
            for p in range(P):
                psR[c, P - 1 - p] = ps[p, c]
        for kk in range(K):
            DT[c, kk] = D[kk, c]
    if not plain:
        for p in range(P):
            saR[P - 1 - p] = sa[p]
    # bounds of the magnitudes in the margin: every finite segment score is at most smax (the
    # largest finite |S| twice, |D|, |ps|, |pe|, |sa|, |ea|), every prefix so far at most vmax
    smax = 2.0 * _row_absmax(S.ravel(), S.size) + _row_absmax(D.ravel(), D.size)
    if not plain:
        smax += _row_absmax(ps.ravel(), ps.size) + _row_absmax(pe.ravel(), pe.size)
        smax += _row_absmax(sa, sa.size) + _row_absmax(ea, ea.size)
    vmax = 0.0
    V[:] = -np.inf
    for c in range(C):  # positions before the start (every later one is written before it is read)
        for p in range(K):
            M[c, P - 1 - p] = -np.inf
        M[c, P - 1 - K] = TrK[0, C, c]  # the phantom start
    tr0 = TrK[0]
    V[K % R, C, 0] = 0.0
    SRf = SR.ravel()
    psRf = psR.ravel()
    DTf = DT.ravel()
    Mf = M.ravel()
    segf = seg.ravel()
    bndf = bnd.ravel()
    for t in range(1, L + 1):
        i = t + K
        wi = i % R
        q0 = P - i
        V[wi, C, :] = -np.inf  # the slot's old position may have been 0 (the phantom start)
        for kk in range(K):  # the ring slot of position t - kk - 1 (no division in the loop)
            x = wi - (kk + 1)
            sl[kk] = x if x >= 0 else x + R
        _segment_rows(SRf, psRf, saR, DTf, Mf, P, q0, K, C, S[i], pe[i], ea[i], t - 1, has_min,
                      min_start[i if has_min else 0], segf, bndf, plain)
        for c in range(C):
            bm = _row_max(bnd[c], K)
            j = 0  # the first largest bound
            while j < K - 1 and bnd[c, j] != bm:
                j += 1
            best[c] = j
        # a bound below the k-th candidate by more than this cannot reach it: the two orders of
        # addition differ by a few 1e-16 of these magnitudes (vmax: every prefix so far)
        margin = 1e-9 * (vmax + smax + tr_abs + 1.0)
        for c in range(C):
            cvc = cv[c]
            cic = ci[c]
            cvc[:] = -np.inf
            cic[:] = 0
            bc = best[c]
            n = _take_segment(bc, c, seg[c, bc], 0, k, TrK, V, sl, cvc, cic)
            lm = cvc[k - 1] - margin if n == k else -np.inf
            brow = bnd[c]
            h = _row_count_ge(brow, K, lm) - (1 if brow[bc] >= lm else 0)
            if h > 0:  # the other durations, one by one
                for kk in range(K):
                    bd = brow[kk]
                    if bd >= lm and bd > -np.inf and kk != bc:
                        n = _take_segment(kk, c, seg[c, kk], n, k, TrK, V, sl, cvc, cic)
                        if n == k:
                            lm = cvc[k - 1] - margin
            for r in range(k):
                V[wi, c, r] = cvc[r]
                bp[i, c, r] = cic[r]
        for c in range(C):
            Mi[c] = -np.inf
        for cp in range(C1):
            v0 = V[wi, cp, 0]
            trow = tr0[cp]
            for c in range(C):
                Mi[c] = fmax(Mi[c], v0 + trow[c])
            if cp < C and np.isfinite(v0):
                vmax = max(vmax, abs(v0))
        qi = P - 1 - i
        for c in range(C):
            M[c, qi] = Mi[c]


@njit(**KERNEL)
def topk_batch(S, ps, pe, D, TrK, tr_abs, factored, sa, ea, min_start, has_min, lengths, k, scores, labels, starts,
               lo, hi):
    """Sequences [lo, hi): the k best scores (B, k), labels (B, k, T) and starts (B, k, T)."""
    K, C = D.shape
    C1 = C + 1
    P = S.shape[1]
    T = labels.shape[2]
    V = np.empty((K + 1, C1, k))
    bp = np.empty((P, C, k), dtype=np.int32)  # every entry the backtrack reads is written first
    seg = np.empty((K, C))
    e = np.empty(K * C1)
    heads = np.empty(K * C1)
    pairs = np.zeros(min(k, K * C1), dtype=np.int64)
    cv = np.empty(k)
    ci = np.zeros(k, dtype=np.int64)
    sl = np.empty(K, dtype=np.int64)
    M = np.empty((C, P) if factored else (1, 1))
    Mi = np.empty(C)
    segT = np.empty((C, K))
    bnd = np.empty((C, K))
    best = np.zeros(C, dtype=np.int64)
    cvs = np.empty((C, k))
    cis = np.zeros((C, k), dtype=np.int64)
    SR = np.empty((C, P) if factored else (1, 1))
    psR = np.empty((C, P) if factored else (1, 1))
    saR = np.empty(P if factored else 1)
    DT = np.empty((C, K))
    fv = np.empty(k)
    fi = np.zeros(k, dtype=np.int64)
    lab_at = np.empty(T + 1, dtype=np.int64)
    for b in range(lo, hi):
        L = lengths[b]
        ms = min_start[b if has_min else 0]
        if factored:
            _kbest_seq_factored(S[b], ps[b], pe[b], D, TrK, tr_abs, sa[b], ea[b], ms, has_min, L, k, V, bp, M, Mi,
                                segT, bnd, cvs, cis, sl, best, SR, psR, saR, DT)
        else:
            _kbest_seq(S[b], ps[b], pe[b], D, TrK, sa[b], ea[b], ms, has_min, L, k, V, bp, seg, e, heads, pairs,
                       cv, ci, sl)
        # the k best final (label, rank), flat index c·k + r (ties: the smaller index)
        n = 0
        for c in range(C):
            for r in range(k):
                v = V[(L + K) % (K + 1), c, r]
                f = c * k + r
                if n == k and not _better(v, f, fv[n - 1], fi[n - 1]):
                    continue
                n = _insert(v, f, n, k, fv, fi)
        for q in range(k):
            scores[b, q] = fv[q]
            if not np.isfinite(fv[q]):
                continue
            t = L
            c = fi[q] // k
            rank = fi[q] - c * k
            lab_at[:] = -1
            while t > 0:
                flat = bp[t + K, c, rank]
                dur = flat // (C1 * k) + 1
                rem = flat - (dur - 1) * (C1 * k)
                rank = rem % k
                s = t - dur
                starts[b, q, s] = True
                lab_at[s] = c
                t = s
                c = rem // k
            cur = -1
            for p in range(L):
                if lab_at[p] >= 0:
                    cur = lab_at[p]
                labels[b, q, p] = cur


def topk_numba(model, k: int):
    """``(scores (B, k) float64, labels (B, k, T) int64, starts (B, k, T) bool)`` of the k best
    segmentations of a :class:`torch_semimarkov.engines.torch.dense._Model` (CPU tensors): -inf, -1 and False for ranks
    that do not exist."""
    f = lambda t: np.ascontiguousarray(t.detach().cpu().numpy(), dtype=np.float64)  # noqa: E731
    B, T, C, K = model.B, model.T, model.C, model.K
    has_min = model.min_start is not None
    min_start = (np.ascontiguousarray(model.min_start.cpu().numpy(), dtype=np.int64) if has_min
                 else np.zeros((1, 1, 1), dtype=np.int64))
    lengths = np.ascontiguousarray(model.lengths.cpu().numpy(), dtype=np.int64)
    scores = np.full((B, k), -np.inf)
    labels = np.full((B, k, T), -1, dtype=np.int64)
    starts = np.zeros((B, k, T), dtype=np.bool_)
    TrK = f(model.TrK)
    finite = np.abs(TrK[np.isfinite(TrK)])
    tr_abs = float(finite.max()) if finite.size else 0.0
    work = float(lengths.max()) * K * (C + 1) * C * max(1, min(k, K * (C + 1)))
    _run_batch(topk_batch, B, work, f(model.S), f(model.ps), f(model.pe), f(model.D), TrK, tr_abs, not model.direct,
               f(model.start_add),
               f(model.end_add), min_start, has_min, lengths, k, scores, labels, starts)
    return torch.from_numpy(scores), torch.from_numpy(labels), torch.from_numpy(starts)
