"""Forward kernels of the streaming semi-CRF (log and max semiring).

The kernels follow ``docs/internals.md`` (the factored recurrence for a static (C, C) transition,
the direct O(K·C²) recurrence for a duration-dependent (K, C, C) one, float32 numerics).

Sequential kernels, one program per sequence looping t = 1 .. L_b (ragged batches need no
masking in time):

* ``_fwd_factored_reg_kernel``: factored, ring of the last K_PAD ``U`` rows in registers
  (:func:`reg_step`); one compiled kernel serves the forward, the checkpointing forward, the
  save-all forward and the backward's recompute (``CK_MODE``), so all run the same instructions;
* ``_fwd_factored_kernel``: factored, ring in a per-sequence global buffer read as
  (K_BLOCK, C_PAD) tiles (large rings and large batches);
* ``_fwd_duration_tr_kernel``: the direct recurrence over (k, c') for (K, C, C) transitions.

Every step: ``u_s = LSE_{c'}(alpha_s(c') + Tr[c', c])`` (the phantom ``LSE_{c'} Tr[c', c]`` at s = 0
in both semirings), ``U_s = u_s + ps_s`` enters the ring, and
``alpha_t = pe_{t-1} + LSE_k(U_{t-k} + D[k-1] + S_t - S_{t-k})``: the segment sum is formed before
anything is added to it, so the size of S never costs float32 precision. alpha is kept as
``alpha_hat = alpha - F_t`` with the shift F accumulated in float64; a normaliser never shifts by
an impossible value. The max semiring stores backpointers for the traceback (``traceback.py``).

Time-parallel (``chunks.py``: ``_reg_chunks_kernel`` runs :func:`reg_step` through ``_run_chunk``,
``_dur_chunks_kernel`` runs :func:`dur_step` through ``_dur_run_chunk``; the same kernels run beta
with ``REVERSE``), one program per (sequence, chunk):
a sequence is cut into chunks of W positions. Three launches make every chunk exact:

1. *spec* (grid (B, n_chunks)): every chunk runs from a guessed start state, "the sequence starts
   here" (alpha = 0, empty ring); chunk 0 from the true one. It stores every position's state
   (``alpha_hat``, ``U_hat`` and the frame F) and its end state E1[j].
2. *fix-up* (grid (B, n_chunks)): chunk j reruns from E1[j-1], the state its predecessor ended in,
   comparing each new row of U with the stored one. The recurrence forgets its start (rank
   convergence): once the last K rows differ from the stored ones by one constant delta (to float
   rounding, ``TOL``), every later value is the stored one plus delta, and the chunk stops. It
   writes the rows it recomputed, moves their frames into the chunk's own system (minus delta),
   and records delta_j. A chunk that reaches its end without converging keeps its rows
   (delta_j = 0) and saves its true end state E2[j].
3. *repair* (grid (B,)): walks the chunks in order; a chunk whose predecessor's stored rows do not
   end in the state it was fixed up from is fixed up again from the right one (E1 or E2 of its
   predecessor). On models that converge this reads n_chunks flags; on models that never converge
   it is the sequential forward.

Every stored value of chunk j is then exact relative to the chunk's own frame system, whose offset
is O_j = delta_1 + ... + delta_j (a prefix sum on the host, ``parallel.py``), for every model,
converging or not. Positions and row offsets are int64 (T·C can pass 2^31).
"""

from __future__ import annotations

from torch_semimarkov.engines.triton.common import HAS_TRITON, REBASE, tl, triton  # noqa: F401

if HAS_TRITON:
    from torch_semimarkov.engines.triton.common import MASK_K as MASK
    from torch_semimarkov.engines.triton.common import load_transition, seq_length
    from torch_semimarkov.engines.triton.common import (ent_row, ent_terms, log_, lse_rows, possible_shift,
                                                         row_offset_bounds, window_row, window_start)

    @triton.jit
    def reg_step(t, L, k_max, ring, rfr, bring, alpha, F, shift, s_ref, s_prev, s_t, ps_s, pe_s,
                 trT, d0, u0, db_ptr, C, oj, oc, mc,
                 K_PAD: tl.constexpr, IS_MAX: tl.constexpr, HAS_PS: tl.constexpr, HAS_PE: tl.constexpr,
                 REBASE: tl.constexpr, ms=None, fl=0, HAS_MASK: tl.constexpr = False):
        """One position of the factored forward with the ring of K_PAD rows held in registers.

        Slot j of the (K_PAD, C_PAD) ring holds position s = j (mod K_PAD) as
        ``U_s - (S_s - S_ref)`` in its own frame (``rfr``); the duration of slot j at step t is
        ``((t - 1 - j) mod K_PAD) + 1``. Computes u_{t-1} from ``alpha`` (alpha_hat_{t-1}, frame
        ``F``), pushes U_{t-1} into the ring and returns alpha_hat_t normalised by the maximum of
        alpha_hat_{t-1} (known one step early, off the critical path).

        Returns the new state and ``(u, F_s, packed)``: U_hat_{t-1} in frame ``F_s`` (the frame of
        alpha_hat_{t-1}) and, in the max semiring, the packed backpointer of position t.

        HAS_MASK: ``fl`` is the flag byte of position s (``limits.py``) and ``ms`` (C_PAD,)
        int32 the smallest allowed start of a segment ending at t, per label. The limit only grows with t, so the ring entries it
        excludes are dropped once, when it moves; a forbidden start s makes U_s impossible (as
        an impossible ``proj_start`` would).
        """
        s = t - 1
        s32 = tl.cast(s, tl.int32)
        kj = ((s32 - oj) & (K_PAD - 1)) + 1
        vj = (kj >= 2) & (kj <= tl.minimum(k_max, t))
        drot = tl.load(db_ptr + (kj[:, None] - 1) * C + oc[None, :], mask=vj[:, None] & mc[None, :],
                       other=MASK).to(tl.float32)
        if HAS_MASK:
            if (fl & 1) != 0:
                ring = tl.where((t - kj)[:, None] >= ms[None, :], ring, MASK)
        # k >= 2 part of alpha_t (ring rows of positions t-2 .. t-K), frame F_{t-1}
        xk = ring + drot + (rfr - F).to(tl.float32)[:, None]
        pm = tl.max(xk, 0)
        if IS_MAX:
            pk = tl.min(tl.where(xk == pm[None, :], kj[:, None], K_PAD + 1), 0)
            pc = tl.sum(tl.where(kj[:, None] == pk[None, :], bring, 0), 0)
        else:
            psum = tl.sum(tl.exp(xk - pm[None, :]), 0)
            plse = tl.where(psum > 0, pm + log_(tl.where(psum > 0, psum, 1.0)), MASK)
        # u_s(c) = LSE_{c'} alpha_hat_s(c') + Tr[c', c] and the k = 1 term (critical path)
        x = trT + alpha[None, :]
        mx = tl.max(x, 1)
        if IS_MAX:
            # the first segment keeps its phantom term LSE_{c'} Tr[c', c] (u0)
            u = tl.where(s == 0, u0, mx)
            bc = tl.argmax(x, 1, tie_break_left=True).to(tl.int32)
        else:
            u = mx + log_(tl.sum(tl.exp(x - mx[:, None]), 1))
        if HAS_PS:
            u += ps_s
        if HAS_MASK:
            u += tl.where((fl & 4) != 0, MASK, 0.0)
        v1 = u - (s_prev - s_ref)
        if HAS_MASK:
            v1 = tl.where(s >= ms, v1, MASK)
        x1 = v1 + d0
        packed = tl.zeros_like(oc)
        if IS_MAX:
            # ties go to the smallest duration: k = 1 wins a tie
            one = x1 >= pm
            lse = tl.where(one, x1, pm)
            packed = tl.where(one, 65536 + bc, pk * 65536 + pc)
        else:
            hi = tl.maximum(plse, x1)
            lse = hi + log_(1.0 + tl.exp(tl.minimum(plse, x1) - hi))
        at = lse + (s_t - s_ref)
        if HAS_PE:
            at += pe_s
        slot = s32 & (K_PAD - 1)
        ring = tl.where(oj[:, None] == slot, v1[None, :], ring)
        rfr = tl.where(oj == slot, F, rfr)
        if IS_MAX:
            bring = tl.where(oj[:, None] == slot, bc[None, :], bring)
        F_s = F
        alpha = tl.where(mc, tl.maximum(at - shift, MASK), MASK)
        F = F + shift.to(tl.float64)
        shift = possible_shift(tl.max(alpha, 0))
        if t % REBASE == 0:
            ring += (s_t - s_ref)[None, :]
            s_ref = s_t
        return ring, rfr, bring, alpha, F, shift, s_ref, s_t, u, F_s, packed

    @triton.jit
    def _load_state(e32, e64, eb, live, oj, oc, C_PAD: tl.constexpr, K_PAD: tl.constexpr,
                    IS_MAX: tl.constexpr):
        """A saved state: ring (K_PAD, C_PAD), alpha_hat (C_PAD,), ring frames, F, and the
        predecessor-label ring in the max semiring."""
        lj = oj < live * K_PAD
        lc = oc < live * C_PAD
        ring = tl.load(e32 + oj[:, None] * C_PAD + oc[None, :], mask=lj[:, None] & lc[None, :], other=MASK)
        alpha = tl.load(e32 + K_PAD * C_PAD + oc, mask=lc, other=MASK)
        rfr = tl.load(e64 + oj, mask=lj, other=0.0)
        F = tl.sum(tl.load(e64 + K_PAD + oj * 0, mask=(oj == 0) & lj, other=0.0), 0)
        bring = tl.zeros([K_PAD, C_PAD], dtype=tl.int32)
        if IS_MAX:
            bring = tl.load(eb + oj[:, None] * C_PAD + oc[None, :], mask=lj[:, None] & lc[None, :], other=0)
        return ring, alpha, rfr, F, bring

    @triton.jit
    def _save_state(e32, e64, eb, live, ring, alpha, rfr, F, bring, oj, oc,
                    C_PAD: tl.constexpr, K_PAD: tl.constexpr, IS_MAX: tl.constexpr):
        lj = oj < live * K_PAD
        lc = oc < live * C_PAD
        tl.store(e32 + oj[:, None] * C_PAD + oc[None, :], ring, mask=lj[:, None] & lc[None, :])
        tl.store(e32 + K_PAD * C_PAD + oc, alpha, mask=lc)
        tl.store(e64 + oj, rfr, mask=lj)
        tl.store(e64 + K_PAD + oj * 0, tl.zeros([K_PAD], tl.float64) + F, mask=(oj == 0) & lj)
        if IS_MAX:
            tl.store(eb + oj[:, None] * C_PAD + oc[None, :], bring, mask=lj[:, None] & lc[None, :])

    @triton.jit
    def _run_chunk(a, b, L, k_max, ring, rfr, bring, alpha, F, cum_b, ps_b, pe_b, w_b, a_b, f_b, bp_b,
                   trT, d0, u0, db_ptr, C, oj, oc, mc, TOL, K,
                   C_PAD: tl.constexpr, K_PAD: tl.constexpr, IS_MAX: tl.constexpr, HAS_PS: tl.constexpr,
                   HAS_PE: tl.constexpr, REBASE: tl.constexpr, COMPARE: tl.constexpr, ms_b, fl_b, HAS_MASK: tl.constexpr):
        """Run positions a+1 .. b from the given state (at position a), storing every position.

        COMPARE (fix-up): before overwriting row s, compare the new U_hat_s (and, in the max
        semiring, alpha_hat_s, whose argmax labels the backpointers keep) with the stored one; stop
        once the last K rows differ from the stored ones by one constant, to a few float32 ulps
        (``row_offset_bounds``).
        Returns ``(state..., converged, delta, steps, t_last)``: ``t_last`` is the last position
        computed, so this run wrote rows a .. t_last-1.
        """
        a_in = tl.minimum(a, L)  # chunks past the end run no step but must not read past T
        s_ref = tl.load(cum_b + (a_in // REBASE) * REBASE * C + oc, mask=mc, other=0.0).to(tl.float32)
        s_prev = tl.load(cum_b + a_in * C + oc, mask=mc, other=0.0).to(tl.float32)
        shift = possible_shift(tl.max(alpha, 0))
        wlo, whi, conv, delta = window_start(K_PAD)
        t = a + 1
        while (t <= b) & (conv == 0):
            s = t - 1
            s_t = tl.load(cum_b + t * C + oc, mask=mc, other=0.0).to(tl.float32)
            ps_s = tl.zeros([C_PAD], dtype=tl.float32)
            pe_s = tl.zeros([C_PAD], dtype=tl.float32)
            if HAS_PS:
                ps_s = tl.load(ps_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
            if HAS_PE:
                pe_s = tl.load(pe_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
            ms = tl.zeros([C_PAD], dtype=tl.int32)
            fl = tl.full([], 0, tl.int32)
            if HAS_MASK:
                fl = tl.load(fl_b + s).to(tl.int32)
                # read every step (not only where the flag says it moved): a load that waited
                # on the flag's would put two memory round trips before the step
                ms = tl.load(ms_b + t * C + oc, mask=mc, other=0)
            if COMPARE:
                u_ref = tl.load(w_b + s * C + oc, mask=mc, other=MASK)
                a_ref = tl.load(a_b + s * C + oc, mask=mc, other=MASK)
                f_ref = tl.sum(tl.load(f_b + s + oj * 0, mask=oj == 0, other=0.0), 0)
                # the stored row is read before this program overwrites it
                tl.debug_barrier()
                # alpha_hat_s as this run enters the step (the same frame as U_hat_s)
                a_lo, a_hi = row_offset_bounds(alpha, a_ref, F - f_ref, mc, TOL)
            tl.store(a_b + s * C + oc, alpha, mask=mc)
            tl.store(f_b + s + oj * 0, tl.zeros([K_PAD], tl.float64) + F, mask=oj == 0)
            ring, rfr, bring, alpha, F, shift, s_ref, s_prev, u, F_s, packed = reg_step(
                t, L, k_max, ring, rfr, bring, alpha, F, shift, s_ref, s_prev, s_t, ps_s, pe_s,
                trT, d0, u0, db_ptr, C, oj, oc, mc, K_PAD, IS_MAX, HAS_PS, HAS_PE, REBASE, ms, fl, HAS_MASK)
            tl.store(w_b + s * C + oc, u, mask=mc)
            if IS_MAX:
                tl.store(bp_b + t * C + oc, packed, mask=mc)
            if COMPARE:
                lo, hi = row_offset_bounds(u, u_ref, F_s - f_ref, mc, TOL)
                if IS_MAX:
                    lo = tl.maximum(lo, a_lo)
                    hi = tl.minimum(hi, a_hi)
                wlo, whi, delta, conv = window_row(wlo, whi, oj, tl.cast(s, tl.int32), lo, hi, delta, K, K_PAD, False)
            t += 1
        return ring, rfr, bring, alpha, F, conv, delta, t - 1 - a, t - 1

    @triton.jit
    def _fix_prefix_frames(f_b, a, t_stop, delta, BLOCK: tl.constexpr):
        """Move the frames of rows a .. t_stop-1 (written by a converged fix-up) into the stored
        rows' system: minus delta."""
        tl.debug_barrier()
        o = tl.arange(0, BLOCK)
        for p0 in range(a, t_stop, BLOCK):
            p = p0 + o
            m = p < t_stop
            tl.store(f_b + p, tl.load(f_b + p, mask=m, other=0.0) - delta, mask=m)

    @triton.jit
    def _fwd_factored_kernel(
        cum_ptr,  # (B, T+1, C) cumulative scores S
        tr_ptr,  # (C, C) transition [c_src, c_dst]
        db_ptr,  # (K, C) duration bias
        len_ptr,  # (B,) int64 lengths
        ps_ptr,  # (B, T, C) proj_start (read only if HAS_PS)
        pe_ptr,  # (B, T, C) proj_end (read only if HAS_PE)
        w_ptr,  # (B, R, C) float32: U_hat = u_hat + ps rows, row s % R
        a_ptr,  # (B, T+1, C) float32: alpha_hat rows (written only if STORE_ALPHA)
        f_ptr,  # (B, R) float64: frame F_s of row s % R (alpha_hat_s and U_hat_s)
        bpk_ptr,  # (B, T+1, C) int32: argmax duration at t (IS_MAX)
        bpc_ptr,  # (B, T+1, C) int32: argmax source label of u_s at s (IS_MAX)
        out_ptr,  # (B,) float64: log Z or the best score
        last_ptr,  # (B,) int32: argmax_c alpha_L (IS_MAX)
        ck_ptr,  # (B, NCK, K*C + C_PAD) float32 checkpoints: rows s-K .. s-1, alpha_hat_s
        ckf_ptr,  # (B, NCK, K + 1) float64 checkpoints: their frames, F_s
        C,
        K,
        R,
        s_cum_b,
        s_p_b,
        s_w_b,
        s_a_b,
        s_f_b,
        s_bp_b,
        DELTA,
        NCK,
        C_PAD: tl.constexpr,
        K_BLOCK: tl.constexpr,
        IS_MAX: tl.constexpr,
        HAS_PS: tl.constexpr,
        HAS_PE: tl.constexpr,
        STORE_ALPHA: tl.constexpr,
        CKPT: tl.constexpr = False,
        RESTORE: tl.constexpr = False,
        IDX64: tl.constexpr = False,
    ):
        """Factored forward with the ring of the last K U_hat rows in global memory (row s % R).

        CKPT saves, at every s = i·DELTA < L, the rows of positions s-K .. s-1, their frames,
        alpha_hat_s and F_s. RESTORE (grid (B, NCK), R = T+1, STORE_ALPHA) restarts program (b, i)
        from checkpoint i: rows before i·DELTA are read from the checkpoint, later ones from the
        rows it writes itself, so intervals never read each other's output.
        """
        b = tl.program_id(0).to(tl.int64)
        L = seq_length(len_ptr, b, IDX64)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        ok = tl.arange(0, K_BLOCK)
        CK32 = K * C + C_PAD
        t0 = 0
        t_end = L
        if RESTORE:
            t0 = tl.program_id(1).to(L.dtype) * DELTA
            t_end = tl.minimum(t0 + DELTA, L)
            ck_b = ck_ptr + (b * NCK + tl.program_id(1)) * CK32
            ckf_b = ckf_ptr + (b * NCK + tl.program_id(1)) * (K + 1)
        else:
            ck_b = ck_ptr + b * NCK * CK32
            ckf_b = ckf_ptr + b * NCK * (K + 1)
        cum_b = cum_ptr + b * s_cum_b
        w_b = w_ptr + b * s_w_b
        a_b = a_ptr + b * s_a_b
        f_b = f_ptr + b * s_f_b
        ps_b = ps_ptr + b * s_p_b
        pe_b = pe_ptr + b * s_p_b
        bpk_b = bpk_ptr + b * s_bp_b
        bpc_b = bpc_ptr + b * s_bp_b

        # shape: (C_PAD src, C_PAD dst)
        tr = load_transition(tr_ptr, oc, mc, C)
        if RESTORE:
            # intervals starting at or past L have no checkpoint (and run no step)
            live = tl.where(t0 < L, 1, 0)
            alpha = tl.load(ck_b + K * C + oc, mask=oc < live * C_PAD, other=MASK)
            F = tl.sum(tl.load(ckf_b + K + oc * 0, mask=oc < live, other=0.0), 0)
        else:
            alpha = tl.where(mc, 0.0, MASK)
            F = tl.zeros([1], dtype=tl.float64)
            F = tl.sum(F, 0)
        if STORE_ALPHA:
            if t0 == 0:
                tl.store(a_b + oc, alpha, mask=mc)
        # u_0 = LSE_{c'} Tr[c', c] in both semirings: the first segment's phantom predecessor
        u0 = lse_rows(tr)

        # steps to the next checkpoint and its slot (the forward starts at position 0)
        ck_left = tl.program_id(0) * 0
        ck_slot = tl.program_id(0) * 0
        for t in range(t0 + 1, t_end + 1):
            s = t - 1
            if CKPT:
                if ck_left == 0:
                    # rows of positions s-K .. s-1 (the ones steps >= t read), then alpha_hat_s, F_s
                    cks = ck_b + ck_slot * CK32
                    ckfs = ckf_b + ck_slot * (K + 1)
                    for kb in range(0, K, K_BLOCK):
                        j = kb + ok
                        p = s - K + j
                        vj = (j < K) & (p >= 0)
                        rp = tl.where(vj, p, 0) % R
                        rows = tl.load(w_b + rp[:, None] * C + oc[None, :], mask=vj[:, None] & mc[None, :], other=MASK)
                        tl.store(cks + j[:, None] * C + oc[None, :], rows, mask=vj[:, None] & mc[None, :])
                        tl.store(ckfs + j, tl.load(f_b + rp, mask=vj, other=0.0), mask=vj)
                    tl.store(cks + K * C + oc, alpha)
                    tl.store(ckfs + K, F)
                ck_slot += tl.where(ck_left == 0, 1, 0)
                ck_left = tl.where(ck_left == 0, DELTA, ck_left) - 1
            # u_s(c) = LSE_{c'} alpha_hat_s(c') + Tr[c', c], in frame F_s
            x = alpha[:, None] + tr
            mx = tl.max(x, 0)
            if IS_MAX:
                u = tl.where(s == 0, u0, mx)
                bc = tl.argmax(x, 0, tie_break_left=True).to(tl.int32)
                tl.store(bpc_b + s * C + oc, bc, mask=mc)
            else:
                u = mx + log_(tl.sum(tl.exp(x - mx[None, :]), 0))
            w = u
            if HAS_PS:
                w += tl.load(ps_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
            row_s = s % R
            tl.store(w_b + row_s * C + oc, w, mask=mc)
            tl.store(f_b + row_s, F)
            # the rows just written are read by other threads below
            tl.debug_barrier()

            # alpha_t(c) = pe_{t-1} + LSE_k (U_{t-k}(c) + D[k-1, c] + S_t(c) - S_{t-k}(c)), frame F_s;
            # the segment sum S_t - S_{t-k} is formed first, so |S| never costs float32 precision
            s_t = tl.load(cum_b + t * C + oc, mask=mc, other=0.0)
            k_lim = tl.minimum(t, K)
            run_m = tl.full([C_PAD], MASK, tl.float32)
            if IS_MAX:
                run_m = tl.full([C_PAD], 2 * MASK, tl.float32)
                run_k = tl.zeros([C_PAD], dtype=tl.int32)
            run_s = tl.zeros([C_PAD], dtype=tl.float32)
            for kb in range(0, k_lim, K_BLOCK):
                k = kb + 1 + ok
                vk = k <= k_lim
                row = (t - k) % R
                m2 = vk[:, None] & mc[None, :]
                if RESTORE:
                    # positions before t0 come from the checkpoint (row j = position - t0 + K)
                    own = (t - k) >= t0
                    jc = tl.where(own, 0, t - k - t0 + K)
                    wv = tl.where(
                        own[:, None],
                        tl.load(w_b + row[:, None] * C + oc[None, :], mask=m2 & own[:, None], other=MASK),
                        tl.load(ck_b + jc[:, None] * C + oc[None, :], mask=m2 & (~own)[:, None], other=MASK),
                    )
                    fr = tl.where(own, tl.load(f_b + row, mask=vk & own, other=0.0),
                                  tl.load(ckf_b + jc, mask=vk & (~own), other=0.0))
                else:
                    wv = tl.load(w_b + row[:, None] * C + oc[None, :], mask=m2, other=MASK)
                    fr = tl.load(f_b + row, mask=vk, other=0.0)
                d = (fr - F).to(tl.float32)
                dbv = tl.load(db_ptr + (k[:, None] - 1) * C + oc[None, :], mask=m2, other=MASK).to(tl.float32)
                seg = (s_t[None, :] - tl.load(cum_b + (t - k[:, None]) * C + oc[None, :], mask=m2, other=0.0)).to(tl.float32)
                xk = wv + dbv + seg + d[:, None]
                bm = tl.max(xk, 0)
                if IS_MAX:
                    ba = tl.argmax(xk, 0, tie_break_left=True).to(tl.int32)
                    upd = bm > run_m
                    run_k = tl.where(upd, tl.cast(kb + 1 + ba, tl.int32), run_k)
                    run_m = tl.where(upd, bm, run_m)
                else:
                    nm = tl.maximum(run_m, bm)
                    run_s = run_s * tl.exp(run_m - nm) + tl.sum(tl.exp(xk - nm[None, :]), 0)
                    run_m = nm
            if IS_MAX:
                lse = run_m
                tl.store(bpk_b + t * C + oc, run_k, mask=mc)
            else:
                lse = run_m + log_(tl.where(mc & (run_s > 0), run_s, 1.0))
            at = lse
            if HAS_PE:
                at += tl.load(pe_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
            at = tl.where(mc, at, MASK)
            m = possible_shift(tl.max(at, 0))
            alpha = tl.where(mc, tl.maximum(at - m, MASK), MASK)
            F = F + m.to(tl.float64)
            if STORE_ALPHA:
                tl.store(a_b + t * C + oc, alpha, mask=mc)

        if (t0 < L) & (t_end == L):
            tl.store(f_b + L % R, F)
        if not RESTORE:
            am = tl.max(alpha, 0)
            if IS_MAX:
                tl.store(out_ptr + b, F + am.to(tl.float64))
                tl.store(last_ptr + b, tl.argmax(alpha, 0, tie_break_left=True).to(tl.int32))
            else:
                lz = am + log_(tl.sum(tl.exp(alpha - am), 0))
                tl.store(out_ptr + b, F + lz.to(tl.float64))

    @triton.jit(do_not_specialize=["DELTA", "NCK", "RANGE", "FLAGS", "CKS", "CK32S"])
    def _fwd_factored_reg_kernel(
        cum_ptr,  # (B, T+1, C) cumulative scores S
        tr_ptr,  # (C, C) transition [c_src, c_dst]
        db_ptr,  # (K, C) duration bias
        len_ptr,  # (B,) int64 lengths
        ps_ptr,  # (B, T, C) proj_start (read only if HAS_PS)
        pe_ptr,  # (B, T, C) proj_end (read only if HAS_PE)
        w_ptr,  # (B, T+1, C) float32 out: U_hat = u_hat + ps rows (STORE)
        a_ptr,  # (B, T+1, C) float32 out: alpha_hat rows (STORE)
        f_ptr,  # (B, T+1) float64 out: frames F_t (STORE)
        bp_ptr,  # (B, T+1, C) int32 out: packed backpointer k * 65536 + c_prev at t (IS_MAX)
        out_ptr,  # (B,) float64: log Z or the best score
        last_ptr,  # (B,) int32: argmax_c alpha_L (IS_MAX)
        ck_ptr,  # (B, NCK, K_PAD*C_PAD + C_PAD) float32 checkpoints: ring, alpha_hat (CK_MODE)
        ckf_ptr,  # (B, NCK, K_PAD + 1) float64 checkpoints: ring frames, F (CK_MODE)
        C,
        K,
        s_cum_b,
        s_p_b,
        s_w_b,
        s_f_b,
        s_bp_b,
        DELTA,
        NCK,
        RANGE,
        FLAGS,
        CKS,
        CK32S,
        C_PAD: tl.constexpr,
        K_PAD: tl.constexpr,
        IS_MAX: tl.constexpr,
        HAS_PS: tl.constexpr,
        HAS_PE: tl.constexpr,
        STORE: tl.constexpr,
        REBASE: tl.constexpr,
        CK_MODE: tl.constexpr = False,
        IDX64: tl.constexpr = False,
    ):
        """Factored forward with the ring of K_PAD rows held in registers.

        Slot j of the (K_PAD, C_PAD) ring holds position s = j (mod K_PAD) as
        ``U_s - (S_s - S_ref)`` in its own frame (``rfr``, float64); the duration of slot j at step
        t is ``((t - 1 - j) mod K_PAD) + 1``, so the duration bias is gathered rotated (L1
        resident). ``S_ref`` moves to the newest S every REBASE steps (one add over the ring).

        Latency: only u_s and the k = 1 term depend on the previous step. The k >= 2 part of
        alpha_t's reduction uses older ring rows and the normalising shift of alpha_t is the
        maximum of alpha_hat_{t-1}, so both run beside the critical path; per-position rows are
        loaded one step ahead.

        CK_MODE (log semiring, STORE): one compiled kernel serves the forward that saves
        checkpoints, the save-all forward and the backward's recompute, so that all three run the
        same instructions (Triton picks register layouts, hence reduction orders, per compiled
        kernel). Program (b, i) starts from checkpoint i (the forward from checkpoint 0, filled with
        the initial state by the host) and runs positions i·RANGE .. min((i+1)·RANGE, L). FLAGS
        (runtime): 1 saves the state at every s = j·DELTA to checkpoint j (ring, ring frames,
        alpha_hat, F), 2 stores every position (alpha_hat, U_hat, frames), 4 writes the score.
        The steps run in chunks of DELTA positions (one chunk without CK_MODE) and a checkpoint is
        saved between chunks, so the step loop itself has no branch; stores are predicated, and
        checkpoint addresses use runtime strides (CKS = C_PAD, CK32S = K_PAD·C_PAD + C_PAD) so
        that their access pattern, hence the ring's register layout, is that of the duration-bias
        gather.
        """
        b = tl.program_id(0).to(tl.int64)
        L = seq_length(len_ptr, b, IDX64)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        oj = tl.arange(0, K_PAD)
        t0 = 0
        t_end = L
        ck_b = ck_ptr + b * NCK * CK32S
        ckf_b = ckf_ptr + b * NCK * (K_PAD + 1)
        if CK_MODE:
            t0 = tl.program_id(1).to(L.dtype) * RANGE
            t_end = tl.minimum(t0 + RANGE, L)
            ck_i = ck_b + tl.program_id(1) * CK32S
            ckf_i = ckf_b + tl.program_id(1) * (K_PAD + 1)
        cum_b = cum_ptr + b * s_cum_b
        ps_b = ps_ptr + b * s_p_b
        pe_b = pe_ptr + b * s_p_b
        w_b = w_ptr + b * s_w_b
        a_b = a_ptr + b * s_w_b
        f_b = f_ptr + b * s_f_b
        bp_b = bp_ptr + b * s_bp_b

        # shape: (C_PAD dst, C_PAD src): the reduction over sources runs along the fast axis
        trT = tl.load(
            tr_ptr + oc[None, :] * C + oc[:, None], mask=mc[:, None] & mc[None, :], other=MASK
        ).to(tl.float32)
        d0 = tl.load(db_ptr + oc, mask=mc, other=MASK).to(tl.float32)
        if CK_MODE:
            # intervals starting at or past L have no checkpoint (and run no step)
            live = tl.where(t0 < L, 1, 0)
            lc = oc < live * C_PAD
            lj = oj < live * K_PAD
            alpha = tl.load(ck_i + K_PAD * CKS + oc, mask=lc, other=MASK)
            F = tl.sum(tl.load(ckf_i + K_PAD + oj * 0, mask=oj < live, other=0.0), 0)
            ring = tl.load(ck_i + oj[:, None] * CKS + oc[None, :], mask=lj[:, None] & lc[None, :], other=MASK)
            rfr = tl.load(ckf_i + oj, mask=lj, other=0.0)
            s_ref = tl.load(cum_b + (t0 // REBASE) * REBASE * C + oc, mask=mc, other=0.0).to(tl.float32)
            s_prev = tl.load(cum_b + t0 * C + oc, mask=mc, other=0.0).to(tl.float32)
        else:
            alpha = tl.where(mc, 0.0, MASK)
            F = tl.sum(tl.zeros([1], dtype=tl.float64), 0)
            ring = tl.full([K_PAD, C_PAD], MASK, tl.float32)
            rfr = tl.zeros([K_PAD], dtype=tl.float64)
            s_ref = tl.load(cum_b + oc, mask=mc, other=0.0).to(tl.float32)
            s_prev = s_ref
        shift = possible_shift(tl.max(alpha, 0))
        # u_0 = LSE_{c'} Tr[c', c] in both semirings: the first segment's phantom predecessor
        u0 = tl.max(trT, 1)
        u0 = u0 + log_(tl.sum(tl.exp(trT - u0[:, None]), 1))
        # predicated per-position stores (FLAGS & 2): no branch in the step loop
        st_c = tl.where((FLAGS & 2) != 0, C, 0)
        st_1 = tl.where((FLAGS & 2) != 0, 1, 0)
        if STORE:
            if (t0 == 0) & ((FLAGS & 2) != 0):
                tl.store(a_b + oc, alpha, mask=mc)
        bring = tl.zeros([K_PAD, C_PAD], dtype=tl.int32)
        nxt_s = tl.load(cum_b + (t0 + 1) * C + oc, mask=mc, other=0.0).to(tl.float32)
        nxt_ps = tl.zeros([C_PAD], dtype=tl.float32)
        nxt_pe = tl.zeros([C_PAD], dtype=tl.float32)
        if HAS_PS:
            nxt_ps = tl.load(ps_b + t0 * C + oc, mask=mc, other=0.0).to(tl.float32)
        if HAS_PE:
            nxt_pe = tl.load(pe_b + t0 * C + oc, mask=mc, other=0.0).to(tl.float32)
        k_max = tl.minimum(K, L)
        # chunks of DELTA positions starting at multiples of DELTA (t0 is one)
        for cs in range(t0, t_end, DELTA):
            if CK_MODE:
                if (FLAGS & 1) != 0:
                    # the state before position cs: restarting here reproduces every later value
                    ck_slot = cs // DELTA
                    cks = ck_b + ck_slot * CK32S
                    tl.store(cks + oj[:, None] * CKS + oc[None, :], ring)
                    tl.store(cks + K_PAD * CKS + oc, alpha)
                    tl.store(ckf_b + ck_slot * (K_PAD + 1) + oj, rfr)
                    tl.store(ckf_b + ck_slot * (K_PAD + 1) + K_PAD + oj * 0, tl.zeros([K_PAD], tl.float64) + F,
                             mask=oj == 0)
            ce = tl.minimum(cs + DELTA, t_end)
            for t in range(cs + 1, ce + 1):
                s = t - 1
                s_t = nxt_s
                ps_s = nxt_ps
                pe_s = nxt_pe
                t_n = tl.minimum(t + 1, L)
                nxt_s = tl.load(cum_b + t_n * C + oc, mask=mc, other=0.0).to(tl.float32)
                if HAS_PS:
                    nxt_ps = tl.load(ps_b + (t_n - 1) * C + oc, mask=mc, other=0.0).to(tl.float32)
                if HAS_PE:
                    nxt_pe = tl.load(pe_b + (t_n - 1) * C + oc, mask=mc, other=0.0).to(tl.float32)
                ring, rfr, bring, alpha, F, shift, s_ref, s_prev, u, F_s, packed = reg_step(
                    t, L, k_max, ring, rfr, bring, alpha, F, shift, s_ref, s_prev, s_t, ps_s, pe_s,
                    trT, d0, u0, db_ptr, C, oj, oc, mc, K_PAD, IS_MAX, HAS_PS, HAS_PE, REBASE)
                if IS_MAX:
                    tl.store(bp_b + t * C + oc, packed, mask=mc)
                if STORE:
                    tl.store(w_b + s * C + oc, u, mask=oc < st_c)
                    tl.store(f_b + s + oc * 0, tl.zeros([C_PAD], tl.float64) + F_s, mask=oc < st_1)
                    tl.store(a_b + t * C + oc, alpha, mask=oc < st_c)

        if STORE:
            if (t0 < L) & (t_end == L) & ((FLAGS & 2) != 0):
                tl.store(f_b + L, F)
        am = tl.max(alpha, 0)
        if IS_MAX:
            tl.store(out_ptr + b, F + am.to(tl.float64))
            tl.store(last_ptr + b, tl.argmax(alpha, 0, tie_break_left=True).to(tl.int32))
        elif CK_MODE:
            if (FLAGS & 4) != 0:
                lz = am + log_(tl.sum(tl.exp(alpha - am), 0))
                tl.store(out_ptr + b, F + lz.to(tl.float64))
        else:
            lz = am + log_(tl.sum(tl.exp(alpha - am), 0))
            tl.store(out_ptr + b, F + lz.to(tl.float64))

    @triton.jit
    def dur_step(t, t0, F, a_b, f_b, ck_b, ckf_b, R, cum_b, ps_b, pe_b, tr_ptr, db_ptr, C, K, oc, mc, m2,
                 C_PAD: tl.constexpr, IS_MAX: tl.constexpr, HAS_PS: tl.constexpr, HAS_PE: tl.constexpr,
                 RESTORE: tl.constexpr, lim_b=None, fl_b=None, HAS_MASK: tl.constexpr = False):
        """One position of the direct recurrence of a (K, C, C) transition:

            alpha_t(c) = pe_{t-1}(c) + LSE_{k, c'} alpha_{t-k}(c') + Tr[k-1, c', c] + D[k-1, c]
                         + S_t(c) - S_{t-k}(c) + ps_{t-k}(c)

        Reads alpha_hat_s (s = t-1 .. t-K) from row s % R of ``a_b`` / ``f_b`` or, with RESTORE,
        for s <= t0 from row s - t0 + K - 1 of a saved state ``ck_b`` / ``ckf_b`` (the K rows of
        positions t0-K+1 .. t0 and their frames; a checkpoint, or a chunk's predecessor's end), so
        a run that starts at t0 never reads rows another program may be writing.

        ``F`` is the frame of alpha_hat_{t-1}. Returns ``(alpha_hat_t, F_t, k, c')``: the new row,
        normalised by its maximum, and (IS_MAX) the argmax duration and source label, the
        lexicographically smallest (k, c') on ties.

        HAS_MASK: ``lim_b`` is the sequence's (T+1, C) int32 ``min_start`` and ``fl_b`` its flag
        bytes (``limits.py``): a segment [s, t) of label c enters only if s >= min_start[t, c] and
        no flag forbids a start at s (its terms are IMPOSSIBLE, as a forbidden entry of the inputs).
        """
        s_t = tl.load(cum_b + t * C + oc, mask=mc, other=0.0)
        ms = oc
        if HAS_MASK:
            ms = tl.load(lim_b + t * C + oc, mask=mc, other=0)
        k_lim = tl.minimum(t, K)
        run_m = tl.full([C_PAD], MASK, tl.float32)
        run_k = tl.zeros([C_PAD], dtype=tl.int32)
        run_c = tl.zeros([C_PAD], dtype=tl.int32)
        if IS_MAX:
            run_m = tl.full([C_PAD], 2 * MASK, tl.float32)
        run_s = tl.zeros([C_PAD], dtype=tl.float32)
        for k in range(1, k_lim + 1):
            s = t - k
            row = s % R
            # shape: (C_PAD src,) alpha_hat_s in the current frame
            if RESTORE:
                own = s > t0
                jc = tl.where(own, 0, s - t0 + K - 1)
                # both addresses are valid (jc = 0 for own rows): load both, select
                av_row = tl.where(own, tl.load(a_b + row * C + oc, mask=mc, other=MASK),
                                  tl.load(ck_b + jc * C + oc, mask=mc, other=MASK))
                av_f = tl.where(own, tl.load(f_b + row), tl.load(ckf_b + jc))
                av = av_row + (av_f - F).to(tl.float32)
            else:
                av = tl.load(a_b + row * C + oc, mask=mc, other=MASK) + (tl.load(f_b + row) - F).to(tl.float32)
            x = _dur_tile(s, k, av, s_t, 0.0, ms, cum_b, ps_b, fl_b, tr_ptr, db_ptr, C, oc, mc, m2, HAS_PS, HAS_MASK)
            bm = tl.max(x, 0)
            if IS_MAX:
                ba = tl.argmax(x, 0, tie_break_left=True).to(tl.int32)
                if s == 0:
                    # the first segment keeps LSE_{c'} (phantom predecessor), as in log Z
                    bm = lse_rows(x)
                    ba = ba * 0
                upd = bm > run_m
                run_k = tl.where(upd, tl.cast(k, tl.int32), run_k)
                run_c = tl.where(upd, ba, run_c)
                run_m = tl.where(upd, bm, run_m)
            else:
                nm = tl.maximum(run_m, bm)
                run_s = run_s * tl.exp(run_m - nm) + tl.sum(tl.exp(x - nm[None, :]), 0)
                run_m = nm
        if IS_MAX:
            lse = run_m
        else:
            lse = run_m + log_(tl.where(mc & (run_s > 0), run_s, 1.0))
        at = lse
        if HAS_PE:
            at += tl.load(pe_b + (t - 1) * C + oc, mask=mc, other=0.0).to(tl.float32)
        at = tl.where(mc, at, MASK)
        m = possible_shift(tl.max(at, 0))
        alpha = tl.where(mc, tl.maximum(at - m, MASK), MASK)
        F = F + m.to(tl.float64)
        return alpha, F, run_k, run_c

    @triton.jit
    def dur_ent_step(t, t0, Fh, h_b, fh_b, st32, st64, ea_b, ef_b, cum_b, ps_b, pe_b, tr_ptr, db_ptr, C, K, oc, mc,
                     m2, C_PAD: tl.constexpr, HAS_PS: tl.constexpr, HAS_PE: tl.constexpr, lim_b, fl_b,
                     HAS_MASK: tl.constexpr):
        """One position of the prefix entropies of a (K, C, C) transition (the entropy engine's
        forward half): h_t(c), the entropy of the prefix given that a segment of label c ends at t,

            h_t(c) = sum_{k, c'} rho (h_{t-k}(c') - log rho),
            rho ∝ exp(alpha_{t-k}(c') + Tr[k-1, c', c] + D[k-1, c] + S_t(c) - S_{t-k}(c)
                      + ps_{t-k}(c) + pe_{t-1}(c)),

        the weights of :func:`dur_step`'s terms, from the stored forward rows ``ea_b`` (alpha_hat)
        and their global frames ``ef_b``. The first segment (t - k = 0) is one term: its score is
        its phantom predecessor's LSE_{c'} Tr[k-1, c', c] and its prefix is empty (h = 0), as log Z
        counts it. The h rows of s <= t0 come from the run's start state (``st32`` / ``st64``, the
        layout of :func:`dur_step`'s), later ones from ``h_b`` / ``fh_b``; ``Fh`` is the frame of
        h_{t-1}. Masks as :func:`dur_step`'s.

        Returns ``(h_hat_t, Fh_t)``: the row less its largest value, which moves into the frame;
        nodes that no term reaches hold IMPOSSIBLE (as alpha's do), so that a fix-up compares
        rows as the forward's does. No select per entry: a term that is not real weighs exactly 0
        and every factor is finite (``entropy._mix_step``)."""
        s_t = tl.load(cum_b + t * C + oc, mask=mc, other=0.0)
        fref = tl.load(ef_b + t - 1)
        ms = oc
        if HAS_MASK:
            ms = tl.load(lim_b + t * C + oc, mask=mc, other=0)
        pe_t = tl.zeros([C_PAD], dtype=tl.float32)
        if HAS_PE:
            pe_t = tl.load(pe_b + (t - 1) * C + oc, mask=mc, other=0.0).to(tl.float32)
        run_m = tl.full([C_PAD], MASK, tl.float32)
        run_s = tl.zeros([C_PAD], dtype=tl.float32)
        run_r = tl.zeros([C_PAD], dtype=tl.float32)
        zero = tl.zeros([C_PAD], dtype=tl.float32)
        for k in range(1, tl.minimum(t, K) + 1):
            s = t - k
            own = s > t0
            jc = tl.where(own, 0, s - t0 + K - 1)
            # both addresses are valid (jc = 0 for own rows): load both, select
            hv = tl.where(own, tl.load(h_b + s * C + oc, mask=mc, other=0.0),
                          tl.load(st32 + jc * C + oc, mask=mc, other=0.0))
            hv += (tl.where(own, tl.load(fh_b + s), tl.load(st64 + jc)) - Fh).to(tl.float32)
            av = tl.load(ea_b + s * C + oc, mask=mc, other=MASK) + (tl.load(ef_b + s) - fref).to(tl.float32)
            x = _dur_tile(s, k, av, s_t, pe_t, ms, cum_b, ps_b, fl_b, tr_ptr, db_ptr, C, oc, mc, m2, HAS_PS, HAS_MASK)
            # the first segment: one term of an empty prefix (h = 0, -Fh in this frame)
            run_m, run_s, run_r = ent_terms(run_m, run_s, run_r, x, hv, zero, s == 0, (-Fh).to(tl.float32))
        return ent_row(run_m, run_s, run_r, mc, Fh)

    @triton.jit
    def _dur_tile(s, k, av, s_t, extra, ms, cum_b, ps_b, fl_b, tr_ptr, db_ptr, C, oc, mc, m2,
                  HAS_PS: tl.constexpr, HAS_MASK: tl.constexpr):
        """(C_PAD source, C_PAD label) terms of the segments [s, t) of duration k of the direct
        recurrence: ``av[c'] + Tr[k-1, c', c] + D[k-1, c] + extra[c] + S_t(c) - S_s(c)
        (+ ps_s(c))`` (``s_t`` = S_t), IMPOSSIBLE where a mask excludes them (HAS_MASK: ``ms`` the
        row of min_start at t, ``fl_b`` the flags: :func:`dur_step`)."""
        base = tl.load(db_ptr + (k - 1) * C + oc, mask=mc, other=MASK).to(tl.float32) + extra
        base += (s_t - tl.load(cum_b + s * C + oc, mask=mc, other=0.0)).to(tl.float32)
        if HAS_PS:
            base += tl.load(ps_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
        if HAS_MASK:
            base += tl.where((s >= ms) & ((tl.load(fl_b + s) & 4) == 0), 0.0, MASK)
        trk = tl.load(tr_ptr + (k - 1) * C * C + oc[:, None] * C + oc[None, :], mask=m2, other=MASK)
        return av[:, None] + trk.to(tl.float32) + base[None, :]

    @triton.jit
    def _dur_row(a_b, f_b, st32, st64, p, a, K, C, oc, mc):
        """alpha_hat row p and its frame for a run that started at a: its own row (p > a) or row
        p - a + K - 1 of its start state (both addresses valid: load both, select)."""
        own = p > a
        jc = tl.where(own, 0, p - a + K - 1)
        po = tl.where(own, p, 0)
        row = tl.where(own, tl.load(a_b + po * C + oc, mask=mc, other=MASK), tl.load(st32 + jc * C + oc, mask=mc, other=MASK))
        fr = tl.where(own, tl.load(f_b + po), tl.load(st64 + jc))
        return row, fr

    @triton.jit
    def _dur_save_end(e32, e64, a, b, alpha, F, a_b, f_b, st32, st64, K, C, oc, mc, C_PAD: tl.constexpr):
        """End state of a run over a+1 .. b that started from ``st32`` / ``st64``: the K rows of
        positions b-K+1 .. b (the last, alpha_hat_b, is the run's register row) and their frames."""
        for i in range(0, K - 1):
            row, fr = _dur_row(a_b, f_b, st32, st64, b - K + 1 + i, a, K, C, oc, mc)
            tl.store(e32 + i * C + oc, row, mask=mc)
            tl.store(e64 + i + oc * 0, tl.zeros([C_PAD], tl.float64) + fr, mask=oc == 0)
        tl.store(e32 + (K - 1) * C + oc, alpha, mask=mc)
        tl.store(e64 + K - 1 + oc * 0, tl.zeros([C_PAD], tl.float64) + F, mask=oc == 0)

    @triton.jit
    def _dur_run_chunk(a, b, L, st32, st64, live, cum_b, ps_b, pe_b, a_b, f_b, bp_b, tr_ptr, db_ptr, C, K, T1,
                       oc, mc, m2, oj, TOL,
                       C_PAD: tl.constexpr, K_PAD: tl.constexpr, IS_MAX: tl.constexpr, HAS_PS: tl.constexpr,
                       HAS_PE: tl.constexpr, COMPARE: tl.constexpr, lim_b=None, fl_b=None,
                       HAS_MASK: tl.constexpr = False, ea_b=None, ef_b=None, ENT: tl.constexpr = False):
        """Run positions a+1 .. b of the direct recurrence (:func:`dur_step`; ``ENT``: the prefix
        entropies of :func:`dur_ent_step`, weighted by the stored rows ``ea_b`` / ``ef_b``) from the state at a
        (``st32`` / ``st64``: the K rows of positions a-K+1 .. a), storing the rows the chunk owns:
        a (the state's last row), a+1 .. b-1, and L (row b is the next chunk's row a; never written
        here, so two programs never write one row). Rows before a are read from the state only.

        COMPARE (fix-up): before overwriting row t, compare the new alpha_hat_t with the stored one;
        stop once the last K rows (the whole state, and all that the backpointers' argmax depends
        on) differ from the stored ones by one constant, to a few float32 ulps.
        Returns ``(alpha_hat_b, F, converged, delta, steps, t_last)``: ``t_last`` is the last
        position computed.
        """
        lim = tl.where(live, C, 0)
        lim1 = tl.where(live, 1, 0)
        alpha = tl.load(st32 + (K - 1) * C + oc, mask=oc < lim, other=MASK)
        F = tl.sum(tl.load(st64 + K - 1 + oc * 0, mask=oc < lim1, other=0.0), 0)
        tl.store(a_b + a * C + oc, alpha, mask=oc < lim)
        tl.store(f_b + a + oc * 0, tl.zeros([C_PAD], tl.float64) + F, mask=oc < lim1)
        wlo, whi, conv, delta = window_start(K_PAD)
        t = a + 1
        while (t <= b) & (conv == 0):
            own = (t < b) | (t == L)
            st_c = tl.where(own, C, 0)
            st_1 = tl.where(own, 1, 0)
            if COMPARE:
                a_ref = tl.load(a_b + t * C + oc, mask=oc < st_c, other=MASK)
                f_ref = tl.sum(tl.load(f_b + t + oc * 0, mask=oc < st_1, other=0.0), 0)
                # the stored row is read before this program overwrites it
                tl.debug_barrier()
            if ENT:
                alpha, F = dur_ent_step(t, a, F, a_b, f_b, st32, st64, ea_b, ef_b, cum_b, ps_b, pe_b, tr_ptr, db_ptr,
                                        C, K, oc, mc, m2, C_PAD, HAS_PS, HAS_PE, lim_b, fl_b, HAS_MASK)
            else:
                alpha, F, bk, bc = dur_step(t, a, F, a_b, f_b, st32, st64, T1, cum_b, ps_b, pe_b, tr_ptr, db_ptr,
                                            C, K, oc, mc, m2, C_PAD, IS_MAX, HAS_PS, HAS_PE, True, lim_b, fl_b,
                                            HAS_MASK)
                if IS_MAX:
                    tl.store(bp_b + t * C + oc, bk * 65536 + bc, mask=mc)
            tl.store(a_b + t * C + oc, alpha, mask=oc < st_c)
            tl.store(f_b + t + oc * 0, tl.zeros([C_PAD], tl.float64) + F, mask=oc < st_1)
            if COMPARE:
                lo, hi = row_offset_bounds(alpha, a_ref, F - f_ref, mc, TOL)
                # row b belongs to the next chunk: nothing to compare it with
                lo = tl.where(own, lo, 1e300)
                hi = tl.where(own, hi, -1e300)
                wlo, whi, delta, conv = window_row(wlo, whi, oj, tl.cast(t, tl.int32), lo, hi, delta, K, K_PAD, False)
            # the next step reads this row from other threads
            tl.debug_barrier()
            t += 1
        return alpha, F, conv, delta, t - 1 - a, t - 1

    @triton.jit
    def _fwd_duration_tr_kernel(
        cum_ptr,  # (B, T+1, C)
        tr_ptr,  # (K, C, C) transition [k-1, c_src, c_dst]
        db_ptr,  # (K, C)
        len_ptr,  # (B,)
        ps_ptr,  # (B, T, C)
        pe_ptr,  # (B, T, C)
        a_ptr,  # (B, R, C) float32: alpha_hat rows, row t % R
        f_ptr,  # (B, R) float64: frame of row t % R
        bpk_ptr,  # (B, T+1, C) int32: argmax duration at t (IS_MAX)
        bpc_ptr,  # (B, T+1, C) int32: argmax source label at t (IS_MAX)
        out_ptr,  # (B,) float64
        last_ptr,  # (B,) int32
        ck_ptr,  # (B, NCK, K*C) float32 checkpoints: alpha_hat rows s-K+1 .. s
        ckf_ptr,  # (B, NCK, K) float64 checkpoints: their frames
        C,
        K,
        R,
        s_cum_b,
        s_p_b,
        s_a_b,
        s_f_b,
        s_bp_b,
        DELTA,
        NCK,
        C_PAD: tl.constexpr,
        IS_MAX: tl.constexpr,
        HAS_PS: tl.constexpr,
        HAS_PE: tl.constexpr,
        CKPT: tl.constexpr = False,
        RESTORE: tl.constexpr = False,
        IDX64: tl.constexpr = False,
    ):
        """Direct O(K·C²) forward for a (K, C, C) transition; alpha_hat rows in a ring of R rows.

        CKPT saves, at every s = i·DELTA < L, the rows of positions s-K+1 .. s and their frames;
        RESTORE (grid (B, NCK), R = T+1) restarts program (b, i) there, reading positions before
        i·DELTA from the checkpoint.
        """
        b = tl.program_id(0).to(tl.int64)
        L = seq_length(len_ptr, b, IDX64)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        m2 = mc[:, None] & mc[None, :]
        t0 = 0
        t_end = L
        if RESTORE:
            t0 = tl.program_id(1).to(L.dtype) * DELTA
            t_end = tl.minimum(t0 + DELTA, L)
            ck_b = ck_ptr + (b * NCK + tl.program_id(1)) * K * C
            ckf_b = ckf_ptr + (b * NCK + tl.program_id(1)) * K
        else:
            ck_b = ck_ptr + b * NCK * K * C
            ckf_b = ckf_ptr + b * NCK * K
        cum_b = cum_ptr + b * s_cum_b
        a_b = a_ptr + b * s_a_b
        f_b = f_ptr + b * s_f_b
        ps_b = ps_ptr + b * s_p_b
        pe_b = pe_ptr + b * s_p_b
        bpk_b = bpk_ptr + b * s_bp_b
        bpc_b = bpc_ptr + b * s_bp_b

        if RESTORE:
            # intervals starting at or past L have no checkpoint (and run no step)
            live = tl.where(t0 < L, 1, 0)
            alpha = tl.load(ck_b + (K - 1) * C + oc, mask=oc < live * C, other=MASK)
            F = tl.sum(tl.load(ckf_b + K - 1 + oc * 0, mask=oc < live, other=0.0), 0)
        else:
            alpha = tl.where(mc, 0.0, MASK)
            F = tl.zeros([1], dtype=tl.float64)
            F = tl.sum(F, 0)
        if t0 == 0:
            tl.store(a_b + oc, alpha, mask=mc)
            tl.store(f_b, F)
        tl.debug_barrier()
        for t in range(t0 + 1, t_end + 1):
            if CKPT:
                if (t - 1) % DELTA == 0:
                    # rows of positions t-K .. t-1 (all that steps >= t read)
                    cks = ck_b + ((t - 1) // DELTA) * K * C
                    ckfs = ckf_b + ((t - 1) // DELTA) * K
                    for j in range(0, K):
                        p = t - K + j
                        if p >= 0:
                            tl.store(cks + j * C + oc, tl.load(a_b + (p % R) * C + oc, mask=mc, other=MASK), mask=mc)
                            tl.store(ckfs + j, tl.load(f_b + p % R))
            alpha, F, run_k, run_c = dur_step(t, t0, F, a_b, f_b, ck_b, ckf_b, R, cum_b, ps_b, pe_b, tr_ptr, db_ptr,
                                              C, K, oc, mc, m2, C_PAD, IS_MAX, HAS_PS, HAS_PE, RESTORE)
            if IS_MAX:
                tl.store(bpk_b + t * C + oc, run_k, mask=mc)
                tl.store(bpc_b + t * C + oc, run_c, mask=mc)
            row_t = t % R
            tl.store(a_b + row_t * C + oc, alpha, mask=mc)
            tl.store(f_b + row_t, F)
            tl.debug_barrier()

        if not RESTORE:
            am = tl.max(alpha, 0)
            if IS_MAX:
                tl.store(out_ptr + b, F + am.to(tl.float64))
                tl.store(last_ptr + b, tl.argmax(alpha, 0, tie_break_left=True).to(tl.int32))
            else:
                lz = am + log_(tl.sum(tl.exp(alpha - am), 0))
                tl.store(out_ptr + b, F + lz.to(tl.float64))
