"""Compiled CPU engine (numba): host launchers with the signatures of the PyTorch path.

:func:`semi_crf_streaming_forward_numba`, :func:`semi_crf_streaming_backward_numba` and
:func:`semi_crf_streaming_viterbi_numba` take and return what their ``*_pytorch`` twins in
:mod:`.pytorch_reference` do, so the dispatcher in :mod:`.autograd` can swap them. They convert
the (already validated) tensors to float64 NumPy arrays, prepare the transition and duration
tables once per call, and run the kernels of :mod:`.factored` ((C, C) transitions) or
:mod:`.direct` ((K, C, C)), parallel over sequences. Every quantity is computed in float64
whatever the input dtype; outputs come back in the dtype of ``cum_scores`` (the partition in float64).

Entries of ``transition`` / ``duration_bias`` at or below ``NEG_INF`` (-1e9), and ``-inf``, forbid
that move or duration exactly: inside the kernels they are ``-inf``. A sequence with no allowed
segmentation gets log Z = -inf, Viterbi score -inf with labels -1 and no segment starts, and zero
marginals and gradients.

Importing this module imports numba (an optional dependency: ``pip install torch-semimarkov[cpu]``).
Each kernel is compiled on its first call and cached on disk (numba ``cache=True``), so later
processes load it instead of compiling.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Optional, Tuple

import numba
import numba.np.ufunc.parallel as numba_parallel
import numpy as np
import torch

from torch_semimarkov.engines.numba import direct, factored
from torch_semimarkov.core.constants import NEG_INF
from torch_semimarkov.engines.torch.reference import _resolve_interval

__all__ = [
    "semi_crf_streaming_backward_numba",
    "semi_crf_streaming_forward_numba",
    "semi_crf_streaming_viterbi_numba",
]


# Conversions go through NumPy, never through torch operations: torch parallelises copies of more
# than ~32k elements over its intra-op threads, and on a busy machine those threads can make a
# millisecond copy take many times longer. NumPy copies run on the calling thread.


def _f64(t: Optional[torch.Tensor]) -> Optional[np.ndarray]:
    if t is None:
        return None
    return np.ascontiguousarray(t.detach().cpu().numpy(), dtype=np.float64)


def _forbid(x: np.ndarray) -> np.ndarray:
    """-inf wherever a value forbids (<= NEG_INF)."""
    return np.where(x <= NEG_INF, -np.inf, x)


def _scaled_exp(x: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """exp(x - ref) with 0 wherever x is -inf (ref broadcast against x; ref >= x)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(x == -np.inf, 0.0, np.exp(x - ref))


def _lse(x: np.ndarray, axis: int) -> np.ndarray:
    """log-sum-exp over an axis; -inf where every term is -inf."""
    m = x.max(axis)
    safe = np.where(m == -np.inf, 0.0, m)
    with np.errstate(divide="ignore"):
        return safe + np.log(_scaled_exp(x, np.expand_dims(safe, axis)).sum(axis))


#: Below this much work (positions x terms per position, summed over the batch) a call runs on the
#: calling thread alone: waking a second thread costs more than it saves, and on a busy machine a
#: thread that is not scheduled for a time slice (milliseconds) would delay the whole call.
_PARALLEL_MIN_WORK = 2_000_000

_POOLS: dict = {}
_POOLS_LOCK = threading.Lock()


def _pool(n: int) -> ThreadPoolExecutor:
    """A thread pool of n workers for this process (a forked child builds its own)."""
    key = (os.getpid(), n)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = ThreadPoolExecutor(max_workers=n, thread_name_prefix="torch_semimarkov")
    return pool


def num_threads() -> int:
    """Threads the engine uses: numba's setting (``numba.set_num_threads``, else ``NUMBA_NUM_THREADS``,
    by default the number of cores).

    numba's own threading layer is never started here: starting it sets OpenMP's thread count,
    which torch shares, so a model's torch operations would silently change their thread count.
    """
    if numba_parallel._is_initialized:
        return numba.get_num_threads()
    return numba.config.NUMBA_NUM_THREADS


def _run_batch(kernel, B: int, work_per_sequence: float, *args) -> None:
    """Run ``kernel(*args, lo, hi)`` over the sequences [0, B), in parallel where it pays.

    Sequences are split into contiguous chunks that worker threads take from a queue (the kernels
    release the GIL), so a worker that gets no CPU time simply takes fewer chunks. Each sequence is
    computed by one call, start to end, so results are identical for any thread count
    (:func:`num_threads`).
    """
    n = min(num_threads(), B)
    if n <= 1 or B * work_per_sequence < _PARALLEL_MIN_WORK:
        kernel(*args, 0, B)
        return
    n_chunks = min(B, 4 * n)
    bounds = [B * i // n_chunks for i in range(n_chunks + 1)]
    pool = _pool(n)
    futures = [pool.submit(kernel, *args, lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]
    for f in futures:
        f.result()


class _Inputs:
    """float64 arrays of one call; absent projections become (1, 1, C) dummies plus a flag.

    ``masks`` (optional) are the segment limits of partial labels and constraints, as
    ``distribution.segment_limits`` returns them: ``(min_start, max_end)`` (B, T+1, C) integer and
    ``forbidden_start`` (B, T) bool or None. The limits become ``lim`` (B, 2, T+1, C) int64 (a
    window's durations per label, :func:`.common.limit_window`); a forbidden start becomes
    ``-inf`` in the start projection (which then exists, zeros elsewhere).
    """

    def __init__(self, cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, masks=None):
        self.S = _f64(cum_scores)
        B, T1, C = self.S.shape
        self.B, self.T, self.C, self.K = B, T1 - 1, C, K
        self.lengths = np.ascontiguousarray(lengths.detach().cpu().numpy(), dtype=np.int64)
        self.t_max = int(self.lengths.max())
        dummy = np.zeros((1, 1, C))
        self.has_ps, self.has_pe = proj_start is not None, proj_end is not None
        self.ps = np.ascontiguousarray(_forbid(_f64(proj_start))) if self.has_ps else dummy
        self.pe = np.ascontiguousarray(_forbid(_f64(proj_end))) if self.has_pe else dummy
        self.has_lim = masks is not None
        self.lim = np.zeros((1, 2, 1, 1), dtype=np.int64)
        if masks is not None:
            min_start, max_end, forbidden = masks
            self.lim = np.ascontiguousarray(np.stack([min_start.cpu().numpy(), max_end.cpu().numpy()], 1),
                                            dtype=np.int64)
            if forbidden is not None:
                if not self.has_ps:
                    self.ps, self.has_ps = np.zeros((B, T1 - 1, C)), True
                self.ps = np.where(forbidden.cpu().numpy()[..., None], -np.inf, self.ps)
        self.direct = transition.dim() == 3
        self.Tr = np.ascontiguousarray(_forbid(_f64(transition)))
        self.D = np.ascontiguousarray(_forbid(_f64(duration_bias)))
        self.device = cum_scores.device
        self.dtype = cum_scores.dtype

    def head(self):
        """The arguments every kernel starts with: inputs, flags, limits, lengths."""
        return (self.S, self.ps, self.pe, self.has_ps, self.has_pe, self.lim, self.has_lim, self.lengths)

    def work(self) -> float:
        """Terms per sequence of the recurrence, a measure of the work of one pass."""
        per_position = self.K * self.C * self.C if self.direct else self.K * self.C + self.C * self.C
        return float(self.t_max * per_position)

    def factored_tables(self):
        """Column-normalised exp(Tr) for u, row-normalised and transposed for beta, and exp(D)."""
        Tr, D = self.Tr, self.D
        tmax = Tr.max(0)
        eTr = np.ascontiguousarray(_scaled_exp(Tr, tmax[None, :]))
        tmaxR = Tr.max(1)
        eTrRT = np.ascontiguousarray(_scaled_exp(Tr, tmaxR[:, None]).T)
        Dm = D.max(0)
        eDT = np.ascontiguousarray(_scaled_exp(D, Dm[None, :]).T)
        return eTr, tmax, eTrRT, tmaxR, eDT, Dm

    def direct_tables(self):
        """exp(Tr[k-1, c', c] + D[k-1, c] - Mc[c]) (and transposed per k) with Mc[c] its max over (k, c')."""
        TD = self.Tr + self.D[:, None, :]
        Mc = TD.max(axis=(0, 1))
        eTD = np.ascontiguousarray(_scaled_exp(TD, Mc[None, None, :]))
        eTDt = np.ascontiguousarray(eTD.transpose(0, 2, 1))
        return eTD, eTDt, Mc


def _torch(x: np.ndarray, like: _Inputs, dtype=None) -> torch.Tensor:
    """A float64 result as a tensor of the requested dtype (default: that of cum_scores)."""
    np_dtype = np.float64 if (dtype or like.dtype) == torch.float64 else np.float32
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np_dtype)).to(like.device)


def _forward(x: _Inputs, interval: int, save: bool, ck: np.ndarray, kept=None) -> np.ndarray:
    """log Z (B,) float64 by the forward kernels, with ``save`` checkpoints in ck every ``interval``
    positions; ``kept``: the arrays ``(A, W, Uu)`` in which the sampler (:mod:`.sample`) keeps
    every message (W and Uu: the factored form only)."""
    out = np.empty(x.B)
    dummy = np.zeros((1, 1, x.C))
    A, W, Uu = (dummy, dummy, dummy) if kept is None else kept
    keep = kept is not None
    if x.direct:
        eTD, _, Mc = x.direct_tables()
        _run_batch(direct.forward_batch, x.B, x.work(), *x.head(), x.Tr, eTD, Mc, x.D, interval, save, ck, keep, A,
                   out)
    else:
        eTr, tmax, _, _, eDT, Dm = x.factored_tables()
        _run_batch(factored.forward_batch, x.B, x.work(), *x.head(), x.Tr, eTr, tmax, x.D, eDT, Dm, interval, save, ck,
                   keep, A, W, Uu, out)
    return out


def semi_crf_streaming_forward_numba(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths: torch.Tensor,
    K: int,
    semiring: str = "log",
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
    checkpoint_interval: Optional[int] = None,
    save_for_backward: bool = True,
    masks=None,
) -> Tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """Streaming forward pass on the compiled CPU engine: log Z (or the best score) and checkpoints.

    Args:
        cum_scores: (B, T+1, C) cumulative label scores, ``cum_scores[:, 0] == 0``.
        transition: (C, C) ``[c_src, c_dst]``, or (K, C, C) indexed by duration ``k-1``.
        duration_bias: (K, C), row ``k-1`` for duration k.
        lengths: (B,) int64 lengths in [1, T].
        K: maximum segment duration.
        semiring: ``"log"`` (log Z) or ``"max"`` (best segmentation score; no checkpoints).
        proj_start, proj_end: optional (B, T, C) boundary scores.
        checkpoint_interval: spacing of the checkpoints (default ``max(K, sqrt(T·K))``).
        save_for_backward: False skips the checkpoints (log Z alone).
        masks: optional segment limits ``(min_start, max_end, forbidden_start)`` of partial
            labels (:class:`_Inputs`): log Z of the allowed segmentations only.

    Returns:
        ``(partition, ring_checkpoints, checkpoint_interval, log_norm_checkpoints)``: partition (B,)
        float64; ring_checkpoints (B, N, K+1, C) float64, at each checkpoint position
        ``i·interval`` the K ring rows (in ring-slot order) and alpha; log_norm_checkpoints (B, N)
        zeros (the engine keeps absolute float64 log values, so no normaliser is needed). Only
        :func:`semi_crf_streaming_backward_numba` reads the checkpoints.

    Example:
        >>> B, T, K, C = 2, 10, 3, 4
        >>> cum = torch.randn(B, T + 1, C).cumsum(1); cum[:, 0] = 0
        >>> logz, ckpts, interval, norms = semi_crf_streaming_forward_numba(
        ...     cum, torch.zeros(C, C), torch.zeros(K, C), torch.tensor([10, 7]), K)
        >>> logz.shape, logz.dtype
        (torch.Size([2]), torch.float64)
    """
    x = _Inputs(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, masks)
    interval = _resolve_interval(x.T, K, checkpoint_interval)
    if semiring == "max":
        scores, _, _ = _viterbi(x, store=False)
        empty = torch.zeros(x.B, 0, K + 1, x.C, dtype=torch.float64, device=x.device)
        return _torch(scores, x, torch.float64), empty, interval, torch.zeros(x.B, 0, dtype=torch.float64, device=x.device)
    n_ck = x.t_max // interval + 1
    ck = np.zeros((x.B, n_ck, K + 1, x.C) if save_for_backward else (1, 1, K + 1, x.C))
    out = _forward(x, interval, save_for_backward, ck)
    norms = torch.zeros(x.B, ck.shape[1] if save_for_backward else 0, dtype=torch.float64, device=x.device)
    ring = torch.from_numpy(ck).to(x.device) if save_for_backward else norms.new_zeros(x.B, 0, K + 1, x.C)
    return _torch(out, x, torch.float64), ring, interval, norms


def semi_crf_streaming_backward_numba(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths: torch.Tensor,
    K: int,
    log_Z: torch.Tensor,
    ring_checkpoints: torch.Tensor,
    checkpoint_interval: int,
    log_norm_checkpoints: torch.Tensor,
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
    need_parameter_grads: bool = True,
    masks=None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Streaming backward pass on the compiled CPU engine: posterior marginals = gradients of log Z.

    Args:
        cum_scores ... proj_end: as for :func:`semi_crf_streaming_forward_numba`, with the forward's
            log_Z (B,) and its checkpoints.
        need_parameter_grads: False skips the transition and duration gradients (marginals only);
            they are then returned as zeros.
        masks: the forward's segment limits, if it had any.

    Returns:
        ``(p_start, p_end, grad_transition, grad_duration_bias)`` in the dtype of cum_scores, not
        scaled by an upstream gradient: p_start (B, T, C) = P(a segment with label c starts at s),
        p_end (B, T, C) = P(a segment with label c has its last position at e), grad_transition
        (B, C, C) or (B, K, C, C) and grad_duration_bias (B, K, C), per sequence.
        ``dlogZ/dcum_scores[t] = p_end[t-1] - p_start[t]``.

    Example:
        >>> cum = torch.randn(1, 9, 2).cumsum(1); cum[:, 0] = 0
        >>> args = (cum, torch.zeros(2, 2), torch.zeros(3, 2), torch.tensor([8]), 3)
        >>> fwd = semi_crf_streaming_forward_numba(*args)
        >>> p_start, p_end, g_tr, g_db = semi_crf_streaming_backward_numba(*args, *fwd)
        >>> round(float(p_start[0, 0].sum()), 6)
        1.0
    """
    x = _Inputs(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, masks)
    B, T, C = x.B, x.T, x.C
    logz = _f64(log_Z)
    ck = _f64(ring_checkpoints)
    p_start = np.zeros((B, T, C))
    p_end = np.zeros((B, T, C))
    gb = B if need_parameter_grads else 1
    g_tr = np.zeros((gb,) + tuple(x.Tr.shape))
    g_db = np.zeros((gb, K, C))
    args = x.head() + (logz,)
    if x.direct:
        eTD, eTDt, Mc = x.direct_tables()
        _run_batch(direct.backward_batch, x.B, 3 * x.work(), *args, x.Tr, eTD, eTDt, Mc, x.D,
                   checkpoint_interval, ck, need_parameter_grads, p_start, p_end, g_tr, g_db)
    else:
        eTr, tmax, eTrRT, tmaxR, eDT, Dm = x.factored_tables()
        _run_batch(factored.backward_batch, x.B, 3 * x.work(), *args, x.Tr, eTr, tmax, eTrRT, tmaxR, x.D,
                   eDT, Dm, checkpoint_interval, ck, need_parameter_grads, p_start, p_end, g_tr, g_db)
    if not need_parameter_grads:
        g_tr = np.zeros((B,) + tuple(x.Tr.shape))
        g_db = np.zeros((B, K, C))
    return _torch(p_start, x), _torch(p_end, x), _torch(g_tr, x), _torch(g_db, x)


def _viterbi(x: _Inputs, store: bool):
    """Run the Viterbi kernels; returns float64 scores and (with store) labels and segment starts."""
    B, T, C = x.B, x.T, x.C
    shape = (B, max(x.t_max, 1), C) if store else (1, 1, C)
    bp_k = np.zeros(shape, dtype=np.int32)
    bp_c = np.zeros(shape, dtype=np.int32)
    scores = np.empty(B)
    labels = np.full((B, T) if store else (1, 1), -1, dtype=np.int64)
    starts = np.zeros((B, T) if store else (1, 1), dtype=np.bool_)
    args = x.head() + (x.Tr,)
    if x.direct:
        # phantom predecessor of a first segment of duration k, marginalised: lse_{c'} Tr[k-1, c', c]
        _run_batch(direct.viterbi_batch, B, x.work(), *args, _lse(x.Tr, 1), x.D, store, bp_k, bp_c,
                   scores, labels, starts)
    else:
        _run_batch(factored.viterbi_batch, B, x.work(), *args, _lse(x.Tr, 0), x.D, store, bp_k, bp_c,
                   scores, labels, starts)
    return scores, labels, starts


def semi_crf_streaming_viterbi_numba(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths: torch.Tensor,
    K: int,
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
    masks=None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Most probable segmentation on the compiled CPU engine (max semiring, backpointers, traceback).

    The first segment receives ``lse_{c'} Tr[c', c]`` (``Tr[k-1]`` for (K, C, C)), as in log Z; ties
    break toward the smallest index (predecessor label, then duration; for (K, C, C) the
    lexicographically smallest (k, c')), and the smallest final label. ``masks``: the best
    allowed segmentation (segment limits, as for :func:`semi_crf_streaming_forward_numba`).

    Returns:
        ``(scores, labels, seg_starts)``: scores (B,) in the dtype of cum_scores (-inf for a
        sequence with no allowed segmentation), labels (B, T) int64 with -1 past each length (and
        everywhere for an impossible sequence), seg_starts (B, T) bool.

    Example:
        >>> cum = torch.randn(2, 7, 3).cumsum(1); cum[:, 0] = 0
        >>> scores, labels, starts = semi_crf_streaming_viterbi_numba(
        ...     cum, torch.zeros(3, 3), torch.zeros(4, 3), torch.tensor([6, 3]), 4)
        >>> labels.shape, bool(starts[:, 0].all())
        (torch.Size([2, 6]), True)
    """
    x = _Inputs(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, masks)
    scores, labels, starts = _viterbi(x, store=True)
    return (_torch(scores, x), torch.from_numpy(labels).to(x.device), torch.from_numpy(starts).to(x.device))


def scale_gradients(cum_scores, need, grad_output, p_start, p_end, g_tr, g_db):
    """Gradients of ``sum_b grad_output[b] · logZ[b]`` from the engine's unscaled marginals, with
    NumPy (like the rest of the engine, no torch intra-op threads).

    Returns ``(grad_cum_scores, grad_transition, grad_duration_bias, grad_proj_start, grad_proj_end)``,
    None where ``need`` (one flag per returned gradient, in that order) is False.
    """
    dtype = p_start.numpy().dtype
    go = np.ascontiguousarray(grad_output.detach().cpu().numpy(), dtype=np.float64)
    scale = go.astype(dtype)[:, None, None]
    ps, pe = p_start.numpy(), p_end.numpy()
    out = [None] * 5
    if need[0]:
        g = np.zeros(tuple(cum_scores.shape), dtype=dtype)
        g[:, 1:] += pe
        g[:, :-1] -= ps
        g *= scale
        out[0] = torch.from_numpy(g)
    if need[1]:
        out[1] = torch.from_numpy(np.tensordot(go, g_tr.numpy().astype(np.float64), axes=(0, 0)).astype(dtype))
    if need[2]:
        out[2] = torch.from_numpy(np.tensordot(go, g_db.numpy().astype(np.float64), axes=(0, 0)).astype(dtype))
    if need[3]:
        out[3] = torch.from_numpy(ps * scale)
    if need[4]:
        out[4] = torch.from_numpy(pe * scale)
    return tuple(out)
