"""Marginal kernels: every posterior marginal and parameter gradient of ``docs/internals.md`` §3
from the stored forward and backward rows, fully parallel over (sequence, chunk of positions).

No atomics: each program writes P_start and P_end of its positions and sums the transition and
duration marginals of its chunk in registers, written once to a per-(sequence, chunk) workspace
that the host reduces in a fixed order (bitwise reproducible). Every marginal is
``exp(hat values + (frame sum - log Z))``: frames and log Z are combined in float64 and only the
small remainder is cast to float32.
"""

from __future__ import annotations

from torch_semimarkov.engines.triton.common import HAS_TRITON, tl, triton  # noqa: F401

if HAS_TRITON:
    from torch_semimarkov.engines.triton.common import MASK_K as MASK
    from torch_semimarkov.engines.triton.common import seq_length
    from torch_semimarkov.engines.triton.common import ent_terms, log_, lse_rows

    @triton.jit
    def anchor_log_z(anc_b, t, L, A):
        """log Z for position t: linear between the anchors p_j <= t <= p_{j+1}."""
        j = tl.minimum(t // A, (L - 1) // A)
        p0 = j * A
        p1 = tl.minimum(p0 + A, L)
        z0 = tl.load(anc_b + j)
        z1 = tl.load(anc_b + j + 1)
        return z0 + (z1 - z0) * ((t - p0).to(tl.float64) / (p1 - p0).to(tl.float64))

    @triton.jit
    def _anchor_kernel(
        cum_ptr,  # (B, T+1, C)
        db_ptr,  # (K, C)
        len_ptr,  # (B,)
        w_ptr,  # (B, T+1, C) U_hat = u_hat + ps (forward)
        f_ptr,  # (B, T+1) float64 forward frames
        x_ptr,  # (B, T+1, C) Y_hat = pe_{t-1} + beta_hat_t (backward)
        g_ptr,  # (B, T+1) float64 backward frames
        out_ptr,  # (B, NA) float64 out: log Z at anchor j (ENT: H)
        C, K, A, NA, s_cum_b, s_a_b, s_f_b,
        C_PAD: tl.constexpr,
        K_BLOCK: tl.constexpr,
        IDX64: tl.constexpr = False,
        me_ptr=None,  # (B, T+1, C) int32: largest allowed end of a segment starting at s (HAS_MASK)
        HAS_MASK: tl.constexpr = False,
        NS: tl.constexpr = 1,
        lz_ptr=None,  # ENT: (B, NA) float64, log Z at the anchors (this kernel's own, first)
        hu_ptr=None, oh_ptr=None,  # ENT: the prefix entropies' hU rows (B, T+1, C) and offsets (B, T+1)
        hy_ptr=None, oy_ptr=None,  # ENT: the suffix entropies' hY rows and offsets
        ENT: tl.constexpr = False,
    ):
        """log Z from the stored rows at anchor p_j = min(j·A, L): every segmentation has one
        segment covering position q = min(p_j, L-1), so log Z = LSE over the segments (s, e, c)
        with s <= q < e of U_s + D[e-s-1] + S_e - S_s + Y_e (plus frames). Program (b, j).
        HAS_MASK: only the allowed segments (e <= max_end[s, c]).
        NS > 1 (large K): program (b, j·NS + p) sums the starts s = q - i with i in its p-th share
        of [0, K) and writes that partial log-sum to ``out_ptr`` (B, NA, NS); the host reduces.
        ENT (the entropy, ``entropy.launch_entropy``): H from the same segments, which split
        every segmentation into that segment, a prefix and a suffix (independent given it), so
        ``H = sum_seg mu (hU_s + hY_e - log mu)``, mu under the anchor's log Z; with NS > 1 each
        program writes its share's partial sum (the first share's with the reference ``href``),
        which the host adds."""
        b = tl.program_id(0).to(tl.int64)
        j = tl.program_id(1)
        part = j * 0
        if NS > 1:
            part = j % NS
            j = j // NS
        L = seq_length(len_ptr, b, IDX64)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        ok = tl.arange(0, K_BLOCK)
        cum_b = cum_ptr + b * s_cum_b
        w_b = w_ptr + b * s_a_b
        f_b = f_ptr + b * s_f_b
        x_b = x_ptr + b * s_a_b
        g_b = g_ptr + b * s_f_b
        if ENT:
            hu_b = hu_ptr + b * s_a_b
            hy_b = hy_ptr + b * s_a_b
            oh_b = oh_ptr + b * s_f_b
            oy_b = oy_ptr + b * s_f_b
        q = tl.minimum(tl.minimum(tl.cast(j, L.dtype) * A, L), L - 1)
        if ENT:
            q = tl.maximum(q, 0)
            # the segments' frames under the anchor's log Z, the entropies' under this reference
            ref = tl.load(lz_ptr + b * NA + j)
            href = tl.load(oh_b + q) + tl.load(oy_b + q + 1)
            acc = tl.zeros([C_PAD], dtype=tl.float32)
        else:
            # frames differ from this reference by O(1) near q: float32 keeps their differences
            ref = tl.load(f_b + q) + tl.load(g_b + q + 1)
            run_m = tl.full([C_PAD], 2 * MASK, tl.float32)
            run_s = tl.zeros([C_PAD], dtype=tl.float32)
        i_lo = 0
        i_hi = tl.minimum(K, q + 1)
        if NS > 1:
            per = (K + NS - 1) // NS
            i_lo = part * per
            i_hi = tl.minimum(i_hi, i_lo + per)
        for i in range(i_lo, i_hi):
            s = q - i
            u = tl.load(w_b + s * C + oc, mask=mc, other=MASK)
            if ENT:
                hu = tl.load(hu_b + s * C + oc, mask=mc, other=0.0)
            s_s = tl.load(cum_b + s * C + oc, mask=mc, other=0.0)
            fs = tl.load(f_b + s)
            if ENT:
                ohs = tl.load(oh_b + s)
            k_hi = tl.minimum(K, L - s)
            me = tl.zeros([C_PAD], dtype=tl.int32)
            if HAS_MASK:
                me = tl.load(me_ptr + b * s_a_b + s * C + oc, mask=mc, other=0)
            for kb in range(i + 1, k_hi + 1, K_BLOCK):
                k = kb + ok
                vk = k <= k_hi
                m2 = vk[:, None] & mc[None, :]
                e = s + k
                if HAS_MASK:
                    m2 = m2 & (e[:, None] <= me[None, :])
                y = tl.load(x_b + e[:, None] * C + oc[None, :], mask=m2, other=MASK)
                if ENT:
                    hy = tl.load(hy_b + e[:, None] * C + oc[None, :], mask=m2, other=0.0)
                d = tl.load(db_ptr + (k[:, None] - 1) * C + oc[None, :], mask=m2, other=MASK).to(tl.float32)
                seg = (tl.load(cum_b + e[:, None] * C + oc[None, :], mask=m2, other=0.0) - s_s[None, :]).to(tl.float32)
                fr = (tl.load(g_b + e, mask=vk, other=0.0) + fs - ref).to(tl.float32)
                z = tl.where(m2, u[None, :] + d + seg + y + fr[:, None], 2 * MASK)
                if ENT:
                    p = tl.where(m2, tl.exp(z), 0.0)
                    oh = (tl.load(oy_b + e, mask=vk, other=0.0) + ohs - href).to(tl.float32)
                    acc += tl.sum(tl.where(p > 0, p * (hu[None, :] + hy + oh[:, None] - z), 0.0), 0)
                else:
                    nm = tl.maximum(run_m, tl.max(z, 0))
                    run_s = run_s * tl.exp(run_m - nm) + tl.sum(tl.exp(z - nm[None, :]), 0)
                    run_m = nm
        if ENT:
            H = tl.sum(tl.where(mc, acc, 0.0), 0).to(tl.float64)
            if NS > 1:
                H = tl.where(part == 0, href, 0.0) + H
            else:
                H = href + H
            tl.store(out_ptr + (b * NA + j) * NS + part, H)
        else:
            m = tl.max(run_m, 0)
            total = tl.sum(tl.where(mc, run_s * tl.exp(run_m - m), 0.0), 0)
            lz = m + log_(tl.where(total > 0, total, 1.0))
            tl.store(out_ptr + (b * NA + j) * NS + part, ref + lz.to(tl.float64))

    @triton.jit
    def _seg_limit(s, L, K, oc, mc, me_b, C, HAS_MASK: tl.constexpr):
        """(C_PAD,) the longest allowed duration of a segment starting at s, per label (0 for a
        padded label): the sequence's end, K and a mask's limit, so that one compare per entry
        of a (K_BLOCK, C_PAD) tile says which segments are allowed, masked or not."""
        lim = tl.where(mc, tl.minimum(L - s, K), 0)
        if HAS_MASK:
            lim = tl.minimum(lim, tl.load(me_b + s * C + oc, mask=mc, other=0) - s)
        return lim

    @triton.jit
    def _dur_seg_limit(s, L, K, oc, mc, me_b, fl_b, C):
        """:func:`_seg_limit` of a masked (K, C, C) call, 0 where a flag forbids a start at s (the
        (C, C) kernels read that from the stored U rows; the (K, C, C) ones from the flags)."""
        lim = _seg_limit(s, L, K, oc, mc, me_b, C, True)
        return tl.where((tl.load(fl_b + s) & 4) == 0, lim, 0)

    @triton.jit
    def _seg_terms(s, L, K, k, dbv, oc, mc, anc_b, w_b, f_b, x_b, g_b, cum_b, me_b, C, A, HAS_MASK: tl.constexpr):
        """``log P_seg`` of the segments starting at s with durations k (K_BLOCK, C_PAD): below
        -1e29 where a segment is not allowed (past the sequence's end or K, or a mask's limit:
        its rows are not loaded), so that ``exp`` gives exactly 0 there with no select (every
        value is finite: forbidden inputs are IMPOSSIBLE = -1e30, never -inf). Also returns which
        entries are allowed."""
        ok2 = k[:, None] <= _seg_limit(s, L, K, oc, mc, me_b, C, HAS_MASK)[None, :]
        lzs = anchor_log_z(anc_b, s, L, A)
        wv = tl.load(w_b + s * C + oc, mask=mc, other=MASK)
        fs = tl.load(f_b + s)
        xv = tl.load(x_b + (s + k[:, None]) * C + oc[None, :], mask=ok2, other=MASK)
        gk = tl.load(g_b + s + k, mask=k <= L - s, other=0.0)
        s_s = tl.load(cum_b + s * C + oc, mask=mc, other=0.0)
        seg = (tl.load(cum_b + (s + k[:, None]) * C + oc[None, :], mask=ok2, other=0.0) - s_s[None, :]).to(tl.float32)
        return xv + dbv + seg + wv[None, :] + (gk + fs - lzs).to(tl.float32)[:, None], ok2

    @triton.jit
    def _wseg_terms(s, L, K, k, dbv, oc, mc, anc_b, hanc_b, oh_b, w_b, hu_b, f_b, x_b, hy_b, g_b, oy_b, cum_b,
                    me_b, C, A, HAS_MASK: tl.constexpr):
        """The segments starting at s with durations k (K_BLOCK, C_PAD): ``z = log P_seg`` (below
        -1e29 where not allowed, as in :func:`_seg_terms`) and the entropy's factor
        ``log P_seg + H - hU_s - hY_{s+k}`` (finite everywhere)."""
        z, ok2 = _seg_terms(s, L, K, k, dbv, oc, mc, anc_b, w_b, f_b, x_b, g_b, cum_b, me_b, C, A, HAS_MASK)
        hs = anchor_log_z(hanc_b, s, L, A) - tl.load(oh_b + s)
        huv = tl.load(hu_b + s * C + oc, mask=mc, other=0.0)
        hyv = tl.load(hy_b + (s + k[:, None]) * C + oc[None, :], mask=ok2, other=0.0)
        oyk = tl.load(oy_b + s + k, mask=k <= L - s, other=0.0)
        return z, z + (hs - oyk).to(tl.float32)[:, None] - huv[None, :] - hyv

    @triton.jit
    def _shared_factored_kernel(
        cum_ptr,  # (B, T+1, C)
        tr_ptr,  # (C, C)
        db_ptr,  # (K, C)
        len_ptr,  # (B,)
        pe_ptr,  # (B, T, C) proj_end (read only if HAS_PE)
        anc_ptr,  # (B, NA) float64: log Z at the anchors p_j = min(j·A, L) (``_anchor_kernel``)
        a_ptr,  # (B, T+1, C) alpha_hat
        w_ptr,  # (B, T+1, C) U_hat
        f_ptr,  # (B, T+1) float64
        x_ptr,  # (B, T+1, C) Y_hat
        g_ptr,  # (B, T+1) float64
        pst_ptr,  # (B, T, C) float32 out, zero-initialised: P_start(s, c)
        pend_ptr,  # (B, T, C) float32 out: P_end(e+1, c) at the last position e (ENT: Q_end)
        wtr_ptr,  # (B, NCH, C, C) float32 out: transition marginals of the chunk (ENT: weighted)
        wdb_ptr,  # (B, NCH, K, C) float32 out: duration marginals of the chunk (ENT: weighted)
        C,
        K,
        CH,
        NCH,
        A,
        NA,
        s_cum_b,
        s_a_b,
        s_f_b,
        s_p_b,
        C_PAD: tl.constexpr,
        K_BLOCK: tl.constexpr,
        HAS_PE: tl.constexpr,
        IDX64: tl.constexpr = False,
        me_ptr=None,  # (B, T+1, C) int32: largest allowed end of a segment starting at s (HAS_MASK)
        HAS_MASK: tl.constexpr = False,
        ONE_KB: tl.constexpr = False,  # K <= K_BLOCK: one duration block
        SEG: tl.constexpr = True,  # False: P_start and the duration marginals come from ``_blk_seg_kernel``
        hanc_ptr=None,  # ENT: (B, NA) float64, H at the anchors (``_anchor_kernel`` with ENT)
        h_ptr=None, hu_ptr=None, oh_ptr=None,  # ENT: forward entropy rows h, hU (B, T+1, C), offsets (B, T+1)
        hy_ptr=None, oy_ptr=None,  # ENT: backward entropy rows hY and their offsets
        qst_ptr=None,  # ENT: (B, T, C) float32 out, zero-initialised: Q_start(s, c)
        ENT: tl.constexpr = False,
    ):
        """Every marginal of the positions s0 <= s < s1 of one sequence.

        The float32 forward and backward recurrences (and the time-parallel engine's chunk
        offsets) each drift by a few ulps per step; over 10^6 steps alpha + beta at a position is
        ~1e-2 away from log Z. So a marginal at position p is normalised by the log Z that the
        stored rows themselves give at the nearest anchors (every A positions, exact there),
        interpolated linearly between them: only the drift within A positions remains.

        ENT (the entropy's gradient, ``entropy.launch_entropy``): every marginal mu weighted by
        ``log mu + H - h_prefix - h_suffix`` (Q = sum mu · factor), H interpolated between its own
        anchors; the transition term at s >= 1 adds the choice of the predecessor:
        ``pi (P_start (log pi - h_s(c') + hU_s(c)) + Q_start)``.
        """
        b = tl.program_id(0).to(tl.int64)
        ch = tl.program_id(1)
        L = seq_length(len_ptr, b, IDX64)
        anc_b = anc_ptr + b * NA
        if ENT:
            hanc_b = hanc_ptr + b * NA
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        ok = tl.arange(0, K_BLOCK)
        a_b = a_ptr + b * s_a_b
        w_b = w_ptr + b * s_a_b
        x_b = x_ptr + b * s_a_b
        f_b = f_ptr + b * s_f_b
        g_b = g_ptr + b * s_f_b
        if ENT:
            h_b = h_ptr + b * s_a_b
            hu_b = hu_ptr + b * s_a_b
            hy_b = hy_ptr + b * s_a_b
            oh_b = oh_ptr + b * s_f_b
            oy_b = oy_ptr + b * s_f_b
        pst_b = pst_ptr + b * s_p_b
        if ENT:
            qst_b = qst_ptr + b * s_p_b
        pend_b = pend_ptr + b * s_p_b
        pe_b = pe_ptr + b * s_p_b
        cum_b = cum_ptr + b * s_cum_b
        me_b = me_ptr + b * s_a_b if HAS_MASK else cum_b
        s0 = ch * CH
        s1 = tl.minimum(s0 + CH, L)
        m2c = mc[:, None] & mc[None, :]

        # P_end(t) = exp(alpha_t + beta_t - log Z), t = e + 1, beta_t = Y_t - pe_{t-1}
        # (ENT: Q_end(t) = P_node (log P_node + H - h_t - hY_t): the duration's entropy is inside h_t)
        for last in range(s0, s1):
            t = last + 1
            lzt = anchor_log_z(anc_b, t, L, A)
            if ENT:
                ht = anchor_log_z(hanc_b, t, L, A)
            z = tl.load(a_b + t * C + oc, mask=mc, other=MASK) + tl.load(x_b + t * C + oc, mask=mc, other=MASK)
            if HAS_PE:
                z -= tl.load(pe_b + last * C + oc, mask=mc, other=0.0).to(tl.float32)
            z += (tl.load(f_b + t) + tl.load(g_b + t) - lzt).to(tl.float32)
            if ENT:
                p = tl.exp(z)
                hh = tl.load(h_b + t * C + oc, mask=mc, other=0.0) + tl.load(hy_b + t * C + oc, mask=mc, other=0.0)
                fac = z + (ht - tl.load(oh_b + t) - tl.load(oy_b + t)).to(tl.float32) - hh
                tl.store(pend_b + last * C + oc, tl.where(p > 0, p * fac, 0.0), mask=mc)
            else:
                tl.store(pend_b + last * C + oc, tl.exp(z), mask=mc)

        # P_seg(s, k, c) = exp(U_s(c) + D[k-1, c] + S_{s+k}(c) - S_s(c) + Y_{s+k}(c) - log Z);
        # P_start(s, c) = sum_k P_seg(s, k, c) (SEG; else ``_blk_seg_kernel`` wrote P_start)
        # (ENT: also Q(s, k, c) = P_seg (log P_seg + H - hU_s - hY_{s+k}), summed the same way)
        if SEG:
            wdb_b = wdb_ptr + (b * NCH + ch) * K * C
            for kb in range(0, K, K_BLOCK):
                k = kb + 1 + ok
                vk0 = k <= K
                dbv = tl.load(db_ptr + (k[:, None] - 1) * C + oc[None, :], mask=vk0[:, None] & mc[None, :], other=MASK).to(tl.float32)
                acc = tl.zeros([K_BLOCK, C_PAD], dtype=tl.float32)
                # every position's rows are loaded one iteration early (they do not depend on the
                # loop): the loads' latency overlaps the previous position's arithmetic
                if ENT:
                    z_n, fac_n = _wseg_terms(tl.maximum(tl.minimum(s0, L - 1), 0), L, K, k, dbv, oc, mc, anc_b,
                                             hanc_b, oh_b, w_b, hu_b, f_b, x_b, hy_b, g_b, oy_b, cum_b, me_b, C, A,
                                             HAS_MASK)
                else:
                    z_n, _ = _seg_terms(tl.maximum(tl.minimum(s0, L - 1), 0), L, K, k, dbv, oc, mc, anc_b, w_b, f_b,
                                        x_b, g_b, cum_b, me_b, C, A, HAS_MASK)
                for s in range(s0, s1):
                    z = z_n
                    if ENT:
                        fac = fac_n
                        z_n, fac_n = _wseg_terms(tl.minimum(s + 1, L - 1), L, K, k, dbv, oc, mc, anc_b, hanc_b,
                                                 oh_b, w_b, hu_b, f_b, x_b, hy_b, g_b, oy_b, cum_b, me_b, C, A,
                                                 HAS_MASK)
                    else:
                        z_n, _ = _seg_terms(tl.minimum(s + 1, L - 1), L, K, k, dbv, oc, mc, anc_b, w_b, f_b, x_b,
                                            g_b, cum_b, me_b, C, A, HAS_MASK)
                    # (a segment that is not allowed has p exactly 0 and a finite factor: q exactly 0)
                    p = tl.exp(z)
                    if ENT:
                        q = p * fac
                        acc += q
                    else:
                        acc += p
                    # this program alone owns row s; the same threads load and store it
                    if ONE_KB:
                        tl.store(pst_b + s * C + oc, tl.sum(p, 0), mask=mc)
                        if ENT:
                            tl.store(qst_b + s * C + oc, tl.sum(q, 0), mask=mc)
                    else:
                        pst = tl.load(pst_b + s * C + oc, mask=mc, other=0.0)
                        tl.store(pst_b + s * C + oc, pst + tl.sum(p, 0), mask=mc)
                        if ENT:
                            qst = tl.load(qst_b + s * C + oc, mask=mc, other=0.0)
                            tl.store(qst_b + s * C + oc, qst + tl.sum(q, 0), mask=mc)
                tl.store(wdb_b + (k[:, None] - 1) * C + oc[None, :], acc, mask=vk0[:, None] & mc[None, :])
        tl.debug_barrier()

        # P_trans(s, c', c) = softmax_{c'}(alpha_s(c') + Tr[c', c]) * P_start(s, c)
        # (ENT: pi(c'|c) (P_start (log pi - h_s(c') + hU_s(c)) + Q_start); at s = 0 the phantom
        # predecessor is no choice: pi Q_start)
        tr = tl.load(tr_ptr + oc[:, None] * C + oc[None, :], mask=m2c, other=MASK).to(tl.float32)
        acc_tr = tl.zeros([C_PAD, C_PAD], dtype=tl.float32)
        for s in range(s0, s1):
            av = tl.load(a_b + s * C + oc, mask=mc, other=MASK)
            x = av[:, None] + tr
            mx = tl.max(x, 0)
            e = tl.exp(x - mx[None, :])
            if ENT:
                zs = tl.sum(e, 0)
                zs = tl.where(zs > 0, zs, 1.0)
                pi = e / zs[None, :]
                lpi = x - (mx + log_(zs))[None, :]
                pv = tl.load(pst_b + s * C + oc, mask=mc, other=0.0)
                qv = tl.load(qst_b + s * C + oc, mask=mc, other=0.0)
                hv = tl.load(h_b + s * C + oc, mask=mc, other=0.0)
                huv = tl.load(hu_b + s * C + oc, mask=mc, other=0.0)
                choice = pv[None, :] * (lpi - hv[:, None] + huv[None, :])
                choice = tl.where(s == 0, 0.0, choice)
                acc_tr += tl.where(pi > 0, pi * (choice + qv[None, :]), 0.0)
            else:
                p = tl.load(pst_b + s * C + oc, mask=mc, other=0.0) / tl.sum(e, 0)
                acc_tr += e * p[None, :]
        wtr_b = wtr_ptr + (b * NCH + ch) * C * C
        tl.store(wtr_b + oc[:, None] * C + oc[None, :], acc_tr, mask=m2c)

    @triton.jit
    def _blk_seg_kernel(
        cum_ptr,  # (B, T+1, C)
        db_ptr,  # (K, C) duration bias (the log-space tiles)
        ed_ptr,  # (K + BK, C_PAD) float32: exp(D[k-1, c] - MD_c), zero past K and where impossible
        md_ptr,  # (2, C_PAD) float32: row 0 MD_c, the largest possible D of each label (row 1 unused here)
        len_ptr,  # (B,)
        anc_ptr,  # (B, NA) float64: log Z at the anchors (ANCHOR: (B,) float64, log Z of the sequence)
        w_ptr,  # (B, T+1, C) U_hat
        f_ptr,  # (B, T+1) float64 forward frames
        x_ptr,  # (B, T+1, C) Y_hat
        g_ptr,  # (B, T+1) float64 backward frames
        pst_ptr,  # (B, T, C) float32 out: P_start(s, c) (ANCHOR: (B, NA, NS) float32 out, the sums)
        wdb_ptr,  # (B, NCH, K, C) float32 out, zero-initialised: duration marginals of the chunk
        sc_ptr,  # (B, NCH, 2, BE, CB) float32 scratch: the tile's end rows (linear, log)
        sg_ptr,  # (B, NCH, BE) float64 scratch: the tile's end frames (log)
        st_ptr,  # (B, NCH, 3) int32 out (STATS): tiles run in linear space, in log space, skipped
        C, K, CH, NCH, A, NA, s_cum_b, s_a_b, s_f_b, s_p_b,
        C_PAD: tl.constexpr,
        BS: tl.constexpr,
        BK: tl.constexpr,
        CB: tl.constexpr,
        BE: tl.constexpr,
        IDX64: tl.constexpr = False,
        LOG_ONLY: tl.constexpr = False,
        STATS: tl.constexpr = False,
        ANCHOR: tl.constexpr = False,
        NS: tl.constexpr = 1,
        LG=1,
    ):
        """P_start and the duration marginals of the starts s0 <= s < s1 of one sequence as
        (BS, BK, CB) tiles over (start, duration, label): the large-K path of
        ``_shared_factored_kernel``'s segment loop (the blocked engine). ANCHOR: instead, program
        (b, j·NS + p) sums the probabilities (under the sequence's log Z) of the segments covering
        the anchor q = min(j·A, L-1) whose start lies in the p-th share of [q - K + 1, q]: the
        host's ``log Z + log sum`` is the anchor's log Z (``_anchor_kernel``'s value).

        ``log P_seg(s, k, c) = a_s(c) + D[k-1, c] + y_{s+k}(c) + kappa(c)`` with ``a`` the start
        rows (U_hat, -S relative to the block's first start s_b, and the frames f_s - log Z + g at
        e_b = s_b + kb + 1, rounded once), ``y`` the end rows (Y_hat, the frames and +S relative to
        e_b) and ``kappa = S_{e_b} - S_{s_b}``, so that every part is small in float32. A tile is a product in linear space, ``exp(a + my + MD + kappa) · ED[k] · exp(y - my)``
        (the end rows exponentiated once per tile into the scratch, then gathered by s + k): no
        exponential per term. Its bound ``max a + max y + MD + kappa`` says whether that is exact:
        above 27 a term of probability >= e^-60 could underflow, so the tile is summed term by term
        in log space; below -80 every term is below e^-80 and the tile is skipped.

        LG (not with ANCHOR): program (b, ch·LG + g) takes the label tiles g, g + LG, ... of chunk
        ch: its P_start and duration marginals are columns no other program writes, so LG programs
        share a chunk's (K, C) workspace and each tile's sums are those of one program."""
        b = tl.program_id(0).to(tl.int64)
        pid = tl.program_id(1)
        ch = pid // LG
        cb0 = (pid % LG) * CB
        L = seq_length(len_ptr, b, IDX64)
        os_ = tl.arange(0, BS)
        okk = tl.arange(0, BK)
        oe = tl.arange(0, BE)
        ob = tl.arange(0, CB)
        cum_b = cum_ptr + b * s_cum_b
        w_b = w_ptr + b * s_a_b
        x_b = x_ptr + b * s_a_b
        f_b = f_ptr + b * s_f_b
        g_b = g_ptr + b * s_f_b
        pst_b = pst_ptr + b * s_p_b
        wdb_b = wdb_ptr + (b * NCH + ch) * K * C
        lin_b = sc_ptr + (b * NCH * LG + pid) * (2 * BE * CB)
        log_b = lin_b + BE * CB
        sg_b = sg_ptr + (b * NCH * LG + pid) * BE
        gidx = (os_[:, None] + okk[None, :])[:, :, None] * CB + ob[None, None, :]
        if ANCHOR:
            j = ch // NS
            part = ch % NS
            q = tl.minimum(tl.minimum(tl.cast(j, L.dtype) * A, L), L - 1)
            lzg = tl.load(anc_ptr + b)
            lo = tl.maximum(q - K + 1, 0)
            per = ((q + 1 - lo + NS - 1) // NS + BS - 1) // BS * BS
            s0 = lo + part * per
            s1 = tl.minimum(s0 + per, q + 1)
        else:
            anc_b = anc_ptr + b * NA
            s0 = tl.cast(ch, L.dtype) * CH  # int64 positions where (T+1)·C may pass 2^31 (IDX64)
            s1 = tl.minimum(s0 + CH, L)
        tot = tl.zeros([CB], dtype=tl.float32)
        n_lin = ch * 0
        n_log = ch * 0
        n_skip = ch * 0
        for cb in range(cb0, C, LG * CB):
            cols = cb + ob
            mcol = cols < C
            md = tl.load(md_ptr + cols)
            for sb in range(s0, s1, BS):
                si = sb + os_
                vs = si < s1
                sp = tl.where(vs, si, sb)
                m2s = vs[:, None] & mcol[None, :]
                if ANCHOR:
                    fs = tl.load(f_b + sp) - lzg
                    kb0 = tl.maximum(q - sb - BS + 1, 0) // BK * BK
                else:
                    fs = tl.load(f_b + sp) - anchor_log_z(anc_b, sp, L, A)
                    kb0 = 0
                s_ref = tl.load(cum_b + sb * C + cols, mask=mcol, other=0.0)
                sa = (tl.load(cum_b + sp[:, None] * C + cols[None, :], mask=m2s, other=0.0) - s_ref[None, :]).to(tl.float32)
                a0 = tl.load(w_b + sp[:, None] * C + cols[None, :], mask=m2s, other=MASK) - sa
                acc_s = tl.zeros([BS, CB], dtype=tl.float32)
                for kb in range(kb0, tl.minimum(K, L - sb), BK):
                    er = sb + kb + 1
                    e = er + oe
                    ve = (e <= L) & (oe < BS + BK - 1)
                    ep = tl.where(ve, e, er)
                    m2e = ve[:, None] & mcol[None, :]
                    g_ref = tl.load(g_b + er)
                    c_ref = tl.load(cum_b + er * C + cols, mask=mcol, other=0.0)
                    ge = tl.load(g_b + ep)
                    y0 = tl.load(x_b + ep[:, None] * C + cols[None, :], mask=m2e, other=MASK)
                    y0 += (tl.load(cum_b + ep[:, None] * C + cols[None, :], mask=m2e, other=0.0) - c_ref[None, :]).to(tl.float32)
                    y0 = tl.where(m2e, y0, MASK)
                    y = y0 + (ge - g_ref).to(tl.float32)[:, None]
                    my = tl.max(y, 0)
                    # the start rows carry the frames f_s - log Z_s + g_{e_b}, rounded once to float32
                    a = tl.where(m2s, a0 + (fs + g_ref).to(tl.float32)[:, None], MASK)
                    ma = tl.max(a, 0)
                    kap = (c_ref - s_ref).to(tl.float32)
                    bound = tl.where(mcol & (ma > -1e29) & (my > -1e29), ma + my + md + kap, 2 * MASK)
                    hi = tl.max(bound, 0)
                    k = kb + 1 + okk
                    if hi < -80.0:
                        n_skip += 1
                    else:
                        use_log = hi > 27.0
                        if LOG_ONLY:
                            use_log = hi > -1e30
                        if use_log:
                            n_log += 1
                            # term by term, the frames f_s - log Z_s + g_e summed in float64 per
                            # (start, end) and rounded once, as ``_shared_factored_kernel`` does
                            tl.store(log_b + oe[:, None] * CB + ob[None, :], y0)
                            tl.store(sg_b + oe, ge)
                            tl.debug_barrier()
                            dv = tl.load(db_ptr + (k[:, None] - 1) * C + cols[None, :],
                                         mask=(k[:, None] <= K) & mcol[None, :], other=MASK).to(tl.float32)
                            y3 = tl.load(log_b + gidx)
                            fr2 = (fs[:, None] + tl.load(sg_b + os_[:, None] + okk[None, :])).to(tl.float32)
                            t3 = tl.exp(a0[:, None, :] + fr2[:, :, None] + dv[None, :, :] + y3 + kap[None, None, :])
                        else:
                            n_lin += 1
                            tl.store(lin_b + oe[:, None] * CB + ob[None, :], tl.exp(y - my[None, :]))
                            tl.debug_barrier()
                            ed = tl.load(ed_ptr + (k[:, None] - 1) * C_PAD + cols[None, :])
                            a2 = tl.exp(a + (my + md + kap)[None, :])
                            y3 = tl.load(lin_b + gidx)
                            t3 = (a2[:, None, :] * ed[None, :, :]) * y3
                        if ANCHOR:
                            # only the segments that cover q: s + k > q
                            cover = (k[None, :] > q - si[:, None])[:, :, None]
                            tot += tl.sum(tl.sum(tl.where(cover, t3, 0.0), 1), 0)
                        else:
                            acc_s += tl.sum(t3, 1)
                            wp = wdb_b + (k[:, None] - 1) * C + cols[None, :]
                            mk = (k[:, None] <= K) & mcol[None, :]
                            tl.store(wp, tl.load(wp, mask=mk, other=0.0) + tl.sum(t3, 0), mask=mk)
                        # the next tile rewrites the scratch and the workspace rows other threads read
                        tl.debug_barrier()
                if not ANCHOR:
                    tl.store(pst_b + sp[:, None] * C + cols[None, :], acc_s, mask=m2s)
        if ANCHOR:
            tl.store(pst_ptr + (b * NA + j) * NS + part, tl.sum(tot, 0))
        if STATS:
            st = st_ptr + (b * NCH * LG + pid) * 3
            tl.store(st, n_lin)
            tl.store(st + 1, n_log)
            tl.store(st + 2, n_skip)

    @triton.jit
    def _anchor_duration_tr_kernel(
        cum_ptr,  # (B, T+1, C)
        tr_ptr,  # (K, C, C)
        db_ptr,  # (K, C)
        len_ptr,  # (B,)
        ps_ptr,  # (B, T, C) proj_start (read only if HAS_PS)
        a_ptr,  # (B, T+1, C) alpha_hat (forward)
        f_ptr,  # (B, T+1) float64 forward frames
        x_ptr,  # (B, T+1, C) Y_hat = pe_{t-1} + beta_hat_t (backward)
        g_ptr,  # (B, T+1) float64 backward frames
        out_ptr,  # (B, NA) float64 out: log Z at anchor j
        C, K, A, NA, s_cum_b, s_p_b, s_a_b, s_f_b,
        C_PAD: tl.constexpr,
        HAS_PS: tl.constexpr,
        IDX64: tl.constexpr = False,
        me_ptr=None,  # (B, T+1, C) int32: largest allowed end of a segment starting at s (HAS_MASK)
        fl_ptr=None,  # (B, T+1) int8: flags of the masks (limits.py) (HAS_MASK)
        HAS_MASK: tl.constexpr = False,
        h_ptr=None,  # ENT: (B, T+1, C) float32 prefix entropies h_s (``forward.dur_ent_step``)
        fh_ptr=None,  # ENT: (B, T+1) float64 their global frames
        hy_ptr=None,  # ENT: (B, T+1, C) float32 suffix entropies h'_t (``beta.dur_ent_beta_step``)
        gh_ptr=None,  # ENT: (B, T+1) float64 their global frames
        hout_ptr=None,  # ENT: (B, NA) float64 out: the entropy H at anchor j
        ENT: tl.constexpr = False,
    ):
        """``_anchor_kernel`` for a (K, C, C) transition: log Z at anchor p_j = min(j·A, L) is the
        LSE over the segments (s, k, c) covering q = min(p_j, L-1) and the previous label c' of
        alpha_s(c') + Tr[k-1, c', c] + ps_s(c) + D[k-1, c] + S_{s+k}(c) - S_s(c) + Y_{s+k}(c)
        (alpha_0 = 0 gives the first segment its phantom term). Program (b, j): O(K²·C²).
        HAS_MASK: only the allowed segments (:func:`_dur_seg_limit`). ``ENT``: also the entropy
        H = sum over the same segments of mu (h_s(c') + h'_{s+k}(c) - log mu) (the first segment's
        prefix is empty and its phantom predecessor one term), from the same rows, so that the
        weights ``log mu + H - h - h'`` of the entropy's marginals cancel the rows' float32 drift."""
        b = tl.program_id(0).to(tl.int64)
        j = tl.program_id(1)
        L = seq_length(len_ptr, b, IDX64)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        m2c = mc[:, None] & mc[None, :]
        cum_b = cum_ptr + b * s_cum_b
        ps_b = ps_ptr + b * s_p_b
        a_b = a_ptr + b * s_a_b
        f_b = f_ptr + b * s_f_b
        x_b = x_ptr + b * s_a_b
        g_b = g_ptr + b * s_f_b
        q = tl.minimum(tl.minimum(tl.cast(j, L.dtype) * A, L), L - 1)
        # frames differ from this reference by O(1) near q: float32 keeps their differences
        ref = tl.load(f_b + q) + tl.load(g_b + q + 1)
        run_m = tl.full([C_PAD], 2 * MASK, tl.float32)
        run_s = tl.zeros([C_PAD], dtype=tl.float32)
        run_r = tl.zeros([C_PAD], dtype=tl.float32)
        if ENT:
            h_b = h_ptr + b * s_a_b
            fh_b = fh_ptr + b * s_f_b
            hy_b = hy_ptr + b * s_a_b
            gh_b = gh_ptr + b * s_f_b
            # entropies in these frames: h_s + h'_e of the segments covering q is about H
            fq = tl.load(fh_b + q)
            gq = tl.load(gh_b + q + 1)
            href = fq + gq
        for i in range(0, tl.minimum(K, q + 1)):
            s = q - i
            av = tl.load(a_b + s * C + oc, mask=mc, other=MASK)
            s_s = tl.load(cum_b + s * C + oc, mask=mc, other=0.0)
            base = tl.zeros([C_PAD], dtype=tl.float32)
            if HAS_PS:
                base += tl.load(ps_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
            fs = tl.load(f_b + s)
            k_hi = tl.minimum(K, L - s)
            if HAS_MASK:
                k_lim = _dur_seg_limit(s, L, K, oc, mc, me_ptr + b * s_a_b, fl_ptr + b * s_f_b, C)
                k_hi = tl.minimum(k_hi, tl.max(k_lim, 0))
            if ENT:
                hv = tl.load(h_b + s * C + oc, mask=mc, other=0.0) + (tl.load(fh_b + s) - fq).to(tl.float32)
            for k in range(i + 1, k_hi + 1):
                e = s + k
                col = base + tl.load(x_b + e * C + oc, mask=mc, other=MASK)
                col += tl.load(db_ptr + (k - 1) * C + oc, mask=mc, other=MASK).to(tl.float32)
                col += (tl.load(cum_b + e * C + oc, mask=mc, other=0.0) - s_s).to(tl.float32)
                col += (tl.load(g_b + e) + fs - ref).to(tl.float32)
                if HAS_MASK:
                    col += tl.where(k <= k_lim, 0.0, MASK)
                trk = tl.load(tr_ptr + (k - 1) * C * C + oc[:, None] * C + oc[None, :], mask=m2c, other=MASK)
                z = tl.where(m2c, av[:, None] + trk.to(tl.float32) + col[None, :], 2 * MASK)
                if ENT:
                    hy = tl.load(hy_b + e * C + oc, mask=mc, other=0.0) + (tl.load(gh_b + e) - gq).to(tl.float32)
                    run_m, run_s, run_r = ent_terms(run_m, run_s, run_r, z, hv, hy, s == 0, (-fq).to(tl.float32))
                else:
                    nm = tl.maximum(run_m, tl.max(z, 0))
                    run_s = run_s * tl.exp(run_m - nm) + tl.sum(tl.exp(z - nm[None, :]), 0)
                    run_m = nm
        m = tl.max(run_m, 0)
        scale = tl.where(mc, tl.exp(run_m - m), 0.0)
        total = tl.sum(run_s * scale, 0)
        lz = m + log_(tl.where(total > 0, total, 1.0))
        tl.store(out_ptr + b * NA + j, ref + lz.to(tl.float64))
        if ENT:
            # H = sum mu (h - log mu) = sum exp(z - m) (h - z) / total + LSE z (z, LSE z in one frame)
            ent = tl.sum(run_r * scale, 0) / tl.where(total > 0, total, 1.0) + lz
            tl.store(hout_ptr + b * NA + j, href + ent.to(tl.float64))

    @triton.jit
    def _shared_duration_tr_kernel(
        cum_ptr,  # (B, T+1, C)
        tr_ptr,  # (K, C, C)
        db_ptr,  # (K, C)
        len_ptr,  # (B,)
        ps_ptr,  # (B, T, C) proj_start (read only if HAS_PS)
        pe_ptr,  # (B, T, C) proj_end (read only if HAS_PE)
        anc_ptr,  # (B, NA) float64: log Z at the anchors p_j = min(j·A, L) (``_anchor_duration_tr_kernel``)
        a_ptr,  # (B, T+1, C) alpha_hat
        f_ptr,  # (B, T+1) float64
        x_ptr,  # (B, T+1, C) Y_hat
        g_ptr,  # (B, T+1) float64
        pst_ptr,  # (B, T, C) out: P_start
        pend_ptr,  # (B, T, C) out: P_end(e+1, c) at the last position e
        wtr_ptr,  # (B, NCH, K, C, C) float32 out, zero-initialised: P_seg summed over the chunk
        C,
        K,
        CH,
        NCH,
        A,
        NA,
        s_cum_b,
        s_p_b,
        s_a_b,
        s_f_b,
        C_PAD: tl.constexpr,
        HAS_PS: tl.constexpr,
        HAS_PE: tl.constexpr,
        IDX64: tl.constexpr = False,
        me_ptr=None,  # (B, T+1, C) int32: largest allowed end of a segment starting at s (HAS_MASK)
        fl_ptr=None,  # (B, T+1) int8: flags of the masks (limits.py) (HAS_MASK)
        HAS_MASK: tl.constexpr = False,
        h_ptr=None,  # ENT: (B, T+1, C) float32 prefix entropies (``forward.dur_ent_step``)
        fh_ptr=None,  # ENT: (B, T+1) float64 their global frames
        hy_ptr=None,  # ENT: (B, T+1, C) float32 suffix entropies (``beta.dur_ent_beta_step``)
        gh_ptr=None,  # ENT: (B, T+1) float64 their global frames
        hanc_ptr=None,  # ENT: (B, NA) float64 the entropy H at the anchors (``_anchor_duration_tr_kernel``)
        ENT: tl.constexpr = False,
    ):
        """Every marginal of the positions s0 <= s < s1 of one sequence, for a (K, C, C)
        transition: P(s, k, c', c) = exp(alpha_s(c') + Tr[k-1, c', c] + ps_s(c) + D[k-1, c]
        + S_{s+k}(c) - S_s(c) + Y_{s+k}(c) - log Z), summed into P_start and the (K, C, C)
        workspace, and P_end; normalised by the anchored log Z as ``_shared_factored_kernel``.
        HAS_MASK: only the allowed segments (:func:`_dur_seg_limit`).

        ``ENT``: the entropy's weighted marginals instead, every P times
        ``log P + H - h_s(c') - h'_{s+k}(c)`` (minus dH / d(its score); a first segment's
        phantom predecessors are one term of an empty prefix: log P of their sum, h = 0), and
        the end marginals times ``log P_end + H - h_t(c) - h'_t(c)`` (their edges' sum, by the
        prefix recurrence), H interpolated between its anchors."""
        b = tl.program_id(0).to(tl.int64)
        ch = tl.program_id(1)
        L = seq_length(len_ptr, b, IDX64)
        anc_b = anc_ptr + b * NA
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        m2c = mc[:, None] & mc[None, :]
        cum_b = cum_ptr + b * s_cum_b
        ps_b = ps_ptr + b * s_p_b
        pe_b = pe_ptr + b * s_p_b
        a_b = a_ptr + b * s_a_b
        f_b = f_ptr + b * s_f_b
        x_b = x_ptr + b * s_a_b
        g_b = g_ptr + b * s_f_b
        pst_b = pst_ptr + b * s_p_b
        pend_b = pend_ptr + b * s_p_b
        wtr_b = wtr_ptr + (b * NCH + ch) * K * C * C
        s0 = ch * CH
        s1 = tl.minimum(s0 + CH, L)
        if ENT:
            h_b = h_ptr + b * s_a_b
            fh_b = fh_ptr + b * s_f_b
            hy_b = hy_ptr + b * s_a_b
            gh_b = gh_ptr + b * s_f_b
            hanc_b = hanc_ptr + b * NA
        # P_end(t) = exp(alpha_t + beta_t - log Z), t = e + 1, beta_t = Y_t - pe_{t-1}
        for last in range(s0, s1):
            t = last + 1
            lzt = anchor_log_z(anc_b, t, L, A)
            z = tl.load(a_b + t * C + oc, mask=mc, other=MASK) + tl.load(x_b + t * C + oc, mask=mc, other=MASK)
            if HAS_PE:
                z -= tl.load(pe_b + last * C + oc, mask=mc, other=0.0).to(tl.float32)
            z += (tl.load(f_b + t) + tl.load(g_b + t) - lzt).to(tl.float32)
            pz = tl.exp(z)
            if ENT:
                # H - h_t - h'_t: frames in float64, the rows' small remainders in float32
                w = (anchor_log_z(hanc_b, t, L, A) - tl.load(fh_b + t) - tl.load(gh_b + t)).to(tl.float32)
                w -= tl.load(h_b + t * C + oc, mask=mc, other=0.0) + tl.load(hy_b + t * C + oc, mask=mc, other=0.0)
                pz = tl.where(pz > 0, pz * (z + w), 0.0)
            tl.store(pend_b + last * C + oc, pz, mask=mc)
        # durations outside, starts inside: each duration's (C, C) transition tile is loaded once
        # and its workspace block summed in registers and stored once a chunk (not read and written
        # at every start); P_start (zero-initialised) gathers its row's terms in the same order as
        # a loop over durations inside would (k = 1, 2, ...), so the sums are the same bitwise
        for k in range(1, K + 1):
            trk = tl.load(tr_ptr + (k - 1) * C * C + oc[:, None] * C + oc[None, :], mask=m2c, other=MASK).to(tl.float32)
            dbk = tl.load(db_ptr + (k - 1) * C + oc, mask=mc, other=MASK).to(tl.float32)
            acc = tl.zeros([C_PAD, C_PAD], dtype=tl.float32)
            for s in range(s0, tl.minimum(s1, L - k + 1)):
                lzs = anchor_log_z(anc_b, s, L, A)
                av = tl.load(a_b + s * C + oc, mask=mc, other=MASK)
                fs = tl.load(f_b + s)
                s_s = tl.load(cum_b + s * C + oc, mask=mc, other=0.0)
                base = tl.zeros([C_PAD], dtype=tl.float32)
                if HAS_PS:
                    base += tl.load(ps_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
                xv = tl.load(x_b + (s + k) * C + oc, mask=mc, other=MASK)
                dk = (tl.load(g_b + s + k) + fs - lzs).to(tl.float32)
                dk += (tl.load(cum_b + (s + k) * C + oc, mask=mc, other=0.0) - s_s).to(tl.float32)
                col = base + xv + dk + dbk
                if HAS_MASK:
                    lim = _dur_seg_limit(s, L, K, oc, mc, me_ptr + b * s_a_b, fl_ptr + b * s_f_b, C)
                    col += tl.where(k <= lim, 0.0, MASK)
                lp = av[:, None] + trk + col[None, :]
                p = tl.where(m2c, tl.exp(lp), 0.0)
                if ENT:
                    # H - h'_{s+k}: frames in float64, the rows' small remainders in float32
                    wq = anchor_log_z(hanc_b, s, L, A) - tl.load(gh_b + s + k)
                    hy = tl.load(hy_b + (s + k) * C + oc, mask=mc, other=0.0)
                    if s == 0:
                        # the phantom predecessors: one term, log P of their sum, an empty prefix
                        w0 = lse_rows(tl.where(m2c, lp, 2 * MASK)) + wq.to(tl.float32) - hy
                        wt = tl.zeros([C_PAD, C_PAD], dtype=tl.float32) + w0[None, :]
                    else:
                        hv = tl.load(h_b + s * C + oc, mask=mc, other=0.0)
                        wt = lp + ((wq - tl.load(fh_b + s)).to(tl.float32) - hy)[None, :] - hv[:, None]
                    p = tl.where(p > 0, p * wt, 0.0)
                acc += p
                # this program alone owns row s; the same threads load and store it
                pst = tl.load(pst_b + s * C + oc, mask=mc, other=0.0)
                tl.store(pst_b + s * C + oc, pst + tl.sum(p, 0), mask=mc)
            tl.store(wtr_b + (k - 1) * C * C + oc[:, None] * C + oc[None, :], acc, mask=m2c)
