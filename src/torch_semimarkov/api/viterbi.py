"""The best segmentation of each sequence (the MAP): :func:`semi_crf_streaming_viterbi`.
"""

from __future__ import annotations

from typing import Optional

import torch

from torch_semimarkov import ops
from torch_semimarkov.core.results import ViterbiResult
from torch_semimarkov.core.signature import keyword_options
from torch_semimarkov.core.validation import check_num_warps, streaming_inputs, StreamingInputs
from torch_semimarkov.engines.select import route


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
    check_num_warps(num_warps)
    if _validated is None:
        inp = streaming_inputs(cum_scores, transition, duration_bias, lengths, K, "max", proj_start, proj_end,
                               checkpoint_interval, label_mask, boundary_mask)
    else:
        inp = _validated
    where = route(inp, inp.label_mask, inp.boundary_mask, "max", backend, use_triton)
    if where.masks is not None:
        scores, labels, starts = where.engine.viterbi_masked(inp, where.masks, validate)
        return ViterbiResult.from_boundaries(scores.to(inp.cum_scores.dtype), labels, starts, inp.lengths)
    name = where.name
    detach = [None if t is None else t.detach()
              for t in (inp.cum_scores, inp.transition, inp.duration_bias, inp.proj_start, inp.proj_end)]
    with torch.no_grad():
        scores, labels, starts = ops.viterbi_op(detach[0], detach[1], detach[2], inp.lengths, inp.K, detach[3],
                                                detach[4], name, bool(validate), num_warps, time_parallel)
    # a sequence with no allowed segmentation (score -inf) has no starts, hence no segments
    return ViterbiResult.from_boundaries(scores, labels, starts, inp.lengths)
