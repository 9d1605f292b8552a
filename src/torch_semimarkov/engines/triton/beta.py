"""Beta kernels: the backward recurrence of ``docs/internals.md`` §3, sequential and time-parallel.

Each stores ``Y_t = pe_{t-1} + beta_t`` (B, T+1, C) relative to a float64 frame ``G_t``, the
layout the marginal kernels (``marginals.py``) read. A normaliser never shifts by an impossible
value (``possible_shift``), so an infeasible suffix costs no precision.

Sequential, one program per sequence from t = L down to 0: ``_beta_factored_reg_kernel`` (ring of
Y rows in registers, :func:`beta_step`; also the backward's own log Z = LSE_c(u_0 + v_0)),
``_beta_factored_kernel`` (ring read from memory) and ``_beta_duration_tr_kernel`` ((K, C, C)
transitions, which also writes P_end).

Time-parallel, ``chunks._reg_chunks_kernel`` with ``REVERSE`` (running :func:`beta_step` through
``_run_chunk``): the forward's chunk, fix-up and repair scheme
(``forward.py``) run in reverse. Chunk j owns rows (a_j, b_j]. Its spec run starts at b_j from
"the sequence ends here" (beta = 0, no segment crosses b_j; the last chunk from the truth,
beta_L = 0), its fix-up from the end state of chunk j+1 (the state at a_{j+1} = b_j), and the
repair walks the chunks from the last to the first. The rows compared are the Y rows: beta at s
depends only on Y_{s+1} .. Y_{s+K}. Offsets are suffix sums (``parallel.py``).
"""

from __future__ import annotations

from torch_semimarkov.engines.triton.common import HAS_TRITON, tl, triton  # noqa: F401


def beta_transition(transition):
    """A (K, C, C) transition as the direct beta kernels read it: ``[k, c, c']`` = Tr[k, c', c]
    (contiguous), so that their (label, source) tiles load along the source and reduce over rows,
    as the forward's do (GPU_NOTES 102: reduced over their columns, the tiles took ~20x the warp
    shuffles and the step 3.4x the forward's time). A copy of the transition a call."""
    return transition.transpose(-2, -1).contiguous()


if HAS_TRITON:
    from torch_semimarkov.engines.triton.common import MASK_K as MASK
    from torch_semimarkov.engines.triton.common import load_transition, seq_length
    from torch_semimarkov.engines.triton.common import ent_row, log_, possible_shift, row_offset_bounds
    from torch_semimarkov.engines.triton.common import window_row, window_start

    @triton.jit
    def beta_step(s, L, k_max, ring, rfr, beta, G, shift, s_ref, s_next, s_s, ps_s, pe_s,
                  tr, d0, db_ptr, C, oj, oc, mc,
                  K_PAD: tl.constexpr, HAS_PS: tl.constexpr, HAS_PE: tl.constexpr, REBASE: tl.constexpr,
                  me=None, fl=0, HAS_MASK: tl.constexpr = False):
        """One position of the beta recurrence with its ring of Y rows in registers.

        Slot j holds position p = j (mod K_PAD) as ``Y_p + (S_p - S_ref)`` in frame ``rfr``; at step
        s its duration is ``((j - s - 1) mod K_PAD) + 1``. From ``beta`` (beta_hat_{s+1}, frame G)
        forms Y_{s+1}, pushes it into the ring and returns beta_hat_s, normalised by the maximum of
        beta_hat_{s+1}. Returns the new state and ``(y, G_t, lse)``: Y_hat_{s+1} in frame ``G_t``
        and ``lse_s = LSE_k D[k-1] + Y_{s+k} + S_{s+k} - S_s`` in that frame.

        HAS_MASK: ``fl`` is the flag byte of position s (``limits.py``) and ``me`` (C_PAD,)
        int32 the largest allowed end of a segment starting at s, per label. The limit only shrinks as s goes
        down, so the ring entries it excludes are dropped once, when it moves; a forbidden start
        s makes lse_s impossible (as an impossible ``proj_start`` would).
        """
        t = s + 1
        t32 = tl.cast(t, tl.int32)
        kj = ((oj - t32) & (K_PAD - 1)) + 1
        vj = (kj >= 2) & (kj <= tl.minimum(L - s, k_max))
        drot = tl.load(db_ptr + (kj[:, None] - 1) * C + oc[None, :], mask=vj[:, None] & mc[None, :],
                       other=MASK).to(tl.float32)
        if HAS_MASK:
            if (fl & 2) != 0:
                ring = tl.where((s + kj)[:, None] <= me[None, :], ring, MASK)
        # k >= 2 part of lse_s (ring rows of positions s+2 .. s+K), frame G_{s+1}
        xk = ring + drot + (rfr - G).to(tl.float32)[:, None]
        pm = tl.max(xk, 0)
        psum = tl.sum(tl.exp(xk - pm[None, :]), 0)
        plse = tl.where(psum > 0, pm + log_(tl.where(psum > 0, psum, 1.0)), MASK)
        # Y_t = pe_{t-1} + beta_t, frame G_t (critical path: beta -> Y_t -> lse_s -> beta_s)
        y = tl.where(mc, beta + pe_s, MASK)
        yr = y + (s_next - s_ref)
        if HAS_MASK:
            yr = tl.where(t <= me, yr, MASK)
        x1 = yr + d0
        hi = tl.maximum(plse, x1)
        # lse_s(c) = LSE_k D[k-1, c] + Y_{s+k}(c) + S_{s+k}(c) - S_s(c)
        lse = hi + log_(1.0 + tl.exp(tl.minimum(plse, x1) - hi)) - (s_s - s_ref)
        v = lse
        if HAS_PS:
            v += ps_s
        if HAS_MASK:
            v += tl.where((fl & 4) != 0, MASK, 0.0)
        v = tl.where(mc, v, MASK)
        yb = tr + v[None, :]
        my = tl.max(yb, 1)
        bs = my + log_(tl.sum(tl.exp(yb - my[:, None]), 1))
        slot = t32 & (K_PAD - 1)
        ring = tl.where(oj[:, None] == slot, yr[None, :], ring)
        rfr = tl.where(oj == slot, G, rfr)
        G_t = G
        beta = tl.where(mc, tl.maximum(bs - shift, MASK), MASK)
        G = G + shift.to(tl.float64)
        shift = possible_shift(tl.max(beta, 0))
        if s % REBASE == 0:
            ring -= (s_s - s_ref)[None, :]
            s_ref = s_s
        return ring, rfr, beta, G, shift, s_ref, s_s, y, G_t, lse

    @triton.jit
    def _load_state(e32, e64, live, oj, oc, C_PAD: tl.constexpr, K_PAD: tl.constexpr):
        """ring (K_PAD, C_PAD), beta_hat, the ring's S reference (C_PAD,), ring frames, G."""
        lj = oj < live * K_PAD
        lc = oc < live * C_PAD
        ring = tl.load(e32 + oj[:, None] * C_PAD + oc[None, :], mask=lj[:, None] & lc[None, :], other=MASK)
        beta = tl.load(e32 + K_PAD * C_PAD + oc, mask=lc, other=MASK)
        s_ref = tl.load(e32 + K_PAD * C_PAD + C_PAD + oc, mask=lc, other=0.0)
        rfr = tl.load(e64 + oj, mask=lj, other=0.0)
        G = tl.sum(tl.load(e64 + K_PAD + oj * 0, mask=(oj == 0) & lj, other=0.0), 0)
        return ring, beta, s_ref, rfr, G

    @triton.jit
    def _save_state(e32, e64, live, ring, beta, s_ref, rfr, G, oj, oc, C_PAD: tl.constexpr, K_PAD: tl.constexpr):
        lj = oj < live * K_PAD
        lc = oc < live * C_PAD
        tl.store(e32 + oj[:, None] * C_PAD + oc[None, :], ring, mask=lj[:, None] & lc[None, :])
        tl.store(e32 + K_PAD * C_PAD + oc, beta, mask=lc)
        tl.store(e32 + K_PAD * C_PAD + C_PAD + oc, s_ref, mask=lc)
        tl.store(e64 + oj, rfr, mask=lj)
        tl.store(e64 + K_PAD + oj * 0, tl.zeros([K_PAD], tl.float64) + G, mask=(oj == 0) & lj)

    @triton.jit
    def _run_chunk(a, b, L, k_max, ring, rfr, beta, G, s_ref, cum_b, ps_b, pe_b, x_b, g_b,
                   tr, d0, db_ptr, C, oj, oc, mc, TOL, K,
                   C_PAD: tl.constexpr, K_PAD: tl.constexpr, HAS_PS: tl.constexpr, HAS_PE: tl.constexpr,
                   REBASE: tl.constexpr, COMPARE: tl.constexpr, me_b, fl_b, HAS_MASK: tl.constexpr):
        """Run s = b-1 down to a from the state at b, storing Y rows b .. a+1 (see the forward's
        ``_run_chunk``). Returns ``(state..., converged, delta, steps, t_low)``: this run wrote
        rows t_low .. b."""
        b_in = tl.minimum(b, L)
        s_next = tl.load(cum_b + b_in * C + oc, mask=mc, other=0.0).to(tl.float32)
        shift = possible_shift(tl.max(beta, 0))
        wlo, whi, conv, delta = window_start(K_PAD)
        s = b - 1
        while (s >= a) & (conv == 0):
            t = s + 1
            s_s = tl.load(cum_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
            ps_s = tl.zeros([C_PAD], dtype=tl.float32)
            pe_s = tl.zeros([C_PAD], dtype=tl.float32)
            if HAS_PS:
                ps_s = tl.load(ps_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
            if HAS_PE:
                pe_s = tl.load(pe_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
            me = tl.full([C_PAD], 2147483647, tl.int32)
            fl = tl.full([], 0, tl.int32)
            if HAS_MASK:
                fl = tl.load(fl_b + s).to(tl.int32)
                me = tl.load(me_b + s * C + oc, mask=mc, other=2147483647)
            if COMPARE:
                y_ref = tl.load(x_b + t * C + oc, mask=mc, other=MASK)
                g_ref = tl.sum(tl.load(g_b + t + oj * 0, mask=oj == 0, other=0.0), 0)
                tl.debug_barrier()
            ring, rfr, beta, G, shift, s_ref, s_next, y, G_t, lse = beta_step(
                s, L, k_max, ring, rfr, beta, G, shift, s_ref, s_next, s_s, ps_s, pe_s,
                tr, d0, db_ptr, C, oj, oc, mc, K_PAD, HAS_PS, HAS_PE, REBASE, me, fl, HAS_MASK)
            tl.store(x_b + t * C + oc, y, mask=mc)
            tl.store(g_b + t + oj * 0, tl.zeros([K_PAD], tl.float64) + G_t, mask=oj == 0)
            if COMPARE:
                lo, hi = row_offset_bounds(y, y_ref, G_t - g_ref, mc, TOL)
                wlo, whi, delta, conv = window_row(wlo, whi, oj, tl.cast(t, tl.int32), lo, hi, delta, K, K_PAD, True)
            s -= 1
        return ring, rfr, beta, G, s_ref, conv, delta, b - 1 - s, s + 2

    @triton.jit
    def _fix_suffix_frames(g_b, t_low, b, delta, BLOCK: tl.constexpr):
        """Move the frames of rows t_low .. b (written by a converged fix-up) into the stored rows'
        system: minus delta."""
        tl.debug_barrier()
        o = tl.arange(0, BLOCK)
        for p0 in range(t_low, b + 1, BLOCK):
            p = p0 + o
            m = p <= b
            tl.store(g_b + p, tl.load(g_b + p, mask=m, other=0.0) - delta, mask=m)

    @triton.jit
    def _beta_factored_kernel(
        cum_ptr,  # (B, T+1, C)
        tr_ptr,  # (C, C)
        db_ptr,  # (K, C)
        len_ptr,  # (B,)
        ps_ptr,  # (B, T, C)
        pe_ptr,  # (B, T, C)
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
        K_BLOCK: tl.constexpr,
        HAS_PS: tl.constexpr,
        HAS_PE: tl.constexpr,
        IDX64: tl.constexpr = False,
    ):
        b = tl.program_id(0).to(tl.int64)
        L = seq_length(len_ptr, b, IDX64)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        ok = tl.arange(0, K_BLOCK)
        cum_b = cum_ptr + b * s_cum_b
        ps_b = ps_ptr + b * s_p_b
        pe_b = pe_ptr + b * s_p_b
        w_b = w_ptr + b * s_a_b
        f_b = f_ptr + b * s_f_b
        x_b = x_ptr + b * s_a_b
        g_b = g_ptr + b * s_f_b
        tr = load_transition(tr_ptr, oc, mc, C)
        beta = tl.where(mc, 0.0, MASK)
        G = tl.sum(tl.zeros([1], dtype=tl.float64), 0)
        for i in range(0, L):
            s = L - 1 - i
            t = s + 1
            # Y_t = pe_{t-1} + beta_t (X_t of docs/internals.md §3 minus S_t), frame G_t
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
            lse = run_m + log_(tl.where(mc & (run_s > 0), run_s, 1.0))
            if s == 0:
                # u_0 + v_0 = U_0 + lse_0
                z0 = tl.load(w_b + oc, mask=mc, other=MASK) + lse
                mz = tl.max(z0, 0)
                tl.store(lzb_ptr + b, tl.load(f_b) + G + (mz + log_(tl.sum(tl.exp(z0 - mz), 0))).to(tl.float64))
            # v_s = ps_s + lse_s; beta_s(c') = LSE_c Tr[c', c] + v_s(c)
            v = lse
            if HAS_PS:
                v += tl.load(ps_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
            v = tl.where(mc, v, MASK)
            y = tr + v[None, :]
            my = tl.max(y, 1)
            bs = my + log_(tl.sum(tl.exp(y - my[:, None]), 1))
            bs = tl.where(mc, bs, MASK)
            m = possible_shift(tl.max(bs, 0))
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
        IDX64: tl.constexpr = False,
    ):
        """The beta recurrence with its ring of Y rows in registers (:func:`beta_step`), one
        program per sequence from s = L-1 down to 0; rows read from memory (S, ps, pe) are loaded
        one step ahead. The marginals are left to the parallel kernel."""
        b = tl.program_id(0).to(tl.int64)
        L = seq_length(len_ptr, b, IDX64)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        oj = tl.arange(0, K_PAD)
        k_max = tl.minimum(K, L)
        cum_b = cum_ptr + b * s_cum_b
        ps_b = ps_ptr + b * s_p_b
        pe_b = pe_ptr + b * s_p_b
        w_b = w_ptr + b * s_a_b
        f_b = f_ptr + b * s_f_b
        x_b = x_ptr + b * s_a_b
        g_b = g_ptr + b * s_f_b
        # shape: (C_PAD src, C_PAD dst): the reduction over destinations runs along the fast axis
        tr = load_transition(tr_ptr, oc, mc, C)
        d0 = tl.load(db_ptr + oc, mask=mc, other=MASK).to(tl.float32)
        beta = tl.where(mc, 0.0, MASK)
        shift = possible_shift(tl.max(beta, 0))
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
            ring, rfr, beta, G, shift, s_ref, s_next, y, G_t, lse = beta_step(
                s, L, k_max, ring, rfr, beta, G, shift, s_ref, s_next, s_s, ps_s, pe_s,
                tr, d0, db_ptr, C, oj, oc, mc, K_PAD, HAS_PS, HAS_PE, REBASE)
            # outputs, beside the critical path
            tl.store(x_b + t * C + oc, y, mask=mc)
            tl.store(g_b + t, G_t)
            if s == 0:
                # u_0 + v_0 = U_0 + lse_0
                z0 = tl.load(w_b + oc, mask=mc, other=MASK) + lse
                mz = tl.max(z0, 0)
                tl.store(lzb_ptr + b, tl.load(f_b) + G_t + (mz + log_(tl.sum(tl.exp(z0 - mz), 0))).to(tl.float64))

    @triton.jit
    def dur_beta_step(s, b0, L, G, x_b, g_b, st32, st64, cum_b, ps_b, tr_ptr, db_ptr, C, K, oc, mc, m2c,
                      C_PAD: tl.constexpr, HAS_PS: tl.constexpr, RESTORE: tl.constexpr, lim_b=None, fl_b=None,
                      HAS_MASK: tl.constexpr = False):
        """One position of the direct beta recurrence of a (K, C, C) transition:

            beta_s(c') = LSE_{k, c} Tr[k-1, c', c] + ps_s(c) + D[k-1, c] + S_{s+k}(c) - S_s(c) + Y_{s+k}(c)

        over k <= min(K, L - s). Reads Y_hat_t (t = s+1 .. s+K) from row t of ``x_b`` / ``g_b`` or,
        with RESTORE, for t > b0 from row t - b0 of a saved state ``st32`` / ``st64`` (beta_hat_b0,
        then the Y rows of positions b0+1 .. b0+K-1, and their frames; a chunk's successor's end),
        so a run never reads rows another program may be writing.

        ``G`` is the frame of Y_hat_{s+1}. Returns ``(beta_hat_s, G_s)`` normalised by its maximum.

        HAS_MASK: ``lim_b`` is the sequence's (T+1, C) int32 ``max_end`` and ``fl_b`` its flag bytes
        (``limits.py``): a segment [s, t) of label c enters only if t <= max_end[s, c], and none
        does where a flag forbids a start at s.

        ``tr_ptr``: the transition transposed, ``[k, c, c']`` (:func:`beta_transition`).
        """
        s_s, base, me = _dur_beta_start(s, cum_b, ps_b, lim_b, fl_b, C, oc, mc, C_PAD, HAS_PS, HAS_MASK)
        k_lim = tl.minimum(L - s, K)
        run_m = tl.full([C_PAD], MASK, tl.float32)
        run_s = tl.zeros([C_PAD], dtype=tl.float32)
        for k in range(1, k_lim + 1):
            t = s + k
            if RESTORE:
                own = t <= b0
                jc = tl.where(own, 0, t - b0)
                # both addresses are valid (jc = 0 for own rows): load both, select
                xv = tl.where(own, tl.load(x_b + t * C + oc, mask=mc, other=MASK),
                              tl.load(st32 + jc * C + oc, mask=mc, other=MASK))
                gt = tl.where(own, tl.load(g_b + t), tl.load(st64 + jc))
            else:
                xv = tl.load(x_b + t * C + oc, mask=mc, other=MASK)
                gt = tl.load(g_b + t)
            y = _dur_beta_tile(t, k, base, xv, (gt - G).to(tl.float32), s_s, me, cum_b, tr_ptr, db_ptr, C, oc, mc,
                               m2c, HAS_MASK)
            nm = tl.maximum(run_m, tl.max(y, 0))
            run_s = run_s * tl.exp(run_m - nm) + tl.sum(tl.exp(y - nm[None, :]), 0)
            run_m = nm
        bs = tl.where(mc, run_m + log_(tl.where(run_s > 0, run_s, 1.0)), MASK)
        m = possible_shift(tl.max(bs, 0))
        beta = tl.where(mc, tl.maximum(bs - m, MASK), MASK)
        G = G + m.to(tl.float64)
        return beta, G

    @triton.jit
    def dur_ent_beta_step(s, b0, L, Gh, h_b, gh_b, st32, st64, ex_b, eg_b, cum_b, ps_b, tr_ptr, db_ptr, C, K, oc, mc,
                          m2c, C_PAD: tl.constexpr, HAS_PS: tl.constexpr, lim_b, fl_b, HAS_MASK: tl.constexpr):
        """One position of the suffix entropies of a (K, C, C) transition (the entropy engine's
        backward half): h'_s(c'), the entropy of the suffix given that a segment of label c' ends
        at s,

            h'_s(c') = sum_{k, c} sigma (h'_{s+k}(c) - log sigma),
            sigma ∝ exp(Tr[k-1, c', c] + ps_s(c) + D[k-1, c] + S_{s+k}(c) - S_s(c) + Y_{s+k}(c)),

        the weights of :func:`dur_beta_step`'s terms, from the stored Y rows ``ex_b`` and their
        global frames ``eg_b`` (h'_L = 0: the sequence's end is no choice). The h' rows of
        t > b0 come from the run's start state (``st32`` / ``st64``: row t - b0), earlier ones from
        ``h_b`` / ``gh_b``; ``Gh`` is the frame of h'_{s+1}. Masks as :func:`dur_beta_step`'s.
        Returns ``(h'_hat_s, Gh_s)`` as :func:`~.forward.dur_ent_step` returns its row."""
        s_s, base, me = _dur_beta_start(s, cum_b, ps_b, lim_b, fl_b, C, oc, mc, C_PAD, HAS_PS, HAS_MASK)
        gref = tl.load(eg_b + s + 1)
        run_m = tl.full([C_PAD], MASK, tl.float32)
        run_s = tl.zeros([C_PAD], dtype=tl.float32)
        run_r = tl.zeros([C_PAD], dtype=tl.float32)
        for k in range(1, tl.minimum(L - s, K) + 1):
            t = s + k
            own = t <= b0
            jc = tl.where(own, 0, t - b0)
            # both addresses are valid (jc = 0 for own rows): load both, select
            hv = tl.where(own, tl.load(h_b + t * C + oc, mask=mc, other=0.0),
                          tl.load(st32 + jc * C + oc, mask=mc, other=0.0))
            hv += (tl.where(own, tl.load(gh_b + t), tl.load(st64 + jc)) - Gh).to(tl.float32)
            y = _dur_beta_tile(t, k, base, tl.load(ex_b + t * C + oc, mask=mc, other=MASK),
                               (tl.load(eg_b + t) - gref).to(tl.float32), s_s, me, cum_b, tr_ptr, db_ptr, C, oc, mc,
                               m2c, HAS_MASK)
            nm = tl.maximum(run_m, tl.max(y, 0))
            sc = tl.exp(run_m - nm)
            e = tl.exp(y - nm[None, :])
            run_s = run_s * sc + tl.sum(e, 0)
            run_r = run_r * sc + tl.sum(e * (hv[:, None] - y), 0)
            run_m = nm
        return ent_row(run_m, run_s, run_r, mc, Gh)

    @triton.jit
    def _dur_beta_start(s, cum_b, ps_b, lim_b, fl_b, C, oc, mc, C_PAD: tl.constexpr, HAS_PS: tl.constexpr,
                        HAS_MASK: tl.constexpr):
        """What every term of a direct beta step at s shares: ``(S_s, base, max_end)``, ``base`` the
        row ps_s (+ IMPOSSIBLE where a flag forbids a start at s), ``max_end`` the mask's row at s
        (HAS_MASK; else unused)."""
        s_s = tl.load(cum_b + s * C + oc, mask=mc, other=0.0)
        base = tl.zeros([C_PAD], dtype=tl.float32)
        if HAS_PS:
            base += tl.load(ps_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
        me = oc
        if HAS_MASK:
            me = tl.load(lim_b + s * C + oc, mask=mc, other=0)
            base += tl.where((tl.load(fl_b + s) & 4) == 0, 0.0, MASK)
        return s_s, base, me

    @triton.jit
    def _dur_beta_tile(t, k, base, xv, dk, s_s, me, cum_b, tr_ptr, db_ptr, C, oc, mc, m2c, HAS_MASK: tl.constexpr):
        """(C_PAD label, C_PAD source) terms of the segments [s, t) of duration k of the direct beta
        recurrence: ``Tr[k-1, c', c] + base[c] + xv[c] + dk + S_t(c) - S_s(c) + D[k-1, c]``, from
        the transposed transition (:func:`beta_transition`; the caller reduces over rows)
        (``base``: ps_s and a forbidden start's mask; ``xv`` the Y row of t, ``dk`` its frame
        relative to the step's), IMPOSSIBLE past ``me`` (HAS_MASK: max_end at s)."""
        dk += (tl.load(cum_b + t * C + oc, mask=mc, other=0.0) - s_s).to(tl.float32)
        col = base + xv + dk + tl.load(db_ptr + (k - 1) * C + oc, mask=mc, other=MASK).to(tl.float32)
        if HAS_MASK:
            col += tl.where(t <= me, 0.0, MASK)
        trk = tl.load(tr_ptr + (k - 1) * C * C + oc[:, None] * C + oc[None, :], mask=m2c, other=MASK)
        return trk.to(tl.float32) + col[:, None]

    @triton.jit
    def _dur_save_end(e32, e64, a, b, beta, G, x_b, g_b, st32, st64, K, C, oc, mc, C_PAD: tl.constexpr):
        """End state of a run over b-1 .. a that started from ``st32`` / ``st64``: beta_hat_a (the
        run's register row), the Y rows of positions a+1 .. a+K-1 (its own rows up to b, then the
        start state's) and their frames."""
        tl.store(e32 + oc, beta, mask=mc)
        tl.store(e64 + oc * 0, tl.zeros([C_PAD], tl.float64) + G, mask=oc == 0)
        for i in range(1, K):
            p = a + i
            own = p <= b
            jc = tl.where(own, 0, p - b)
            po = tl.where(own, p, 0)
            row = tl.where(own, tl.load(x_b + po * C + oc, mask=mc, other=MASK),
                           tl.load(st32 + jc * C + oc, mask=mc, other=MASK))
            fr = tl.where(own, tl.load(g_b + po), tl.load(st64 + jc))
            tl.store(e32 + i * C + oc, row, mask=mc)
            tl.store(e64 + i + oc * 0, tl.zeros([C_PAD], tl.float64) + fr, mask=oc == 0)

    @triton.jit
    def _dur_run_chunk(a, b, L, st32, st64, live, cum_b, ps_b, pe_b, x_b, g_b, tr_ptr, db_ptr, C, K,
                       oc, mc, m2c, oj, TOL,
                       C_PAD: tl.constexpr, K_PAD: tl.constexpr, HAS_PS: tl.constexpr, HAS_PE: tl.constexpr,
                       COMPARE: tl.constexpr, lim_b=None, fl_b=None, HAS_MASK: tl.constexpr = False, ex_b=None,
                       eg_b=None, ENT: tl.constexpr = False):
        """Run s = b-1 down to a of the direct beta recurrence (:func:`dur_beta_step`; ``ENT``: the
        suffix entropies of :func:`dur_ent_beta_step`, weighted by the stored Y rows ``ex_b`` /
        ``eg_b``, its rows h' itself rather than Y) from the
        state at b, storing Y rows b .. a+1 (see the forward's ``_dur_run_chunk``); rows past b are
        read from the state only. Returns ``(beta_hat_a, G, converged, delta, steps, t_low)``: this
        run wrote rows t_low .. b."""
        lim = tl.where(live, C, 0)
        lim1 = tl.where(live, 1, 0)
        beta = tl.load(st32 + oc, mask=oc < lim, other=MASK)
        G = tl.sum(tl.load(st64 + oc * 0, mask=oc < lim1, other=0.0), 0)
        wlo, whi, conv, delta = window_start(K_PAD)
        s = b - 1
        while (s >= a) & (conv == 0):
            t = s + 1
            # Y_t = pe_{t-1} + beta_t, frame G_t
            y = beta
            if HAS_PE:
                if not ENT:
                    y += tl.load(pe_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
            y = tl.where(mc, y, MASK)
            if COMPARE:
                y_ref = tl.load(x_b + t * C + oc, mask=mc, other=MASK)
                g_ref = tl.sum(tl.load(g_b + t + oc * 0, mask=oc == 0, other=0.0), 0)
                # the stored row is read before this program overwrites it
                tl.debug_barrier()
            tl.store(x_b + t * C + oc, y, mask=mc)
            tl.store(g_b + t + oc * 0, tl.zeros([C_PAD], tl.float64) + G, mask=oc == 0)
            if COMPARE:
                lo, hi = row_offset_bounds(y, y_ref, G - g_ref, mc, TOL)
                wlo, whi, delta, conv = window_row(wlo, whi, oj, tl.cast(t, tl.int32), lo, hi, delta, K, K_PAD, True)
            # the step reads this row from other threads
            tl.debug_barrier()
            if ENT:
                beta, G = dur_ent_beta_step(s, b, L, G, x_b, g_b, st32, st64, ex_b, eg_b, cum_b, ps_b, tr_ptr, db_ptr,
                                            C, K, oc, mc, m2c, C_PAD, HAS_PS, lim_b, fl_b, HAS_MASK)
            else:
                beta, G = dur_beta_step(s, b, L, G, x_b, g_b, st32, st64, cum_b, ps_b, tr_ptr, db_ptr, C, K, oc, mc,
                                        m2c, C_PAD, HAS_PS, True, lim_b, fl_b, HAS_MASK)
            s -= 1
        return beta, G, conv, delta, b - 1 - s, s + 2

    @triton.jit
    def _beta_duration_tr_kernel(
        cum_ptr,  # (B, T+1, C)
        tr_ptr,  # (K, C, C)
        db_ptr,  # (K, C)
        len_ptr,  # (B,)
        ps_ptr,  # (B, T, C)
        pe_ptr,  # (B, T, C)
        x_ptr,  # (B, T+1, C) out: Y_hat = pe_{t-1} + beta_hat_t
        g_ptr,  # (B, T+1) float64 out
        C,
        K,
        s_cum_b,
        s_p_b,
        s_a_b,
        s_f_b,
        C_PAD: tl.constexpr,
        HAS_PS: tl.constexpr,
        HAS_PE: tl.constexpr,
        IDX64: tl.constexpr = False,
    ):
        """The direct beta recurrence (:func:`dur_beta_step`), one program per sequence from
        s = L-1 down to 0."""
        b = tl.program_id(0).to(tl.int64)
        L = seq_length(len_ptr, b, IDX64)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        m2c = mc[:, None] & mc[None, :]
        cum_b = cum_ptr + b * s_cum_b
        ps_b = ps_ptr + b * s_p_b
        pe_b = pe_ptr + b * s_p_b
        x_b = x_ptr + b * s_a_b
        g_b = g_ptr + b * s_f_b
        beta = tl.where(mc, 0.0, MASK)
        G = tl.sum(tl.zeros([1], dtype=tl.float64), 0)
        for i in range(0, L):
            s = L - 1 - i
            t = s + 1
            # Y_t = pe_{t-1} + beta_t, frame G_t
            xt = beta
            if HAS_PE:
                xt += tl.load(pe_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
            xt = tl.where(mc, xt, MASK)
            tl.store(x_b + t * C + oc, xt, mask=mc)
            tl.store(g_b + t, G)
            # the step reads this row from other threads
            tl.debug_barrier()
            beta, G = dur_beta_step(s, L, L, G, x_b, g_b, x_b, g_b, cum_b, ps_b, tr_ptr, db_ptr, C, K, oc, mc, m2c,
                                    C_PAD, HAS_PS, False)
