"""``SemiMarkovCRFHead``: a semi-Markov CRF layer to put on top of any sequence encoder.

The head turns encoder features (B, T, H) into per-position label scores, takes their cumulative
sum in float32 (or float64), centred per label with the exact compensation in the duration term
(:mod:`torch_semimarkov.scores`: the model is that of the raw scores, position by position), and
hands them with its transition and duration parameters to the streaming engine
(:func:`torch_semimarkov.streaming.semi_crf_streaming_forward` and friends). The engine never builds
the (B, T, K, C, C) edge tensor, so T can be very large; on CUDA with Triton installed the GPU kernels
are used automatically.
"""

from __future__ import annotations

import numbers
from typing import Callable, List, NamedTuple, Optional, Sequence, Union

import torch
from torch import nn

from torch_semimarkov.api.constrained import constrained_log_partition
from torch_semimarkov.api.partition import semi_crf_streaming_forward
from torch_semimarkov.core.gold import (
    any_bad_label,
    checked_nll,
    FORBIDDEN_REASONS,
    forbidden_terms,
    gold_score,
    labels_to_starts,
    no_segmentation_message,
    segments_to_starts,
)
from torch_semimarkov.core.results import MarginalsResult, SegmentationSamples, TopKResult, ViterbiResult
from torch_semimarkov.core.validation import debug_checks as _debug, lengths_from, refuse_jit_trace
from torch_semimarkov.core.values import check_value_stats, float_inputs, value_stats
from torch_semimarkov.crf import SemiMarkovCRF
from torch_semimarkov.durations import DurationDistribution, make_duration
from torch_semimarkov.engines.select import BACKENDS
from torch_semimarkov.scores import cumulative_scores

__all__ = ["SemiMarkovCRFHead", "SemiCRFOutput", "Posterior"]

REDUCTIONS = ("mean", "sum", "none", "token_mean")


class SemiCRFOutput(NamedTuple):
    """What :meth:`SemiMarkovCRFHead.forward` returns: log Z and the tensors it was built from."""

    partition: torch.Tensor  # (B,) log Z
    cum_scores: torch.Tensor  # (B, T+1, C) float32/float64, [:, 0] = 0
    transition: torch.Tensor  # (C, C) or (K, C, C), forbidden moves at -inf
    duration_bias: torch.Tensor  # (K, C)
    proj_start: Optional[torch.Tensor]  # (B, T, C) or None
    proj_end: Optional[torch.Tensor]  # (B, T, C) or None
    lengths: torch.Tensor  # (B,) int64


#: The result of :meth:`SemiMarkovCRFHead.marginals`: :class:`~torch_semimarkov.MarginalsResult` (the
#: name of earlier releases; its per-position entropy is ``position_entropy``).
Posterior = MarginalsResult


def _per_label(name: str, value, C: int) -> List[int]:
    """An integer, or a sequence of C integers, as a list of C integers >= 1 (errors name it)."""
    if hasattr(value, "tolist") and not isinstance(value, numbers.Integral):
        value = value.tolist()  # tensors and NumPy arrays
    values = [value] * C if not isinstance(value, (list, tuple)) else list(value)
    if len(values) != C:
        raise ValueError(f"{name} must be an integer or a sequence of C = {C} integers, got {len(values)} values")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{name} must be an integer (or one per label), got {type(v).__name__} {v!r}")
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    return [int(v) for v in values]


def _reduce(nll: torch.Tensor, infinite: torch.Tensor, zero_infinity: bool, reduction: str, lengths: torch.Tensor):
    if zero_infinity:
        nll = torch.where(infinite, torch.zeros_like(nll), nll)
    if reduction == "none":
        return nll
    if reduction == "sum":
        return nll.sum()
    if reduction == "token_mean":
        return nll.sum() / lengths.sum().to(nll.dtype)
    return nll.mean()


class SemiMarkovCRFHead(nn.Module):
    """Semi-Markov CRF over segments of duration 1..K with C labels.

    A segmentation of positions 0..L-1 into segments (s, k, c) scores
    ``sum_segments S[s+k, c] - S[s, c] + D[k-1, c] + ps[s, c] + pe[s+k-1, c] + Tr[c_prev, c]``
    where S is the cumulative per-position score (the projection's output), D the duration bias, ps/pe optional
    boundary scores and Tr the transition; the first segment's transition term is
    ``logsumexp_{c'} Tr[c', c]``. Start/end label scores, when enabled, are added to the per-position
    scores at position 0 and L-1, which always belong to the first and the last segment.

    Args:
        num_classes: C, the number of labels.
        max_duration: K, the longest segment (durations 1..K); or a sequence of C integers, the
            longest segment of each label (K is then their maximum).
        min_duration: optional shortest segment: an integer for every label or a sequence of C
            integers (default 1). Durations outside ``[min, max]`` of a label get -inf in training
            and decoding alike.
        hidden_dim: H, the encoder's feature size; a ``Linear(H, C)`` projects features to scores.
            ``None``: the input already holds the (B, T, C) scores.
        duration: the duration bias: ``"learned"`` (a free (K, C) parameter ``duration_bias``),
            ``"geometric"``, ``"negative_binomial"``, ``"poisson"``, ``"uniform"``, a
            :class:`~torch_semimarkov.durations.DurationDistribution`, or a callable
            ``fn(durations (K, 1)) -> (K, C)`` (see :mod:`torch_semimarkov.durations`).
        duration_kwargs: extra arguments of the duration distribution (e.g. ``init_mean``).
        transition: ``"static"`` for a (C, C) transition ``[c_src, c_dst]``, ``"duration"`` for a
            (K, C, C) one indexed by the duration of the segment being entered.
        allowed_transitions: optional bool (C, C) mask ``[c_src, c_dst]``; forbidden moves get -inf in
            training and decoding alike.
        allow_same_label_transitions: whether a segment may follow one of its own label
            (``Tr[c, c]``): ``True`` (default), ``False``, or C bools (per label, e.g. True only for
            a background label whose runs are long). Forbidden, each run of a label is one segment
            and the model cannot spread its probability over the ways of cutting a run into
            pieces; but a run longer than its label's ``max_duration`` (split into pieces joined
            by ``c -> c``) becomes impossible. docs/guide.md §1 measures both and explains the
            default. Combines with ``allowed_transitions``.
        allowed_starts, allowed_ends: optional bool (C,) masks: the labels the first / the last
            segment of a sequence may carry (e.g. a gene model starts and ends in intergenic).
        boundary_scores: add ``Linear(H, C)`` layers ``proj_start`` / ``proj_end`` scoring where
            segments start and end.
        start_end_scores: learnable per-label scores for the first and the last segment.
        use_triton: use the Triton kernels when the tensors are on CUDA and Triton is installed.
        backend: the engine: ``"auto"`` (default: Triton on CUDA, the compiled CPU engine on the
            CPU when numba is installed, else the PyTorch path), ``"triton"``, ``"numba"`` or
            ``"torch"`` (see :func:`~torch_semimarkov.semi_crf_streaming_forward`).
        checkpoint_interval: the engine's checkpoint spacing (default: about sqrt(T·K)).
        cumsum_dtype: ``torch.float32`` (default) or ``torch.float64`` for the CRF math.
        ignore_index: the label expected past each sequence's length in ``labels``.
        time_parallel: the GPU engine (see ``semi_crf_streaming_forward``): None (default) runs
            parallel over time when the batch alone cannot fill the GPU, False one program per
            sequence, True parallel whenever available.
        validate: check values that need a device-to-host transfer (default True): the engine's
            inputs (one transfer), a ``mask``'s prefix form, gold labels in range, and that no loss
            is infinite unless ``zero_infinity``. ``False`` skips all of them, so a training step
            never synchronises with the GPU (and ``torch.compile`` captures it whole; the one
            exception: the blocked engine of rings above 16,384 K·C values reads one flag of its
            duration tables per forward, docs/guide.md §11); wrong
            inputs then give wrong (or infinite) losses instead of errors. An attribute: set
            ``head.validate = False`` after a first checked batch. NaN in the projected scores is
            reported by the engine's check (``TORCH_SEMIMARKOV_DEBUG=1`` checks it in the head too).

    Example:
        >>> _ = torch.manual_seed(0)
        >>> head = SemiMarkovCRFHead(num_classes=3, max_duration=4, hidden_dim=8)
        >>> h, lengths = torch.randn(2, 10, 8), torch.tensor([10, 7])
        >>> labels = torch.tensor([[0] * 4 + [1] * 2 + [2] * 4, [2] * 3 + [0] * 4 + [-100] * 3])
        >>> loss = head.compute_loss(h, lengths, labels)
        >>> loss.backward()
        >>> bool(loss >= 0)
        True
        >>> out = head.decode(h, lengths)
        >>> out.labels.shape
        torch.Size([2, 10])
    """

    def __init__(
        self,
        num_classes: int,
        max_duration: Union[int, Sequence[int]],
        hidden_dim: Optional[int] = None,
        duration: Union[str, DurationDistribution, Callable] = "learned",
        transition: str = "static",
        allowed_transitions: Optional[torch.Tensor] = None,
        boundary_scores: bool = False,
        start_end_scores: bool = False,
        use_triton: bool = True,
        checkpoint_interval: Optional[int] = None,
        cumsum_dtype: torch.dtype = torch.float32,
        ignore_index: int = -100,
        duration_kwargs: Optional[dict] = None,
        backend: str = "auto",
        time_parallel: Optional[bool] = None,
        min_duration: Union[None, int, Sequence[int]] = None,
        allowed_starts: Optional[torch.Tensor] = None,
        allowed_ends: Optional[torch.Tensor] = None,
        validate: bool = True,
        allow_same_label_transitions: Union[bool, Sequence[bool], torch.Tensor] = True,
    ):
        super().__init__()
        if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral):
            raise TypeError(f"num_classes must be an integer, got {type(num_classes).__name__} {num_classes!r}")
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        max_per_label = _per_label("max_duration", max_duration, int(num_classes))
        min_per_label = _per_label("min_duration", 1 if min_duration is None else min_duration, int(num_classes))
        max_duration = max(max_per_label)
        bad = [c for c in range(int(num_classes)) if min_per_label[c] > max_per_label[c]]
        if bad:
            c = bad[0]
            raise ValueError(f"min_duration of label {c} ({min_per_label[c]}) exceeds its max_duration ({max_per_label[c]})")
        if transition not in ("static", "duration"):
            raise ValueError(f"transition must be 'static' or 'duration', got {transition!r}")
        if cumsum_dtype not in (torch.float32, torch.float64):
            raise ValueError(f"cumsum_dtype must be torch.float32 or torch.float64, got {cumsum_dtype}")
        if not isinstance(backend, str) or backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        C, K = int(num_classes), int(max_duration)
        self.num_classes = C
        self.max_duration = K
        self.hidden_dim = hidden_dim
        self.use_triton = use_triton
        self.backend = backend
        self.time_parallel = time_parallel
        self.validate = bool(validate)
        self.checkpoint_interval = checkpoint_interval
        self.cumsum_dtype = cumsum_dtype
        self.ignore_index = ignore_index
        self.transition_type = transition
        in_dim = C if hidden_dim is None else int(hidden_dim)
        self.projection = None if hidden_dim is None else nn.Linear(in_dim, C)

        shape = (C, C) if transition == "static" else (K, C, C)
        self.transition = nn.Parameter(torch.zeros(shape))

        self.duration_dist: Optional[DurationDistribution] = None
        if isinstance(duration, str) and duration == "learned":
            self.duration_bias = nn.Parameter(torch.zeros(K, C))
        else:
            self.duration_dist = make_duration(duration, K, C, **(duration_kwargs or {}))

        same = allow_same_label_transitions
        if isinstance(same, bool):
            same = [same] * C
        else:
            same = torch.as_tensor(same).tolist() if not isinstance(same, (list, tuple)) else list(same)
            if len(same) != C or not all(isinstance(v, bool) for v in same):
                raise ValueError(f"allow_same_label_transitions must be True, False or C = {C} bools, got "
                                 f"{allow_same_label_transitions!r}")
        self.allow_same_label_transitions = same if len(set(same)) > 1 else same[0]
        allowed = None
        if allowed_transitions is not None:
            allowed = torch.as_tensor(allowed_transitions)
            if allowed.shape != (C, C):
                raise ValueError(f"allowed_transitions must have shape (C, C) = ({C}, {C}), got {tuple(allowed.shape)}")
            allowed = allowed.bool()
        if not all(same):
            no_self = torch.eye(C, dtype=torch.bool) & ~torch.tensor(same)[:, None]
            allowed = (torch.ones(C, C, dtype=torch.bool) if allowed is None else allowed) & ~no_self
        if allowed is not None:
            if not bool(allowed.any(0).all()):
                raise ValueError("allowed_transitions forbids every move into some label (a column is all False)"
                                 + ("" if all(same) else " once same-label moves are forbidden "
                                    "(allow_same_label_transitions)"))
            self.register_buffer("allowed_transitions", allowed)
        else:
            self.allowed_transitions = None

        # durations outside [min, max] of a label: forbidden (None when every duration 1..K is allowed)
        if max(min_per_label) > 1 or min(max_per_label) < K:
            k = torch.arange(1, K + 1)[:, None]
            allowed_dur = (k >= torch.tensor(min_per_label)[None, :]) & (k <= torch.tensor(max_per_label)[None, :])
            self.register_buffer("allowed_durations", allowed_dur)
            self.register_buffer("label_max_duration", torch.tensor(max_per_label))
        else:
            self.allowed_durations = None
            self.label_max_duration = None
        for name, mask in (("allowed_starts", allowed_starts), ("allowed_ends", allowed_ends)):
            if mask is None:
                setattr(self, name, None)
                continue
            mask = torch.as_tensor(mask)
            if tuple(mask.shape) != (C,):
                raise ValueError(f"{name} must have shape (C,) = ({C},), got {tuple(mask.shape)}")
            mask = mask.bool()
            if not bool(mask.any()):
                raise ValueError(f"{name} allows no label")
            self.register_buffer(name, mask)

        if boundary_scores:
            self.proj_start = nn.Linear(in_dim, C)
            self.proj_end = nn.Linear(in_dim, C)
        else:
            self.proj_start = None
            self.proj_end = None
        if start_end_scores:
            self.start_scores = nn.Parameter(torch.zeros(C))
            self.end_scores = nn.Parameter(torch.zeros(C))
        else:
            self.start_scores = None
            self.end_scores = None

    def extra_repr(self) -> str:
        dur = "learned" if self.duration_dist is None else type(self.duration_dist).__name__
        parts = [f"num_classes={self.num_classes}", f"max_duration={self.max_duration}",
                 f"hidden_dim={self.hidden_dim}", f"duration={dur}", f"transition={self.transition_type!r}"]
        if self.allowed_transitions is not None:
            parts.append(f"allowed_transitions={int(self.allowed_transitions.sum())}/{self.num_classes ** 2}")
        if self.allowed_durations is not None:
            lo = (self.allowed_durations.float().argmax(0) + 1).tolist()
            parts.append(f"min_duration={lo}, max_duration_per_label={self.label_max_duration.tolist()}")
        for name in ("allowed_starts", "allowed_ends"):
            mask = getattr(self, name)
            if mask is not None:
                parts.append(f"{name}={mask.nonzero().reshape(-1).tolist()}")
        if self.allow_same_label_transitions is not True:
            parts.append(f"allow_same_label_transitions={self.allow_same_label_transitions}")
        parts += [f"boundary_scores={self.proj_start is not None}", f"start_end_scores={self.start_scores is not None}",
                  f"backend={self.backend!r}", f"time_parallel={self.time_parallel}"]
        if self.cumsum_dtype != torch.float32:
            parts.append(f"cumsum_dtype={self.cumsum_dtype}")
        if self.checkpoint_interval is not None:
            parts.append(f"checkpoint_interval={self.checkpoint_interval}")
        return ", ".join(parts)

    # ------------------------------------------------------------------ parameters

    @property
    def duration_bias(self) -> torch.Tensor:  # noqa: D401 - also a Parameter for "learned"
        """The (K, C) duration log-bias: the parameter itself for ``duration="learned"``."""
        if "duration_bias" in self._parameters:
            return self._parameters["duration_bias"]
        dist = self.__dict__.get("duration_dist")
        if dist is None:
            dist = self._modules.get("duration_dist")
        if dist is None:
            raise AttributeError("duration_bias")
        return dist()

    def duration_table(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The (K, C) duration log-bias computed in ``dtype`` (default float32): a float64 head
        evaluates its duration distribution in float64, not a float32 table cast up."""
        if "duration_bias" in self._parameters:
            bias = self._parameters["duration_bias"]
            return bias if dtype is None else bias.to(dtype)
        return self.duration_dist(dtype=dtype)

    def effective_transition(self) -> torch.Tensor:
        """The transition with forbidden moves set to -inf: (C, C) or (K, C, C)."""
        tr = self.transition
        if self.allowed_transitions is not None:
            tr = tr.masked_fill(~self.allowed_transitions, float("-inf"))
        return tr

    def crf_parameters(self) -> List[torch.Tensor]:
        """The CRF's own parameters (transition, duration, start/end scores), not the projections."""
        params = [self.transition]
        if self.duration_dist is None:
            params.append(self._parameters["duration_bias"])
        else:
            params.extend(self.duration_dist.parameters())
        if self.start_scores is not None:
            params.extend([self.start_scores, self.end_scores])
        return params

    def param_groups(self, lr: float, crf_lr: Optional[float] = None, model: Optional[nn.Module] = None) -> List[dict]:
        """Optimiser parameter groups: the CRF's own parameters (:meth:`crf_parameters`: transition,
        durations, start/end scores) at ``crf_lr`` (default ``10 * lr``), everything else at ``lr``.

        The CRF parameters are few, are shared by every position, and must move by several nats
        (a duration mean from 10 to 20, a transition score to -5), far more than an encoder weight;
        at the encoder's learning rate they barely move (docs/guide.md §1).

        Args:
            lr: the learning rate of the projections (and of ``model``'s other parameters).
            crf_lr: the learning rate of the CRF parameters (default ``10 * lr``).
            model: a module holding this head (an encoder + head); its other parameters join the
                ``lr`` group. Default: the head alone.

        Example:
            >>> head = SemiMarkovCRFHead(3, 4, hidden_dim=8)
            >>> encoder = torch.nn.Linear(5, 8)
            >>> model = torch.nn.ModuleDict({"encoder": encoder, "head": head})
            >>> opt = torch.optim.Adam(head.param_groups(1e-3, model=model))
            >>> [g["lr"] for g in opt.param_groups], len(opt.param_groups[1]["params"]) == len(head.crf_parameters())
            ([0.001, 0.01], True)
        """
        crf = self.crf_parameters()
        crf_ids = {id(q) for q in crf}
        others = [q for q in (model or self).parameters() if id(q) not in crf_ids]
        return [{"params": others, "lr": lr}, {"params": crf, "lr": 10 * lr if crf_lr is None else crf_lr}]

    def parameter_penalty(self, p: float = 2.0) -> torch.Tensor:
        """``sum |theta|^p`` over the CRF parameters: add ``lambda * head.parameter_penalty()`` to the
        loss to keep transition and duration scores from drifting to large values.

        Example:
            >>> head = SemiMarkovCRFHead(3, 4)
            >>> float(head.parameter_penalty().detach())
            0.0
        """
        total = self.transition.new_zeros(())
        for param in self.crf_parameters():
            if param is self.transition and self.allowed_transitions is not None:
                # forbidden entries never enter the model: leave them out of the penalty too
                param = param.masked_fill(~self.allowed_transitions, 0.0)
            if self.allowed_durations is not None and param is self._parameters.get("duration_bias"):
                param = param.masked_fill(~self.allowed_durations, 0.0)
            total = total + param.abs().pow(p).sum()
        return total

    # ------------------------------------------------------------------ scores

    def _check_inputs(self, hidden_states: torch.Tensor, lengths, mask=None) -> torch.Tensor:
        refuse_jit_trace()
        if not isinstance(hidden_states, torch.Tensor):
            raise TypeError(f"hidden_states must be a torch.Tensor, got {type(hidden_states).__name__}")
        in_dim = self.num_classes if self.hidden_dim is None else self.hidden_dim
        if hidden_states.dim() != 3 or hidden_states.shape[-1] != in_dim:
            raise ValueError(
                f"hidden_states must have shape (batch, T, {in_dim}), got {tuple(hidden_states.shape)}"
            )
        if not hidden_states.dtype.is_floating_point:
            raise ValueError(f"hidden_states must be a floating-point tensor, got {hidden_states.dtype}")
        B, T, _ = hidden_states.shape
        if B == 0 or T == 0:
            raise ValueError(
                f"hidden_states must hold at least one sequence of at least one position, got shape {tuple(hidden_states.shape)}"
            )
        # the range of lengths is checked by the engine, in its one transfer
        return lengths_from(lengths, mask, B, T, check=self.validate).to(device=hidden_states.device,
                                                                           dtype=torch.long)

    @staticmethod
    def _check_finite(scores: torch.Tensor, valid: torch.Tensor) -> None:
        """NaN/Inf in the per-position scores of valid positions (padding may hold anything)."""
        bad = ~torch.isfinite(scores) & valid
        if bool(bad.any()):
            b, t, c = (int(i) for i in bad.nonzero()[0])
            value = float(scores[b, t, c].detach())
            if value != value:
                raise ValueError(
                    f"hidden_states contains NaN values after projection layer (sequence {b}, position {t})"
                )
            raise ValueError(
                f"hidden_states contains infinite values after projection layer ({value} at sequence {b}, "
                f"position {t}); scores must be finite inside each sequence"
            )

    def _project(self, hidden_states: torch.Tensor, lengths: torch.Tensor):
        """(valid (B, T, 1), the features with padding zeroed, the per-position scores (B, T, C))."""
        T = hidden_states.shape[1]
        valid = (torch.arange(T, device=lengths.device)[None, :] < lengths[:, None])[..., None]
        # padding never influences a sequence, whatever it holds (encoders with fully masked
        # attention produce NaN there): zero it before any layer sees it, so that no NaN reaches a
        # value or a gradient
        hidden_states = torch.where(valid, hidden_states, hidden_states.new_zeros(()))
        if self.projection is not None or self.proj_start is not None:
            weight = (self.projection or self.proj_start).weight
            # outside autocast, half-precision features meet float32 layers: cast the features
            if not torch.is_autocast_enabled(hidden_states.device.type) and hidden_states.dtype != weight.dtype:
                hidden_states = hidden_states.to(weight.dtype)
        scores = hidden_states if self.projection is None else self.projection(hidden_states)
        return valid, hidden_states, scores

    def build(self, hidden_states: torch.Tensor, lengths=None, *, mask=None) -> SemiCRFOutput:
        """The engine's inputs (cum_scores, transition, duration_bias, proj_start, proj_end) without
        running it; ``partition`` is left empty. :meth:`forward` fills it."""
        lengths = self._check_inputs(hidden_states, lengths, mask)
        B, T, _ = hidden_states.shape
        dtype = self.cumsum_dtype
        device_type = hidden_states.device.type
        valid, hidden_states, scores = self._project(hidden_states, lengths)
        # the boundary layers run under the caller's autocast, as the main projection does (inside
        # the float32 block below a bf16 feature would meet a float32 weight)
        proj_start = proj_end = None
        if self.proj_start is not None:
            proj_start, proj_end = self.proj_start(hidden_states), self.proj_end(hidden_states)
        if _debug():
            self._check_finite(scores, valid)
        with torch.autocast(device_type=device_type, enabled=False):
            scores = scores.to(dtype)
            zero = scores.new_zeros(())
            if self.start_scores is not None:
                first = (torch.arange(T, device=scores.device) == 0)[None, :, None]
                last = torch.arange(T, device=lengths.device)[None, :, None] == (lengths - 1)[:, None, None]
                scores = scores + torch.where(first, self.start_scores.to(dtype), zero)
                scores = scores + torch.where(last, self.end_scores.to(dtype), zero)
            duration_bias = self.duration_table(dtype)
            # exact: the per-label centring that keeps float32 cumulative sums small is given back
            # to every segment through its duration term (scores.py)
            cum_scores, duration_bias = cumulative_scores(scores, lengths, duration_bias)
            if proj_start is not None:
                proj_start, proj_end = proj_start.to(dtype), proj_end.to(dtype)
            transition = self.effective_transition().to(dtype)
            if self.allowed_durations is not None:
                duration_bias = duration_bias.masked_fill(~self.allowed_durations, float("-inf"))
            # allowed first / last labels: -inf boundary scores at position 0 / L-1 (exact)
            if self.allowed_starts is not None:
                if proj_start is None:
                    proj_start = scores.new_zeros(B, T, self.num_classes)
                at_first = (torch.arange(T, device=lengths.device) == 0)[None, :, None]
                proj_start = proj_start.masked_fill(at_first & ~self.allowed_starts, float("-inf"))
            if self.allowed_ends is not None:
                if proj_end is None:
                    proj_end = scores.new_zeros(B, T, self.num_classes)
                at_last = (torch.arange(T, device=lengths.device)[None, :] == (lengths - 1)[:, None])[..., None]
                proj_end = proj_end.masked_fill(at_last & ~self.allowed_ends, float("-inf"))
        return SemiCRFOutput(
            partition=cum_scores.new_empty(0),
            cum_scores=cum_scores,
            transition=transition,
            duration_bias=duration_bias,
            proj_start=proj_start,
            proj_end=proj_end,
            lengths=lengths,
        )

    def _engine_kwargs(self, out: SemiCRFOutput) -> dict:
        return dict(
            validate=self.validate,
            proj_start=out.proj_start,
            proj_end=out.proj_end,
            use_triton=self.use_triton,
            checkpoint_interval=self.checkpoint_interval,
            backend=self.backend,
            time_parallel=self.time_parallel,
        )

    def forward(self, hidden_states: torch.Tensor, lengths=None, *, mask=None) -> SemiCRFOutput:
        """Log-partition log Z (B,) and the tensors it was built from.

        Args:
            hidden_states: (B, T, H) encoder features (any float dtype; autocast is fine).
            lengths: (B,) sequence lengths in [1, T].
            mask: instead of ``lengths``, a (B, T) bool mask, True at valid positions; it must be a
                prefix mask (True at 0 .. L-1, False after): right padding only.
        """
        if torch.compiler.is_compiling():
            return SemiCRFOutput(*self._compiled_partition(hidden_states, lengths, mask))
        out = self.build(hidden_states, lengths, mask=mask)
        with torch.autocast(device_type=hidden_states.device.type, enabled=False):
            try:
                partition = semi_crf_streaming_forward(
                    out.cum_scores, out.transition, out.duration_bias, out.lengths, self.max_duration,
                    **self._engine_kwargs(out))
            except ValueError as exc:
                self._explain_non_finite(exc, hidden_states, out.lengths)
                raise
        return out._replace(partition=partition)

    def _compiled_partition(self, hidden_states, lengths, mask) -> tuple:
        """:meth:`forward` inside a compiled graph, as a plain tuple: where the engine's operator
        breaks a graph (``torch.compile`` without ``fullgraph``), only plain tensors are held
        across the break (torch 2.11's dynamo rebuilds a NamedTuple held across one wrongly)."""
        out = self.build(hidden_states, lengths, mask=mask)
        kwargs = self._engine_kwargs(out)
        parts = tuple(out)[1:]  # cum_scores, transition, duration_bias, proj_start, proj_end, lengths
        del out
        with torch.autocast(device_type=hidden_states.device.type, enabled=False):
            partition = semi_crf_streaming_forward(parts[0], parts[1], parts[2], parts[5], self.max_duration,
                                                   **kwargs)
        return (partition,) + parts

    def _explain_non_finite(self, exc: ValueError, hidden_states: torch.Tensor, lengths: torch.Tensor) -> None:
        """Only on failure: say where a non-finite per-position score came from."""
        if any(f"{name} contains" in str(exc) for name in ("cum_scores", "proj_start", "proj_end")):
            with torch.no_grad():
                valid, features, scores = self._project(hidden_states, lengths)
                self._check_finite(scores, valid)
                if self.proj_start is not None:  # the boundary layers see the same features
                    for layer in (self.proj_start, self.proj_end):
                        self._check_finite(layer(features), valid)

    # ------------------------------------------------------------------ loss

    def _gold_tensors(self, out: SemiCRFOutput, labels, segments, check: Optional[bool] = None):
        T = out.cum_scores.shape[1] - 1
        if (labels is None) == (segments is None):
            raise ValueError("pass exactly one of labels (B, T) or segments (a list of segment lists)")
        if labels is not None:
            labels = torch.as_tensor(labels)
            B = out.lengths.shape[0]
            if labels.dim() != 2 or tuple(labels.shape) != (B, T):
                hint = (": time-first inputs? pass batch-first hidden_states (batch, T, features) and labels "
                        "(batch, T)" if tuple(labels.shape) == (T, B) else "")
                raise ValueError(f"labels must have shape (batch, T) = ({B}, {T}) like hidden_states ({B}, {T}, ...), "
                                 f"got {tuple(labels.shape)}{hint}")
            # a run longer than its label's maximum is split into pieces of that maximum
            max_d = self.max_duration if self.label_max_duration is None else self.label_max_duration
            lab, starts = labels_to_starts(labels, out.lengths, self.num_classes, max_d, self.ignore_index,
                                           check=self.validate if check is None else check)
        else:
            lab, starts = segments_to_starts(segments, out.lengths, T, self.num_classes, self.max_duration)
        return lab, starts

    def _raise_forbidden_gold(self, out: SemiCRFOutput, lab: torch.Tensor, starts: torch.Tensor, code: torch.Tensor, b: int):
        """A clear error for the first forbidden term of sequence b's gold segmentation."""
        t = int(code[b].nonzero()[0])
        seg_starts = starts[b].nonzero().reshape(-1).tolist() + [int(out.lengths[b])]
        end = next(e for e in seg_starts if e > t)
        c = int(lab[b, t])
        where = f"the gold segmentation of sequence {b} has a segment [{t}, {end}) of label {c} (duration {end - t})"
        kind = int(code[b, t])
        if kind == 1 and self.allowed_durations is not None:
            allowed = self.allowed_durations[:, c].nonzero().reshape(-1) + 1
            raise ValueError(f"{where}, outside the durations the head allows for label {c}: "
                             f"[{int(allowed.min())}, {int(allowed.max())}] (min_duration / max_duration)")
        if kind == 4 and self.allowed_starts is not None and t == 0:
            raise ValueError(f"the gold segmentation of sequence {b} starts with label {c}, which allowed_starts forbids")
        if kind == 5 and self.allowed_ends is not None and end == int(out.lengths[b]):
            raise ValueError(f"the gold segmentation of sequence {b} ends with label {c}, which allowed_ends forbids")
        if kind == 2:
            c_prev = int(lab[b, t - 1])
            raise ValueError(
                f"the gold segmentation of sequence {b} moves {c_prev} -> {c} at position {t}, which the model "
                "forbids (allowed_transitions, or a -inf transition entry)"
                + ("" if c_prev != c or self.allow_same_label_transitions is True else
                   f": same-label moves of label {c} are forbidden (allow_same_label_transitions), and a run of label "
                   f"{c} longer than its max_duration is cut into pieces joined by {c} -> {c}: allow them for this "
                   "label or use a larger max_duration")
            )
        raise ValueError(f"{where} that the model forbids: {FORBIDDEN_REASONS[kind]}")

    def gold_score(self, hidden_states: torch.Tensor, lengths=None, labels=None, segments=None, out=None, *,
                   mask=None) -> torch.Tensor:
        """Score (B,) of the given segmentation, with exactly the partition's terms (``-inf`` for
        a segmentation that uses a forbidden duration, transition or first label)."""
        if out is None:
            out = self.build(hidden_states, lengths, mask=mask)
        lab, starts = self._gold_tensors(out, labels, segments)
        with torch.autocast(device_type=out.cum_scores.device.type, enabled=False):
            return gold_score(
                out.cum_scores, out.transition, out.duration_bias, out.lengths, lab, starts,
                proj_start=out.proj_start, proj_end=out.proj_end,
            )

    def compute_loss(
        self,
        hidden_states: torch.Tensor,
        lengths=None,
        labels: Optional[torch.Tensor] = None,
        segments: Optional[Sequence[Sequence]] = None,
        reduction: str = "mean",
        zero_infinity: bool = False,
        *,
        mask: Optional[torch.Tensor] = None,
        label_mask: Optional[torch.Tensor] = None,
        boundary_mask: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Negative log-likelihood ``log Z - score(gold)`` of the gold segmentation.

        Args:
            hidden_states: (B, T, H) encoder features.
            lengths: (B,) sequence lengths (or pass ``mask``).
            labels: (B, T) per-position labels, ``ignore_index`` past each length. Each run of one
                label is one segment; a run longer than K is split into pieces of K positions (the
                last holds the rest) joined by the same-label transition ``Tr[c, c]``.
            segments: instead of labels, explicit segmentations: for each sequence a list of
                ``(start, end, label)`` (end exclusive) tiling ``[0, length)``.
            reduction: ``"mean"`` over the batch, ``"sum"``, ``"token_mean"`` (sum divided by the
                number of valid positions) or ``"none"`` (per sequence, (B,)).
            zero_infinity: what to do with a sequence whose loss is infinite, because the model
                allows no segmentation of it at all (log Z = -inf) or forbids its gold segmentation
                (a -inf duration, transition or first label): ``False`` (default) raises a
                ``ValueError`` that names the sequence (and the position and reason for a forbidden
                gold segmentation); ``True`` gives such a sequence loss 0 and zero gradients (as
                ``torch.nn.CTCLoss(zero_infinity=True)``).

            mask: instead of ``lengths``, a (B, T) bool prefix mask, True at valid positions.
            label_mask, boundary_mask: partial labels instead of ``labels`` / ``segments``:
                ``label_mask`` (B, T, C) bool, the labels each position may carry, and
                ``boundary_mask`` (B, T) integer, -1 no segment starts at t, 0 free, 1 a segment
                starts at t. The loss is then ``log Z - log Z(allowed)`` =
                ``-log sum_{y allowed} P(y)``: every segmentation consistent with the partial
                annotation counts as gold (one-hot masks with every boundary fixed give the
                ordinary NLL). Runs the constrained partition on the PyTorch path.

        Returns:
            The NLL, >= 0 up to float rounding.
        """
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        if label_mask is not None or boundary_mask is not None:
            if labels is not None or segments is not None:
                raise ValueError("pass either labels / segments (full labels) or label_mask / boundary_mask "
                                 "(partial labels), not both")
            return self._partial_loss(hidden_states, lengths, mask, label_mask, boundary_mask, reduction,
                                      zero_infinity)
        if self.validate and not torch.compiler.is_compiling():
            out, lab, starts, infinite = self._checked_gold(hidden_states, lengths, mask, labels, segments,
                                                            zero_infinity)
        else:
            # validate=False, or inside a compiled graph: there the checks run in an opaque
            # operator (core.gold.checked_nll) after the loss, at run time, with the eager errors
            if torch.compiler.is_compiling():
                out = SemiCRFOutput(*self._compiled_partition(hidden_states, lengths, mask))
            else:
                out = self.forward(hidden_states, lengths, mask=mask)
            lab, starts = self._gold_tensors(out, labels, segments, check=False)
            code = forbidden_terms(out.transition, out.duration_bias, out.lengths, lab, starts, out.proj_start,
                                   out.proj_end)
            # an infinite loss: the model allows no segmentation at all (log Z = -inf) or not the gold one
            infinite = torch.isneginf(out.partition) | (code > 0).any(1)
        with torch.autocast(device_type=out.cum_scores.device.type, enabled=False):
            gold = gold_score(
                out.cum_scores, out.transition, out.duration_bias, out.lengths, lab, starts,
                proj_start=out.proj_start, proj_end=out.proj_end,
            )
        nll = out.partition - gold
        if self.validate and torch.compiler.is_compiling():
            given = torch.as_tensor(labels) if labels is not None else lab.new_empty(0, 0)
            nll = checked_nll(nll, out.partition, code, starts, given, out.lengths, self.num_classes,
                              self.ignore_index, zero_infinity)
        return _reduce(nll, infinite, zero_infinity, reduction, out.lengths)

    def _checked_gold(self, hidden_states, lengths, mask, labels, segments, zero_infinity):
        """log Z and the gold tensors with every check of ``validate=True`` in ONE device-to-host
        transfer: the engine's input values, the gold labels' range and the infinite losses are
        reduced on the device and read together after the forward pass (the engine runs on
        lengths clamped into [1, T], so that an out-of-range length is reported, not acted on)."""
        out = self.build(hidden_states, lengths, mask=mask)
        T = out.cum_scores.shape[1] - 1
        floats = float_inputs(out.cum_scores, out.transition, out.duration_bias, out.proj_start, out.proj_end)
        stats = value_stats(floats, out.lengths)
        safe = out._replace(lengths=out.lengths.clamp(1, T))
        with torch.autocast(device_type=hidden_states.device.type, enabled=False):
            kwargs = dict(self._engine_kwargs(out), validate=False)
            partition = semi_crf_streaming_forward(out.cum_scores, out.transition, out.duration_bias, safe.lengths,
                                                   self.max_duration, **kwargs)
        safe = safe._replace(partition=partition)
        lab, starts = self._gold_tensors(safe, labels, segments, check=False)
        bad_label = (any_bad_label(torch.as_tensor(labels), out.lengths, self.num_classes, self.ignore_index)
                     if labels is not None else partition.new_zeros((), dtype=torch.bool))
        code = forbidden_terms(out.transition, out.duration_bias, safe.lengths, lab, starts, out.proj_start,
                               out.proj_end)
        infinite = torch.isneginf(partition) | (code > 0).any(1)
        host = torch.cat([stats, bad_label.reshape(1).to(stats.dtype), infinite.to(stats.dtype)]).tolist()  # the read
        n = stats.numel()
        try:
            check_value_stats(floats, host[:n], T)
        except ValueError as exc:
            self._explain_non_finite(exc, hidden_states, out.lengths)
            raise
        if host[n]:
            self._gold_tensors(out, labels, segments, check=True)  # raises with the details
        if not zero_infinity and any(host[n + 1:]):
            self._raise_infinite_loss(safe, lab, starts, code, host[n + 1:].index(1.0))
        return safe, lab, starts, infinite

    def _raise_infinite_loss(self, out: SemiCRFOutput, lab, starts, code, b: int):
        """The error for sequence b's infinite loss: no segmentation at all, or a forbidden gold one."""
        if bool(torch.isneginf(out.partition[b])):
            raise ValueError(no_segmentation_message(b, int(out.lengths[b])))
        self._raise_forbidden_gold(out, lab, starts, code, b)

    def _dist_args(self, out: SemiCRFOutput) -> tuple:
        return (out.cum_scores, out.transition, out.duration_bias, out.lengths, self.max_duration)

    def _partial_loss(self, hidden_states, lengths, mask, label_mask, boundary_mask, reduction, zero_infinity):
        """``log Z - log Z(allowed by the masks)`` per sequence, reduced."""
        out = self.forward(hidden_states, lengths, mask=mask)
        with torch.autocast(device_type=out.cum_scores.device.type, enabled=False):
            allowed = constrained_log_partition(*self._dist_args(out), proj_start=out.proj_start,
                                                proj_end=out.proj_end, label_mask=label_mask,
                                                boundary_mask=boundary_mask, validate=self.validate,
                                                backend=self.backend, use_triton=self.use_triton)
        infinite = torch.isneginf(out.partition) | torch.isneginf(allowed)
        if self.validate and not zero_infinity and bool(infinite.any()):
            b = int(infinite.nonzero()[0])
            raise ValueError(
                f"sequence {b} (length {int(out.lengths[b])}): label_mask / boundary_mask allow no segmentation that "
                "the model allows (log Z of the allowed set = -inf); pass zero_infinity=True to give such sequences "
                "loss 0"
            )
        safe = torch.where(infinite, torch.zeros_like(allowed), allowed)
        return _reduce(out.partition - safe, infinite, zero_infinity, reduction, out.lengths)

    def log_prob(
        self,
        hidden_states: torch.Tensor,
        lengths=None,
        labels: Optional[torch.Tensor] = None,
        segments: Optional[Sequence[Sequence]] = None,
        zero_infinity: bool = False,
        *,
        mask: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Log-likelihood ``log P(gold | x) = score(gold) - log Z`` of each sequence, (B,), <= 0.

        The sign is that of a log-probability: maximise it, or minimise
        ``-head.log_prob(...).mean()``, which equals ``head.compute_loss(...)`` (the NLL). Takes
        the arguments of :meth:`compute_loss` (without ``reduction``) and raises for the same
        impossible sequences unless ``zero_infinity=True`` (then their value is 0).

        Example:
            >>> _ = torch.manual_seed(0)
            >>> head = SemiMarkovCRFHead(num_classes=2, max_duration=3, hidden_dim=4)
            >>> h, mask = torch.randn(2, 5, 4), torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]).bool()
            >>> lp = head.log_prob(h, labels=torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, -100, -100]]), mask=mask)
            >>> lp.shape, bool((lp <= 0).all())
            (torch.Size([2]), True)
        """
        return -self.compute_loss(hidden_states, lengths, labels, segments, reduction="none",
                                  zero_infinity=zero_infinity, mask=mask)

    # ------------------------------------------------------------------ inference

    def distribution(self, hidden_states: torch.Tensor, lengths=None, *, mask=None, label_mask=None,
                     boundary_mask=None) -> SemiMarkovCRF:
        """The head's distribution over the segmentations of these sequences: a
        :class:`~torch_semimarkov.SemiMarkovCRF` holding the potentials (built once) with
        ``log_partition``, ``log_prob``, ``marginals``, ``argmax``, ``topk``, ``sample``,
        ``entropy``, ``cross_entropy`` and ``kl`` (differentiable where the maths is). With
        ``label_mask`` / ``boundary_mask``, the distribution restricted to the segmentations they
        allow. The values are checked here, once (``validate``); a non-finite feature is reported
        as ``hidden_states`` with its sequence and position.

        Example:
            >>> _ = torch.manual_seed(0)
            >>> head = SemiMarkovCRFHead(num_classes=3, max_duration=4, hidden_dim=8)
            >>> dist = head.distribution(torch.randn(2, 10, 8), torch.tensor([10, 7]))
            >>> dist.entropy.shape, dist.argmax.labels.shape
            (torch.Size([2]), torch.Size([2, 10]))
        """
        out = self.build(hidden_states, lengths, mask=mask)
        with torch.autocast(device_type=hidden_states.device.type, enabled=False):
            try:
                return SemiMarkovCRF(
                    out.cum_scores, out.transition, out.duration_bias, out.lengths, self.max_duration,
                    proj_start=out.proj_start, proj_end=out.proj_end, label_mask=label_mask,
                    boundary_mask=boundary_mask, backend=self.backend, use_triton=self.use_triton,
                    checkpoint_interval=self.checkpoint_interval, time_parallel=self.time_parallel,
                    validate=self.validate,
                )
            except ValueError as exc:
                self._explain_non_finite(exc, hidden_states, out.lengths)
                raise

    def _inference(self, hidden_states, lengths, mask, label_mask, boundary_mask, what: Callable):
        """``what(distribution)`` with autocast off (the CRF math runs in the head's dtype)."""
        dist = self.distribution(hidden_states, lengths, mask=mask, label_mask=label_mask,
                                 boundary_mask=boundary_mask)
        with torch.autocast(device_type=hidden_states.device.type, enabled=False):
            return what(dist)

    @torch.no_grad()
    def decode(self, hidden_states: torch.Tensor, lengths=None, *, mask=None, label_mask=None,
               boundary_mask=None) -> ViterbiResult:
        """Viterbi: the best segmentation of each sequence (with ``label_mask`` / ``boundary_mask``,
        of :meth:`compute_loss`: the best segmentation the masks allow, i.e. constrained decoding).

        Returns:
            The engine's :class:`~torch_semimarkov.ViterbiResult`, tensor-first and on the device of
            ``hidden_states``: ``scores`` (B,), ``labels`` (B, T) long with -1 past each length,
            ``segment_starts`` / ``segment_ends`` (exclusive) / ``segment_labels`` (N,) for every
            segment of the batch and ``segment_offsets`` (B+1,) (sequence b owns
            ``[offsets[b], offsets[b+1])``); ``.segments`` builds Python lists of
            :class:`~torch_semimarkov.Segment` on request.
        """
        return self._inference(hidden_states, lengths, mask, label_mask, boundary_mask, lambda d: d.argmax)

    @torch.no_grad()
    def marginals(self, hidden_states: torch.Tensor, lengths=None, *, mask=None, label_mask=None,
                  boundary_mask=None) -> MarginalsResult:
        """Posterior marginals from one forward-backward pass (with ``label_mask`` /
        ``boundary_mask``: of the distribution restricted to the segmentations they allow).

        Returns:
            :class:`~torch_semimarkov.MarginalsResult`, the type
            :func:`~torch_semimarkov.semi_crf_streaming_marginals` returns: ``log_Z`` (B,),
            ``start`` / ``end`` (B, T, C) (a segment of label c starts / has its last position at
            t), ``position`` (B, T, C) per-position label posteriors, ``boundary`` (B, T)
            (P(a segment starts at t); 1 at t = 0) and, computed on access,
            ``position_entropy`` (B, T) in nats. Everything is 0 past each length.
        """
        return self._inference(hidden_states, lengths, mask, label_mask, boundary_mask, lambda d: d.marginals)

    posterior = marginals

    # ------------------------------------------------------------------ beyond the best path

    @torch.no_grad()
    def topk(self, hidden_states: torch.Tensor, lengths=None, k: int = 1, *, mask=None, label_mask=None,
             boundary_mask=None) -> TopKResult:
        """The k best segmentations of each sequence, best first (rank 0 = :meth:`decode`).

        Returns:
            :class:`~torch_semimarkov.TopKResult`: ``scores`` (B, k), ``labels`` (B, k, T) and
            the segment tensors; see :func:`~torch_semimarkov.semi_crf_streaming_topk`.

        Example:
            >>> _ = torch.manual_seed(0)
            >>> head = SemiMarkovCRFHead(num_classes=3, max_duration=4, hidden_dim=8)
            >>> best = head.topk(torch.randn(2, 10, 8), torch.tensor([10, 7]), k=3)
            >>> best.labels.shape, bool((best.scores[:, 0] >= best.scores[:, 1]).all())
            (torch.Size([2, 3, 10]), True)
        """
        return self._inference(hidden_states, lengths, mask, label_mask, boundary_mask, lambda d: d.topk(k))

    @torch.no_grad()
    def sample(self, hidden_states: torch.Tensor, lengths=None, num_samples: int = 1, *, generator=None, mask=None,
               label_mask=None, boundary_mask=None) -> SegmentationSamples:
        """Exact samples from P(segmentation | x) (``generator`` for reproducibility).

        Returns:
            :class:`~torch_semimarkov.SegmentationSamples`: ``labels`` (S, B, T), ``log_prob``
            (S, B) and the segment tensors; see :func:`~torch_semimarkov.semi_crf_streaming_sample`.
        """
        return self._inference(hidden_states, lengths, mask, label_mask, boundary_mask,
                               lambda d: d.sample(num_samples, generator=generator))

    def entropy(self, hidden_states: torch.Tensor, lengths=None, *, mask=None, label_mask=None,
                boundary_mask=None) -> torch.Tensor:
        """Entropy (B,) in nats of P(segmentation | x), differentiable (a training term, e.g.
        ``loss - 0.01 * head.entropy(h, lengths).mean()``); see
        :func:`~torch_semimarkov.semi_crf_streaming_entropy`. Not the per-position entropy of
        :meth:`marginals`, which ignores the dependencies between positions."""
        return self._inference(hidden_states, lengths, mask, label_mask, boundary_mask, lambda d: d.entropy)
