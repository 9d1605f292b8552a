"""The k best segmentations on every engine.
"""

from __future__ import annotations

from typing import Optional

import torch

from torch_semimarkov.api.constrained import _validated
from torch_semimarkov.api.sample import _segment_scores
from torch_semimarkov.core.results import TopKResult
from torch_semimarkov.core.signature import keyword_options
from torch_semimarkov.core.validation import StreamingInputs
from torch_semimarkov.engines.available import numba_module
from torch_semimarkov.engines.select import cpu_engine, engine_takes, refuse
from torch_semimarkov.engines.torch.dense import _Model, _NEG, dense_topk


def _topk_on_engine(inp: StreamingInputs, k: int) -> Optional["TopKResult"]:
    """The k best segmentations by sidetracks over the engine's Viterbi (:mod:`torch_semimarkov.engines.triton.topk`), with
    scores recomputed exactly from the segments; None where the engine cannot run."""
    from torch_semimarkov.engines.triton.topk import topk_on_engine
    out = topk_on_engine(inp, k)
    if out is None:
        return None
    labels, starts = out
    B, T = inp.batch, inp.T
    first = TopKResult(None, labels, starts, inp.lengths)
    score = _segment_scores(inp, B * k, first.segment_starts, first.segment_ends, first.segment_labels,
                            first.segment_offsets, per_row=k).reshape(B, k)
    exist = labels[:, :, 0] >= 0
    score = torch.where(exist, score, torch.full_like(score, _NEG))
    # the search ordered the ranks by float32 deficits: order them by the exact scores (stable)
    order = torch.sort(score, dim=1, descending=True, stable=True).indices
    if not torch.equal(order, torch.arange(k, device=order.device).expand(B, k)):
        labels = labels.gather(1, order[..., None].expand(B, k, T))
        starts = starts.gather(1, order[..., None].expand(B, k, T))
        score = score.gather(1, order)
        return TopKResult(score.to(inp.cum_scores.dtype), labels, starts, inp.lengths)
    first.scores = score.to(inp.cum_scores.dtype)
    return first


@keyword_options("k", "proj_start", "proj_end", "label_mask", "boundary_mask", "validate")
def semi_crf_streaming_topk(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths: torch.Tensor,
    K: int,
    *,
    k: int,
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
    label_mask: Optional[torch.Tensor] = None,
    boundary_mask: Optional[torch.Tensor] = None,
    backend: str = "auto",
    use_triton: bool = True,
    validate: bool = True,
) -> TopKResult:
    """The k highest-scoring distinct segmentations of each sequence, best first.

    A k-best Viterbi: each (position, label) keeps its k best prefixes (scores and backpointers,
    O(T·C·k) memory); the final k are traced back together. Rank 0 is the Viterbi segmentation
    (:func:`~torch_semimarkov.semi_crf_streaming_viterbi`, the same tie-breaking). Ties break
    deterministically: toward the shorter last segment, then the smaller predecessor label, then
    the better-ranked prefix; at the end toward the smaller final label.

    Args:
        cum_scores ... K, proj_start, proj_end: as :func:`~torch_semimarkov.semi_crf_streaming_forward`.
        k: how many segmentations per sequence (>= 1).
        label_mask: optional (B, T, C) bool: position t may only carry the labels marked True.
        boundary_mask: optional (B, T) integer: -1 no segment starts at t, 0 free, 1 a segment
            starts at t (partial annotations, known landmarks).
        backend: ``"auto"`` (default: the engine's kernels where they take the call, i.e. CUDA
            tensors, Triton and a (C, C) transition; on CPU tensors with numba installed the
            compiled CPU engine, :mod:`torch_semimarkov.engines.numba.kbest`, which runs this recurrence with the same
            scores, labels and ties, masks and both transition shapes included; else the float64
            PyTorch path), ``"triton"`` (the kernels; ``ValueError`` where they cannot take it),
            ``"torch"`` (the float64 PyTorch path, the reference) or ``"numba"`` (CPU tensors: the
            compiled CPU engine).
        use_triton: ``False`` keeps ``"auto"`` off the kernels.
        validate: check the input values (one device-to-host transfer).

    Returns:
        :class:`TopKResult`: ``scores`` (B, k), ``labels`` (B, k, T) and the segment tensors. A
        rank that does not exist has score ``-inf``, labels -1 and no segments.

    Example:
        >>> import torch
        >>> from torch_semimarkov import semi_crf_streaming_topk
        >>> cum = torch.nn.functional.pad(torch.randn(1, 10, 2).cumsum(1), (0, 0, 1, 0))
        >>> out = semi_crf_streaming_topk(cum, torch.zeros(2, 2), torch.zeros(3, 2), torch.tensor([10]), 3, k=4)
        >>> out.scores.shape, bool((out.scores[0, :-1] >= out.scores[0, 1:]).all())
        (torch.Size([1, 4]), True)
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    inp, lm, bm, choice = _validated(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end,
                                     label_mask, boundary_mask, validate, backend, use_triton, "runs k-best lists")
    if choice != "no" and lm is None and bm is None and engine_takes(inp):
        out = _topk_on_engine(inp, k)
        if out is not None:
            return out
        refuse(choice, "this k-best list")
    with torch.no_grad():
        model = _Model(inp, lm, bm)
        eng = cpu_engine(inp, backend) and numba_module("kbest")
        if eng:  # CPU tensors: this recurrence, compiled (engines/numba/kbest.py), the same results
            scores, labels, starts = eng.topk_numba(model, k)
            return TopKResult(scores.to(inp.cum_scores.dtype), labels, starts, model.lengths)
        scores, labels, flags = dense_topk(model, k)
        return TopKResult(scores.to(inp.cum_scores.dtype), labels, flags, model.lengths)
