"""Segments and per-position labels, and conversion between them.

A :class:`Segment` covers positions ``start .. end-1`` (``end`` exclusive) with one label. A
segmentation of a sequence of length L is a list of segments in order that tiles ``0 .. L-1``.
"""

from __future__ import annotations

import itertools
from typing import List, NamedTuple, Optional, Sequence

import numpy as np
import torch


class Segment(NamedTuple):
    """One segment: positions ``start .. end-1`` carry ``label``."""

    start: int
    end: int
    label: int

    @property
    def duration(self) -> int:
        return self.end - self.start


def segments_from_boundaries(labels: np.ndarray, starts: np.ndarray, length: int) -> List[Segment]:
    """Segments of one sequence from its per-position labels and segment-start flags.

    Args:
        labels: (T,) integer labels; only ``labels[:length]`` is read.
        starts: (T,) bool, True where a segment starts; ``starts[0]`` must be True.
        length: the sequence length L.
    """
    begin = np.flatnonzero(starts[:length])
    end = np.append(begin[1:], length)
    lab = labels[begin]
    # built in C (tuple.__new__ skips the named tuple's Python-level __new__) from Python ints
    # (tolist): a sequence of 10^6 positions can have ~10^5 segments, and a per-segment Python
    # call would cost more than decoding
    rows = zip(begin.tolist(), end.tolist(), lab.tolist())
    return list(map(tuple.__new__, itertools.repeat(Segment, len(begin)), rows))


def segment_tensors(labels: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor):
    """Segments of a batch as flat tensors, on the device of ``labels``, without a Python loop.

    Args:
        labels: (B, T) long per-position labels (-1 past each length).
        starts: (B, T) bool, True where a segment starts (all False for a sequence with no
            segmentation).
        lengths: (B,) lengths.

    Returns:
        ``(segment_starts, segment_ends, segment_labels, segment_offsets)``: the first three (N,)
        long, ends exclusive, concatenated over the batch in order; ``segment_offsets`` (B+1,) long,
        sequence b owns ``[offsets[b], offsets[b+1])``.

    Example:
        >>> lab = torch.tensor([[0, 0, 1, -1], [2, 2, 2, 2]])
        >>> st = torch.tensor([[True, False, True, False], [True, False, True, False]])
        >>> s, e, c, o = segment_tensors(lab, st, torch.tensor([3, 4]))
        >>> s.tolist(), e.tolist(), c.tolist(), o.tolist()
        ([0, 2, 0, 2], [2, 3, 2, 4], [0, 1, 2, 2], [0, 2, 4])
    """
    B, T = labels.shape
    dev = labels.device
    lengths = lengths.to(device=dev, dtype=torch.long)
    valid = torch.arange(T, device=dev)[None, :] < lengths[:, None]
    flags = starts.bool() & valid
    # a segment ends where the next one of its sequence starts, the last one at the length: for
    # every position the first start after it (or the length), by a reversed running minimum over
    # (B, T). Only static shapes before the nonzero, nothing sliced after it, so that torch.export
    # can trace this with a data-dependent number of segments.
    idx = torch.arange(T, device=dev)[None, :].expand(B, T)
    cand = torch.where(flags, idx, lengths[:, None].expand(B, T))
    after = torch.cat([cand[:, 1:], lengths[:, None]], dim=1)
    next_start = torch.flip(torch.cummin(torch.flip(after, [1]), dim=1).values, [1])
    b, s = flags.nonzero(as_tuple=True)
    # b is sorted (row-major order): sequence k's segments begin at the first index with b >= k
    offsets = torch.searchsorted(b, torch.arange(B + 1, device=dev, dtype=b.dtype))
    return s, next_start[b, s], labels[b, s], offsets


def segment_lists(starts: torch.Tensor, ends: torch.Tensor, seg_labels: torch.Tensor,
                  offsets: torch.Tensor) -> List[List[Segment]]:
    """Python lists of :class:`Segment` per sequence from :func:`segment_tensors`' output (one
    device-to-host transfer)."""
    host = torch.stack([starts, ends, seg_labels]).cpu().numpy() if starts.numel() else np.zeros((3, 0), np.int64)
    off = offsets.cpu().tolist()
    out = []
    for b in range(len(off) - 1):
        rows = zip(*(host[:, off[b]:off[b + 1]].tolist()))
        out.append(list(map(tuple.__new__, itertools.repeat(Segment, off[b + 1] - off[b]), rows)))
    return out


def labels_to_segments(labels: torch.Tensor, lengths: Optional[torch.Tensor] = None) -> List[List[Segment]]:
    """Split per-position labels into segments: each maximal run of one label is one segment.

    Note that two adjacent segments with the same label cannot be told apart from labels alone;
    use the ``segments`` returned by :func:`semi_crf_streaming_viterbi` when that matters.

    Args:
        labels: (B, T) or (T,) integer labels. Positions at or past a sequence's length are ignored.
        lengths: (B,) lengths; default: the whole row, or up to the first negative label.

    Returns:
        For each sequence, its list of :class:`Segment` in order.

    Example:
        >>> labels_to_segments(torch.tensor([[0, 0, 2, 2, 2, 1]]))
        [[Segment(start=0, end=2, label=0), Segment(start=2, end=5, label=2), Segment(start=5, end=6, label=1)]]
    """
    lab = torch.as_tensor(labels)
    if lab.dim() == 1:
        lab = lab[None]
    if lab.dim() != 2:
        raise ValueError(f"labels must have shape (batch, T) or (T,), got {tuple(lab.shape)}")
    lab = lab.detach().cpu().numpy()
    B, T = lab.shape
    if lengths is None:
        lens = [int(np.argmax(row < 0)) if (row < 0).any() else T for row in lab]
    else:
        lens = [int(x) for x in torch.as_tensor(lengths).reshape(-1).tolist()]
        if len(lens) != B:
            raise ValueError(f"lengths must have shape ({B},), got {len(lens)} values")
        bad = [L for L in lens if not 0 <= L <= T]
        if bad:
            raise ValueError(f"lengths must lie in [0, T] = [0, {T}] for labels of width T = {T}, got {bad[0]}")
    out = []
    for b in range(B):
        L = lens[b]
        row = lab[b, :L]
        if L == 0:
            out.append([])
            continue
        if (row < 0).any():
            raise ValueError(f"labels of sequence {b} are negative before its length {L}")
        starts = np.ones(L, dtype=bool)
        starts[1:] = row[1:] != row[:-1]
        out.append(segments_from_boundaries(row, starts, L))
    return out


def segments_to_labels(
    segments: Sequence[Sequence[Segment]], T: Optional[int] = None, fill_value: int = -1
) -> torch.Tensor:
    """Per-position labels (B, T) from segment lists; positions not covered get ``fill_value``.

    Example:
        >>> segments_to_labels([[Segment(0, 2, 1), Segment(2, 3, 0)]], T=4)
        tensor([[ 1,  1,  0, -1]])
    """
    if T is None:
        T = max((seg[-1][1] for seg in segments if len(seg)), default=0)
    out = torch.full((len(segments), T), fill_value, dtype=torch.long)
    for b, segs in enumerate(segments):
        for s, e, c in segs:
            if not 0 <= s < e <= T:
                raise ValueError(f"segment {(s, e, c)} of sequence {b} does not lie in [0, {T})")
            out[b, s:e] = c
    return out


class SegmentTensorsMixin:
    """``segments`` and ``num_segments`` of a result that holds ``labels`` (*lead, T) and the
    segment tensors with ``segment_offsets`` (prod(lead) + 1,) (``ViterbiResult``, the k-best
    lists and the samples). Needs a ``_segments`` attribute, None until first access."""

    __slots__ = ()

    @property
    def segments(self) -> List[List[Segment]]:
        """Python lists of :class:`Segment`, one per flattened row (built on first access: one
        device-to-host transfer and a Python object per segment, so prefer the tensors)."""
        if self._segments is None:
            self._segments = segment_lists(self.segment_starts, self.segment_ends, self.segment_labels,
                                           self.segment_offsets)
        return self._segments

    @property
    def num_segments(self) -> torch.Tensor:
        """Long tensor of the leading shape (``labels.shape[:-1]``): the number of segments of
        each segmentation."""
        return self.segment_offsets.diff().reshape(self.labels.shape[:-1])
