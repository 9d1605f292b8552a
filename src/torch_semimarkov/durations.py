"""Duration distributions: small modules that produce the (K, C) duration log-bias of a semi-CRF.

Every module maps nothing to a tensor ``bias`` of shape (K, C) where ``bias[k-1, c]`` is the
log-score added to a segment of label ``c`` and duration ``k`` (durations run from 1 to K). The
parametric families return log-probabilities of the distribution truncated to 1..K and renormalised
(``normalize=True``), so each column is a proper log-distribution over durations; the parameters
are learnable and stay in their valid range through a softplus / sigmoid.

Example:
    >>> d = make_duration("poisson", max_duration=8, num_classes=3, init_mean=[2.0, 4.0, 6.0])
    >>> d().shape
    torch.Size([8, 3])
    >>> bool(torch.allclose(d().exp().sum(0), torch.ones(3)))
    True
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "DurationDistribution",
    "LearnedDuration",
    "GeometricDuration",
    "NegativeBinomialDuration",
    "PoissonDuration",
    "UniformDuration",
    "CallableDuration",
    "make_duration",
    "DURATION_NAMES",
]

MeanSpec = Union[None, float, Sequence[float], torch.Tensor]


def _per_class(value: MeanSpec, num_classes: int, default: float, name: str) -> torch.Tensor:
    """A (C,) float tensor from a scalar, a sequence of C values or None (the default)."""
    if value is None:
        value = default
    t = torch.as_tensor(value, dtype=torch.float32).reshape(-1)
    if t.numel() == 1:
        t = t.expand(num_classes).clone()
    if t.numel() != num_classes:
        raise ValueError(f"{name} must be a scalar or have {num_classes} values (one per class), got {t.numel()}")
    return t


def _inv_softplus(x: torch.Tensor) -> torch.Tensor:
    return x + torch.log(-torch.expm1(-x))


class DurationDistribution(nn.Module):
    """Base class: ``forward()`` returns the (K, C) duration log-bias."""

    def __init__(self, max_duration: int, num_classes: int, normalize: bool = True):
        super().__init__()
        if max_duration < 1:
            raise ValueError(f"max_duration must be >= 1, got {max_duration}")
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self.max_duration = int(max_duration)
        self.num_classes = int(num_classes)
        self.normalize = normalize
        # shape: (K, 1) -- the durations 1..K
        self.register_buffer("durations", torch.arange(1, max_duration + 1, dtype=torch.float32)[:, None], persistent=False)

    def log_pmf(self, durations: torch.Tensor) -> torch.Tensor:
        """(K, C) unnormalised log-scores; ``durations`` (K, 1) holds 1..K in the compute dtype,
        and parameters are cast to that dtype before any arithmetic."""
        raise NotImplementedError

    def forward(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The (K, C) duration log-bias, computed in ``dtype`` (default float32) from start to end:
        a float64 head gets float64 probabilities, not a float32 table cast up."""
        durations = self.durations if dtype is None else self.durations.to(dtype)
        out = self.log_pmf(durations)
        if self.normalize:
            out = torch.log_softmax(out, dim=0)
        return out

    def extra_repr(self) -> str:
        return f"max_duration={self.max_duration}, num_classes={self.num_classes}, normalize={self.normalize}"


class LearnedDuration(DurationDistribution):
    """A free (K, C) table, initialised to zero (no duration preference). Never renormalised."""

    def __init__(self, max_duration: int, num_classes: int):
        super().__init__(max_duration, num_classes, normalize=False)
        self.bias = nn.Parameter(torch.zeros(max_duration, num_classes))

    def log_pmf(self, durations: torch.Tensor) -> torch.Tensor:
        return self.bias.to(durations.dtype)


class GeometricDuration(DurationDistribution):
    """Geometric on 1..K: P(k) = p (1-p)^(k-1), one learnable p per class (mean 1/p)."""

    def __init__(self, max_duration: int, num_classes: int, init_mean: MeanSpec = None, normalize: bool = True):
        super().__init__(max_duration, num_classes, normalize)
        mean = _per_class(init_mean, num_classes, max(1.5, max_duration / 4), "init_mean").clamp(min=1.0 + 1e-3)
        self.logit_p = nn.Parameter(torch.logit(1.0 / mean))

    def log_pmf(self, durations: torch.Tensor) -> torch.Tensor:
        logit_p = self.logit_p.to(durations.dtype)
        log_p = F.logsigmoid(logit_p)
        log_q = F.logsigmoid(-logit_p)
        return log_p[None, :] + (durations - 1.0) * log_q[None, :]


class NegativeBinomialDuration(DurationDistribution):
    """Negative binomial on k-1 (k = 1..K): learnable shape r > 0 and success probability p per class.

    P(k) = Gamma(k-1+r) / (Gamma(r) (k-1)!) p^r (1-p)^(k-1), mean 1 + r (1-p) / p. ``r = 1`` is the
    geometric; larger ``r`` gives the peaked durations of, e.g., exons.
    """

    def __init__(
        self,
        max_duration: int,
        num_classes: int,
        init_mean: MeanSpec = None,
        init_shape: MeanSpec = None,
        normalize: bool = True,
    ):
        super().__init__(max_duration, num_classes, normalize)
        mean = _per_class(init_mean, num_classes, max(1.5, max_duration / 4), "init_mean").clamp(min=1.0 + 1e-3)
        r = _per_class(init_shape, num_classes, 2.0, "init_shape").clamp(min=1e-3)
        # mean - 1 = r (1-p) / p  =>  p = r / (r + mean - 1)
        p = r / (r + mean - 1.0)
        self.raw_shape = nn.Parameter(_inv_softplus(r))
        self.logit_p = nn.Parameter(torch.logit(p.clamp(1e-4, 1 - 1e-4)))

    def log_pmf(self, durations: torch.Tensor) -> torch.Tensor:
        r = F.softplus(self.raw_shape.to(durations.dtype))[None, :]
        logit_p = self.logit_p.to(durations.dtype)
        n = durations - 1.0
        return (
            torch.lgamma(n + r)
            - torch.lgamma(r)
            - torch.lgamma(n + 1.0)
            + r * F.logsigmoid(logit_p)[None, :]
            + n * F.logsigmoid(-logit_p)[None, :]
        )


class PoissonDuration(DurationDistribution):
    """Poisson on k-1 (k = 1..K) with a learnable rate per class: mean duration 1 + rate."""

    def __init__(self, max_duration: int, num_classes: int, init_mean: MeanSpec = None, normalize: bool = True):
        super().__init__(max_duration, num_classes, normalize)
        mean = _per_class(init_mean, num_classes, max(1.5, max_duration / 4), "init_mean").clamp(min=1.0 + 1e-3)
        self.raw_rate = nn.Parameter(_inv_softplus(mean - 1.0))

    def log_pmf(self, durations: torch.Tensor) -> torch.Tensor:
        rate = F.softplus(self.raw_rate.to(durations.dtype))[None, :]
        n = durations - 1.0
        return n * torch.log(rate) - rate - torch.lgamma(n + 1.0)


class UniformDuration(DurationDistribution):
    """Uniform on 1..K: every duration gets log(1/K). No parameters."""

    def __init__(self, max_duration: int, num_classes: int):
        super().__init__(max_duration, num_classes, normalize=False)

    def log_pmf(self, durations: torch.Tensor) -> torch.Tensor:
        # computed in the durations' dtype: -log(K) in float64 for a float64 head
        return torch.full((self.max_duration, self.num_classes), -math.log(self.max_duration),
                          dtype=durations.dtype, device=durations.device)


class CallableDuration(DurationDistribution):
    """Wraps a user function ``fn(durations) -> bias``.

    ``fn`` receives the durations 1..K as a float tensor of shape (K, 1) and returns a tensor of
    shape (K, C) or (K, 1) (broadcast to every class) of log-scores. If ``fn`` is an ``nn.Module``
    its parameters are learned with the rest of the head.

    Example:
        >>> d = CallableDuration(lambda k: -0.1 * k, max_duration=5, num_classes=2, normalize=False)
        >>> d()[:, 0]
        tensor([-0.1000, -0.2000, -0.3000, -0.4000, -0.5000])
    """

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], max_duration: int, num_classes: int, normalize: bool = False):
        super().__init__(max_duration, num_classes, normalize)
        if not callable(fn):
            raise TypeError(f"duration function must be callable, got {type(fn).__name__}")
        self.fn = fn

    def log_pmf(self, durations: torch.Tensor) -> torch.Tensor:
        out = torch.as_tensor(self.fn(durations), device=durations.device)
        K, C = self.max_duration, self.num_classes
        if out.dim() == 1 and out.shape[0] == K:
            out = out[:, None]
        if out.dim() != 2 or out.shape[0] != K or out.shape[1] not in (1, C):
            raise ValueError(f"duration function must return shape ({K}, {C}) or ({K}, 1), got {tuple(out.shape)}")
        if not out.dtype.is_floating_point:
            out = out.to(durations.dtype)
        # the function's own precision is kept up to the compute dtype (a float32 function result
        # in a float64 head stays as precise as the function made it)
        return out.to(durations.dtype).expand(K, C)


DURATION_NAMES = ("learned", "geometric", "negative_binomial", "poisson", "uniform")


def make_duration(
    spec: Union[str, DurationDistribution, Callable], max_duration: int, num_classes: int, **kwargs
) -> DurationDistribution:
    """A duration module from a name, a module, or a callable.

    Args:
        spec: one of ``DURATION_NAMES`` (``"negbin"`` is accepted for ``"negative_binomial"``), a
            :class:`DurationDistribution` (returned as is after a shape check), or a callable
            (wrapped in :class:`CallableDuration`).
        max_duration: K.
        num_classes: C.
        **kwargs: passed to the distribution (``init_mean``, ``init_shape``, ``normalize``).
    """
    if isinstance(spec, DurationDistribution):
        if (spec.max_duration, spec.num_classes) != (max_duration, num_classes):
            raise ValueError(
                f"duration module has (K, C) = ({spec.max_duration}, {spec.num_classes}), "
                f"the head needs ({max_duration}, {num_classes})"
            )
        return spec
    if isinstance(spec, str):
        name = spec.lower().replace("-", "_")
        if name == "negbin":
            name = "negative_binomial"
        classes = {
            "learned": LearnedDuration,
            "geometric": GeometricDuration,
            "negative_binomial": NegativeBinomialDuration,
            "poisson": PoissonDuration,
            "uniform": UniformDuration,
        }
        if name not in classes:
            raise ValueError(f"unknown duration distribution {spec!r}; choose one of {DURATION_NAMES} or pass a callable")
        return classes[name](max_duration, num_classes, **kwargs)
    if callable(spec):
        return CallableDuration(spec, max_duration, num_classes, **kwargs)
    raise TypeError(f"duration must be a name, a DurationDistribution or a callable, got {type(spec).__name__}")
