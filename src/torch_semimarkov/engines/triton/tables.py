"""The blocked engine's duration tables in one launch.

``parallel.linear_duration_tables`` builds the tables of the linear-space block sums and of the
marginal tiles from PyTorch operations: 43 small launches, ~0.7 ms of the host before the first
kernel of a call can start (and the linear sums' period, ``parallel.dense_durations``, three more
and a synchronisation). :func:`duration_tables` makes the same tables (bitwise, without the trend)
and the per-label test of ``dense_durations`` in one kernel, so that the period costs one small
read instead of its own reductions (GPU_NOTES 97).
"""

from __future__ import annotations

import torch

from torch_semimarkov.engines.triton.common import HAS_TRITON, tl, triton
from torch_semimarkov.engines.triton.plan import table_tiles

if HAS_TRITON:
    _INF = tl.constexpr(float("inf"))
    _NEG_INF = tl.constexpr(float("-inf"))

    @triton.jit
    def _duration_tables_kernel(
        db_ptr, ed_ptr, kr_ptr,
        C, K, ROWS, s_db, SPREAD,
        C_PAD: tl.constexpr, CB: tl.constexpr, KB: tl.constexpr,
    ):
        """One program per CB labels and KB rows of ED. ``ed_ptr`` (ROWS + 2, C_PAD) float32: rows 0..ROWS-1
        ``exp(D - MD)`` (zero where impossible, past K and on padded labels), row ROWS ``MD``, row
        ROWS + 1 the trend (0); ``kr_ptr`` (5, C_PAD) int32: the first and last possible duration
        (K + 1, 0 where none is), the shared residue modulo 3 (-1 where none), the recomputation
        counter (0) and, in row 4, whether the label's bias is dense (``dense_durations``: every
        duration possible and a spread of at most SPREAD nats; 1 on padded labels)."""
        c = tl.program_id(0) * CB + tl.arange(0, CB)
        lab = c < C
        r = tl.arange(0, KB)
        # per (row slot, label) running statistics over the K durations, reduced once at the end
        # (a reduction over rows a step would put a cross-warp round on every step)
        md = tl.full((KB, CB), _NEG_INF, tl.float64)
        lo = tl.full((KB, CB), _INF, db_ptr.dtype.element_ty)
        hi = tl.full((KB, CB), _NEG_INF, db_ptr.dtype.element_ty)
        kmin = tl.full((KB, CB), K + 1, tl.int32)
        kmax = tl.zeros((KB, CB), tl.int32)
        h0 = tl.zeros((KB, CB), tl.int32)
        h1 = tl.zeros((KB, CB), tl.int32)
        h2 = tl.zeros((KB, CB), tl.int32)
        for k0 in range(0, K, KB):
            row = k0 + r
            inb = (row < K)[:, None] & lab[None, :]
            d = tl.load(db_ptr + row[:, None] * s_db + c[None, :], mask=inb, other=0.0)
            lo = tl.where(inb, tl.minimum(lo, d), lo)
            hi = tl.where(inb, tl.maximum(hi, d), hi)
            d64 = d.to(tl.float64)
            fin = inb & (d64 > -1e29)
            md = tl.where(fin, tl.maximum(md, d64), md)
            k = (row + 1)[:, None]
            kmin = tl.where(fin, tl.minimum(kmin, k), kmin)
            kmax = tl.where(fin, tl.maximum(kmax, k), kmax)
            m3 = k % 3
            h0 = tl.where(fin & (m3 == 0), 1, h0)
            h1 = tl.where(fin & (m3 == 1), 1, h1)
            h2 = tl.where(fin & (m3 == 2), 1, h2)
        md1 = tl.max(md, 0)
        md1 = tl.where(md1 > _NEG_INF, md1, 0.0)
        cw = c < C_PAD
        # this program's block of ED rows
        row = tl.program_id(1) * KB + r
        inb = (row < K)[:, None] & lab[None, :]
        d = tl.load(db_ptr + row[:, None] * s_db + c[None, :], mask=inb, other=0.0).to(tl.float64)
        fin = inb & (d > -1e29)
        e = tl.where(fin, tl.exp(tl.where(fin, d - md1[None, :], 0.0)), 0.0)
        tl.store(ed_ptr + row[:, None] * C_PAD + c[None, :], e.to(tl.float32), mask=(row < ROWS)[:, None] & cw[None, :])
        if tl.program_id(1) == 0:
            lo1, hi1 = tl.min(lo, 0), tl.max(hi, 0)
            one = (tl.max(h0, 0) + tl.max(h1, 0) + tl.max(h2, 0)) == 1
            res = tl.where(one, tl.where(tl.max(h0, 0) == 1, 0, tl.where(tl.max(h1, 0) == 1, 1, 2)), -1)
            dense = tl.where(lab, ((lo1 > -1e29) & (hi1 - lo1 <= SPREAD)).to(tl.int32), 1)
            tl.store(kr_ptr + c, tl.min(kmin, 0), mask=cw)
            tl.store(kr_ptr + C_PAD + c, tl.max(kmax, 0), mask=cw)
            tl.store(kr_ptr + 2 * C_PAD + c, res, mask=cw)
            tl.store(kr_ptr + 3 * C_PAD + c, tl.zeros((CB,), tl.int32), mask=cw)
            tl.store(kr_ptr + 4 * C_PAD + c, dense, mask=cw)
            tl.store(ed_ptr + ROWS * C_PAD + c, md1.to(tl.float32), mask=cw)
            tl.store(ed_ptr + (ROWS + 1) * C_PAD + c, tl.zeros((CB,), tl.float32), mask=cw)


def duration_tables(duration_bias: torch.Tensor, K: int, c_pad: int, pad: int, spread: float):
    """``(ED, MD, ranges, dense)``: the tables of ``parallel.linear_duration_tables`` without the
    trend, ``ED`` (K + pad, c_pad) float32, ``MD`` (2, c_pad) float32, ``ranges`` (4, c_pad)
    int32, from one kernel, and ``dense`` (c_pad,) int32: 1 where the label passes
    ``parallel.dense_durations``' test with ``spread`` (padded labels 1), read by the caller.

    ``duration_bias`` (>= K, C) on the device of a Triton engine (CUDA, or the interpreter)."""
    C = duration_bias.shape[1]
    dev = duration_bias.device
    db = duration_bias if duration_bias.stride(1) == 1 else duration_bias.contiguous()
    rows = K + pad
    ed = torch.empty((rows + 2, c_pad), device=dev, dtype=torch.float32)
    kr = torch.empty((5, c_pad), device=dev, dtype=torch.int32)
    cb, kb, warps = table_tiles(K, c_pad)
    # a program per (label tile, block of KB rows of ED), each with the labels' statistics over K
    _duration_tables_kernel[(triton.cdiv(c_pad, cb), triton.cdiv(rows, kb))](
        db, ed, kr, C, K, rows, db.stride(0), float(spread), C_PAD=c_pad, CB=cb, KB=kb, num_warps=warps)
    return ed[:rows], ed[rows:], kr[:4], kr[4]
