"""Exact samples of segmentations (forward filtering, backward sampling) on every engine.
"""

from __future__ import annotations

from typing import Optional

import torch

from torch_semimarkov.api.constrained import _validated
from torch_semimarkov.core.results import SegmentationSamples
from torch_semimarkov.core.signature import keyword_options
from torch_semimarkov.core.validation import StreamingInputs, detached
from torch_semimarkov.engines.available import numba_module
from torch_semimarkov.engines.select import cpu_engine, cpu_limits, engine_samples
from torch_semimarkov.engines.torch.dense import _fill_past_length, _inverse_cdf, _Model, _NEG, _walk


def _segment_scores(inp: StreamingInputs, rows: int, starts, ends, labels, offsets, per_row: int = 0) -> torch.Tensor:
    """(rows,) float64 score of each row's segmentation from its segment tensors: gathers per
    segment, never a copy of the inputs per row. Row r is sequence ``r % B``, or ``r // per_row``
    when ``per_row`` is given (the (B, k) rows of a k-best list)."""
    dev = starts.device
    B = inp.batch
    row = torch.repeat_interleave(torch.arange(rows, device=dev), offsets.diff())
    b = row // per_row if per_row else row % B
    cum = inp.cum_scores
    val = cum[b, ends, labels].double() - cum[b, starts, labels].double()
    val = val + inp.duration_bias.double()[ends - starts - 1, labels]
    if inp.proj_start is not None:
        val = val + inp.proj_start[b, starts, labels].double()
    if inp.proj_end is not None:
        val = val + inp.proj_end[b, ends - 1, labels].double()
    tr = inp.transition.double()
    prev = torch.roll(labels, 1)
    if tr.dim() == 3:
        k = ends - starts - 1
        val = val + torch.where(starts == 0, torch.logsumexp(tr, 1)[k, labels], tr[k, prev, labels])
    else:
        val = val + torch.where(starts == 0, torch.logsumexp(tr, 0)[labels], tr[prev, labels])
    total = torch.cat([val.new_zeros(1), val.cumsum(0)])
    return total[offsets[1:]] - total[offsets[:-1]]


def _sample_on_engine(inp: StreamingInputs, num_samples: int, generator) -> "SegmentationSamples":
    """Engine sampling: one forward keeping every position's ``alpha_hat`` (and ``U_hat`` for a
    (C, C) transition) and frames, then ``num_samples·B`` walks by the chunked, merging walk
    (``sample_chunked``)."""
    from torch_semimarkov.engines.triton import launch, parallel
    from torch_semimarkov.engines.triton.plan import sample_chunk_length

    S, B, T, K = num_samples, inp.batch, inp.T, inp.K
    dev = inp.cum_scores.device
    log_z, state = launch.launch_forward(inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, K,
                                         proj_start=inp.proj_start, proj_end=inp.proj_end, save="all")
    saved, frames = state
    ok = torch.isfinite(log_z)
    traced = torch.where(ok, inp.lengths, torch.zeros_like(inp.lengths))
    uniforms = torch.rand((S * B, T + 1, 2), generator=generator, device=dev, dtype=torch.float32)
    K_eff = min(K, max(T, 1))
    chunk = sample_chunk_length(S * B, T, K_eff, dev)
    c = lambda x: x.contiguous()  # noqa: E731
    ps = None if inp.proj_start is None else c(inp.proj_start)
    labels, starts, _ = parallel.sample_chunked(saved, frames, c(inp.cum_scores), c(inp.transition),
                                                c(inp.duration_bias), c(traced), uniforms, K_eff, chunk, ps)
    return _samples_result(inp, S, labels, starts, log_z)


def _samples_result(inp: StreamingInputs, S: int, labels, starts, log_z) -> "SegmentationSamples":
    """:class:`SegmentationSamples` from an engine's walks, labels / starts (S·B, T) with row
    ``s·B + b``: scores recomputed exactly (float64) from the segments, minus log Z (B,)."""
    B, T = inp.batch, inp.T
    ok = torch.isfinite(log_z)
    out = SegmentationSamples(labels.reshape(S, B, T), starts.reshape(S, B, T), inp.lengths, None, None)
    score = _segment_scores(inp, S * B, out.segment_starts, out.segment_ends, out.segment_labels,
                            out.segment_offsets).reshape(S, B)
    neg = torch.full_like(score, _NEG)
    dt = inp.cum_scores.dtype
    out.scores = torch.where(ok[None, :], score, neg).to(dt)
    out.log_prob = torch.where(ok[None, :], score - log_z[None, :].double(), neg).to(dt)
    return out


@keyword_options("num_samples", "proj_start", "proj_end", "label_mask", "boundary_mask", "generator", "validate")
def semi_crf_streaming_sample(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths: torch.Tensor,
    K: int,
    *,
    num_samples: int = 1,
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
    label_mask: Optional[torch.Tensor] = None,
    boundary_mask: Optional[torch.Tensor] = None,
    generator: Optional[torch.Generator] = None,
    backend: str = "auto",
    use_triton: bool = True,
    validate: bool = True,
) -> SegmentationSamples:
    """Exact samples from P(segmentation) by forward filtering, backward sampling.

    One forward pass keeps the messages alpha (B, T+1, C+1); each sample then walks back from its
    sequence's end: at each segment start t (first: the end), the label of the segment that ends
    at t from ``alpha_t(c') + Tr[c', c]``, then its duration k from the prefix sums of every
    duration, by the inverse CDF with two uniforms per position (drawn from ``generator``,
    float64, (S·B, T+1, 2)). The draws are exact (no perturbation, no MCMC). On CPU tensors the
    compiled engine (numba, :mod:`torch_semimarkov.engines.numba.sample`) runs the same walk on the same uniforms, so it
    returns the same samples as ``backend="torch"``; on CUDA tensors (no masks; a (C, C) or
    (K, C, C) transition) the engine's forward and a Triton walk, parallel over samples, sequences
    and chunks of positions, do the same with float32 uniforms.

    Args:
        cum_scores ... K, proj_start, proj_end: as :func:`~torch_semimarkov.semi_crf_streaming_forward`.
        num_samples: S, samples per sequence.
        label_mask, boundary_mask: sample from the distribution restricted to the allowed
            segmentations (see :func:`semi_crf_streaming_topk`).
        generator: a ``torch.Generator`` on the device of the inputs, for reproducible samples.

    Returns:
        :class:`SegmentationSamples`: ``labels`` (S, B, T), ``log_prob`` (S, B), ``scores`` (S, B) and
        the segment tensors. Not differentiable (use :func:`semi_crf_streaming_entropy` or the
        log-probability of the samples for score-function estimators).

    Example:
        >>> import torch
        >>> from torch_semimarkov import semi_crf_streaming_sample
        >>> cum = torch.nn.functional.pad(torch.randn(2, 20, 3).cumsum(1), (0, 0, 1, 0))
        >>> g = torch.Generator().manual_seed(0)
        >>> out = semi_crf_streaming_sample(cum, torch.zeros(3, 3), torch.zeros(5, 3), torch.tensor([20, 9]), 5,
        ...                                 num_samples=4, generator=g)
        >>> out.labels.shape, bool((out.log_prob <= 0).all())
        (torch.Size([4, 2, 20]), True)
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
    inp, lm, bm, choice = _validated(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end,
                                     label_mask, boundary_mask, validate, backend, use_triton, "samples",
                                     any_transition=True)
    with torch.no_grad():
        if choice != "no" and engine_samples(inp, lm, bm):
            return _sample_on_engine(inp, num_samples, generator)
        S, B, T = num_samples, inp.batch, inp.T
        dev = inp.cum_scores.device
        uniforms = torch.rand((S * B, T + 1, 2), generator=generator, dtype=torch.float64, device=dev)
        eng = cpu_engine(inp, backend) and numba_module("sample")
        if eng:
            labels, starts, log_z = eng.sample_numba(detached(inp.cum_scores), detached(inp.transition),
                                                     detached(inp.duration_bias), inp.lengths, inp.K,
                                                     detached(inp.proj_start), detached(inp.proj_end),
                                                     uniforms, masks=cpu_limits(inp, lm, bm))
            return _samples_result(inp, S, labels, starts, log_z)
        model = _Model(inp, lm, bm)
        A = model.alpha()
        log_z = model.log_z(A)
        C = model.C
        rows = torch.arange(S * B, device=dev)
        b = rows % B  # row s*B + b
        L = model.lengths[b]
        ok = torch.isfinite(log_z)[b]
        end = A[b, L + model.K, :C]
        last = _inverse_cdf(torch.where(ok[:, None], end, torch.zeros_like(end)), uniforms[rows, L, 0])
        t = torch.where(ok, L, torch.zeros_like(L))

        def choose(active, ta, ca, e):
            # the duration from every prefix (u2 of the end), then the previous label (u1 of the start)
            prev = A[b[active][:, None], ta[:, None] + model.K - model.ks[None, :]]  # (n, K, C+1)
            x = prev + e
            k = _inverse_cdf(torch.logsumexp(x, 2), uniforms[active, ta, 1])
            xk = x[torch.arange(x.shape[0], device=dev), k]  # (n, C+1)
            c_prev = _inverse_cdf(xk, uniforms[active, ta - k - 1, 0])
            return k * (C + 1) + c_prev

        labels, flags, score = _walk(model, b, t, last, choose)
        labels = _fill_past_length(labels, L)
        neg = torch.full_like(score, _NEG)
        score = torch.where(ok, score, neg)
        log_prob = torch.where(ok, score - log_z[b], neg)
        dt = inp.cum_scores.dtype
        return SegmentationSamples(labels.reshape(S, B, T), flags.reshape(S, B, T), model.lengths,
                                   score.reshape(S, B).to(dt), log_prob.reshape(S, B).to(dt))
