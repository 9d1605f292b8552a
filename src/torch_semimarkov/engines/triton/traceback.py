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

from torch_semimarkov.engines.triton.common import HAS_TRITON, tl, triton  # noqa: F401

if HAS_TRITON:
    from torch_semimarkov.engines.triton.common import MASK_K, log_
    from torch_semimarkov.engines.triton.common import seq_length
    from torch_semimarkov.engines.triton.common import chunk_clean, passed_clean, rerun_owns_end
    from torch_semimarkov.engines.triton.common import sweep_chunk, sweep_start

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
        L = seq_length(len_ptr, b, IDX64)
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
    def _inverse_cdf(z, idx, valid, u, first, last, acc, m):
        """Fold one tile of log-weights ``z`` (relative to ``m``) into an inverse-CDF draw: returns
        ``(first, last, acc)``, the first index whose cumulative weight ``acc + cumsum`` exceeds
        the target ``u``, the last index of positive weight and the running total."""
        p = tl.where(valid, tl.exp(z - m), 0.0)
        cs = acc + tl.cumsum(p, 0)
        big = 2147483647
        first = tl.minimum(first, tl.min(tl.where(valid & (p > 0) & (cs > u), idx, big), 0))
        last = tl.maximum(last, tl.max(tl.where(valid & (p > 0), idx, -1), 0))
        return first, last, acc + tl.sum(p, 0)

    @triton.jit
    def _duration_logits(k, kmax, s, c1, w_b, f_b, cum_b, db_ptr, fs, s_c, C):
        """log weights, up to a constant, of the segment [s-k, s) of label c1 for a tile of
        durations k: U_{s-k}(c1) + D[k-1, c1] + S_s - S_{s-k} (frames included)."""
        vk = k <= kmax
        p0 = s.to(tl.int64) - k
        u = tl.load(w_b + p0 * C + c1, mask=vk, other=MASK_K).to(tl.float32)
        fr = (tl.load(f_b + p0, mask=vk, other=0.0) - fs).to(tl.float32)
        seg = (s_c - tl.load(cum_b + p0 * C + c1, mask=vk, other=0.0)).to(tl.float32)
        d = tl.load(db_ptr + (k - 1) * C + c1, mask=vk, other=MASK_K).to(tl.float32)
        return tl.where(vk, u + fr + seg + d, -3e38), vk

    @triton.jit
    def _draw(s, c, a_b, w_b, f_b, cum_b, tr_ptr, db_ptr, u_r, C, K, ok, C_PAD: tl.constexpr,
              K_BLOCK: tl.constexpr):
        """One exact backward-sampling step from the start node (s, c), "a segment of label c
        starts at s" (c == C: the sequence ends at s). With the uniforms (u1, u2) of position s it
        draws the label c' of the segment that ends at s, P(c') ~ alpha_s(c') exp(Tr[c', c]), then
        its duration k, P(k) ~ exp(U_{s-k}(c') + D[k-1, c'] + S_s(c') - S_{s-k}(c')). Returns
        ``(s - k, c')``. A draw is a function of the node and the uniforms of its position only,
        so walks that reach the same node go on together (what the chunked walk relies on)."""
        s64 = s.to(tl.int64)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        z = tl.load(a_b + s64 * C + oc, mask=mc, other=MASK_K).to(tl.float32)
        z += tl.load(tr_ptr + oc * C + c, mask=mc & ((oc * 0 + c) < C), other=0.0).to(tl.float32)
        z = tl.where(mc, z, -3e38)
        m = tl.max(z, 0)
        tot = tl.sum(tl.where(mc, tl.exp(z - m), 0.0), 0)
        u1 = tl.load(u_r + s64 * 2)
        first, last, _ = _inverse_cdf(z, oc, mc, u1 * tot, 2147483647, -1, 0.0, m)
        c1 = tl.where(first < C, first, last)
        fs = tl.load(f_b + s64)
        s_c = tl.load(cum_b + s64 * C + c1)
        kmax = tl.minimum(K, s)
        run_m = -3e38
        run_s = 0.0
        for kb in range(1, kmax + 1, K_BLOCK):
            zk, vk = _duration_logits(kb + ok, kmax, s, c1, w_b, f_b, cum_b, db_ptr, fs, s_c, C)
            nm = tl.maximum(run_m, tl.max(zk, 0))
            run_s = run_s * tl.exp(run_m - nm) + tl.sum(tl.where(vk, tl.exp(zk - nm), 0.0), 0)
            run_m = nm
        target = tl.load(u_r + s64 * 2 + 1) * run_s
        first = 2147483647
        last = -1
        acc = 0.0
        for kb in range(1, kmax + 1, K_BLOCK):
            k = kb + ok
            zk, vk = _duration_logits(k, kmax, s, c1, w_b, f_b, cum_b, db_ptr, fs, s_c, C)
            first, last, acc = _inverse_cdf(zk, k, vk, target, first, last, acc, run_m)
        k1 = tl.where(first <= kmax, first, last)
        return s - k1, c1

    @triton.jit
    def _pick_label(z, mc, u, oc, C):
        """Inverse-CDF draw of a label from one (C_PAD,) tile of log weights with the uniform u."""
        z = tl.where(mc, z, -3e38)
        m = tl.max(z, 0)
        tot = tl.sum(tl.where(mc, tl.exp(z - m), 0.0), 0)
        first, last, _ = _inverse_cdf(z, oc, mc, u * tot, 2147483647, -1, 0.0, m)
        return tl.where(first < C, first, last)

    @triton.jit
    def _kcc_duration_logits(k, kmax, t, c, a_b, f_b, cum_b, ps_b, tr_ptr, db_ptr, ft, C, oc, mc,
                             HAS_PS: tl.constexpr):
        """log weights, up to a constant, of the durations k (a tile) of the segment [t-k, t) of label
        c under a (K, C, C) transition: LSE_{c'} alpha_{t-k}(c') + Tr[k-1, c', c], plus
        D[k-1, c] - S_{t-k}(c) (+ ps_{t-k}(c)); frames included."""
        vk = k <= kmax
        p0 = t.to(tl.int64) - k
        m2 = vk[:, None] & mc[None, :]
        # shape: (K_BLOCK durations, C_PAD source labels)
        x = tl.load(a_b + p0[:, None] * C + oc[None, :], mask=m2, other=MASK_K).to(tl.float32)
        x += (tl.load(f_b + p0, mask=vk, other=0.0) - ft).to(tl.float32)[:, None]
        x += tl.load(tr_ptr + (k[:, None] - 1) * C * C + oc[None, :] * C + c, mask=m2, other=MASK_K).to(tl.float32)
        x = tl.where(m2, x, -3e38)
        mx = tl.max(x, 1)
        lse = mx + log_(tl.sum(tl.exp(x - mx[:, None]), 1))
        base = tl.load(db_ptr + (k - 1) * C + c, mask=vk, other=MASK_K).to(tl.float32)
        base -= tl.load(cum_b + p0 * C + c, mask=vk, other=0.0).to(tl.float32)
        if HAS_PS:
            base += tl.load(ps_b + p0 * C + c, mask=vk, other=0.0).to(tl.float32)
        return tl.where(vk, lse + base, -3e38), vk

    @triton.jit
    def _draw_kcc(t, c, a_b, f_b, cum_b, ps_b, tr_ptr, db_ptr, u_r, C, K, ok, C_PAD: tl.constexpr,
                  K_BLOCK: tl.constexpr, HAS_PS: tl.constexpr):
        """One exact backward-sampling step from the end node (t, c), "a segment of label c ends at
        t", of a (K, C, C) transition, whose transition depends on the later segment's duration
        (so the node is an end node, not a start node as in :func:`_draw`); c == C: the sequence
        ends at t, and the label is drawn first, P(c) ~ alpha_t(c), with u1 of position t. Then the
        duration with u2 of t, P(k) ~ sum_{c'} alpha_{t-k}(c') exp(Tr[k-1, c', c] + D[k-1, c] +
        S_t(c) - S_{t-k}(c) (+ ps_{t-k}(c))), and the previous label with u1 of the start t-k,
        P(c') ~ alpha_{t-k}(c') exp(Tr[k-1, c', c]): the PyTorch path's draws and uniforms.
        Returns ``(t - k, c', c)``, c the label of the segment drawn."""
        t64 = t.to(tl.int64)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        if c >= C:
            c = _pick_label(tl.load(a_b + t64 * C + oc, mask=mc, other=MASK_K).to(tl.float32), mc,
                            tl.load(u_r + t64 * 2), oc, C)
            c = tl.maximum(c, 0)  # a guessed node that no segmentation reaches (fixed up later)
        ft = tl.load(f_b + t64)
        kmax = tl.minimum(K, t)
        run_m = -3e38
        run_s = 0.0
        for kb in range(1, kmax + 1, K_BLOCK):
            zk, vk = _kcc_duration_logits(kb + ok, kmax, t, c, a_b, f_b, cum_b, ps_b, tr_ptr, db_ptr, ft, C, oc, mc,
                                          HAS_PS)
            nm = tl.maximum(run_m, tl.max(zk, 0))
            run_s = run_s * tl.exp(run_m - nm) + tl.sum(tl.where(vk, tl.exp(zk - nm), 0.0), 0)
            run_m = nm
        target = tl.load(u_r + t64 * 2 + 1) * run_s
        first = 2147483647
        last = -1
        acc = 0.0
        for kb in range(1, kmax + 1, K_BLOCK):
            k = kb + ok
            zk, vk = _kcc_duration_logits(k, kmax, t, c, a_b, f_b, cum_b, ps_b, tr_ptr, db_ptr, ft, C, oc, mc,
                                          HAS_PS)
            first, last, acc = _inverse_cdf(zk, k, vk, target, first, last, acc, run_m)
        k1 = tl.maximum(tl.where(first <= kmax, first, last), 1)
        s64 = t64 - k1
        z = tl.load(a_b + s64 * C + oc, mask=mc, other=MASK_K).to(tl.float32)
        z += tl.load(tr_ptr + (k1 - 1) * C * C + oc * C + c, mask=mc, other=MASK_K).to(tl.float32)
        c1 = tl.maximum(_pick_label(z, mc, tl.load(u_r + s64 * 2), oc, C), 0)
        return t - k1, c1, c

    @triton.jit
    def _walk(t, c, a, bp_b, lab_b, st_b, mk_b, C, ok, K_BLOCK: tl.constexpr, MERGE: tl.constexpr,
              SAMPLE: tl.constexpr, a_b, w_b, f_b, cum_b, tr_ptr, db_ptr, u_r, K, C_PAD: tl.constexpr,
              KCC: tl.constexpr = False, ps_b=None, HAS_PS: tl.constexpr = False):
        """Follow backpointers from node (t, c) while t > a, writing each segment's positions of
        [a, ...) and marking its nodes. MERGE: stop at a node of the stored path. Returns
        ``(t, c, merged)``: the node reached. The label of the last segment walked, the one that
        crosses a when t < a, is the label this walk wrote at position a (:func:`_exit_label`).

        SAMPLE: the nodes are start nodes (t, c), "a segment of label c starts at t", and each
        step draws the segment before it (:func:`_draw`) instead of reading a backpointer; with
        KCC (a (K, C, C) transition) end nodes as in the traceback, each step drawing the
        segment's duration and the label before it (:func:`_draw_kcc`)."""
        t = tl.cast(t, a.dtype)
        c = tl.cast(c, tl.int32)
        merged = tl.full([], 0, tl.int32)
        if MERGE:
            merged = tl.where(t > a, tl.load(mk_b + tl.maximum(t, a)) == c, 0).to(tl.int32)
        while (t > a) & (merged == 0):
            if KCC:
                s, c_prev, seg_c = _draw_kcc(t, c, a_b, f_b, cum_b, ps_b, tr_ptr, db_ptr, u_r, C, K, ok, C_PAD,
                                             K_BLOCK, HAS_PS)
            elif SAMPLE:
                s, c_prev = _draw(t, c, a_b, w_b, f_b, cum_b, tr_ptr, db_ptr, u_r, C, K, ok, C_PAD, K_BLOCK)
                seg_c = c_prev
            else:
                packed = tl.load(bp_b + t.to(tl.int64) * C + c)
                k = packed >> 16
                c_prev = packed & 65535
                s = t - k
                seg_c = c
            tl.store(mk_b + t, c)
            _write_segment(lab_b, st_b, mk_b, a, s, t, seg_c, ok, K_BLOCK)
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
        # sampling (SAMPLE): rows are (sample, sequence) pairs, row r reads sequence r % NB
        SAMPLE: tl.constexpr = False,
        a_ptr=None,  # (NB, T+1, C) float32 alpha_hat
        w_ptr=None,  # (NB, T+1, C) float32 U_hat
        f_ptr=None,  # (NB, T+1) float64 frames
        cum_ptr=None,  # (NB, T+1, C)
        tr_ptr=None,  # (C, C)
        db_ptr=None,  # (K, C)
        u_ptr=None,  # (rows, T+1, 2) float32 uniforms of each position
        NB=1,
        K=1,
        C_PAD: tl.constexpr = 4,
        KCC: tl.constexpr = False,  # a (K, C, C) transition tr_ptr: end nodes, :func:`_draw_kcc`
        ps_ptr=None,  # (NB, T, C) proj_start (KCC; U_hat holds it for a (C, C) transition)
        HAS_PS: tl.constexpr = False,
    ):
        b_id = tl.program_id(0).to(tl.int64)
        seq = b_id % NB
        a_b = a_ptr
        w_b = w_ptr
        f_b = f_ptr
        cum_b = cum_ptr
        u_r = u_ptr
        ps_b = ps_ptr
        if SAMPLE:
            a_b = a_ptr + seq * (T + 1) * C
            w_b = w_ptr + seq * (T + 1) * C
            f_b = f_ptr + seq * (T + 1)
            cum_b = cum_ptr + seq * (T + 1) * C
            u_r = u_ptr + b_id * (T + 1) * 2
            if HAS_PS:
                ps_b = ps_ptr + seq * T * C
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
                t, c, merged = _walk(b, c, a, bp_b, lab_b, st_b, mk_b, C, ok, K_BLOCK, False, SAMPLE, a_b, w_b, f_b,
                                     cum_b, tr_ptr, db_ptr, u_r, K, C_PAD, KCC, ps_b, HAS_PS)
                e = ex_ptr + (row + j) * 3
                tl.store(e, t)
                tl.store(e + 1, c)
                tl.store(e + 2, _exit_label(lab_b, a))
        else:
            j0, count = sweep_start(n_b, PHASE, True)
            clean_prev = tl.full([], 1, tl.int32)
            for jj in range(0, count):
                j, a, b, live, redo, e = sweep_chunk(j0, jj, W, L, n_b, clean_prev, src_ptr, row, half,
                                                     PHASE, True, "")
                if redo:
                    ex = ex_ptr + e * 3
                    t = tl.load(ex)
                    c = tl.load(ex + 1)
                    lab = tl.load(ex + 2)
                    # the segment that crosses b_j: label lab on [t, b_j), a start at t
                    _write_segment(lab_b, st_b, mk_b, a, t, b, lab, ok, K_BLOCK)
                    if t < b:
                        tl.store(mk_b + b, -1)
                    tl.debug_barrier()
                    t, c, merged = _walk(t, c, a, bp_b, lab_b, st_b, mk_b, C, ok, K_BLOCK, True, SAMPLE, a_b, w_b, f_b,
                                         cum_b, tr_ptr, db_ptr, u_r, K, C_PAD, KCC, ps_b, HAS_PS)
                    if merged != 0:
                        clean = chunk_clean(src_ptr, row, j)
                    else:
                        ex = ex_ptr + (half + row + j) * 3
                        tl.store(ex, t)
                        tl.store(ex + 1, c)
                        tl.store(ex + 2, _exit_label(lab_b, a))
                        clean = rerun_owns_end(src_ptr, row, j, merged)
                    tl.store(stt_ptr + row + j, merged)
                    clean_prev = clean
                else:
                    clean_prev = passed_clean(clean_prev, live, src_ptr, row, j, PHASE)
                # the next chunk reads what this one stored (end state, flags) from other threads
                tl.debug_barrier()
