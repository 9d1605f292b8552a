"""Public streaming API: dispatch between the Triton, compiled CPU (numba) and PyTorch paths, and
the autograd Functions.

``backend="auto"`` (the default, :mod:`.backends`) runs the Triton kernels on CUDA tensors when
Triton imports and ``use_triton=True``, the compiled CPU engine on CPU tensors when numba imports,
and the PyTorch path otherwise (on any device). All paths return the same quantities; the backward
is hand-written, never an autograd graph over T.
"""

from __future__ import annotations

import warnings
from typing import List, NamedTuple, Optional

import torch

from torch_semimarkov import ops
from torch_semimarkov.core.cumsum import cumsum_time
from torch_semimarkov.engines.interface import ENGINES, EngineOptions
from torch_semimarkov.engines.select import backend_for, triton_available
from torch_semimarkov.core.segments import Segment, SegmentTensorsMixin, segment_tensors
from torch_semimarkov.core.signature import keyword_options
from torch_semimarkov.core.validation import StreamingInputs, check_input_values, debug_checks, validate_streaming_inputs


def _check_num_warps(num_warps) -> None:
    if num_warps is None:
        return
    if isinstance(num_warps, bool) or not isinstance(num_warps, int) or num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"num_warps must be None or one of 1, 2, 4, 8, 16, got {num_warps!r}")


@keyword_options("semiring", "proj_start", "proj_end", "use_triton", "num_warps", "checkpoint_interval",
                 "time_parallel", "backend", "validate", "label_mask", "boundary_mask")
def semi_crf_streaming_forward(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths: torch.Tensor,
    K: int,
    *,
    semiring: str = "log",
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
    use_triton: bool = True,
    num_warps: Optional[int] = None,
    checkpoint_interval: Optional[int] = None,
    time_parallel: Optional[bool] = None,
    backend: str = "auto",
    validate: bool = True,
    label_mask: Optional[torch.Tensor] = None,
    boundary_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Log partition function (or Viterbi score) of a semi-CRF, streamed in O(K·C) memory.

    Args:
        cum_scores: (B, T+1, C) float32/float64 cumulative label scores; ``cum_scores[:, 0] = 0``
            and ``cum_scores[:, t]`` sums the per-position scores of positions 0..t-1.
        transition: (C, C) scores ``[c_src, c_dst]`` (``-inf``, or any value ``<= NEG_INF``,
            forbids a move), or (K, C, C) duration-dependent, indexed ``[k-1]`` for the segment
            being entered.
        duration_bias: (K, C), row ``k-1`` is the bias of a duration-k segment (``-inf`` or
            ``<= NEG_INF`` forbids that duration for that label).
        lengths: (B,) integer lengths in [1, T].
        K: maximum segment duration (any K >= 1; K = 1 is a linear-chain CRF).
        semiring: ``"log"`` for log Z or ``"max"`` for the Viterbi score (the score of the most
            probable segmentation, see :func:`semi_crf_streaming_viterbi`); both are
            differentiable (the gradient of the max is the indicator of the best segmentation).
        proj_start, proj_end: optional (B, T, C) scores added to a segment starting (resp. having
            its last position) at a position.
        use_triton: use the Triton kernels when the tensors are on CUDA (False keeps
            ``backend="auto"`` off Triton).
        num_warps: Triton warps per program; None (default) picks them from the problem size
            (measured best per ring size on an H200); an int forces that many.
        checkpoint_interval: positions between forward checkpoints (default ``max(K, sqrt(T·K))``).
        time_parallel: GPU engine: ``None`` (default) runs the recurrences parallel over time
            (chunks with fix-up, exact) when the batch alone cannot fill the GPU and the sequences
            are long, ``False`` one program per sequence, ``True`` parallel whenever available.
        backend: ``"auto"`` (default: Triton for CUDA tensors, the compiled CPU engine for CPU
            tensors when numba is installed, else the PyTorch path), ``"triton"``, ``"numba"`` or
            ``"torch"``; naming one that cannot run here raises ``ValueError``.
        validate: check the values (NaN/Inf, magnitudes, lengths in [1, T]) inside the engine's
            operator, with one device-to-host transfer (default True). ``False`` skips them and
            the transfer (no host synchronisation at all); bad values then give wrong results.
            Shapes, dtypes and devices are always checked (that reads no data).
        label_mask: optional (B, T, C) bool, partial labels: position t may only carry the labels
            marked True. The result is then log Z (or the best score) of the allowed segmentations.
        boundary_mask: optional (B, T) integer: -1 no segment starts at t, 0 free, 1 a segment
            starts at t. With either mask the computation runs on the compiled engine's kernels
            (CPU: numba; CUDA: Triton, a (C, C) transition) or else the PyTorch path of
            :mod:`torch_semimarkov.streaming.distribution` (any device, a Python loop over T).

    The engine runs as the operator ``torch.ops.torch_semimarkov.forward`` (with a registered
    backward), so ``torch.compile`` and ``torch.export`` see one opaque node (docs/guide.md).

    Returns:
        (B,) log Z (``"log"``) or best segmentation score (``"max"``), dtype of ``cum_scores``;
        ``-inf`` for a sequence that the model allows no segmentation of (its gradients are 0).

    Example:
        >>> import torch
        >>> from torch_semimarkov import semi_crf_streaming_forward
        >>> B, T, K, C = 2, 50, 8, 4
        >>> scores = torch.randn(B, T, C)
        >>> cum = torch.nn.functional.pad(scores.cumsum(1), (0, 0, 1, 0))
        >>> transition = torch.zeros(C, C, requires_grad=True)
        >>> log_z = semi_crf_streaming_forward(cum, transition, torch.zeros(K, C), torch.tensor([50, 31]), K)
        >>> log_z.sum().backward(); transition.grad.shape
        torch.Size([4, 4])
    """
    _check_num_warps(num_warps)
    if label_mask is not None or boundary_mask is not None:
        return _masked_score(cum_scores, transition, duration_bias, lengths, K, semiring, proj_start, proj_end,
                             label_mask, boundary_mask, validate, backend, use_triton)
    inp = validate_streaming_inputs(
        cum_scores, transition, duration_bias, lengths, K, semiring, proj_start, proj_end, checkpoint_interval,
        check_values=False,
    )
    tensors = (inp.cum_scores, inp.transition, inp.duration_bias, inp.proj_start, inp.proj_end)
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    options = EngineOptions(checkpoint_interval, num_warps, time_parallel)
    name = backend_for(inp, use_triton, backend)
    if needs_grad and semiring == "max":
        if validate or debug_checks():
            check_input_values(inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, inp.proj_start,
                               inp.proj_end)
        return _ViterbiScore.apply(
            inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, inp.K, inp.proj_start, inp.proj_end,
            (use_triton, options, name),
        )
    score = ops.forward_op(inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, inp.K, semiring,
                           inp.proj_start, inp.proj_end, name, bool(validate), checkpoint_interval, num_warps,
                           time_parallel, needs_grad)[0]
    return score.to(inp.cum_scores.dtype)


def _masked_score(cum_scores, transition, duration_bias, lengths, K, semiring, proj_start, proj_end, label_mask,
                  boundary_mask, validate, backend="auto", use_triton=True):
    """log Z or the best score of the segmentations the masks allow (the engine where it takes the
    masks, else the PyTorch path)."""
    from torch_semimarkov.streaming import distribution
    if semiring not in ("log", "max"):
        raise ValueError(f"semiring must be one of ('log', 'max'), got {semiring!r}")
    if semiring == "log":
        return distribution.constrained_log_partition(cum_scores, transition, duration_bias, lengths, K,
                                                      proj_start=proj_start, proj_end=proj_end,
                                                      label_mask=label_mask, boundary_mask=boundary_mask,
                                                      validate=validate, backend=backend, use_triton=use_triton)
    # the best allowed segmentation (the engine's masked Viterbi where it runs, else k-best with k = 1)
    best = semi_crf_streaming_viterbi(cum_scores, transition, duration_bias, lengths, K, proj_start=proj_start,
                                      proj_end=proj_end, validate=validate, label_mask=label_mask,
                                      boundary_mask=boundary_mask, backend=backend, use_triton=use_triton)
    # the best score, differentiable: the score of the best segmentation (its indicator is the gradient)
    inp = validate_streaming_inputs(cum_scores, transition, duration_bias, lengths, K, "max", proj_start, proj_end,
                                    check_values=False)
    from torch_semimarkov.core.gold import gold_score
    starts = torch.zeros_like(best.labels, dtype=torch.bool)
    rows = torch.repeat_interleave(torch.arange(inp.batch, device=starts.device), best.segment_offsets.diff())
    starts[rows, best.segment_starts] = True
    labels = best.labels.clamp(min=0)
    score = gold_score(inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, labels, starts,
                       inp.proj_start, inp.proj_end)
    scores = best.scores.to(score.dtype)
    return torch.where(torch.isfinite(scores), score, scores).to(inp.cum_scores.dtype)


class _ViterbiScore(torch.autograd.Function):
    """The best segmentation's score; its gradient is the indicator of that segmentation.

    d score / d input counts how often each score term enters the best path (docs/internals.md §1):
    +1 at ``cum_scores[end, c]``, -1 at ``cum_scores[start, c]``, +1 at ``duration_bias[k-1, c]``,
    ``proj_start[start, c]`` and ``proj_end[end-1, c]``, +1 at the transition taken into each later
    segment, and for the first segment the gradient of its phantom term
    ``logsumexp_{c'} Tr[c', c]``: ``softmax_{c'} Tr[:, c]`` (``Tr[k-1]`` for (K, C, C)). A sequence
    with no allowed segmentation (score ``-inf``) contributes no gradient.
    """

    @staticmethod
    def forward(ctx, cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, backend_args):
        use_triton, options, backend = backend_args
        inp = StreamingInputs(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end)
        result = semi_crf_streaming_viterbi(
            cum_scores, transition, duration_bias, lengths, K, proj_start=proj_start, proj_end=proj_end,
            use_triton=use_triton, num_warps=options.num_warps, time_parallel=options.time_parallel, backend=backend,
            _validated=inp,
        )
        seg_batch = torch.repeat_interleave(torch.arange(lengths.shape[0], device=lengths.device), result.num_segments)
        ctx.save_for_backward(cum_scores, transition, result.labels, seg_batch, result.segment_starts,
                              result.segment_ends, result.segment_labels)
        ctx.K = K
        return result.scores

    @staticmethod
    def backward(ctx, grad_output):
        cum_scores, transition, labels, b_idx, s_idx, e_idx, c_idx = ctx.saved_tensors
        B, T1, C = cum_scores.shape
        K, dtype, device = ctx.K, cum_scores.dtype, cum_scores.device
        need = ctx.needs_input_grad
        p_start = torch.zeros(B, T1 - 1, C, dtype=dtype, device=device)
        p_end = torch.zeros_like(p_start)
        grad_db = torch.zeros(K, C, dtype=dtype, device=device)
        grad_tr = torch.zeros_like(transition)
        if b_idx.numel():
            weight = grad_output.to(dtype)[b_idx]
            p_start.index_put_((b_idx, s_idx, c_idx), weight, accumulate=True)
            p_end.index_put_((b_idx, e_idx - 1, c_idx), weight, accumulate=True)
            k_idx = e_idx - s_idx - 1
            grad_db.index_put_((k_idx, c_idx), weight, accumulate=True)
            first = s_idx == 0
            later = ~first
            prev = labels[b_idx, (s_idx - 1).clamp(min=0)]
            if transition.dim() == 3:
                grad_tr.index_put_((k_idx[later], prev[later], c_idx[later]), weight[later], accumulate=True)
                # (n_first, C'): softmax over the source of the column Tr[k-1, :, c]
                soft = torch.softmax(transition[k_idx[first], :, c_idx[first]], dim=1)
                grad_tr.index_put_((k_idx[first][:, None], torch.arange(C, device=device)[None, :], c_idx[first][:, None]),
                                   soft * weight[first][:, None], accumulate=True)
            else:
                grad_tr.index_put_((prev[later], c_idx[later]), weight[later], accumulate=True)
                soft = torch.softmax(transition[:, c_idx[first]].t(), dim=1)  # (n_first, C')
                grad_tr.index_put_((torch.arange(C, device=device)[None, :].expand_as(soft), c_idx[first][:, None].expand_as(soft)),
                                   soft * weight[first][:, None], accumulate=True)
        grad_cum = None
        if need[0]:
            grad_cum = torch.zeros_like(cum_scores)
            grad_cum[:, 1:] += p_end
            grad_cum[:, :-1] -= p_start
        return (
            grad_cum,
            grad_tr if need[1] else None,
            grad_db if need[2] else None,
            None,
            None,
            p_start if need[5] else None,
            p_end if need[6] else None,
            None,
        )


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


@keyword_options("proj_start", "proj_end", "use_triton", "num_warps", "checkpoint_interval", "time_parallel",
                 "backend", "validate")
def semi_crf_streaming_viterbi(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths: torch.Tensor,
    K: int,
    *,
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
    use_triton: bool = True,
    num_warps: Optional[int] = None,
    checkpoint_interval: Optional[int] = None,
    time_parallel: Optional[bool] = None,
    backend: str = "auto",
    validate: bool = True,
    label_mask: Optional[torch.Tensor] = None,
    boundary_mask: Optional[torch.Tensor] = None,
    _validated: Optional[StreamingInputs] = None,
) -> ViterbiResult:
    """Viterbi decoding: the most probable segmentation of each sequence (the MAP).

    Takes the inputs of :func:`semi_crf_streaming_forward`. The first segment keeps the term it
    has in log Z, ``logsumexp_{c'} Tr[c', c]`` (its phantom predecessor is marginalised, not
    maximised), so the result maximises exactly the probability that log Z normalises.
    flash-semicrf 0.2.0's ``semiring="max"`` maximises that predecessor instead
    (``max_{c'} Tr[c', c]``), a different model, and can return a less probable segmentation.
    Ties break toward the smallest index (predecessor label, then duration), identically on the
    CPU and the GPU. A sequence with no allowed segmentation gets score ``-inf``, labels -1 and no
    segments.

    ``validate``, ``label_mask`` and ``boundary_mask`` are those of
    :func:`semi_crf_streaming_forward` (with a mask: the best allowed segmentation, constrained
    decoding, on the PyTorch path). The engine runs as the operator ``torch.ops.torch_semimarkov.viterbi``; the segment tensors are built from its labels and
    start flags with tensor operations (no Python loop, no host transfer).

    Returns:
        :class:`ViterbiResult`: ``scores`` (B,), ``labels`` (B, T) and the segments as tensors
        (``segment_starts``, ``segment_ends``, ``segment_labels``, ``segment_offsets``), all on the
        device of the inputs; ``segments`` builds Python lists on request. Not differentiable.

    Example:
        >>> import torch
        >>> from torch_semimarkov import semi_crf_streaming_viterbi
        >>> cum = torch.nn.functional.pad(torch.randn(1, 12, 3).cumsum(1), (0, 0, 1, 0))
        >>> out = semi_crf_streaming_viterbi(cum, torch.zeros(3, 3), torch.zeros(4, 3), torch.tensor([12]), 4)
        >>> int(out.segment_starts[0]), int(out.segment_ends[-1])  # the segments tile 0 .. 12
        (0, 12)
        >>> out.segments[0][0].start  # Python lists, built on request
        0
    """
    _check_num_warps(num_warps)
    if label_mask is not None or boundary_mask is not None:
        from torch_semimarkov.streaming.distribution import masked_viterbi_on_engine, semi_crf_streaming_topk
        on_engine = masked_viterbi_on_engine(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end,
                                             label_mask, boundary_mask, validate, backend, use_triton)
        if on_engine is not None:
            return ViterbiResult.from_boundaries(*on_engine)
        # (a named backend was checked above; the k-best path is the float64 PyTorch one)
        best = semi_crf_streaming_topk(cum_scores, transition, duration_bias, lengths, K, k=1,
                                       proj_start=proj_start, proj_end=proj_end, label_mask=label_mask,
                                       boundary_mask=boundary_mask, validate=False,
                                       backend=backend, use_triton=use_triton)
        return ViterbiResult(best.scores[:, 0], best.labels[:, 0], best.segment_starts, best.segment_ends,
                             best.segment_labels, best.segment_offsets)
    if _validated is not None:
        inp, validate = _validated, False
    else:
        inp = validate_streaming_inputs(cum_scores, transition, duration_bias, lengths, K, "max", proj_start,
                                        proj_end, checkpoint_interval, check_values=False)
    name = backend_for(inp, use_triton, backend)
    detach = [None if t is None else t.detach()
              for t in (inp.cum_scores, inp.transition, inp.duration_bias, inp.proj_start, inp.proj_end)]
    with torch.no_grad():
        scores, labels, starts = ops.viterbi_op(detach[0], detach[1], detach[2], inp.lengths, inp.K, detach[3],
                                                detach[4], name, bool(validate), num_warps, time_parallel)
    # a sequence with no allowed segmentation (score -inf) has no starts, hence no segments
    return ViterbiResult.from_boundaries(scores, labels, starts, inp.lengths)


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


@keyword_options("proj_start", "proj_end", "use_triton", "num_warps", "checkpoint_interval", "time_parallel",
                 "backend", "validate", "label_mask", "boundary_mask")
def semi_crf_streaming_marginals(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths: torch.Tensor,
    K: int,
    *,
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
    use_triton: bool = True,
    num_warps: Optional[int] = None,
    checkpoint_interval: Optional[int] = None,
    time_parallel: Optional[bool] = None,
    backend: str = "auto",
    validate: bool = True,
    label_mask: Optional[torch.Tensor] = None,
    boundary_mask: Optional[torch.Tensor] = None,
) -> MarginalsResult:
    """Posterior marginals from one streaming forward and backward pass (no edge tensor).

    Takes the inputs of :func:`semi_crf_streaming_forward` (``validate`` and the masks included;
    with a mask, the marginals of the distribution restricted to the allowed segmentations, on the
    PyTorch path); runs the operators ``torch.ops.torch_semimarkov.forward`` and ``.backward``.

    Returns:
        :class:`MarginalsResult` ``(log_Z, start, end, position, boundary)``. Not differentiable.

    Example:
        >>> import torch
        >>> from torch_semimarkov import semi_crf_streaming_marginals
        >>> cum = torch.nn.functional.pad(torch.randn(1, 20, 3).cumsum(1), (0, 0, 1, 0))
        >>> m = semi_crf_streaming_marginals(cum, torch.zeros(3, 3), torch.zeros(5, 3), torch.tensor([20]), 5)
        >>> bool(torch.allclose(m.position.sum(-1), torch.ones(1, 20)))
        True
    """
    _check_num_warps(num_warps)
    inp = validate_streaming_inputs(
        cum_scores, transition, duration_bias, lengths, K, "log", proj_start, proj_end, checkpoint_interval,
        check_values=False,
    )
    args = [inp.cum_scores.detach(), inp.transition.detach(), inp.duration_bias.detach(), inp.lengths, inp.K]
    ps = None if inp.proj_start is None else inp.proj_start.detach()
    pe = None if inp.proj_end is None else inp.proj_end.detach()
    name = backend_for(inp, use_triton, backend)
    opts = (checkpoint_interval, num_warps, time_parallel)
    with torch.no_grad():
        if label_mask is not None or boundary_mask is not None:
            from torch_semimarkov.streaming.distribution import check_masks, constrained_marginals, engine_choice
            if validate or debug_checks():
                check_input_values(inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, inp.proj_start,
                                   inp.proj_end)
            masks = check_masks(label_mask, boundary_mask, inp.batch, inp.T, inp.C, inp.cum_scores.device)
            log_z, p_start, p_end = constrained_marginals(inp, *masks, engine_choice(inp, backend, use_triton),
                                                         backend)
        else:
            log_z, state_a, state_b, meta = ops.forward_op(*args, "log", ps, pe, name, bool(validate), *opts, True)
            # the gradients of sum_b log Z[b] with respect to the projections are the start / end marginals
            ones = torch.ones_like(log_z)
            _, _, _, p_start, p_end = ops.backward_op(ones, *args, ps, pe, log_z, state_a, state_b, meta, name,
                                                      *opts, [False, False, False, True, True])
    # cumulative sums in float64: over 10^6 positions float32 would lose ~1e-2
    starts64 = cumsum_time(p_start.double())
    ends64 = cumsum_time(p_end.double())
    position = starts64.clone()
    position[:, 1:] -= ends64[:, :-1]
    past_end = torch.arange(position.shape[1], device=position.device)[None, :] >= inp.lengths[:, None]
    position = position.clamp_(0.0, 1.0).masked_fill_(past_end[..., None], 0.0).to(p_start.dtype)
    boundary = p_start.sum(-1)
    return MarginalsResult(log_z.to(p_start.dtype), p_start, p_end, position, boundary)
