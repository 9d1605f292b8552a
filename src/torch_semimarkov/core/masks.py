"""Partial labels: the checks of ``label_mask`` / ``boundary_mask`` and their form as segment limits
(the earliest allowed start and latest allowed end of a segment per position and label).
"""

from __future__ import annotations


import torch



def _block_scan(x: torch.Tensor, K: int, fill: int, reverse: bool) -> torch.Tensor:
    """Running max (``reverse``: running min from the right) of ``x`` (B, T, ...) along time,
    exact wherever it differs from ``fill`` within K positions: blocks of K' >= K positions are
    scanned on their own (K' sequential steps, every block and column in parallel) and then take
    the neighbouring block's total. ``torch.cummax`` over the whole axis would run T dependent
    steps per column, slow on the GPU when T is long and B·C small."""
    B, T = x.shape[:2]
    blk = max(int(K), 32)
    n = -(-T // blk)
    pad = n * blk - T
    if reverse:
        x = torch.flip(x, (1,))
    if pad:
        x = torch.cat([x, x.new_full((B, pad) + x.shape[2:], fill)], 1)
    y = x.view((B, n, blk) + x.shape[2:])
    inner = (torch.cummin(y, 2) if reverse else torch.cummax(y, 2)).values
    prev = torch.cat([inner.new_full((B, 1) + inner.shape[3:], fill), inner[:, :-1, -1]], 1)
    out = (torch.minimum if reverse else torch.maximum)(inner, prev[:, :, None])
    out = out.reshape((B, n * blk) + x.shape[2:])[:, :T]
    return torch.flip(out, (1,)) if reverse else out


def segment_limits(label_mask, boundary_mask, B: int, T: int, C: int, K: int, device):
    """The masks as per-(position, label) limits of the allowed segments (the PyTorch path's
    form; the engine's kernels read the same limits from :func:`~torch_semimarkov.engines.triton.limits.engine_limits`,
    one kernel with per-position flags): a segment ``[s, e)`` of label c with ``e - s <= K`` is allowed iff
    ``min_start[e, c] <= s`` (equivalently ``e <= max_end[s, c]``) and ``s`` is not a forbidden
    start. (The limits are exact within K positions of their index; farther values only ever
    concern segments longer than K.)

    Returns ``(min_start, max_end)`` (B, T+1, C) int32 and ``forbidden_start`` (B, T) bool or None.
    """
    ms = torch.zeros(B, T + 1, C, dtype=torch.int32, device=device)
    me = torch.full((B, T + 1, C), T, dtype=torch.int32, device=device)
    pos = torch.arange(T, device=device, dtype=torch.int32)
    if label_mask is not None:
        # end e: one past the last forbidden position before e; start s: the first forbidden one at or after s
        ms[:, 1:] = _block_scan(torch.where(label_mask, 0, pos[None, :, None] + 1), K, 0, False)
        me[:, :T] = _block_scan(torch.where(label_mask, T, pos[None, :, None]), K, T, True)
    forbidden = None
    if boundary_mask is not None:
        forced = boundary_mask == 1
        # no segment may straddle a forced start: end e starts at or after the last one before e,
        # start s ends at or before the first one after s
        last = _block_scan(torch.where(forced, pos[None, :], 0), K, 0, False)
        ms[:, 1:] = torch.maximum(ms[:, 1:], last[..., None])
        first = _block_scan(torch.where(forced, pos[None, :], T), K, T, True)
        after = torch.cat([first[:, 1:], torch.full_like(first[:, :1], T)], 1)
        me[:, :T] = torch.minimum(me[:, :T], after[..., None])
        forbidden = boundary_mask == -1
    return ms, me, forbidden
