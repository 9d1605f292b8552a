"""The one interface every engine offers (the PyTorch path, the compiled CPU engine, the Triton
kernels): log Z with the state its backward needs, the backward into marginals and parameter
gradients, the score alone, and the Viterbi segmentation. :mod:`torch_semimarkov.ops` wraps them
as PyTorch operators; :func:`torch_semimarkov.engines.select.backend_for` picks one.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import torch

from torch_semimarkov.core.masks import segment_limits
from torch_semimarkov.core.validation import debug_checks, detached
from torch_semimarkov.core.values import check_input_values
from torch_semimarkov.engines.available import numba_engine, triton_launchers
from torch_semimarkov.engines.torch.dense import _Model, ConstrainedLogZ, dense_marginals, dense_topk
from torch_semimarkov.engines.torch.reference import (
    semi_crf_streaming_backward_pytorch,
    semi_crf_streaming_forward_pytorch,
    semi_crf_streaming_viterbi_pytorch,
)


def check_finite(what: str, backend: str, allow_neg_inf: bool = False, **tensors) -> None:
    """RuntimeError naming the tensor when one of ``tensors`` holds NaN or +-inf (-inf allowed on request)."""
    for name, t in tensors.items():
        if t is None:
            continue
        ok = torch.isfinite(t)
        if allow_neg_inf:
            ok = ok | torch.isneginf(t)
        if not bool(ok.all()):
            n_nan, n_inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
            raise RuntimeError(f"Non-finite values in {what} ({backend}): {name} has {n_nan} NaN, {n_inf} Inf")


def scale_grads(cum_scores, need, grad_output, p_start, p_end, g_tr, g_db):
    """Turn unscaled marginals into gradients of sum_b grad_output[b] * logZ[b]; ``need`` says
    which of (cum_scores, transition, duration_bias, proj_start, proj_end) to compute (None else)."""
    B, T1, C = cum_scores.shape
    go = grad_output.to(p_start.dtype)
    scale = go.view(B, 1, 1)
    grad_cum = grad_tr = grad_db = grad_ps = grad_pe = None
    if need[0]:
        grad_cum = torch.zeros_like(cum_scores)
        grad_cum[:, 1:] += p_end
        grad_cum[:, :-1] -= p_start
        grad_cum.mul_(scale)
    go64 = grad_output.to(torch.float64)
    if need[1]:
        grad_tr = torch.einsum("b...,b->...", g_tr.to(torch.float64), go64).to(cum_scores.dtype)
    if need[2]:
        grad_db = torch.einsum("bkc,b->kc", g_db.to(torch.float64), go64).to(cum_scores.dtype)
    if need[3]:
        grad_ps = p_start * scale
    if need[4]:
        grad_pe = p_end * scale
    return grad_cum, grad_tr, grad_db, grad_ps, grad_pe


class EngineOptions(NamedTuple):
    """Launch options of one call (everything but the tensors)."""

    checkpoint_interval: Optional[int] = None
    num_warps: Optional[int] = None
    time_parallel: Optional[bool] = None


def _masked_entry(fn):
    """An engine's entry with partial labels, ``fn(inp, masks, validate=True)``: the values of the
    inputs and of the boundary mask are checked first (one device-to-host transfer) unless
    ``validate=False`` (and no ``TORCH_SEMIMARKOV_DEBUG``), as the operators do for unmasked calls."""

    @functools.wraps(fn)
    def entry(inp, masks, validate: bool = True):
        if validate or debug_checks():
            check_input_values(inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, inp.proj_start,
                               inp.proj_end, inp.boundary_mask)
        return fn(inp, masks)

    return staticmethod(entry)


def _limits(inp, masks):
    """``(label_mask, boundary_mask)`` as the compiled engine's segment limits."""
    return segment_limits(*masks, inp.batch, inp.T, inp.C, inp.K, inp.cum_scores.device)


class Engine:
    """One backend behind the operators of :mod:`torch_semimarkov.ops`, all static methods on
    validated inputs (``args`` = ``(cum_scores, transition, duration_bias, lengths, K, proj_start,
    proj_end)``):

    * ``forward(*args, options)`` -> ``(log Z, state tensors, extra)``: log Z with what the backward needs;
    * ``backward(*args, log_z, state, extra, need_parameter_grads)`` -> the unscaled start / end
      marginals and per-sequence parameter gradients (``need_parameter_grads=False`` lets an
      engine skip the latter); ``scale_grads`` turns them into the gradients;
    * ``score(*args, semiring, options)`` -> log Z or the best score alone (nothing kept);
    * ``viterbi(*args, options)`` -> ``(scores, labels, starts)`` of the best segmentations.
    """

    backend = "PyTorch"

    @staticmethod
    def scale_grads(cum_scores, need, grad_output, p_start, p_end, g_tr, g_db):
        return scale_grads(cum_scores, need, grad_output, p_start, p_end, g_tr, g_db)


class _RingEngine(Engine):
    """The CPU-style engines (PyTorch, numba): the forward keeps its ring of the last K rows and
    checkpoints (``state = (ring, norms)``, ``extra`` = the checkpoint interval); the backward
    recomputes between checkpoints."""

    @classmethod
    def forward(cls, cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, options):
        partition, ring, interval, norms = cls._forward_fn()(
            cum_scores, transition, duration_bias, lengths, K, "log", proj_start, proj_end, options.checkpoint_interval
        )
        return partition, (ring, norms), interval

    @classmethod
    def backward(cls, cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, log_z, state, interval,
                 need_parameter_grads=True):
        ring, norms = state
        return cls._backward_fn()(cum_scores, transition, duration_bias, lengths, K, log_z, ring, interval, norms,
                                  proj_start, proj_end, need_parameter_grads=need_parameter_grads)


class TorchEngine(_RingEngine):
    """The streaming PyTorch path (any device; the reference of the other two)."""

    backend = "PyTorch"

    @staticmethod
    def _forward_fn():
        return semi_crf_streaming_forward_pytorch

    @staticmethod
    def _backward_fn():
        return semi_crf_streaming_backward_pytorch

    @staticmethod
    def score(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, semiring, options):
        return semi_crf_streaming_forward_pytorch(cum_scores, transition, duration_bias, lengths, K, semiring,
                                                  proj_start, proj_end, options.checkpoint_interval)[0]

    @staticmethod
    def viterbi(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, options):
        return semi_crf_streaming_viterbi_pytorch(cum_scores, transition, duration_bias, lengths, K, proj_start,
                                                  proj_end)

    @_masked_entry
    def log_z_masked(inp, masks):
        return ConstrainedLogZ.apply(inp.cum_scores, inp.transition, inp.duration_bias, inp.proj_start,
                                     inp.proj_end, inp, *masks)

    @_masked_entry
    def marginals_masked(inp, masks):
        return dense_marginals(inp, *masks)

    @_masked_entry
    def viterbi_masked(inp, masks):
        with torch.no_grad():
            scores, labels, starts = dense_topk(_Model(inp, *masks), 1)
        return scores[:, 0], labels[:, 0], starts[:, 0]


class TritonEngine(Engine):
    """The Triton kernels (CUDA tensors); every call makes its
    :class:`~torch_semimarkov.engines.triton.KernelPlan` (the backward recomputes the forward's)."""

    backend = "Triton"

    @staticmethod
    def forward(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, options):
        launch = triton_launchers()
        plan = launch.plan_for(cum_scores, transition, K, "log", options.num_warps, options.time_parallel,
                               options.checkpoint_interval, backward=True)
        partition, state = launch.launch_forward(cum_scores, transition, duration_bias, lengths, K, "log", proj_start,
                                                 proj_end, plan=plan, save_for_backward=True, beta=True)
        return partition, tuple(state), plan

    @staticmethod
    def backward(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, log_z, state, plan,
                 need_parameter_grads=True):
        launch = triton_launchers()
        return launch.launch_backward(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end,
                                      plan=plan, state=launch.ForwardState(*state))

    @staticmethod
    def score(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, semiring, options):
        launch = triton_launchers()
        plan = launch.plan_for(cum_scores, transition, K, semiring, options.num_warps, options.time_parallel,
                               options.checkpoint_interval)
        return launch.launch_forward(cum_scores, transition, duration_bias, lengths, K, semiring, proj_start,
                                     proj_end, plan=plan, save_for_backward=False)[0]

    @staticmethod
    def viterbi(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, options):
        launch = triton_launchers()
        plan = launch.plan_for(cum_scores, transition, K, "max", options.num_warps, options.time_parallel)
        return launch.launch_viterbi(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end,
                                     plan=plan)

    @_masked_entry
    def log_z_masked(inp, masks):
        return _TritonMaskedLogZ.apply(inp.cum_scores, inp.transition, inp.duration_bias, inp.proj_start,
                                       inp.proj_end, inp, masks)

    @_masked_entry
    def marginals_masked(inp, masks):
        launch, args, ps, pe, plan, limits = _triton_masked(inp, masks)
        with torch.no_grad():
            log_z, state = launch.launch_forward(*args, "log", ps, pe, plan=plan, masks=limits)
            p_start, p_end, _, _ = launch.launch_backward(*args, ps, pe, plan=plan, state=state, masks=limits)
        return log_z.to(inp.cum_scores.dtype), p_start, p_end

    @_masked_entry
    def viterbi_masked(inp, masks):
        launch, args, ps, pe, plan, limits = _triton_masked(inp, masks)
        with torch.no_grad():
            return launch.launch_viterbi(*args, ps, pe, plan=plan, masks=limits)


class NumbaEngine(_RingEngine):
    """The compiled CPU engine (numba, CPU tensors, float64 inside)."""

    backend = "numba"

    @staticmethod
    def scale_grads(cum_scores, need, grad_output, p_start, p_end, g_tr, g_db):
        return numba_engine().scale_gradients(cum_scores, need, grad_output, p_start, p_end, g_tr, g_db)

    @staticmethod
    def _forward_fn():
        return numba_engine().semi_crf_streaming_forward_numba

    @staticmethod
    def _backward_fn():
        return numba_engine().semi_crf_streaming_backward_numba

    @staticmethod
    def score(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, semiring, options):
        return numba_engine().semi_crf_streaming_forward_numba(
            cum_scores, transition, duration_bias, lengths, K, semiring, proj_start, proj_end,
            options.checkpoint_interval, save_for_backward=False)[0]

    @staticmethod
    def viterbi(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, options):
        return numba_engine().semi_crf_streaming_viterbi_numba(cum_scores, transition, duration_bias, lengths, K,
                                                               proj_start, proj_end)

    @_masked_entry
    def log_z_masked(inp, masks):
        return _NumbaMaskedLogZ.apply(inp.cum_scores, inp.transition, inp.duration_bias, inp.proj_start,
                                      inp.proj_end, inp, _limits(inp, masks))

    @_masked_entry
    def marginals_masked(inp, masks):
        eng = numba_engine()
        args, ps, pe = _detached(inp)
        limits = _limits(inp, masks)
        state = eng.semi_crf_streaming_forward_numba(*args, "log", ps, pe, masks=limits)
        p_start, p_end, _, _ = eng.semi_crf_streaming_backward_numba(*args, *state, ps, pe,
                                                                     need_parameter_grads=False, masks=limits)
        return state[0].to(inp.cum_scores.dtype), p_start, p_end

    @_masked_entry
    def viterbi_masked(inp, masks):
        args, ps, pe = _detached(inp)
        return numba_engine().semi_crf_streaming_viterbi_numba(*args, ps, pe, masks=_limits(inp, masks))


#: The engine of each backend name (:func:`~torch_semimarkov.engines.select.backend_for` picks the name).
ENGINES = {"triton": TritonEngine, "numba": NumbaEngine, "torch": TorchEngine}


def _detached(inp):
    """``((cum_scores, transition, duration_bias, lengths, K), proj_start, proj_end)``, detached."""
    return ((detached(inp.cum_scores), detached(inp.transition), detached(inp.duration_bias), inp.lengths, inp.K),
            detached(inp.proj_start), detached(inp.proj_end))


def _triton_masked(inp, masks):
    """``(launchers, args, proj_start, proj_end, plan, limits)`` of a masked Triton call: the detached
    inputs, with the start projection of the masks ``(plan, limits, proj_start)`` (forbidden starts)."""
    plan, limits, ps = masks
    args, _, pe = _detached(inp)
    return triton_launchers(), args, None if ps is None else ps.detach(), pe, plan, limits


def masked_input_grads(ctx, cum_scores, grad, marginals, has_ps, has_pe):
    """The gradients of an engine autograd Function whose inputs are ``(cum_scores, transition,
    duration_bias, proj_start, proj_end, inp, masks)``: log Z's gradient map (:func:`scale_grads`)
    applied to the engine's marginals ``(p_start, p_end, g_tr, g_db)`` (or any weighted
    marginals) times ``grad``, whose non-finite entries count as 0."""
    need = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2],
            has_ps and ctx.needs_input_grad[3], has_pe and ctx.needs_input_grad[4])
    grad = torch.where(torch.isfinite(grad), grad, torch.zeros_like(grad))
    return scale_grads(cum_scores, need, grad, *marginals) + (None, None)


class _TritonMaskedLogZ(torch.autograd.Function):
    """log Z of the allowed segmentations on the Triton kernels; the backward is the kernels' own."""

    @staticmethod
    def forward(ctx, cum_scores, transition, duration_bias, proj_start, proj_end, inp, masks):
        launch, args, ps, pe, plan, limits = _triton_masked(inp, masks)
        log_z, state = launch.launch_forward(*args, "log", ps, pe, plan=plan, masks=limits)
        ctx.stash = (args, ps, pe, plan, limits, state, proj_start is not None, proj_end is not None)
        return log_z.to(inp.cum_scores.dtype)

    @staticmethod
    def backward(ctx, grad):
        args, ps, pe, plan, limits, state, has_ps, has_pe = ctx.stash
        marg = triton_launchers().launch_backward(*args, ps, pe, plan=plan, state=state, masks=limits)
        return masked_input_grads(ctx, args[0], grad, marg, has_ps, has_pe)


class _NumbaMaskedLogZ(torch.autograd.Function):
    """log Z of the allowed segmentations on the compiled CPU engine (its forward and backward
    with segment limits)."""

    @staticmethod
    def forward(ctx, cum_scores, transition, duration_bias, proj_start, proj_end, inp, limits):
        args, ps, pe = _detached(inp)
        log_z, ring, interval, norms = numba_engine().semi_crf_streaming_forward_numba(*args, "log", ps, pe,
                                                                                      masks=limits)
        ctx.stash = (args, ps, pe, limits, (log_z, ring, interval, norms), proj_start is not None,
                     proj_end is not None)
        return log_z.to(inp.cum_scores.dtype)

    @staticmethod
    def backward(ctx, grad):
        args, ps, pe, limits, state, has_ps, has_pe = ctx.stash
        need_params = bool(ctx.needs_input_grad[1] or ctx.needs_input_grad[2])
        marg = numba_engine().semi_crf_streaming_backward_numba(*args, *state, ps, pe, need_parameter_grads=need_params,
                                                                masks=limits)
        return masked_input_grads(ctx, args[0], grad, marg, has_ps, has_pe)
