"""Viterbi traceback kernels: follow the max-semiring forward's backpointers from (L, c_L) to 0.

Node (t, c) means "a segment with label c ends at t"; its backpointer gives the segment's duration
k and the label of the node (t - k, c') before it (packed as ``k << 16 | c'`` by the
register-ring forward, two arrays otherwise). Every output element is written by the kernels.

Sequential, ``_traceback_kernel``: one program per sequence walks the segments.

Time-parallel, ``_traceback_chunks_kernel``: paths from different nodes merge (every node has one
predecessor), so speculative chunks become exact:

1. *spec* (grid (B, n_chunks)): chunk j, positions [a_j, b_j), traces from a guessed node
   (b_j, argmax_c alpha_hat_{b_j}); the last chunk from the true one. It writes labels and segment
   starts of its positions, marks its nodes (``mark[t] = c``) and records its exit: the first
   node at or below a_j and the label of the segment that crosses a_j.
2. *fix-up* (grid (B, n_chunks)): chunk j traces again from the exit of chunk j+1, the true entry
   if chunk j+1's path was right, writing the crossing segment and every segment until it reaches a
   node of the stored path (``mark[t] == c``): from there the stored path is the true one. A walk
   that leaves the chunk without merging records its own exit.
3. *repair* (grid (B,)): from the last chunk to the first, a chunk whose successor's stored path
   does not end in the exit it was fixed up from is fixed up again from the right one.

Marks always describe the path stored in the chunk (a walk sets its nodes and clears the
positions inside its segments), so "merged" means exactly "the rest of the stored path is the
true path". Requires W >= K (a segment crosses at most one chunk boundary).
"""

from __future__ import annotations

from .common import HAS_TRITON, tl, triton  # noqa: F401

if HAS_TRITON:

    @triton.jit
    def _traceback_kernel(
        bpk_ptr,  # (B, T+1, C) int32
        bpc_ptr,  # (B, T+1, C) int32
        last_ptr,  # (B,) int32
        len_ptr,  # (B,)
        lab_ptr,  # (B, T) int64 out: labels, -1 past the length
        st_ptr,  # (B, T) int8 (a bool tensor's bytes) out: 1 where a segment starts
        C,
        T,
        s_bp_b,
        BP_C_AT_END: tl.constexpr,
        PACKED: tl.constexpr,
        K_BLOCK: tl.constexpr,
        FILL_BLOCK: tl.constexpr,
        IDX64: tl.constexpr = False,
    ):
        b = tl.program_id(0).to(tl.int64)
        L = tl.load(len_ptr + b)
        if not IDX64:
            L = L.to(tl.int32)
        c = tl.load(last_ptr + b)
        ok = tl.arange(0, K_BLOCK)
        bpk_b = bpk_ptr + b * s_bp_b
        bpc_b = bpc_ptr + b * s_bp_b
        lab_b = lab_ptr + b * T
        st_b = st_ptr + b * T
        # every output element is written here (no host-side fills)
        of = tl.arange(0, FILL_BLOCK)
        for p0 in range(0, T, FILL_BLOCK):
            pos = p0 + of
            tl.store(st_b + pos, tl.zeros([FILL_BLOCK], tl.int8), mask=pos < T)
            tl.store(lab_b + pos, tl.full([FILL_BLOCK], -1, tl.int64), mask=(pos >= L) & (pos < T))
        tl.debug_barrier()
        t = L
        while t > 0:
            k = tl.load(bpk_b + t * C + c)
            if PACKED:
                c_prev = k & 65535
                k = k >> 16
            s = t - k
            for j in range(0, k, K_BLOCK):
                pos = s + j + ok
                tl.store(lab_b + pos, tl.cast(c, tl.int64) + tl.zeros([K_BLOCK], tl.int64), mask=pos < t)
            tl.store(st_b + s, 1)
            if PACKED:
                c = c_prev
            elif BP_C_AT_END:
                c = tl.load(bpc_b + t * C + c)
            else:
                c = tl.load(bpc_b + s * C + c)
            t = s


    @triton.jit
    def _write_segment(lab_b, st_b, mk_b, lo, s, t, c, ok, K_BLOCK: tl.constexpr):
        """Segment [s, t) of label c, clipped to positions >= lo (the chunk's): labels c, a start
        at s, no start elsewhere, and no node inside it (marks cleared on (max(s, lo), t); the mark
        at lo belongs to the chunk before)."""
        a = tl.maximum(s, lo)
        for j in range(0, t - a, K_BLOCK):
            pos = a + j + ok
            m = pos < t
            tl.store(lab_b + pos, tl.cast(c, tl.int64) + tl.zeros([K_BLOCK], tl.int64), mask=m)
            tl.store(st_b + pos, tl.where(pos == s, 1, 0).to(tl.int8), mask=m)
            tl.store(mk_b + pos, tl.full([K_BLOCK], -1, tl.int32), mask=m & (pos > a))

    @triton.jit
    def _walk(t, c, a, bp_b, lab_b, st_b, mk_b, C, ok, K_BLOCK: tl.constexpr, MERGE: tl.constexpr):
        """Follow backpointers from node (t, c) while t > a, writing each segment's positions of
        [a, ...) and marking its nodes. MERGE: stop at a node of the stored path. Returns
        ``(t, c, merged)``: the node reached. The label of the last segment walked, the one that
        crosses a when t < a, is the label this walk wrote at position a (:func:`_exit_label`)."""
        t = tl.cast(t, a.dtype)
        c = tl.cast(c, tl.int32)
        merged = tl.full([], 0, tl.int32)
        if MERGE:
            merged = tl.where(t > a, tl.load(mk_b + tl.maximum(t, a)) == c, 0).to(tl.int32)
        while (t > a) & (merged == 0):
            packed = tl.load(bp_b + t.to(tl.int64) * C + c)
            k = packed >> 16
            c_prev = packed & 65535
            s = t - k
            tl.store(mk_b + t, c)
            _write_segment(lab_b, st_b, mk_b, a, s, t, c, ok, K_BLOCK)
            t = s
            c = c_prev
            if MERGE:
                merged = tl.where(t > a, tl.load(mk_b + tl.maximum(t, a)) == c, 0).to(tl.int32)
        return t, c, merged

    @triton.jit
    def _exit_label(lab_b, a):
        """The label at position a, as the walk that just left the chunk wrote it (other threads
        wrote it: barrier first). Read from memory rather than carried through the walk's loop."""
        tl.debug_barrier()
        return tl.load(lab_b + a).to(tl.int32)

    @triton.jit
    def _traceback_chunks_kernel(
        bp_ptr,  # (B, T+1, C) int32 packed backpointers k << 16 | c_prev at t
        guess_ptr,  # (B, NCH) int32: the label of chunk j's guessed start node (b_j, .)
        len_ptr,  # (B,) lengths (0 for a sequence with no segmentation)
        lab_ptr,  # (B, T) int64 out: labels, -1 past the length
        st_ptr,  # (B, T) int8 out: 1 where a segment starts
        mk_ptr,  # (B, T+1) int32 scratch: mark[t] = c for the nodes of the stored path
        ex_ptr,  # (2, B, NCH, 3) int32: exits (node t, node c, crossing label): [0] spec, [1] fix-up
        stt_ptr,  # (B, NCH) int32: 1 if the chunk's last fix-up merged
        src_ptr,  # (B, NCH) int32: 1 or 2, which exit ends the chunk's stored path
        C, T, W, NCH, s_bp_b,
        K_BLOCK: tl.constexpr,
        FILL: tl.constexpr,
        PHASE: tl.constexpr,  # 1 spec, 2 fix-up, 3 repair
        IDX64: tl.constexpr = False,
    ):
        b_id = tl.program_id(0).to(tl.int64)
        L = tl.load(len_ptr + b_id)
        if not IDX64:
            L = L.to(tl.int32)
        ok = tl.arange(0, K_BLOCK)
        bp_b = bp_ptr + b_id * s_bp_b
        lab_b = lab_ptr + b_id * T
        st_b = st_ptr + b_id * T
        mk_b = mk_ptr + b_id * (T + 1)
        row = b_id * NCH
        half = tl.num_programs(0).to(tl.int64) * NCH
        n_b = (L + W - 1) // W
        if PHASE == 1:
            j = tl.program_id(1)
            a = tl.cast(j, L.dtype) * W
            b = tl.minimum(a + W, L)
            # positions of this chunk past the length (every output element is written here)
            of = tl.arange(0, FILL)
            for p0 in range(a, tl.minimum(a + W, T), FILL):
                pos = p0 + of
                m = (pos < tl.minimum(a + W, T)) & (pos >= L)
                tl.store(lab_b + pos, tl.full([FILL], -1, tl.int64), mask=m)
                tl.store(st_b + pos, tl.zeros([FILL], tl.int8), mask=m)
            if a < L:
                for p0 in range(a + 1, b + 1, FILL):
                    pos = p0 + of
                    tl.store(mk_b + pos, tl.full([FILL], -1, tl.int32), mask=pos <= b)
                tl.debug_barrier()
                c = tl.load(guess_ptr + row + j)
                t, c, merged = _walk(b, c, a, bp_b, lab_b, st_b, mk_b, C, ok, K_BLOCK, False)
                e = ex_ptr + (row + j) * 3
                tl.store(e, t)
                tl.store(e + 1, c)
                tl.store(e + 2, _exit_label(lab_b, a))
        else:
            j0 = n_b - 2
            j1 = -1
            if PHASE == 2:
                j0 = tl.program_id(1)
                j1 = j0 - 1
            clean_prev = tl.full([], 1, tl.int32)
            for jj in range(0, j0 - j1):
                j = j0 - jj
                a = tl.cast(j, L.dtype) * W
                b = tl.minimum(a + W, L)
                live = (j >= 0) & (j < n_b - 1)
                redo = live
                if PHASE == 3:
                    redo = live & (clean_prev == 0)
                if redo:
                    sp = 1
                    if PHASE == 3:
                        sp = tl.load(src_ptr + row + j + 1)
                    e = ex_ptr + ((sp - 1) * half + row + j + 1) * 3
                    t = tl.load(e)
                    c = tl.load(e + 1)
                    lab = tl.load(e + 2)
                    # the segment that crosses b_j: label lab on [t, b_j), a start at t
                    _write_segment(lab_b, st_b, mk_b, a, t, b, lab, ok, K_BLOCK)
                    if t < b:
                        tl.store(mk_b + b, -1)
                    tl.debug_barrier()
                    t, c, merged = _walk(t, c, a, bp_b, lab_b, st_b, mk_b, C, ok, K_BLOCK, True)
                    if merged != 0:
                        clean = (tl.load(src_ptr + row + j) == 1).to(tl.int32)
                    else:
                        e = ex_ptr + (half + row + j) * 3
                        tl.store(e, t)
                        tl.store(e + 1, c)
                        tl.store(e + 2, _exit_label(lab_b, a))
                        tl.store(src_ptr + row + j, 2)
                        clean = merged * 0
                    tl.store(stt_ptr + row + j, merged)
                    clean_prev = clean
                else:
                    if PHASE == 3:
                        if live:
                            clean_prev = (tl.load(src_ptr + row + j) == 1).to(tl.int32)
                # the next chunk reads what this one stored (end state, flags) from other threads
                tl.debug_barrier()
