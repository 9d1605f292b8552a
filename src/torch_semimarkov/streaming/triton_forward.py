"""Triton forward kernels of the streaming semi-CRF (log and max semiring) and their launchers.

The kernels follow ``ALGORITHM.md`` §2 (factored recurrence for a static (C, C) transition, the
direct O(K·C²) recurrence for a duration-dependent (K, C, C) one) and §5 (float32 numerics).

One program owns one sequence and loops t = 1 .. L_b over that sequence's own length, so ragged
batches need no masking in time. Every step of the factored kernels:

* ``u_s = LSE_{c'}(alpha_s(c') + Tr[c', c])`` on a (C_PAD, C_PAD) register tile;
* ``U_s = u_s + ps_s`` enters a ring of the last K positions: in registers
  (``_fwd_factored_reg_kernel``, rings up to 8192 elements, small batches) or in a per-sequence
  global buffer read back as (K_BLOCK, C_PAD) tiles (``_fwd_factored_kernel``);
* ``alpha_t = pe_{t-1} + LSE_k(U_{t-k} + D[k-1] + S_t - S_{t-k})`` with an online log-sum-exp.
  The segment sum ``S_t - S_{t-k}`` is formed before anything is added to it, so the size of S
  (O(sqrt T) after zero-centring, O(T) without) never costs float32 precision.

Numerics: alpha is kept as ``alpha_hat = alpha - F_t`` with the shift ``F_t`` accumulated in
float64 at every step; each ring row keeps the frame of the step that wrote it and a reader adds
the float64 frame difference cast to float32, so no stored value holds more than a few steps'
growth. Logs use libdevice's (unbiased to 1 ulp) on the GPU.

With ``save_for_backward=True`` (log semiring) the forward saves checkpoints (ALGORITHM.md §6):
at every position ``i·checkpoint_interval`` the state its kernel needs to restart exactly there
(ring rows, their float64 frames, ``alpha_hat``, the running shift F), O((T/Δ)·K·C) per sequence.
:func:`recompute_forward_state` (called by the backward launcher) restores them, one program per
(sequence, interval), and reruns the forward over every interval into a transient buffer of every
position's ``alpha_hat``, ``U_hat`` and frame; the register-ring forward and its recompute are one
compiled kernel (``CK_MODE``), so the recomputed values are the forward's, bit for bit.
The max semiring stores backpointers (B, T+1, C) int32 and ``_traceback_kernel`` decodes them on
the GPU.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple, Optional

import torch

from .pytorch_reference import feasible, public_score

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

#: Structural mask (padding, durations out of range). Far below NEG_INF so that a real -1e9 score
#: is never confused with padding, and far above -3.4e38 so that sums of a few masks stay finite.
_MASK = -1e30


#: Move the reference of the segment sums in the register ring every this many steps.
REBASE = 4

#: Largest (K_PAD x C_PAD) ring held in registers, per warp count.
_REG_RING_ELEMENTS = {1: 1024, 2: 2048, 4: 4096, 8: 8192, 16: 16384}


#: Tests set this to exercise the memory-ring kernels at small sizes.
FORCE_MEMORY_RING = False


def _use_register_ring(C: int, K_eff: int, num_warps: int, B: int = 1) -> bool:
    """Register ring for a small (K_PAD, C_PAD) ring; the memory ring for large rings and for
    large batches of large rings (register pressure then costs more occupancy than it saves)."""
    if FORCE_MEMORY_RING:
        return False
    elems = max(2, _next_pow2(K_eff)) * max(4, _next_pow2(C))
    if B >= 256 and elems >= 2048:
        return False
    return elems <= _REG_RING_ELEMENTS.get(num_warps, 4096)


def auto_num_warps(B: int, C: int, K_eff: int, duration_transitions: bool = False, semiring: str = "log") -> int:
    """Warps per program for the sequential kernels, from the H200 sweep in benchmarks/GPU_NOTES.md:
    one program per sequence is latency-bound below a few hundred sequences (more warps shorten a
    step for large rings) and throughput-bound above."""
    if duration_transitions:
        return 4
    c_pad = max(4, _next_pow2(C))
    elems = max(2, _next_pow2(K_eff)) * c_pad
    if B >= 256:
        return 4
    if elems <= 256:
        return 1 if (c_pad <= 4 or semiring == "max") else 4
    return 8


if not HAS_TRITON:  # pragma: no cover - names the backward imports
    _log = None


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


#: Tests set this to a small power of two to exercise the multi-block duration loops.
K_BLOCK_OVERRIDE = None


def _tile_sizes(C: int, K_eff: int):
    """(C_PAD, K_BLOCK): a (K_BLOCK, C_PAD) tile holds at most 4096 elements."""
    c_pad = max(4, _next_pow2(C))
    k_block = max(2, min(_next_pow2(K_eff), max(16, 4096 // c_pad)))
    if K_BLOCK_OVERRIDE is not None:
        k_block = K_BLOCK_OVERRIDE
    return c_pad, k_block


if HAS_TRITON:
    #: libdevice's log (1 ulp) on the GPU: lg2.approx has a small absolute bias that a
    #: recurrence over 10^6 steps would sum; the interpreter has no libdevice
    _PRECISE_LOG = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"))

    @triton.jit
    def _log(x):
        y = tl.log(x)
        if _PRECISE_LOG:
            y = libdevice.log(x)
        return y

    @triton.jit
    def _possible(m):
        """A normaliser shift: ``m``, or 0 where every state is impossible (m below -1e29), so
        that frames only move by real values and an infeasible prefix costs no precision."""
        return tl.where(m > -1e29, m, 0.0)

    @triton.jit
    def _lse_cols(x):
        """Log-sum-exp of a (rows, cols) tile over its rows (axis 0)."""
        mx = tl.max(x, 0)
        return mx + _log(tl.sum(tl.exp(x - mx[None, :]), 0))

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
    ):
        """Factored forward with the ring of the last K U_hat rows in global memory (row s % R).

        CKPT saves, at every s = i·DELTA < L, the rows of positions s-K .. s-1, their frames,
        alpha_hat_s and F_s. RESTORE (grid (B, NCK), R = T+1, STORE_ALPHA) restarts program (b, i)
        from checkpoint i: rows before i·DELTA are read from the checkpoint, later ones from the
        rows it writes itself, so intervals never read each other's output.
        """
        MASK: tl.constexpr = -1e30
        b = tl.program_id(0).to(tl.int64)
        L = tl.load(len_ptr + b).to(tl.int32)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        ok = tl.arange(0, K_BLOCK)
        CK32 = K * C + C_PAD
        t0 = 0
        t_end = L
        if RESTORE:
            t0 = tl.program_id(1) * DELTA
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
        tr = tl.load(
            tr_ptr + oc[:, None] * C + oc[None, :], mask=mc[:, None] & mc[None, :], other=MASK
        ).to(tl.float32)
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
        u0 = _lse_cols(tr)

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
                u = mx + _log(tl.sum(tl.exp(x - mx[None, :]), 0))
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
                    run_k = tl.where(upd, kb + 1 + ba, run_k)
                    run_m = tl.where(upd, bm, run_m)
                else:
                    nm = tl.maximum(run_m, bm)
                    run_s = run_s * tl.exp(run_m - nm) + tl.sum(tl.exp(xk - nm[None, :]), 0)
                    run_m = nm
            if IS_MAX:
                lse = run_m
                tl.store(bpk_b + t * C + oc, run_k, mask=mc)
            else:
                lse = run_m + _log(tl.where(mc & (run_s > 0), run_s, 1.0))
            at = lse
            if HAS_PE:
                at += tl.load(pe_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
            at = tl.where(mc, at, MASK)
            m = _possible(tl.max(at, 0))
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
                lz = am + _log(tl.sum(tl.exp(alpha - am), 0))
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
        MASK: tl.constexpr = -1e30
        b = tl.program_id(0).to(tl.int64)
        L = tl.load(len_ptr + b).to(tl.int32)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        oj = tl.arange(0, K_PAD)
        t0 = 0
        t_end = L
        ck_b = ck_ptr + b * NCK * CK32S
        ckf_b = ckf_ptr + b * NCK * (K_PAD + 1)
        if CK_MODE:
            t0 = tl.program_id(1) * RANGE
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
        shift = _possible(tl.max(alpha, 0))
        # u_0 = LSE_{c'} Tr[c', c] in both semirings: the first segment's phantom predecessor
        u0 = tl.max(trT, 1)
        u0 = u0 + _log(tl.sum(tl.exp(trT - u0[:, None]), 1))
        # predicated per-position stores (FLAGS & 2): no branch in the step loop
        st_c = tl.where((FLAGS & 2) != 0, C, 0)
        st_1 = tl.where((FLAGS & 2) != 0, 1, 0)
        if STORE:
            if (t0 == 0) & ((FLAGS & 2) != 0):
                tl.store(a_b + oc, alpha, mask=mc)
        if IS_MAX:
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
                kj = ((s - oj) & (K_PAD - 1)) + 1
                vj = (kj >= 2) & (kj <= tl.minimum(k_max, t))
                drot = tl.load(
                    db_ptr + (kj[:, None] - 1) * C + oc[None, :], mask=vj[:, None] & mc[None, :], other=MASK
                ).to(tl.float32)

                # k >= 2 part of alpha_t (ring rows of positions t-2 .. t-K), frame F_{t-1}
                xk = ring + drot + (rfr - F).to(tl.float32)[:, None]
                pm = tl.max(xk, 0)
                if IS_MAX:
                    pk = tl.min(tl.where(xk == pm[None, :], kj[:, None], K_PAD + 1), 0)
                    pc = tl.sum(tl.where(kj[:, None] == pk[None, :], bring, 0), 0)
                else:
                    psum = tl.sum(tl.exp(xk - pm[None, :]), 0)
                    plse = tl.where(psum > 0, pm + _log(tl.where(psum > 0, psum, 1.0)), MASK)

                # u_s(c) = LSE_{c'} alpha_hat_s(c') + Tr[c', c] and the k = 1 term (critical path)
                x = trT + alpha[None, :]
                mx = tl.max(x, 1)
                if IS_MAX:
                    u = tl.where(s == 0, u0, mx)
                    bc = tl.argmax(x, 1, tie_break_left=True).to(tl.int32)
                else:
                    u = mx + _log(tl.sum(tl.exp(x - mx[:, None]), 1))
                if HAS_PS:
                    u += ps_s
                v1 = u - (s_prev - s_ref)
                x1 = v1 + d0
                if IS_MAX:
                    # ties go to the smallest duration: k = 1 wins a tie
                    one = x1 >= pm
                    lse = tl.where(one, x1, pm)
                    packed = tl.where(one, 65536 + bc, pk * 65536 + pc)
                    tl.store(bp_b + t * C + oc, packed, mask=mc)
                else:
                    hi = tl.maximum(plse, x1)
                    lse = hi + _log(1.0 + tl.exp(tl.minimum(plse, x1) - hi))
                at = lse + (s_t - s_ref)
                if HAS_PE:
                    at += pe_s
                if STORE:
                    tl.store(w_b + s * C + oc, u, mask=oc < st_c)
                    tl.store(f_b + s + oc * 0, tl.zeros([C_PAD], tl.float64) + F, mask=oc < st_1)
                slot = s & (K_PAD - 1)
                ring = tl.where(oj[:, None] == slot, v1[None, :], ring)
                rfr = tl.where(oj == slot, F, rfr)
                if IS_MAX:
                    bring = tl.where(oj[:, None] == slot, bc[None, :], bring)
                # normalise by the maximum of the previous alpha_hat (known one step early)
                alpha = tl.where(mc, tl.maximum(at - shift, MASK), MASK)
                F = F + shift.to(tl.float64)
                shift = _possible(tl.max(alpha, 0))
                if STORE:
                    tl.store(a_b + t * C + oc, alpha, mask=oc < st_c)
                s_prev = s_t
                if t % REBASE == 0:
                    ring += (s_t - s_ref)[None, :]
                    s_ref = s_t

        if STORE:
            if (t0 < L) & (t_end == L) & ((FLAGS & 2) != 0):
                tl.store(f_b + L, F)
        am = tl.max(alpha, 0)
        if IS_MAX:
            tl.store(out_ptr + b, F + am.to(tl.float64))
            tl.store(last_ptr + b, tl.argmax(alpha, 0, tie_break_left=True).to(tl.int32))
        elif CK_MODE:
            if (FLAGS & 4) != 0:
                lz = am + _log(tl.sum(tl.exp(alpha - am), 0))
                tl.store(out_ptr + b, F + lz.to(tl.float64))
        else:
            lz = am + _log(tl.sum(tl.exp(alpha - am), 0))
            tl.store(out_ptr + b, F + lz.to(tl.float64))

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
    ):
        """Direct O(K·C²) forward for a (K, C, C) transition; alpha_hat rows in a ring of R rows.

        CKPT saves, at every s = i·DELTA < L, the rows of positions s-K+1 .. s and their frames;
        RESTORE (grid (B, NCK), R = T+1) restarts program (b, i) there, reading positions before
        i·DELTA from the checkpoint.
        """
        MASK: tl.constexpr = -1e30
        b = tl.program_id(0).to(tl.int64)
        L = tl.load(len_ptr + b).to(tl.int32)
        oc = tl.arange(0, C_PAD)
        mc = oc < C
        m2 = mc[:, None] & mc[None, :]
        t0 = 0
        t_end = L
        if RESTORE:
            t0 = tl.program_id(1) * DELTA
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
            s_t = tl.load(cum_b + t * C + oc, mask=mc, other=0.0)
            k_lim = tl.minimum(t, K)
            run_m = tl.full([C_PAD], MASK, tl.float32)
            if IS_MAX:
                run_m = tl.full([C_PAD], 2 * MASK, tl.float32)
                run_k = tl.zeros([C_PAD], dtype=tl.int32)
                run_c = tl.zeros([C_PAD], dtype=tl.int32)
            run_s = tl.zeros([C_PAD], dtype=tl.float32)
            for k in range(1, k_lim + 1):
                s = t - k
                row = s % R
                # shape: (C_PAD src,) alpha_hat_s in the current frame
                if RESTORE:
                    # positions before t0 come from the checkpoint (row j = position - t0 + K - 1)
                    own = s > t0
                    jc = tl.where(own, 0, s - t0 + K - 1)
                    # both addresses are valid (jc = 0 for own rows): load both, select
                    av_row = tl.where(own, tl.load(a_b + row * C + oc, mask=mc, other=MASK),
                                      tl.load(ck_b + jc * C + oc, mask=mc, other=MASK))
                    av_f = tl.where(own, tl.load(f_b + row), tl.load(ckf_b + jc))
                    av = av_row + (av_f - F).to(tl.float32)
                else:
                    av = tl.load(a_b + row * C + oc, mask=mc, other=MASK) + (tl.load(f_b + row) - F).to(tl.float32)
                base = tl.load(db_ptr + (k - 1) * C + oc, mask=mc, other=MASK).to(tl.float32)
                base += (s_t - tl.load(cum_b + s * C + oc, mask=mc, other=0.0)).to(tl.float32)
                if HAS_PS:
                    base += tl.load(ps_b + s * C + oc, mask=mc, other=0.0).to(tl.float32)
                trk = tl.load(tr_ptr + (k - 1) * C * C + oc[:, None] * C + oc[None, :], mask=m2, other=MASK)
                x = av[:, None] + trk.to(tl.float32) + base[None, :]
                bm = tl.max(x, 0)
                if IS_MAX:
                    ba = tl.argmax(x, 0, tie_break_left=True).to(tl.int32)
                    if s == 0:
                        # the first segment keeps LSE_{c'} (phantom predecessor), as in log Z
                        bm = _lse_cols(x)
                        ba = ba * 0
                    upd = bm > run_m
                    run_k = tl.where(upd, k, run_k)
                    run_c = tl.where(upd, ba, run_c)
                    run_m = tl.where(upd, bm, run_m)
                else:
                    nm = tl.maximum(run_m, bm)
                    run_s = run_s * tl.exp(run_m - nm) + tl.sum(tl.exp(x - nm[None, :]), 0)
                    run_m = nm
            if IS_MAX:
                lse = run_m
                tl.store(bpk_b + t * C + oc, run_k, mask=mc)
                tl.store(bpc_b + t * C + oc, run_c, mask=mc)
            else:
                lse = run_m + _log(tl.where(mc & (run_s > 0), run_s, 1.0))
            at = lse
            if HAS_PE:
                at += tl.load(pe_b + (t - 1) * C + oc, mask=mc, other=0.0).to(tl.float32)
            at = tl.where(mc, at, MASK)
            m = _possible(tl.max(at, 0))
            alpha = tl.where(mc, tl.maximum(at - m, MASK), MASK)
            F = F + m.to(tl.float64)
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
                lz = am + _log(tl.sum(tl.exp(alpha - am), 0))
                tl.store(out_ptr + b, F + lz.to(tl.float64))

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
    ):
        b = tl.program_id(0).to(tl.int64)
        L = tl.load(len_ptr + b).to(tl.int32)
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
                tl.store(lab_b + pos, c.to(tl.int64) + tl.zeros([K_BLOCK], tl.int64), mask=pos < t)
            tl.store(st_b + s, 1)
            if PACKED:
                c = c_prev
            elif BP_C_AT_END:
                c = tl.load(bpc_b + t * C + c)
            else:
                c = tl.load(bpc_b + s * C + c)
            t = s


def _contig(x):
    return None if x is None else x.contiguous()


def _resolve_interval(T: int, K: int, checkpoint_interval: Optional[int]) -> int:
    """Positions between checkpoints: ``max(K, sqrt(T·K))`` by default (as the PyTorch path),
    clamped to [1, T]."""
    interval = checkpoint_interval or max(K, int(math.sqrt(T * K)), 1)
    return max(1, min(int(interval), max(T, 1)))


def _ckpt_sizes(kind: str, C: int, K_eff: int):
    """Per-checkpoint float32 and float64 element counts of each kernel's restart state."""
    c_pad = max(4, _next_pow2(C))
    if kind == "reg":
        k_pad = max(2, _next_pow2(K_eff))
        return k_pad * c_pad + c_pad, k_pad + 1
    if kind == "mem":
        return K_eff * C + c_pad, K_eff + 1
    return K_eff * C, K_eff


def _init_reg_checkpoint(ck32, ck64, C, c_pad, k_pad):
    """Checkpoint 0 of the register-ring kernel: the initial state (empty ring, alpha_hat_0 = 0
    on the C real labels, every frame 0)."""
    ck32[:, 0, :k_pad * c_pad] = _MASK
    ck32[:, 0, k_pad * c_pad:] = torch.where(torch.arange(c_pad, device=ck32.device) < C, 0.0, _MASK)
    ck64[:, 0] = 0.0


def _kernel_kind(B: int, C: int, K_eff: int, num_warps: int, dur_tr: bool) -> str:
    """Which forward kernel runs: "dur" ((K, C, C) transitions), "reg" (register ring) or "mem"."""
    if dur_tr:
        return "dur"
    return "reg" if _use_register_ring(C, K_eff, num_warps, B) and C < 65536 else "mem"


def _forward_impl(cum_scores, transition, duration_bias, lengths, K, semiring, proj_start, proj_end,
                  num_warps, save_for_backward, checkpoint_interval=None, save_all=False):
    """Runs the forward. ``save_for_backward`` (log semiring) saves checkpoints every
    ``checkpoint_interval`` positions; ``save_all`` instead saves every position (the layout the
    backward kernels read; tests compare it with :func:`recompute_forward_state`)."""
    if not HAS_TRITON:
        raise RuntimeError("Triton is not available")
    cum_scores = cum_scores.contiguous()
    transition = transition.contiguous()
    duration_bias = duration_bias.contiguous()
    proj_start = _contig(proj_start)
    proj_end = _contig(proj_end)
    lengths = lengths.to(device=cum_scores.device, dtype=torch.int64).contiguous()
    B, T1, C = cum_scores.shape
    T = T1 - 1
    dev = cum_scores.device
    K_eff = max(1, min(int(K), T))
    is_max = semiring == "max"
    dur_tr = transition.dim() == 3
    if num_warps is None:
        num_warps = auto_num_warps(B, C, K_eff, dur_tr, semiring)
    c_pad, k_block = _tile_sizes(C, K_eff)
    full = save_all and not is_max
    ckpt = save_for_backward and not is_max and not full
    kind = _kernel_kind(B, C, K_eff, num_warps, dur_tr)
    R = T + 1 if full else _next_pow2(K_eff + 1)
    frames = torch.empty((B, R), device=dev, dtype=torch.float64)
    out = torch.empty((B,), device=dev, dtype=torch.float64)
    last = torch.empty((B,), device=dev, dtype=torch.int32)
    # the register-ring kernel packs (k, c_prev) into one int32 per (t, c): one dependent load per
    # segment in the traceback instead of two
    packed = kind == "reg"
    if is_max:
        bpk = torch.empty((B, T + 1, C), device=dev, dtype=torch.int32)
        bpc = bpk if packed else torch.empty((B, T + 1, C), device=dev, dtype=torch.int32)
    else:
        bpk = bpc = torch.empty((1,), device=dev, dtype=torch.int32)
    ps = proj_start if proj_start is not None else cum_scores
    pe = proj_end if proj_end is not None else cum_scores
    s_p_b = T * C
    grid = (B,)
    delta = _resolve_interval(T, K_eff, checkpoint_interval)
    nck = -(-T // delta)
    if ckpt:
        n32, n64 = _ckpt_sizes(kind, C, K_eff)
        ck32 = torch.empty((B, nck, n32), device=dev, dtype=torch.float32)
        ck64 = torch.empty((B, nck, n64), device=dev, dtype=torch.float64)
    else:
        ck32 = torch.empty((1,), device=dev, dtype=torch.float32)
        ck64 = torch.empty((1,), device=dev, dtype=torch.float64)
    # alpha_hat and W_hat share one allocation so that the backward state is a single tensor
    n_rows = 1 if dur_tr else 2
    saved = torch.empty((n_rows, B, T + 1, C), device=dev, dtype=torch.float32) if full else None
    has_ps, has_pe = proj_start is not None, proj_end is not None
    if kind == "dur":
        alpha_hat = saved[0] if full else torch.empty((B, R, C), device=dev, dtype=torch.float32)
        _fwd_duration_tr_kernel[grid](
            cum_scores, transition, duration_bias, lengths, ps, pe, alpha_hat, frames, bpk, bpc,
            out, last, ck32, ck64, C, K_eff, R, T1 * C, s_p_b, R * C, R, (T + 1) * C, delta, nck,
            C_PAD=c_pad, IS_MAX=is_max, HAS_PS=has_ps, HAS_PE=has_pe, CKPT=ckpt, num_warps=num_warps,
        )
    elif kind == "reg":
        dummy = torch.empty((1,), device=dev, dtype=torch.float32)
        k_pad = max(2, _next_pow2(K_eff))
        ck_mode = full or ckpt
        flags = 0
        if full:
            # the save-all forward runs the checkpointing kernel (same compiled code), from an
            # initial-state checkpoint
            n32, n64 = _ckpt_sizes(kind, C, K_eff)
            ck32 = torch.empty((B, 1, n32), device=dev, dtype=torch.float32)
            ck64 = torch.empty((B, 1, n64), device=dev, dtype=torch.float64)
            flags = 2 | 4
        elif ckpt:
            flags = 1 | 4
        if ck_mode:
            _init_reg_checkpoint(ck32, ck64, C, c_pad, k_pad)
        f_out = frames if full else torch.empty((1,), device=dev, dtype=torch.float64)
        _fwd_factored_reg_kernel[grid](
            cum_scores, transition, duration_bias, lengths, ps, pe,
            saved[1] if full else dummy, saved[0] if full else dummy, f_out, bpk, out, last, ck32, ck64,
            C, K_eff, T1 * C, s_p_b, T1 * C, T1, (T + 1) * C, delta if ckpt else max(T, 1),
            ck32.shape[1] if ck_mode else 1, max(T, 1), flags, c_pad, k_pad * c_pad + c_pad,
            C_PAD=c_pad, K_PAD=k_pad, IS_MAX=is_max, HAS_PS=has_ps,
            HAS_PE=has_pe, STORE=ck_mode, REBASE=REBASE, CK_MODE=ck_mode, num_warps=num_warps,
        )
    else:
        w_hat = saved[1] if full else torch.empty((B, R, C), device=dev, dtype=torch.float32)
        alpha_hat = saved[0] if full else torch.empty((1,), device=dev, dtype=torch.float32)
        _fwd_factored_kernel[grid](
            cum_scores, transition, duration_bias, lengths, ps, pe, w_hat, alpha_hat, frames,
            bpk, bpc, out, last, ck32, ck64, C, K_eff, R, T1 * C, s_p_b, R * C, (T + 1) * C, R,
            (T + 1) * C, delta, nck,
            C_PAD=c_pad, K_BLOCK=k_block, IS_MAX=is_max, HAS_PS=has_ps,
            HAS_PE=has_pe, STORE_ALPHA=full, CKPT=ckpt, num_warps=num_warps,
        )
    if full:
        state = (saved, frames, 1)
    elif ckpt:
        state = (ck32, ck64, delta)
    else:
        state = None
    return out, state, (bpk, bpc, last, K_eff, dur_tr, packed)


def recompute_forward_state(cum_scores, transition, duration_bias, lengths, K, ck32, ck64, delta,
                            proj_start=None, proj_end=None, num_warps=None):
    """Every position's forward state, recomputed from the checkpoints of a ``save_for_backward``
    forward: one program per (sequence, checkpoint interval) restores its checkpoint and reruns
    the forward recurrence over its interval, with the same kernel, operations and order as the
    forward (so the values are the forward's own, bitwise; pass the forward's ``num_warps``).

    Returns ``(saved, frames)``: ``saved`` (2, B, T+1, C) float32 ``alpha_hat`` and ``U_hat``
    ((1, B, T+1, C), ``alpha_hat`` only, for (K, C, C) transitions), ``frames`` (B, T+1) float64,
    the layout the backward kernels read. Positions past a sequence's length are not written.
    """
    cum_scores = cum_scores.contiguous()
    transition = transition.contiguous()
    duration_bias = duration_bias.contiguous()
    proj_start = _contig(proj_start)
    proj_end = _contig(proj_end)
    lengths = lengths.to(device=cum_scores.device, dtype=torch.int64).contiguous()
    B, T1, C = cum_scores.shape
    T = T1 - 1
    dev = cum_scores.device
    K_eff = max(1, min(int(K), T))
    dur_tr = transition.dim() == 3
    if num_warps is None:
        num_warps = auto_num_warps(B, C, K_eff, dur_tr, "log")
    c_pad, k_block = _tile_sizes(C, K_eff)
    kind = _kernel_kind(B, C, K_eff, num_warps, dur_tr)
    nck = ck32.shape[1]
    if tuple(ck32.shape) != (B, nck, _ckpt_sizes(kind, C, K_eff)[0]) or nck != -(-T // int(delta)):
        raise ValueError("checkpoints do not match these inputs (same K, num_warps and interval as the forward?)")
    saved = torch.empty((1 if dur_tr else 2, B, T1, C), device=dev, dtype=torch.float32)
    frames = torch.empty((B, T1), device=dev, dtype=torch.float64)
    ps = proj_start if proj_start is not None else cum_scores
    pe = proj_end if proj_end is not None else cum_scores
    i32 = torch.empty((1,), device=dev, dtype=torch.int32)
    out = torch.empty((1,), device=dev, dtype=torch.float64)
    has_ps, has_pe = proj_start is not None, proj_end is not None
    grid = (B, nck)
    if kind == "dur":
        _fwd_duration_tr_kernel[grid](
            cum_scores, transition, duration_bias, lengths, ps, pe, saved[0], frames, i32, i32,
            out, i32, ck32, ck64, C, K_eff, T1, T1 * C, T * C, T1 * C, T1, 0, int(delta), nck,
            C_PAD=c_pad, IS_MAX=False, HAS_PS=has_ps, HAS_PE=has_pe, RESTORE=True, num_warps=num_warps,
        )
    elif kind == "reg":
        # the forward's own compiled kernel (CK_MODE): only the runtime range and flags differ
        _fwd_factored_reg_kernel[grid](
            cum_scores, transition, duration_bias, lengths, ps, pe, saved[1], saved[0], frames, i32,
            out, i32, ck32, ck64, C, K_eff, T1 * C, T * C, T1 * C, T1, T1 * C, int(delta), nck,
            int(delta), 2, c_pad, max(2, _next_pow2(K_eff)) * c_pad + c_pad,
            C_PAD=c_pad, K_PAD=max(2, _next_pow2(K_eff)), IS_MAX=False, HAS_PS=has_ps,
            HAS_PE=has_pe, STORE=True, REBASE=REBASE, CK_MODE=True, num_warps=num_warps,
        )
    else:
        _fwd_factored_kernel[grid](
            cum_scores, transition, duration_bias, lengths, ps, pe, saved[1], saved[0], frames,
            i32, i32, out, i32, ck32, ck64, C, K_eff, T1, T1 * C, T * C, T1 * C, T1 * C, T1, 0,
            int(delta), nck,
            C_PAD=c_pad, K_BLOCK=k_block, IS_MAX=False, HAS_PS=has_ps,
            HAS_PE=has_pe, STORE_ALPHA=True, RESTORE=True, num_warps=num_warps,
        )
    return saved, frames


def launch_streaming_triton_kernel(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths: torch.Tensor,
    K: int,
    semiring: str = "log",
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
    checkpoint_interval: Optional[int] = None,
    num_warps: Optional[int] = None,
    save_for_backward: bool = True,
):
    """Partition (log semiring) or best score (max semiring) of a batch, on the GPU.

    Inputs must already be validated by ``validate_streaming_inputs``.

    Args:
        cum_scores: (B, T+1, C) float32/float64 cumulative scores, ``cum_scores[:, 0] = 0``.
        transition: (C, C) or (K, C, C) transition scores.
        duration_bias: (K, C).
        lengths: (B,) integer lengths in [1, T].
        K: maximum segment duration.
        semiring: "log" (log Z) or "max" (Viterbi score).
        proj_start, proj_end: optional (B, T, C) boundary scores.
        checkpoint_interval: positions between checkpoints (default ``max(K, sqrt(T·K))``, clamped
            to [1, T]); honoured with ``save_for_backward``.
        num_warps: warps per program (one program per sequence); None picks by size
            (:func:`auto_num_warps`).
        save_for_backward: keep what ``launch_streaming_triton_backward`` needs (log semiring).

    Returns:
        ``(partition (B,) in the input dtype, ring_checkpoints, checkpoint_interval,
        log_norm_checkpoints)``. With ``save_for_backward`` (log semiring) the forward saves, at
        every position ``i·checkpoint_interval < L``, the state its kernel needs to restart
        exactly there: ``ring_checkpoints`` (B, n, n32) float32 (the last K ring rows and
        ``alpha_hat``) and ``log_norm_checkpoints`` (B, n, n64) float64 (their frames), with
        ``n = ceil(T / checkpoint_interval)``: O((T / interval)·K·C) per sequence. Both are None
        for the max semiring or without ``save_for_backward``. Pass all four, and the same
        ``num_warps``, to ``launch_streaming_triton_backward``, which recomputes every position
        from them (:func:`recompute_forward_state`).

    Example:
        >>> logZ, state, _, _ = launch_streaming_triton_kernel(S, tr, db, lengths, K)  # doctest: +SKIP
    """
    out, saved, _ = _forward_impl(cum_scores, transition, duration_bias, lengths, K, semiring,
                                  proj_start, proj_end, num_warps, save_for_backward, checkpoint_interval)
    out = public_score(out).to(cum_scores.dtype)
    if saved is None:
        T = cum_scores.shape[1] - 1
        return out, None, _resolve_interval(T, max(1, min(int(K), T)), checkpoint_interval), None
    ck32, ck64, delta = saved
    return out, ck32, delta, ck64


def launch_streaming_triton_viterbi(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths: torch.Tensor,
    K: int,
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
    num_warps: Optional[int] = None,
):
    """Best segmentation of each sequence (max semiring forward + on-GPU traceback).

    Ties break toward the smallest index: the smallest source label in ``u_s``, the smallest
    duration in ``alpha_t`` (for (K, C, C) transitions the lexicographically smallest (k, c')),
    and the smallest final label.

    Returns:
        ``(scores (B,) in the input dtype, labels (B, T) int64 with -1 past each length,
        seg_starts (B, T) bool, True where a segment starts)``.

    Example:
        >>> scores, labels, starts = launch_streaming_triton_viterbi(S, tr, db, lengths, K)  # doctest: +SKIP
    """
    out, _, (bpk, bpc, last, K_eff, dur_tr, packed) = _forward_impl(
        cum_scores, transition, duration_bias, lengths, K, "max", proj_start, proj_end, num_warps, False)
    B, T1, C = cum_scores.shape
    T = T1 - 1
    labels = torch.empty((B, T), device=cum_scores.device, dtype=torch.int64)
    starts = torch.empty((B, T), device=cum_scores.device, dtype=torch.bool)
    lengths = lengths.to(device=cum_scores.device, dtype=torch.int64)
    # an infeasible sequence has no segmentation to trace: length 0 writes labels -1, no starts
    lengths = torch.where(feasible(out), lengths, torch.zeros_like(lengths)).contiguous()
    _traceback_kernel[(B,)](
        bpk, bpc, last, lengths, labels, starts.view(torch.int8), C, T, (T + 1) * C,
        BP_C_AT_END=dur_tr, PACKED=packed, K_BLOCK=max(2, min(128, _next_pow2(K_eff))),
        FILL_BLOCK=min(1024, max(32, _next_pow2(T))), num_warps=1,
    )
    return public_score(out).to(cum_scores.dtype), labels, starts
