"""Blocked recurrence kernel: the factored forward and beta for rings too large for registers
(genomics shapes: K ~ 10^3 durations, C ~ 50 labels), parallel over time.

One kernel, ``_blk_chunks_kernel``, runs both recurrences (``REVERSE``: beta) under the chunk /
fix-up / repair scheme of ``forward.py`` (one program per (sequence, chunk), the same three
launches, the same convergence test and frame offsets; host side in ``parallel.py``). What
differs is the step: the ring of the last K rows lives in memory (the stored rows themselves,
and the predecessor's end state for rows before the chunk), and the K·C terms of a position are
spread over the whole program by blocking in time.

A block is BT consecutive positions q = q0 + d·i (i = 1 .. BT; d = +1 forward, -1 beta) after a
position q0 whose ring row is stored. Each position's sum splits into

* *old* rows r = q0 - d·rho (rho >= 0, known when the block starts): phase A computes
  ``P[i, c] = LSE_rho V[rho, c] + D[i + rho - 1, c]`` for the whole block at once, as
  (BT, RB, CB) tiles over rows and labels (``V`` is the ring row in the block's frame, with the
  segment sum's S term), every row loaded once per block and used by BT positions;
* *new* rows (inside the block, at most BT - 1): phase B, sequential, keeps them in a (BT, C_PAD)
  register ring and finishes each position: the sum, the label step (the transition), the
  normaliser, the stored row and the fix-up's comparison.

Per position (forward; beta mirrored, ``docs/internals.md`` §3):

    alpha_t = pe_{t-1} + S_t + LSE_k (U_{t-k} - S_{t-k} + D[k-1])      (phase A + phase B)
    U_t     = LSE_{c'} (alpha_t(c') + Tr[c', c]) + ps_t                 (phase B)

    lse_s   = LSE_k (D[k-1] + Y_{s+k} + S_{s+k}) - S_s,  beta_s = LSE_c (Tr[c', c] + lse_s + ps_s)
    Y_s     = pe_{s-1} + beta_s

Stored rows and frames are those of the register-ring chunk kernels (alpha_hat, U_hat with one
float64 frame per row; Y_hat and its frame), so the marginal, anchor and traceback kernels read
them unchanged. The max semiring (forward) stores the argmax duration of alpha_t and the argmax
source label of U_s per (position, label); the host packs them into the traceback's
``k * 65536 + c_prev`` afterwards. Ties: the smallest duration, the smallest source label.
"""

from __future__ import annotations

from torch_semimarkov.engines.triton.common import HAS_TRITON, tl, triton  # noqa: F401

if HAS_TRITON:
    from torch_semimarkov.engines.triton.common import MASK_K as MASK
    from torch_semimarkov.engines.triton.common import log_, possible_shift, row_offset_bounds, window_offset
    from torch_semimarkov.engines.triton.common import window_start
    from torch_semimarkov.engines.triton.common import chunk_clean, record_rerun, rerun_owns_end
    from torch_semimarkov.engines.triton.common import sweep_chunk, sweep_start
    from torch_semimarkov.engines.triton.forward import _fix_prefix_frames

    #: A run's progress once it has ended (``_blk_run``): its helpers stop.
    HELP_DONE = tl.constexpr(1 << 30)

    @triton.jit
    def _ring_rows(r, ok, start, r_b, f_b, in32, in64, C, K, cols, mcol,
                   HAS_IN: tl.constexpr, REVERSE: tl.constexpr, PER_LABEL: tl.constexpr, CM: tl.constexpr):
        """Ring rows ``r`` (RB,) at label columns ``cols`` and their frames: a row the run owns
        (at or past ``start`` in its direction) from the stored rows, a row before the start from
        the incoming state (row m = distance - 1 of ``in32`` / ``in64``, only with ``HAS_IN``),
        else impossible. Returns ``(rows (RB, CB) float32, frames (RB,) float64)``. PER_LABEL:
        ``r`` and ``ok`` are (RB, CB), a row per label (``_edge_exact``), and so are the frames.
        CM: the loads' cache modifier (".cg" in a helper, ``_blk_help``: rows that another program
        wrote while this one ran, which a line cached in L1 before could hide)."""
        if REVERSE:
            own = r <= start
            m = r - start - 1
        else:
            own = r >= start
            m = start - 1 - r
        from_in = ok & (~own) & (m < K)
        own = ok & own
        rp = tl.where(own, r, 0)
        if PER_LABEL:
            m2o = own & mcol[None, :]
            v = tl.load(r_b + rp * C + cols[None, :], mask=m2o, other=MASK, cache_modifier=CM)
        else:
            m2o = own[:, None] & mcol[None, :]
            v = tl.load(r_b + rp[:, None] * C + cols[None, :], mask=m2o, other=MASK, cache_modifier=CM)
        fr = tl.load(f_b + rp, mask=own, other=0.0, cache_modifier=CM)
        if HAS_IN:
            mp = tl.where(from_in, m, 0)
            if PER_LABEL:
                m2i = from_in & mcol[None, :]
                v = tl.where(m2i, tl.load(in32 + mp * C + cols[None, :], mask=m2i, other=MASK), v)
            else:
                m2i = from_in[:, None] & mcol[None, :]
                v = tl.where(m2i, tl.load(in32 + mp[:, None] * C + cols[None, :], mask=m2i, other=MASK), v)
            fr = tl.where(from_in, tl.load(in64 + mp, mask=from_in, other=0.0), fr)
        return v, fr

    @triton.jit
    def _old_rows(q0, r0, start, L, H, r_b, f_b, in32, in64, cum_b, s_ref, C, K, cols, mcol, orr,
                  HAS_IN: tl.constexpr, REVERSE: tl.constexpr, CM: tl.constexpr):
        """The old rows rho = r0 .. r0 + RB - 1 of the block after q0, in the block's frame H with
        the segment sums relative to S_{q0}: ``(V (RB, CB), rho, r, ok)``."""
        rho = r0 + orr
        if REVERSE:
            r = q0 + rho
            ok = (rho < K) & (r <= L)
        else:
            r = q0 - rho
            ok = (rho < K) & (r >= 0)
        v, fr = _ring_rows(r, ok, start, r_b, f_b, in32, in64, C, K, cols, mcol, HAS_IN, REVERSE, False, CM)
        rp = tl.where(ok, r, 0)
        sr = tl.load(cum_b + rp[:, None] * C + cols[None, :], mask=ok[:, None] & mcol[None, :], other=0.0)
        if REVERSE:
            v = v + (fr - H).to(tl.float32)[:, None] + (sr - s_ref[None, :])
        else:
            v = v + (fr - H).to(tl.float32)[:, None] - (sr - s_ref[None, :])
        return v, rho, r, ok

    @triton.jit
    def _tile_exact(q0, ii, vi, start, L, H, r_b, f_b, in32, in64, cum_b, db_ptr, lim_b, s_ref, C, K, cols,
                    mcol, orr, HAS_IN: tl.constexpr, CB: tl.constexpr, BT: tl.constexpr,
                    REVERSE: tl.constexpr, IS_MAX: tl.constexpr, HAS_MASK: tl.constexpr, R0, KR, CM: tl.constexpr,
                    wd_ptr, IO: tl.constexpr, BOUND: tl.constexpr):
        """Phase A of one label tile in log space, term by term, over the old rows R0 <= rho < KR
        (0, K: all of them; a helper's share of them; 0, BT with helpers: the previous block's rows,
        ``_help_parts``): ``(P (BT, CB), argmax k)``.

        BOUND (max semiring): ``wd_ptr`` (K + 2·BT + 1, C) float32 holds, at row j, the largest duration
        bias of the durations j + 1 .. j + BT (``parallel.max_bound_table``), so that a tile of rows
        whose largest ``row + bias`` per label is at most every position's running maximum is
        skipped: none of its terms can raise a maximum (float32 sums round monotonically) nor win a
        tie (its durations are longer than those of every tile before it). IO: the positions' offset
        (``ii = IO + 1 ..``), so row rho meets durations rho + IO + 1 .. rho + IO + BT."""
        run_m = tl.full([BT, CB], 2 * MASK, tl.float32)
        run_s = tl.zeros([BT, CB], dtype=tl.float32)
        run_k = tl.zeros([BT, CB], dtype=tl.int32)
        if HAS_MASK:
            if REVERSE:
                qi = q0 - ii
                limb = tl.load(lim_b + qi[:, None] * C + cols[None, :], mask=vi[:, None] & mcol[None, :],
                               other=2147483647)
            else:
                qi = q0 + ii
                limb = tl.load(lim_b + qi[:, None] * C + cols[None, :], mask=vi[:, None] & mcol[None, :],
                               other=0)
        for r0 in range(R0, KR, orr.shape[0]):
            v, rho, r, ok = _old_rows(q0, r0, start, L, H, r_b, f_b, in32, in64, cum_b, s_ref, C, K, cols, mcol,
                                      orr, HAS_IN, REVERSE, CM)
            go = True
            if BOUND:
                # the tile's bound: per label its largest row plus the largest bias of the durations
                # it meets, against the least running maximum over the block's positions
                wd = tl.load(wd_ptr + (rho + IO)[:, None] * C + cols[None, :], mask=ok[:, None] & mcol[None, :],
                             other=2 * MASK)
                low = tl.min(tl.where(vi[:, None], run_m, 3.0e38), 0)
                go = tl.max(tl.where(mcol, tl.max(v + wd, 0) - low, -1.0), 0) > 0
            if go:
                # duration k = i + rho of row rho at position i
                kk = ii[:, None] + rho[None, :]
                vk = vi[:, None] & ok[None, :] & (kk <= K)
                m3 = vk[:, :, None] & mcol[None, None, :]
                if HAS_MASK:
                    if REVERSE:
                        m3 = m3 & (r[None, :, None] <= limb[:, None, :])
                    else:
                        m3 = m3 & (r[None, :, None] >= limb[:, None, :])
                dv = tl.load(db_ptr + (kk[:, :, None] - 1) * C + cols[None, None, :], mask=m3, other=MASK)
                x = v[None, :, :] + dv.to(tl.float32)
                x = tl.where(m3, x, 2 * MASK)
                if IS_MAX:
                    # the largest term and its first row (the smallest duration: kk grows with rho, and
                    # every masked term lies past the block's allowed rows) in one reduction over rows
                    bm, bi = tl.max(x, 1, return_indices=True, return_indices_tie_break_left=True)
                    bk = ii[:, None] + r0 + bi
                    upd = bm > run_m
                    run_k = tl.where(upd, bk, run_k)
                    run_m = tl.where(upd, bm, run_m)
                else:
                    nm = tl.maximum(run_m, tl.max(x, 1))
                    run_s = run_s * tl.exp(run_m - nm) + tl.sum(tl.exp(x - nm[:, None, :]), 1)
                    run_m = nm
        if IS_MAX:
            p = run_m
        else:
            p = tl.where(run_s > 0, run_m + log_(tl.where(run_s > 0, run_s, 1.0)), 2 * MASK)
        return p, run_k

    @triton.jit
    def _usable(ok, rho, kmin, kmax, BT: tl.constexpr):
        """(RB, CB): the old rows some position of the block may use (duration in [kmin_c, kmax_c] for
        some i = 1 .. BT); the others neither set a linear sum's shift nor enter it."""
        return ok[:, None] & (rho[:, None] < kmax[None, :]) & (rho[:, None] + BT >= kmin[None, :])

    @triton.jit
    def _linear_rows(q0, ii, kmin, kmax, start, L, H, r_b, f_b, in32, in64, cum_b, ed_ptr, s_ref, C, K, cols, mcol,
                     orr, R0, R1, HAS_IN: tl.constexpr, C_PAD: tl.constexpr, CB: tl.constexpr, BT: tl.constexpr,
                     REVERSE: tl.constexpr, CM: tl.constexpr):
        """The linear-space sum of the old rows R0 <= rho < R1 against ``ED`` with one shift per label:
        ``(acc (BT, CB), m (CB,), lo (CB,), hi (CB,))`` with ``acc[i, c] = sum_rho exp(V[rho, c] -
        m_c) · ED[i + rho - 1, c]``, ``m_c`` the largest row some position of the block may use
        (duration in [kmin_c, kmax_c]) and lo / hi the first and last finite such row.

        Two passes over the rows, neither reducing over them per tile: the first keeps the largest
        row and the first / last finite one per (row slot, label), the second the products per
        (position, row slot, label); each is reduced over the rows once, after its pass (a
        reduction over a tile's rows crosses the program's warps: a shared-memory round a tile)."""
        m2 = tl.full([orr.shape[0], CB], 2 * MASK, tl.float32)
        lo2 = tl.full([orr.shape[0], CB], 1 << 30, tl.int32)
        hi2 = tl.full([orr.shape[0], CB], -(1 << 30), tl.int32)
        for r0 in range(R0, R1, orr.shape[0]):
            v, rho, r, ok = _old_rows(q0, r0, start, L, H, r_b, f_b, in32, in64, cum_b, s_ref, C, K, cols, mcol,
                                      orr, HAS_IN, REVERSE, CM)
            use = _usable(ok, rho, kmin, kmax, BT)
            fin = use & (v > -1e29)
            m2 = tl.maximum(m2, tl.where(use, v, 2 * MASK))
            lo2 = tl.minimum(lo2, tl.where(fin, rho[:, None], 1 << 30))
            hi2 = tl.maximum(hi2, tl.where(fin, rho[:, None], -(1 << 30)))
        run_m = tl.max(m2, 0)
        acc3 = tl.zeros([BT, orr.shape[0], CB], dtype=tl.float32)
        for r0 in range(R0, R1, orr.shape[0]):
            v, rho, r, ok = _old_rows(q0, r0, start, L, H, r_b, f_b, in32, in64, cum_b, s_ref, C, K, cols, mcol,
                                      orr, HAS_IN, REVERSE, CM)
            ev = tl.where(_usable(ok, rho, kmin, kmax, BT), tl.exp(v - run_m[None, :]), 0.0)
            kk = ii[:, None] + rho[None, :]
            ed = tl.load(ed_ptr + (kk[:, :, None] - 1) * C_PAD + cols[None, None, :])
            acc3 += ed * ev[None, :, :]
        return tl.sum(acc3, 1), run_m, tl.min(lo2, 0), tl.max(hi2, 0)

    @triton.jit
    def _pick(j, any_res, x0, x1, x2, xa):
        """Per element, the (CB,) value of class ``j`` (0, 1, 2) broadcast over j's rows, or ``xa``
        where ``any_res`` (labels whose durations share no residue)."""
        return tl.where(any_res, xa[None, :], tl.where(j == 0, x0[None, :], tl.where(j == 1, x1[None, :], x2[None, :])))

    @triton.jit
    def _linear_core(q0, ii, kmin, kmax, lam, res, start, L, H, r_b, f_b, in32, in64, cum_b, ed_ptr, s_ref, C, K,
                     cols, mcol, orr, R0, R1, HAS_IN: tl.constexpr, C_PAD: tl.constexpr, CB: tl.constexpr,
                     BT: tl.constexpr, REVERSE: tl.constexpr, CM: tl.constexpr):
        """The linear-space sum of the old rows R0 <= rho < R1 every position of the block may use (duration in
        [kmin_c, kmax_c] for i = 1 .. BT), each row raised by ``lam_c · rho`` (the trend taken out
        of ``ED``), with one shift per residue class of the rows modulo 3: ``(acc (BT, CB), M (BT,
        CB), has (BT, CB))`` with ``acc[i, c] = sum_rho exp(V[rho, c] - M[i, c]) · ED[i + rho - 1,
        c]``. A label whose durations share a residue (``res_c`` >= 0) reaches position i from one
        class only, j = (res_c - i) mod 3, and a row of class j is scaled by that class's largest
        row, so ``M[i, c]`` is the shift of a term the position may take; other labels scale every
        row by the largest of all. ``has``: a finite row reaches the position."""
        m0 = tl.full([CB], 2 * MASK, tl.float32)
        m1 = tl.full([CB], 2 * MASK, tl.float32)
        m2 = tl.full([CB], 2 * MASK, tl.float32)
        ma = tl.full([CB], 2 * MASK, tl.float32)
        acc = tl.zeros([BT, CB], dtype=tl.float32)
        any_res = res[None, :] < 0
        js = (res[None, :] - ii[:, None] + 3 * BT) % 3  # the class that reaches position i
        for r0 in range(R0, R1, orr.shape[0]):
            v, rho, r, ok = _old_rows(q0, r0, start, L, H, r_b, f_b, in32, in64, cum_b, s_ref, C, K, cols, mcol,
                                      orr, HAS_IN, REVERSE, CM)
            use = ok[:, None] & (rho[:, None] + 1 >= kmin[None, :]) & (rho[:, None] + BT <= kmax[None, :])
            v = tl.where(use, v + lam[None, :] * rho[:, None].to(tl.float32), 2 * MASK)
            cls = (rho % 3)[:, None]
            n0 = tl.maximum(m0, tl.max(tl.where(cls == 0, v, 2 * MASK), 0))
            n1 = tl.maximum(m1, tl.max(tl.where(cls == 1, v, 2 * MASK), 0))
            n2 = tl.maximum(m2, tl.max(tl.where(cls == 2, v, 2 * MASK), 0))
            na = tl.maximum(tl.maximum(n0, n1), n2)
            acc = acc * tl.exp(_pick(js, any_res, m0, m1, m2, ma) - _pick(js, any_res, n0, n1, n2, na))
            ev = tl.exp(v - _pick(cls, any_res, n0, n1, n2, na))
            m0 = n0
            m1 = n1
            m2 = n2
            ma = na
            kk = ii[:, None] + rho[None, :]
            ed = tl.load(ed_ptr + (kk[:, :, None] - 1) * C_PAD + cols[None, None, :])
            acc += tl.sum(ed * ev[None, :, :], 1)
        M = _pick(js, any_res, m0, m1, m2, ma)
        return acc, M, M > -1e29

    @triton.jit
    def _lae(a, b):
        """log(e^a + e^b) of two block sums (2·MASK where both are impossible)."""
        m = tl.maximum(a, b)
        return tl.where(m > MASK, m + log_(1.0 + tl.exp(tl.minimum(a, b) - m)), 2 * MASK)

    @triton.jit
    def _edge_exact(q0, ii, vi, kmin, kmax, start, L, H, r_b, f_b, in32, in64, cum_b, db_ptr, s_ref, C, K, cols,
                    mcol, R0, R1, HAS_IN: tl.constexpr, CB: tl.constexpr, BT: tl.constexpr, REVERSE: tl.constexpr,
                    CM: tl.constexpr):
        """The old rows that only some positions of the block may use, term by term in log space:
        per label, rho in [kmin - BT, kmin - 2] (short durations) and [max(kmax - BT + 1, kmin - 1),
        kmax - 1] (long ones; all of a label's rows where its range is narrower than the block),
        at most 2·BT - 2 rows a label; only those in R0 <= rho < R1 (a helper's share of the rows).
        Returns ``P (BT, CB)``."""
        oe = tl.arange(0, 8)
        low_end = tl.minimum(kmin - 2, kmax - 1)
        up_start = tl.maximum(kmax - BT + 1, kmin - 1)
        run_m = tl.full([BT, CB], 2 * MASK, tl.float32)
        run_s = tl.zeros([BT, CB], dtype=tl.float32)
        for e0 in range(0, 2 * BT - 2, 8):
            e = (e0 + oe)[:, None]
            lower = e < BT - 1
            rho = tl.where(lower, kmin[None, :] - BT + e, up_start[None, :] + e - (BT - 1))
            ok = tl.where(lower, rho <= low_end[None, :], rho <= kmax[None, :] - 1) & (e < 2 * BT - 2)
            ok = ok & (rho >= R0) & (rho < R1) & (rho < K) & mcol[None, :]
            if REVERSE:
                r = q0 + rho
                ok = ok & (r <= L)
            else:
                r = q0 - rho
                ok = ok & (r >= 0)
            v, fr = _ring_rows(r, ok, start, r_b, f_b, in32, in64, C, K, cols, mcol, HAS_IN, REVERSE, True, CM)
            sr = tl.load(cum_b + tl.where(ok, r, 0) * C + cols[None, :], mask=ok, other=0.0)
            if REVERSE:
                v = v + (fr - H).to(tl.float32) + (sr - s_ref[None, :])
            else:
                v = v + (fr - H).to(tl.float32) - (sr - s_ref[None, :])
            kk = ii[:, None, None] + rho[None, :, :]
            m3 = vi[:, None, None] & ok[None, :, :] & (kk >= 1) & (kk <= K)
            dv = tl.load(db_ptr + (kk - 1) * C + cols[None, None, :], mask=m3, other=MASK)
            x = tl.where(m3, v[None, :, :] + dv.to(tl.float32), 2 * MASK)
            nm = tl.maximum(run_m, tl.max(x, 1))
            run_s = run_s * tl.exp(run_m - nm) + tl.sum(tl.exp(x - nm[:, None, :]), 1)
            run_m = nm
        return tl.where(run_s > 0, run_m + log_(tl.where(run_s > 0, run_s, 1.0)), 2 * MASK)

    @triton.jit
    def _tile_linear(q0, ii, vi, start, L, H, r_b, f_b, in32, in64, cum_b, db_ptr, ed_ptr, md_ptr, kr_ptr, s_ref,
                     C, K, cols, mcol, orr, R0, R1, HAS_IN: tl.constexpr, C_PAD: tl.constexpr, CB: tl.constexpr,
                     BT: tl.constexpr, REVERSE: tl.constexpr, PERIOD: tl.constexpr, IO: tl.constexpr,
                     CM: tl.constexpr):
        """Phase A of one label tile (log semiring) as a product in linear space:
        ``P[i, c] = m_c + MD_c + log sum_rho exp(V[rho, c] - m_c) · ED[i + rho - 1, c]`` with
        ``ED = exp(D - MD_c)`` precomputed (zero past K), ``m_c`` the running maximum of the rows:
        one multiply-add per term instead of an exponential. Returns ``(P (BT, CB), need)``: need
        is True when some possible sum fell below 1e-25 (float32 underflow could then lose a
        dominant term; the caller recomputes the tile term by term). A sum is possible unless
        no row of the label is finite or no duration of its finite rows lies in the label's
        finite range [kmin, kmax] of D.

        PERIOD = 3 (gene grammars and models whose duration bias has a trend in k,
        ``parallel.linear_period``) makes the shift that of a term the position may use:

        * each row is scaled by the largest row of its residue class rho mod 3 (``_linear_core``):
          a coding label (durations of one residue modulo 3, ``kr_ptr`` row 2) reaches a position
          from one class only, whose largest row it may take, and the one product sums them all;
        * only the rows every position of the block may use (duration in [kmin, kmax] for
          i = 1 .. BT) enter the linear sums; the others, at most 2·BT - 2 a label, are summed
          term by term (``_edge_exact``), so a recent row that a short duration forbids (an
          intron's first 30 positions) never sets the shift;
        * a trend ``lam_c`` per label (``md_ptr`` row 1; the k·mu of ``cumulative_scores``) is
          taken out of ``ED`` and put back as ``lam_c · rho`` on the rows and ``lam_c · i`` on
          the positions, so that ``ED`` spans little.

        With one shift for all rows of a gene grammar, the largest row was often a duration the
        label may not take and the tile was recomputed term by term on nearly every block.

        IO: the positions are q0 + d·i for i = IO + 1 .. IO + BT (a helper's part, ``_blk_help``):
        the rows' durations shift by IO, so the rows' selection takes the range [kmin - IO,
        kmax - IO].

        R0, R1: the rows R0 <= rho < R1 only (0, K: all; a helper's share, ``_blk_help``); whether a
        sum underflowed is judged over these rows, and so is its term-by-term recomputation."""
        kmin = tl.load(kr_ptr + cols)
        kmax = tl.load(kr_ptr + C_PAD + cols)
        md = tl.load(md_ptr + cols)
        if PERIOD == 1:
            acc, run_m, lo, hi = _linear_rows(q0, ii, kmin - IO, kmax - IO, start, L, H, r_b, f_b, in32, in64, cum_b,
                                              ed_ptr, s_ref, C, K, cols, mcol, orr, R0, R1, HAS_IN, C_PAD, CB, BT,
                                              REVERSE, CM)
            p = tl.where(acc > 0, (run_m + md)[None, :] + log_(tl.where(acc > 0, acc, 1.0)), 2 * MASK)
            possible = vi[:, None] & mcol[None, :] & (hi >= lo)[None, :] & \
                ((ii[:, None] + lo[None, :]) <= kmax[None, :]) & ((ii[:, None] + hi[None, :]) >= kmin[None, :])
            need = tl.sum(tl.sum((possible & (acc <= 1e-25)).to(tl.int32), 1), 0) > 0
        else:
            res = tl.load(kr_ptr + 2 * C_PAD + cols)
            lam = tl.load(md_ptr + C_PAD + cols)
            acc, M, has = _linear_core(q0, ii, kmin - IO, kmax - IO, lam, res, start, L, H, r_b, f_b, in32, in64,
                                       cum_b, ed_ptr, s_ref, C, K, cols, mcol, orr, R0, R1, HAS_IN, C_PAD, CB, BT,
                                       REVERSE, CM)
            p = tl.where(acc > 0, M + md[None, :] + log_(tl.where(acc > 0, acc, 1.0)), 2 * MASK)
            possible = vi[:, None] & mcol[None, :] & has
            need = tl.sum(tl.sum((possible & (acc <= 1e-25)).to(tl.int32), 1), 0) > 0
            p = tl.where(p > MASK, p + lam[None, :] * ii[:, None].to(tl.float32), p)
            p = _lae(p, _edge_exact(q0, ii, vi, kmin - IO, kmax - IO, start, L, H, r_b, f_b, in32, in64, cum_b, db_ptr,
                                    s_ref, C, K, cols, mcol, R0, R1, HAS_IN, CB, BT, REVERSE, CM))
        return p, need

    @triton.jit
    def _phase_a(q0, nb, start, L, H, r_b, f_b, in32, in64, cum_b, db_ptr, ed_ptr, md_ptr, kr_ptr, sc_b, sk_b,
                 lim_b, C, K, oi, ob, orr, orx, cb0, R0, R1, HAS_IN: tl.constexpr,
                 C_PAD: tl.constexpr, CB: tl.constexpr, RB: tl.constexpr, BT: tl.constexpr,
                 REVERSE: tl.constexpr, IS_MAX: tl.constexpr, HAS_MASK: tl.constexpr, LINEAR: tl.constexpr,
                 CBS: tl.constexpr, IO: tl.constexpr, CM: tl.constexpr, BOUND: tl.constexpr):
        """The old rows' part of the block's positions q0 + d·i (i = IO + 1 .. IO + nb), written to
        the scratch ``sc_b`` (BT, C_PAD) (and the argmax duration to ``sk_b``), in the frame H with
        the segment sums relative to S_{q0}, for the label tiles cb0, cb0 + CBS, ... (all of them:
        cb0 = 0, CBS = CB; a helper's share of them, ``_blk_help``, at IO = BT), over the old rows
        R0 <= rho < R1 (0, K: all; a helper's share). HAS_MASK:
        ``lim_b`` (T+1, C) int32 is the segment limit per (position, label), the smallest allowed
        start (forward) or the largest allowed end (beta) of a segment at that position. LINEAR
        (log semiring, no masks): the sums as products in linear space (``_tile_linear``), a tile
        recomputed term by term where a sum underflows."""
        ii = oi + 1 + IO
        vi = oi + 1 <= nb
        for cb in range(cb0, C, CBS):
            cols = cb + ob
            mcol = cols < C
            s_ref = tl.load(cum_b + q0 * C + cols, mask=mcol, other=0.0)
            if LINEAR:
                p, need = _tile_linear(q0, ii, vi, start, L, H, r_b, f_b, in32, in64, cum_b, db_ptr, ed_ptr, md_ptr,
                                       kr_ptr, s_ref, C, K, cols, mcol, orr, R0, R1, HAS_IN, C_PAD, CB, BT, REVERSE,
                                       LINEAR, IO, CM)
                if need:
                    # counted in row 3 of the duration ranges (probes: how often the sums underflow)
                    tl.atomic_add(kr_ptr + 3 * C_PAD, 1)
                    p, run_k = _tile_exact(q0, ii, vi, start, L, H, r_b, f_b, in32, in64, cum_b, db_ptr, lim_b,
                                           s_ref, C, K, cols, mcol, orx, HAS_IN, CB, BT, REVERSE, IS_MAX, HAS_MASK, R0,
                                           R1, CM, ed_ptr, IO, BOUND)
            else:
                p, run_k = _tile_exact(q0, ii, vi, start, L, H, r_b, f_b, in32, in64, cum_b, db_ptr, lim_b,
                                       s_ref, C, K, cols, mcol, orr, HAS_IN, CB, BT, REVERSE, IS_MAX, HAS_MASK, R0, R1,
                                       CM, ed_ptr, IO, BOUND)
                if IS_MAX:
                    tl.store(sk_b + oi[:, None] * C_PAD + cols[None, :], run_k, mask=mcol[None, :])
            tl.store(sc_b + oi[:, None] * C_PAD + cols[None, :], p, mask=mcol[None, :])

    @triton.jit
    def _help_parts(q0, qp, nb, start, L, H, HP, r_b, f_b, in32, in64, cum_b, db_ptr, ed_ptr, lim_b, hs_b, hk_b, sc_b,
                    sk_b,
                    C, K, oi, ob, orm, HAS_IN: tl.constexpr, C_PAD: tl.constexpr, CB: tl.constexpr,
                    BT: tl.constexpr, REVERSE: tl.constexpr, IS_MAX: tl.constexpr, HAS_MASK: tl.constexpr,
                    HR: tl.constexpr, BOUND: tl.constexpr):
        """Phase A of a block after q0 from its parts: the previous block's own rows (rho < BT, term
        by term here) and the rows older than the previous block (at or before its start qp, the
        helpers' sums ``hs_b`` / ``hk_b`` in that block's frame HP relative to S_{qp}, in HR parts
        of consecutive rows, each (BT, C_PAD)), combined in that order and written to the scratch
        as ``_phase_a`` writes it. Each part has longer durations than the one before, so a tie of
        the max semiring keeps the earlier part's row."""
        ii = oi + 1
        vi = ii <= nb
        for cb in range(0, C, CB):
            cols = cb + ob
            mcol = cols < C
            s_ref = tl.load(cum_b + q0 * C + cols, mask=mcol, other=0.0)
            s_prev = tl.load(cum_b + qp * C + cols, mask=mcol, other=0.0)
            p, run_k = _tile_exact(q0, ii, vi, start, L, H, r_b, f_b, in32, in64, cum_b, db_ptr, lim_b,
                                   s_ref, C, K, cols, mcol, orm, HAS_IN, CB, BT, REVERSE, IS_MAX, HAS_MASK, 0, BT, "",
                                   ed_ptr, 0, BOUND)
            m2 = mcol[None, :] & (oi[:, None] < BT)
            # the helpers' frame (HP, S_{qp}) moved to this block's (H, S_{q0})
            if REVERSE:
                shift = (HP - H).to(tl.float32) + (s_prev - s_ref)
            else:
                shift = (HP - H).to(tl.float32) - (s_prev - s_ref)
            for j in tl.static_range(HR):
                at = j * (BT * C_PAD) + oi[:, None] * C_PAD + cols[None, :]
                ph = tl.load(hs_b + at, mask=m2, other=2 * MASK, cache_modifier=".cg")
                ph = tl.where(ph > MASK, ph + shift[None, :], ph)
                if IS_MAX:
                    kh = tl.load(hk_b + at, mask=m2, other=0, cache_modifier=".cg")
                    old = ph > p
                    run_k = tl.where(old, kh, run_k)
                    p = tl.where(old, ph, p)
                else:
                    p = _lae(p, ph)
            if IS_MAX:
                tl.store(sk_b + oi[:, None] * C_PAD + cols[None, :], run_k, mask=mcol[None, :])
            tl.store(sc_b + oi[:, None] * C_PAD + cols[None, :], p, mask=mcol[None, :])

    @triton.jit
    def _part_rows(j, hrs, K, HR: tl.constexpr):
        """The old rows ``(R0, R1)`` of part j of HR (``hrs`` rows each, a multiple of the tiles'
        rows; the last part ends at K): a helper's share of a block's rows, ``_blk_help``."""
        if HR == 1:
            return j * 0, K
        else:
            return j * hrs, tl.where(j == HR - 1, K, tl.minimum((j + 1) * hrs, K))

    @triton.jit
    def _wait_for(ptr, target, spins):
        """Poll the int32 at ``ptr`` (acquire) until it is at least ``target`` or ``spins`` polls
        have passed; returns the last value read. Every thread of the program sees the writes
        released before that value (the barrier after the acquire)."""
        v = tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")
        n = spins * 0
        while (v < target) & (n < spins):
            v = tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")
            n += 1
        tl.debug_barrier()
        return v

    @triton.jit
    def _row_of(q, st, M, u0, ps_b, pe_b, fl_b, C, oc, mc,
                REVERSE: tl.constexpr, IS_MAX: tl.constexpr, HAS_PS: tl.constexpr, HAS_PE: tl.constexpr,
                HAS_MASK: tl.constexpr):
        """The ring row of position q from its state value: forward ``U_q = LSE_{c'} alpha_q(c')
        + Tr[c', c] + ps_q`` (the phantom ``LSE_{c'} Tr`` at q = 0 in both semirings; with its
        argmax source label in the max semiring), beta ``Y_q = beta_q + pe_{q-1}``."""
        bc = tl.zeros([oc.shape[0]], dtype=tl.int32)
        if REVERSE:
            row = st
            if HAS_PE:
                lim = tl.where(q >= 1, C, 0)
                row += tl.load(pe_b + (q - 1) * C + oc, mask=oc < lim, other=0.0).to(tl.float32)
        else:
            x = M + st[None, :]
            mx = tl.max(x, 1)
            if IS_MAX:
                row = tl.where(q == 0, u0, mx)
                bc = tl.argmax(x, 1, tie_break_left=True).to(tl.int32)
            else:
                row = mx + log_(tl.sum(tl.exp(x - mx[:, None]), 1))
            if HAS_PS:
                row += tl.load(ps_b + q * C + oc, mask=mc, other=0.0).to(tl.float32)
            if HAS_MASK:
                # no segment starts at a forbidden start (flag NO_START)
                row += tl.where((tl.load(fl_b + q).to(tl.int32) & 4) != 0, MASK, 0.0)
        return tl.where(mc, row, MASK), bc

    @triton.jit
    def _compare_row(q, row, st, F, r_b, a_b, f_b, wlo, whi, inwin, oj, oc, mc, C, TOL,
                     K_PAD: tl.constexpr, IS_MAX: tl.constexpr):
        """A fix-up's test of a recomputed row q (frame F) against the stored one, read before it is
        overwritten: its offset interval (with alpha_hat's too in the max semiring, whose argmax
        labels the backpointers keep) enters the window ring (``window_offset``) at slot q; the
        window is the rows flagged ``inwin``. Returns ``(wlo, whi, converged, delta)``."""
        f_ref = tl.load(f_b + q)
        lo, hi = row_offset_bounds(row, tl.load(r_b + q * C + oc, mask=mc, other=MASK), F - f_ref, mc, TOL)
        if IS_MAX:
            a_lo, a_hi = row_offset_bounds(st, tl.load(a_b + q * C + oc, mask=mc, other=MASK), F - f_ref, mc, TOL)
            lo = tl.maximum(lo, a_lo)
            hi = tl.minimum(hi, a_hi)
        wlo, whi, ok, dd = window_offset(wlo, whi, oj, tl.cast(q, tl.int32) & (K_PAD - 1), lo, hi, inwin)
        # the stored row is read before this program overwrites it
        tl.debug_barrier()
        return wlo, whi, ok, dd

    @triton.jit
    def _store_row(q, row, st, bc, F, r_b, a_b, f_b, bc_b, oc, mc, C, REVERSE: tl.constexpr, IS_MAX: tl.constexpr):
        """Store row q: the ring row and its frame; forward also alpha_hat and (max) the argmax
        source label of U_q."""
        tl.store(r_b + q * C + oc, row, mask=mc)
        tl.store(f_b + q, F)
        if not REVERSE:
            tl.store(a_b + q * C + oc, st, mask=mc)
            if IS_MAX:
                tl.store(bc_b + q * C + oc, bc, mask=mc)

    @triton.jit
    def _blk_run(start, stop, L, st, F, in32, in64, cum_b, ps_b, pe_b, r_b, a_b, f_b, bk_b, bc_b, lim_b, fl_b,
                 sc_b, sk_b, M, u0, db_ptr, ed_ptr, md_ptr, kr_ptr, C, K, TOL, oc, mc, oi, ob, orr, orx, oj,
                 hp_b, hf_b, hh_b, hs_b, hk_b, spin, orm, hrs,
                 HAS_IN: tl.constexpr,
                 C_PAD: tl.constexpr, K_PAD: tl.constexpr, CB: tl.constexpr, RB: tl.constexpr,
                 BT: tl.constexpr, REVERSE: tl.constexpr, IS_MAX: tl.constexpr, HAS_PS: tl.constexpr,
                 HAS_PE: tl.constexpr, COMPARE: tl.constexpr, HAS_MASK: tl.constexpr, LINEAR: tl.constexpr,
                 HELP: tl.constexpr, INLINE: tl.constexpr, HR: tl.constexpr, BOUND: tl.constexpr):
        """Run from the state at ``start`` (value ``st`` in frame ``F``; the rows before it from
        ``in32`` / ``in64`` when ``HAS_IN``, else impossible) to ``stop``, storing the rows the
        chunk owns (``start`` and every position before ``stop``).

        COMPARE (fix-up): compare each recomputed row with the stored one and stop once the last
        K rows differ from them by one constant (``row_offset_bounds``, as the register kernels).
        Returns ``(st, F, converged, delta, steps, q_last)``: the state at ``stop`` (when the run
        got there) and ``q_last``, the last row written.

        HELP (> 0, the number of helper programs, ``_blk_help``): at the start of block m the run
        publishes its frame (``hh_b[m]``) and then m (``hp_b``, release): the rows up to the block's
        start are stored. The helpers sum the rows older than block m for block m + 1 while this
        program runs block m's phase B, and block m + 1's phase A only adds the BT rows of block m
        (``_help_parts``; HR > 1: the helpers split the rows into HR parts of ``hrs`` rows too, each
        part a (BT, C_PAD) sum of its own). A helper that has not delivered within ``spin`` polls (not resident, or
        the interpreter) makes the run compute the helpers' part itself from then on, tile by tile
        as they would, so the outputs are the same bits either way. INLINE (the interpreter, whose
        programs run one after another): the run always computes it itself.
        """
        wlo, whi, conv, delta = window_start(K_PAD)
        # the first row: the state's own
        q = start
        row, bc = _row_of(q, st, M, u0, ps_b, pe_b, fl_b, C, oc, mc, REVERSE, IS_MAX, HAS_PS, HAS_PE, HAS_MASK)
        if COMPARE:
            # the window's first row (no window yet to test)
            wlo, whi, ok, dd = _compare_row(q, row, st, F, r_b, a_b, f_b, wlo, whi, oj < 0, oj, oc, mc, C, TOL,
                                            K_PAD, IS_MAX)
        _store_row(q, row, st, bc, F, r_b, a_b, f_b, bc_b, oc, mc, C, REVERSE, IS_MAX)
        q_last = q
        q0 = start
        H = F
        if REVERSE:
            left = q0 - stop
        else:
            left = stop - q0
        steps = left * 0
        blk = left * 0  # the block's index in the run
        solo = tl.full([], 0, tl.int32)
        qp = q0
        HP = H
        while (left > 0) & (conv == 0):
            nb = tl.minimum(left, BT)
            # rows written by the previous block (other threads) and the scratch it read
            tl.debug_barrier()
            split = tl.full([], 0, tl.int32)
            if HELP > 0:
                if not INLINE:
                    # the rows up to q0 are stored: the helpers may sum them for block blk + 1
                    tl.store(hh_b + blk, H)
                    tl.debug_barrier()
                    tl.atomic_xchg(hp_b, blk.to(tl.int32), sem="release", scope="gpu")
                if blk >= 1:
                    split = split + 1
                    slot = (blk % 2) * (HR * BT * C_PAD)
                    if not INLINE:
                        if solo == 0:
                            # a helper that has delivered this block may have gone on to the next
                            # (the other slot); none can write this block's slot again before
                            # the run publishes the next block
                            for h in tl.static_range(HELP):
                                if _wait_for(hf_b + h, blk.to(tl.int32), spin) < blk:
                                    solo = solo * 0 + 1
                    if INLINE or solo != 0:
                        # the helpers' part computed here, the same sums in the same tiles (so the
                        # same bits), in a slot of its own that no late helper writes
                        slot = slot * 0 + 2 * (HR * BT * C_PAD)  # (blk's type: int64 offsets keep it)
                        for j in tl.static_range(HR):
                            r0_, r1_ = _part_rows(j, hrs, K, HR)
                            _phase_a(qp, nb, start, L, HP, r_b, f_b, in32, in64, cum_b, db_ptr, ed_ptr, md_ptr,
                                     kr_ptr, hs_b + slot + j * (BT * C_PAD), hk_b + slot + j * (BT * C_PAD), lim_b, C,
                                     K, oi, ob, orr, orx, 0, r0_, r1_, HAS_IN, C_PAD, CB, RB, BT, REVERSE, IS_MAX,
                                     HAS_MASK, LINEAR, CB, BT, "", BOUND)
                        tl.debug_barrier()
                    _help_parts(q0, qp, nb, start, L, H, HP, r_b, f_b, in32, in64, cum_b, db_ptr, ed_ptr, lim_b,
                                hs_b + slot, hk_b + slot, sc_b, sk_b, C, K, oi, ob, orm, HAS_IN, C_PAD, CB, BT,
                                REVERSE, IS_MAX, HAS_MASK, HR, BOUND)
            if split == 0:
                _phase_a(q0, nb, start, L, H, r_b, f_b, in32, in64, cum_b, db_ptr, ed_ptr, md_ptr, kr_ptr, sc_b, sk_b,
                         lim_b, C, K, oi, ob, orr, orx, 0, 0, K, HAS_IN, C_PAD, CB, RB, BT, REVERSE, IS_MAX, HAS_MASK,
                         LINEAR, CB, 0, "", BOUND)
            tl.debug_barrier()
            m2 = (oi[:, None] < BT) & mc[None, :]
            P = tl.load(sc_b + oi[:, None] * C_PAD + oc[None, :], mask=m2, other=2 * MASK)
            Pk = tl.zeros([BT, C_PAD], dtype=tl.int32)
            if IS_MAX:
                Pk = tl.load(sk_b + oi[:, None] * C_PAD + oc[None, :], mask=m2, other=0)
            s_ref = tl.load(cum_b + q0 * C + oc, mask=mc, other=0.0)
            # the new rows, each in its own position's frame (fn): a position's sum is formed in the
            # frame of the position before it (F), as the one-program-a-sequence kernels form it,
            # not in the block's H, which may lie thousands of nats from the values that matter
            # (a gene model's coding labels set some positions' frames far above the others')
            vn = tl.full([BT, C_PAD], MASK, tl.float32)
            fn = tl.zeros([BT], dtype=tl.float64) + H
            sn = tl.zeros([BT, C_PAD], dtype=tl.float32)  # each new row's S
            fmin = F + 0.0
            i = 1
            while (i <= nb) & (conv == 0):
                if REVERSE:
                    q = q0 - i
                else:
                    q = q0 + i
                # new rows: slot j holds position q0 + d·j (j = 1 .. i-1), duration i - j
                kk = i - oi
                vj = (oi >= 1) & (oi < i) & (kk <= K)
                dn = tl.load(db_ptr + (kk[:, None] - 1) * C + oc[None, :], mask=vj[:, None] & mc[None, :], other=MASK)
                mn = vj[:, None] & mc[None, :]
                if HAS_MASK:
                    lq = tl.load(lim_b + q * C + oc, mask=mc, other=0)
                    if REVERSE:
                        mn = mn & ((q0 - oi)[:, None] <= lq[None, :])
                    else:
                        mn = mn & ((q0 + oi)[:, None] >= lq[None, :])
                s_q = tl.load(cum_b + q * C + oc, mask=mc, other=0.0)
                # the segment sums S_q - S_j formed first (small), then the frames' offset
                if REVERSE:
                    seg = sn - s_q[None, :]
                    seg0 = s_ref - s_q
                else:
                    seg = s_q[None, :] - sn
                    seg0 = s_q - s_ref
                xn = tl.where(mn, (vn + dn.to(tl.float32)) + ((fn - F).to(tl.float32)[:, None] + seg), 2 * MASK)
                pi = tl.max(tl.where(oi[:, None] == i - 1, P, -3e38), 0)
                # the old rows' part from the block's frame H and S_{q0} to F and S_q
                pi = tl.where(pi > MASK, pi + ((H - F).to(tl.float32) + seg0), pi)
                nm = tl.max(xn, 0)
                if IS_MAX:
                    nk = tl.min(tl.where(xn == nm[None, :], kk[:, None], 2147483647), 0)
                    pki = tl.sum(tl.where(oi[:, None] == i - 1, Pk, 0), 0)
                    # the new rows have the smaller durations: they win ties
                    old = pi > nm
                    z = tl.where(old, pi, nm)
                    kbest = tl.where(old, pki, nk)
                else:
                    ns = tl.sum(tl.exp(xn - nm[None, :]), 0)
                    hi_ = tl.maximum(pi, nm)
                    tot = tl.exp(pi - hi_) + ns * tl.exp(nm - hi_)
                    z = hi_ + log_(tl.where(tot > 0, tot, 1.0))
                if REVERSE:
                    v = z
                    if HAS_PS:
                        v += tl.load(ps_b + q * C + oc, mask=mc, other=0.0).to(tl.float32)
                    if HAS_MASK:
                        v += tl.where((tl.load(fl_b + q).to(tl.int32) & 4) != 0, MASK, 0.0)
                    v = tl.where(mc & (v > -1e29), v, MASK)
                    x = M + v[None, :]
                    mx = tl.max(x, 1)
                    sv = mx + log_(tl.sum(tl.exp(x - mx[:, None]), 1))
                else:
                    sv = z
                    if HAS_PE:
                        sv += tl.load(pe_b + (q - 1) * C + oc, mask=mc, other=0.0).to(tl.float32)
                sv = tl.where(mc, sv, MASK)
                m = possible_shift(tl.max(sv, 0))
                st = tl.where(mc, tl.maximum(sv - m, MASK), MASK)
                F = F + m.to(tl.float64)
                if not IS_MAX:  # the log semiring's next block frame (the max semiring keeps the last)
                    fmin = tl.minimum(fmin, F)
                if IS_MAX:
                    tl.store(bk_b + q * C + oc, kbest, mask=mc)
                steps += 1
                if q != stop:
                    row, bc = _row_of(q, st, M, u0, ps_b, pe_b, fl_b, C, oc, mc, REVERSE, IS_MAX, HAS_PS, HAS_PE, HAS_MASK)
                    vn = tl.where(oi[:, None] == i, row[None, :], vn)
                    fn = tl.where(oi == i, F, fn)
                    sn = tl.where(oi[:, None] == i, s_q[None, :], sn)
                    if COMPARE:
                        q32 = tl.cast(q, tl.int32)
                        if REVERSE:
                            inwin = ((oj - q32) & (K_PAD - 1)) < K
                        else:
                            inwin = ((q32 - oj) & (K_PAD - 1)) < K
                        wlo, whi, ok, dd = _compare_row(q, row, st, F, r_b, a_b, f_b, wlo, whi, inwin, oj, oc, mc, C,
                                                        TOL, K_PAD, IS_MAX)
                        delta = tl.where(ok, dd, delta)
                        conv = tl.where(ok, 1, 0).to(tl.int32)
                    _store_row(q, row, st, bc, F, r_b, a_b, f_b, bc_b, oc, mc, C, REVERSE, IS_MAX)
                    q_last = q
                i += 1
            left -= nb
            if HELP > 0:
                # the previous block for the helpers' part (without helpers nothing is carried); new
                # values (+ 0): Triton carries through a loop only the names whose value the body
                # changes, and a plain copy of the block's start would look unchanged to it
                qp = q0 + 0
                HP = H + 0.0
                blk += 1
            if REVERSE:
                q0 = q0 - nb
            else:
                q0 = q0 + nb
            # the next block's frame: the least of this block's frames, not its last one, which a
            # label far above the others at that one position (a gene model's coding label where
            # a coding segment may end) can set far above the values the next block sums
            if IS_MAX:
                H = F
            else:
                H = fmin
        if HELP > 0:
            if not INLINE:
                tl.debug_barrier()
                tl.atomic_xchg(hp_b, HELP_DONE, sem="release", scope="gpu")
        return st, F, conv, delta, steps, q_last

    @triton.jit
    def _ends(a, b, REVERSE: tl.constexpr):
        """``(start, stop)`` of a run over the chunk [a, b]: from a forward, from b (beta)."""
        start = a
        stop = b
        if REVERSE:
            start = b
            stop = a
        return start, stop

    @triton.jit
    def _blk_help(h, start, stop, L, in32, in64, cum_b, r_b, f_b, lim_b, db_ptr, ed_ptr, md_ptr, kr_ptr,
                  hp_b, hf_b, hh_b, hs_b, hk_b, spin, C, K, oi, ob, orr, orx, hrs, HAS_IN: tl.constexpr,
                  C_PAD: tl.constexpr, CB: tl.constexpr, RB: tl.constexpr, BT: tl.constexpr, REVERSE: tl.constexpr,
                  IS_MAX: tl.constexpr, HAS_MASK: tl.constexpr, LINEAR: tl.constexpr, HG: tl.constexpr,
                  HR: tl.constexpr, BOUND: tl.constexpr):
        """Helper h (0 .. HG·HR - 1) of the run from ``start`` to ``stop`` (``_blk_run``): once the run
        has reached block n (its rows up to the block's start q0_n stored, its frame published), sum
        the rows at or before q0_n for the positions of block n + 1 (``_phase_a`` at IO = BT, in the
        frame of block n, relative to S_{q0_n}) over the label tiles g, g + HG, ... (g = h mod HG)
        and the rows of part h // HG of HR (``_part_rows``) into that part of the slot of block
        n + 1, and release n + 1; then block n + 2, in order. Stops when the run ends, has no block
        n + 1, or does not move within ``spin`` polls."""
        if REVERSE:
            run = start - stop
        else:
            run = stop - start
        n = run * 0
        go = tl.full([], 1, tl.int32)
        while go != 0:
            # block by block, never skipping one: the run takes a delivery of a later block as one
            # of its own (the slots alternate), and a run that has gone on alone reads none
            v = _wait_for(hp_b, n.to(tl.int32), spin).to(n.dtype)
            if (v < n) | (v >= HELP_DONE):
                go = go * 0
            else:
                if (n + 1) * BT >= run:
                    go = go * 0
                else:
                    if REVERSE:
                        q0 = start - n * BT
                    else:
                        q0 = start + n * BT
                    Hn = tl.load(hh_b + n, cache_modifier=".cg")
                    nb = tl.minimum(run - (n + 1) * BT, BT)
                    part = h // HG
                    slot = ((n + 1) % 2) * (HR * BT * C_PAD) + part * (BT * C_PAD)
                    r0_, r1_ = _part_rows(part, hrs, K, HR)
                    _phase_a(q0, nb, start, L, Hn, r_b, f_b, in32, in64, cum_b, db_ptr, ed_ptr, md_ptr, kr_ptr,
                             hs_b + slot, hk_b + slot, lim_b, C, K, oi, ob, orr, orx, (h % HG) * CB, r0_, r1_, HAS_IN,
                             C_PAD, CB, RB, BT, REVERSE, IS_MAX, HAS_MASK, LINEAR, HG * CB, BT, ".cg", BOUND)
                    # the slot's stores (every thread) before the release
                    tl.debug_barrier()
                    tl.atomic_xchg(hf_b + h, (n + 1).to(tl.int32), sem="release", scope="gpu")
                    n = n + 1

    @triton.jit
    def _blk_save_end(o32, o64, stop, st, F, start, r_b, f_b, in32, in64, C, K, oc, mc, orr, HAS_IN: tl.constexpr,
                      C_PAD: tl.constexpr, RB: tl.constexpr, REVERSE: tl.constexpr):
        """The state at ``stop`` for the next chunk: the K rows before it (row m at distance m + 1)
        with their frames, then the state value and its frame."""
        tl.debug_barrier()
        for r0 in range(0, K, RB):
            m = r0 + orr
            if REVERSE:
                r = stop + 1 + m
            else:
                r = stop - 1 - m
            ok = m < K
            v, fr = _ring_rows(r, ok, start, r_b, f_b, in32, in64, C, K, oc, mc, HAS_IN, REVERSE, False, "")
            tl.store(o32 + m[:, None] * C + oc[None, :], v, mask=ok[:, None] & mc[None, :])
            tl.store(o64 + m, fr, mask=ok)
        tl.store(o32 + K * C + oc, st, mask=mc)
        tl.store(o64 + K, F)

    @triton.jit
    def _blk_chunks_kernel(
        cum_ptr,  # (B, T+1, C) cumulative scores S
        tr_ptr,  # (C, C) transition [c_src, c_dst]
        db_ptr,  # (K, C) duration bias
        len_ptr,  # (B,) int64 lengths
        ps_ptr,  # (B, T, C) proj_start (read only if HAS_PS)
        pe_ptr,  # (B, T, C) proj_end (read only if HAS_PE)
        r_ptr,  # (B, T+1, C) float32 out: ring rows (U_hat forward, Y_hat beta)
        a_ptr,  # (B, T+1, C) float32 out: alpha_hat rows (forward)
        f_ptr,  # (B, T+1) float64 out: frame of row q
        bk_ptr,  # (B, T+1, C) int32 out: argmax duration of alpha_t (IS_MAX)
        bc_ptr,  # (B, T+1, C) int32 out: argmax source label of U_s (IS_MAX)
        e32, e64,  # (2, B, NCH, K*C + C_PAD) / (2, B, NCH, K + 1): end states (spec, non-converged fix-up)
        sc_ptr,  # (B, NCH, BT, C_PAD) float32 scratch: phase A's sums
        sk_ptr,  # (B, NCH, BT, C_PAD) int32 scratch: phase A's argmax durations (IS_MAX)
        st_ptr,  # (B, NCH) int32: 1 if the chunk's last fix-up converged
        src_ptr,  # (B, NCH) int32: 1 or 2, which end state ends the chunk's stored rows
        dl_ptr,  # (B, NCH) float64: delta_j
        cv_ptr,  # (B, NCH) int32: positions the chunk's last fix-up ran
        C, K, W, NCH, s_cum_b, s_p_b, s_w_b, s_f_b, TOL,
        C_PAD: tl.constexpr,
        K_PAD: tl.constexpr,
        CB: tl.constexpr,
        RB: tl.constexpr,
        BT: tl.constexpr,
        REVERSE: tl.constexpr,
        IS_MAX: tl.constexpr,
        HAS_PS: tl.constexpr,
        HAS_PE: tl.constexpr,
        PHASE: tl.constexpr,  # 1 spec, 2 fix-up, 3 repair
        IDX64: tl.constexpr = False,
        lim_ptr=None,  # (B, T+1, C) int32: min_start (forward) / max_end (beta) of limits.py (HAS_MASK)
        fl_ptr=None,  # (B, T+1) int8: the masks' flags (bit 4: no segment starts here) (HAS_MASK)
        HAS_MASK: tl.constexpr = False,
        ed_ptr=None,  # (K + BT + RB, C_PAD) float32: exp(D - lam_c k - MD_c), zero past K (LINEAR); in the
        # max semiring (K + 2·BT + 1, C) float32: the tiles' bounds (parallel.max_bound_table)
        md_ptr=None,  # (2, C_PAD) float32: MD_c = max_k D[k, c] - lam_c k, the trend lam_c (LINEAR)
        kr_ptr=None,  # (4, C_PAD) int32: kmin_c, kmax_c (finite range of D[:, c]), residue mod 3, counter
        LINEAR: tl.constexpr = 0,  # linear-space block sums: 0 off, else their PERIOD (1 or 3)
        RBX: tl.constexpr = 1,  # rows per tile of a LINEAR tile's term-by-term recomputation
        hp_ptr=None,  # (B, NCH) int32: the block each run has reached (HELPERS; -1 before it starts)
        hf_ptr=None,  # (B, NCH, HELPERS) int32: the block each helper has delivered (-1: none)
        hh_ptr=None,  # (B, NCH, NBLK) float64: the run's frame at the start of each block
        hs_ptr=None,  # (B, NCH, 3, HR, BT, C_PAD) float32: the helpers' sums for two blocks, the run's own
        hk_ptr=None,  # (B, NCH, 3, HR, BT, C_PAD) int32: their argmax durations (IS_MAX)
        NBLK=1,  # blocks a run may take
        SPIN=0,  # polls a run waits for its helpers before it goes on alone (0: never waits)
        HSPIN=0,  # polls a helper waits for its run
        HELPERS: tl.constexpr = 0,  # helper programs per run (grid axis 2: 0 the run, 1 .. the helpers)
        HG: tl.constexpr = 1,  # the helpers' label groups (helper h takes the tiles h mod HG, HG + h mod HG, ...)
        HR: tl.constexpr = 1,  # and row parts (helper h the rows of part h // HG); HELPERS = HG · HR
        HRS=0,  # rows a part (HR > 1), a multiple of the tiles' rows
        INLINE: tl.constexpr = False,  # the run computes its helpers' part itself (tests)
        MB: tl.constexpr = 16,  # rows per tile of the previous block's part (``_help_parts``)
        MAX_BOUND: tl.constexpr = False,  # max semiring: skip the tiles ed_ptr's bounds rule out (_tile_exact)
    ):
        """Forward chunk j owns rows [a, b) (and row L if b = L) and starts from the state at a;
        beta chunk j owns rows (a, b] and starts from the state at b (``forward.py`` / ``beta.py``
        describe the phases)."""
        b_id = tl.program_id(0).to(tl.int64)
        L = tl.load(len_ptr + b_id)
        if not IDX64:
            L = L.to(tl.int32)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        oi = tl.arange(0, BT)
        ob = tl.arange(0, CB)
        orr = tl.arange(0, RB)
        orx = orr
        if LINEAR:
            orx = tl.arange(0, RBX)
        oj = tl.arange(0, K_PAD)
        E32 = K * C + C_PAD
        E64 = K + 1
        cum_b = cum_ptr + b_id * s_cum_b
        ps_b = ps_ptr + b_id * s_p_b
        pe_b = pe_ptr + b_id * s_p_b
        r_b = r_ptr + b_id * s_w_b
        a_b = a_ptr + b_id * s_w_b
        f_b = f_ptr + b_id * s_f_b
        bk_b = bk_ptr + b_id * s_w_b
        bc_b = bc_ptr + b_id * s_w_b
        lim_b = lim_ptr
        fl_b = fl_ptr
        if HAS_MASK:
            lim_b = lim_ptr + b_id * s_w_b
            fl_b = fl_ptr + b_id * s_f_b
        row = b_id * NCH
        half = tl.num_programs(0).to(tl.int64) * NCH
        m2c = mc[:, None] & mc[None, :]
        if REVERSE:
            # M[c_src, c_dst] = Tr[c_src, c_dst]: beta_{c'} = LSE_c Tr[c', c] + v(c)
            M = tl.load(tr_ptr + oc[:, None] * C + oc[None, :], mask=m2c, other=MASK).to(tl.float32)
        else:
            # M[c_dst, c_src] = Tr[c_src, c_dst]: U_c = LSE_{c'} alpha(c') + Tr[c', c]
            M = tl.load(tr_ptr + oc[None, :] * C + oc[:, None], mask=m2c, other=MASK).to(tl.float32)
        u0 = tl.max(M, 1)
        u0 = u0 + log_(tl.sum(tl.exp(M - u0[:, None]), 1))
        n_b = (L + W - 1) // W
        orm = tl.arange(0, MB)
        hp_b = hp_ptr
        hf_b = hf_ptr
        hh_b = hh_ptr
        hs_b = hs_ptr
        hk_b = hk_ptr
        role = tl.program_id(2)
        main = True  # the run (axis 2 index 0), not one of its helpers
        if HELPERS > 0:
            slot = row + tl.program_id(1)
            hp_b = hp_ptr + slot
            hf_b = hf_ptr + slot * HELPERS
            hh_b = hh_ptr + slot * NBLK
            hs_b = hs_ptr + slot * (3 * HR * BT * C_PAD)
            hk_b = hk_ptr + slot * (3 * HR * BT * C_PAD)
        if HELPERS > 0 and not INLINE:
            main = role == 0
            if role > 0:
                # a helper of chunk j's run (spec or fix-up)
                a = tl.cast(tl.program_id(1), L.dtype) * W
                b = tl.minimum(a + W, L)
                start, stop = _ends(a, b, REVERSE)
                if PHASE == 1:
                    if a < L:
                        _blk_help(role - 1, start, stop, L, e32, e64, cum_b, r_b, f_b, lim_b, db_ptr, ed_ptr, md_ptr,
                                  kr_ptr, hp_b, hf_b, hh_b, hs_b, hk_b, HSPIN, C, K, oi, ob, orr, orx, HRS, False,
                                  C_PAD, CB, RB, BT, REVERSE, IS_MAX, HAS_MASK, LINEAR, HG, HR, MAX_BOUND)
                elif PHASE == 2:
                    j0, count = sweep_start(n_b, PHASE, REVERSE)
                    j, a, b, live, redo, e = sweep_chunk(j0, 0, W, L, n_b, 1, src_ptr, row, half, PHASE, REVERSE, "")
                    if redo:
                        _blk_help(role - 1, start, stop, L, e32 + e * E32, e64 + e * E64, cum_b, r_b, f_b, lim_b,
                                  db_ptr, ed_ptr, md_ptr, kr_ptr, hp_b, hf_b, hh_b, hs_b, hk_b, HSPIN, C, K, oi, ob,
                                  orr, orx, HRS, True, C_PAD, CB, RB, BT, REVERSE, IS_MAX, HAS_MASK, LINEAR, HG, HR,
                                  MAX_BOUND)
                else:
                    # a helper of the in-order repair: the run's chunks in the run's order, each in its
                    # own slot; the run publishes a chunk it reruns as any run does (block 0 first)
                    # and HELP_DONE on one it passes, so the helper learns which before it reads the
                    # state the chunk starts from (the predecessor's, stored by the run)
                    j0, count = sweep_start(n_b, PHASE, REVERSE)
                    for jj in range(0, count):
                        j, a, b, live, redo, e = sweep_chunk(j0, jj, W, L, n_b, 1, src_ptr, row, half, PHASE,
                                                             REVERSE, "")
                        if live:
                            sl = row + j
                            v0 = _wait_for(hp_ptr + sl, 0, HSPIN)
                            if (v0 >= 0) & (v0 < HELP_DONE):
                                # the run reruns it: its incoming slot, as the run read it
                                j, a, b, live, redo, e = sweep_chunk(j0, jj, W, L, n_b, 0, src_ptr, row, half,
                                                                     PHASE, REVERSE, ".cg")
                                start, stop = _ends(a, b, REVERSE)
                                _blk_help(role - 1, start, stop, L, e32 + e * E32, e64 + e * E64, cum_b, r_b, f_b,
                                          lim_b, db_ptr, ed_ptr, md_ptr, kr_ptr, hp_ptr + sl, hf_ptr + sl * HELPERS,
                                          hh_ptr + sl * NBLK, hs_ptr + sl * (3 * HR * BT * C_PAD),
                                          hk_ptr + sl * (3 * HR * BT * C_PAD), HSPIN, C, K, oi, ob, orr, orx, HRS,
                                          True, C_PAD, CB, RB, BT, REVERSE, IS_MAX, HAS_MASK, LINEAR, HG, HR,
                                          MAX_BOUND)
        if main:
            if PHASE == 1:
                j = tl.program_id(1)
                sc_b = sc_ptr + (row + j) * (BT * C_PAD)
                sk_b = sk_ptr + (row + j) * (BT * C_PAD)
                a = tl.cast(j, L.dtype) * W
                b = tl.minimum(a + W, L)
                live = a < L
                if live:
                    start, stop = _ends(a, b, REVERSE)
                    # "the sequence starts (ends) here": state 0, no segment crosses the boundary
                    st = tl.where(mc, 0.0, MASK)
                    F = tl.sum(tl.zeros([1], tl.float64), 0)
                    st, F, conv, delta, steps, q_last = _blk_run(
                        start, stop, L, st, F, e32, e64, cum_b, ps_b, pe_b, r_b, a_b, f_b, bk_b, bc_b, lim_b, fl_b,
                        sc_b, sk_b, M, u0, db_ptr, ed_ptr, md_ptr, kr_ptr, C, K, TOL, oc, mc, oi, ob, orr, orx, oj,
                        hp_b, hf_b, hh_b, hs_b, hk_b, SPIN, orm, HRS, False,
                        C_PAD, K_PAD, CB, RB, BT, REVERSE, IS_MAX, HAS_PS, HAS_PE, False, HAS_MASK, LINEAR, HELPERS, INLINE,
                        HR, MAX_BOUND)
                    e = row + j
                    _blk_save_end(e32 + e * E32, e64 + e * E64, stop, st, F, start, r_b, f_b, e32, e64,
                                  C, K, oc, mc, orr, False, C_PAD, RB, REVERSE)
                    if not REVERSE:
                        if b == L:
                            tl.store(a_b + L * C + oc, st, mask=mc)
                            tl.store(f_b + L, F)
            else:
                # forward: chunks 1 .. n-1 from their predecessor; beta: n-2 .. 0 from their successor
                j0, count = sweep_start(n_b, PHASE, REVERSE)
                clean_prev = tl.full([], 1, tl.int32)
                for jj in range(0, count):
                    j, a, b, live, redo, e = sweep_chunk(j0, jj, W, L, n_b, clean_prev, src_ptr, row, half,
                                                         PHASE, REVERSE, "")
                    sc_b = sc_ptr + (row + j) * (BT * C_PAD)
                    sk_b = sk_ptr + (row + j) * (BT * C_PAD)
                    start, stop = _ends(a, b, REVERSE)
                    hp_j = hp_b
                    hf_j = hf_b
                    hh_j = hh_b
                    hs_j = hs_b
                    hk_j = hk_b
                    if HELPERS > 0:
                        if PHASE == 3:
                            # the repair's helpers (grid (B, 1, 1 + HELPERS)): chunk j's own slot
                            sl = row + j
                            hp_j = hp_ptr + sl
                            hf_j = hf_ptr + sl * HELPERS
                            hh_j = hh_ptr + sl * NBLK
                            hs_j = hs_ptr + sl * (3 * HR * BT * C_PAD)
                            hk_j = hk_ptr + sl * (3 * HR * BT * C_PAD)
                    if redo:
                        in32 = e32 + e * E32
                        in64 = e64 + e * E64
                        st = tl.load(in32 + K * C + oc, mask=mc, other=MASK)
                        F = tl.load(in64 + K)
                        st, F, conv, delta, steps, q_last = _blk_run(
                            start, stop, L, st, F, in32, in64, cum_b, ps_b, pe_b, r_b, a_b, f_b, bk_b, bc_b, lim_b, fl_b,
                            sc_b, sk_b, M, u0, db_ptr, ed_ptr, md_ptr, kr_ptr, C, K, TOL, oc, mc, oi, ob, orr, orx, oj,
                            hp_j, hf_j, hh_j, hs_j, hk_j, SPIN, orm, HRS, True,
                            C_PAD, K_PAD, CB, RB, BT, REVERSE, IS_MAX, HAS_PS, HAS_PE, True, HAS_MASK, LINEAR, HELPERS,
                            INLINE, HR, MAX_BOUND)
                        if conv != 0:
                            if REVERSE:
                                _fix_prefix_frames(f_b, q_last, start + 1, delta, 256)
                            else:
                                _fix_prefix_frames(f_b, start, q_last + 1, delta, 256)
                            clean = chunk_clean(src_ptr, row, j)
                        else:
                            e = half + row + j
                            _blk_save_end(e32 + e * E32, e64 + e * E64, stop, st, F, start, r_b, f_b, in32, in64,
                                          C, K, oc, mc, orr, True, C_PAD, RB, REVERSE)
                            clean = rerun_owns_end(src_ptr, row, j, conv)
                            if not REVERSE:
                                if b == L:
                                    tl.store(a_b + L * C + oc, st, mask=mc)
                                    tl.store(f_b + L, F)
                        record_rerun(st_ptr, dl_ptr, cv_ptr, row, j, conv, delta, steps)
                        clean_prev = clean
                    else:
                        if PHASE == 3:
                            if live:
                                clean_prev = chunk_clean(src_ptr, row, j)
                                if HELPERS > 0:
                                    if not INLINE:
                                        # the repair's helpers pass this chunk too
                                        tl.atomic_xchg(hp_j, HELP_DONE, sem="release", scope="gpu")
                    # the next chunk reads what this one stored (end state, flags) from other threads
                    tl.debug_barrier()
