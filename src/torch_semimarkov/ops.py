"""The engine as opaque PyTorch operators (``torch.ops.torch_semimarkov.*``).

Every public streaming function runs its engine through these operators, in eager mode as under
``torch.compile`` and ``torch.export``. Each has a fake (meta) implementation that gives the
shapes of its outputs without running anything, so a compiler sees one node per call instead of
tracing the per-position loop, and the log-partition operator has a registered backward (itself an
operator), so compiled and exported graphs differentiate through it exactly as eager code does.

* ``forward(...) -> (score, state_a, state_b, meta)``: log Z or the best score (float64, (B,)); with
  ``save_state`` the state the backward needs, flattened (its size depends on the backend and the
  plan, so the fake implementation gives it a data-dependent length), and ``meta`` (CPU int64)
  holding the state's shapes. The value checks (NaN/Inf, magnitudes, the range of ``lengths``) run
  inside, with one device-to-host transfer, unless ``validate=False``.
* ``backward(...) -> (grad_cum_scores, grad_transition, grad_duration_bias, grad_proj_start,
  grad_proj_end)``: the gradients of ``sum_b grad_output[b] · logZ[b]``; an empty tensor for each
  one not asked for in ``needs``.
* ``viterbi(...) -> (scores, labels, starts)``: the best segmentation as per-position labels (-1
  past each length) and segment-start flags.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from torch_semimarkov.core.validation import debug_checks
from torch_semimarkov.core.values import check_input_values
from torch_semimarkov.engines.interface import ENGINES, EngineOptions, check_finite
from torch_semimarkov.engines.available import triton_launchers

_STATE_DIMS = 5  # the state tensors have at most this many dimensions


def _options(checkpoint_interval, num_warps, time_parallel):
    return EngineOptions(checkpoint_interval, num_warps, time_parallel)


def _state_dtype(backend: str) -> torch.dtype:
    # the Triton engine keeps its rows in float32, the CPU engines in float64
    return torch.float32 if backend == "triton" else torch.float64


def _fresh(t: Tensor, *inputs: Optional[Tensor]) -> Tensor:
    """``t``, copied if it shares memory with an input (an operator's outputs may not alias them)."""
    for x in inputs:
        if x is not None and t.numel() and x.numel() and t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
            return t.clone()
    return t


@torch.library.custom_op("torch_semimarkov::forward", mutates_args=())
def forward_op(
    cum_scores: Tensor, transition: Tensor, duration_bias: Tensor, lengths: Tensor, K: int, semiring: str,
    proj_start: Optional[Tensor], proj_end: Optional[Tensor], backend: str, validate: bool,
    checkpoint_interval: Optional[int], num_warps: Optional[int], time_parallel: Optional[bool], save_state: bool,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    if validate or debug_checks():
        check_input_values(cum_scores, transition, duration_bias, lengths, proj_start, proj_end)
    fn = ENGINES[backend]
    options = _options(checkpoint_interval, num_warps, time_parallel)
    meta = torch.zeros(2 + 2 * (_STATE_DIMS + 1), dtype=torch.int64)
    empty_a = cum_scores.new_empty(0, dtype=_state_dtype(backend))
    empty_b = cum_scores.new_empty(0, dtype=torch.float64)
    if not save_state:
        with torch.no_grad():
            score = fn.score(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, semiring, options)
        return _fresh(score.to(torch.float64)), empty_a, empty_b, meta
    partition, state, extra = fn.forward(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end,
                                               options)
    if debug_checks():
        # -inf is a real answer (a sequence with no allowed segmentation); NaN and +inf are not
        check_finite("forward partition", fn.backend, allow_neg_inf=True, partition=partition)
    a, b = state
    meta[0] = extra if isinstance(extra, int) else 0  # the checkpoint interval of the CPU engines
    for i, t in enumerate((a, b)):
        base = 2 + i * (_STATE_DIMS + 1)
        meta[base] = t.dim()
        meta[base + 1 : base + 1 + t.dim()] = torch.tensor(t.shape)
    return (partition.to(torch.float64), a.to(_state_dtype(backend)).reshape(-1),
            b.to(torch.float64).reshape(-1), meta)


@forward_op.register_fake
def _forward_fake(cum_scores, transition, duration_bias, lengths, K, semiring, proj_start, proj_end, backend,
                  validate, checkpoint_interval, num_warps, time_parallel, save_state):
    B = cum_scores.shape[0]
    meta = torch.empty(2 + 2 * (_STATE_DIMS + 1), dtype=torch.int64, device="cpu")
    if save_state:
        ctx = torch.library.get_ctx()
        n_a, n_b = ctx.new_dynamic_size(), ctx.new_dynamic_size()
    else:
        n_a = n_b = 0
    return (cum_scores.new_empty(B, dtype=torch.float64), cum_scores.new_empty(n_a, dtype=_state_dtype(backend)),
            cum_scores.new_empty(n_b, dtype=torch.float64), meta)


def _unflatten(flat: Tensor, meta: List[int], i: int) -> Tensor:
    base = 2 + i * (_STATE_DIMS + 1)
    return flat.view(meta[base + 1 : base + 1 + meta[base]])


@torch.library.custom_op("torch_semimarkov::backward", mutates_args=())
def backward_op(
    grad_output: Tensor, cum_scores: Tensor, transition: Tensor, duration_bias: Tensor, lengths: Tensor, K: int,
    proj_start: Optional[Tensor], proj_end: Optional[Tensor], partition: Tensor, state_a: Tensor, state_b: Tensor,
    meta: Tensor, backend: str, checkpoint_interval: Optional[int], num_warps: Optional[int],
    time_parallel: Optional[bool], needs: List[bool],
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    fn = ENGINES[backend]
    m = meta.numpy().tolist()  # a CPU tensor: no device transfer
    state = (_unflatten(state_a, m, 0), _unflatten(state_b, m, 1))
    if backend == "triton":
        extra = triton_launchers().plan_for(cum_scores, transition, K, "log", num_warps, time_parallel,
                                            checkpoint_interval, backward=True)
    else:
        extra = m[0]
    p_start, p_end, g_tr, g_db = fn.backward(cum_scores, transition, duration_bias, lengths, K, proj_start,
                                                   proj_end, partition, state, extra,
                                                   need_parameter_grads=needs[1] or needs[2])
    grads = fn.scale_grads(cum_scores, needs, grad_output, p_start, p_end, g_tr, g_db)
    if debug_checks():
        names = ("grad_cum_scores", "grad_transition", "grad_duration_bias", "grad_proj_start", "grad_proj_end")
        check_finite("CRF backward", fn.backend, **dict(zip(names, grads)))
    like = (cum_scores, transition, duration_bias, cum_scores, cum_scores)
    return tuple(g.to(x.dtype) if g is not None and n else x.new_empty(0)
                 for g, x, n in zip(grads, like, needs))  # type: ignore[return-value]


@backward_op.register_fake
def _backward_fake(grad_output, cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, partition,
                   state_a, state_b, meta, backend, checkpoint_interval, num_warps, time_parallel, needs):
    B, T1, C = cum_scores.shape
    shapes = (cum_scores.shape, transition.shape, duration_bias.shape, (B, T1 - 1, C), (B, T1 - 1, C))
    like = (cum_scores, transition, duration_bias, cum_scores, cum_scores)
    return tuple(x.new_empty(s) if n else x.new_empty(0) for s, x, n in zip(shapes, like, needs))


def _setup_context(ctx, inputs, output):
    (cum_scores, transition, duration_bias, lengths, K, semiring, proj_start, proj_end, backend, validate,
     checkpoint_interval, num_warps, time_parallel, save_state) = inputs
    partition, state_a, state_b, meta = output
    ctx.save_for_backward(cum_scores, transition, duration_bias, lengths, proj_start, proj_end, partition, state_a,
                          state_b, meta)
    ctx.args = (K, backend, checkpoint_interval, num_warps, time_parallel)


def _backward(ctx, grad_partition, grad_state_a, grad_state_b, grad_meta):
    cum_scores, transition, duration_bias, lengths, proj_start, proj_end, partition, a, b, meta = ctx.saved_tensors
    K, backend, checkpoint_interval, num_warps, time_parallel = ctx.args
    need = ctx.needs_input_grad
    needs = [bool(need[0]), bool(need[1]), bool(need[2]), bool(need[6]), bool(need[7])]
    grads = backward_op(grad_partition, cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end,
                        partition, a, b, meta, backend, checkpoint_interval, num_warps, time_parallel, needs)
    g = [t if n else None for t, n in zip(grads, needs)]
    return (g[0], g[1], g[2], None, None, None, g[3], g[4], None, None, None, None, None, None)


forward_op.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("torch_semimarkov::viterbi", mutates_args=())
def viterbi_op(
    cum_scores: Tensor, transition: Tensor, duration_bias: Tensor, lengths: Tensor, K: int,
    proj_start: Optional[Tensor], proj_end: Optional[Tensor], backend: str, validate: bool,
    num_warps: Optional[int], time_parallel: Optional[bool],
) -> Tuple[Tensor, Tensor, Tensor]:
    if validate or debug_checks():
        check_input_values(cum_scores, transition, duration_bias, lengths, proj_start, proj_end)
    with torch.no_grad():
        scores, labels, starts = ENGINES[backend].viterbi(cum_scores, transition, duration_bias, lengths, K, proj_start,
                                                          proj_end, _options(None, num_warps, time_parallel))
    return (_fresh(scores.to(cum_scores.dtype), cum_scores), labels.to(torch.int64), starts.to(torch.bool))


@viterbi_op.register_fake
def _viterbi_fake(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, backend, validate,
                  num_warps, time_parallel):
    B, T1, _ = cum_scores.shape
    return (cum_scores.new_empty(B), cum_scores.new_empty(B, T1 - 1, dtype=torch.int64),
            cum_scores.new_empty(B, T1 - 1, dtype=torch.bool))
