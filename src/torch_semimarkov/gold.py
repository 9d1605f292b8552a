"""The score of a given (gold) segmentation, with exactly the terms of the partition function.

A segmentation is represented by two (B, T) tensors: ``labels`` (the label of each position, 0 past
the sequence's length) and ``starts`` (True where a segment starts). Its score is the sum over its
segments (s, k, c) with predecessor label c' of (ALGORITHM.md §1)

    S[s+k, c] - S[s, c] + D[k-1, c] + ps[s, c] + pe[s+k-1, c] + Tr[c', c]

where the first segment's transition term is the phantom ``logsumexp_{c'} Tr[c', c]`` (for
duration-dependent transitions ``logsumexp_{c'} Tr[k-1, c', c]``). With these conventions
``exp(gold_score - log Z)`` is the segmentation's probability under the model, so the negative
log-likelihood ``log Z - gold_score`` is never negative.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from .streaming.constants import NEG_INF

__all__ = ["labels_to_starts", "segments_to_starts", "gold_score"]


def _valid_mask(lengths: torch.Tensor, T: int) -> torch.Tensor:
    # shape: (B, T) -- True at positions inside each sequence
    return torch.arange(T, device=lengths.device)[None, :] < lengths[:, None]


def labels_to_starts(
    labels: torch.Tensor,
    lengths: torch.Tensor,
    num_classes: int,
    max_duration: int,
    ignore_index: int = -100,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Validate per-position labels and turn them into (labels, segment starts).

    Each maximal run of one label is one segment. A run longer than ``max_duration`` (K) is split
    into consecutive pieces of K positions (the last piece holds the remainder), joined by the
    same-label transition ``Tr[c, c]``.

    Args:
        labels: (B, T) integer labels in [0, C) at positions < length and ``ignore_index`` after.
        lengths: (B,) sequence lengths.
        num_classes: C.
        max_duration: K.
        ignore_index: the padding label expected past each sequence's length.

    Returns:
        ``labels`` (B, T) long with 0 past the length, and ``starts`` (B, T) bool.

    Raises:
        ValueError: wrong shape or dtype, a label out of [0, C) inside a sequence, or a label other
            than ``ignore_index`` past a sequence's length.

    Example:
        >>> lab, st = labels_to_starts(torch.tensor([[1, 1, 1, 0, -100]]), torch.tensor([4]), 2, 2)
        >>> st.int().tolist()
        [[1, 0, 1, 1, 0]]
    """
    if not isinstance(labels, torch.Tensor):
        labels = torch.as_tensor(labels)
    B = lengths.shape[0]
    if labels.dim() != 2 or labels.shape[0] != B:
        raise ValueError(f"labels must have shape (batch, T) = ({B}, T), got {tuple(labels.shape)}")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.is_complex():
        raise ValueError(f"labels must hold integers, got dtype {labels.dtype}")
    T = labels.shape[1]
    labels = labels.to(device=lengths.device, dtype=torch.long)
    valid = _valid_mask(lengths, T)
    bad_inside = valid & ((labels < 0) | (labels >= num_classes))
    if bool(bad_inside.any()):
        b, t = (int(i) for i in bad_inside.nonzero()[0])
        raise ValueError(
            f"labels must lie in [0, {num_classes}) inside each sequence; sequence {b} has label "
            f"{int(labels[b, t])} at position {t} < length {int(lengths[b])}"
        )
    bad_outside = (~valid) & (labels != ignore_index)
    if bool(bad_outside.any()):
        b, t = (int(i) for i in bad_outside.nonzero()[0])
        raise ValueError(
            f"labels past a sequence's length must be ignore_index={ignore_index}; sequence {b} has "
            f"label {int(labels[b, t])} at position {t} >= length {int(lengths[b])} "
            "(are the lengths right?)"
        )
    labels = torch.where(valid, labels, torch.zeros_like(labels))
    idx = torch.arange(T, device=labels.device).expand(B, T)
    change = torch.ones_like(valid)
    change[:, 1:] = labels[:, 1:] != labels[:, :-1]
    # position of each t inside its run of equal labels
    run_start = torch.cummax(torch.where(change, idx, torch.zeros_like(idx)), dim=1).values
    pos_in_run = idx - run_start
    starts = valid & (pos_in_run % max_duration == 0)
    return labels, starts


def segments_to_starts(
    segments: Sequence[Sequence[Sequence[int]]],
    lengths: torch.Tensor,
    T: int,
    num_classes: int,
    max_duration: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Validate explicit segmentations and turn them into (labels, starts) tensors.

    Args:
        segments: for each sequence, its segments ``(start, end, label)`` (end exclusive) in order,
            tiling ``0 .. length-1`` with durations in [1, K]. Adjacent segments may share a label.
        lengths: (B,) sequence lengths.
        T: padded length.
        num_classes: C.
        max_duration: K.

    Returns:
        ``labels`` (B, T) long (0 past the length) and ``starts`` (B, T) bool.
    """
    B = lengths.shape[0]
    if len(segments) != B:
        raise ValueError(f"segments must hold one list per sequence ({B}), got {len(segments)}")
    labels = torch.zeros(B, T, dtype=torch.long)
    starts = torch.zeros(B, T, dtype=torch.bool)
    lens = lengths.tolist()
    for b, segs in enumerate(segments):
        pos = 0
        for seg in segs:
            s, e, c = (int(v) for v in seg)
            if s != pos:
                raise ValueError(f"segments of sequence {b} must tile [0, length) in order; got a segment starting at {s}, expected {pos}")
            if not 1 <= e - s <= max_duration:
                raise ValueError(f"segment {(s, e, c)} of sequence {b} has duration {e - s}, not in [1, K={max_duration}]")
            if not 0 <= c < num_classes:
                raise ValueError(f"segment {(s, e, c)} of sequence {b} has label {c}, not in [0, {num_classes})")
            labels[b, s:min(e, T)] = c
            starts[b, min(s, T - 1)] = True
            pos = e
        if pos != lens[b]:
            raise ValueError(f"segments of sequence {b} cover [0, {pos}) but its length is {lens[b]}")
    return labels.to(lengths.device), starts.to(lengths.device)


def gold_score(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths: torch.Tensor,
    labels: torch.Tensor,
    starts: torch.Tensor,
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Score of one segmentation per sequence, with the partition's terms and conventions.

    Args:
        cum_scores: (B, T+1, C) cumulative per-position scores, ``cum_scores[:, 0] = 0``.
        transition: (C, C) ``[c_src, c_dst]`` or (K, C, C) indexed ``[k-1]``; ``-inf`` allowed.
        duration_bias: (K, C) indexed ``[k-1, c]``.
        lengths: (B,) sequence lengths.
        labels: (B, T) long, the label of each position (anything past the length).
        starts: (B, T) bool, True where a segment starts (``starts[:, 0]`` True); durations <= K.
        proj_start, proj_end: optional (B, T, C) boundary scores.

    Returns:
        (B,) segmentation scores, differentiable in every score tensor.

    Example:
        >>> S = torch.zeros(1, 4, 2); S[0, 1:, 1] = torch.tensor([1.0, 2.0, 3.0])
        >>> tr, db = torch.zeros(2, 2), torch.zeros(3, 2)
        >>> gold_score(S, tr, db, torch.tensor([3]), torch.tensor([[1, 1, 1]]), torch.tensor([[True, False, False]]))
        tensor([3.6931])
    """
    B, T1, C = cum_scores.shape
    T = T1 - 1
    K = duration_bias.shape[0]
    dtype = cum_scores.dtype
    transition = transition.to(dtype).clamp(min=NEG_INF)
    duration_bias = duration_bias.to(dtype).clamp(min=NEG_INF)
    lengths = lengths.to(device=cum_scores.device, dtype=torch.long)
    labels = labels.to(cum_scores.device)
    valid = _valid_mask(lengths, T)
    starts = starts.to(cum_scores.device) & valid
    zero = cum_scores.new_zeros(())

    # a segment's last position e: the next position starts a segment or is past the length
    next_start = torch.ones_like(starts)
    next_start[:, :-1] = starts[:, 1:] | ~valid[:, 1:]
    ends = valid & next_start

    y = labels.clamp(0, C - 1)
    # content: sum over segments of S[e+1, c] - S[s, c]
    s_hi = cum_scores[:, 1:].gather(2, y[..., None]).squeeze(-1)
    s_lo = cum_scores[:, :-1].gather(2, y[..., None]).squeeze(-1)
    score = torch.where(ends, s_hi, zero).sum(1) - torch.where(starts, s_lo, zero).sum(1)

    # duration of the segment that starts at each start position
    seg_id = (torch.cumsum(starts.long(), dim=1) - 1).clamp(min=0)
    seg_len = torch.zeros(B, T, dtype=torch.long, device=cum_scores.device)
    seg_len.scatter_add_(1, seg_id, valid.long())
    k = seg_len.gather(1, seg_id)
    k_idx = (k - 1).clamp(0, K - 1)
    dur = duration_bias[k_idx, y]
    score = score + torch.where(starts, dur, zero).sum(1)

    if proj_start is not None:
        ps = proj_start.to(dtype).gather(2, y[..., None]).squeeze(-1)
        score = score + torch.where(starts, ps, zero).sum(1)
    if proj_end is not None:
        pe = proj_end.to(dtype).gather(2, y[..., None]).squeeze(-1)
        score = score + torch.where(ends, pe, zero).sum(1)

    y_prev = torch.zeros_like(y)
    y_prev[:, 1:] = y[:, :-1]
    first = torch.zeros_like(starts)
    first[:, 0] = True
    if transition.dim() == 2:
        tr = transition[y_prev, y]
        # shape: (C,) -- the first segment's phantom predecessor term
        phantom = torch.logsumexp(transition, dim=0)[y]
    else:
        tr = transition[k_idx, y_prev, y]
        phantom = torch.logsumexp(transition, dim=1)[k_idx, y]
    tr = torch.where(first, phantom, tr)
    score = score + torch.where(starts, tr, zero).sum(1)
    return score
