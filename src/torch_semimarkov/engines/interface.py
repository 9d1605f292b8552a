"""The one interface every engine offers (the PyTorch path, the compiled CPU engine, the Triton
kernels): log Z with the state its backward needs, the backward into marginals and parameter
gradients, the score alone, and the Viterbi segmentation. :mod:`torch_semimarkov.ops` wraps them
as PyTorch operators; :func:`torch_semimarkov.engines.select.backend_for` picks one.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from torch_semimarkov.engines.select import numba_engine, triton_launchers
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


class TorchEngine(Engine):
    """The streaming PyTorch path (any device; the reference of the other two)."""

    backend = "PyTorch"

    @staticmethod
    def forward(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, options):
        partition, ring, interval, norms = semi_crf_streaming_forward_pytorch(
            cum_scores, transition, duration_bias, lengths, K, "log", proj_start, proj_end, options.checkpoint_interval
        )
        return partition, (ring, norms), interval

    @staticmethod
    def backward(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, log_z, state, interval,
                 need_parameter_grads=True):
        ring, norms = state
        return semi_crf_streaming_backward_pytorch(
            cum_scores, transition, duration_bias, lengths, K, log_z, ring, interval, norms, proj_start, proj_end
        )

    @staticmethod
    def score(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, semiring, options):
        return semi_crf_streaming_forward_pytorch(cum_scores, transition, duration_bias, lengths, K, semiring,
                                                  proj_start, proj_end, options.checkpoint_interval)[0]

    @staticmethod
    def viterbi(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, options):
        return semi_crf_streaming_viterbi_pytorch(cum_scores, transition, duration_bias, lengths, K, proj_start,
                                                  proj_end)


class TritonEngine(Engine):
    """The Triton kernels (CUDA tensors); every call makes its
    :class:`~torch_semimarkov.engines.triton.KernelPlan` (the backward recomputes the forward's)."""

    backend = "Triton"

    @staticmethod
    def forward(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, options):
        launch = triton_launchers()
        plan = launch.plan_for(cum_scores, transition, K, "log", options.num_warps, options.time_parallel,
                               options.checkpoint_interval)
        partition, state = launch.launch_forward(cum_scores, transition, duration_bias, lengths, K, "log", proj_start,
                                                 proj_end, plan=plan, save_for_backward=True)
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


class NumbaEngine(Engine):
    """The compiled CPU engine (numba, CPU tensors, float64 inside)."""

    backend = "numba"

    @staticmethod
    def scale_grads(cum_scores, need, grad_output, p_start, p_end, g_tr, g_db):
        return numba_engine().scale_gradients(cum_scores, need, grad_output, p_start, p_end, g_tr, g_db)

    @staticmethod
    def forward(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, options):
        partition, ring, interval, norms = numba_engine().semi_crf_streaming_forward_numba(
            cum_scores, transition, duration_bias, lengths, K, "log", proj_start, proj_end, options.checkpoint_interval
        )
        return partition, (ring, norms), interval

    @staticmethod
    def backward(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, log_z, state, interval,
                 need_parameter_grads=True):
        ring, norms = state
        return numba_engine().semi_crf_streaming_backward_numba(
            cum_scores, transition, duration_bias, lengths, K, log_z, ring, interval, norms, proj_start, proj_end,
            need_parameter_grads=need_parameter_grads,
        )

    @staticmethod
    def score(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, semiring, options):
        return numba_engine().semi_crf_streaming_forward_numba(
            cum_scores, transition, duration_bias, lengths, K, semiring, proj_start, proj_end,
            options.checkpoint_interval, save_for_backward=False)[0]

    @staticmethod
    def viterbi(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, options):
        return numba_engine().semi_crf_streaming_viterbi_numba(cum_scores, transition, duration_bias, lengths, K,
                                                               proj_start, proj_end)


#: The engine of each backend name (:func:`~torch_semimarkov.engines.select.backend_for` picks the name).
ENGINES = {"triton": TritonEngine, "numba": NumbaEngine, "torch": TorchEngine}
