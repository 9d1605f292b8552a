"""``SemiMarkovCRF``: a distribution over segmentations, in the style of ``torch.distributions``.

One object holds the potentials of a batch (cumulative scores, transition, duration bias,
lengths, boundary scores, partial-label masks and the engine options) and answers every question
about the distribution they define, by the streaming engine, never by an edge tensor:

=====================  ===========================================================  ==============
member                 what                                                         differentiable
=====================  ===========================================================  ==============
``log_partition``      (B,) log Z (alias ``partition``)                              yes
``log_prob(value)``    log P(value): labels, segment lists or a result object       yes
``score(value)``       the unnormalised log-probability of ``value``                yes
``marginals``          :class:`~torch_semimarkov.MarginalsResult`                   no
``argmax``             the MAP segmentation, :class:`~torch_semimarkov.ViterbiResult`  no
``max``                (B,) its score                                                no
``topk(k)``            :class:`~torch_semimarkov.TopKResult`                        no
``sample(n)``          :class:`~torch_semimarkov.SegmentationSamples`               no
``entropy``            (B,) entropy in nats                                          yes
``cross_entropy(q)``   (B,) ``-E_p[log q(y)]``                                       yes (p and q)
``kl(q)``              (B,) ``KL(p || q)``                                           yes (p and q)
=====================  ===========================================================  ==============

Properties are computed on first access and kept, as in pytorch-struct. The cross-entropy of two
semi-CRFs over the same lengths is one forward pass of p in the expectation semiring with q's
scores inside the expectations (``-E_p[score_q]``), plus q's log Z; its gradient, for both
models, one backward pass of p (the float64 PyTorch recurrences, on any device).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence, Union

import torch

from torch_semimarkov.api.entropy import negative_expected_score, semi_crf_streaming_entropy
from torch_semimarkov.api.marginals import semi_crf_streaming_marginals
from torch_semimarkov.api.partition import semi_crf_streaming_forward
from torch_semimarkov.api.sample import semi_crf_streaming_sample
from torch_semimarkov.api.topk import semi_crf_streaming_topk
from torch_semimarkov.api.viterbi import semi_crf_streaming_viterbi
from torch_semimarkov.core.gold import gold_score, labels_to_starts, segments_to_starts
from torch_semimarkov.core.validation import check_masks
from torch_semimarkov.core.results import MarginalsResult, SegmentationSamples, TopKResult, ViterbiResult
from torch_semimarkov.core.validation import debug_checks, lengths_from, validate_streaming_inputs
from torch_semimarkov.core.values import check_input_values
from torch_semimarkov.engines.select import BACKENDS
from torch_semimarkov.scores import cumulative_scores

__all__ = ["SemiMarkovCRF"]

Value = Union[torch.Tensor, Sequence[Sequence[Sequence[int]]], ViterbiResult, TopKResult, SegmentationSamples]


class SemiMarkovCRF:
    """The distribution over segmentations that a semi-CRF's potentials define.

    A segment ``[s, s+k)`` with label c after one with label c' scores
    ``S[s+k, c] - S[s, c] + D[k-1, c] + ps[s, c] + pe[s+k-1, c] + Tr[c', c]`` (the first segment:
    ``logsumexp_{c'} Tr[c', c]``), and ``P(y) = exp(score(y) - log Z)`` over the segmentations
    that tile each sequence (and that the masks allow, when given).

    Args:
        cum_scores: (B, T+1, C) cumulative per-position scores, ``[:, 0] = 0`` (build them from
            per-position scores with :meth:`from_scores`, which keeps float32 precise).
        transition: (C, C) ``[c_src, c_dst]`` or (K, C, C) indexed ``[k-1]``; ``-inf`` forbids.
        duration_bias: (K, C), row ``k-1`` scores duration k; ``-inf`` forbids.
        lengths: (B,) integer lengths in [1, T] (or pass ``mask``).
        K: the longest segment (default ``duration_bias.shape[0]``).
        proj_start, proj_end: optional (B, T, C) scores of a segment starting / having its last
            position at a position.
        mask: instead of ``lengths``, a (B, T) bool prefix mask (True at valid positions).
        label_mask, boundary_mask: optional partial labels: the distribution is then restricted
            to (conditioned on) the segmentations they allow (see
            :func:`~torch_semimarkov.semi_crf_streaming_topk`).
        backend, use_triton, checkpoint_interval, time_parallel, num_warps: the engine options of
            :func:`~torch_semimarkov.semi_crf_streaming_forward`, used by every method.
        validate: check the inputs' values once, here (one device-to-host transfer); the methods
            then run without further checks.

    Example:
        >>> import torch
        >>> from torch_semimarkov import SemiMarkovCRF
        >>> _ = torch.manual_seed(0)
        >>> scores = torch.randn(2, 12, 3)                     # (B, T, C) per-position scores
        >>> dist = SemiMarkovCRF.from_scores(scores, torch.zeros(3, 3), torch.zeros(4, 3), torch.tensor([12, 7]))
        >>> dist.log_partition.shape, dist.argmax.labels.shape
        (torch.Size([2]), torch.Size([2, 12]))
        >>> lp = dist.log_prob(dist.sample(5, generator=torch.Generator().manual_seed(1)))
        >>> lp.shape, bool((lp <= 0).all())
        (torch.Size([5, 2]), True)
        >>> float(dist.kl(dist).abs().max()) < 1e-5
        True
    """

    def __init__(
        self,
        cum_scores: torch.Tensor,
        transition: torch.Tensor,
        duration_bias: torch.Tensor,
        lengths: Optional[torch.Tensor] = None,
        K: Optional[int] = None,
        *,
        proj_start: Optional[torch.Tensor] = None,
        proj_end: Optional[torch.Tensor] = None,
        mask: Optional[torch.Tensor] = None,
        label_mask: Optional[torch.Tensor] = None,
        boundary_mask: Optional[torch.Tensor] = None,
        backend: str = "auto",
        use_triton: bool = True,
        checkpoint_interval: Optional[int] = None,
        time_parallel: Optional[bool] = None,
        num_warps: Optional[int] = None,
        validate: bool = True,
    ):
        if not isinstance(cum_scores, torch.Tensor) or cum_scores.dim() != 3:
            raise ValueError("cum_scores must be a (batch, T+1, C) tensor, got "
                             f"{tuple(cum_scores.shape) if isinstance(cum_scores, torch.Tensor) else type(cum_scores).__name__}")
        if not isinstance(backend, str) or backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if K is None:
            if not isinstance(duration_bias, torch.Tensor) or duration_bias.dim() != 2:
                raise ValueError("duration_bias must be a (K, C) tensor")
            K = int(duration_bias.shape[0])
        B, T = cum_scores.shape[0], cum_scores.shape[1] - 1
        lengths = lengths_from(lengths, mask, B, T, check=validate).to(cum_scores.device)
        inp = validate_streaming_inputs(cum_scores, transition, duration_bias, lengths, K, "log", proj_start,
                                        proj_end, checkpoint_interval, check_values=False)
        lm, bm = check_masks(label_mask, boundary_mask, inp.batch, inp.T, inp.C, inp.cum_scores.device,
                             check_values=False)
        # the values are checked once, here (one device-to-host transfer for every input and the
        # boundary mask); inside a compiled graph the engine's operators check them instead
        self._check_in_ops = bool(validate) and torch.compiler.is_compiling()
        if (validate or debug_checks()) and not self._check_in_ops:
            check_input_values(inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, inp.proj_start,
                               inp.proj_end, bm)
        self._inp = inp
        self.label_mask, self.boundary_mask = lm, bm
        self.backend, self.use_triton = backend, use_triton
        self._engine = dict(checkpoint_interval=checkpoint_interval, time_parallel=time_parallel, num_warps=num_warps)
        self._cache = {}

    @classmethod
    def from_scores(
        cls,
        scores: torch.Tensor,
        transition: torch.Tensor,
        duration_bias: torch.Tensor,
        lengths: Optional[torch.Tensor] = None,
        K: Optional[int] = None,
        *,
        mask: Optional[torch.Tensor] = None,
        dtype: Optional[torch.dtype] = None,
        **options,
    ) -> "SemiMarkovCRF":
        """The distribution of per-position scores (B, T, C): their cumulative sum, centred per
        label with the exact compensation in the duration term
        (:func:`~torch_semimarkov.scores.cumulative_scores`), so float32 stays precise at long T
        and the model is exactly that of ``scores``. ``dtype``: of the cumulative sums (default:
        that of ``scores``). The other arguments are those of :class:`SemiMarkovCRF`."""
        if not isinstance(scores, torch.Tensor) or scores.dim() != 3:
            raise ValueError(f"scores must be a (batch, T, C) tensor, got "
                             f"{tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__}")
        B, T = scores.shape[:2]
        lengths = lengths_from(lengths, mask, B, T, check=options.get("validate", True)).to(scores.device)
        cum, db = cumulative_scores(scores, lengths, duration_bias, dtype)
        return cls(cum, transition.to(cum.dtype), db, lengths, K, **options)

    # ------------------------------------------------------------------ the inputs

    @property
    def cum_scores(self) -> torch.Tensor:
        return self._inp.cum_scores

    @property
    def transition(self) -> torch.Tensor:
        return self._inp.transition

    @property
    def duration_bias(self) -> torch.Tensor:
        return self._inp.duration_bias

    @property
    def proj_start(self) -> Optional[torch.Tensor]:
        return self._inp.proj_start

    @property
    def proj_end(self) -> Optional[torch.Tensor]:
        return self._inp.proj_end

    @property
    def lengths(self) -> torch.Tensor:
        """(B,) long."""
        return self._inp.lengths

    @property
    def K(self) -> int:
        return self._inp.K

    @property
    def num_classes(self) -> int:
        return self._inp.C

    @property
    def batch_shape(self) -> torch.Size:
        return torch.Size([self._inp.batch])

    def __repr__(self) -> str:
        i = self._inp
        masks = "" if self.label_mask is None and self.boundary_mask is None else ", masked"
        return (f"SemiMarkovCRF(batch={i.batch}, T={i.T}, K={i.K}, C={i.C}, "
                f"transition={tuple(i.transition.shape)}{masks}, device={i.cum_scores.device})")

    def _args(self):
        i = self._inp
        return (i.cum_scores, i.transition, i.duration_bias, i.lengths, i.K)

    def _opts(self, engine: bool = False) -> dict:
        opts = dict(proj_start=self._inp.proj_start, proj_end=self._inp.proj_end, label_mask=self.label_mask,
                    boundary_mask=self.boundary_mask, backend=self.backend, use_triton=self.use_triton,
                    validate=self._check_in_ops)
        if engine:
            opts.update(self._engine)
        return opts

    def _cached(self, name: str, fn):
        if name not in self._cache:
            self._cache[name] = fn()
        return self._cache[name]

    # ------------------------------------------------------------------ the distribution

    @property
    def log_partition(self) -> torch.Tensor:
        """(B,) log Z (of the allowed segmentations, with masks); ``-inf`` for a sequence with none."""
        return self._cached("log_partition", lambda: semi_crf_streaming_forward(*self._args(),
                                                                                **self._opts(engine=True)))

    partition = log_partition

    @property
    def marginals(self) -> MarginalsResult:
        """Posterior marginals: ``start``, ``end``, ``position`` (B, T, C), ``boundary`` (B, T),
        ``log_Z`` (B,) (:class:`~torch_semimarkov.MarginalsResult`)."""
        return self._cached("marginals", lambda: semi_crf_streaming_marginals(*self._args(),
                                                                              **self._opts(engine=True)))

    @property
    def argmax(self) -> ViterbiResult:
        """The most probable segmentation of each sequence (Viterbi; with masks, the best allowed)."""
        return self._cached("argmax", lambda: semi_crf_streaming_viterbi(*self._args(), **self._opts(engine=True)))

    @property
    def max(self) -> torch.Tensor:
        """(B,) the score of the most probable segmentation (``-inf`` where none exists)."""
        return self.argmax.scores

    def topk(self, k: int) -> TopKResult:
        """The k most probable segmentations of each sequence, best first."""
        return semi_crf_streaming_topk(*self._args(), k=k, **self._opts())

    def sample(self, num_samples: int = 1, *, generator: Optional[torch.Generator] = None) -> SegmentationSamples:
        """``num_samples`` exact samples per sequence: labels (S, B, T), ``log_prob`` (S, B)."""
        return semi_crf_streaming_sample(*self._args(), num_samples=num_samples, generator=generator,
                                         **self._opts())

    @property
    def entropy(self) -> torch.Tensor:
        """(B,) entropy in nats, differentiable (0 for a sequence with no allowed segmentation)."""
        return self._cached("entropy", lambda: semi_crf_streaming_entropy(*self._args(), **self._opts()))

    def score(self, value: Value) -> torch.Tensor:
        """The unnormalised log-probability of segmentations, differentiable: (B,) for one per
        sequence, ``(*lead, B)`` for ``value`` with leading dimensions (samples, ranks); ``-inf`` for
        one the model or the masks forbid. See :meth:`log_prob` for the forms of ``value``."""
        labels, starts, lead = self._segmentations(value)
        i = self._inp
        n = int(math.prod(lead))
        expand = (lambda t: None if t is None else t.unsqueeze(0).expand(n, *t.shape).reshape(-1, *t.shape[1:]))
        cum, lengths = expand(i.cum_scores), i.lengths.repeat(n)
        score = gold_score(cum, i.transition, i.duration_bias, lengths, labels, starts, expand(i.proj_start),
                           expand(i.proj_end))
        if self.label_mask is not None or self.boundary_mask is not None:
            score = torch.where(self._outside_masks(labels, starts, n), torch.full_like(score, -math.inf), score)
        return score.reshape(*lead, i.batch) if lead else score

    def log_prob(self, value: Value) -> torch.Tensor:
        """``log P(value)`` = score - log Z, differentiable.

        ``value`` is one of: a (B, T) or ``(*lead, B, T)`` integer tensor of labels (each maximal run of
        a label is one segment, runs longer than K split into K-position pieces; anything past a
        sequence's length is ignored); a list of B lists of ``(start, end, label)`` segments (for
        segmentations where neighbours may share a label); or a result of this distribution
        (:class:`~torch_semimarkov.ViterbiResult`, :class:`~torch_semimarkov.TopKResult`,
        :class:`~torch_semimarkov.SegmentationSamples`), whose segments are used as they are.

        Returns (B,) or ``(*lead, B)``: (S, B) for samples; for a k-best list (k, B), its
        ``scores`` transposed.
        """
        score = self.score(value)
        return score - self.log_partition

    def cross_entropy(self, other: "SemiMarkovCRF") -> torch.Tensor:
        """(B,) ``H(p, q) = -sum_y p(y) log q(y)`` with p = ``self``, q = ``other`` (the same
        lengths, K and labels), differentiable with respect to both. ``0`` where p allows no
        segmentation; ``+inf`` where p gives probability to a segmentation q forbids.
        ``cross_entropy(p, p) = entropy(p)``."""
        p_inp, q_inp = self._aligned_with(other)
        neg = negative_expected_score(p_inp, (self.label_mask, self.boundary_mask), q_inp,
                                      (other.label_mask, other.boundary_mask), self.backend)
        ce = other.log_partition.to(neg.dtype) + neg
        ce = torch.where(torch.isnan(ce), torch.full_like(ce, math.inf), ce)
        ok = torch.isfinite(self.log_partition.detach())
        return torch.where(ok, ce, torch.zeros_like(ce))

    def kl(self, other: "SemiMarkovCRF") -> torch.Tensor:
        """(B,) ``KL(p || q) = H(p, q) - H(p)`` >= 0 with p = ``self``, q = ``other``,
        differentiable with respect to both; ``kl(p, p) = 0``."""
        return self.cross_entropy(other) - self.entropy.to(self.cum_scores.dtype)

    # ------------------------------------------------------------------ helpers

    def _aligned_with(self, other: "SemiMarkovCRF"):
        """Both models' inputs with one transition shape, after checking they share positions."""
        if not isinstance(other, SemiMarkovCRF):
            raise TypeError(f"other must be a SemiMarkovCRF, got {type(other).__name__}")
        p, q = self._inp, other._inp
        if (p.batch, p.T, p.C, p.K) != (q.batch, q.T, q.C, q.K):
            raise ValueError(f"the two distributions must share batch, T, C and K: (B, T, C, K) = "
                             f"{(p.batch, p.T, p.C, p.K)} and {(q.batch, q.T, q.C, q.K)}")
        if not torch.equal(p.lengths, q.lengths.to(p.lengths.device)):
            raise ValueError(f"the two distributions must have the same lengths, got {p.lengths.tolist()} and "
                             f"{q.lengths.tolist()}")
        tr_p, tr_q = p.transition, q.transition
        if tr_p.dim() != tr_q.dim():  # one (C, C) and one (K, C, C): both as (K, C, C)
            tr_p = tr_p.expand(p.K, p.C, p.C) if tr_p.dim() == 2 else tr_p
            tr_q = tr_q.expand(q.K, q.C, q.C) if tr_q.dim() == 2 else tr_q
        return dataclasses.replace(p, transition=tr_p), dataclasses.replace(q, transition=tr_q)

    def _segmentations(self, value: Value):
        """(labels (N, T) long, starts (N, T) bool, leading dims) with N = prod(lead)·B."""
        i = self._inp
        B, T = i.batch, i.T
        dev = i.cum_scores.device
        if isinstance(value, TopKResult):
            labels, starts = self._result_rows(value)
            k = value.labels.shape[1]
            # (B, k, T) -> (k, B, T)
            labels = labels.view(B, k, T).transpose(0, 1).reshape(-1, T)
            starts = starts.view(B, k, T).transpose(0, 1).reshape(-1, T)
            return labels, starts, (k,)
        if isinstance(value, (ViterbiResult, SegmentationSamples)):
            labels, starts = self._result_rows(value)
            return labels, starts, tuple(value.labels.shape[:-2])
        if isinstance(value, torch.Tensor):
            if value.dim() < 2 or tuple(value.shape[-2:]) != (B, T):
                raise ValueError(f"labels must have shape (batch, T) = ({B}, {T}) or (..., {B}, {T}), "
                                 f"got {tuple(value.shape)}")
            if value.dtype.is_floating_point or value.dtype == torch.bool:
                raise ValueError(f"labels must be an integer tensor, got {value.dtype}")
            lead = tuple(value.shape[:-2])
            n = int(math.prod(lead))
            lengths = i.lengths.repeat(n)
            flat = value.reshape(-1, T).to(dev)
            valid = torch.arange(T, device=dev)[None, :] < lengths[:, None]
            bad = valid & ((flat < 0) | (flat >= i.C))
            if bool(bad.any()):
                r, t = (int(x) for x in bad.nonzero()[0])
                raise ValueError(f"labels must lie in [0, {i.C}) inside each sequence; row {r} has {int(flat[r, t])} "
                                 f"at position {t}")
            labels, starts = labels_to_starts(torch.where(valid, flat, torch.full_like(flat, -100)), lengths, i.C,
                                              i.K, check=False)
            return labels, starts, lead
        labels, starts = segments_to_starts(value, i.lengths, T, i.C, i.K)
        return labels, starts, ()

    def _result_rows(self, result):
        """(labels, starts) (rows, T) of a result object, from its segment tensors."""
        T = self._inp.T
        labels = result.labels.reshape(-1, T).clamp(min=0)
        rows = labels.shape[0]
        starts = torch.zeros(rows, T, dtype=torch.bool, device=labels.device)
        row = torch.repeat_interleave(torch.arange(rows, device=labels.device), result.segment_offsets.diff())
        starts[row, result.segment_starts] = True
        return labels, starts

    def _outside_masks(self, labels, starts, n) -> torch.Tensor:
        """(N,) bool: the segmentation breaks ``label_mask`` or ``boundary_mask``."""
        i = self._inp
        T = i.T
        lengths = i.lengths.repeat(n)
        valid = torch.arange(T, device=labels.device)[None, :] < lengths[:, None]
        bad = torch.zeros_like(valid)
        if self.label_mask is not None:
            lm = self.label_mask.repeat(n, 1, 1)
            bad |= valid & ~lm.gather(2, labels[..., None]).squeeze(-1)
        if self.boundary_mask is not None:
            bm = self.boundary_mask.repeat(n, 1)
            bad |= valid & (((bm == -1) & starts) | ((bm == 1) & ~starts))
        return bad.any(1)
