"""The result types of the public functions: Viterbi segmentations, marginals, k-best lists and
samples, each with its segments as tensors (and Python lists on request).
"""

from __future__ import annotations

from typing import List
from typing import NamedTuple
import warnings

import torch

from torch_semimarkov.core.segments import Segment, segment_tensors, SegmentTensorsMixin


class _Segmentations(SegmentTensorsMixin):
    """Segmentations with leading batch dimensions, tensor-first (the layout of ViterbiResult).

    ``labels`` (*lead, T); ``segment_starts`` / ``segment_ends`` (exclusive) / ``segment_labels``
    (N,), concatenated in row-major order of the leading dimensions; ``segment_offsets``
    (prod(lead) + 1,): row r (flattened) owns ``[offsets[r], offsets[r+1])``.
    """

    def _set_segments(self, labels: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor):
        lead = labels.shape[:-1]
        T = labels.shape[-1]
        flat_len = lengths.expand(lead).reshape(-1) if lengths.dim() else lengths
        s, e, c, o = segment_tensors(labels.reshape(-1, T), starts.reshape(-1, T), flat_len)
        self.labels = labels
        self.segment_starts, self.segment_ends, self.segment_labels, self.segment_offsets = s, e, c, o
        self._segments = None


class TopKResult(_Segmentations):
    """The k best segmentations of each sequence, best first.

    Attributes:
        scores: (B, k) the segmentations' scores (unnormalised log-probabilities), descending;
            ``-inf`` for a rank that does not exist (fewer than k allowed segmentations).
        labels: (B, k, T) long, -1 past each length and for missing ranks.
        segment_starts, segment_ends, segment_labels: (N,) long, every segment, ordered by
            sequence, then rank, then position.
        segment_offsets: (B·k + 1,): rank r of sequence b owns ``[offsets[b·k + r], offsets[b·k + r + 1])``.
        segments: Python lists per (b, r) in the same flattened order, built on request.
    """

    def __init__(self, scores, labels, starts, lengths):
        self.scores = scores
        self._set_segments(labels, starts, lengths[:, None])

    def segments_of(self, b: int, r: int) -> List[Segment]:
        """The segments of rank r of sequence b."""
        return self.segments[b * self.scores.shape[1] + r]

    def __repr__(self) -> str:
        B, k, T = self.labels.shape
        return f"TopKResult(batch={B}, k={k}, T={T}, segments={self.segment_starts.numel()}, device={self.labels.device})"


class SegmentationSamples(_Segmentations):
    """Exact samples from P(segmentation | inputs).

    Attributes:
        labels: (S, B, T) long, -1 past each length (and everywhere for a sequence with no
            allowed segmentation).
        log_prob: (S, B) log P(sample) = score - log Z (``-inf`` where no segmentation exists).
        scores: (S, B) the samples' scores.
        segment_starts, segment_ends, segment_labels: (N,) long, ordered by sample, then
            sequence, then position; ``segment_offsets`` (S·B + 1,): sample s of sequence b owns
            ``[offsets[s·B + b], offsets[s·B + b + 1])``.
    """

    def __init__(self, labels, starts, lengths, scores, log_prob):
        self.scores = scores
        self.log_prob = log_prob
        self._set_segments(labels, starts, lengths[None, :])

    def segments_of(self, s: int, b: int) -> List[Segment]:
        """The segments of sample s of sequence b."""
        return self.segments[s * self.labels.shape[1] + b]

    def __repr__(self) -> str:
        S, B, T = self.labels.shape
        return (f"SegmentationSamples(samples={S}, batch={B}, T={T}, segments={self.segment_starts.numel()}, "
                f"device={self.labels.device})")


class ViterbiResult(SegmentTensorsMixin):
    """Best segmentations of a batch, tensor-first.

    Attributes:
        scores: (B,) the best segmentation's score (its unnormalised log-probability), ``-inf``
            for a sequence the model allows no segmentation of.
        labels: (B, T) long, the label of each position, -1 past each length (and everywhere for
            a sequence with no segmentation).
        segment_starts, segment_ends, segment_labels: (N,) long, every segment of the batch in
            order (``end`` exclusive), on the device of the inputs.
        segment_offsets: (B+1,) long: sequence b owns segments ``offsets[b] .. offsets[b+1]-1``.
        segments: for each sequence the list of :class:`Segment` tiling ``0 .. L-1``, built on
            first access (one device-to-host transfer and a Python object per segment: at
            B = 1024, T = 1000 that costs far more than decoding, so prefer the tensors).

    The best segmentation is the most probable one under the model whose log-partition
    :func:`semi_crf_streaming_forward` computes.

    Example:
        >>> import torch
        >>> from torch_semimarkov import semi_crf_streaming_viterbi
        >>> cum = torch.nn.functional.pad(torch.randn(2, 12, 3).cumsum(1), (0, 0, 1, 0))
        >>> out = semi_crf_streaming_viterbi(cum, torch.zeros(3, 3), torch.zeros(4, 3), torch.tensor([12, 7]), 4)
        >>> o = out.segment_offsets
        >>> int(out.segment_starts[o[1]]), int(out.segment_ends[o[2] - 1])  # sequence 1: 0 .. 7
        (0, 7)
    """

    __slots__ = ("scores", "labels", "segment_starts", "segment_ends", "segment_labels", "segment_offsets",
                 "_segments")

    def __init__(self, scores, labels, segment_starts, segment_ends, segment_labels, segment_offsets):
        self.scores = scores
        self.labels = labels
        self.segment_starts = segment_starts
        self.segment_ends = segment_ends
        self.segment_labels = segment_labels
        self.segment_offsets = segment_offsets
        self._segments = None

    @classmethod
    def from_boundaries(cls, scores: torch.Tensor, labels: torch.Tensor, starts: torch.Tensor,
                        lengths: torch.Tensor) -> "ViterbiResult":
        """From per-position labels and segment-start flags (B, T), as the engines return them."""
        return cls(scores, labels, *segment_tensors(labels, starts, lengths))

    def segments_of(self, b: int) -> List[Segment]:
        """The segments of sequence b."""
        return self.segments[b]

    def __repr__(self) -> str:
        B, T = self.labels.shape
        return (f"ViterbiResult(batch={B}, T={T}, segments={self.segment_starts.numel()}, "
                f"device={self.labels.device})")


class MarginalsResult(NamedTuple):
    """Posterior marginals of a semi-CRF.

    * ``log_Z`` (B,): log partition.
    * ``start`` (B, T, C): P(a segment with label c starts at position t).
    * ``end`` (B, T, C): P(a segment with label c has its last position at t).
    * ``position`` (B, T, C): P(position t has label c).
    * ``boundary`` (B, T): P(a segment starts at t); 1 at t = 0.
    * ``position_entropy`` (B, T), computed on access: the entropy of each position's posterior.

    Positions at or past a sequence's length are 0.
    """

    log_Z: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor
    position: torch.Tensor
    boundary: torch.Tensor

    @property
    def position_entropy(self) -> torch.Tensor:
        """(B, T) entropy (nats) of each position's label posterior, 0 past each length (not the
        entropy of the distribution over segmentations, which counts the dependencies)."""
        p = self.position
        plogp = torch.where(p > 0, p * torch.log(p.clamp(min=1e-30)), p.new_zeros(()))
        return -plogp.sum(-1)

    @property
    def entropy(self) -> torch.Tensor:
        """Deprecated name of :attr:`position_entropy` (the head's ``Posterior`` of earlier releases)."""
        warnings.warn("MarginalsResult.entropy (the head's Posterior.entropy) is now .position_entropy: the "
                      "per-position entropy, not the distribution's (SemiMarkovCRF.entropy)", FutureWarning,
                      stacklevel=2)
        return self.position_entropy
