"""Per-position scores to the engine's cumulative form, exactly and with small float32 values.

The engine reads per-position label scores as their cumulative sum ``cum_scores`` (B, T+1, C). A
model's raw scores usually drift (a label whose score is +2 everywhere reaches 2·10^6 after 10^6
positions), and float32 cumulative values that large lose the digits a segment's score
``S[e, c] - S[s, c]`` needs. Subtracting a per-label mean ``mu_c`` before the sum keeps them small,
but it is not a constant shift: a segmentation loses ``mu_c`` for each of its positions labelled c,
so different segmentations lose different amounts, and a mean taken over the sequence makes the
model of one position depend on every other position. :func:`cumulative_scores` therefore gives
the loss back exactly: a duration-k segment of label c loses ``k·mu_c`` in its content and gets
``k·mu_c`` in its duration term, so every segment (hence every segmentation) scores exactly what
the raw scores give it, whatever else is in the sequence or the batch. ``mu`` is the mean over
the whole batch's valid positions (one (C,) vector, so the compensation fits the shared (K, C)
duration bias) and is a constant for autograd: the value does not depend on it, so neither does
the gradient.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from torch_semimarkov.core.cumsum import cumsum_time

__all__ = ["cumulative_scores"]


def cumulative_scores(
    scores: torch.Tensor,
    lengths: torch.Tensor,
    duration_bias: torch.Tensor,
    dtype: Optional[torch.dtype] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The engine's ``(cum_scores, duration_bias)`` for per-position scores, exactly.

    Args:
        scores: (B, T, C) per-position label scores; positions at or past a sequence's length are
            ignored (they may hold anything finite).
        lengths: (B,) integer lengths in [1, T].
        duration_bias: (K, C) duration scores (``-inf`` where forbidden).
        dtype: the dtype of the results (default: that of ``scores``).

    Returns:
        ``cum_scores`` (B, T+1, C) with ``[:, 0] = 0`` (constant past each length), the cumulative
        sum of ``scores - mu``, and ``duration_bias + k·mu`` (K, C), where ``mu`` (C,) is each
        label's mean score over the batch's valid positions. Every segment, hence every
        segmentation, log Z and every marginal, equals that of the raw ``scores``.

    Example:
        >>> x = torch.tensor([[[5.0, 1.0], [7.0, 1.0], [6.0, 1.0]]])
        >>> cum, db = cumulative_scores(x, torch.tensor([3]), torch.zeros(2, 2))
        >>> (cum[0, 2] - cum[0, 0] + db[1]).tolist()  # a duration-2 segment at 0: 5 + 7 and 1 + 1
        [12.0, 2.0]
    """
    dtype = dtype or scores.dtype
    B, T, C = scores.shape
    scores = scores.to(dtype)
    valid = (torch.arange(T, device=scores.device)[None, :] < lengths.to(scores.device)[:, None])[..., None]
    zero = scores.new_zeros(())
    scores = torch.where(valid, scores, zero)
    count = lengths.sum().to(device=scores.device, dtype=dtype).clamp(min=1)
    mu = (scores.detach().sum((0, 1)) / count)  # (C,)
    centred = torch.where(valid, scores - mu, zero)
    # the scan runs along the innermost dimension (an operator: compilers call the eager scan)
    cum = torch.cat([scores.new_zeros(B, 1, C), cumsum_time(centred)], dim=1)
    K = duration_bias.shape[0]
    k = torch.arange(1, K + 1, device=scores.device, dtype=dtype)[:, None]
    return cum, duration_bias.to(dtype) + k * mu
