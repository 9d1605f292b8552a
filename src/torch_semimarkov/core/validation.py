"""Input validation shared by every streaming entry point.

Each check raises a ``ValueError`` (or ``TypeError`` for wrong types) that names the argument and
the expected shape or range, so that bad input never becomes a silent NaN or a crash inside a
kernel. The checks are cheap: one pass over each tensor for NaN/Inf, no per-position work.
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from torch_semimarkov.core.constants import BOUNDARY_VALUES, NEG_INF
from torch_semimarkov.core.values import check_input_values

SEMIRINGS = ("log", "max")


@dataclass
class StreamingInputs:
    """Validated and normalised inputs of the streaming semi-CRF.

    ``transition``, ``duration_bias`` and the projections are cast to the dtype of ``cum_scores``
    with every forbidden entry (``-inf`` or ``<= NEG_INF``) replaced by ``IMPOSSIBLE``; ``lengths`` is an int64 tensor on
    the device of ``cum_scores``; ``K`` is a Python int.
    """

    cum_scores: torch.Tensor  # (B, T+1, C)
    transition: torch.Tensor  # (C, C) or (K, C, C)
    duration_bias: torch.Tensor  # (K, C)
    lengths: torch.Tensor  # (B,) int64
    K: int
    proj_start: Optional[torch.Tensor]  # (B, T, C) or None
    proj_end: Optional[torch.Tensor]  # (B, T, C) or None
    label_mask: Optional[torch.Tensor] = None  # (B, T, C) bool or None
    boundary_mask: Optional[torch.Tensor] = None  # (B, T) int8 or None

    @property
    def batch(self) -> int:
        return self.cum_scores.shape[0]

    @property
    def T(self) -> int:
        return self.cum_scores.shape[1] - 1

    @property
    def C(self) -> int:
        return self.cum_scores.shape[2]

    @property
    def duration_transitions(self) -> bool:
        return self.transition.dim() == 3


def debug_checks() -> bool:
    """``TORCH_SEMIMARKOV_DEBUG=1``: check every input's values (NaN, Inf, magnitudes) on every
    call and backend, even with ``validate=False``, and the engine's outputs too."""
    return os.environ.get("TORCH_SEMIMARKOV_DEBUG", "") not in ("", "0")


def detached(t: Optional[Tensor]) -> Optional[Tensor]:
    """``t.detach()``, or None for an absent optional input (``proj_start``, ``proj_end``): what the
    engines' entries and the custom Functions hand to kernels that record no graph."""
    return None if t is None else t.detach()


def forbid(t: torch.Tensor) -> torch.Tensor:
    """``t`` with every forbidden entry (``-inf`` or ``<= NEG_INF``) set to ``IMPOSSIBLE``."""
    # the fill is IMPOSSIBLE written as a literal (tests/api/test_compile.py checks that they are
    # equal): torch.compile(dynamic=True) makes a module-level float a symbolic input, and a
    # symbolic fill value of full_like makes dynamo restart its analysis with the float
    # specialised, so every dynamic compile of a model with the head traced it twice
    # (a Python scalar as the fill: one kernel fewer than a full_like tensor, GPU_NOTES 104)
    return torch.where(t <= NEG_INF, -1e30, t)


def check_lengths(lengths, B: int) -> torch.Tensor:
    """``lengths`` as a (B,) integer tensor, or a ``TypeError``/``ValueError`` naming it (the range
    is checked with the other values, in one transfer)."""
    if lengths is None:
        raise TypeError("lengths is required: a (batch,) tensor of sequence lengths in [1, T]")
    if not isinstance(lengths, torch.Tensor):
        try:
            lengths = torch.as_tensor(lengths)
        except Exception as exc:  # noqa: BLE001 - re-raised with the argument's name
            raise TypeError(f"lengths must be a tensor of integers of shape (batch,), got {type(lengths).__name__}") from exc
    if lengths.dtype.is_floating_point or lengths.dtype == torch.bool or lengths.is_complex():
        raise ValueError(f"lengths must hold integers, got dtype {lengths.dtype}")
    if lengths.dim() != 1 or lengths.shape[0] != B:
        raise ValueError(f"lengths must have shape (batch,) = ({B},), got {_shape(lengths)}")
    return lengths


def lengths_from(lengths, mask, B: int, T: int, check: bool = True) -> torch.Tensor:
    """(B,) lengths from exactly one of ``lengths`` and a (B, T) prefix ``mask`` (the head's
    ``mask=``), with errors that name the argument and say what is wrong.

    Example:
        >>> lengths_from(None, torch.tensor([[True, True, False], [True, True, True]]), 2, 3)
        tensor([2, 3])
    """
    if isinstance(lengths, torch.Tensor) and lengths.dim() == 2:
        got = f"lengths must be a (batch,) tensor of sequence lengths, got a {lengths.dtype} tensor of shape {_shape(lengths)}"
        if lengths.dtype == torch.bool or bool(((lengths == 0) | (lengths == 1)).all()):
            raise ValueError(f"{got} that looks like a mask of valid positions: use mask= instead")
        # pytorch-crf's crf(emissions, tags, mask=mask) puts the tags where the head takes lengths
        raise ValueError(f"{got} that looks like per-position labels: pass them as labels= and a (batch, T) "
                         "mask as mask= (head.compute_loss(h, labels=tags, mask=mask) is pytorch-crf's "
                         "crf(emissions, tags, mask=mask))")
    if mask is None:
        if lengths is None:
            raise TypeError("pass lengths (a (batch,) tensor of sequence lengths) or mask (a (batch, T) bool tensor)")
        if isinstance(lengths, torch.Tensor) and lengths.dtype == torch.bool:
            raise ValueError(
                f"lengths must be a (batch,) tensor of integers, got a {lengths.dtype} tensor of shape "
                f"{_shape(lengths)}: to pass a (batch, T) mask of valid positions use mask= instead"
            )
        return check_lengths(lengths, B)
    if lengths is not None:
        raise ValueError("pass either lengths or mask, not both")
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a (batch, T) bool tensor, got {type(mask).__name__}")
    if tuple(mask.shape) != (B, T):
        hint = (": time-first inputs? hidden_states must be (batch, T, features); transpose them "
                "(h.transpose(0, 1))" if tuple(mask.shape) == (T, B) else "")
        raise ValueError(f"mask must have shape (batch, T) = ({B}, {T}) like hidden_states (batch, T, ...), "
                         f"got {_shape(mask)}{hint}")
    if mask.dtype != torch.bool:
        if mask.dtype.is_floating_point or mask.is_complex():
            raise ValueError(f"mask must be a bool tensor (True at valid positions), got dtype {mask.dtype}")
        if check and torch.compiler.is_compiling():
            # inside a graph the value checks run in an opaque operator, at run time
            return mask_lengths(mask)
        if check and not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("mask must hold only 0/1 (or be a bool tensor)")
        mask = mask != 0
    if check and torch.compiler.is_compiling():
        # inside a graph the value checks run in an opaque operator, at run time
        return mask_lengths(mask)
    lengths = mask.sum(1)
    if not check:  # the caller asked for no device-to-host transfer
        return lengths
    prefix = torch.arange(T, device=mask.device)[None, :] < lengths[:, None]
    # an empty row fits the prefix pattern but is no sequence: report it with the other mistakes
    wrong = (mask != prefix) | (lengths == 0)[:, None]
    if bool(wrong.any()):
        b = int(wrong.any(1).nonzero()[0])
        row = mask[b]
        if not bool(row[0]):
            what = ("it is all False (an empty sequence)" if not bool(row.any())
                    else f"it starts with False (left padding? its first True is at position {int(row.nonzero()[0])})")
        else:
            hole = int((~row).nonzero()[0])
            what = f"it has a hole: False at position {hole} and True again at position {int(row[hole:].nonzero()[0]) + hole}"
        # a time-first (T, B) mask read as (batch, T): its transpose is the prefix mask
        flipped = mask.t()
        if bool((flipped == (torch.arange(B, device=mask.device)[None, :] < flipped.sum(1)[:, None])).all()):
            raise ValueError(
                f"mask is not a (batch, T) prefix mask, but its transpose is: time-first inputs? hidden_states "
                f"({B}, {T}, ...) and mask ({B}, {T}) are read as {B} sequences of {T} positions; pass "
                "batch-first tensors (h.transpose(0, 1), mask.t(), labels.t())"
            )
        raise ValueError(
            f"mask must be a prefix mask (True at positions 0 .. L-1 and False after: right padding only), "
            f"but in sequence {b} {what}"
        )
    return lengths


def _shape(t: torch.Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def _check_float_tensor(name: str, t) -> None:
    """Type and dtype of a float input (cheap: no data is read)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.float32, torch.float64):
        if t.dtype.is_floating_point:
            raise ValueError(
                f"{name} must be float32 or float64, got {t.dtype}; half precision loses the "
                "precision the log-partition needs (cast with .float())"
            )
        raise ValueError(f"{name} must be a float32 or float64 tensor, got dtype {t.dtype} (cast with .float())")


#: The error of a ``boundary_mask`` value outside {-1, 0, 1}.


def streaming_inputs(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths,
    K,
    semiring: str = "log",
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
    checkpoint_interval: Optional[int] = None,
    label_mask: Optional[torch.Tensor] = None,
    boundary_mask: Optional[torch.Tensor] = None,
) -> StreamingInputs:
    """Check the types, shapes, dtypes and devices of a streaming call's inputs (and of the masks,
    :func:`check_masks`) without reading any data, and return them normalised.

    The values are :func:`validate_streaming_inputs`' business (or the engine operators', inside:
    :func:`~torch_semimarkov.core.values.check_input_values`),
    with one device-to-host transfer; the public functions instead run :func:`check_input_values`
    inside the engine's operator, so that ``torch.compile`` never sees a data-dependent branch.

    Raises:
        TypeError: an argument has the wrong Python or tensor type.
        ValueError: a shape, size, range, dtype or device is wrong, or a tensor holds NaN/Inf.
    """
    if semiring not in SEMIRINGS:
        raise ValueError(f"semiring must be one of {SEMIRINGS}, got {semiring!r}")
    refuse_jit_trace()
    if isinstance(K, torch.Tensor) and K.numel() == 1 and not K.dtype.is_floating_point and K.dtype != torch.bool:
        K = int(K)
    elif isinstance(K, numbers.Integral) and not isinstance(K, bool):
        K = int(K)  # numpy integers too
    else:
        raise TypeError(f"K must be an integer (the maximum segment duration), got {type(K).__name__} {K!r}")
    if K < 1:
        raise ValueError(f"K (maximum segment duration) must be >= 1, got {K}")

    # devices first: the value checks below read the tensors, which fails on the meta device
    for name, t in (("cum_scores", cum_scores), ("transition", transition), ("duration_bias", duration_bias),
                    ("lengths", lengths), ("proj_start", proj_start), ("proj_end", proj_end)):
        if not isinstance(t, torch.Tensor):
            continue
        if name != "cum_scores" and isinstance(cum_scores, torch.Tensor) and t.device != cum_scores.device:
            raise ValueError(
                f"all tensors must be on one device: cum_scores is on {cum_scores.device} but {name} is on {t.device}"
            )
    if isinstance(cum_scores, torch.Tensor) and cum_scores.device.type == "meta":
        raise ValueError("cum_scores is on the meta device; the streaming semi-CRF needs real tensors")
    _check_float_tensor("cum_scores", cum_scores)
    if cum_scores.dim() != 3:
        raise ValueError(
            f"cum_scores must have shape (batch, T+1, C), got {cum_scores.dim()} dims {_shape(cum_scores)}"
        )
    B, T1, C = cum_scores.shape
    T = T1 - 1
    if B < 1 or T < 1 or C < 1:
        raise ValueError(f"cum_scores must have shape (batch>=1, T+1>=2, C>=1), got {_shape(cum_scores)}")
    device = cum_scores.device
    dtype = cum_scores.dtype

    _check_float_tensor("transition", transition)
    if transition.dim() == 2:
        if tuple(transition.shape) != (C, C):
            raise ValueError(
                f"transition must have shape (C, C) = ({C}, {C}) to match cum_scores, got {_shape(transition)}"
            )
    elif transition.dim() == 3:
        if tuple(transition.shape) != (K, C, C):
            raise ValueError(
                f"duration-dependent transition must have shape (K, C, C) = ({K}, {C}, {C}), got {_shape(transition)}"
            )
    else:
        raise ValueError(f"transition must have shape (C, C) or (K, C, C), got {_shape(transition)}")

    _check_float_tensor("duration_bias", duration_bias)
    if tuple(duration_bias.shape) != (K, C):
        raise ValueError(
            f"duration_bias must have shape (K, C) = ({K}, {C}), got {_shape(duration_bias)}"
        )

    lengths = check_lengths(lengths, B)

    for name, p in (("proj_start", proj_start), ("proj_end", proj_end)):
        if p is None:
            continue
        _check_float_tensor(name, p)
        if tuple(p.shape) != (B, T, C):
            raise ValueError(f"{name} must have shape (batch, T, C) = ({B}, {T}, {C}), got {_shape(p)}")

    label_mask, boundary_mask = check_masks(label_mask, boundary_mask, B, T, C, device, check_values=False)

    if checkpoint_interval is not None:
        if isinstance(checkpoint_interval, bool) or not isinstance(checkpoint_interval, int):
            raise TypeError(f"checkpoint_interval must be an int or None, got {type(checkpoint_interval).__name__}")
        if checkpoint_interval < 1:
            raise ValueError(f"checkpoint_interval must be >= 1, got {checkpoint_interval}")

    return StreamingInputs(
        cum_scores=cum_scores,
        transition=forbid(transition.to(dtype)),
        duration_bias=forbid(duration_bias.to(dtype)),
        lengths=lengths.to(device=device, dtype=torch.int64),
        K=K,
        proj_start=None if proj_start is None else forbid(proj_start.to(dtype)),
        proj_end=None if proj_end is None else forbid(proj_end.to(dtype)),
        label_mask=label_mask,
        boundary_mask=boundary_mask,
    )


def refuse_jit_trace() -> None:
    """A ``RuntimeError`` under ``torch.jit.trace``: a trace records sizes (T, B, the number of
    segments) as constants and would silently give wrong results on other shapes."""
    if torch.jit.is_tracing():
        raise RuntimeError(
            "torch.jit.trace is not supported: it records the sequence length, batch size and number of "
            "segments as constants, so the trace would give wrong results on other shapes. Use "
            "torch.export.export (with dynamic shapes) or torch.compile instead (docs/guide.md, section 11)"
        )


@torch.library.custom_op("torch_semimarkov::mask_lengths", mutates_args=())
def mask_lengths(mask: Tensor) -> Tensor:
    """(B,) lengths of a (B, T) prefix mask, with the eager checks and errors of
    :func:`~.validation.lengths_from` (an opaque node: inside a compiled graph too)."""
    return lengths_from(None, mask, mask.shape[0], mask.shape[1], check=True).clone()


@mask_lengths.register_fake
def _mask_lengths_fake(mask):
    return mask.new_empty(mask.shape[0], dtype=torch.int64)


def check_num_warps(num_warps) -> None:
    """ValueError unless ``num_warps`` is None or a Triton warp count (1, 2, 4, 8, 16)."""
    if num_warps is None:
        return
    if isinstance(num_warps, bool) or not isinstance(num_warps, int) or num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"num_warps must be None or one of 1, 2, 4, 8, 16, got {num_warps!r}")


def validate_streaming_inputs(cum_scores, transition, duration_bias, lengths, K, semiring: str = "log",
                              proj_start=None, proj_end=None, checkpoint_interval: Optional[int] = None,
                              check_values: bool = True, label_mask=None, boundary_mask=None) -> StreamingInputs:
    """Check the inputs of a streaming call and return them normalised (:func:`streaming_inputs`);
    with ``check_values`` their values too (NaN/Inf, magnitudes, the range of ``lengths`` and of
    ``boundary_mask``), with one device-to-host transfer. The public functions check the values
    inside the engine's operator instead, so that ``torch.compile`` never sees a data-dependent
    branch.

    Raises:
        TypeError: an argument has the wrong Python or tensor type.
        ValueError: a shape, size, range, dtype or device is wrong, or a tensor holds NaN/Inf.
    """
    inp = streaming_inputs(cum_scores, transition, duration_bias, lengths, K, semiring, proj_start, proj_end,
                           checkpoint_interval, label_mask, boundary_mask)
    if check_values:
        check_input_values(cum_scores, transition, duration_bias, inp.lengths, proj_start, proj_end, inp.boundary_mask)
    return inp


def check_masks(label_mask, boundary_mask, B: int, T: int, C: int, device,
                check_values: bool = True) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Validate ``label_mask`` (B, T, C) bool and ``boundary_mask`` (B, T) in {-1, 0, 1}.

    Returns them on ``device`` (bool and int8), or None where not given. Raises ``ValueError`` (or
    ``TypeError``) naming the argument. ``check_values=False`` leaves the values of
    ``boundary_mask`` to the caller (``check_input_values`` reads them with the other inputs').
    """
    if label_mask is not None:
        if not isinstance(label_mask, torch.Tensor):
            raise TypeError(f"label_mask must be a bool tensor (B, T, C), got {type(label_mask).__name__}")
        if label_mask.dtype != torch.bool:
            raise ValueError(f"label_mask must be a bool tensor (True: the label is allowed there), got {label_mask.dtype}")
        if tuple(label_mask.shape) != (B, T, C):
            raise ValueError(f"label_mask must have shape (batch, T, C) = ({B}, {T}, {C}), got {tuple(label_mask.shape)}")
        label_mask = label_mask.to(device)
    if boundary_mask is not None:
        if not isinstance(boundary_mask, torch.Tensor):
            raise TypeError(f"boundary_mask must be an integer tensor (B, T), got {type(boundary_mask).__name__}")
        if boundary_mask.dtype.is_floating_point or boundary_mask.dtype == torch.bool:
            raise ValueError(
                "boundary_mask must be an integer tensor with values -1 (no segment starts here), 0 (free) or "
                f"1 (a segment starts here), got {boundary_mask.dtype}")
        if tuple(boundary_mask.shape) != (B, T):
            raise ValueError(f"boundary_mask must have shape (batch, T) = ({B}, {T}), got {tuple(boundary_mask.shape)}")
        if check_values and boundary_mask.numel() and bool(((boundary_mask < -1) | (boundary_mask > 1)).any()):
            raise ValueError(BOUNDARY_VALUES)
        boundary_mask = boundary_mask.to(device=device, dtype=torch.int8)
    return label_mask, boundary_mask
