"""Small independent oracles for the semi-CRF, in float64, for tests.

Two references that share no code with the streaming engine:

* :func:`brute_force` enumerates every segmentation of every sequence (T <= 8) and computes the
  partition, the best segmentation and the posterior marginals by explicit sums over them.
* :func:`naive_semi_crf` is the textbook edge-block dynamic programme over (t, k, c', c), in the
  log or max semiring, differentiable by autograd. :func:`naive_semi_crf_viterbi` adds a traceback
  and :func:`naive_marginals` gets every marginal from autograd.

Both take the inputs of the streaming API (docs/internals.md §1). The score of a segment (s, k, c) after
a segment with label c_prev is

    S[s+k, c] - S[s, c] + D[k-1, c] + ps[s, c] + pe[s+k-1, c] + Tr[c_prev, c]

and the first segment has a phantom predecessor: it receives logsumexp_{c'} Tr[c', c] (Tr[k-1]
for (K, C, C) transitions) in both semirings, so that the max semiring finds the segmentation of
highest probability under the model whose log-partition the log semiring computes. Forbidden
entries (``-inf`` or ``<= NEG_INF`` in ``transition`` / ``duration_bias``) are exactly ``-inf``
here: a sequence with no allowed segmentation has log Z = max score = -inf, no best
segmentation and zero marginals, and gradients stay finite (zero) through them.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

from torch_semimarkov.core.constants import NEG_INF
from torch_semimarkov.core.segments import Segment

__all__ = [
    "BruteForceResult",
    "brute_force",
    "naive_semi_crf",
    "naive_semi_crf_viterbi",
    "naive_marginals",
    "segmentation_score",
    "enumerate_segmentations",
    "segmentation_allowed",
]

#: Largest T that :func:`brute_force` accepts (the number of segmentations grows like (C+1)^T).
BRUTE_FORCE_MAX_T = 8


@dataclass
class BruteForceResult:
    """Everything :func:`brute_force` computes, per sequence of the batch.

    ``end`` is indexed by the segment's last position e (P_end(e+1, c) of docs/internals.md §3).
    Positions at or past a sequence's length hold 0.
    """

    log_Z: torch.Tensor  # (B,) log partition
    max_score: torch.Tensor  # (B,) best segmentation score (max semiring)
    argmax: List[List[Segment]]  # a best segmentation of each sequence
    argmax_unique: List[bool]  # False where another segmentation ties the best within 1e-9
    start: torch.Tensor  # (B, T, C) P(a segment with label c starts at s)
    end: torch.Tensor  # (B, T, C) P(a segment with label c has its last position at e)
    position: torch.Tensor  # (B, T, C) P(y_t = c)
    boundary: torch.Tensor  # (B, T) P(a segment starts at t)
    num_segmentations: List[int]  # how many labelled segmentations were enumerated


def _forbid(t: torch.Tensor) -> torch.Tensor:
    """float64 copy (keeping autograd) with every forbidden entry (<= NEG_INF) exactly -inf."""
    t = t.to(torch.float64)
    return torch.where(t <= NEG_INF, torch.full_like(t, -math.inf), t)


def _lse(x: torch.Tensor, dim) -> torch.Tensor:
    """logsumexp whose value is -inf and whose gradient is 0 (not NaN) where every term is -inf."""
    m = x.detach().amax(dim=dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    total = torch.exp(x - m).sum(dim=dim, keepdim=True)
    # log of an empty sum: -inf, with the gradient of clamp (0) instead of 1/0
    out = torch.log(total.clamp(min=torch.finfo(total.dtype).tiny)) + m
    out = torch.where(total > 0, out, torch.full_like(out, -math.inf))
    return out.squeeze(dim) if isinstance(dim, int) else out.reshape([n for i, n in enumerate(out.shape) if i not in dim])


def _prepare(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end):
    """Cast to float64 (keeping autograd), make forbidden entries -inf, fill absent projections."""
    if not isinstance(K, int) or K < 1:
        raise ValueError(f"K must be an int >= 1, got {K!r}")
    S = cum_scores.to(torch.float64)
    B, T1, C = S.shape
    T = T1 - 1
    Tr = _forbid(transition)
    D = _forbid(duration_bias)
    if Tr.dim() == 2:
        if tuple(Tr.shape) != (C, C):
            raise ValueError(f"transition must be (C, C) = ({C}, {C}), got {tuple(Tr.shape)}")
    elif tuple(Tr.shape) != (K, C, C):
        raise ValueError(f"transition must be (K, C, C) = ({K}, {C}, {C}), got {tuple(Tr.shape)}")
    if tuple(D.shape) != (K, C):
        raise ValueError(f"duration_bias must be (K, C) = ({K}, {C}), got {tuple(D.shape)}")
    zeros = S.new_zeros(B, T, C)
    ps = zeros if proj_start is None else _forbid(proj_start)
    pe = zeros if proj_end is None else _forbid(proj_end)
    lens = [int(x) for x in torch.as_tensor(lengths).reshape(-1).tolist()]
    if len(lens) != B or min(lens) < 1 or max(lens) > T:
        raise ValueError(f"lengths must be {B} integers in [1, {T}], got {lens}")
    return S, Tr, D, ps, pe, lens, B, T, C


def _transition_for(Tr: torch.Tensor, k: int) -> torch.Tensor:
    """The (C, C) [c_src, c_dst] transition matrix used by a segment of duration k."""
    return Tr if Tr.dim() == 2 else Tr[k - 1]


def _phantom(Tr: torch.Tensor, k: int) -> torch.Tensor:
    """(C,) score the first segment (duration k) receives from its phantom predecessor: the
    predecessor is marginalised, logsumexp_{c'} Tr[c', c], in both semirings."""
    return _lse(_transition_for(Tr, k), 0)


def _compositions(L: int, K: int):
    """Every tuple of durations in 1..K that sums to L, in lexicographic order."""
    if L == 0:
        yield ()
        return
    for k in range(1, min(K, L) + 1):
        for rest in _compositions(L - k, K):
            yield (k,) + rest


def _score_labelled(S, Tr, D, ps, pe, durations, labels):
    """Scores (N,) of N labelled segmentations sharing one duration tuple; labels is (N, m)."""
    total = None
    s = 0
    for i, k in enumerate(durations):
        c = labels[:, i]
        term = S[s + k, c] - S[s, c] + D[k - 1, c] + ps[s, c] + pe[s + k - 1, c]
        if i == 0:
            term = term + _phantom(Tr, k)[c]
        else:
            term = term + _transition_for(Tr, k)[labels[:, i - 1], c]
        total = term if total is None else total + term
        s += k
    return total


def _labelled_segmentations(S, Tr, D, ps, pe, L, K, C):
    """Every labelled segmentation of one sequence of length L, by duration tuple: yields
    ``(durations, labels (N, m), scores (N,))`` with the N = C^m labellings of the m segments in
    lexicographic order."""
    for durations in _compositions(L, K):
        m = len(durations)
        labels = torch.tensor(list(itertools.product(range(C), repeat=m)), dtype=torch.long,
                              device=S.device).reshape(-1, m)
        yield durations, labels, _score_labelled(S, Tr, D, ps, pe, durations, labels)


def _check_enumerable(name: str, T: int) -> None:
    """Enumeration grows like (C+1)^T: refuse T > :data:`BRUTE_FORCE_MAX_T`."""
    if T > BRUTE_FORCE_MAX_T:
        raise ValueError(f"{name} enumerates every segmentation; T must be <= {BRUTE_FORCE_MAX_T}, got {T}")


def brute_force(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths,
    K: int,
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
) -> BruteForceResult:
    """Partition, best segmentation and marginals by enumerating every segmentation.

    ``log_Z`` stays differentiable (autograd through the enumerated scores), so its gradients are
    an oracle too. The marginals are explicit probability-weighted sums over segmentations.

    Args:
        cum_scores: (B, T+1, C) cumulative label scores with cum_scores[:, 0] = 0; T <= 8.
        transition: (C, C) [c_src, c_dst] or (K, C, C) indexed [k-1].
        duration_bias: (K, C) indexed [k-1].
        lengths: (B,) integers in [1, T].
        K: maximum segment duration.
        proj_start, proj_end: optional (B, T, C) start / end projections.

    Example:
        >>> S = torch.randn(1, 4, 2, dtype=torch.float64).cumsum(1); S[:, 0] = 0
        >>> r = brute_force(S, torch.zeros(2, 2), torch.zeros(3, 2), [3], K=3)
        >>> round(r.start[0, 0].sum().item(), 9)
        1.0
    """
    S, Tr, D, ps, pe, lens, B, T, C = _prepare(
        cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end
    )
    _check_enumerable("brute_force", T)
    dev = S.device
    log_Z, max_score, argmax, counts, unique = [], [], [], [], []
    start = torch.zeros(B, T, C, dtype=torch.float64, device=dev)
    end = torch.zeros_like(start)
    position = torch.zeros_like(start)
    for b in range(B):
        L = lens[b]
        blocks = []
        best = None
        for durations, labels, log_scores in _labelled_segmentations(S[b], Tr, D, ps[b], pe[b], L, K, C):
            with torch.no_grad():
                max_scores = log_scores.detach()
                i = int(torch.argmax(max_scores))
                if best is None or float(max_scores[i]) > best[0]:
                    best = (float(max_scores[i]), durations, labels[i].tolist())
            blocks.append((durations, labels, log_scores, max_scores))
        all_scores = torch.cat([blk[2] for blk in blocks])
        lz = _lse(all_scores, 0)
        log_Z.append(lz)
        max_score.append(best[0])
        counts.append(int(all_scores.numel()))
        segs, s = [], 0
        if best[0] == -math.inf:
            # no allowed segmentation: no best one either
            unique.append(True)
        else:
            n_best = sum(int((blk[3] >= best[0] - 1e-9).sum()) for blk in blocks)
            unique.append(n_best == 1)
            for k, c in zip(best[1], best[2]):
                segs.append(Segment(s, s + k, int(c)))
                s += k
        argmax.append(segs)
        with torch.no_grad():
            for durations, labels, log_scores, _ in blocks:
                if lz.detach() == -math.inf:
                    break
                prob = torch.exp(log_scores.detach() - lz.detach())
                s = 0
                for i, k in enumerate(durations):
                    c = labels[:, i]
                    start[b, s].index_add_(0, c, prob)
                    end[b, s + k - 1].index_add_(0, c, prob)
                    for t in range(s, s + k):
                        position[b, t].index_add_(0, c, prob)
                    s += k
    return BruteForceResult(
        log_Z=torch.stack(log_Z),
        max_score=torch.tensor(max_score, dtype=torch.float64, device=dev),
        argmax=argmax,
        argmax_unique=unique,
        start=start,
        end=end,
        position=position,
        boundary=start.sum(-1),
        num_segmentations=counts,
    )


def _naive_alphas(S, Tr, D, ps, pe, K, semiring, keep_argmax=False):
    """Forward messages alpha_t (B, C) for t = 0..T by the edge-block recurrence.

    alpha_t(c) = reduce_{k, c'} alpha_{t-k}(c') + Tr[c', c] + seg(t-k, k, c); a segment starting at
    0 takes the phantom term logsumexp_{c'} Tr[c', c] instead (in both semirings). With
    keep_argmax, also returns for each t the best (k, c') pair per (b, c) as two (B, C) long
    tensors (c' = 0 for a first segment).
    """
    B, T1, C = S.shape
    alphas = [S.new_zeros(B, C)]
    best_k, best_c = [None], [None]
    for t in range(1, T1):
        terms = []
        for k in range(1, min(K, t) + 1):
            s = t - k
            # shape: (B, C) score of the segment (s, k, c) without its transition
            seg = S[:, t] - S[:, s] + D[k - 1] + ps[:, s] + pe[:, t - 1]
            if s == 0:
                # shape: (B, C', C) the phantom term in slot c' = 0, nothing elsewhere
                first = (seg + _phantom(Tr, k))[:, None, :]
                edge = torch.cat([first, first.new_full((B, C - 1, C), -math.inf)], 1)
            else:
                # shape: (B, C', C) the full edge block for duration k ending at t
                edge = alphas[s][:, :, None] + _transition_for(Tr, k)[None] + seg[:, None, :]
            terms.append(edge)
        # shape: (B, k * C', C)
        stacked = torch.cat(terms, dim=1)
        if semiring == "log":
            alphas.append(_lse(stacked, 1))
        else:
            val, idx = stacked.max(dim=1)
            alphas.append(val)
            if keep_argmax:
                best_k.append(idx // C + 1)
                best_c.append(idx % C)
    if keep_argmax:
        return alphas, best_k, best_c
    return alphas


def naive_semi_crf(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths,
    K: int,
    semiring: str = "log",
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """log Z (``semiring="log"``) or the best score (``"max"``) by the O(T·K·C²) edge-block DP.

    Differentiable by autograd with respect to every tensor input. Computed in float64.

    Returns:
        (B,) float64.

    Example:
        >>> S = torch.randn(2, 6, 3, dtype=torch.float64).cumsum(1); S[:, 0] = 0
        >>> naive_semi_crf(S, torch.zeros(3, 3), torch.zeros(4, 3), [5, 2], K=4).shape
        torch.Size([2])
    """
    if semiring not in ("log", "max"):
        raise ValueError(f"semiring must be 'log' or 'max', got {semiring!r}")
    S, Tr, D, ps, pe, lens, B, T, C = _prepare(
        cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end
    )
    alphas = _naive_alphas(S, Tr, D, ps, pe, K, semiring)
    final = torch.stack([alphas[lens[b]][b] for b in range(B)])
    if semiring == "log":
        return _lse(final, -1)
    return final.max(dim=-1).values


def naive_semi_crf_viterbi(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths,
    K: int,
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, List[List[Segment]]]:
    """Best score (B,) and best segmentation of each sequence, by the edge-block DP and traceback
    (an infeasible sequence: score -inf and no segments)."""
    S, Tr, D, ps, pe, lens, B, T, C = _prepare(
        cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end
    )
    with torch.no_grad():
        alphas, best_k, best_c = _naive_alphas(S, Tr, D, ps, pe, K, "max", keep_argmax=True)
    scores, segments = [], []
    for b in range(B):
        t = lens[b]
        val, c = alphas[t][b].max(dim=0)
        scores.append(float(val))
        c = int(c)
        segs = []
        if float(val) == -math.inf:
            t = 0
        while t > 0:
            k = int(best_k[t][b, c])
            c_prev = int(best_c[t][b, c])
            segs.append(Segment(t - k, t, c))
            t, c = t - k, c_prev
        segments.append(segs[::-1])
    return torch.tensor(scores, dtype=torch.float64), segments


def naive_marginals(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths,
    K: int,
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
):
    """(log_Z, start, end, position, boundary) of the naive DP, all from autograd.

    start / end are the gradients of log Z with respect to added start / end projections;
    position is the gradient with respect to a per-position label score added inside the cumulative
    sum (so it counts every segment covering the position); boundary sums start over labels.
    """
    S = cum_scores.detach().to(torch.float64)
    B, T1, C = S.shape
    T = T1 - 1
    extra_s = torch.zeros(B, T, C, dtype=torch.float64, requires_grad=True)
    extra_e = torch.zeros(B, T, C, dtype=torch.float64, requires_grad=True)
    extra_p = torch.zeros(B, T, C, dtype=torch.float64, requires_grad=True)
    ps = extra_s if proj_start is None else proj_start.detach().to(torch.float64) + extra_s
    pe = extra_e if proj_end is None else proj_end.detach().to(torch.float64) + extra_e
    S2 = S + torch.cat([S.new_zeros(B, 1, C), extra_p.cumsum(1)], dim=1)
    log_Z = naive_semi_crf(
        S2, transition.detach(), duration_bias.detach(), lengths, K, "log", ps, pe
    )
    start, end, position = torch.autograd.grad(log_Z.sum(), (extra_s, extra_e, extra_p))
    return log_Z.detach(), start, end, position, start.sum(-1)


def segmentation_score(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    segments: Sequence[Segment],
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
) -> float:
    """Score of one given segmentation of one sequence: its unnormalised log-probability, the
    value the Viterbi score of a best segmentation equals (``-inf`` if it uses a forbidden entry).

    Args:
        cum_scores: (T+1, C) of one sequence; proj_start / proj_end: (T, C) of it or None.
        segments: the segmentation, in order, tiling 0..L-1.
    """
    S = cum_scores.detach().to(torch.float64)
    Tr = _forbid(transition.detach())
    D = _forbid(duration_bias.detach())
    total, prev, pos = 0.0, None, 0
    for s, e, c in segments:
        if s != pos or e <= s:
            raise ValueError(f"segments must tile the sequence in order, got {list(segments)}")
        k = e - s
        total += float(S[e, c] - S[s, c] + D[k - 1, c])
        if proj_start is not None:
            total += float(proj_start[s, c])
        if proj_end is not None:
            total += float(proj_end[e - 1, c])
        if prev is None:
            total += float(_phantom(Tr, k)[c])
        else:
            total += float(_transition_for(Tr, k)[prev, c])
        prev, pos = c, e
    return total


def enumerate_segmentations(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths,
    K: int,
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
) -> List[Tuple[List[Tuple[Segment, ...]], torch.Tensor]]:
    """Every labelled segmentation of every sequence with its score (T <= 8).

    Returns, for each sequence, ``(segmentations, scores)``: the segmentations as tuples of
    :class:`Segment` and their scores (N,) float64, differentiable with respect to the inputs
    (``-inf`` for one that uses a forbidden entry). The oracle for k-best lists, samples,
    entropies and constrained partitions.

    Example:
        >>> S = torch.zeros(1, 3, 2, dtype=torch.float64)
        >>> segs, scores = enumerate_segmentations(S, torch.zeros(2, 2), torch.zeros(2, 2), [2], K=2)[0]
        >>> len(segs), segs[0]
        (6, (Segment(start=0, end=1, label=0), Segment(start=1, end=2, label=0)))
    """
    S, Tr, D, ps, pe, lens, B, T, C = _prepare(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end)
    _check_enumerable("enumerate_segmentations", T)
    out = []
    for b in range(B):
        segs, scores = [], []
        for durations, labels, score in _labelled_segmentations(S[b], Tr, D, ps[b], pe[b], lens[b], K, C):
            scores.append(score)
            bounds = list(itertools.accumulate((0,) + durations))
            for row in labels.tolist():
                segs.append(tuple(Segment(bounds[i], bounds[i + 1], c) for i, c in enumerate(row)))
        out.append((segs, torch.cat(scores)))
    return out


def segmentation_allowed(segments: Sequence[Segment], label_mask: Optional[torch.Tensor] = None,
                         boundary_mask: Optional[torch.Tensor] = None) -> bool:
    """Whether one sequence's segmentation respects ``label_mask`` (T, C) bool (every position
    of a segment allows its label) and ``boundary_mask`` (T,) (-1: no segment starts there, 1: a
    segment starts there)."""
    starts = {s for s, _, _ in segments}
    for s, e, c in segments:
        if label_mask is not None and not bool(label_mask[s:e, c].all()):
            return False
    if boundary_mask is not None:
        L = segments[-1][1]
        for t in range(L):
            v = int(boundary_mask[t])
            if (v == -1 and t in starts) or (v == 1 and t not in starts):
                return False
    return True
