"""The entropy and its gradient on the time-parallel engine (a (C, C) transition).

``H = log Z - E[score]`` and, for an edge e (a segment [s, s+k) of label c after label c'),

    dH / dw_e = -mu_e (log mu_e + H - h_s(c') - h'_{s+k}(c)),

where ``h_s(c')`` is the entropy of the prefix distribution given that a segment of label c' ends
at s and ``h'_t(c)`` the entropy of the suffix distribution given that a segment of label c ends at
t (``E[score | e] - E[score]`` written with entropies: ``alpha - E[prefix score] = h``). Both obey
linear recurrences whose coefficients are the posterior "which predecessor / which duration"
probabilities, known once the forward's and beta's rows are stored:

    hU_s(c) = sum_{c'} pi_s(c'|c) (h_s(c') - log pi_s(c'|c)),   pi_s ∝ exp(alpha_s(c') + Tr[c', c])
    h_t(c)  = sum_k rho_t(k|c) (hU_{t-k}(c) - log rho_t(k|c)),  rho_t ∝ exp(U_{t-k} + D[k-1] + S_t - S_{t-k})

and the mirror image for ``h'`` (suffix entropies ``hY_t = h'_t`` at the Y rows, through the
segment-start entropies ``hV``). The scores themselves never enter: the values stay small (an
entropy accumulated within a chunk), so float32 rows relative to per-chunk float64 offsets are
enough.

Time-parallel like the forward (``chunks.py``), one kernel for both directions
(``_ent_chunks_kernel``, ``REVERSE`` for the suffix entropies): every chunk runs from a guessed start (entropy
0, the true weights), a fix-up reruns it from its neighbour's end state until the last K rows
differ from the stored ones by one constant delta (the recurrence is linear and its
coefficients are stochastic, so the difference becomes a constant as the posterior chain
mixes), and a repair walks the chunks whose neighbour did not converge. Offsets are the prefix
(suffix) sums of the deltas (``parallel.py``).

Then the weighted marginals (``marginals._shared_factored_kernel`` with ``ENT``): every marginal
of ``marginals.py`` times its factor ``log mu + H - h - h'``, with H interpolated between anchors
where it is computed from the rows themselves (``marginals._anchor_kernel`` with ``ENT``: H is the
entropy of the segment covering the anchor plus the expected entropies of its prefix and suffix),
as the log Z anchors of the marginals remove the float32 drift of the rows. With ``q`` those weighted
marginals, ``dH/dtheta = -(the map from marginals to gradients)(q)``.
"""

from __future__ import annotations

import torch

from torch_semimarkov.engines.triton.common import HAS_TRITON, REBASE, tl, triton  # noqa: F401

if HAS_TRITON:
    from torch_semimarkov.engines.triton.common import MASK_K as MASK
    from torch_semimarkov.engines.triton.common import load_transition
    from torch_semimarkov.engines.triton.beta import _fix_suffix_frames
    from torch_semimarkov.engines.triton.common import log_, possible_shift, row_offset_bounds
    from torch_semimarkov.engines.triton.common import window_row, window_start
    from torch_semimarkov.engines.triton.common import chunk_clean, passed_clean, record_rerun, rerun_owns_end
    from torch_semimarkov.engines.triton.common import sweep_chunk, sweep_start
    from torch_semimarkov.engines.triton.forward import _fix_prefix_frames

    @triton.jit
    def _load_ent_state(e32, e64, live, oj, oc, C_PAD: tl.constexpr, K_PAD: tl.constexpr):
        """A saved entropy state: the ring of entropy rows (K_PAD, C_PAD), the current row, the
        ring's frames and the current frame."""
        lj = oj < live * K_PAD
        lc = oc < live * C_PAD
        hr = tl.load(e32 + oj[:, None] * C_PAD + oc[None, :], mask=lj[:, None] & lc[None, :], other=0.0)
        h = tl.load(e32 + K_PAD * C_PAD + oc, mask=lc, other=0.0)
        hfr = tl.load(e64 + oj, mask=lj, other=0.0)
        Fh = tl.sum(tl.load(e64 + K_PAD + oj * 0, mask=(oj == 0) & lj, other=0.0), 0)
        return hr, h, hfr, Fh

    @triton.jit
    def _save_ent_state(e32, e64, live, hr, h, hfr, Fh, oj, oc, C_PAD: tl.constexpr, K_PAD: tl.constexpr):
        lj = oj < live * K_PAD
        lc = oc < live * C_PAD
        tl.store(e32 + oj[:, None] * C_PAD + oc[None, :], hr, mask=lj[:, None] & lc[None, :])
        tl.store(e32 + K_PAD * C_PAD + oc, h, mask=lc)
        tl.store(e64 + oj, hfr, mask=lj)
        tl.store(e64 + K_PAD + oj * 0, tl.zeros([K_PAD], tl.float64) + Fh, mask=(oj == 0) & lj)

    @triton.jit
    def _rebase(h, ok, F):
        """Keep a row of entropies small: subtract its largest real value and add it to the
        float64 frame (entropies grow along the sequence; the increments stay small)."""
        sh = possible_shift(tl.max(tl.where(ok, h, -3e38), 0))
        return tl.where(ok, h - sh, h), F + sh.to(tl.float64)

    @triton.jit
    def _mix_step(xk, hr):
        """``sum_k rho_k (hr_k - log rho_k)`` per column with ``rho = softmax_k(xk)``, and the
        log-sum-exp of ``xk``; ``ok`` False where no entry is real.

        No select per entry: an entry that is not real sits below -1e29 (the inputs' forbidden
        values and the rows' impossible ones are the finite IMPOSSIBLE, -1e30, never -inf), so in
        a column with a real entry its weight ``exp(xk - m)`` is exactly 0 and ``0 * (hr - xk)``
        is 0 (every term is finite); a column with none is dropped by ``ok``. The same values as
        masking each entry (up to how the compiler fuses the arithmetic: float32 rounding), for
        less work a step."""
        m = tl.max(xk, 0)
        ok = m > -1e29
        pk = tl.exp(xk - m[None, :])
        z = tl.sum(pk, 0)
        lz = log_(z)
        h = tl.sum(pk * (hr - xk + m[None, :]), 0) / z + lz
        return tl.where(ok, h, 0.0), tl.where(ok, m + lz, MASK), ok

    @triton.jit
    def _pick_step(x, hv):
        """``sum_j p_j (hv_j - log p_j)`` per row of x (softmax over the fast axis j); entries
        that are not real weigh exactly 0 (see ``_mix_step``)."""
        mx = tl.max(x, 1)
        ok = mx > -1e29
        ex = tl.exp(x - mx[:, None])
        z = tl.sum(ex, 1)
        lz = mx + log_(z)
        h = tl.sum(ex * (hv[None, :] - (x - lz[:, None])), 1) / z
        return tl.where(ok, h, 0.0), ok

    @triton.jit
    def _stored_ref(row, F, row_b, f_b, q, C, oc, mc, COMPARE: tl.constexpr):
        """What a fix-up compares its row q with: the stored row and frame, read before this run
        overwrites them (``(row, F)`` themselves without COMPARE)."""
        ref = row
        f_ref = F
        if COMPARE:
            ref = tl.load(row_b + q * C + oc, mask=mc, other=MASK)
            f_ref = tl.load(f_b + q)
            tl.debug_barrier()
        return ref, f_ref

    @triton.jit
    def _prefix_label_step(h, av, uv, trT, s, Fh, h_b, hu_b, fh_b, C, oc, mc, COMPARE: tl.constexpr):
        """The prefix entropies' label step at s: ``hU_s`` from ``h_s`` (the predecessor label; the
        phantom at s = 0 is no choice), then rows ``h_s``, ``hU_s`` and their frame stored (a
        fix-up first reads the stored ``hU_s`` and frame it compares with). Returns ``(hU_s,
        stored hU_s, stored frame)`` (the last two ``hU_s`` and ``Fh`` without COMPARE)."""
        hu, _ = _pick_step(trT + av[None, :], h)
        hu = tl.where(mc & (uv > -1e29), tl.where(s == 0, 0.0, hu), MASK)
        hu_ref, fh_ref = _stored_ref(hu, Fh, hu_b, fh_b, s, C, oc, mc, COMPARE)
        tl.store(h_b + s * C + oc, h, mask=mc)
        tl.store(hu_b + s * C + oc, hu, mask=mc)
        tl.store(fh_b + s, Fh)
        return hu, hu_ref, fh_ref

    @triton.jit
    def _suffix_row_step(hy, yv, t, Gh, hy_b, gh_b, C, oc, mc, COMPARE: tl.constexpr):
        """The suffix entropies' row t: ``hY_t`` (impossible where Y_t is), stored with its frame
        (a fix-up first reads the stored row and frame it compares with). Returns ``(hY_t, stored
        hY_t, stored frame)`` (the last two ``hY_t`` and ``Gh`` without COMPARE); the mirror of
        :func:`_prefix_label_step`."""
        hyrow = tl.where(mc & (yv > -1e29), hy, MASK)
        hy_ref, gh_ref = _stored_ref(hyrow, Gh, hy_b, gh_b, t, C, oc, mc, COMPARE)
        tl.store(hy_b + t * C + oc, hyrow, mask=mc)
        tl.store(gh_b + t, Gh)
        return hyrow, hy_ref, gh_ref

    @triton.jit
    def _compare_window(row, ref, fd, mc, TOL, wlo, whi, oj, q32, delta, K, K_PAD: tl.constexpr,
                        REVERSE: tl.constexpr):
        """A fix-up's test of the recomputed entropy row of position q (``q32``) against the stored
        one (their frames ``fd`` apart): its offset interval enters the window ring of the last K
        rows in the run's direction. Returns ``(wlo, whi, delta, converged)``."""
        lo, hi = row_offset_bounds(row, ref, fd, mc, TOL)
        return window_row(wlo, whi, oj, q32, lo, hi, delta, K, K_PAD, REVERSE)

    @triton.jit
    def _ent_fwd_run(a, b, L, k_max, hr, h, hfr, Fh, cum_b, a_b, w_b, f_b, h_b, hu_b, fh_b, trT, db_ptr, C, K, oj,
                     oc, mc, TOL,
                     C_PAD: tl.constexpr, K_PAD: tl.constexpr, REBASE: tl.constexpr, COMPARE: tl.constexpr, ms_b,
                     HAS_MASK: tl.constexpr):
        """Steps t = a+1 .. b of the prefix entropies from the state (hr, h) at a, storing rows
        ``h_s`` and ``hU_s`` (s = t-1). The weights come from the stored rows: the ring of
        ``U_hat_p - (S_p - S_ref)`` (frame ``rfr``) starts from rows a-K+1 .. a-1.
        Rows are relative to a float64 frame (``fh_b``, the same for ``h_s`` and ``hU_s``).
        COMPARE (fix-up): stop once the last K ``hU`` rows differ from the stored ones by one
        constant. Returns ``(hr, h, hfr, Fh, converged, delta, steps, t_last)``."""
        a_in = tl.minimum(a, L)
        s_ref = tl.load(cum_b + a_in * C + oc, mask=mc, other=0.0).to(tl.float32)
        p = a_in - 1 - ((a_in - 1 - oj) & (K_PAD - 1))
        vp = p >= 0
        m2 = vp[:, None] & mc[None, :]
        pr = tl.where(vp, p, 0)
        ring = tl.load(w_b + pr[:, None] * C + oc[None, :], mask=m2, other=MASK)
        sp = tl.load(cum_b + pr[:, None] * C + oc[None, :], mask=m2, other=0.0).to(tl.float32)
        ring = tl.where(m2, ring - (sp - s_ref[None, :]), MASK)
        rfr = tl.load(f_b + pr, mask=vp, other=0.0)
        s_prev = s_ref
        wlo, whi, conv, delta = window_start(K_PAD)
        t = a + 1
        # the stored rows of step t are loaded during step t-1 (they do not depend on the
        # recurrence): a load's latency is then off the critical path; the row index is clamped
        # into the sequence instead of masked (a row past b is loaded but never used)
        av_n = tl.load(a_b + a_in * C + oc, mask=mc, other=MASK)
        uv_n = tl.load(w_b + a_in * C + oc, mask=mc, other=MASK)
        fs_n = tl.load(f_b + a_in)
        st_n = tl.load(cum_b + tl.minimum(a_in + 1, L) * C + oc, mask=mc, other=0.0).to(tl.float32)
        ms_n = tl.zeros([C_PAD], dtype=tl.int32)
        if HAS_MASK:
            ms_n = tl.load(ms_b + tl.minimum(a_in + 1, L) * C + oc, mask=mc, other=0)
        while (t <= b) & (conv == 0):
            s = t - 1
            s32 = tl.cast(s, tl.int32)
            av = av_n
            uv = uv_n
            fs = fs_n
            s_t = st_n
            ms = ms_n
            tn = tl.minimum(t, L)
            av_n = tl.load(a_b + tn * C + oc, mask=mc, other=MASK)
            uv_n = tl.load(w_b + tn * C + oc, mask=mc, other=MASK)
            fs_n = tl.load(f_b + tn)
            st_n = tl.load(cum_b + tl.minimum(t + 1, L) * C + oc, mask=mc, other=0.0).to(tl.float32)
            if HAS_MASK:
                ms_n = tl.load(ms_b + tl.minimum(t + 1, L) * C + oc, mask=mc, other=0)
            hu, hu_ref, fh_ref = _prefix_label_step(h, av, uv, trT, s, Fh, h_b, hu_b, fh_b, C, oc, mc, COMPARE)
            slot = s32 & (K_PAD - 1)
            ring = tl.where(oj[:, None] == slot, (uv - (s_prev - s_ref))[None, :], ring)
            rfr = tl.where(oj == slot, fs, rfr)
            hr = tl.where(oj[:, None] == slot, hu[None, :], hr)
            hfr = tl.where(oj == slot, Fh, hfr)
            F_s = Fh
            # h_t: the duration of the segment ending at t
            kj = ((s32 - oj) & (K_PAD - 1)) + 1
            vj = kj <= tl.minimum(k_max, t)
            drot = tl.load(db_ptr + (kj[:, None] - 1) * C + oc[None, :], mask=vj[:, None] & mc[None, :],
                           other=MASK).to(tl.float32)
            xk = ring + drot + (rfr - fs).to(tl.float32)[:, None]
            if HAS_MASK:
                xk = tl.where((t - kj)[:, None] >= ms[None, :], xk, MASK)
            hn, _, okn = _mix_step(xk, hr + (hfr - Fh).to(tl.float32)[:, None])
            h, Fh = _rebase(tl.where(okn & mc, hn, 0.0), okn & mc, Fh)
            if COMPARE:
                wlo, whi, delta, conv = _compare_window(hu, hu_ref, F_s - fh_ref, mc, TOL, wlo, whi, oj, s32, delta,
                                                        K, K_PAD, False)
            s_prev = s_t
            if t % REBASE == 0:
                ring += (s_t - s_ref)[None, :]
                s_ref = s_t
            t += 1
        return hr, h, hfr, Fh, conv, delta, t - 1 - a, t - 1

    @triton.jit
    def _ent_beta_run(a, b, L, k_max, hr, hy, hfr, Gh, cum_b, ps_b, x_b, g_b, hy_b, gh_b, tr, db_ptr, C, K, oj, oc,
                      mc, TOL,
                      C_PAD: tl.constexpr, K_PAD: tl.constexpr, REBASE: tl.constexpr, HAS_PS: tl.constexpr, COMPARE: tl.constexpr,
                      me_b, fl_b, HAS_MASK: tl.constexpr):
        """Steps s = b-1 down to a of the suffix entropies from the state (hr, hy) at b, storing
        rows ``hY_t = h'_t`` (t = s+1). The weights come from the stored Y rows: the ring of
        ``Y_hat_p + (S_p - S_ref)`` (frame ``rfr``) starts from rows b+1 .. b+K-1.
        Rows are relative to a float64 frame (``gh_b``). Returns
        ``(hr, hy, hfr, Gh, converged, delta, steps, t_low)``: this run wrote rows t_low .. b."""
        b_in = tl.minimum(b, L)
        s_ref = tl.load(cum_b + b_in * C + oc, mask=mc, other=0.0).to(tl.float32)
        p = b_in + 1 + ((oj - b_in - 1) & (K_PAD - 1))
        vp = p <= L
        m2 = vp[:, None] & mc[None, :]
        pr = tl.where(vp, p, 0)
        ring = tl.load(x_b + pr[:, None] * C + oc[None, :], mask=m2, other=MASK)
        sp = tl.load(cum_b + pr[:, None] * C + oc[None, :], mask=m2, other=0.0).to(tl.float32)
        ring = tl.where(m2, ring + (sp - s_ref[None, :]), MASK)
        rfr = tl.load(g_b + pr, mask=vp, other=0.0)
        s_next = s_ref
        wlo, whi, conv, delta = window_start(K_PAD)
        s = b - 1
        # step s's stored rows are loaded during step s+1 (see the forward's run)
        sn = tl.maximum(tl.minimum(s, L), 0)
        yv_n = tl.load(x_b + (sn + 1) * C + oc, mask=mc, other=MASK)
        gt_n = tl.load(g_b + sn + 1)
        ss_n = tl.load(cum_b + sn * C + oc, mask=mc, other=0.0).to(tl.float32)
        ps_n = tl.zeros([C_PAD], dtype=tl.float32)
        if HAS_PS:
            ps_n = tl.load(ps_b + sn * C + oc, mask=mc, other=0.0).to(tl.float32)
        me_n = tl.zeros([C_PAD], dtype=tl.int32)
        fl_n = tl.full([], 0, tl.int32)
        if HAS_MASK:
            me_n = tl.load(me_b + sn * C + oc, mask=mc, other=0)
            fl_n = tl.load(fl_b + sn).to(tl.int32)
        while (s >= a) & (conv == 0):
            t = s + 1
            t32 = tl.cast(t, tl.int32)
            yv = yv_n
            gt = gt_n
            s_s = ss_n
            ps_s = ps_n
            me = me_n
            fl = fl_n
            sn = tl.maximum(s - 1, 0)
            yv_n = tl.load(x_b + (sn + 1) * C + oc, mask=mc, other=MASK)
            gt_n = tl.load(g_b + sn + 1)
            ss_n = tl.load(cum_b + sn * C + oc, mask=mc, other=0.0).to(tl.float32)
            if HAS_PS:
                ps_n = tl.load(ps_b + sn * C + oc, mask=mc, other=0.0).to(tl.float32)
            if HAS_MASK:
                me_n = tl.load(me_b + sn * C + oc, mask=mc, other=0)
                fl_n = tl.load(fl_b + sn).to(tl.int32)
            hyrow, hy_ref, gh_ref = _suffix_row_step(hy, yv, t, Gh, hy_b, gh_b, C, oc, mc, COMPARE)
            slot = t32 & (K_PAD - 1)
            ring = tl.where(oj[:, None] == slot, (yv + (s_next - s_ref))[None, :], ring)
            rfr = tl.where(oj == slot, gt, rfr)
            hr = tl.where(oj[:, None] == slot, hyrow[None, :], hr)
            hfr = tl.where(oj == slot, Gh, hfr)
            G_t = Gh
            # hV_s: the duration of the segment starting at s
            kj = ((oj - t32) & (K_PAD - 1)) + 1
            vj = kj <= tl.minimum(L - s, k_max)
            drot = tl.load(db_ptr + (kj[:, None] - 1) * C + oc[None, :], mask=vj[:, None] & mc[None, :],
                           other=MASK).to(tl.float32)
            xk = ring + drot + (rfr - gt).to(tl.float32)[:, None]
            if HAS_MASK:
                xk = tl.where((s + kj)[:, None] <= me[None, :], xk, MASK)
            hv, lse, okv = _mix_step(xk, hr + (hfr - Gh).to(tl.float32)[:, None])
            # V_s(c) in frame G_t: its differences over c pick the segment's label
            v = lse - (s_s - s_ref)
            if HAS_PS:
                v += ps_s
            if HAS_MASK:
                v += tl.where((fl & 4) != 0, MASK, 0.0)
            v = tl.where(okv & mc, v, MASK)
            hv = tl.where(okv, hv, 0.0)
            # h'_s(c'): the label of the segment starting at s, given the predecessor c'
            hy, oky = _pick_step(tr + v[None, :], hv)
            hy, Gh = _rebase(tl.where(mc, hy, 0.0), oky & mc, Gh)
            if COMPARE:
                wlo, whi, delta, conv = _compare_window(hyrow, hy_ref, G_t - gh_ref, mc, TOL, wlo, whi, oj, t32,
                                                        delta, K, K_PAD, True)
            s_next = s_s
            if s % REBASE == 0:
                ring -= (s_s - s_ref)[None, :]
                s_ref = s_s
            s -= 1
        return hr, hy, hfr, Gh, conv, delta, b - 1 - s, s + 2

    @triton.jit
    def _ent_run(a, b, L, k_max, hr, h, hfr, Fh, cum_b, ps_b, a_b, r_b, f_b, h_b, hu_b, fh_b, M, db_ptr, C, K, oj,
                 oc, mc, TOL, C_PAD: tl.constexpr, K_PAD: tl.constexpr, REBASE: tl.constexpr, HAS_PS: tl.constexpr,
                 COMPARE: tl.constexpr, lim_b, fl_b, HAS_MASK: tl.constexpr, REVERSE: tl.constexpr):
        """One run of an entropy chunk in its direction (:func:`_ent_fwd_run`, :func:`_ent_beta_run`):
        ``(hr, h, hfr, Fh, converged, delta, steps, edge)``, ``edge`` the forward's ``t_last``, beta's
        ``t_low``."""
        if REVERSE:
            hr, h, hfr, Fh, conv, delta, steps, edge = _ent_beta_run(
                a, b, L, k_max, hr, h, hfr, Fh, cum_b, ps_b, r_b, f_b, h_b, fh_b, M, db_ptr, C, K, oj, oc, mc, TOL,
                C_PAD, K_PAD, REBASE, HAS_PS, COMPARE, lim_b, fl_b, HAS_MASK)
        else:
            hr, h, hfr, Fh, conv, delta, steps, edge = _ent_fwd_run(
                a, b, L, k_max, hr, h, hfr, Fh, cum_b, a_b, r_b, f_b, h_b, hu_b, fh_b, M, db_ptr, C, K, oj, oc, mc,
                TOL, C_PAD, K_PAD, REBASE, COMPARE, lim_b, HAS_MASK)
        return hr, h, hfr, Fh, conv, delta, steps, edge

    # -- a ring too large for registers (the blocked engine's shapes): the entropy rows read back ------
    # from memory, the sums over durations in tiles of KB rows (``MEM``)

    @triton.jit
    def _mem_h_rows(p, ok, own, hrow_b, fh_b, in32, in64, C, oc, mc, C_PAD: tl.constexpr, K_PAD: tl.constexpr,
                    HAS_IN: tl.constexpr):
        """Entropy rows ``p`` (KB,) of a memory-ring run and their frames: a row the run owns from
        its stored rows (``hrow_b``, ``fh_b``), a row before its start from the incoming state
        (slot ``p mod K_PAD`` of ``in32`` / ``in64``, the layout of ``_save_ent_state``) when
        ``HAS_IN``, else 0 in frame 0 (a speculative run's guess, as the register ring's)."""
        mo = ok & own
        po = tl.where(mo, p, 0)
        v = tl.load(hrow_b + po[:, None] * C + oc[None, :], mask=mo[:, None] & mc[None, :], other=0.0)
        fr = tl.load(fh_b + po, mask=mo, other=0.0)
        if HAS_IN:
            mi = ok & (~own)
            sl = tl.where(mi, p & (K_PAD - 1), 0)
            m2 = mi[:, None] & mc[None, :]
            v = tl.where(m2, tl.load(in32 + sl[:, None] * C_PAD + oc[None, :], mask=m2, other=0.0), v)
            fr = tl.where(mi, tl.load(in64 + sl, mask=mi, other=0.0), fr)
        return v, fr

    @triton.jit
    def _mix_entry(m, z, acc, x, hr):
        """Fold a (KB, C_PAD) tile into a running ``_mix_step`` kept per entry (no reduction across
        threads): max ``m``, ``z = sum exp(x - m)``, ``acc = sum exp(x - m) (hr - x)``, each over the
        tiles seen so far; one exponential an entry (``exp(-|x - m|)``, the new term's weight or the
        old sums' scale). :func:`_mix_rows` reduces the state over its rows. An entry that is not
        real (below -1e29) adds a weight 1 and a finite ``hr - x`` until a real one comes, then its
        sums are scaled by exactly 0, as in ``_mix_step``."""
        big = x > m
        nm = tl.maximum(m, x)
        e = tl.exp(tl.minimum(m, x) - nm)
        d = hr - x
        z = tl.where(big, z * e + 1.0, z + e)
        acc = tl.where(big, acc * e + d, acc + e * d)
        return nm, z, acc

    @triton.jit
    def _mix_rows(m, z, acc):
        """The per-entry state of :func:`_mix_entry` reduced over its rows: the running ``(m, z,
        acc)`` of each column, as :func:`_mix_value` takes it. Rows without a real entry are scaled
        by exactly 0 in a column with one; a column with none is dropped by its max."""
        mm = tl.max(m, 0)
        sc = tl.exp(m - mm[None, :])
        return mm, tl.sum(z * sc, 0), tl.sum(acc * sc, 0)

    @triton.jit
    def _mix_value(m, z, acc):
        """``(h, lse, ok)`` of a running mix (:func:`_mix_rows`), as ``_mix_step`` returns them."""
        ok = m > -1e29
        zz = tl.where(z > 0, z, 1.0)
        lz = log_(zz)
        return tl.where(ok, acc / zz + m + lz, 0.0), tl.where(ok, m + lz, MASK), ok

    @triton.jit
    def _mem_mix(s, t, k_lim, own_end, Fh, cum_b, r_b, f_b, hrow_b, fh_b, db_ptr, in32, in64, lim_b, C, oc, mc, okb,
                 C_PAD: tl.constexpr, K_PAD: tl.constexpr, KB: tl.constexpr, HAS_IN: tl.constexpr,
                 HAS_MASK: tl.constexpr, REVERSE: tl.constexpr):
        """A memory-ring step's sum over the durations k <= ``k_lim`` (``_mix_step`` in tiles of KB
        rows, folded per entry by :func:`_mix_entry`, reduced over the rows once by
        :func:`_mix_rows`). Forward (the segment [t - k, t) ending at t = s + 1): rows p = t - k,
        weights ``exp(U_hat_p + D[k-1] - (S_p - S_s) + frame_p - frame_s)``, entropies ``hU_p``,
        the run's own rows p >= ``own_end``. Beta (the segment [s, s + k)): rows p = s + k, weights
        ``exp(Y_hat_p + D[k-1] + (S_p - S_s) + frame_p - frame_t)``, entropies ``hY_p``, own rows
        p <= ``own_end``. Entropies relative to the frame ``Fh``; ``lim_b`` the segment limits
        (forward min_start at t, beta max_end at s). Returns the running ``(m, z, acc)``."""
        if REVERSE:
            f_ref = tl.load(f_b + t)
            q = s
        else:
            f_ref = tl.load(f_b + s)
            q = t
        s_s = tl.load(cum_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
        lim = tl.zeros([C_PAD], dtype=tl.int32)
        if HAS_MASK:
            lim = tl.load(lim_b + q * C + oc, mask=mc, other=0)
        m = tl.full([KB, C_PAD], MASK, tl.float32)
        z = tl.zeros([KB, C_PAD], dtype=tl.float32)
        acc = tl.zeros([KB, C_PAD], dtype=tl.float32)
        for k0 in range(0, k_lim, KB):
            kk = k0 + okb + 1
            ok = kk <= k_lim
            if REVERSE:
                p = s + kk
                own = p <= own_end
            else:
                p = t - kk
                own = p >= own_end
            pr = tl.where(ok, p, 0)
            m2 = ok[:, None] & mc[None, :]
            r = tl.load(r_b + pr[:, None] * C + oc[None, :], mask=m2, other=MASK)
            sp = tl.load(cum_b + pr[:, None] * C + oc[None, :], mask=m2, other=0.0).to(tl.float32)
            fp = tl.load(f_b + pr, mask=ok, other=0.0)
            d = tl.load(db_ptr + (kk[:, None] - 1) * C + oc[None, :], mask=m2, other=MASK).to(tl.float32)
            if REVERSE:
                x = r + d + ((fp - f_ref).to(tl.float32)[:, None] + (sp - s_s[None, :]))
            else:
                x = r + d + ((fp - f_ref).to(tl.float32)[:, None] - (sp - s_s[None, :]))
            x = tl.where(m2, x, MASK)
            if HAS_MASK:
                if REVERSE:
                    x = tl.where(p[:, None] <= lim[None, :], x, MASK)
                else:
                    x = tl.where(p[:, None] >= lim[None, :], x, MASK)
            hv, hf = _mem_h_rows(p, ok, own, hrow_b, fh_b, in32, in64, C, oc, mc, C_PAD, K_PAD, HAS_IN)
            m, z, acc = _mix_entry(m, z, acc, x, hv + (hf - Fh).to(tl.float32)[:, None])
        return _mix_rows(m, z, acc)

    @triton.jit
    def _ent_fwd_mem_run(a, b, L, k_max, h, Fh, cum_b, a_b, w_b, f_b, h_b, hu_b, fh_b, trT, db_ptr, in32, in64, C, K,
                         oj, oc, mc, okb, TOL, C_PAD: tl.constexpr, K_PAD: tl.constexpr, KB: tl.constexpr,
                         COMPARE: tl.constexpr, HAS_IN: tl.constexpr, ms_b, HAS_MASK: tl.constexpr):
        """:func:`_ent_fwd_run` with the ring in memory: the weights from the stored U rows, the
        entropies ``hU`` from this run's stored rows (rows before ``a`` from the incoming state),
        summed over durations in tiles of KB rows. Returns ``(h, Fh, converged, delta, steps,
        t_last)``."""
        wlo, whi, conv, delta = window_start(K_PAD)
        t = a + 1
        while (t <= b) & (conv == 0):
            s = t - 1
            s32 = tl.cast(s, tl.int32)
            av = tl.load(a_b + s * C + oc, mask=mc, other=MASK)
            uv = tl.load(w_b + s * C + oc, mask=mc, other=MASK)
            hu, hu_ref, fh_ref = _prefix_label_step(h, av, uv, trT, s, Fh, h_b, hu_b, fh_b, C, oc, mc, COMPARE)
            F_s = Fh
            # row s is read back below, by other threads
            tl.debug_barrier()
            # h_t: the duration k of the segment [t - k, t), weights exp(U_{t-k} + D[k-1] + S_t - S_{t-k})
            m, z, acc = _mem_mix(s, t, tl.minimum(k_max, t), a, Fh, cum_b, w_b, f_b, hu_b, fh_b, db_ptr, in32, in64,
                                 ms_b, C, oc, mc, okb, C_PAD, K_PAD, KB, HAS_IN, HAS_MASK, False)
            hn, _, okn = _mix_value(m, z, acc)
            h, Fh = _rebase(tl.where(okn & mc, hn, 0.0), okn & mc, Fh)
            if COMPARE:
                wlo, whi, delta, conv = _compare_window(hu, hu_ref, F_s - fh_ref, mc, TOL, wlo, whi, oj, s32, delta,
                                                        K, K_PAD, False)
            t += 1
        return h, Fh, conv, delta, t - 1 - a, t - 1

    @triton.jit
    def _ent_beta_mem_run(a, b, L, k_max, hy, Gh, cum_b, ps_b, x_b, g_b, hy_b, gh_b, tr, db_ptr, in32, in64, C, K,
                          oj, oc, mc, okb, TOL, C_PAD: tl.constexpr, K_PAD: tl.constexpr, KB: tl.constexpr,
                          HAS_PS: tl.constexpr, COMPARE: tl.constexpr, HAS_IN: tl.constexpr, me_b, fl_b,
                          HAS_MASK: tl.constexpr):
        """:func:`_ent_beta_run` with the ring in memory (see :func:`_ent_fwd_mem_run`). Returns
        ``(hy, Gh, converged, delta, steps, t_low)``: this run wrote rows t_low .. b."""
        wlo, whi, conv, delta = window_start(K_PAD)
        s = b - 1
        while (s >= a) & (conv == 0):
            t = s + 1
            t32 = tl.cast(t, tl.int32)
            yv = tl.load(x_b + t * C + oc, mask=mc, other=MASK)
            hyrow, hy_ref, gh_ref = _suffix_row_step(hy, yv, t, Gh, hy_b, gh_b, C, oc, mc, COMPARE)
            G_t = Gh
            tl.debug_barrier()
            # hV_s: the duration k of the segment [s, s + k), weights exp(Y_{s+k} + D[k-1] + S_{s+k} - S_s)
            m, z, acc = _mem_mix(s, t, tl.minimum(L - s, k_max), b, Gh, cum_b, x_b, g_b, hy_b, gh_b, db_ptr, in32, in64,
                                 me_b, C, oc, mc, okb, C_PAD, K_PAD, KB, HAS_IN, HAS_MASK, True)
            hv, lse, okv = _mix_value(m, z, acc)
            # V_s(c) in frame G_t: its differences over c pick the segment's label
            v = lse
            if HAS_PS:
                v += tl.load(ps_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
            if HAS_MASK:
                v += tl.where((tl.load(fl_b + s).to(tl.int32) & 4) != 0, MASK, 0.0)
            v = tl.where(okv & mc, v, MASK)
            # h'_s(c'): the label of the segment starting at s, given the predecessor c'
            hy, oky = _pick_step(tr + v[None, :], hv)
            hy, Gh = _rebase(tl.where(mc, hy, 0.0), oky & mc, Gh)
            if COMPARE:
                wlo, whi, delta, conv = _compare_window(hyrow, hy_ref, G_t - gh_ref, mc, TOL, wlo, whi, oj, t32,
                                                        delta, K, K_PAD, True)
            s -= 1
        return hy, Gh, conv, delta, b - 1 - s, s + 2

    @triton.jit
    def _mem_ends(a, b, REVERSE: tl.constexpr):
        """``(first, last)`` rows a full run over the chunk [a, b] stores: forward a .. b - 1 (its
        state is at b), beta b .. a + 1 (its state is at a)."""
        if REVERSE:
            return b, a + 1
        else:
            return a, b - 1

    @triton.jit
    def _save_mem_state(e32, e64, live, h, Fh, last, start, L, hrow_b, fh_b, in32, in64, C, oc, mc, okb,
                        C_PAD: tl.constexpr, K_PAD: tl.constexpr, KB: tl.constexpr, HAS_IN: tl.constexpr,
                        REVERSE: tl.constexpr):
        """A memory-ring run's end state in the layout of ``_save_ent_state``: slot j holds the
        latest row with that slot (forward: at or before ``last``, the last row the run stored;
        beta: at or after it), from the run's stored rows, or from its incoming state for a row
        before its ``start``, else 0; then the current row and frame."""
        tl.debug_barrier()
        for j0 in range(0, K_PAD, KB):
            j = j0 + okb
            if REVERSE:
                p = last + ((j - last) & (K_PAD - 1))
                ok = p <= L
                own = p <= start
            else:
                p = last - ((last - j) & (K_PAD - 1))
                ok = p >= 0
                own = p >= start
            v, fr = _mem_h_rows(p, ok, own, hrow_b, fh_b, in32, in64, C, oc, mc, C_PAD, K_PAD, HAS_IN)
            lj = j < live * K_PAD
            tl.store(e32 + j[:, None] * C_PAD + oc[None, :], v, mask=lj[:, None] & (oc < C_PAD)[None, :])
            tl.store(e64 + j, fr, mask=lj)
        lc = oc < live * C_PAD
        tl.store(e32 + K_PAD * C_PAD + oc, h, mask=lc)
        tl.store(e64 + K_PAD + okb * 0, tl.zeros([KB], tl.float64) + Fh, mask=okb < live * 1)

    @triton.jit
    def _ent_mem_run(a, b, L, k_max, h, Fh, cum_b, ps_b, a_b, r_b, f_b, h_b, hu_b, fh_b, M, db_ptr, in32, in64, C,
                     K, oj, oc, mc, okb, TOL, C_PAD: tl.constexpr, K_PAD: tl.constexpr, KB: tl.constexpr,
                     HAS_PS: tl.constexpr, COMPARE: tl.constexpr, HAS_IN: tl.constexpr, lim_b, fl_b,
                     HAS_MASK: tl.constexpr, REVERSE: tl.constexpr):
        """:func:`_ent_run` with the ring in memory: ``(h, Fh, converged, delta, steps, edge)``."""
        if REVERSE:
            h, Fh, conv, delta, steps, edge = _ent_beta_mem_run(
                a, b, L, k_max, h, Fh, cum_b, ps_b, r_b, f_b, h_b, fh_b, M, db_ptr, in32, in64, C, K, oj, oc, mc, okb,
                TOL, C_PAD, K_PAD, KB, HAS_PS, COMPARE, HAS_IN, lim_b, fl_b, HAS_MASK)
        else:
            h, Fh, conv, delta, steps, edge = _ent_fwd_mem_run(
                a, b, L, k_max, h, Fh, cum_b, a_b, r_b, f_b, h_b, hu_b, fh_b, M, db_ptr, in32, in64, C, K, oj, oc, mc,
                okb, TOL, C_PAD, K_PAD, KB, COMPARE, HAS_IN, lim_b, HAS_MASK)
        return h, Fh, conv, delta, steps, edge

    @triton.jit
    def _ent_chunks_kernel(
        cum_ptr,  # (B, T+1, C) cumulative scores S
        tr_ptr,  # (C, C) transition [c_src, c_dst]
        db_ptr,  # (K, C) duration bias
        len_ptr,  # (B,) lengths
        r_ptr,  # (B, T+1, C) the recurrence's ring rows: U_hat (the forward's), Y_hat (beta's)
        f_ptr,  # (B, T+1) float64 global frames of those rows
        h_ptr,  # (B, T+1, C) float32 out: h_s (forward), h'_t (beta) relative to the frame of its row
        fh_ptr,  # (B, T+1) float64 out: frames of the h rows (chunk j's system)
        e32, e64,  # (2, B, NCH, ...) end states: [0] spec runs, [1] non-converged fix-ups
        st_ptr, src_ptr, dl_ptr, cv_ptr,  # (B, NCH): converged, source of the end state, delta, steps
        C, K, W, NCH, s_cum_b, s_w_b, s_f_b, TOL,
        C_PAD: tl.constexpr,
        K_PAD: tl.constexpr,
        REBASE: tl.constexpr,
        PHASE: tl.constexpr,  # 1 spec, 2 fix-up, 3 repair
        REVERSE: tl.constexpr = False,  # the suffix entropies (beta's direction), else the prefix ones
        a_ptr=None,  # forward: (B, T+1, C) alpha_hat rows (the forward's)
        hu_ptr=None,  # forward: (B, T+1, C) float32 out: hU_s relative to the frame of row s
        ps_ptr=None,  # beta: (B, T, C) proj_start (read only if HAS_PS)
        s_p_b=None,  # beta: proj_start's batch stride
        HAS_PS: tl.constexpr = False,
        IDX64: tl.constexpr = False,
        lim_ptr=None,  # (B, T+1, C) int32: the segment limits, min_start (forward) / max_end (beta) (HAS_MASK)
        fl_ptr=None,  # beta: (B, T+1) int8 flags of the masks (HAS_MASK)
        HAS_MASK: tl.constexpr = False,
        MEM: tl.constexpr = False,  # the ring of entropy rows read back from memory (large rings)
        KB: tl.constexpr = 1,  # MEM: rows per tile of the sums over durations
    ):
        """The prefix (forward) or suffix (``REVERSE``) entropy recurrences, parallel over time: the
        chunk scheme of ``chunks._reg_chunks_kernel`` over the state (hr, h) of the entropies; with
        ``MEM`` the ring hr is the stored rows themselves (:func:`_ent_fwd_mem_run`), and only the
        end states (the layout of ``_save_ent_state``) carry rows between chunks."""
        b_id = tl.program_id(0).to(tl.int64)
        lim_b = lim_ptr
        fl_b = fl_ptr
        if HAS_MASK:
            lim_b = lim_ptr + b_id * s_w_b
            if REVERSE:
                fl_b = fl_ptr + b_id * s_f_b
        L = tl.load(len_ptr + b_id)
        if not IDX64:
            L = L.to(tl.int32)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        oj = tl.arange(0, K_PAD)
        E32 = K_PAD * C_PAD + C_PAD
        cum_b = cum_ptr + b_id * s_cum_b
        ps_b = ps_ptr
        a_b = a_ptr
        hu_b = hu_ptr
        if REVERSE:
            ps_b = ps_ptr + b_id * s_p_b
        else:
            a_b = a_ptr + b_id * s_w_b
        r_b = r_ptr + b_id * s_w_b
        f_b = f_ptr + b_id * s_f_b
        h_b = h_ptr + b_id * s_w_b
        if not REVERSE:
            hu_b = hu_ptr + b_id * s_w_b
        fh_b = fh_ptr + b_id * s_f_b
        E64 = K_PAD + 1
        okb = tl.arange(0, KB)
        # MEM: the run's own entropy rows, read back as its ring (forward hU, beta hY)
        hrow_b = h_b
        if not REVERSE:
            hrow_b = hu_b
        row = b_id * NCH
        half = tl.num_programs(0).to(tl.int64) * NCH
        if REVERSE:
            # (C_PAD src, C_PAD dst): the segment's label runs along the fast axis
            M = load_transition(tr_ptr, oc, mc, C)
            k_max = tl.minimum(K, L)
            n_b = (L + W - 1) // W
        else:
            # (C_PAD dst, C_PAD src): the predecessor runs along the fast axis
            M = tl.load(tr_ptr + oc[None, :] * C + oc[:, None], mask=mc[:, None] & mc[None, :],
                        other=MASK).to(tl.float32)
            k_max = tl.minimum(K, L)
            n_b = NCH
        if PHASE == 1:
            j = tl.program_id(1)
            a = tl.cast(j, L.dtype) * W
            b = tl.minimum(a + W, L)
            live = a < L
            h = tl.zeros([C_PAD], dtype=tl.float32)
            Fh = tl.sum(tl.zeros([1], tl.float64), 0)
            e = row + j
            if MEM:
                h, Fh, conv, delta, steps, edge = _ent_mem_run(
                    a, b, L, k_max, h, Fh, cum_b, ps_b, a_b, r_b, f_b, h_b, hu_b, fh_b, M, db_ptr, e32, e64, C, K, oj,
                    oc, mc, okb, TOL, C_PAD, K_PAD, KB, HAS_PS, False, False, lim_b, fl_b, HAS_MASK, REVERSE)
                first, last = _mem_ends(a, b, REVERSE)
                _save_mem_state(e32 + e * E32, e64 + e * E64, live, h, Fh, last, first, L, hrow_b, fh_b, e32, e64, C,
                                oc, mc, okb, C_PAD, K_PAD, KB, False, REVERSE)
            else:
                hr = tl.zeros([K_PAD, C_PAD], dtype=tl.float32)
                hfr = tl.zeros([K_PAD], dtype=tl.float64)
                hr, h, hfr, Fh, conv, delta, steps, edge = _ent_run(
                    a, b, L, k_max, hr, h, hfr, Fh, cum_b, ps_b, a_b, r_b, f_b, h_b, hu_b, fh_b, M, db_ptr, C, K, oj,
                    oc, mc, TOL, C_PAD, K_PAD, REBASE, HAS_PS, False, lim_b, fl_b, HAS_MASK, REVERSE)
                _save_ent_state(e32 + e * E32, e64 + e * E64, live, hr, h, hfr, Fh, oj, oc, C_PAD, K_PAD)
            if not REVERSE:
                if live & (b == L):
                    tl.store(h_b + L * C + oc, h, mask=mc)
                    tl.store(fh_b + L, Fh)
        else:
            j0, count = sweep_start(n_b, PHASE, REVERSE)
            clean_prev = tl.full([], 1, tl.int32)
            for jj in range(0, count):
                j, a, b, live, redo, e = sweep_chunk(j0, jj, W, L, n_b, clean_prev, src_ptr, row, half,
                                                     PHASE, REVERSE, "")
                if redo:
                    in32 = e32 + e * E32
                    in64 = e64 + e * E64
                    if MEM:
                        h = tl.load(in32 + K_PAD * C_PAD + oc, mask=oc < live * C_PAD, other=0.0)
                        Fh = tl.sum(tl.load(in64 + K_PAD + okb * 0, mask=okb < live * 1, other=0.0), 0)
                        h, Fh, conv, delta, steps, edge = _ent_mem_run(
                            a, b, L, k_max, h, Fh, cum_b, ps_b, a_b, r_b, f_b, h_b, hu_b, fh_b, M, db_ptr, in32, in64,
                            C, K, oj, oc, mc, okb, TOL, C_PAD, K_PAD, KB, HAS_PS, True, True, lim_b, fl_b, HAS_MASK,
                            REVERSE)
                    else:
                        hr, h, hfr, Fh = _load_ent_state(in32, in64, live, oj, oc, C_PAD, K_PAD)
                        hr, h, hfr, Fh, conv, delta, steps, edge = _ent_run(
                            a, b, L, k_max, hr, h, hfr, Fh, cum_b, ps_b, a_b, r_b, f_b, h_b, hu_b, fh_b, M, db_ptr, C,
                            K, oj, oc, mc, TOL, C_PAD, K_PAD, REBASE, HAS_PS, True, lim_b, fl_b, HAS_MASK, REVERSE)
                    if conv != 0:
                        if REVERSE:
                            _fix_suffix_frames(fh_b, edge, b, delta, 256)
                        else:
                            _fix_prefix_frames(fh_b, a, edge, delta, 256)
                        clean = chunk_clean(src_ptr, row, j)
                    else:
                        e = half + row + j
                        if MEM:
                            first, last = _mem_ends(a, b, REVERSE)
                            _save_mem_state(e32 + e * E32, e64 + e * E64, live, h, Fh, last, first, L, hrow_b, fh_b,
                                            in32, in64, C, oc, mc, okb, C_PAD, K_PAD, KB, True, REVERSE)
                        else:
                            _save_ent_state(e32 + e * E32, e64 + e * E64, live, hr, h, hfr, Fh, oj, oc, C_PAD, K_PAD)
                        clean = rerun_owns_end(src_ptr, row, j, conv)
                        if not REVERSE:
                            if b == L:
                                tl.store(h_b + L * C + oc, h, mask=mc)
                                tl.store(fh_b + L, Fh)
                    record_rerun(st_ptr, dl_ptr, cv_ptr, row, j, conv, delta, steps)
                    clean_prev = clean
                else:
                    clean_prev = passed_clean(clean_prev, live, src_ptr, row, j, PHASE)
                tl.debug_barrier()


#: Run the prefix half (forward, prefix entropies) and the suffix half (beta, suffix entropies)
#: on two CUDA streams.
ENTROPY_STREAMS = True

def launch_entropy(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, *, plan, masks=None):
    """The entropy and its weighted marginals on the time-parallel register-ring engine (a (C, C)
    transition), the blocked engine (a (C, C) transition whose ring is too large for registers:
    its rows, then the entropy recurrences with their ring in memory, ``MEM``) or the chunked
    direct recurrence (a (K, C, C) one, :func:`_launch_entropy_dur`).

    Args: validated inputs; ``plan`` a time-parallel ``"reg"``, ``"mem"`` or ``"dur"`` plan
    (:func:`~.plan.masked_plan`); ``masks`` as for :func:`~.launch.launch_forward`.

    Returns:
        ``(H (B,) float64, q_start (B, T, C), q_end (B, T, C), q_tr (B, C, C), q_db (B, K, C))``:
        ``dH/dtheta`` is minus the gradient map of log Z applied to the q's (as
        :func:`~torch_semimarkov.engines.interface.scale_grads` maps the marginals). Sequences
        with no allowed segmentation: H = 0 and every q 0.
    """
    from torch_semimarkov.engines.torch.reference import feasible
    from torch_semimarkov.engines.triton.launch import _prepare, anchor_log_z, final_scores, finish_marginals
    from torch_semimarkov.engines.triton.marginals import _anchor_kernel, _shared_factored_kernel
    from torch_semimarkov.engines.triton.plan import (AUX_WARPS, ENTROPY_MEM_WARPS, entropy_chunk, entropy_mem_rows,
                                                      entropy_warps, fixup_tol, marginal_chunks)
    from torch_semimarkov.engines.triton.parallel import (_chunk_state, _three_phases, backward_offsets, beta_chunked, forward_chunked,
                           forward_offsets)

    if not (plan.time_parallel and plan.kind in ("reg", "dur", "mem")):
        raise ValueError("the entropy engine runs on a time-parallel plan: the register ring, the blocked "
                         "engine or the (K, C, C) recurrence (see masked_plan)")
    cum_scores, transition, duration_bias, lengths, proj_start, proj_end = _prepare(
        cum_scores, transition, duration_bias, lengths, proj_start, proj_end)
    if plan.kind == "dur":
        return _launch_entropy_dur(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, plan,
                                   masks)
    B, T1, C = cum_scores.shape
    T = T1 - 1
    dev = cum_scores.device
    dtype = cum_scores.dtype
    K_eff = plan.K
    c_pad, k_pad, W = plan.c_pad, plan.k_pad, plan.chunk
    ps = proj_start if proj_start is not None else cum_scores
    pe = proj_end if proj_end is not None else cum_scores
    mask_fwd = {} if masks is None else dict(lim_ptr=masks[0], HAS_MASK=True)
    mask_bwd = {} if masks is None else dict(lim_ptr=masks[1], fl_ptr=masks[2], HAS_MASK=True)
    mask_me = {} if masks is None else dict(me_ptr=masks[1], HAS_MASK=True)
    meta = dict(C_PAD=c_pad, K_PAD=k_pad, REBASE=REBASE, num_warps=entropy_warps(plan),
                IDX64=plan.idx64)
    if plan.kind == "mem":
        # a ring too large for registers: the recurrences read their rows back from memory
        meta.update(MEM=True, KB=entropy_mem_rows(c_pad), num_warps=ENTROPY_MEM_WARPS)
    # the entropy recurrences' own chunks (their rows carry their own offsets)
    We = entropy_chunk(B, T, K_eff, plan, dev)
    ne = max(1, -(-T // We))

    def prefix():
        saved, frames, _, _ = forward_chunked(cum_scores, transition, duration_bias, lengths, "log", proj_start,
                                              proj_end, plan, masks=masks)
        h = torch.empty((B, T1, C), device=dev, dtype=torch.float32)
        hu = torch.empty((B, T1, C), device=dev, dtype=torch.float32)
        fh = torch.zeros((B, T1), device=dev, dtype=torch.float64)
        e32, e64, _, status, src, delta, steps = _chunk_state(B, ne, k_pad * c_pad + c_pad, k_pad + 1, 0, dev)
        args = dict(cum_ptr=cum_scores, tr_ptr=transition, db_ptr=duration_bias, len_ptr=lengths, a_ptr=saved[0],
                    r_ptr=saved[1], f_ptr=frames, h_ptr=h, hu_ptr=hu, fh_ptr=fh, e32=e32, e64=e64, st_ptr=status,
                    src_ptr=src, dl_ptr=delta, cv_ptr=steps, C=C, K=K_eff, W=We, NCH=ne, s_cum_b=T1 * C,
                    s_w_b=T1 * C, s_f_b=T1, TOL=fixup_tol(plan, "log"), **mask_fwd)
        _three_phases(_ent_chunks_kernel, B, ne, args, meta, steps)
        return saved[0], saved[1], frames, h, hu, forward_offsets(fh, delta, We)

    def suffix():
        x_hat, g, _ = beta_chunked(cum_scores, transition, duration_bias, lengths, proj_start, proj_end, plan,
                                   masks=masks)
        hy = torch.empty((B, T1, C), device=dev, dtype=torch.float32)
        gh = torch.zeros((B, T1), device=dev, dtype=torch.float64)
        e32, e64, _, status, src, delta, steps = _chunk_state(B, ne, k_pad * c_pad + c_pad, k_pad + 1, 0, dev)
        args = dict(cum_ptr=cum_scores, tr_ptr=transition, db_ptr=duration_bias, len_ptr=lengths, ps_ptr=ps,
                    r_ptr=x_hat, f_ptr=g, h_ptr=hy, fh_ptr=gh, e32=e32, e64=e64, st_ptr=status, src_ptr=src,
                    dl_ptr=delta, cv_ptr=steps, C=C, K=K_eff, W=We, NCH=ne, s_cum_b=T1 * C, s_p_b=T * C,
                    s_w_b=T1 * C, s_f_b=T1, TOL=fixup_tol(plan, "log"), **mask_bwd)
        _three_phases(_ent_chunks_kernel, B, ne, args, dict(meta, HAS_PS=proj_start is not None, REVERSE=True),
                      steps)
        return x_hat, g, hy, backward_offsets(gh, delta, We)

    if cum_scores.is_cuda and ENTROPY_STREAMS:
        # the two halves are independent and each leaves the GPU partly idle: run them side by side
        main = torch.cuda.current_stream(dev)
        side = torch.cuda.Stream(dev)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            back = suffix()
        alpha_hat, w_hat, frames, h, hu, oh = prefix()
        main.wait_stream(side)
        for t in back:
            t.record_stream(main)
        x_hat, g, hy, oy = back
    else:
        alpha_hat, w_hat, frames, h, hu, oh = prefix()
        x_hat, g, hy, oy = suffix()
    ok = feasible(final_scores(alpha_hat, frames, lengths))

    # anchors: log Z, then H, every A positions (the blocked engine's split over NS programs each,
    # H's partial sums reduced here in float64 as log Z's partial log-sums are)
    A = W
    n_anchor = -(-T // A) + 1
    rows_in = dict(len_ptr=lengths, f_ptr=frames, x_ptr=x_hat, g_ptr=g, C=C, K=K_eff, A=A, NA=n_anchor,
                   s_cum_b=T1 * C, s_a_b=T1 * C, s_f_b=T1, C_PAD=c_pad, num_warps=AUX_WARPS, IDX64=plan.idx64,
                   cum_ptr=cum_scores, db_ptr=duration_bias, w_ptr=w_hat, K_BLOCK=plan.k_block, **mask_me)
    lz, ns = anchor_log_z(plan, rows_in, B, n_anchor, dev)
    lz = torch.where(ok[:, None], lz, torch.zeros_like(lz))
    H = torch.empty((B, n_anchor, ns), device=dev, dtype=torch.float64)
    _anchor_kernel[(B, n_anchor * ns)](**rows_in, lz_ptr=lz, hu_ptr=hu, oh_ptr=oh, hy_ptr=hy, oy_ptr=oy, out_ptr=H,
                                       NS=ns, ENT=True)
    H = H.sum(-1) if ns > 1 else H[..., 0]
    H = torch.where(ok[:, None], H, torch.zeros_like(H))

    # weighted marginals
    ch, nch = marginal_chunks(B, T, C, K_eff * C + C * C)
    p_start = torch.zeros((B, T, C), device=dev, dtype=torch.float32)
    q_start = torch.zeros((B, T, C), device=dev, dtype=torch.float32)
    q_end = torch.zeros((B, T, C), device=dev, dtype=torch.float32)
    wtr = torch.empty((B, nch, C, C), device=dev, dtype=torch.float32)
    wdb = torch.empty((B, nch, K_eff, C), device=dev, dtype=torch.float32)
    _shared_factored_kernel[(B, nch)](
        cum_ptr=cum_scores, tr_ptr=transition, db_ptr=duration_bias, len_ptr=lengths, pe_ptr=pe, anc_ptr=lz,
        hanc_ptr=H, a_ptr=alpha_hat, w_ptr=w_hat, f_ptr=frames, x_ptr=x_hat, g_ptr=g, h_ptr=h, hu_ptr=hu, oh_ptr=oh,
        hy_ptr=hy, oy_ptr=oy, pst_ptr=p_start, qst_ptr=q_start, pend_ptr=q_end, wtr_ptr=wtr, wdb_ptr=wdb, C=C,
        K=K_eff, CH=ch, NCH=nch, A=A, NA=n_anchor, s_cum_b=T1 * C, s_a_b=T1 * C, s_f_b=T1, s_p_b=T * C,
        C_PAD=c_pad, K_BLOCK=plan.k_block, HAS_PE=proj_end is not None, num_warps=AUX_WARPS, IDX64=plan.idx64,
        ONE_KB=K_eff <= plan.k_block, ENT=True, **mask_me)
    return (H[:, 0],) + finish_marginals(q_start, q_end, wtr.sum(1).double(), wdb.sum(1).double(), ok, K, dtype)


def _launch_entropy_dur(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, plan, masks):
    """:func:`launch_entropy` for a (K, C, C) transition (prepared inputs, a ``"dur"`` plan).

    The same four steps on the direct recurrence's kernels: the forward and beta rows
    (``parallel.forward_chunked`` / ``beta_chunked``); the prefix and suffix entropies, linear
    recurrences over the same O(K·C²) terms weighted by those rows, time-parallel by the same
    chunked fix-up (``parallel.dur_entropy_chunked``); then the backward's last two steps with
    ``ENT`` (``launch.dur_marginals``): log Z and H at anchors from the rows themselves, and every
    marginal times ``log mu + H - h - h'``. The first
    segment is one term of its phantom predecessors (their LSE, an empty prefix), as log Z counts
    it, so H is the entropy of the segmentations themselves.
    """
    from torch_semimarkov.engines.torch.reference import feasible
    from torch_semimarkov.engines.triton.launch import dur_marginals, final_scores, finish_marginals
    from torch_semimarkov.engines.triton.parallel import beta_chunked, dur_entropy_chunked, forward_chunked

    inputs = (cum_scores, transition, duration_bias, lengths)
    saved, frames, _, _ = forward_chunked(*inputs, "log", proj_start, proj_end, plan, masks=masks)
    alpha_hat = saved[0]
    x_hat, g, _ = beta_chunked(*inputs, proj_start, proj_end, plan, masks=masks)
    h, fh = dur_entropy_chunked(*inputs, proj_start, proj_end, plan, alpha_hat, frames, False, masks)
    hy, gh = dur_entropy_chunked(*inputs, proj_start, proj_end, plan, x_hat, g, True, masks)
    ok = feasible(final_scores(alpha_hat, frames, lengths))
    q_start, q_end, q_tr, H = dur_marginals(*inputs, proj_start, proj_end, plan, alpha_hat, frames, x_hat, g, ok, masks,
                                            entropy=(h, fh, hy, gh))
    return (H[:, 0],) + finish_marginals(q_start, q_end, q_tr, q_tr.sum(2), ok, K, cum_scores.dtype)
