"""Partial labels and constraints as the engine reads them: per-(position, label) segment limits
and one byte of flags per position, built by one kernel.

A segment ``[s, e)`` of label c (``e - s <= K``) is allowed iff ``min_start[e, c] <= s``, equivalently
``e <= max_end[s, c]``, and ``s`` is not a forbidden start. Both limits are monotone in their index,
so the register-ring recurrences need not test every (duration, label) entry at every step: an entry
that a limit excludes stays excluded, so it is dropped from the ring once, at the step where the
limit moves (flag bits 1 and 2); every other step loads the flag byte and the row of limits
(for the one-segment entry it pushes), with the step's scores.

``flags[b, p]``:

* ``FWD_MOVED`` (1): ``min_start[p + 1] != min_start[p]`` for some label (the forward's step
  ``t = p + 1`` drops the ring entries that start before ``min_start[p + 1]``);
* ``BWD_MOVED`` (2): ``max_end[p] != max_end[p + 1]`` for some label (the beta step at ``s = p``
  drops the ring entries that end after ``max_end[p]``);
* ``NO_START`` (4): no segment starts at p (``boundary_mask == -1``).

Each program scans its block of positions plus K + 2 positions before (``min_start``) or after
(``max_end``) it, so the limits are exact wherever they bind a segment of at most K positions, and
never tighter than the exact ones (a farther forbidden position is only ever missed). The flags are
set at every position where the exact limits move.
"""

from __future__ import annotations

import torch

from torch_semimarkov.engines.triton import plan as plan_mod
from torch_semimarkov.engines.triton.common import HAS_TRITON, tl, triton

FWD_MOVED, BWD_MOVED, NO_START = 1, 2, 4

if HAS_TRITON:

    @triton.jit
    def _limits_kernel(
        lm_ptr,  # (B, T, C) uint8: 1 where the label is allowed (read if HAS_LM)
        bm_ptr,  # (B, T) int8: -1 no start, 0 free, 1 a segment starts here (read if HAS_BM)
        ms_ptr,  # (B, T+1, C) int32 out: smallest allowed start of a segment ending at e
        me_ptr,  # (B, T+1, C) int32 out: largest allowed end of a segment starting at s
        fl_ptr,  # (B, T+1) int8 out: FWD_MOVED | BWD_MOVED | NO_START
        T, C, K,
        BLK: tl.constexpr,
        C_PAD: tl.constexpr,
        HAS_LM: tl.constexpr,
        HAS_BM: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        p0 = tl.program_id(1) * BLK
        p1 = tl.minimum(p0 + BLK, T + 1)  # rows p0 .. p1-1 of the (T+1)-row outputs
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        ms_b = ms_ptr + b * (T + 1) * C
        me_b = me_ptr + b * (T + 1) * C
        fl_b = fl_ptr + b * (T + 1)
        lm_b = lm_ptr + b * T * C
        bm_b = bm_ptr + b * T
        zero = tl.zeros([C_PAD], dtype=tl.int32)
        if p0 == 0:
            tl.store(ms_b + oc, zero, mask=mc)
        if p1 == T + 1:
            tl.store(me_b + T * C + oc, zero + T, mask=mc)
            tl.store(fl_b + T, tl.full([], 0, tl.int8))
        # min_start[e] (e = p + 1) = max(1 + the last position < e that forbids the label,
        # the last forced start <= e - 1), scanned from K + 2 positions before the block
        last_bad = zero
        last_forced = zero
        prev = zero
        for p in range(tl.maximum(p0 - K - 2, 0), tl.minimum(p1, T)):
            if HAS_LM:
                ok = tl.load(lm_b + p * C + oc, mask=mc, other=1)
                last_bad = tl.where(ok != 0, last_bad, p + 1)
            if HAS_BM:
                if tl.load(bm_b + p) == 1:
                    last_forced = zero + p
            ms = tl.maximum(last_bad, last_forced)
            moved = tl.max(tl.where(mc & (ms != prev), 1, 0), 0)
            prev = ms
            if p + 1 < p1:
                if p + 1 >= p0:
                    tl.store(ms_b + (p + 1) * C + oc, ms, mask=mc)
            if p >= p0:
                tl.store(fl_b + p, moved.to(tl.int8))  # FWD_MOVED
        tl.debug_barrier()
        # max_end[s] = min(the first position >= s that forbids the label, the first forced start
        # > s), scanned from K + 2 positions after the block
        first_bad = zero + T
        first_forced = zero + T
        nxt = zero + T
        hi = tl.minimum(p1 + K + 2, T)
        for i in range(hi - p0):
            p = hi - 1 - i
            okb = tl.full([C_PAD], 1, tl.int32)
            if HAS_LM:
                okb = tl.load(lm_b + p * C + oc, mask=mc, other=1).to(tl.int32)
            me = tl.minimum(tl.where(okb != 0, first_bad, p), first_forced)
            moved = tl.max(tl.where(mc & (me != nxt), 1, 0), 0)
            nxt = me
            first_bad = tl.where(okb != 0, first_bad, p)
            no_start = 0
            if HAS_BM:
                v = tl.load(bm_b + p)
                if v == 1:
                    first_forced = zero + p
                no_start = (v == -1).to(tl.int32)
            if p < p1:
                tl.store(me_b + p * C + oc, me, mask=mc)
                f = tl.load(fl_b + p).to(tl.int32) | (moved * 2) | (no_start * 4)  # BWD_MOVED, NO_START
                tl.store(fl_b + p, f.to(tl.int8))


def engine_limits(label_mask, boundary_mask, B: int, T: int, C: int, K: int, device):
    """``(min_start, max_end, flags)`` of validated masks for the engine's kernels (see the module
    docstring): (B, T+1, C) int32, (B, T+1, C) int32 and (B, T+1) int8, by one kernel launch."""
    ms = torch.empty((B, T + 1, C), dtype=torch.int32, device=device)
    me = torch.empty((B, T + 1, C), dtype=torch.int32, device=device)
    fl = torch.empty((B, T + 1), dtype=torch.int8, device=device)
    lm = label_mask.view(torch.uint8) if label_mask is not None else ms
    bm = boundary_mask if boundary_mask is not None else ms
    blk = plan_mod.LIMITS_BLOCK
    grid = (B, -(-(T + 1) // blk))
    _limits_kernel[grid](lm_ptr=lm.contiguous(), bm_ptr=bm.contiguous(), ms_ptr=ms, me_ptr=me, fl_ptr=fl, T=T, C=C,
                         K=int(K), BLK=blk, C_PAD=plan_mod.label_pad(C), HAS_LM=label_mask is not None,
                         HAS_BM=boundary_mask is not None, num_warps=plan_mod.WALK_WARPS)
    return ms, me, fl
