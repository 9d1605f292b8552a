"""Triton backward of the streaming semi-CRF: every marginal and gradient of ALGORITHM.md §3.

Three launches, no atomics, every output element written by exactly one program:

0. ``recompute_forward_state`` (grid (B, n_intervals)): every position's forward state, rerun from
   the forward's checkpoints into a transient buffer freed when the launcher returns;
1. ``_beta_*_kernel`` (grid (B,)): one program per sequence runs the backward recurrence from
   t = L down to 0 with the same normalisation as the forward (``beta_hat``, float64 frames ``G``)
   and stores ``Y_t = pe_{t-1} + beta_hat_t`` (B, T+1, C) and, for a static transition, the
   backward's own log Z = LSE_c(u_0 + v_0).
2. ``_shared_*_kernel`` (grid (B, n_chunks)): fully parallel over chunks of positions; writes
   P_start and P_end of its positions and sums the transition and duration marginals of its chunk
   in registers, written once to a per-(sequence, chunk) workspace. The host reduces the workspace
   over chunks in a fixed order, so the result is bitwise reproducible.

Every marginal is ``exp(hat values + (frame sum - log Z))``: frames and log Z are combined in
float64 and only the small remainder is cast to float32. For a static transition, log Z at
position p is interpolated between the forward's and the backward's values (see
``_shared_factored_kernel``), which keeps the marginals consistent at T = 10^6.
"""

from __future__ import annotations

from typing import Optional

import torch

from .pytorch_reference import feasible, zero_rows
from .triton_forward import (
    HAS_TRITON,
    REBASE,
    _log,
    _next_pow2,
    _possible,
    _tile_sizes,
    _use_register_ring,
    auto_num_warps,
    recompute_forward_state,
)

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _beta_factored_kernel(
        cum_ptr,  # (B, T+1, C)
        tr_ptr,  # (C, C)
        db_ptr,  # (K, C)
        len_ptr,  # (B,)
        ps_ptr,  # (B, T, C)
        pe_ptr,  # (B, T, C)
        lz_ptr,  # (B,) float64 log Z
        a_ptr,  # (B, T+1, C) alpha_hat (forward)
        w_ptr,  # (B, T+1, C) U_hat = u_hat + ps (forward)
        f_ptr,  # (B, T+1) float64 forward frames
        x_ptr,  # (B, T+1, C) float32 out: Y_hat = pe_{t-1} + beta_hat_t rows
        g_ptr,  # (B, T+1) float64 out: backward frames
        lzb_ptr,  # (B,) float64 out: log Z seen by the backward, LSE_c u_0(c) + v_0(c)
        C,
        K,
        s_cum_b,
        s_p_b,
        s_a_b,
        s_w_b,
        s_f_b,
        C_PAD: tl.constexpr,
        K_BLOCK: tl.constexpr,
        HAS_PS: tl.constexpr,
        HAS_PE: tl.constexpr,
    ):
        MASK: tl.constexpr = -1e30
        b = tl.program_id(0).to(tl.int64)
        L = tl.load(len_ptr + b).to(tl.int32)
        lz = tl.load(lz_ptr + b)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        ok = tl.arange(0, K_BLOCK)
        cum_b = cum_ptr + b * s_cum_b
        ps_b = ps_ptr + b * s_p_b
        pe_b = pe_ptr + b * s_p_b
        a_b = a_ptr + b * s_a_b
        w_b = w_ptr + b * s_w_b
        f_b = f_ptr + b * s_f_b
        x_b = x_ptr + b * s_a_b
        g_b = g_ptr + b * s_f_b
        tr = tl.load(
            tr_ptr + oc[:, None] * C + oc[None, :], mask=mc[:, None] & mc[None, :], other=MASK
        ).to(tl.float32)
        beta = tl.where(mc, 0.0, MASK)
        G = tl.sum(tl.zeros([1], dtype=tl.float64), 0)
        for i in range(0, L):
            s = L - 1 - i
            t = s + 1
            # Y_t = pe_{t-1} + beta_t (X_t of ALGORITHM.md §3 minus S_t), frame G_t
            xt = beta
            if HAS_PE:
                xt += tl.load(pe_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
            xt = tl.where(mc, xt, MASK)
            tl.store(x_b + t * C + oc, xt, mask=mc)
            tl.store(g_b + t, G)
            s_s = tl.load(cum_b + s * C + oc, mask=mc, other=0.0)
            tl.debug_barrier()

            # lse_s(c) = LSE_k D[k-1, c] + Y_{s+k}(c) + S_{s+k}(c) - S_s(c), k <= min(K, L - s), frame G_t
            k_lim = tl.minimum(L - s, K)
            run_m = tl.full([C_PAD], MASK, tl.float32)
            run_s = tl.zeros([C_PAD], dtype=tl.float32)
            for kb in range(0, k_lim, K_BLOCK):
                k = kb + 1 + ok
                vk = k <= k_lim
                m2 = vk[:, None] & mc[None, :]
                xv = tl.load(x_b + (s + k[:, None]) * C + oc[None, :], mask=m2, other=MASK)
                gk = tl.load(g_b + s + k, mask=vk, other=0.0)
                dbv = tl.load(db_ptr + (k[:, None] - 1) * C + oc[None, :], mask=m2, other=MASK).to(tl.float32)
                seg = (tl.load(cum_b + (s + k[:, None]) * C + oc[None, :], mask=m2, other=0.0) - s_s[None, :]).to(tl.float32)
                xk = xv + dbv + seg + (gk - G).to(tl.float32)[:, None]
                nm = tl.maximum(run_m, tl.max(xk, 0))
                run_s = run_s * tl.exp(run_m - nm) + tl.sum(tl.exp(xk - nm[None, :]), 0)
                run_m = nm
            lse = run_m + _log(tl.where(mc & (run_s > 0), run_s, 1.0))
            if s == 0:
                # u_0 + v_0 = U_0 + lse_0
                z0 = tl.load(w_b + oc, mask=mc, other=MASK) + lse
                mz = tl.max(z0, 0)
                tl.store(lzb_ptr + b, tl.load(f_b) + G + (mz + _log(tl.sum(tl.exp(z0 - mz), 0))).to(tl.float64))
            # v_s = ps_s + lse_s; beta_s(c') = LSE_c Tr[c', c] + v_s(c)
            v = lse
            if HAS_PS:
                v += tl.load(ps_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
            v = tl.where(mc, v, MASK)
            y = tr + v[None, :]
            my = tl.max(y, 1)
            bs = my + _log(tl.sum(tl.exp(y - my[:, None]), 1))
            bs = tl.where(mc, bs, MASK)
            m = _possible(tl.max(bs, 0))
            beta = tl.where(mc, tl.maximum(bs - m, MASK), MASK)
            G = G + m.to(tl.float64)

    @triton.jit
    def _beta_factored_reg_kernel(
        cum_ptr,  # (B, T+1, C)
        tr_ptr,  # (C, C)
        db_ptr,  # (K, C)
        len_ptr,  # (B,)
        ps_ptr,  # (B, T, C)
        pe_ptr,  # (B, T, C)
        lz_ptr,  # (B,) float64 log Z
        a_ptr,  # (B, T+1, C) alpha_hat (forward)
        w_ptr,  # (B, T+1, C) U_hat = u_hat + ps (forward)
        f_ptr,  # (B, T+1) float64 forward frames
        x_ptr,  # (B, T+1, C) float32 out: Y_hat = pe_{t-1} + beta_hat_t rows
        g_ptr,  # (B, T+1) float64 out: backward frames
        lzb_ptr,  # (B,) float64 out: log Z seen by the backward, LSE_c u_0(c) + v_0(c)
        C,
        K,
        s_cum_b,
        s_p_b,
        s_a_b,
        s_f_b,
        C_PAD: tl.constexpr,
        K_PAD: tl.constexpr,
        HAS_PS: tl.constexpr,
        HAS_PE: tl.constexpr,
        REBASE: tl.constexpr,
    ):
        """The beta recurrence with its ring of Y rows in registers (mirror of the forward).

        Slot j holds position p = j (mod K_PAD) as ``Y_p + (S_p - S_ref)`` in frame ``rfr``; at
        step s its duration is ``((j - s - 1) mod K_PAD) + 1``. Rows read from memory (S, ps, pe,
        are loaded one step ahead. The marginals are left to the parallel kernel.
        """
        MASK: tl.constexpr = -1e30
        b = tl.program_id(0).to(tl.int64)
        L = tl.load(len_ptr + b).to(tl.int32)
        lz = tl.load(lz_ptr + b)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        oj = tl.arange(0, K_PAD)
        cum_b = cum_ptr + b * s_cum_b
        ps_b = ps_ptr + b * s_p_b
        pe_b = pe_ptr + b * s_p_b
        a_b = a_ptr + b * s_a_b
        w_b = w_ptr + b * s_a_b
        f_b = f_ptr + b * s_f_b
        x_b = x_ptr + b * s_a_b
        g_b = g_ptr + b * s_f_b
        # shape: (C_PAD src, C_PAD dst): the reduction over destinations runs along the fast axis
        tr = tl.load(
            tr_ptr + oc[:, None] * C + oc[None, :], mask=mc[:, None] & mc[None, :], other=MASK
        ).to(tl.float32)
        d0 = tl.load(db_ptr + oc, mask=mc, other=MASK).to(tl.float32)
        beta = tl.where(mc, 0.0, MASK)
        shift = _possible(tl.max(beta, 0))
        G = tl.sum(tl.zeros([1], dtype=tl.float64), 0)
        ring = tl.full([K_PAD, C_PAD], MASK, tl.float32)
        rfr = tl.zeros([K_PAD], dtype=tl.float64)
        s_ref = tl.load(cum_b + L * C + oc, mask=mc, other=0.0).to(tl.float32)
        s_next = s_ref
        # rows of step s = L - 1, loaded ahead
        s0 = L - 1
        n_s = tl.load(cum_b + s0 * C + oc, mask=mc, other=0.0).to(tl.float32)
        n_ps = tl.zeros([C_PAD], dtype=tl.float32)
        n_pe = tl.zeros([C_PAD], dtype=tl.float32)
        if HAS_PS:
            n_ps = tl.load(ps_b + s0 * C + oc, mask=mc, other=0.0).to(tl.float32)
        if HAS_PE:
            n_pe = tl.load(pe_b + s0 * C + oc, mask=mc, other=0.0).to(tl.float32)
        for i in range(0, L):
            s = L - 1 - i
            t = s + 1
            s_s = n_s
            ps_s = n_ps
            pe_s = n_pe
            sn = tl.maximum(s - 1, 0)
            n_s = tl.load(cum_b + sn * C + oc, mask=mc, other=0.0).to(tl.float32)
            if HAS_PS:
                n_ps = tl.load(ps_b + sn * C + oc, mask=mc, other=0.0).to(tl.float32)
            if HAS_PE:
                n_pe = tl.load(pe_b + sn * C + oc, mask=mc, other=0.0).to(tl.float32)
            kj = ((oj - t) & (K_PAD - 1)) + 1
            vj = (kj >= 2) & (kj <= tl.minimum(L - s, K))
            drot = tl.load(
                db_ptr + (kj[:, None] - 1) * C + oc[None, :], mask=vj[:, None] & mc[None, :], other=MASK
            ).to(tl.float32)

            # k >= 2 part of lse_s (ring rows of positions s+2 .. s+K), frame G_{s+1}
            xk = ring + drot + (rfr - G).to(tl.float32)[:, None]
            pm = tl.max(xk, 0)
            psum = tl.sum(tl.exp(xk - pm[None, :]), 0)
            plse = tl.where(psum > 0, pm + _log(tl.where(psum > 0, psum, 1.0)), MASK)

            # Y_t = pe_{t-1} + beta_t, frame G_t (critical path: beta -> Y_t -> lse_s -> beta_s)
            y = tl.where(mc, beta + pe_s, MASK)
            yr = y + (s_next - s_ref)
            x1 = yr + d0
            hi = tl.maximum(plse, x1)
            # lse_s(c) = LSE_k D[k-1, c] + Y_{s+k}(c) + S_{s+k}(c) - S_s(c)
            lse = hi + _log(1.0 + tl.exp(tl.minimum(plse, x1) - hi)) - (s_s - s_ref)
            v = lse
            if HAS_PS:
                v += ps_s
            v = tl.where(mc, v, MASK)
            yb = tr + v[None, :]
            my = tl.max(yb, 1)
            bs = my + _log(tl.sum(tl.exp(yb - my[:, None]), 1))

            # outputs, beside the critical path
            tl.store(x_b + t * C + oc, y, mask=mc)
            tl.store(g_b + t, G)
            if s == 0:
                # u_0 + v_0 = U_0 + lse_0
                z0 = tl.load(w_b + oc, mask=mc, other=MASK) + lse
                mz = tl.max(z0, 0)
                tl.store(lzb_ptr + b, tl.load(f_b) + G + (mz + _log(tl.sum(tl.exp(z0 - mz), 0))).to(tl.float64))
            slot = t & (K_PAD - 1)
            ring = tl.where(oj[:, None] == slot, yr[None, :], ring)
            rfr = tl.where(oj == slot, G, rfr)
            # normalise by the maximum of the previous beta_hat (known one step early)
            beta = tl.where(mc, tl.maximum(bs - shift, MASK), MASK)
            G = G + shift.to(tl.float64)
            shift = _possible(tl.max(beta, 0))
            s_next = s_s
            if i % REBASE == REBASE - 1:
                ring -= (s_s - s_ref)[None, :]
                s_ref = s_s

    @triton.jit
    def _shared_factored_kernel(
        cum_ptr,  # (B, T+1, C)
        tr_ptr,  # (C, C)
        db_ptr,  # (K, C)
        len_ptr,  # (B,)
        pe_ptr,  # (B, T, C) proj_end (read only if HAS_PE)
        lz_ptr,  # (B,) float64: log Z of the forward
        lzb_ptr,  # (B,) float64: log Z of the backward recurrence
        a_ptr,  # (B, T+1, C) alpha_hat
        w_ptr,  # (B, T+1, C) U_hat
        f_ptr,  # (B, T+1) float64
        x_ptr,  # (B, T+1, C) Y_hat
        g_ptr,  # (B, T+1) float64
        pst_ptr,  # (B, T, C) float32 out, zero-initialised: P_start(s, c)
        pend_ptr,  # (B, T, C) float32 out: P_end(e+1, c) at the last position e
        wtr_ptr,  # (B, NCH, C, C) float32 out: transition marginals of the chunk
        wdb_ptr,  # (B, NCH, K, C) float32 out: duration marginals of the chunk
        C,
        K,
        CH,
        NCH,
        s_cum_b,
        s_a_b,
        s_f_b,
        s_p_b,
        C_PAD: tl.constexpr,
        K_BLOCK: tl.constexpr,
        HAS_PE: tl.constexpr,
    ):
        """Every marginal of the positions s0 <= s < s1 of one sequence.

        The float32 forward and backward recurrences each drift by a few ulps per step; over 10^6
        steps their two values of log Z differ by ~1e-2. A marginal at position p combines forward
        messages summed over p steps with backward ones summed over L - p steps, so it is
        normalised by ``log Z(p) = (p / L) log Z_fwd + (1 - p / L) log Z_bwd``, which cancels the
        linear part of that drift (both values agree to float32 rounding at short lengths).
        """
        MASK: tl.constexpr = -1e30
        b = tl.program_id(0).to(tl.int64)
        ch = tl.program_id(1)
        L = tl.load(len_ptr + b).to(tl.int32)
        lz_f = tl.load(lz_ptr + b)
        lz_b = tl.load(lzb_ptr + b)
        inv_l = 1.0 / L.to(tl.float64)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        ok = tl.arange(0, K_BLOCK)
        a_b = a_ptr + b * s_a_b
        w_b = w_ptr + b * s_a_b
        x_b = x_ptr + b * s_a_b
        f_b = f_ptr + b * s_f_b
        g_b = g_ptr + b * s_f_b
        pst_b = pst_ptr + b * s_p_b
        pend_b = pend_ptr + b * s_p_b
        pe_b = pe_ptr + b * s_p_b
        cum_b = cum_ptr + b * s_cum_b
        s0 = ch * CH
        s1 = tl.minimum(s0 + CH, L)
        m2c = mc[:, None] & mc[None, :]

        # P_end(t) = exp(alpha_t + beta_t - log Z), t = e + 1, beta_t = Y_t - pe_{t-1}
        for last in range(s0, s1):
            t = last + 1
            lzt = lz_f * (t * inv_l) + lz_b * (1.0 - t * inv_l)
            z = tl.load(a_b + t * C + oc, mask=mc, other=MASK) + tl.load(x_b + t * C + oc, mask=mc, other=MASK)
            if HAS_PE:
                z -= tl.load(pe_b + last * C + oc, mask=mc, other=0.0).to(tl.float32)
            z += (tl.load(f_b + t) + tl.load(g_b + t) - lzt).to(tl.float32)
            tl.store(pend_b + last * C + oc, tl.exp(z), mask=mc)

        # P_seg(s, k, c) = exp(U_s(c) + D[k-1, c] + S_{s+k}(c) - S_s(c) + Y_{s+k}(c) - log Z);
        # P_start(s, c) = sum_k P_seg(s, k, c)
        wdb_b = wdb_ptr + (b * NCH + ch) * K * C
        for kb in range(0, K, K_BLOCK):
            k = kb + 1 + ok
            vk0 = k <= K
            dbv = tl.load(db_ptr + (k[:, None] - 1) * C + oc[None, :], mask=vk0[:, None] & mc[None, :], other=MASK).to(tl.float32)
            acc = tl.zeros([K_BLOCK, C_PAD], dtype=tl.float32)
            for s in range(s0, s1):
                vk = vk0 & (k <= L - s)
                m2 = vk[:, None] & mc[None, :]
                lzs = lz_f * (s * inv_l) + lz_b * (1.0 - s * inv_l)
                wv = tl.load(w_b + s * C + oc, mask=mc, other=MASK)
                fs = tl.load(f_b + s)
                xv = tl.load(x_b + (s + k[:, None]) * C + oc[None, :], mask=m2, other=MASK)
                gk = tl.load(g_b + s + k, mask=vk, other=0.0)
                s_s = tl.load(cum_b + s * C + oc, mask=mc, other=0.0)
                seg = (tl.load(cum_b + (s + k[:, None]) * C + oc[None, :], mask=m2, other=0.0) - s_s[None, :]).to(tl.float32)
                z = xv + dbv + seg + wv[None, :] + (gk + fs - lzs).to(tl.float32)[:, None]
                p = tl.where(m2, tl.exp(z), 0.0)
                acc += p
                # this program alone owns row s; the same threads load and store it
                pst = tl.load(pst_b + s * C + oc, mask=mc, other=0.0)
                tl.store(pst_b + s * C + oc, pst + tl.sum(p, 0), mask=mc)
            tl.store(wdb_b + (k[:, None] - 1) * C + oc[None, :], acc, mask=vk0[:, None] & mc[None, :])
        tl.debug_barrier()

        # P_trans(s, c', c) = softmax_{c'}(alpha_s(c') + Tr[c', c]) * P_start(s, c)
        tr = tl.load(tr_ptr + oc[:, None] * C + oc[None, :], mask=m2c, other=MASK).to(tl.float32)
        acc_tr = tl.zeros([C_PAD, C_PAD], dtype=tl.float32)
        for s in range(s0, s1):
            av = tl.load(a_b + s * C + oc, mask=mc, other=MASK)
            x = av[:, None] + tr
            mx = tl.max(x, 0)
            e = tl.exp(x - mx[None, :])
            p = tl.load(pst_b + s * C + oc, mask=mc, other=0.0) / tl.sum(e, 0)
            acc_tr += e * p[None, :]
        wtr_b = wtr_ptr + (b * NCH + ch) * C * C
        tl.store(wtr_b + oc[:, None] * C + oc[None, :], acc_tr, mask=m2c)

    @triton.jit
    def _beta_duration_tr_kernel(
        cum_ptr,  # (B, T+1, C)
        tr_ptr,  # (K, C, C)
        db_ptr,  # (K, C)
        len_ptr,  # (B,)
        ps_ptr,  # (B, T, C)
        pe_ptr,  # (B, T, C)
        lz_ptr,  # (B,) float64
        a_ptr,  # (B, T+1, C) alpha_hat
        f_ptr,  # (B, T+1) float64
        x_ptr,  # (B, T+1, C) out: Y_hat = pe_{t-1} + beta_hat_t
        g_ptr,  # (B, T+1) float64 out
        pend_ptr,  # (B, T, C) out: P_end
        C,
        K,
        s_cum_b,
        s_p_b,
        s_a_b,
        s_f_b,
        C_PAD: tl.constexpr,
        HAS_PS: tl.constexpr,
        HAS_PE: tl.constexpr,
    ):
        MASK: tl.constexpr = -1e30
        b = tl.program_id(0).to(tl.int64)
        L = tl.load(len_ptr + b).to(tl.int32)
        lz = tl.load(lz_ptr + b)
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
        pend_b = pend_ptr + b * s_p_b
        beta = tl.where(mc, 0.0, MASK)
        G = tl.sum(tl.zeros([1], dtype=tl.float64), 0)
        for i in range(0, L):
            s = L - 1 - i
            t = s + 1
            xt = beta
            if HAS_PE:
                xt += tl.load(pe_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
            xt = tl.where(mc, xt, MASK)
            tl.store(x_b + t * C + oc, xt, mask=mc)
            tl.store(g_b + t, G)
            ft = tl.load(f_b + t)
            pend = tl.exp(tl.load(a_b + t * C + oc, mask=mc, other=MASK) + beta + (ft + G - lz).to(tl.float32))
            tl.store(pend_b + s * C + oc, pend, mask=mc)
            tl.debug_barrier()

            # beta_s(c') = LSE_{k, c} Tr[k-1, c', c] + ps_s(c) + D[k-1, c] + S_{s+k}(c) - S_s(c) + Y_{s+k}(c)
            s_s = tl.load(cum_b + s * C + oc, mask=mc, other=0.0)
            base = tl.zeros([C_PAD], dtype=tl.float32)
            if HAS_PS:
                base += tl.load(ps_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
            k_lim = tl.minimum(L - s, K)
            run_m = tl.full([C_PAD], MASK, tl.float32)
            run_s = tl.zeros([C_PAD], dtype=tl.float32)
            for k in range(1, k_lim + 1):
                xv = tl.load(x_b + (s + k) * C + oc, mask=mc, other=MASK)
                dk = (tl.load(g_b + s + k) - G).to(tl.float32)
                dk += (tl.load(cum_b + (s + k) * C + oc, mask=mc, other=0.0) - s_s).to(tl.float32)
                col = base + xv + dk + tl.load(db_ptr + (k - 1) * C + oc, mask=mc, other=MASK).to(tl.float32)
                trk = tl.load(tr_ptr + (k - 1) * C * C + oc[:, None] * C + oc[None, :], mask=m2c, other=MASK)
                y = trk.to(tl.float32) + col[None, :]
                nm = tl.maximum(run_m, tl.max(y, 1))
                run_s = run_s * tl.exp(run_m - nm) + tl.sum(tl.exp(y - nm[:, None]), 1)
                run_m = nm
            bs = tl.where(mc, run_m + _log(tl.where(run_s > 0, run_s, 1.0)), MASK)
            m = _possible(tl.max(bs, 0))
            beta = tl.where(mc, tl.maximum(bs - m, MASK), MASK)
            G = G + m.to(tl.float64)

    @triton.jit
    def _shared_duration_tr_kernel(
        cum_ptr,  # (B, T+1, C)
        tr_ptr,  # (K, C, C)
        db_ptr,  # (K, C)
        len_ptr,  # (B,)
        ps_ptr,  # (B, T, C)
        lz_ptr,  # (B,) float64
        a_ptr,  # (B, T+1, C) alpha_hat
        f_ptr,  # (B, T+1) float64
        x_ptr,  # (B, T+1, C) Y_hat
        g_ptr,  # (B, T+1) float64
        pst_ptr,  # (B, T, C) out: P_start
        wtr_ptr,  # (B, NCH, K, C, C) float32 out, zero-initialised: P_seg summed over the chunk
        C,
        K,
        CH,
        NCH,
        s_cum_b,
        s_p_b,
        s_a_b,
        s_f_b,
        C_PAD: tl.constexpr,
        HAS_PS: tl.constexpr,
    ):
        MASK: tl.constexpr = -1e30
        b = tl.program_id(0).to(tl.int64)
        ch = tl.program_id(1)
        L = tl.load(len_ptr + b).to(tl.int32)
        lz = tl.load(lz_ptr + b)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        m2c = mc[:, None] & mc[None, :]
        cum_b = cum_ptr + b * s_cum_b
        ps_b = ps_ptr + b * s_p_b
        a_b = a_ptr + b * s_a_b
        f_b = f_ptr + b * s_f_b
        x_b = x_ptr + b * s_a_b
        g_b = g_ptr + b * s_f_b
        pst_b = pst_ptr + b * s_p_b
        wtr_b = wtr_ptr + (b * NCH + ch) * K * C * C
        s0 = ch * CH
        s1 = tl.minimum(s0 + CH, L)
        for s in range(s0, s1):
            av = tl.load(a_b + s * C + oc, mask=mc, other=MASK)
            fs = tl.load(f_b + s)
            s_s = tl.load(cum_b + s * C + oc, mask=mc, other=0.0)
            base = tl.zeros([C_PAD], dtype=tl.float32)
            if HAS_PS:
                base += tl.load(ps_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
            pst = tl.zeros([C_PAD], dtype=tl.float32)
            for k in range(1, tl.minimum(L - s, K) + 1):
                xv = tl.load(x_b + (s + k) * C + oc, mask=mc, other=MASK)
                dk = (tl.load(g_b + s + k) + fs - lz).to(tl.float32)
                dk += (tl.load(cum_b + (s + k) * C + oc, mask=mc, other=0.0) - s_s).to(tl.float32)
                col = base + xv + dk + tl.load(db_ptr + (k - 1) * C + oc, mask=mc, other=MASK).to(tl.float32)
                trk = tl.load(tr_ptr + (k - 1) * C * C + oc[:, None] * C + oc[None, :], mask=m2c, other=MASK)
                p = tl.where(m2c, tl.exp(av[:, None] + trk.to(tl.float32) + col[None, :]), 0.0)
                pst += tl.sum(p, 0)
                # this program alone owns this workspace block; same layout for load and store
                ptrs = wtr_b + (k - 1) * C * C + oc[:, None] * C + oc[None, :]
                tl.store(ptrs, tl.load(ptrs, mask=m2c, other=0.0) + p, mask=m2c)
            tl.store(pst_b + s * C + oc, pst, mask=mc)


def _chunking(B: int, T: int, C: int, ws_per_chunk: int, min_programs: int = 2048, min_chunk: int = 32):
    """Chunk length and count for the parallel kernel: enough programs to fill a GPU, and a
    per-chunk workspace (``ws_per_chunk`` floats per sequence and chunk) of at most twice the size
    of the (B, T, C) marginals, so that peak memory stays O(B·T·C) for any K."""
    n = max(1, min(-(-T // min_chunk), -(-min_programs // B), (2 * (T + 1) * C) // ws_per_chunk))
    ch = -(-T // n)
    return ch, -(-T // ch)


def launch_streaming_triton_backward(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths: torch.Tensor,
    K: int,
    log_Z: torch.Tensor,
    ring_checkpoints: torch.Tensor,
    checkpoint_interval: int,
    log_norm_checkpoints,
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
    num_warps: Optional[int] = None,
):
    """Marginals and per-sequence parameter gradients of log Z (unscaled by grad_output).

    Args:
        cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end: the forward inputs.
        log_Z: (B,) from ``launch_streaming_triton_kernel`` (any float dtype; the kernel uses the
            float64 value recomputed from the saved state).
        ring_checkpoints: the float32 checkpoints returned by the forward.
        checkpoint_interval: as returned by the forward.
        log_norm_checkpoints: the float64 checkpoints returned by the forward.
        num_warps: the forward's (None picks the same value as the forward's None): the
            recompute must run the forward's kernel with the forward's reduction layout.

    Returns:
        ``(p_start (B, T, C), p_end (B, T, C), grad_transition (B, C, C) or (B, K, C, C),
        grad_duration_bias (B, K, C))`` in the dtype of ``cum_scores``. ``p_end`` is indexed by a
        segment's last position; positions at or past a sequence's length are 0.

    Example:
        >>> z, st, dt, fr = launch_streaming_triton_kernel(S, tr, db, lens, K)  # doctest: +SKIP
        >>> p_start, p_end, g_tr, g_db = launch_streaming_triton_backward(
        ...     S, tr, db, lens, K, z, st, dt, fr)  # doctest: +SKIP
    """
    if ring_checkpoints is None or log_norm_checkpoints is None:
        raise ValueError("the forward was run without save_for_backward")
    # every position's alpha_hat / U_hat and frames, recomputed interval by interval from the
    # checkpoints into a transient buffer (freed when this function returns)
    saved, frames = recompute_forward_state(
        cum_scores, transition, duration_bias, lengths, K, ring_checkpoints, log_norm_checkpoints,
        checkpoint_interval, proj_start, proj_end, num_warps)
    alpha_hat = saved[0]
    w_hat = saved[1] if saved.shape[0] > 1 else None
    cum_scores = cum_scores.contiguous()
    transition = transition.contiguous()
    duration_bias = duration_bias.contiguous()
    proj_start = None if proj_start is None else proj_start.contiguous()
    proj_end = None if proj_end is None else proj_end.contiguous()
    lengths = lengths.to(device=cum_scores.device, dtype=torch.int64).contiguous()
    B, T1, C = cum_scores.shape
    T = T1 - 1
    dev = cum_scores.device
    dtype = cum_scores.dtype
    K = int(K)
    K_eff = max(1, min(K, T))
    c_pad, k_block = _tile_sizes(C, K_eff)
    # log Z in float64 from the saved state: the returned partition may be float32, whose rounding
    # (0.06 at log Z ~ 1e6) would bias every marginal
    rows = torch.arange(B, device=dev)
    lz = frames[rows, lengths] + torch.logsumexp(alpha_hat[rows, lengths].double(), -1)
    # an infeasible sequence (no allowed segmentation) has no marginals: normalise it by 0, so that
    # every value is exp(IMPOSSIBLE) = 0, and zero it explicitly at the end
    ok = feasible(lz)
    lz = torch.where(ok, lz, torch.zeros_like(lz)).contiguous()
    x_hat = torch.empty((B, T + 1, C), device=dev, dtype=torch.float32)
    g = torch.empty((B, T + 1), device=dev, dtype=torch.float64)
    p_start = torch.zeros((B, T, C), device=dev, dtype=torch.float32)
    p_end = torch.zeros((B, T, C), device=dev, dtype=torch.float32)
    ps = proj_start if proj_start is not None else cum_scores
    pe = proj_end if proj_end is not None else cum_scores
    dur_tr = transition.dim() == 3
    ch, nch = _chunking(B, T, C, K_eff * C * C if dur_tr else K_eff * C + C * C)
    warps = auto_num_warps(B, C, K_eff, dur_tr) if num_warps is None else num_warps
    lzb = torch.empty((B,), device=dev, dtype=torch.float64)
    if not dur_tr and _use_register_ring(C, K_eff, warps, B):
        _beta_factored_reg_kernel[(B,)](
            cum_scores, transition, duration_bias, lengths, ps, pe, lz, alpha_hat, w_hat,
            frames, x_hat, g, lzb, C, K_eff, T1 * C, T * C, T1 * C, T1,
            C_PAD=c_pad, K_PAD=max(2, _next_pow2(K_eff)), HAS_PS=proj_start is not None,
            HAS_PE=proj_end is not None, REBASE=REBASE, num_warps=warps,
        )
    elif not dur_tr:
        _beta_factored_kernel[(B,)](
            cum_scores, transition, duration_bias, lengths, ps, pe, lz, alpha_hat, w_hat,
            frames, x_hat, g, lzb, C, K_eff, T1 * C, T * C, T1 * C, T1 * C, T1,
            C_PAD=c_pad, K_BLOCK=k_block, HAS_PS=proj_start is not None,
            HAS_PE=proj_end is not None, num_warps=warps,
        )
    if not dur_tr:
        lzb = torch.where(ok, lzb, torch.zeros_like(lzb))
        wtr = torch.empty((B, nch, C, C), device=dev, dtype=torch.float32)
        wdb = torch.empty((B, nch, K_eff, C), device=dev, dtype=torch.float32)
        _shared_factored_kernel[(B, nch)](
            cum_scores, transition, duration_bias, lengths, pe, lz, lzb, alpha_hat, w_hat, frames,
            x_hat, g, p_start, p_end, wtr, wdb, C, K_eff, ch, nch, T1 * C, T1 * C, T1, T * C,
            C_PAD=c_pad, K_BLOCK=k_block, HAS_PE=proj_end is not None, num_warps=4,
        )
        # fixed-order reductions over chunks (deterministic), without a float64 copy of the workspace
        g_tr = wtr.sum(1).double()
        g_db = wdb.sum(1).double()
    else:
        _beta_duration_tr_kernel[(B,)](
            cum_scores, transition, duration_bias, lengths, ps, pe, lz, alpha_hat,
            frames, x_hat, g, p_end, C, K_eff, T1 * C, T * C, T1 * C, T1,
            C_PAD=c_pad, HAS_PS=proj_start is not None, HAS_PE=proj_end is not None,
            num_warps=warps,
        )
        wtr = torch.zeros((B, nch, K_eff, C, C), device=dev, dtype=torch.float32)
        _shared_duration_tr_kernel[(B, nch)](
            cum_scores, transition, duration_bias, lengths, ps, lz, alpha_hat, frames,
            x_hat, g, p_start, wtr, C, K_eff, ch, nch, T1 * C, T * C, T1 * C, T1,
            C_PAD=c_pad, HAS_PS=proj_start is not None, num_warps=4,
        )
        g_tr = wtr.sum(1).double()
        g_db = g_tr.sum(2)
    for t in (p_start, p_end, g_tr, g_db):
        zero_rows(t, ok)
    if K_eff < K:
        pad = K - K_eff
        g_db = torch.cat([g_db, g_db.new_zeros(B, pad, C)], 1)
        if dur_tr:
            g_tr = torch.cat([g_tr, g_tr.new_zeros(B, pad, C, C)], 1)
    return p_start.to(dtype), p_end.to(dtype), g_tr.to(dtype), g_db.to(dtype)
