"""The entropy of the distribution over segmentations and the cross-entropy term ``-E_p[score_q]``
(the head's KL and cross-entropy), with gradients, on every engine.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from torch_semimarkov.api.constrained import _validated
from torch_semimarkov.core.cumsum import cumsum_time
from torch_semimarkov.core.signature import keyword_options
from torch_semimarkov.core.validation import StreamingInputs, detached
from torch_semimarkov.engines.available import numba_module
from torch_semimarkov.engines.interface import masked_input_grads, scale_grads
from torch_semimarkov.engines.select import cpu_engine, cpu_limits, engine_masks, engine_takes, refuse
from torch_semimarkov.engines.torch.dense import (
    _edge_gradients,
    _expected_prefix,
    _expected_score,
    _expected_suffix,
    _forbid64,
    _messages_and_expected,
    _Model,
    _weighted,
)


class _Entropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cum_scores, transition, duration_bias, proj_start, proj_end, inp, label_mask, boundary_mask):
        model = _Model(inp, label_mask, boundary_mask)
        A, Ea = _messages_and_expected(model, "alpha")
        log_z, expected = _expected_score(model, A, Ea)
        H = torch.where(torch.isfinite(log_z), log_z - expected, torch.zeros_like(log_z))
        ctx.stash = (model, A, Ea, log_z, expected, inp)
        return H.to(inp.cum_scores.dtype)

    @staticmethod
    def backward(ctx, grad):
        model, A, Ea, log_z, expected, inp = ctx.stash
        Bt, Eb = _messages_and_expected(model, "beta")
        return _edge_gradients(model, A, Bt, log_z, grad, (Ea, Eb, expected)).result(inp) + (None, None, None)


def _entropy_on_engine(inp: StreamingInputs, lm, bm, engine: str = "may") -> Optional[torch.Tensor]:
    """(B,) float64 entropy from ONE forward + backward of the engine, or None where the engine
    cannot take the call (then the float64 path of :class:`_Entropy`).

    ``H = log Z - E[score]`` and the score is linear in the parameters, except for the first
    segment's ``logsumexp_{c'} Tr[c', c]``, so ``E[score]`` comes from the engine's marginals:
    per-position label marginals times per-position scores (``S_{p+1} - S_p``, never the
    cumulative values, which would cost float64 digits at long T), expected transition and
    duration counts times their scores, and the projections. The value only: its gradient needs
    the expectation semiring, which the engine's kernels do not run. A (K, C, C) transition too
    (masks included): its first segment's phantom term depends on the duration, weighted by
    :func:`_first_segments`."""
    from torch_semimarkov.engines.triton import launch
    kcc = inp.duration_transitions
    if engine == "no" or not engine_takes(inp, any_transition=True):
        return None
    masks = None
    ps, pe = inp.proj_start, inp.proj_end
    if lm is not None or bm is not None:
        on_engine = engine_masks(inp, lm, bm, engine=engine, any_transition=True)
        if on_engine is None:
            return None
        plan, masks, ps = on_engine
    else:
        plan = launch.plan_for(inp.cum_scores, inp.transition, inp.K, backward=True)
    args = (inp.cum_scores.detach(), inp.transition.detach(), inp.duration_bias.detach(), inp.lengths, inp.K)
    with torch.no_grad():
        log_z, state = launch.launch_forward(*args, "log", detached(ps), detached(pe), plan=plan, masks=masks,
                                             beta=True)
        p_start, p_end, g_tr, g_db = (x.double() for x in launch.launch_backward(
            *args, detached(ps), detached(pe), plan=plan, state=state, masks=masks))
        cum = inp.cum_scores.detach().double()
        x = cum[:, 1:] - cum[:, :-1]
        # P(position p has label c) = P(a c-segment starts at or before p) - P(one ends before p)
        # (a scan along the innermost dimension: along T it is one sequential thread per column)
        label = cumsum_time(p_start - torch.nn.functional.pad(p_end, (0, 0, 1, 0))[:, :-1])
        expected = (label * x).sum((1, 2))
        tr = _forbid64(inp.transition)
        expected = expected + _weighted(g_tr, tr[None]).sum(tuple(range(1, g_tr.dim())))
        expected = expected + _weighted(g_db, _forbid64(inp.duration_bias)[None]).sum((1, 2))
        # the marginals count the first segment's phantom predecessor by softmax_{c'} Tr[c', c];
        # its score is logsumexp_{c'} Tr[c', c]: add the difference (the phantom's entropy)
        soft = torch.softmax(tr, -2)
        phantom = torch.logsumexp(tr, -2) - _weighted(soft, tr).sum(-2)
        phantom = torch.where(torch.isfinite(phantom), phantom, 0.0)
        if kcc:  # (K, C): the phantom of a first segment of each duration
            # the time-parallel forward kept every position's rows: the first K' are those it needs
            rows = (state.first[0], state.second) if plan.time_parallel and plan.kind == "dur" else None
            expected = expected + (_first_segments(inp, p_end, masks, rows) * phantom[None, :p_end.shape[1]]).sum((1, 2))
        else:
            expected = expected + (p_start[:, 0] * phantom).sum(1)
        for p, m in ((ps, p_start), (pe, p_end)):
            if p is not None:
                expected = expected + _weighted(m, _forbid64(p)).sum((1, 2))
        ok = torch.isfinite(log_z)
        return torch.where(ok, log_z.double() - expected, torch.zeros_like(expected))


def _first_segments(inp: StreamingInputs, p_end: torch.Tensor, masks=None, rows=None) -> torch.Tensor:
    """(B, K', C) float64 P(the first segment is [0, k) of label c), k = 1..K' (K' = min(K, T)),
    from the engine's end marginals: ``P(a c-segment ends at k) · exp(a0_k(c) - alpha_k(c))``,
    where a0 is the score of the one-segment prefix (phantom predecessor included) and alpha_k the
    forward message: from ``rows`` (``(alpha_hat (B, T+1, C) float32, frames (B, T+1) float64)``,
    the call's own forward where it kept every position), else from the engine's forward over the
    first K' positions (they depend on nothing later). ``masks``: the call's segment limits
    ``(min_start, max_end, flags)`` (``limits.py``): that forward reads their first K' + 1 rows, and
    a first segment they exclude has probability 0. Where a sequence is shorter than K' its rows
    past its end are not read (its end marginals there are 0)."""
    from torch_semimarkov.engines.triton import launch
    from torch_semimarkov.engines.triton.limits import NO_START
    from torch_semimarkov.engines.triton.plan import masked_plan
    B, K1 = inp.batch, min(inp.K, inp.T)
    cut = lambda x: None if x is None else x.detach()[:, :K1].contiguous()  # noqa: E731
    cum = inp.cum_scores.detach()[:, :K1 + 1].contiguous()
    lengths = torch.full((B,), K1, device=cum.device, dtype=inp.lengths.dtype)
    first = None if masks is None else tuple(m[:, :K1 + 1].contiguous() for m in masks)
    if rows is None:
        plan = None if masks is None else masked_plan(B, K1, K1, inp.C, device=cum.device, duration_transitions=True)
        _, (saved, frames) = launch.launch_forward(cum, inp.transition.detach(), inp.duration_bias.detach(), lengths,
                                                   K1, "log", cut(inp.proj_start), cut(inp.proj_end), save="all",
                                                   plan=plan, masks=first)
        rows = (saved[0], frames)
    alpha = rows[0][:, 1:K1 + 1].double() + rows[1][:, 1:K1 + 1, None]
    c64 = cum.double()
    a0 = (c64[:, 1:] - c64[:, :1] + _forbid64(inp.duration_bias)[None, :K1]
          + torch.logsumexp(_forbid64(inp.transition), 1)[None, :K1])
    for p, at in ((inp.proj_start, slice(0, 1)), (inp.proj_end, slice(0, K1))):
        if p is not None:
            a0 = a0 + p.detach()[:, at].double()
    if first is not None:  # [0, k) of label c is allowed iff min_start[k, c] = 0 and 0 may start one
        allowed = (first[0][:, 1:] == 0) & ((first[2][:, :1] & NO_START) == 0)[:, :, None]
        a0 = torch.where(allowed, a0, torch.full_like(a0, -math.inf))
    p = p_end.double()[:, :K1]
    return torch.where(p > 0, p * torch.exp(torch.clamp(a0 - alpha, max=0.0)), torch.zeros_like(p))


class _EngineEntropy(torch.autograd.Function):
    """The entropy and its gradient on the engine (``engines/triton/entropy.py``): the forward runs
    everything (the gradient is a by-product of the same passes) and keeps the weighted
    marginals; the backward scales them."""

    @staticmethod
    def forward(ctx, cum_scores, transition, duration_bias, proj_start, proj_end, inp, engine):
        from torch_semimarkov.engines.triton.entropy import launch_entropy
        plan, masks, ps = engine
        H, *q = launch_entropy(detached(cum_scores), detached(transition), detached(duration_bias), inp.lengths,
                               inp.K, detached(ps), detached(proj_end), plan=plan, masks=masks)
        ctx.stash = (detached(cum_scores), q, proj_start is not None, proj_end is not None)
        return H.to(inp.cum_scores.dtype)

    @staticmethod
    def backward(ctx, grad):
        cum, q, has_ps, has_pe = ctx.stash
        # dH/dtheta is minus log Z's gradient map applied to the weighted marginals
        return masked_input_grads(ctx, cum, -grad, q, has_ps, has_pe)


def _entropy_engine(inp: StreamingInputs, lm, bm, engine: str = "may"):
    """``(plan, masks, proj_start)`` of an entropy with its gradient on the engine (the
    time-parallel register-ring plan of a (C, C) transition, or the blocked engine's where its
    ring is too large for registers; the chunked direct recurrence of a (K, C, C) one), or None
    (the float64 path)."""
    if lm is not None or bm is not None:
        return engine_masks(inp, lm, bm, engine=engine, blocked=True, any_transition=True)
    if engine == "no" or not engine_takes(inp, any_transition=True):
        return None
    from torch_semimarkov.engines.triton.plan import masked_plan
    plan = masked_plan(inp.batch, inp.T, inp.K, inp.C, device=inp.cum_scores.device, blocked=True,
                       duration_transitions=inp.duration_transitions)
    if plan is None:
        refuse(engine, "the entropy's gradient")
        return None
    return plan, None, inp.proj_start


class _NumbaEntropy(torch.autograd.Function):
    """The entropy and its gradient on the compiled CPU engine (:mod:`torch_semimarkov.engines.numba.entropy`, a (C, C) or
    (K, C, C) transition): the forward runs both passes when a gradient is needed and keeps the weighted
    marginals; the backward scales them."""

    @staticmethod
    def forward(ctx, cum_scores, transition, duration_bias, proj_start, proj_end, inp, limits):
        args = (detached(cum_scores), detached(transition), detached(duration_bias), inp.lengths, inp.K,
                detached(proj_start), detached(proj_end))
        grads = any(ctx.needs_input_grad[:5])
        out = numba_module("entropy").expected_score_numba(args, masks=limits, grads=grads)
        log_z, expected = out[0], out[1]
        ctx.stash = (args[0], out[3] if grads else None, proj_start is not None, proj_end is not None)
        H = torch.where(torch.isfinite(log_z), log_z - expected, torch.zeros_like(log_z))
        return H.to(inp.cum_scores.dtype)

    @staticmethod
    def backward(ctx, grad):
        cum, weighted, has_ps, has_pe = ctx.stash
        return masked_input_grads(ctx, cum, -grad, weighted, has_ps, has_pe)


@keyword_options("proj_start", "proj_end", "label_mask", "boundary_mask", "validate")
def semi_crf_streaming_entropy(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths: torch.Tensor,
    K: int,
    *,
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
    label_mask: Optional[torch.Tensor] = None,
    boundary_mask: Optional[torch.Tensor] = None,
    backend: str = "auto",
    use_triton: bool = True,
    validate: bool = True,
) -> torch.Tensor:
    """Entropy ``H = -sum_y P(y) log P(y)`` (nats) of the distribution over segmentations, (B,).

    Computed exactly by streaming passes in the expectation semiring, ``H = log Z - E[score]``,
    never by enumeration; differentiable with respect to every float input (the gradient
    ``dH/d(edge) = -P(edge) (E[score | edge] - E[score])`` comes from one more forward-backward
    pass, not from autograd over T), so it can be a training term (e.g. an entropy penalty).
    With masks, the entropy of the distribution restricted to the allowed segmentations.

    Paths: CPU tensors with a (C, C) or (K, C, C) transition take the compiled CPU engine
    (``backend="auto"`` or ``"numba"``; float64, :mod:`torch_semimarkov.engines.numba.entropy`, the same recurrences
    compiled, 100x+ faster, with the scores taken relative to a per-position reference so that
    cumulative scores of 1e6 cost no precision). CUDA tensors take the engine's float32 kernels.
    Without a gradient (or under ``torch.no_grad()``: uncertainty for active learning,
    monitoring) one forward + backward, ``E[score]`` from its marginals (about the accuracy of
    the engine's log Z); with one, the entropy engine (``engines/triton/entropy.py``: prefix and
    suffix entropy recurrences, then weighted marginals; (C, C) rings that fit in registers and
    (K, C, C) transitions). Elsewhere (the gradient of larger (C, C) rings, ``backend="torch"``,
    the CPU without numba) the float64 expectation-semiring recurrences (dense kernels on CUDA,
    PyTorch on the CPU).

    Args: those of :func:`semi_crf_streaming_topk` (without ``k``).

    Returns:
        (B,) in the dtype of ``cum_scores``; 0 (with zero gradients) for a sequence that has no
        allowed segmentation.

    Example:
        >>> import torch
        >>> from torch_semimarkov import semi_crf_streaming_entropy
        >>> cum = torch.nn.functional.pad(torch.randn(2, 30, 3).cumsum(1), (0, 0, 1, 0)).requires_grad_()
        >>> H = semi_crf_streaming_entropy(cum, torch.zeros(3, 3), torch.zeros(6, 3), torch.tensor([30, 12]), 6)
        >>> H.sum().backward(); bool((H > 0).all()), cum.grad.shape
        (True, torch.Size([2, 31, 3]))
    """
    inp, lm, bm, choice = _validated(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end,
                                     label_mask, boundary_mask, validate, backend, use_triton, any_transition=True)
    tensors = (inp.cum_scores, inp.transition, inp.duration_bias, inp.proj_start, inp.proj_end)
    if choice == "no":
        pass
    elif not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)):
        H = _entropy_on_engine(inp, lm, bm, choice)
        if H is not None:
            return H.to(inp.cum_scores.dtype)
    else:
        engine = _entropy_engine(inp, lm, bm, choice)
        if engine is not None:
            return _EngineEntropy.apply(inp.cum_scores, inp.transition, inp.duration_bias, inp.proj_start,
                                        inp.proj_end, inp, engine)
    # the engine's kernels did not take it (CPU tensors): the compiled CPU engine where it runs
    if cpu_engine(inp, backend) is not None:
        return _NumbaEntropy.apply(*tensors, inp, cpu_limits(inp, lm, bm))
    return _Entropy.apply(inp.cum_scores, inp.transition, inp.duration_bias, inp.proj_start, inp.proj_end, inp, lm, bm)


class _NegExpectedScore(torch.autograd.Function):
    """``-E_p[score_q(y)]`` (B,) for two models over the same positions, by the expectation
    semiring of the entropy with q's scores inside the expectations and p's weights; both sets of
    inputs get gradients: ``-Cov_p(d score_p, score_q)`` for p (the entropy's weighted marginals
    with q's conditional expectations) and ``-E_p[d score_q]`` for q (p's marginals mapped
    through q's terms, the first segment's phantom term included)."""

    @staticmethod
    def forward(ctx, p_cum, p_tr, p_db, p_ps, p_pe, q_cum, q_tr, q_db, q_ps, q_pe, inp_p, inp_q, masks_p, masks_q):
        mp, mq = _Model(inp_p, *masks_p), _Model(inp_q, *masks_q)
        A = mp.alpha()
        Ea = _expected_prefix(mp, A, mq)
        log_z, expected = _expected_score(mp, A, Ea)
        ctx.stash = (mp, mq, A, Ea, log_z, expected, inp_p, inp_q)
        return torch.where(torch.isfinite(log_z), -expected, torch.zeros_like(expected)).to(inp_p.cum_scores.dtype)

    @staticmethod
    def backward(ctx, grad):
        mp, mq, A, Ea, log_z, expected, inp_p, inp_q = ctx.stash
        # a sequence whose expectation is infinite (q forbids what p allows) has no gradient
        finite = torch.isfinite(expected)
        grad = torch.where(finite, grad.to(torch.float64), torch.zeros_like(expected))
        keep = finite[:, None, None]
        Ea = torch.where(keep, Ea, torch.zeros_like(Ea))
        expected = torch.where(finite, expected, torch.zeros_like(expected))
        Bt = mp.beta()
        Eb = torch.where(keep, _expected_suffix(mp, Bt, mq), torch.zeros_like(Ea))
        g_p = _edge_gradients(mp, A, Bt, log_z, grad, (Ea, Eb, expected), values=mq).result(inp_p)
        g_q = _edge_gradients(mp, A, Bt, log_z, -grad).result(inp_q, scored=mq)
        return g_p + g_q + (None, None, None, None)


class _NumbaNegExpectedScore(torch.autograd.Function):
    """``-E_p[score_q]`` on the compiled CPU engine (:mod:`torch_semimarkov.engines.numba.entropy`; (C, C) or (K, C, C)
    transitions, masks on either model): p's gradient from the weighted marginals, q's from p's
    marginals mapped through q's terms (the first segment's share by q's softmax)."""

    @staticmethod
    def forward(ctx, p_cum, p_tr, p_db, p_ps, p_pe, q_cum, q_tr, q_db, q_ps, q_pe, inp_p, inp_q, limits, limits_q):
        p_args = (detached(p_cum), detached(p_tr), detached(p_db), inp_p.lengths, inp_p.K, detached(p_ps),
                  detached(p_pe))
        q_args = (detached(q_cum), detached(q_tr), detached(q_db), inp_q.lengths, inp_q.K, detached(q_ps),
                  detached(q_pe))
        grads = any(ctx.needs_input_grad[:10])
        out = numba_module("entropy").expected_score_numba(p_args, q_args, limits, grads, limits_q)
        log_z, expected = out[0], out[1]
        ctx.stash = (p_args, q_args, out[2:] if grads else None)
        neg = torch.where(torch.isfinite(log_z), -expected, torch.zeros_like(expected))
        return neg.to(inp_p.cum_scores.dtype)

    @staticmethod
    def backward(ctx, grad):
        p_args, q_args, (plain, weighted) = ctx.stash
        need = ctx.needs_input_grad
        grad = torch.where(torch.isfinite(grad), grad, torch.zeros_like(grad)).to(torch.float64)
        has = lambda a: (a[5] is not None, a[6] is not None)  # noqa: E731
        g_p = scale_grads(p_args[0], (need[0], need[1], need[2], need[3] and has(p_args)[0],
                                       need[4] and has(p_args)[1]), -grad, *weighted)
        g_q = scale_grads(q_args[0], (need[5], need[6], need[7], need[8] and has(q_args)[0],
                                       need[9] and has(q_args)[1]), -grad, *plain)
        return g_p + g_q + (None, None, None, None)


def negative_expected_score(inp_p: StreamingInputs, masks_p, inp_q: StreamingInputs, masks_q,
                            backend: str = "auto") -> torch.Tensor:
    """(B,) ``-E_p[score_q]``, differentiable with respect to both models' float inputs (validated
    inputs with the same positions, K, C and transition shape; masks as ``(label_mask,
    boundary_mask)`` pairs). ``0`` where p allows no segmentation, ``+inf`` where p gives
    probability to a segmentation that q forbids. On CPU tensors (``backend="auto"`` or
    ``"numba"``) the compiled CPU engine runs it, as it does the entropy."""
    if cpu_engine(inp_p, backend) is not None:
        return _NumbaNegExpectedScore.apply(inp_p.cum_scores, inp_p.transition, inp_p.duration_bias,
                                            inp_p.proj_start, inp_p.proj_end, inp_q.cum_scores, inp_q.transition,
                                            inp_q.duration_bias, inp_q.proj_start, inp_q.proj_end, inp_p, inp_q,
                                            cpu_limits(inp_p, *masks_p), cpu_limits(inp_q, *masks_q))
    return _NegExpectedScore.apply(inp_p.cum_scores, inp_p.transition, inp_p.duration_bias, inp_p.proj_start,
                                   inp_p.proj_end, inp_q.cum_scores, inp_q.transition, inp_q.duration_bias,
                                   inp_q.proj_start, inp_q.proj_end, inp_p, inp_q, tuple(masks_p), tuple(masks_q))
