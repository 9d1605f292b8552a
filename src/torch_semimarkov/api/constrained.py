"""The validation shared by the calls beyond log Z (k-best, samples, entropy: inputs, masks, the
engine choice) and :func:`constrained_log_partition`, log Z under partial labels with the
keyword arguments of those calls (the head's and the distribution object's partial-label loss).
"""

from __future__ import annotations

import torch

from torch_semimarkov.core.signature import keyword_options
from torch_semimarkov.core.validation import debug_checks, streaming_inputs, validate_streaming_inputs
from torch_semimarkov.engines.select import engine_choice, route


def _validated(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, label_mask,
               boundary_mask, validate=True, backend="auto", use_triton=True, unmasked_kernels=None,
               any_transition=False):
    """``(inputs, label_mask, boundary_mask, engine)``: the checked inputs and masks, and whether
    the call may (``"may"``) or must (``"must"``) run on the engine's kernels, or not (``"no"``).

    ``unmasked_kernels``: for a call whose kernels take no masks, what they do (``"samples"``,
    ``"runs k-best lists"``): ``backend="triton"`` with a mask then raises ``ValueError``.
    ``any_transition``: the call's kernels take a (K, C, C) transition too (sampling)."""
    inp = validate_streaming_inputs(cum_scores, transition, duration_bias, lengths, K, "log", proj_start, proj_end,
                                    check_values=validate or debug_checks(), label_mask=label_mask,
                                    boundary_mask=boundary_mask)
    choice = engine_choice(inp, backend, use_triton, any_transition)
    masked = inp.label_mask is not None or inp.boundary_mask is not None
    if unmasked_kernels is not None and choice == "must" and masked:
        raise ValueError(f"backend='triton' {unmasked_kernels} without masks only; use backend='auto' or 'torch' "
                         "with label_mask / boundary_mask")
    return inp, inp.label_mask, inp.boundary_mask, choice


@keyword_options("proj_start", "proj_end", "label_mask", "boundary_mask", "validate")
def constrained_log_partition(
    cum_scores, transition, duration_bias, lengths, K, *, proj_start=None, proj_end=None,
    label_mask=None, boundary_mask=None, validate=True, backend="auto", use_triton=True,
) -> torch.Tensor:
    """(B,) log Z of the segmentations that ``label_mask`` and ``boundary_mask`` allow.

    Differentiable with respect to every float input (a hand-written forward-backward pass, not
    autograd over T). ``-inf`` for a sequence the masks leave no segmentation. With no masks it
    equals :func:`~torch_semimarkov.semi_crf_streaming_forward` (which is faster: use that).

    Args: those of :func:`semi_crf_streaming_topk` (without ``k``).
    """
    inp = streaming_inputs(cum_scores, transition, duration_bias, lengths, K, "log", proj_start, proj_end,
                           label_mask=label_mask, boundary_mask=boundary_mask)
    where = route(inp, inp.label_mask, inp.boundary_mask, "log", backend, use_triton, masked=True)
    return where.engine.log_z_masked(inp, where.masks, validate)
