"""Triton kernels of the dense recurrences of ``engines/torch/dense.py`` (k-best, samples,
entropy, masks): one program per sequence walks its positions, forming the (K, C+1, C) edges of
one position in tiles of ``K_BLK`` durations and never storing them.

* :func:`dense_kernel`: forward messages ``alpha`` (and, with ``EXPECT``, the expected prefix
  score ``Ea`` of the expectation semiring) at every position; with ``REVERSE`` the backward
  messages ``beta`` (and ``Eb``);
* :func:`factored_kernel`: the same for a (C, C) transition, factored into a label step and a
  sum over durations.

Layout (that of ``engines/torch/dense.py`` ``_Model``): every per-position tensor has ``P = T + 1 + 2K`` rows,
position p at row ``p + K``; messages have C+1 columns, the last being the first segment's
phantom predecessor. Values run in float64; an impossible value is ``MASK`` (-1e30) or below
inside the kernels, and the host turns it back into ``-inf``.
"""

from __future__ import annotations

from torch_semimarkov.engines.triton import plan as plan_mod
from torch_semimarkov.engines.triton.common import HAS_TRITON, MASK

if HAS_TRITON:
    import triton
    import triton.language as tl

    from torch_semimarkov.engines.triton.common import MASK_K, lse_cols, lse_rows, online_lse, online_lse_value

    @triton.jit
    def _normalised(acc, wsum):
        """An expectation ``sum w x`` divided by ``sum w``: the weights ``exp(x - lse)`` sum to 1 only
        up to the rounding of the log-sum-exp (about 1e-16 of its size, which grows with T), and
        that error would multiply the expected score itself (of the size of the scores of the
        whole prefix) at every step."""
        return acc / tl.where(wsum > 0, wsum, 1.0)

    @triton.jit
    def _seg_tile(i, k0, b, P, K, C, S_ptr, ps_ptr, pe_ptr, D_ptr, sadd_ptr, eadd_ptr, ms_ptr, ok, oc, mc,
                  BY_END: tl.constexpr, HAS_MIN: tl.constexpr):
        """Scores (K_BLK, C_PAD) of the segments of durations k0+1 .. k0+K_BLK ending (BY_END) or
        starting at row i, the other end's rows (K_BLK,) and the valid durations."""
        kk = k0 + ok  # duration - 1
        mk = kk < K
        if BY_END:
            j = i - (kk + 1)  # start rows
            e_row = i + kk * 0
            s_row = j
        else:
            j = i + (kk + 1)  # end rows
            e_row = j
            s_row = i + kk * 0
        m2 = mk[:, None] & mc[None, :]
        base = b * P
        s_e = tl.load(S_ptr + (base + e_row)[:, None] * C + oc[None, :], mask=m2, other=0.0)
        s_s = tl.load(S_ptr + (base + s_row)[:, None] * C + oc[None, :], mask=m2, other=0.0)
        seg = s_e - s_s
        seg += tl.load(D_ptr + kk[:, None] * C + oc[None, :], mask=m2, other=MASK_K)
        seg += tl.load(ps_ptr + (base + s_row)[:, None] * C + oc[None, :], mask=m2, other=0.0)
        seg += tl.load(pe_ptr + (base + e_row)[:, None] * C + oc[None, :], mask=m2, other=0.0)
        seg += tl.load(sadd_ptr + base + s_row, mask=mk, other=MASK_K)[:, None]
        seg += tl.load(eadd_ptr + base + e_row, mask=mk, other=MASK_K)[:, None]
        if HAS_MIN:
            lo = tl.load(ms_ptr + (base + e_row)[:, None] * C + oc[None, :], mask=m2, other=0)
            start = (s_row - K).to(tl.int64)
            seg = tl.where(start[:, None] >= lo, seg, MASK_K)
        seg = tl.maximum(tl.where(m2, seg, MASK_K), MASK_K)
        return seg, j, mk

    @triton.jit
    def _tile(t, i, k0, b, P, K, C, S_ptr, ps_ptr, pe_ptr, D_ptr, tr_ptr, sadd_ptr, eadd_ptr, ms_ptr,
              ok, oc, op, mc, mp, BY_END: tl.constexpr, HAS_MIN: tl.constexpr):
        """Edges of the K_BLK durations k0+1 .. k0+K_BLK of the segments ending (BY_END) or
        starting at position t (row i): (K_BLK, C1_PAD, C_PAD) scores and the other end's rows."""
        seg, j, mk = _seg_tile(i, k0, b, P, K, C, S_ptr, ps_ptr, pe_ptr, D_ptr, sadd_ptr, eadd_ptr, ms_ptr, ok, oc,
                               mc, BY_END, HAS_MIN)
        kk = k0 + ok
        m3 = mk[:, None, None] & mp[None, :, None] & mc[None, None, :]
        tr = tl.load(tr_ptr + (kk[:, None, None] * (C + 1) + op[None, :, None]) * C + oc[None, None, :], mask=m3,
                     other=MASK_K)
        x = tl.maximum(seg[:, None, :] + tr, MASK_K)
        return x, j, mk

    @triton.jit
    def _positions(L, REVERSE: tl.constexpr):
        """The loop over a sequence's positions: ``range(lo, hi)`` of the loop variable r, whose
        position is :func:`_position` (forward 1 .. L, beta L-1 .. 0)."""
        if REVERSE:
            lo = 0
            hi = L
        else:
            lo = 1
            hi = L + 1
        return lo, hi

    @triton.jit
    def _position(r, L, REVERSE: tl.constexpr):
        if REVERSE:
            return L - 1 - r
        else:
            return r

    @triton.jit
    def _dur_lse(i, b, P, K, C, S_ptr, ps_ptr, pe_ptr, D_ptr, sadd_ptr, eadd_ptr, ms_ptr, msg_ptr, MS, ok, oc, mc,
                 REVERSE: tl.constexpr, HAS_MIN: tl.constexpr, K_BLK: tl.constexpr, C_PAD: tl.constexpr):
        """The factored recurrences' sum over durations at row i: forward ``lse_k U_{t-k}(c) + seg``
        (``msg_ptr`` the U rows, MS = C values a row), beta ``lse_k seg + beta_{s+k}(c)`` (the beta
        rows, MS = C + 1)."""
        run_m = tl.full([C_PAD], MASK_K, tl.float64)
        run_s = tl.zeros([C_PAD], tl.float64)
        for k0 in range(0, K, K_BLK):
            seg, j, mk = _seg_tile(i, k0, b, P, K, C, S_ptr, ps_ptr, pe_ptr, D_ptr, sadd_ptr, eadd_ptr, ms_ptr, ok, oc,
                                   mc, not REVERSE, HAS_MIN)
            m = tl.load(msg_ptr + (b * P + j)[:, None] * MS + oc[None, :], mask=mk[:, None] & mc[None, :], other=MASK_K)
            y = tl.maximum(m + seg, MASK_K)
            run_m, run_s = online_lse(run_m, run_s, y)
        return online_lse_value(run_m, run_s, run_m > -1e29)

    @triton.jit
    def _dur_expect(i, b, P, K, C, S_ptr, ps_ptr, pe_ptr, D_ptr, sadd_ptr, eadd_ptr, ms_ptr, msg_ptr, em_ptr, MS, val,
                    ok, oc, mc, REVERSE: tl.constexpr, HAS_MIN: tl.constexpr, K_BLK: tl.constexpr,
                    C_PAD: tl.constexpr):
        """The expectation over the durations of :func:`_dur_lse` (whose value is ``val``): each
        term weighted ``exp(term - val)``, with the other end's expected score (``em_ptr``) plus the
        segment's score."""
        acc = tl.zeros([C_PAD], tl.float64)
        wsum = tl.zeros([C_PAD], tl.float64)
        for k0 in range(0, K, K_BLK):
            seg, j, mk = _seg_tile(i, k0, b, P, K, C, S_ptr, ps_ptr, pe_ptr, D_ptr, sadd_ptr, eadd_ptr, ms_ptr, ok, oc,
                                   mc, not REVERSE, HAS_MIN)
            m2 = mk[:, None] & mc[None, :]
            m = tl.load(msg_ptr + (b * P + j)[:, None] * MS + oc[None, :], mask=m2, other=MASK_K)
            em = tl.load(em_ptr + (b * P + j)[:, None] * MS + oc[None, :], mask=m2, other=0.0)
            ok2 = (m > -1e29) & (seg > -1e29)
            w = tl.where(ok2, tl.exp(tl.maximum(m + seg, MASK_K) - val[None, :]), 0.0)
            acc += tl.sum(w * (em + tl.where(ok2, seg, 0.0)), 0)
            wsum += tl.sum(w, 0)
        return _normalised(acc, wsum)

    @triton.jit
    def factored_kernel(S_ptr, ps_ptr, pe_ptr, D_ptr, tr_ptr, sadd_ptr, eadd_ptr, ms_ptr, len_ptr, M_ptr, E_ptr,
                        U_ptr, EU_ptr, P, K, C, HAS_MIN: tl.constexpr, EXPECT: tl.constexpr, K_BLK: tl.constexpr,
                        C_PAD: tl.constexpr, C1_PAD: tl.constexpr, REVERSE: tl.constexpr = False):
        """alpha (``M_ptr``; ``REVERSE``: beta) for a (C, C) transition (tr_ptr: (C+1, C), the last
        row the phantom one), factored; O(K·C + C²) a position instead of O(K·C²). Forward: ``U_s(c)
        = lse_c' alpha_s(c') + Tr[c', c]`` once per position (into the scratch rows ``U_ptr``, with
        its expectation in ``EU_ptr``), then ``alpha_t(c) = lse_k U_{t-k}(c) + seg``. Beta (no
        scratch: ``U_ptr`` / ``EU_ptr`` None): ``V_s(c) = lse_k seg + beta_{s+k}(c)``, then
        ``beta_s(c') = lse_c Tr[c', c] + V_s(c)``."""
        b = tl.program_id(0)
        L = tl.load(len_ptr + b)
        ok = tl.arange(0, K_BLK)
        oc = tl.arange(0, C_PAD)
        op = tl.arange(0, C1_PAD)
        mc = oc < C
        mp = op < C + 1
        tr = tl.load(tr_ptr + op[:, None] * C + oc[None, :], mask=mp[:, None] & mc[None, :], other=MASK_K)
        if REVERSE:
            tl.store(M_ptr + (b * P + L + K) * (C + 1) + op, tl.zeros([C1_PAD], tl.float64), mask=mp)
        lo, hi = _positions(L, REVERSE)
        for r in range(lo, hi):
            i = _position(r, L, REVERSE) + K
            if REVERSE:
                v = _dur_lse(i, b, P, K, C, S_ptr, ps_ptr, pe_ptr, D_ptr, sadd_ptr, eadd_ptr, ms_ptr, M_ptr, C + 1, ok,
                             oc, mc, True, HAS_MIN, K_BLK, C_PAD)
                x = tl.maximum(tr + v[None, :], MASK_K)  # (C1_PAD, C_PAD)
                beta = tl.maximum(lse_cols(x), MASK_K)
                tl.store(M_ptr + (b * P + i) * (C + 1) + op, beta, mask=mp)
                if EXPECT:
                    ev = _dur_expect(i, b, P, K, C, S_ptr, ps_ptr, pe_ptr, D_ptr, sadd_ptr, eadd_ptr, ms_ptr, M_ptr,
                                     E_ptr, C + 1, v, ok, oc, mc, True, HAS_MIN, K_BLK, C_PAD)
                    okx = x > -1e29
                    w2 = tl.where(okx, tl.exp(x - beta[:, None]), 0.0)
                    eb = _normalised(tl.sum(w2 * (tl.where(okx, tr, 0.0) + ev[None, :]), 1), tl.sum(w2, 1))
                    tl.store(E_ptr + (b * P + i) * (C + 1) + op, tl.where(beta > -1e29, eb, 0.0), mask=mp)
            else:
                # U and its expectation for position t-1 (row i-1)
                a = tl.load(M_ptr + (b * P + i - 1) * (C + 1) + op, mask=mp, other=MASK_K)
                x = tl.maximum(a[:, None] + tr, MASK_K)
                u = tl.maximum(lse_rows(x), MASK_K)
                tl.store(U_ptr + (b * P + i - 1) * C + oc, u, mask=mc)
                if EXPECT:
                    ea = tl.load(E_ptr + (b * P + i - 1) * (C + 1) + op, mask=mp, other=0.0)
                    wu = tl.where((x > -1e29), tl.exp(x - u[None, :]), 0.0)
                    eu = _normalised(tl.sum(wu * (ea[:, None] + tl.where(x > -1e29, tr, 0.0)), 0), tl.sum(wu, 0))
                    tl.store(EU_ptr + (b * P + i - 1) * C + oc, eu, mask=mc)
                alpha = _dur_lse(i, b, P, K, C, S_ptr, ps_ptr, pe_ptr, D_ptr, sadd_ptr, eadd_ptr, ms_ptr, U_ptr, C, ok,
                                 oc, mc, False, HAS_MIN, K_BLK, C_PAD)
                tl.store(M_ptr + (b * P + i) * (C + 1) + oc, alpha, mask=mc)
                if EXPECT:
                    acc = _dur_expect(i, b, P, K, C, S_ptr, ps_ptr, pe_ptr, D_ptr, sadd_ptr, eadd_ptr, ms_ptr, U_ptr,
                                      EU_ptr, C, alpha, ok, oc, mc, False, HAS_MIN, K_BLK, C_PAD)
                    tl.store(E_ptr + (b * P + i) * (C + 1) + oc, tl.where(alpha > -1e29, acc, 0.0), mask=mc)

    @triton.jit
    def _other(m, REVERSE: tl.constexpr):
        """The other end's messages (K_BLK, cols) against the (K_BLK, C1_PAD, C_PAD) edge tile:
        forward the predecessor labels (axis 1), beta the successor labels (axis 2)."""
        if REVERSE:
            return m[:, None, :]
        else:
            return m[:, :, None]

    @triton.jit
    def _own(v, REVERSE: tl.constexpr):
        """This position's values against the edge tile: forward per label (axis 2), beta per
        predecessor label (axis 1)."""
        if REVERSE:
            return v[None, :, None]
        else:
            return v[None, None, :]

    @triton.jit
    def _sum_other(x, REVERSE: tl.constexpr):
        """An edge tile summed over its durations and the other end's labels."""
        if REVERSE:
            return tl.sum(tl.sum(x, 2), 0)
        else:
            return tl.sum(tl.sum(x, 0), 0)

    @triton.jit
    def dense_kernel(S_ptr, ps_ptr, pe_ptr, D_ptr, tr_ptr, sadd_ptr, eadd_ptr, ms_ptr, len_ptr, M_ptr, E_ptr,
                     P, K, C, HAS_MIN: tl.constexpr, EXPECT: tl.constexpr, K_BLK: tl.constexpr,
                     C_PAD: tl.constexpr, C1_PAD: tl.constexpr, REVERSE: tl.constexpr = False):
        """alpha (``M_ptr``; ``REVERSE``: beta) over the (K, C+1, C) edges of each position, formed
        in tiles of K_BLK durations (a (K, C, C) transition, or a (C, C) one with ``factored_off``):
        forward per label c over (duration, predecessor label), beta per predecessor label c' over
        (duration, label); with ``EXPECT`` the expected prefix (suffix) score in ``E_ptr``."""
        b = tl.program_id(0)
        L = tl.load(len_ptr + b)
        ok = tl.arange(0, K_BLK)
        oc = tl.arange(0, C_PAD)
        op = tl.arange(0, C1_PAD)
        mc = oc < C
        mp = op < C + 1
        if REVERSE:
            # per predecessor label (C+1 values, the phantom one last), from the successors' (C)
            own, mown, ot, mot = op, mp, oc, mc
            tl.store(M_ptr + (b * P + L + K) * (C + 1) + op, tl.zeros([C1_PAD], tl.float64), mask=mp)
        else:
            own, mown, ot, mot = oc, mc, op, mp
        lo, hi = _positions(L, REVERSE)
        for r in range(lo, hi):
            t = _position(r, L, REVERSE)
            i = t + K
            run_m = tl.full(own.shape, MASK_K, tl.float64)
            run_s = tl.zeros(own.shape, tl.float64)
            for k0 in range(0, K, K_BLK):
                x, j, mk = _tile(t, i, k0, b, P, K, C, S_ptr, ps_ptr, pe_ptr, D_ptr, tr_ptr, sadd_ptr, eadd_ptr,
                                 ms_ptr, ok, oc, op, mc, mp, not REVERSE, HAS_MIN)
                m = tl.load(M_ptr + (b * P + j)[:, None] * (C + 1) + ot[None, :], mask=mk[:, None] & mot[None, :],
                            other=MASK_K)
                x = tl.maximum(x + _other(m, REVERSE), MASK_K)
                if REVERSE:
                    x = tl.reshape(tl.permute(x, (0, 2, 1)), (K_BLK * C_PAD, C1_PAD))
                else:
                    x = tl.reshape(x, (K_BLK * C1_PAD, C_PAD))
                run_m, run_s = online_lse(run_m, run_s, x)
            val = online_lse_value(run_m, run_s, run_m > -1e29)
            tl.store(M_ptr + (b * P + i) * (C + 1) + own, val, mask=mown)
            if EXPECT:
                acc = tl.zeros(own.shape, tl.float64)
                wsum = tl.zeros(own.shape, tl.float64)
                for k0 in range(0, K, K_BLK):
                    x, j, mk = _tile(t, i, k0, b, P, K, C, S_ptr, ps_ptr, pe_ptr, D_ptr, tr_ptr, sadd_ptr, eadd_ptr,
                                     ms_ptr, ok, oc, op, mc, mp, not REVERSE, HAS_MIN)
                    mm = mk[:, None] & mot[None, :]
                    m = tl.load(M_ptr + (b * P + j)[:, None] * (C + 1) + ot[None, :], mask=mm, other=MASK_K)
                    em = tl.load(E_ptr + (b * P + j)[:, None] * (C + 1) + ot[None, :], mask=mm, other=0.0)
                    w = tl.exp(tl.maximum(x + _other(m, REVERSE), MASK_K) - _own(val, REVERSE))
                    w = tl.where((x > -1e29) & (_other(m, REVERSE) > -1e29), w, 0.0)
                    acc += _sum_other(w * (_other(em, REVERSE) + tl.where(x > -1e29, x, 0.0)), REVERSE)
                    wsum += _sum_other(w, REVERSE)
                acc = _normalised(acc, wsum)
                tl.store(E_ptr + (b * P + i) * (C + 1) + own, tl.where(val > -1e29, acc, 0.0), mask=mown)


def run_dense(model, which: str, expect: bool = False, factored_off: bool = False):
    """Launch the alpha (``which="alpha"``) or beta kernel on a ``_Model`` of ``engines/torch/dense.py`` (the
    factored kernels for a (C, C) transition unless ``factored_off``).

    Returns the messages (B, P, C+1) with ``-inf`` for impossible values, and with ``expect`` the
    expected prefix (suffix) scores (B, P, C+1).
    """
    import torch

    B, K, C = model.B, model.K, model.C
    P = model.T + 1 + 2 * K
    dev = model.device

    def fin(x):  # -inf (forbidden) as MASK: the kernels add and compare, never subtract infinities
        return torch.clamp(x, min=MASK).contiguous()

    M = torch.full((B, P, C + 1), MASK, dtype=torch.float64, device=dev)
    E = torch.zeros((B, P, C + 1), dtype=torch.float64, device=dev)
    if which == "alpha":
        M[:, K, C] = 0.0
    ms = model.min_start if model.min_start is not None else torch.zeros(1, dtype=torch.long, device=dev)
    args = (fin(model.S), fin(model.ps), fin(model.pe), fin(model.D), fin(model.TrK), fin(model.start_add),
            fin(model.end_add), ms.contiguous(), model.lengths.contiguous(), M, E, P, K, C)
    factored = not model.direct and not factored_off
    c_pad, c1_pad, K_BLK = plan_mod.dense_tiles(K, C, factored)
    meta = dict(HAS_MIN=model.min_start is not None, EXPECT=expect, C_PAD=c_pad, C1_PAD=c1_pad,
                num_warps=plan_mod.DENSE_WARPS)
    if factored:
        # (C, C): the transition of every duration is the same; the factored recurrence
        tr = args[4][0].contiguous()  # (C+1, C)
        args = args[:4] + (tr,) + args[5:]
        scratch = (None, None)  # beta's label step needs no rows of its own
        if which == "alpha":
            scratch = (torch.full((B, P, C), MASK, dtype=torch.float64, device=dev),
                       torch.zeros((B, P, C), dtype=torch.float64, device=dev))
        factored_kernel[(B,)](*args[:11], *scratch, *args[11:], K_BLK=K_BLK, REVERSE=which != "alpha", **meta)
    else:
        dense_kernel[(B,)](*args, K_BLK=K_BLK, REVERSE=which != "alpha", **meta)
    M = torch.where(M > -1e29, M, torch.full_like(M, float("-inf")))
    return (M, E) if expect else M
