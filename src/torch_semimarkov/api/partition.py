"""log Z (or the best score) of a batch, differentiable: :func:`semi_crf_streaming_forward`.
"""

from __future__ import annotations

from typing import Optional

import torch

from torch_semimarkov import ops
from torch_semimarkov.api.viterbi import semi_crf_streaming_viterbi
from torch_semimarkov.core.gold import gold_score
from torch_semimarkov.core.signature import keyword_options
from torch_semimarkov.core.validation import check_num_warps, streaming_inputs, StreamingInputs
from torch_semimarkov.engines.interface import EngineOptions
from torch_semimarkov.engines.select import route


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
            the transfer (no host synchronisation, except one small read per forward of the
            blocked engine for rings of more than 16,384 K·C values: which block sums its duration
            bias allows); bad values then give wrong results.
            Shapes, dtypes and devices are always checked (that reads no data).
        label_mask: optional (B, T, C) bool, partial labels: position t may only carry the labels
            marked True. The result is then log Z (or the best score) of the allowed segmentations.
        boundary_mask: optional (B, T) integer: -1 no segment starts at t, 0 free, 1 a segment
            starts at t. With either mask the computation runs on the compiled engine's kernels
            (CPU: numba; CUDA: Triton, a (C, C) transition) or else the PyTorch path of
            :mod:`torch_semimarkov.engines.torch.dense` (any device, a Python loop over T).

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
    check_num_warps(num_warps)
    inp = streaming_inputs(cum_scores, transition, duration_bias, lengths, K, semiring, proj_start, proj_end,
                           checkpoint_interval, label_mask, boundary_mask)
    where = route(inp, inp.label_mask, inp.boundary_mask, semiring, backend, use_triton)
    if where.masks is not None and semiring == "log":
        return where.engine.log_z_masked(inp, where.masks, validate)
    if where.masks is not None:
        # the best allowed score, differentiable: the score of the best allowed segmentation (its
        # indicator is the gradient); -inf where the masks allow none
        best, labels, starts = where.engine.viterbi_masked(inp, where.masks, validate)
        score = gold_score(inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, labels.clamp(min=0),
                           starts, inp.proj_start, inp.proj_end)
        best = best.to(score.dtype)
        return torch.where(torch.isfinite(best), score, best).to(inp.cum_scores.dtype)
    tensors = (inp.cum_scores, inp.transition, inp.duration_bias, inp.proj_start, inp.proj_end)
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    options = EngineOptions(checkpoint_interval, num_warps, time_parallel)
    if needs_grad and semiring == "max":
        # the values are checked inside the Viterbi operator
        return _ViterbiScore.apply(
            inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, inp.K, inp.proj_start, inp.proj_end,
            (use_triton, options, where.name, bool(validate)),
        )
    score = ops.forward_op(inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, inp.K, semiring,
                           inp.proj_start, inp.proj_end, where.name, bool(validate), checkpoint_interval, num_warps,
                           time_parallel, needs_grad)[0]
    return score.to(inp.cum_scores.dtype)


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
        use_triton, options, backend, validate = backend_args
        inp = StreamingInputs(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end)
        result = semi_crf_streaming_viterbi(
            cum_scores, transition, duration_bias, lengths, K, proj_start=proj_start, proj_end=proj_end,
            use_triton=use_triton, num_warps=options.num_warps, time_parallel=options.time_parallel, backend=backend,
            validate=validate, _validated=inp,
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
