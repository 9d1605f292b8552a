"""The score of a given (gold) segmentation, with exactly the terms of the partition function.

A segmentation is represented by two (B, T) tensors: ``labels`` (the label of each position, 0 past
the sequence's length) and ``starts`` (True where a segment starts). Its score is the sum over its
segments (s, k, c) with predecessor label c' of (docs/internals.md §1)

    S[s+k, c] - S[s, c] + D[k-1, c] + ps[s, c] + pe[s+k-1, c] + Tr[c', c]

where the first segment's transition term is the phantom ``logsumexp_{c'} Tr[c', c]`` (for
duration-dependent transitions ``logsumexp_{c'} Tr[k-1, c', c]``). With these conventions
``exp(gold_score - log Z)`` is the segmentation's probability under the model, so the negative
log-likelihood ``log Z - gold_score`` is never negative.

A segmentation that uses a forbidden term (an entry of ``transition`` or ``duration_bias`` that is
``-inf`` or at most ``NEG_INF``) has probability 0: its score is ``-inf``, and
:func:`forbidden_terms` says where and why.
"""

from __future__ import annotations

import numbers
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from torch_semimarkov.core.constants import NEG_INF
from torch_semimarkov.core.cumsum import cumsum_time

__all__ = ["labels_to_starts", "segments_to_starts", "gold_score", "forbidden_terms", "FORBIDDEN_REASONS",
           "explain_bad_gold", "no_segmentation_message"]

#: What :func:`forbidden_terms` codes mean (code 0: nothing forbidden at that position).
FORBIDDEN_REASONS = {
    1: "its duration is forbidden for its label (duration_bias[k-1, c] is -inf)",
    2: "the transition into it from the previous segment's label is forbidden (transition is -inf there)",
    3: "its label cannot start a sequence (every transition into it is -inf, so the first segment's "
       "phantom term logsumexp_c' transition[c', c] is -inf)",
    4: "no segment of its label may start at that position (proj_start is -inf there)",
    5: "no segment of its label may end at its last position (proj_end is -inf there)",
}


def _valid_mask(lengths: torch.Tensor, T: int) -> torch.Tensor:
    # shape: (B, T) -- True at positions inside each sequence
    return torch.arange(T, device=lengths.device)[None, :] < lengths[:, None]


def _raise_bad_labels(labels, lengths, num_classes, ignore_index, bad_inside, bad_outside):
    if bool(bad_inside.any()):
        b, t = (int(i) for i in bad_inside.nonzero()[0])
        raise ValueError(
            f"labels must lie in [0, {num_classes}) inside each sequence; sequence {b} has label "
            f"{int(labels[b, t])} at position {t} < length {int(lengths[b])}"
        )
    b, t = (int(i) for i in bad_outside.nonzero()[0])
    raise ValueError(
        f"labels past a sequence's length must be ignore_index={ignore_index}; sequence {b} has "
        f"label {int(labels[b, t])} at position {t} >= length {int(lengths[b])} "
        "(are the lengths right?)"
    )


def _bad_labels(labels, valid, num_classes: int, ignore_index: int):
    """(B, T) bool pair: a label out of [0, C) inside a sequence; a label other than ignore_index past it."""
    return valid & ((labels < 0) | (labels >= num_classes)), (~valid) & (labels != ignore_index)


def any_bad_label(labels: torch.Tensor, lengths: torch.Tensor, num_classes: int, ignore_index: int = -100) -> torch.Tensor:
    """0-d bool tensor, on the device, without reading it: whether :func:`labels_to_starts` with
    ``check=True`` would raise for these labels (shapes and dtypes already checked)."""
    labels = labels.to(device=lengths.device, dtype=torch.long)
    inside, outside = _bad_labels(labels, _valid_mask(lengths, labels.shape[1]), num_classes, ignore_index)
    return (inside | outside).any()


def labels_to_starts(
    labels: torch.Tensor,
    lengths: torch.Tensor,
    num_classes: int,
    max_duration,
    ignore_index: int = -100,
    check: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Validate per-position labels and turn them into (labels, segment starts).

    Each maximal run of one label is one segment. A run longer than ``max_duration`` (K, or the
    label's own maximum) is split into consecutive pieces of that many positions (the last piece
    holds the remainder), joined by the same-label transition ``Tr[c, c]``.

    Args:
        labels: (B, T) integer labels in [0, C) at positions < length and ``ignore_index`` after.
        lengths: (B,) sequence lengths.
        num_classes: C.
        max_duration: K, or a (C,) integer tensor of per-label maxima.
        ignore_index: the padding label expected past each sequence's length.
        check: raise for labels out of range (one device-to-host transfer); ``False`` skips the
            check and clamps such labels into [0, C) instead.

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
    bad_inside, bad_outside = _bad_labels(labels, valid, num_classes, ignore_index)
    if not check:
        labels = labels.clamp(0, num_classes - 1)
    elif bool((bad_inside | bad_outside).any()):  # one transfer; the details only on failure
        _raise_bad_labels(labels, lengths, num_classes, ignore_index, bad_inside, bad_outside)
    labels = torch.where(valid, labels, torch.zeros_like(labels))
    idx = torch.arange(T, device=labels.device).expand(B, T)
    # concatenations, not slice assignments into bool tensors: inductor's CPU code for the latter
    # does not compile (torch 2.13)
    change = torch.cat([torch.ones_like(valid[:, :1]), labels[:, 1:] != labels[:, :-1]], dim=1)
    # position of each t inside its run of equal labels
    run_start = torch.cummax(torch.where(change, idx, torch.zeros_like(idx)), dim=1).values
    pos_in_run = idx - run_start
    if isinstance(max_duration, torch.Tensor):
        max_duration = max_duration.to(device=labels.device, dtype=torch.long)[labels]
    starts = valid & (pos_in_run % max_duration == 0)
    return labels, starts


def no_segmentation_message(b: int, length: int) -> str:
    """The error of a sequence whose model allows no segmentation at all (log Z = -inf)."""
    return (f"sequence {b} (length {length}) has no segmentation that the model allows (log Z = -inf): its "
            "transition and duration constraints rule out every segmentation of this length; pass "
            "zero_infinity=True to give such sequences loss 0")


def explain_bad_gold(partition, code, starts, labels, lengths, num_classes: int, ignore_index: int,
                     zero_infinity: bool) -> None:
    """Raise the ``ValueError`` of a batch whose gold labels are out of range or whose loss is
    infinite (unless ``zero_infinity``), with one device-to-host read; nothing otherwise.

    Args:
        partition: (B,) log Z; code, starts: (B, T) of :func:`forbidden_terms` and the gold's
            segment starts; labels: (B, T) the labels as given (empty when segments were given);
            lengths: (B,).
    """
    bad_label = partition.new_zeros((), dtype=torch.bool)
    if labels.numel():
        labels = labels.to(device=lengths.device, dtype=torch.long)
        inside, outside = _bad_labels(labels, _valid_mask(lengths, labels.shape[1]), num_classes, ignore_index)
        bad_label = (inside | outside).any()
    infinite = torch.isneginf(partition) | (code > 0).any(1)
    host = torch.cat([bad_label.reshape(1), infinite]).tolist()  # the read
    if host[0]:
        _raise_bad_labels(labels, lengths, num_classes, ignore_index, inside, outside)
    if zero_infinity or not any(host[1:]):
        return
    b = host[1:].index(True)
    if bool(torch.isneginf(partition[b])):
        raise ValueError(no_segmentation_message(b, int(lengths[b])))
    t = int(code[b].nonzero()[0])
    ends = starts[b].nonzero().reshape(-1).tolist() + [int(lengths[b])]
    end = next(e for e in ends if e > t)
    c = int(labels[b, t]) if labels.numel() else -1
    what = f"label {c} " if c >= 0 else ""
    raise ValueError(f"the gold segmentation of sequence {b} has a segment [{t}, {end}) {what}(duration {end - t}) "
                     f"that the model forbids: {FORBIDDEN_REASONS[int(code[b, t])]}")


def _segment_triple(seg, b: int) -> Tuple[int, int, int]:
    """``(start, end, label)`` as Python ints, or a clear error: exactly three integers (Python,
    numpy or integer 0-d tensors), never a float silently truncated."""
    if isinstance(seg, (str, bytes, torch.Tensor)) or not isinstance(seg, Sequence) or len(seg) != 3:
        raise ValueError(f"each segment of sequence {b} must be a (start, end, label) triple, got {seg!r}")
    out = []
    for name, v in zip(("start", "end", "label"), seg):
        if isinstance(v, torch.Tensor) and v.numel() == 1 and not v.dtype.is_floating_point and v.dtype != torch.bool:
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"segment {tuple(seg)!r} of sequence {b}: {name} must be an integer, got {v!r}")
        out.append(int(v))
    return out[0], out[1], out[2]


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
            Each segment is exactly three integers; anything else raises.
        lengths: (B,) sequence lengths.
        T: padded length.
        num_classes: C.
        max_duration: K.

    Returns:
        ``labels`` (B, T) long (0 past the length) and ``starts`` (B, T) bool.
    """
    B = lengths.shape[0]
    if isinstance(segments, (str, bytes, torch.Tensor)) or not isinstance(segments, Sequence):
        raise TypeError(
            f"segments must be a list with one list of (start, end, label) per sequence, got {type(segments).__name__}"
        )
    if len(segments) != B:
        raise ValueError(f"segments must hold one list per sequence ({B}), got {len(segments)}")
    labels = torch.zeros(B, T, dtype=torch.long)
    starts = torch.zeros(B, T, dtype=torch.bool)
    lens = lengths.tolist()
    for b, segs in enumerate(segments):
        if isinstance(segs, (str, bytes, torch.Tensor)) or not isinstance(segs, Sequence):
            raise TypeError(
                f"segments[{b}] must be a list of (start, end, label) triples, got {type(segs).__name__}"
            )
        pos = 0
        for seg in segs:
            s, e, c = _segment_triple(seg, b)
            if s != pos:
                raise ValueError(f"segments of sequence {b} must tile [0, length) in order; got a segment starting at {s}, expected {pos}")
            if not 1 <= e - s <= max_duration:
                raise ValueError(f"segment {(s, e, c)} of sequence {b} has duration {e - s}, not in [1, K={max_duration}]")
            if not 0 <= c < num_classes:
                raise ValueError(f"segment {(s, e, c)} of sequence {b} has label {c}, not in [0, {num_classes})")
            if e > lens[b]:
                raise ValueError(f"segment {(s, e, c)} of sequence {b} ends past its length {lens[b]}")
            labels[b, s:e] = c
            starts[b, s] = True
            pos = e
        if pos != lens[b]:
            raise ValueError(f"segments of sequence {b} cover [0, {pos}) but its length is {lens[b]}")
    return labels.to(lengths.device), starts.to(lengths.device)


def _counts(index: torch.Tensor, where: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """(B, n) how often each value of ``index`` (B, T) in [0, n) occurs where ``where`` is True.
    Counts of 1.0 are exact in any order, so the result is deterministic on every device."""
    B = index.shape[0]
    flat = (index + torch.arange(B, device=index.device)[:, None] * n).reshape(-1)
    weight = where.reshape(-1).to(torch.float32)
    # index_add into a fixed size: bincount would read the largest index back (a device sync)
    counts = torch.zeros(B * n, dtype=torch.float32, device=index.device).index_add_(0, flat, weight)
    return counts.view(B, n).to(dtype)


def _segments_of(cum_scores, duration_bias, lengths, labels, starts):
    """Shared bookkeeping of a segmentation: (valid, starts, ends, y, y_prev, first, k_idx)."""
    B, T1, C = cum_scores.shape
    T = T1 - 1
    K = duration_bias.shape[0]
    lengths = lengths.to(device=cum_scores.device, dtype=torch.long)
    labels = labels.to(cum_scores.device)
    valid = _valid_mask(lengths, T)
    starts = starts.to(cum_scores.device) & valid
    # a segment's last position e: the next position starts a segment or is past the length
    next_start = torch.cat([starts[:, 1:] | ~valid[:, 1:], torch.ones_like(starts[:, :1])], dim=1)
    ends = valid & next_start
    y = labels.clamp(0, C - 1)
    # duration of the segment that starts at each start position
    seg_id = (cumsum_time(starts.long()) - 1).clamp(min=0)
    seg_len = torch.zeros(B, T, dtype=torch.long, device=cum_scores.device)
    seg_len.scatter_add_(1, seg_id, valid.long())
    k_idx = (seg_len.gather(1, seg_id) - 1).clamp(0, K - 1)
    y_prev = torch.cat([torch.zeros_like(y[:, :1]), y[:, :-1]], dim=1)
    first = (torch.arange(T, device=starts.device) == 0)[None, :].expand(B, T)
    return valid, starts, ends, y, y_prev, first, k_idx


def forbidden_terms(
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths: torch.Tensor,
    labels: torch.Tensor,
    starts: torch.Tensor,
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Where a segmentation uses a forbidden term, and which.

    Args:
        transition, duration_bias, lengths, labels, starts, proj_start, proj_end: as for
            :func:`gold_score`.

    Returns:
        (B, T) long: at each segment's start position, 0 if the segment is allowed, else a key of
        :data:`FORBIDDEN_REASONS` (1: duration, 2: transition from the previous segment, 3: the
        first segment's label cannot start a sequence, 4: ``proj_start`` forbids it to start
        there, 5: ``proj_end`` forbids it to end there); 0 elsewhere.

    Example:
        >>> db = torch.tensor([[float("-inf")], [0.0]])  # duration 1 forbidden
        >>> forbidden_terms(torch.zeros(1, 1), db, torch.tensor([3]), torch.zeros(1, 3, dtype=torch.long),
        ...                 torch.tensor([[True, False, True]])).tolist()
        [[0, 0, 1]]
    """
    B, T = labels.shape
    zeros = torch.zeros(B, T + 1, duration_bias.shape[1], dtype=duration_bias.dtype, device=duration_bias.device)
    _, starts, _, y, y_prev, first, k_idx = _segments_of(zeros, duration_bias, lengths, labels, starts)
    forb_tr = transition <= NEG_INF
    forb_db = duration_bias <= NEG_INF
    bad_dur = forb_db[k_idx, y]
    if transition.dim() == 2:
        bad_tr = forb_tr[y_prev, y]
        bad_first = forb_tr.all(dim=0)[y]
    else:
        bad_tr = forb_tr[k_idx, y_prev, y]
        bad_first = forb_tr.all(dim=1)[k_idx, y]
    code = torch.zeros(B, T, dtype=torch.long, device=labels.device)
    code = torch.where(first & bad_first, torch.full_like(code, 3), code)
    code = torch.where(~first & bad_tr, torch.full_like(code, 2), code)
    if proj_end is not None:
        # the segment starting at s ends at s + k: its last position is s + k - 1
        last = (torch.arange(T, device=labels.device)[None, :] + k_idx).clamp(max=T - 1)
        bad_end = (proj_end <= NEG_INF)[torch.arange(B, device=labels.device)[:, None], last, y]
        code = torch.where(bad_end, torch.full_like(code, 5), code)
    if proj_start is not None:
        bad_start = (proj_start <= NEG_INF).gather(2, y[..., None]).squeeze(-1)
        code = torch.where(bad_start, torch.full_like(code, 4), code)
    code = torch.where(bad_dur, torch.full_like(code, 1), code)
    return torch.where(starts, code, torch.zeros_like(code))


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
        duration_bias: (K, C) indexed ``[k-1, c]``; ``-inf`` allowed.
        lengths: (B,) sequence lengths.
        labels: (B, T) long, the label of each position (anything past the length).
        starts: (B, T) bool, True where a segment starts (``starts[:, 0]`` True); durations <= K.
        proj_start, proj_end: optional (B, T, C) boundary scores.

    Returns:
        (B,) segmentation scores, differentiable in every score tensor; ``-inf`` (with zero
        gradient) for a segmentation that uses a forbidden term (see :func:`forbidden_terms`).

    Example:
        >>> S = torch.zeros(1, 4, 2); S[0, 1:, 1] = torch.tensor([1.0, 2.0, 3.0])
        >>> tr, db = torch.zeros(2, 2), torch.zeros(3, 2)
        >>> gold_score(S, tr, db, torch.tensor([3]), torch.tensor([[1, 1, 1]]), torch.tensor([[True, False, False]]))
        tensor([3.6931])
    """
    dtype = cum_scores.dtype
    transition = transition.to(dtype)
    duration_bias = duration_bias.to(dtype)
    code = forbidden_terms(transition, duration_bias, lengths, labels, starts)
    forb_tr = transition <= NEG_INF
    # forbidden entries as exact -inf; a column with no allowed entry as 0 (its phantom is flagged
    # by ``code``), so that every logsumexp below is finite and its gradient is never NaN
    tr_inf = torch.where(forb_tr, torch.full_like(transition, float("-inf")), transition)
    dead_col = forb_tr.all(dim=-2, keepdim=True)
    tr_phantom = torch.where(dead_col, torch.zeros_like(transition), tr_inf)
    transition = torch.where(forb_tr, torch.zeros_like(transition), transition)
    duration_bias = torch.where(duration_bias <= NEG_INF, torch.zeros_like(duration_bias), duration_bias)
    valid, starts, ends, y, y_prev, first, k_idx = _segments_of(cum_scores, duration_bias, lengths, labels, starts)
    zero = cum_scores.new_zeros(())

    # content: sum over segments of S[e+1, c] - S[s, c]
    s_hi = cum_scores[:, 1:].gather(2, y[..., None]).squeeze(-1)
    s_lo = cum_scores[:, :-1].gather(2, y[..., None]).squeeze(-1)
    score = torch.where(ends, s_hi, zero).sum(1) - torch.where(starts, s_lo, zero).sum(1)
    K, C = duration_bias.shape
    later = starts & ~first
    # the parameter terms as counts times the table: a dense product whose gradient is the counts,
    # where indexing the tables per position would cost an index backward (slow on long sequences)
    dur = _counts(k_idx * C + y, starts, K * C, dtype).view(-1, K, C)
    score = score + (dur * duration_bias).sum((1, 2))

    if proj_start is not None:
        ps = proj_start.to(dtype).gather(2, y[..., None]).squeeze(-1)
        score = score + torch.where(starts, ps, zero).sum(1)
    if proj_end is not None:
        pe = proj_end.to(dtype).gather(2, y[..., None]).squeeze(-1)
        score = score + torch.where(ends, pe, zero).sum(1)

    first_start = starts & first
    if transition.dim() == 2:
        moves = _counts(y_prev * C + y, later, C * C, dtype).view(-1, C, C)
        # shape: (C,) -- the first segment's phantom predecessor term
        phantom = torch.logsumexp(tr_phantom, dim=0)
        score = score + (moves * transition).sum((1, 2)) + (_counts(y, first_start, C, dtype) * phantom).sum(1)
    else:
        moves = _counts((k_idx * C + y_prev) * C + y, later, K * C * C, dtype).view(-1, K, C, C)
        phantom = torch.logsumexp(tr_phantom, dim=1)  # (K, C)
        firsts = _counts(k_idx * C + y, first_start, K * C, dtype).view(-1, K, C)
        score = score + (moves * transition).sum((1, 2, 3)) + (firsts * phantom).sum((1, 2))
    return torch.where((code > 0).any(1), torch.full_like(score, float("-inf")), score)


@torch.library.custom_op("torch_semimarkov::checked_nll", mutates_args=())
def checked_nll(nll: Tensor, partition: Tensor, code: Tensor, starts: Tensor, labels: Tensor, lengths: Tensor,
                num_classes: int, ignore_index: int, zero_infinity: bool) -> Tensor:
    """``nll`` (B,) after the checks of ``validate=True`` that need the data, as one opaque node:
    inside a compiled graph they run at run time, read their flags once and raise the same
    ``ValueError`` as eager code (no graph break, no device-side assert). ``labels`` (B, T) are
    the gold labels as given (empty when segments were given), ``code`` and ``starts`` those of
    :func:`~torch_semimarkov.core.gold.forbidden_terms`."""
    explain_bad_gold(partition, code, starts, labels, lengths, num_classes, ignore_index, zero_infinity)
    return nll.clone()


@checked_nll.register_fake
def _checked_nll_fake(nll, partition, code, starts, labels, lengths, num_classes, ignore_index, zero_infinity):
    return torch.empty_like(nll)


def _checked_nll_setup(ctx, inputs, output):
    pass


def _checked_nll_backward(ctx, grad):
    return grad, None, None, None, None, None, None, None, None


checked_nll.register_autograd(_checked_nll_backward, setup_context=_checked_nll_setup)
