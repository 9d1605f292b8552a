"""Exact samples on the compiled CPU engine (numba): forward filtering, backward sampling.

One forward pass per sequence (the engine's own kernels, :mod:`.factored` or
:mod:`.direct`) keeps alpha at every position, and for a (C, C) transition the ring values
``W_s = u_s + ps_s - S_s``; then every sample walks back from its sequence's end. The walk is the
one of the GPU engine and of the PyTorch path (``distribution.semi_crf_streaming_sample``), so the
same uniforms give the same samples: at a node (t, c), "a segment of label c starts at t" (c = C:
the sequence ends at t), with the two uniforms (u1, u2) of position t,

* the label c' of the segment that ends at t is drawn from ``alpha_t(c') + Tr[c', c]``
  (``Tr[k-1, c', c]`` for (K, C, C), k the duration of the segment after it; nothing at the end),
* then its duration k from ``W_{t-k}(c') + D[k-1, c']`` (for (K, C, C):
  ``lse_{c''}(alpha_{t-k}(c'') + Tr[k-1, c'', c']) + D[k-1, c'] + ps_{t-k}(c') - S_{t-k}(c')``),
  k up to the segment limits of the masks,

each by the inverse CDF: the first index whose running sum of ``exp(z - max z)`` exceeds ``u`` times
the total (the last index of positive weight when rounding leaves none). The walk moves to
``(t - k, c')`` and stops at 0. Memory: O(T·C) per sequence (the PyTorch path keeps the same).

The totals are known from the forward (``u_t(c)``, ``alpha_t(c')``, log Z), so a draw scans its
weights in index order and stops at the drawn one: a step costs about its duration in exponentials,
not K. (Those totals equal the PyTorch path's sums up to rounding, so a draw can differ from its
only when a uniform falls within about 1e-15 of a boundary of the cumulative distribution.)
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

from torch_semimarkov.engines.numba.common import KERNEL, lse_finish, lse_update, seq_row
from torch_semimarkov.engines.numba.engine import _forward, _Inputs, _run_batch
from torch_semimarkov.engines.torch.reference import _resolve_interval

NINF = -np.inf


@njit(**KERNEL)
def _inverse_cdf(z, n, u, p):
    """The index drawn from the weights exp(z[:n]) by the uniform u (p: a scratch of n values)."""
    m = NINF
    for i in range(n):
        m = max(m, z[i])
    if m == NINF:
        return 0
    tot = 0.0
    for i in range(n):
        p[i] = math.exp(z[i] - m) if z[i] != NINF else 0.0
        tot += p[i]
    target = u * tot
    acc = 0.0
    last = 0
    for i in range(n):
        acc += p[i]
        if p[i] > 0.0:
            if acc > target:
                return i
            last = i
    return last


@njit(inline="always")
def _step(acc, last, i, x, u):
    """One index of an inverse-CDF scan over normalised log weights: ``(acc, last, hit)``."""
    p = math.exp(x) if x != NINF else 0.0
    acc += p
    if p > 0.0:
        last = i
        return acc, last, acc > u
    return acc, last, False


@njit(**KERNEL)
def walk_batch(A, W, Uu, log_z, direct, S, ps, pe, has_ps, has_pe, lim, has_lim, lengths, Tr, D, U, labels, starts,
               lo, hi):
    """Backward sampling of rows [lo, hi): row r samples sequence r % B with the uniforms U[r]
    (T+1, 2); Tr (K, C, C) (direct) or (1, C, C); labels (N, T) -1 on entry, starts (N, T) False
    on entry. Sequences with log Z = -inf are skipped."""
    K, C = D.shape
    B = A.shape[0]
    z = np.empty(max(K, C))
    p = np.empty(max(K, C))
    for r in range(lo, hi):
        b = r % B
        if log_z[b] == NINF:
            continue
        Ab, Sb, u = A[b], S[b], U[r]
        psb, peb, limb = seq_row(ps, b), seq_row(pe, b), seq_row(lim, b)
        t, cn, kn = lengths[b], C, 0
        while t > 0:
            # the label c1 of the segment that ends at t
            if direct and cn < C:
                for c in range(C):
                    z[c] = Ab[t, c] + Tr[kn - 1, c, cn]
                c1 = _inverse_cdf(z, C, u[t, 0], p)
            else:
                ref = log_z[b] if cn == C else Uu[b, t, cn]
                acc, c1, hit = 0.0, 0, False
                for c in range(C):
                    x = Ab[t, c] - ref if cn == C else (Ab[t, c] + Tr[0, c, cn]) - ref
                    acc, c1, hit = _step(acc, c1, c, x, u[t, 0])
                    if hit:
                        break
            # its duration k1
            kmax = min(K, t)
            if has_lim:
                kmax = max(0, min(kmax, t - limb[0, t, c1]))
            ref = (Ab[t, c1] - Sb[t, c1]) - (peb[t - 1, c1] if has_pe else 0.0)
            acc, k1, hit = 0.0, 0, False
            for k in range(kmax):
                s = t - 1 - k
                if direct:
                    mm, sm = NINF, 0.0
                    for cp in range(C):
                        mm, sm = lse_update(mm, sm, Ab[s, cp] + Tr[k, cp, c1])
                    x = (lse_finish(mm, sm) + D[k, c1]) + ((psb[s, c1] if has_ps else 0.0) - Sb[s, c1])
                else:
                    x = W[b, s, c1] + D[k, c1]
                acc, k1, hit = _step(acc, k1, k, x - ref, u[t, 1])
                if hit:
                    break
            k1 += 1
            s = t - k1
            for i in range(s, t):
                labels[r, i] = c1
            starts[r, s] = True
            t, cn, kn = s, c1, k1


def sample_numba(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, uniforms, masks=None):
    """Exact samples on the compiled CPU engine.

    Args:
        cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end: validated CPU
            tensors, as for :func:`~.engine.semi_crf_streaming_forward_numba`.
        uniforms: (N, T+1, 2) float64 in [0, 1); row r samples sequence ``r % B``.
        masks: optional segment limits ``(min_start, max_end, forbidden_start)``.

    Returns:
        ``(labels (N, T) int64 (-1 past each length and for a sequence with no allowed
        segmentation), starts (N, T) bool, log_z (B,) float64)``.

    Example:
        >>> cum = torch.nn.functional.pad(torch.randn(2, 9, 3).cumsum(1), (0, 0, 1, 0))
        >>> u = torch.rand(4, 10, 2, dtype=torch.float64)
        >>> labels, starts, log_z = sample_numba(cum, torch.zeros(3, 3), torch.zeros(4, 3),
        ...                                      torch.tensor([9, 5]), 4, None, None, u)
        >>> labels.shape, bool(starts[:, 0].all())
        (torch.Size([4, 9]), True)
    """
    x = _Inputs(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, masks)
    B, T, C = x.B, x.T, x.C
    interval = _resolve_interval(T, K, None)
    A = np.empty((B, T + 1, C))
    W = np.empty((B, T, C) if not x.direct else (1, 1, C))
    Uu = np.empty((B, T, C) if not x.direct else (1, 1, C))
    log_z = _forward(x, interval, False, np.zeros((1, 1, K + 1, C)), (A, W, Uu))
    U = np.ascontiguousarray(uniforms.detach().cpu().numpy(), dtype=np.float64)
    N = U.shape[0]
    labels = np.full((N, T), -1, dtype=np.int64)
    starts = np.zeros((N, T), dtype=np.bool_)
    _run_batch(walk_batch, N, float(x.t_max * K), A, W, Uu, log_z, x.direct, x.S, x.ps, x.pe, x.has_ps, x.has_pe,
               x.lim, x.has_lim, x.lengths, x.Tr if x.direct else x.Tr[None], x.D, U, labels, starts)
    dev = cum_scores.device
    return torch.from_numpy(labels).to(dev), torch.from_numpy(starts).to(dev), torch.from_numpy(log_z).to(dev)
