"""Posterior marginals from one forward and backward pass: :func:`semi_crf_streaming_marginals`.
"""

from __future__ import annotations

from typing import Optional

import torch

from torch_semimarkov import ops
from torch_semimarkov.core.cumsum import cumsum_time
from torch_semimarkov.core.results import MarginalsResult
from torch_semimarkov.core.signature import keyword_options
from torch_semimarkov.core.validation import check_num_warps, streaming_inputs
from torch_semimarkov.engines.select import route


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
    check_num_warps(num_warps)
    inp = streaming_inputs(cum_scores, transition, duration_bias, lengths, K, "log", proj_start, proj_end,
                           checkpoint_interval, label_mask, boundary_mask)
    where = route(inp, inp.label_mask, inp.boundary_mask, "log", backend, use_triton)
    with torch.no_grad():
        if where.masks is not None:
            log_z, p_start, p_end = where.engine.marginals_masked(inp, where.masks, validate)
        else:
            args = [inp.cum_scores.detach(), inp.transition.detach(), inp.duration_bias.detach(), inp.lengths, inp.K]
            ps = None if inp.proj_start is None else inp.proj_start.detach()
            pe = None if inp.proj_end is None else inp.proj_end.detach()
            opts = (checkpoint_interval, num_warps, time_parallel)
            log_z, state_a, state_b, meta = ops.forward_op(*args, "log", ps, pe, where.name, bool(validate), *opts,
                                                           True)
            # the gradients of sum_b log Z[b] with respect to the projections are the start / end marginals
            ones = torch.ones_like(log_z)
            _, _, _, p_start, p_end = ops.backward_op(ones, *args, ps, pe, log_z, state_a, state_b, meta, where.name,
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
