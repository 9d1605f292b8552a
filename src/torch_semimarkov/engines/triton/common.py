"""Pieces every Triton kernel of the engine shares: Triton's optional import, constants and small
``@triton.jit`` helpers (log-sum-exp, normaliser shift, online reductions, padded row loads).

Notation used by every kernel and in ``docs/internals.md``: ``alpha_hat`` / ``beta_hat`` are the
forward / backward messages relative to a float64 frame (``F`` forward, ``G`` backward);
``U_s = u_s + ps_s`` is the forward ring quantity (the factored recurrence) and
``Y_t = pe_{t-1} + beta_t`` the backward one; "DUR" marks the direct recurrence of a (K, C, C)
transition, whose ring holds ``alpha`` itself.
"""

from __future__ import annotations

import os

try:  # Triton is optional: the package imports without it.
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None
    libdevice = None
    HAS_TRITON = False

#: Structural mask and the value of an impossible state inside the kernels (= IMPOSSIBLE).
MASK = -1e30

#: Move the reference of the segment sums in a register ring every this many steps.
REBASE = 4


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


if HAS_TRITON:
    #: MASK as a compile-time constant: what the kernels see (a plain global is not allowed there)
    MASK_K = tl.constexpr(MASK)

    #: libdevice's log (1 ulp) on the GPU: lg2.approx has a small absolute bias that a
    #: recurrence over 10^6 steps would sum; the interpreter has no libdevice
    _PRECISE_LOG = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"))

    @triton.jit
    def log_(x):
        """Natural log: libdevice's on the GPU, tl.log in the interpreter."""
        y = tl.log(x)
        if _PRECISE_LOG:
            y = libdevice.log(x)
        return y

    @triton.jit
    def seq_length(len_ptr, b, IDX64: tl.constexpr):
        """Sequence ``b``'s length from ``lengths``: int64 where offsets are 64-bit (``IDX64``),
        else int32."""
        L = tl.load(len_ptr + b)
        if not IDX64:
            L = L.to(tl.int32)
        return L

    @triton.jit
    def load_transition(tr_ptr, oc, mc, C):
        """The (C_PAD source, C_PAD destination) tile of a (C, C) transition in float32, MASK in
        the padding."""
        return tl.load(tr_ptr + oc[:, None] * C + oc[None, :], mask=mc[:, None] & mc[None, :],
                       other=MASK_K).to(tl.float32)

    @triton.jit
    def possible_shift(m):
        """A normaliser shift: ``m``, or 0 where every state is impossible (m below -1e29), so
        that frames only move by real values and an infeasible prefix costs no precision."""
        return tl.where(m > -1e29, m, 0.0)

    @triton.jit
    def lse_rows(x):
        """Log-sum-exp of a (rows, cols) tile over its rows (axis 0): one value per column."""
        mx = tl.max(x, 0)
        return mx + log_(tl.sum(tl.exp(x - mx[None, :]), 0))

    @triton.jit
    def ent_terms(run_m, run_s, run_r, z, hv, hy, first, h0):
        """Add a (source c', label c) tile of log weights ``z`` to the entropy engine's running
        sums per label (axis 1): ``run_s = sum exp(z - run_m)`` and ``run_r = sum exp(z - run_m)
        (h + h' - z)``, h = ``hv[c']`` (prefix entropies at the start node), h' = ``hy[c]`` (suffix
        entropies at the end node, or 0). ``first``: a first segment, whose phantom predecessors
        are one term (LSE over c') of an empty prefix, h = ``h0`` (0 in the frame of ``hv``).
        Every factor is finite and a term that is not real weighs exactly 0 (no select per
        entry: ``entropy._mix_step``). Returns ``(run_m, run_s, run_r)``; :func:`ent_row` ends it."""
        if first:
            z0 = lse_rows(z)
            nm = tl.maximum(run_m, z0)
            sc = tl.exp(run_m - nm)
            e0 = tl.exp(z0 - nm)
            run_s = run_s * sc + e0
            run_r = run_r * sc + e0 * (h0 + hy - z0)
        else:
            nm = tl.maximum(run_m, tl.max(z, 0))
            sc = tl.exp(run_m - nm)
            e = tl.exp(z - nm[None, :])
            run_s = run_s * sc + tl.sum(e, 0)
            run_r = run_r * sc + tl.sum(e * (hv[:, None] + hy[None, :] - z), 0)
        return nm, run_s, run_r

    @triton.jit
    def ent_row(run_m, run_s, run_r, mc, F):
        """The entropies of the running sums of :func:`ent_terms` (``sum rho (h - log rho) =
        run_r / run_s + LSE``), IMPOSSIBLE where no term is real, less their largest value, which
        moves into the frame ``F``: ``(row, F)``."""
        ok = mc & (run_m > -1e29)
        z = tl.where(ok, run_s, 1.0)
        h = tl.where(ok, run_r / z + run_m + log_(z), MASK_K)
        m = possible_shift(tl.max(h, 0))
        return tl.where(ok, h - m, MASK_K), F + m.to(tl.float64)

    @triton.jit
    def lse_cols(x):
        """Log-sum-exp of a (rows, cols) tile over its columns (axis 1): one value per row."""
        mx = tl.max(x, 1)
        return mx + log_(tl.sum(tl.exp(x - mx[:, None]), 1))

    @triton.jit
    def online_lse(run_m, run_s, x):
        """Fold a (rows, cols) tile into a running log-sum-exp over rows: ``(max, sum)`` per column."""
        nm = tl.maximum(run_m, tl.max(x, 0))
        run_s = run_s * tl.exp(run_m - nm) + tl.sum(tl.exp(x - nm[None, :]), 0)
        return nm, run_s

    @triton.jit
    def online_lse_value(run_m, run_s, valid):
        """The value of a running log-sum-exp (MASK-like where nothing real was folded in)."""
        return run_m + log_(tl.where(valid & (run_s > 0), run_s, 1.0))

    @triton.jit
    def load_row(ptr, oc, mc, other):
        """One (C_PAD,) float32 row of a (T, C) array, padded with ``other``."""
        return tl.load(ptr + oc, mask=mc, other=other).to(tl.float32)

    @triton.jit
    def row_offset_bounds(new, ref, fd, mc, TOL):
        """How one recomputed row agrees with its stored version up to a constant offset.

        ``new`` and ``ref`` are (C_PAD,) float32 rows relative to frames whose difference is
        ``fd`` (float64). Returns the interval [lo, hi] of offsets delta with
        ``|new - ref + fd - delta| <= TOL * (1 + |ref|)`` for every real label (a few float32 ulps
        of each value): lo > hi when no offset fits, in particular when a label is impossible in
        one row and possible in the other; (-big, big) when every label is impossible in both.
        """
        big = 1e300
        imp_new = new < -1e29
        imp_ref = ref < -1e29
        mismatch = tl.sum((mc & (imp_new != imp_ref)).to(tl.int32), 0) > 0
        both = mc & (~imp_new) & (~imp_ref)
        d = new - ref
        e = TOL * (1.0 + tl.abs(ref))
        lo = tl.max(tl.where(both, d - e, -3e38), 0).to(tl.float64) + fd
        hi = tl.min(tl.where(both, d + e, 3e38), 0).to(tl.float64) + fd
        anyb = tl.sum(both.to(tl.int32), 0) > 0
        lo = tl.where(mismatch, big, tl.where(anyb, lo, -big))
        hi = tl.where(mismatch, -big, tl.where(anyb, hi, big))
        return lo, hi

    @triton.jit
    def window_start(K_PAD: tl.constexpr):
        """A fix-up's window before its first row: ``(wlo, whi, converged, delta)``, every slot's
        interval empty (a row not yet recomputed fits no offset), not converged, delta 0."""
        wlo = tl.full([K_PAD], 1e300, tl.float64)
        whi = tl.full([K_PAD], -1e300, tl.float64)
        conv = tl.full([], 0, tl.int32)
        delta = tl.sum(tl.zeros([1], tl.float64), 0)
        return wlo, whi, conv, delta

    @triton.jit
    def window_offset(wlo, whi, idx, slot, lo, hi, inwin):
        """Put one row's offset interval into the window ring (``idx == slot``) and intersect
        the rows in the window: returns the ring and ``(converged, delta)``, delta the middle of
        the intersection (0 if every row of the window is impossible in both runs)."""
        big = 1e300
        wlo = tl.where(idx == slot, lo, wlo)
        whi = tl.where(idx == slot, hi, whi)
        glo = tl.max(tl.where(inwin, wlo, -big), 0)
        ghi = tl.min(tl.where(inwin, whi, big), 0)
        ok = glo <= ghi
        delta = tl.where((glo > -big) & (ghi < big), 0.5 * (glo + ghi), 0.0)
        return wlo, whi, ok, delta

    @triton.jit
    def window_row(wlo, whi, oj, q32, lo, hi, delta, K, K_PAD: tl.constexpr, REVERSE: tl.constexpr):
        """A fix-up's recomputed row q (``q32``), whose offset interval against the stored row is
        [lo, hi], into the window ring of the last K rows in the run's direction
        (:func:`window_offset`): ``(wlo, whi, delta, converged)``, delta kept until they agree."""
        if REVERSE:
            inwin = ((oj - q32) & (K_PAD - 1)) < K
        else:
            inwin = ((q32 - oj) & (K_PAD - 1)) < K
        wlo, whi, ok, d = window_offset(wlo, whi, oj, q32 & (K_PAD - 1), lo, hi, inwin)
        delta = tl.where(ok, d, delta)
        conv = tl.where(ok, 1, 0).to(tl.int32)
        return wlo, whi, delta, conv

    @triton.jit
    def sweep_start(n_chunks, PHASE: tl.constexpr, REVERSE: tl.constexpr):
        """The chunks a time-parallel program visits after the speculative pass (the chunk
        driver shared by every chunked kernel): ``(j0, count)``. PHASE 2 (fix-up): its own chunk,
        ``program_id(1)``; PHASE 3 (repair): every chunk after the first in the run's direction,
        in order (forward 1 .. n - 1; ``REVERSE``, beta: n - 2 .. 0)."""
        if REVERSE:
            j0 = n_chunks - 2
        else:
            j0 = 1
        count = n_chunks - 1
        if PHASE == 2:
            j0 = tl.program_id(1)
            count = 1
        return j0, count

    @triton.jit
    def sweep_chunk(j0, jj, W, L, n_chunks, clean_prev, src_ptr, row, half,
                    PHASE: tl.constexpr, REVERSE: tl.constexpr, CM: tl.constexpr):
        """Step ``jj`` of the sweep from ``sweep_start``: ``(j, a, b, live, redo, e)``: chunk j
        covers positions [a, b); ``live``: it has a predecessor in the run's direction (forward
        j - 1, beta j + 1) and positions; ``redo``: it runs (a fix-up always; a repair only after a
        chunk whose stored rows are not ``clean_prev``); ``e``: the end-state slot it starts from,
        the predecessor's speculative end (PHASE 2) or the end of the predecessor's stored rows
        (PHASE 3: ``src_ptr`` says which of the two buffers, ``half`` entries apart; CM the cache
        modifier of that read, ".cg" in a program other than the run that wrote it)."""
        if REVERSE:
            j = j0 - jj
            nbr = j + 1
        else:
            j = j0 + jj
            nbr = j - 1
        a = tl.cast(j, L.dtype) * W
        b = tl.minimum(a + W, L)
        if REVERSE:
            live = (j >= 0) & (j < n_chunks - 1)
        else:
            live = (j >= 1) & (a < L)
        redo = live
        sp = 1
        if PHASE == 3:
            redo = live & (clean_prev == 0)
            sp = tl.load(src_ptr + row + nbr, mask=redo, other=1, cache_modifier=CM)
        e = (sp - 1) * half + row + nbr
        return j, a, b, live, redo, e

    @triton.jit
    def chunk_clean(src_ptr, row, j):
        """1 if chunk j's stored rows end in its speculative end state (``src_ptr`` 1), else 0: a
        repair may pass the chunk after a clean one."""
        return (tl.load(src_ptr + row + j) == 1).to(tl.int32)

    @triton.jit
    def rerun_owns_end(src_ptr, row, j, conv):
        """A rerun of chunk j that did not converge: its own end state (saved in the second buffer)
        now ends the chunk's stored rows (``src_ptr`` 2), so the chunk is not clean: returns 0."""
        tl.store(src_ptr + row + j, 2)
        return conv.to(tl.int32) * 0

    @triton.jit
    def record_rerun(st_ptr, dl_ptr, cv_ptr, row, j, conv, delta, steps):
        """A rerun's outcome for the host: converged (1 / 0), the offset delta of the chunk's system
        over its predecessor's, and the positions it ran."""
        tl.store(st_ptr + row + j, conv.to(tl.int32))
        tl.store(dl_ptr + row + j, delta)
        tl.store(cv_ptr + row + j, steps.to(tl.int32))

    @triton.jit
    def passed_clean(clean_prev, live, src_ptr, row, j, PHASE: tl.constexpr):
        """``clean_prev`` after a chunk the sweep did not rerun: in the repair, a live chunk's own
        :func:`chunk_clean`."""
        if PHASE == 3:
            if live:
                clean_prev = chunk_clean(src_ptr, row, j)
        return clean_prev
