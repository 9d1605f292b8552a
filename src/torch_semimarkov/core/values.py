"""The value checks of the inputs (NaN / Inf, magnitudes, the range of ``lengths`` and of
``boundary_mask``) with one device-to-host transfer; the engines' operators run them inside, so
that a compiled graph has no data-dependent branch."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from torch_semimarkov.core.constants import BOUNDARY_VALUES, MAX_ABS_SCORE, NEG_INF


def _raise_non_finite(name: str, t: torch.Tensor, allow_neg_inf: bool) -> None:
    n_nan = int(torch.isnan(t).sum())
    bad = torch.isnan(t) | (t == float("inf")) if allow_neg_inf else ~torch.isfinite(t)
    first = tuple(int(i) for i in bad.nonzero()[0]) if bool(bad.any()) else ()
    # where the first one is, in the words of the tensor's layout
    if name == "cum_scores" and len(first) == 3:
        at = (f"; the first at sequence {first[0]}, cumulative position {first[1]}, label {first[2]} "
              f"(a per-position score of position {max(first[1] - 1, 0)} or earlier)")
    elif len(first) == 3:
        at = f"; the first at sequence {first[0]}, position {first[1]}, label {first[2]}"
    elif len(first) == 2:
        at = f"; the first at row {first[0]}, column {first[1]}"
    else:
        at = f"; the first at index {first}"
    if allow_neg_inf:
        n_inf = int((t == float("inf")).sum())
        raise ValueError(f"{name} contains {n_nan} NaN and {n_inf} +inf values (-inf is allowed: it forbids what "
                         f"the entry scores){at}")
    n_inf = int(torch.isinf(t).sum())
    raise ValueError(f"{name} contains non-finite values ({n_nan} NaN, {n_inf} Inf){at}")


def value_stats(floats, lengths: torch.Tensor) -> torch.Tensor:
    """The minimum and maximum of each float input that is not empty, then of ``lengths``, as one
    float64 tensor on their device, without reading it (``aminmax`` propagates NaN, so these
    scalars tell everything :func:`check_value_stats` needs)."""
    present = [t.detach() for _, t, _ in floats if t.numel()]
    parts = []
    if present and len({t.dtype for t in present}) == 1:
        # one stack and one conversion for all of them (each small operation is a launch on CUDA)
        parts.append(torch.stack([m for t in present for m in torch.aminmax(t)]).to(torch.float64))
    elif present:
        parts.append(torch.stack([m.to(torch.float64) for t in present for m in torch.aminmax(t)]))
    parts.append(torch.stack(torch.aminmax(lengths.detach())).to(torch.float64))
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def _check_values(floats, lengths: torch.Tensor, T: int, boundary_mask: Optional[torch.Tensor] = None) -> None:
    """NaN/Inf, magnitude and the range of lengths (and of ``boundary_mask``'s values), with ONE
    device-to-host transfer.

    ``floats`` is a list of (name, tensor, allow_neg_inf). ``aminmax`` propagates NaN, so the
    minimum and maximum of each tensor tell everything the checks need; only a failure reads more.
    """
    bm = boundary_mask is not None and boundary_mask.numel() > 0
    if lengths.device.type == "cpu":
        # NumPy on the calling thread: torch would split each reduction over its intra-op
        # threads, which on a busy machine can cost milliseconds per call (np.min/max keep NaN)
        arrays = [t.detach().numpy() for _, t, _ in floats if t.numel()]
        arrays.append(lengths.detach().numpy())
        if bm:
            arrays.append(boundary_mask.cpu().numpy())
        values = [float(f(a)) for a in arrays for f in (np.min, np.max)]
    else:
        stats = value_stats(floats, lengths)
        if bm:
            stats = torch.cat([stats, torch.stack(torch.aminmax(boundary_mask.detach())).to(stats)])
        values = stats.tolist()
    if bm:
        values, (lo, hi) = values[:-2], values[-2:]
        if lo < -1 or hi > 1:
            raise ValueError(BOUNDARY_VALUES)
    check_value_stats(floats, values, T)


def check_value_stats(floats, values, T: int) -> None:
    """Raise the error of :func:`_check_values` from the host copy of :func:`value_stats`."""
    lo, hi = int(values[-2]), int(values[-1])
    if lo < 1 or hi > T:  # first: a zero length makes NaN of the head's per-sequence means
        _raise_lengths(lo, hi, T)
    i = 0
    for name, t, allow_neg_inf in floats:
        if not t.numel():
            continue
        t_min, t_max = values[i], values[i + 1]
        i += 2
        bad = math.isnan(t_min) or math.isnan(t_max) or t_max == math.inf or (t_min == -math.inf and not allow_neg_inf)
        if bad:
            _raise_non_finite(name, t, allow_neg_inf)
        # forbidden entries (<= NEG_INF) of transition / duration_bias are not magnitudes
        forbidding = allow_neg_inf and t_min <= NEG_INF
        big = max(abs(t_max) if not (allow_neg_inf and t_max <= NEG_INF) else 0.0, 0.0 if forbidding else abs(t_min))
        if big > MAX_ABS_SCORE:
            raise ValueError(
                f"{name} holds values of magnitude up to {big:.3g}; scores beyond {MAX_ABS_SCORE:.0e} leave no "
                "precision for the log-partition (rescale them, and zero-centre per-position scores before the cumsum)"
            )


def _raise_lengths(lo: int, hi: int, T: int) -> None:
    hint = ""
    if hi > T:
        hint = (
            f" (cum_scores must have T+1 rows with row 0 = 0: it has {T + 1}, so T = {T}; did you pass "
            "the cumsum without its leading zero row? torch.nn.functional.pad(scores.cumsum(1), (0, 0, 1, 0)))"
        )
    raise ValueError(f"lengths must lie in [1, T] = [1, {T}], got values in [{lo}, {hi}]{hint}")


def float_inputs(cum_scores, transition, duration_bias, proj_start, proj_end):
    """(name, tensor, -inf allowed) of each float input that is present."""
    floats = [("cum_scores", cum_scores, False), ("transition", transition, True), ("duration_bias", duration_bias, True)]
    # -inf (or <= NEG_INF) in a projection forbids a segment to start / end there with that label
    floats += [(name, p, True) for name, p in (("proj_start", proj_start), ("proj_end", proj_end)) if p is not None]
    return floats


def check_input_values(cum_scores, transition, duration_bias, lengths, proj_start=None, proj_end=None,
                       boundary_mask=None) -> None:
    """The value checks of :func:`validate_streaming_inputs` (NaN/Inf, magnitudes, the range of
    ``lengths``, and of ``boundary_mask`` if given) with one device-to-host transfer; a
    ``ValueError`` naming the argument."""
    _check_values(float_inputs(cum_scores, transition, duration_bias, proj_start, proj_end), lengths,
                  cum_scores.shape[1] - 1, boundary_mask)
