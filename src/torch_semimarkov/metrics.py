"""Segmentation metrics: segment F1, boundary F1 (exact or within a tolerance), position accuracy.

Segments are compared as ``(start, end, label)`` triples; boundaries are the start positions of
every segment but the first. Metrics are micro-averaged over all sequences of a batch or data set:
accumulate with :class:`SegmentationMetrics` and read :meth:`SegmentationMetrics.compute`.

Example:
    >>> true = torch.tensor([[0, 0, 1, 1, 1, 2]])
    >>> pred = torch.tensor([[0, 1, 1, 1, 1, 2]])
    >>> m = SegmentationMetrics(tolerances=(0, 1))
    >>> m.update(pred, true, torch.tensor([6]))
    >>> r = m.compute()
    >>> r["segment_f1"], r["boundary_f1@0"], r["boundary_f1@1"], round(r["position_accuracy"], 3)
    (0.3333333333333333, 0.5, 1.0, 0.833)
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Sequence, Tuple

import torch

from torch_semimarkov.core.segments import labels_to_segments

__all__ = ["segment_counts", "boundary_counts", "f1_from_counts", "SegmentationMetrics"]


def f1_from_counts(tp: int, n_pred: int, n_true: int) -> Tuple[float, float, float]:
    """(precision, recall, F1); each is 1.0 when there is nothing to find and nothing was found."""
    precision = tp / n_pred if n_pred else float(n_true == 0)
    recall = tp / n_true if n_true else float(n_pred == 0)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return precision, recall, f1


def segment_counts(pred: Sequence[Sequence], true: Sequence[Sequence]) -> Tuple[int, int, int]:
    """(true positives, predicted, true) for exact ``(start, end, label)`` matches, summed over sequences."""
    tp = n_pred = n_true = 0
    for p, t in zip(pred, true):
        ps = {tuple(int(v) for v in s) for s in p}
        ts = {tuple(int(v) for v in s) for s in t}
        tp += len(ps & ts)
        n_pred += len(ps)
        n_true += len(ts)
    return tp, n_pred, n_true


def _match_within(pred: List[int], true: List[int], tol: int) -> int:
    """Largest one-to-one matching of sorted positions with |p - t| <= tol (greedy is optimal in 1-D)."""
    i = j = matched = 0
    while i < len(pred) and j < len(true):
        if abs(pred[i] - true[j]) <= tol:
            matched += 1
            i += 1
            j += 1
        elif pred[i] < true[j]:
            i += 1
        else:
            j += 1
    return matched


def boundary_counts(pred: Sequence[Sequence], true: Sequence[Sequence], tolerance: int = 0) -> Tuple[int, int, int]:
    """(matched, predicted, true) boundary counts; a boundary is the start of any segment but the first."""
    tp = n_pred = n_true = 0
    for p, t in zip(pred, true):
        pb = sorted(int(s[0]) for s in p if int(s[0]) > 0)
        tb = sorted(int(s[0]) for s in t if int(s[0]) > 0)
        tp += _match_within(pb, tb, tolerance)
        n_pred += len(pb)
        n_true += len(tb)
    return tp, n_pred, n_true


class SegmentationMetrics:
    """Accumulates segment F1, boundary F1 at each tolerance and position accuracy.

    Predictions and references are per-position labels (B, T); each maximal run of one label is a
    segment (so a prediction that splits a run into two same-label segments is not penalised).

    Args:
        tolerances: the boundary tolerances (in positions) to report; 0 is exact.
        ignore_labels: labels whose segments are left out of segment F1 (e.g. a background label).
    """

    def __init__(self, tolerances: Iterable[int] = (0, 2), ignore_labels: Iterable[int] = ()):
        self.tolerances = tuple(int(t) for t in tolerances)
        self.ignore_labels = set(int(c) for c in ignore_labels)
        self.reset()

    def reset(self) -> None:
        self.seg = [0, 0, 0]
        self.bnd = {tol: [0, 0, 0] for tol in self.tolerances}
        self.correct = 0
        self.total = 0

    def update(self, pred_labels: torch.Tensor, true_labels: torch.Tensor, lengths: torch.Tensor) -> None:
        """Add a batch: ``pred_labels`` and ``true_labels`` (B, T), ``lengths`` (B,)."""
        pred_labels = torch.as_tensor(pred_labels).detach().cpu()
        true_labels = torch.as_tensor(true_labels).detach().cpu()
        lengths = torch.as_tensor(lengths).detach().cpu()
        valid = torch.arange(true_labels.shape[1])[None, :] < lengths[:, None]
        self.correct += int(((pred_labels == true_labels) & valid).sum())
        self.total += int(valid.sum())
        pred = labels_to_segments(torch.where(valid, pred_labels, 0), lengths)
        true = labels_to_segments(torch.where(valid, true_labels, 0), lengths)
        keep = lambda segs: [[s for s in seq if s[2] not in self.ignore_labels] for seq in segs]  # noqa: E731
        counts = segment_counts(keep(pred), keep(true))
        self.seg = [a + b for a, b in zip(self.seg, counts)]
        for tol in self.tolerances:
            counts = boundary_counts(pred, true, tol)
            self.bnd[tol] = [a + b for a, b in zip(self.bnd[tol], counts)]

    def compute(self) -> Dict[str, float]:
        """``segment_precision``/``_recall``/``_f1``, ``boundary_f1@tol`` (and P/R) per tolerance,
        ``position_accuracy``."""
        out: Dict[str, float] = {}
        p, r, f = f1_from_counts(*self.seg)
        out.update(segment_precision=p, segment_recall=r, segment_f1=f)
        for tol, counts in self.bnd.items():
            p, r, f = f1_from_counts(*counts)
            out[f"boundary_precision@{tol}"] = p
            out[f"boundary_recall@{tol}"] = r
            out[f"boundary_f1@{tol}"] = f
        out["position_accuracy"] = self.correct / self.total if self.total else 0.0
        return out
