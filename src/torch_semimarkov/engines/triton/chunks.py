"""The chunk drivers: one kernel runs both time-parallel recurrences, the forward and (``REVERSE``)
beta: ``_reg_chunks_kernel`` for a (C, C) transition with its ring of K_PAD rows in registers,
``_dur_chunks_kernel`` for a (K, C, C) transition with its last K rows in memory.

The scheme (``docs/internals.md`` §9) is the same in both directions. One program per (sequence,
chunk) runs its chunk speculatively from "the sequence starts (ends) here" (PHASE 1); each chunk's
fix-up reruns it from its predecessor's speculative end state until its last K rows agree with the
stored ones up to one offset (PHASE 2); the repair walks the chunks in order and reruns those whose
predecessor's stored rows were not exact (PHASE 3). What differs is the step and its state, kept in
the two step modules: the forward (``forward.py``: ``reg_step``, state ``(ring, alpha_hat, frames,
F)`` and in the max semiring the ring of predecessor labels) runs chunk j over rows [a_j, b_j) from
a_j; beta (``beta.py``: ``beta_step``, state ``(ring, beta_hat, frames, G)`` and the ring's score
reference S) runs it over (a_j, b_j] from b_j. Here the direction-specific part of the state is
``extra`` (the label ring; S's reference). The (K, C, C) recurrence (``dur_step``,
``dur_beta_step``) keeps its state, the last K rows, in memory: its runs start from a saved end
state (``s32`` / ``s64``).
"""

from __future__ import annotations

from torch_semimarkov.engines.triton.common import HAS_TRITON, tl, triton  # noqa: F401

if HAS_TRITON:
    from torch_semimarkov.engines.triton import beta as _bw
    from torch_semimarkov.engines.triton import forward as _fw
    from torch_semimarkov.engines.triton.common import MASK_K as MASK
    from torch_semimarkov.engines.triton.common import load_transition
    from torch_semimarkov.engines.triton.common import chunk_clean, log_, passed_clean, record_rerun, rerun_owns_end
    from torch_semimarkov.engines.triton.common import sweep_chunk, sweep_start

    @triton.jit
    def _run(a, b, L, k_max, ring, rfr, extra, st, F, cum_b, ps_b, pe_b, r_b, a_b, f_b, bp_b, M, d0, u0,
             db_ptr, C, oj, oc, mc, TOL, K, C_PAD: tl.constexpr, K_PAD: tl.constexpr, IS_MAX: tl.constexpr,
             HAS_PS: tl.constexpr, HAS_PE: tl.constexpr, REBASE: tl.constexpr, COMPARE: tl.constexpr, lim_b,
             fl_b, HAS_MASK: tl.constexpr, REVERSE: tl.constexpr):
        """One run of the chunk (its spec, fix-up or repair) in the recurrence's direction: returns
        ``(ring, rfr, extra, st, F, converged, delta, steps, edge)``, ``edge`` the last row the run
        computed in its direction (the forward's ``t_last``, beta's ``t_low``)."""
        if REVERSE:
            ring, rfr, st, F, extra, conv, delta, steps, edge = _bw._run_chunk(
                a, b, L, k_max, ring, rfr, st, F, extra, cum_b, ps_b, pe_b, r_b, f_b,
                M, d0, db_ptr, C, oj, oc, mc, TOL, K, C_PAD, K_PAD, HAS_PS, HAS_PE, REBASE, COMPARE, lim_b,
                fl_b, HAS_MASK)
        else:
            ring, rfr, extra, st, F, conv, delta, steps, edge = _fw._run_chunk(
                a, b, L, k_max, ring, rfr, extra, st, F, cum_b, ps_b, pe_b, r_b, a_b, f_b, bp_b,
                M, d0, u0, db_ptr, C, oj, oc, mc, TOL, K, C_PAD, K_PAD, IS_MAX, HAS_PS, HAS_PE, REBASE, COMPARE,
                lim_b, fl_b, HAS_MASK)
        return ring, rfr, extra, st, F, conv, delta, steps, edge

    @triton.jit
    def _save(e32, e64, eb, live, ring, st, rfr, F, extra, oj, oc, C_PAD: tl.constexpr, K_PAD: tl.constexpr,
              IS_MAX: tl.constexpr, REVERSE: tl.constexpr):
        """Store an end state for the next chunk's fix-up or repair."""
        if REVERSE:
            _bw._save_state(e32, e64, live, ring, st, extra, rfr, F, oj, oc, C_PAD, K_PAD)
        else:
            _fw._save_state(e32, e64, eb, live, ring, st, rfr, F, extra, oj, oc, C_PAD, K_PAD, IS_MAX)

    @triton.jit
    def _load(e32, e64, eb, live, oj, oc, C_PAD: tl.constexpr, K_PAD: tl.constexpr, IS_MAX: tl.constexpr,
              REVERSE: tl.constexpr):
        """A stored end state: ``(ring, st, rfr, F, extra)``."""
        if REVERSE:
            ring, st, extra, rfr, F = _bw._load_state(e32, e64, live, oj, oc, C_PAD, K_PAD)
        else:
            ring, st, rfr, F, extra = _fw._load_state(e32, e64, eb, live, oj, oc, C_PAD, K_PAD, IS_MAX)
        return ring, st, rfr, F, extra

    @triton.jit
    def _slot(e32, e64, eb, e, E32, E64, EB, REVERSE: tl.constexpr):
        """Pointers to end-state slot ``e`` (beta keeps no label ring, ``eb`` is None: its third
        pointer is the first again, never read)."""
        p32 = e32 + e * E32
        p64 = e64 + e * E64
        if REVERSE:
            pb = p32
        else:
            pb = eb + e * EB
        return p32, p64, pb

    @triton.jit
    def _reg_chunks_kernel(
        cum_ptr,  # (B, T+1, C) cumulative scores S
        tr_ptr,  # (C, C) transition [c_src, c_dst]
        db_ptr,  # (K, C) duration bias
        len_ptr,  # (B,) int64 lengths
        ps_ptr,  # (B, T, C) proj_start (read only if HAS_PS)
        pe_ptr,  # (B, T, C) proj_end (read only if HAS_PE)
        r_ptr,  # (B, T+1, C) float32 out: the compared rows (forward U_hat, beta Y_hat)
        f_ptr,  # (B, T+1) float64 out: their frames (forward F, beta G)
        e32, e64,  # (2, B, NCH, ...) end states: [0] of every spec run, [1] of non-converged fix-ups
        st_ptr,  # (B, NCH) int32: 1 if the chunk's last fix-up converged
        src_ptr,  # (B, NCH) int32: 1 or 2, which of e*[0] / e*[1] ends the chunk's stored rows
        dl_ptr,  # (B, NCH) float64: delta_j, offset of chunk j's system over its predecessor's
        cv_ptr,  # (B, NCH) int32: positions the last fix-up of the chunk ran
        C, K, W, NCH, s_cum_b, s_p_b, s_w_b, s_f_b, TOL,
        C_PAD: tl.constexpr,
        K_PAD: tl.constexpr,
        HAS_PS: tl.constexpr,
        HAS_PE: tl.constexpr,
        REBASE: tl.constexpr,
        PHASE: tl.constexpr,  # 1 spec, 2 fix-up, 3 repair
        REVERSE: tl.constexpr = False,  # beta (else the forward)
        IS_MAX: tl.constexpr = False,  # the forward's max semiring (packed backpointers)
        a_ptr=None,  # forward: (B, T+1, C) float32 out: alpha_hat rows
        bp_ptr=None,  # forward: (B, T+1, C) int32 out: packed backpointers (IS_MAX)
        eb=None,  # forward: (2, B, NCH, K_PAD * C_PAD) int32: end states' label rings (IS_MAX)
        IDX64: tl.constexpr = False,
        lim_ptr=None,  # (B, T+1, C) int32: the segment limits, min_start (forward) / max_end (beta) (HAS_MASK)
        fl_ptr=None,  # (B, T+1) int8: flags of the masks (limits.py) (HAS_MASK)
        HAS_MASK: tl.constexpr = False,
    ):
        b_id = tl.program_id(0).to(tl.int64)
        lim_b = lim_ptr
        fl_b = fl_ptr
        if HAS_MASK:
            lim_b = lim_ptr + b_id * s_w_b
            fl_b = fl_ptr + b_id * s_f_b
        L = tl.load(len_ptr + b_id)
        if not IDX64:
            L = L.to(tl.int32)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        oj = tl.arange(0, K_PAD)
        if REVERSE:
            E32 = K_PAD * C_PAD + 2 * C_PAD  # ring, beta_hat, S reference
        else:
            E32 = K_PAD * C_PAD + C_PAD  # ring, alpha_hat
        E64 = K_PAD + 1
        EB = K_PAD * C_PAD
        cum_b = cum_ptr + b_id * s_cum_b
        ps_b = ps_ptr + b_id * s_p_b
        pe_b = pe_ptr + b_id * s_p_b
        r_b = r_ptr + b_id * s_w_b
        a_b = a_ptr
        bp_b = bp_ptr
        if not REVERSE:
            a_b = a_ptr + b_id * s_w_b
        f_b = f_ptr + b_id * s_f_b
        if not REVERSE:
            bp_b = bp_ptr + b_id * s_w_b
        row = b_id * NCH
        u0 = tl.zeros([C_PAD], dtype=tl.float32)
        if REVERSE:
            half = tl.num_programs(0).to(tl.int64) * NCH  # (B, NCH) entries per end-state buffer
            # shape: (C_PAD src, C_PAD dst): the reduction over destinations runs along the fast axis
            M = load_transition(tr_ptr, oc, mc, C)
            d0 = tl.load(db_ptr + oc, mask=mc, other=MASK).to(tl.float32)
            k_max = tl.minimum(K, L)
            n_b = (L + W - 1) // W  # chunks of this sequence
        else:
            # shape: (C_PAD dst, C_PAD src): the reduction over sources runs along the fast axis
            M = tl.load(tr_ptr + oc[None, :] * C + oc[:, None], mask=mc[:, None] & mc[None, :],
                        other=MASK).to(tl.float32)
            d0 = tl.load(db_ptr + oc, mask=mc, other=MASK).to(tl.float32)
            u0 = tl.max(M, 1)
            u0 = u0 + log_(tl.sum(tl.exp(M - u0[:, None]), 1))
            k_max = tl.minimum(K, L)
            half = tl.num_programs(0).to(tl.int64) * NCH
            n_b = NCH
        if PHASE == 1:
            j = tl.program_id(1)
            a = tl.cast(j, L.dtype) * W
            b = tl.minimum(a + W, L)
            live = a < L
            # "the sequence starts (ends) here": state 0, no segment crosses a (b); the first
            # chunk in the run's direction starts from the truth
            st = tl.where(mc, 0.0, MASK)
            ring = tl.full([K_PAD, C_PAD], MASK, tl.float32)
            rfr = tl.zeros([K_PAD], dtype=tl.float64)
            if REVERSE:
                F = tl.sum(tl.zeros([1], tl.float64), 0)
                extra = tl.load(cum_b + tl.minimum(b, L) * C + oc, mask=mc, other=0.0).to(tl.float32)
            else:
                extra = tl.zeros([K_PAD, C_PAD], dtype=tl.int32)
                F = tl.sum(tl.zeros([1], tl.float64), 0)
            ring, rfr, extra, st, F, conv, delta, steps, edge = _run(
                a, b, L, k_max, ring, rfr, extra, st, F, cum_b, ps_b, pe_b, r_b, a_b, f_b, bp_b, M, d0, u0,
                db_ptr, C, oj, oc, mc, TOL, K, C_PAD, K_PAD, IS_MAX, HAS_PS, HAS_PE, REBASE, False, lim_b, fl_b,
                HAS_MASK, REVERSE)
            e = row + j
            p32, p64, pb = _slot(e32, e64, eb, e, E32, E64, EB, REVERSE)
            _save(p32, p64, pb, live, ring, st, rfr, F, extra, oj, oc, C_PAD, K_PAD, IS_MAX, REVERSE)
            if not REVERSE:
                if live & (b == L):
                    tl.store(a_b + L * C + oc, st, mask=mc)
                    tl.store(f_b + L + oj * 0, tl.zeros([K_PAD], tl.float64) + F, mask=oj == 0)
        else:
            j0, count = sweep_start(n_b, PHASE, REVERSE)
            # repair: chunk j's predecessor is "clean" when its stored rows are exact up to its offset
            # and end in its spec end state (the state chunk j's fix-up started from); the first
            # chunk in the run's direction always is
            clean_prev = tl.full([], 1, tl.int32)
            for jj in range(0, count):
                j, a, b, live, redo, e = sweep_chunk(j0, jj, W, L, n_b, clean_prev, src_ptr, row, half,
                                                     PHASE, REVERSE, "")
                if redo:
                    # phase 2: the predecessor's spec end state; repair: the end state of the
                    # predecessor's stored rows (its spec end, or the end of an exact rerun)
                    p32, p64, pb = _slot(e32, e64, eb, e, E32, E64, EB, REVERSE)
                    ring, st, rfr, F, extra = _load(p32, p64, pb, live, oj, oc, C_PAD, K_PAD, IS_MAX, REVERSE)
                    ring, rfr, extra, st, F, conv, delta, steps, edge = _run(
                        a, b, L, k_max, ring, rfr, extra, st, F, cum_b, ps_b, pe_b, r_b, a_b, f_b, bp_b, M, d0,
                        u0, db_ptr, C, oj, oc, mc, TOL, K, C_PAD, K_PAD, IS_MAX, HAS_PS, HAS_PE, REBASE, True,
                        lim_b, fl_b, HAS_MASK, REVERSE)
                    if conv != 0:
                        if REVERSE:
                            _bw._fix_suffix_frames(f_b, edge, b, delta, 256)
                        else:
                            _fw._fix_prefix_frames(f_b, a, edge, delta, 256)
                        clean = chunk_clean(src_ptr, row, j)
                    else:
                        # an exact rerun that did not converge: its rows are the stored ones now
                        e = half + row + j
                        p32, p64, pb = _slot(e32, e64, eb, e, E32, E64, EB, REVERSE)
                        _save(p32, p64, pb, live, ring, st, rfr, F, extra, oj, oc, C_PAD, K_PAD, IS_MAX, REVERSE)
                        clean = rerun_owns_end(src_ptr, row, j, conv)
                        if not REVERSE:
                            if b == L:
                                tl.store(a_b + L * C + oc, st, mask=mc)
                                tl.store(f_b + L + oj * 0, tl.zeros([K_PAD], tl.float64) + F, mask=oj == 0)
                    record_rerun(st_ptr, dl_ptr, cv_ptr, row, j, conv, delta, steps)
                    clean_prev = clean
                else:
                    clean_prev = passed_clean(clean_prev, live, src_ptr, row, j, PHASE)
                # the next chunk reads what this one stored (end state, flags) from other threads
                tl.debug_barrier()

    @triton.jit
    def _dur_run(a, b, L, s32, s64, live, cum_b, ps_b, pe_b, r_b, f_b, bp_b, tr_ptr, db_ptr, C, K, T1, oc, mc, m2,
                 oj, TOL, C_PAD: tl.constexpr, K_PAD: tl.constexpr, IS_MAX: tl.constexpr, HAS_PS: tl.constexpr,
                 HAS_PE: tl.constexpr, COMPARE: tl.constexpr, REVERSE: tl.constexpr, lim_b, fl_b,
                 HAS_MASK: tl.constexpr, ea_b, ef_b, ENT: tl.constexpr):
        """One run of a (K, C, C) chunk from the state at ``s32`` / ``s64`` in the recurrence's
        direction: ``(st, F, converged, delta, steps, edge)`` (the forward's ``t_last``, beta's
        ``t_low``). ``ENT``: the prefix (suffix) entropies, weighted by the stored forward (Y) rows
        ``ea_b`` and their global frames ``ef_b``."""
        if REVERSE:
            st, F, conv, delta, steps, edge = _bw._dur_run_chunk(
                a, b, L, s32, s64, live, cum_b, ps_b, pe_b, r_b, f_b, tr_ptr, db_ptr, C, K,
                oc, mc, m2, oj, TOL, C_PAD, K_PAD, HAS_PS, HAS_PE, COMPARE, lim_b, fl_b, HAS_MASK, ea_b, ef_b, ENT)
        else:
            st, F, conv, delta, steps, edge = _fw._dur_run_chunk(
                a, b, L, s32, s64, live, cum_b, ps_b, pe_b, r_b, f_b, bp_b, tr_ptr, db_ptr, C, K, T1,
                oc, mc, m2, oj, TOL, C_PAD, K_PAD, IS_MAX, HAS_PS, HAS_PE, COMPARE, lim_b, fl_b, HAS_MASK, ea_b,
                ef_b, ENT)
        return st, F, conv, delta, steps, edge

    @triton.jit
    def _dur_save(e32, e64, a, b, st, F, r_b, f_b, s32, s64, K, C, oc, mc, C_PAD: tl.constexpr,
                  REVERSE: tl.constexpr):
        """The end state of a (K, C, C) run: its last K rows (``forward.py`` / ``beta.py``)."""
        if REVERSE:
            _bw._dur_save_end(e32, e64, a, b, st, F, r_b, f_b, s32, s64, K, C, oc, mc, C_PAD)
        else:
            _fw._dur_save_end(e32, e64, a, b, st, F, r_b, f_b, s32, s64, K, C, oc, mc, C_PAD)

    @triton.jit
    def _dur_chunks_kernel(
        cum_ptr,  # (B, T+1, C) cumulative scores S
        tr_ptr,  # (K, C, C) transition [k-1, c_src, c_dst]
        db_ptr,  # (K, C) duration bias
        len_ptr,  # (B,) int64 lengths
        ps_ptr,  # (B, T, C) proj_start (read only if HAS_PS)
        pe_ptr,  # (B, T, C) proj_end (read only if HAS_PE)
        r_ptr,  # (B, T+1, C) float32 out: the stored rows (forward alpha_hat, beta Y_hat)
        f_ptr,  # (B, T+1) float64 out: their frames
        i32, i64,  # (K*C,) float32, (K,) float64: "the sequence starts (ends) here"
        e32, e64,  # (2, B, NCH, K*C) / (2, B, NCH, K) end states: [0] spec runs, [1] non-converged fix-ups
        st_ptr,  # (B, NCH) int32: 1 if the chunk's last fix-up converged
        src_ptr,  # (B, NCH) int32: 1 or 2, which of e*[0] / e*[1] ends the chunk's stored rows
        dl_ptr,  # (B, NCH) float64: delta_j, offset of chunk j's system over its predecessor's
        cv_ptr,  # (B, NCH) int32: positions the last fix-up of the chunk ran
        C, K, W, NCH, s_cum_b, s_p_b, s_w_b, s_f_b, TOL,
        C_PAD: tl.constexpr,
        K_PAD: tl.constexpr,
        HAS_PS: tl.constexpr,
        HAS_PE: tl.constexpr,
        PHASE: tl.constexpr,  # 1 spec, 2 fix-up, 3 repair
        REVERSE: tl.constexpr = False,  # beta (else the forward)
        IS_MAX: tl.constexpr = False,  # the forward's max semiring (packed backpointers)
        bp_ptr=None,  # forward: (B, T+1, C) int32 out: packed backpointers k * 65536 + c_prev (IS_MAX)
        T1=None,  # forward: T + 1
        IDX64: tl.constexpr = False,
        lim_ptr=None,  # (B, T+1, C) int32: the segment limits, min_start (forward) / max_end (beta) (HAS_MASK)
        fl_ptr=None,  # (B, T+1) int8: flags of the masks (limits.py) (HAS_MASK)
        HAS_MASK: tl.constexpr = False,
        ea_ptr=None,  # ENT: (B, T+1, C) float32 stored rows that weigh the terms (forward alpha_hat, beta Y_hat)
        ef_ptr=None,  # ENT: (B, T+1) float64 their global frames
        ENT: tl.constexpr = False,  # the entropies of the prefixes (suffixes) instead of alpha (beta)
    ):
        """The time-parallel direct recurrence of a (K, C, C) transition, forward and (``REVERSE``)
        beta: the phases of :func:`_reg_chunks_kernel` with a state of K rows in memory (the rows the
        chunk wrote itself, and beyond its start its predecessor's saved end state). ``ENT``: the same
        phases for the entropy engine's linear recurrences (``forward.dur_ent_step``,
        ``beta.dur_ent_beta_step``), whose rows, like alpha's, agree with a rerun's up to one
        constant once the chain of their weights forgets the start."""
        b_id = tl.program_id(0).to(tl.int64)
        lim_b = lim_ptr
        fl_b = fl_ptr
        if HAS_MASK:
            lim_b = lim_ptr + b_id * s_w_b
            fl_b = fl_ptr + b_id * s_f_b
        ea_b = ea_ptr
        ef_b = ef_ptr
        if ENT:
            ea_b = ea_ptr + b_id * s_w_b
            ef_b = ef_ptr + b_id * s_f_b
        L = tl.load(len_ptr + b_id)
        if not IDX64:
            L = L.to(tl.int32)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        m2 = mc[:, None] & mc[None, :]
        oj = tl.arange(0, K_PAD)
        E32 = K * C
        cum_b = cum_ptr + b_id * s_cum_b
        ps_b = ps_ptr + b_id * s_p_b
        pe_b = pe_ptr + b_id * s_p_b
        r_b = r_ptr + b_id * s_w_b
        f_b = f_ptr + b_id * s_f_b
        bp_b = bp_ptr
        if not REVERSE:
            bp_b = bp_ptr + b_id * s_w_b
        row = b_id * NCH
        half = tl.num_programs(0).to(tl.int64) * NCH  # (B, NCH) entries per end-state buffer
        if REVERSE:
            n_b = (L + W - 1) // W  # chunks of this sequence
        else:
            n_b = NCH
        if PHASE == 1:
            j = tl.program_id(1)
            a = tl.cast(j, L.dtype) * W
            b = tl.minimum(a + W, L)
            live = a < L
            # "the sequence starts (ends) here": the first chunk in the run's direction from the truth
            st, F, conv, delta, steps, edge = _dur_run(
                a, b, L, i32, i64, live, cum_b, ps_b, pe_b, r_b, f_b, bp_b, tr_ptr, db_ptr, C, K, T1, oc, mc, m2,
                oj, TOL, C_PAD, K_PAD, IS_MAX, HAS_PS, HAS_PE, False, REVERSE, lim_b, fl_b, HAS_MASK, ea_b, ef_b,
                ENT)
            if live:
                e = row + j
                _dur_save(e32 + e * E32, e64 + e * K, a, b, st, F, r_b, f_b, i32, i64, K, C, oc, mc, C_PAD, REVERSE)
        else:
            j0, count = sweep_start(n_b, PHASE, REVERSE)
            # repair: chunk j's predecessor is "clean" when its stored rows are exact up to its offset
            # and end in its spec end state (the state chunk j's fix-up started from)
            clean_prev = tl.full([], 1, tl.int32)
            for jj in range(0, count):
                j, a, b, live, redo, e = sweep_chunk(j0, jj, W, L, n_b, clean_prev, src_ptr, row, half,
                                                     PHASE, REVERSE, "")
                if redo:
                    # phase 2: the predecessor's spec end state; repair: the end state of the
                    # predecessor's stored rows (its spec end, or the end of an exact rerun)
                    s32 = e32 + e * E32
                    s64 = e64 + e * K
                    st, F, conv, delta, steps, edge = _dur_run(
                        a, b, L, s32, s64, live, cum_b, ps_b, pe_b, r_b, f_b, bp_b, tr_ptr, db_ptr, C, K, T1, oc,
                        mc, m2, oj, TOL, C_PAD, K_PAD, IS_MAX, HAS_PS, HAS_PE, True, REVERSE, lim_b, fl_b, HAS_MASK,
                        ea_b, ef_b, ENT)
                    if conv != 0:
                        # the rows the fix-up wrote move into the chunk's system
                        if REVERSE:
                            _bw._fix_suffix_frames(f_b, edge, b, delta, 256)
                        else:
                            _fw._fix_prefix_frames(f_b, a, edge + 1, delta, 256)
                        clean = chunk_clean(src_ptr, row, j)
                    else:
                        # an exact rerun that did not converge: its rows are the stored ones now
                        e = half + row + j
                        _dur_save(e32 + e * E32, e64 + e * K, a, b, st, F, r_b, f_b, s32, s64, K, C, oc, mc, C_PAD,
                                  REVERSE)
                        clean = rerun_owns_end(src_ptr, row, j, conv)
                    record_rerun(st_ptr, dl_ptr, cv_ptr, row, j, conv, delta, steps)
                    clean_prev = clean
                else:
                    clean_prev = passed_clean(clean_prev, live, src_ptr, row, j, PHASE)
                # the next chunk reads what this one stored (end state, flags) from other threads
                tl.debug_barrier()
