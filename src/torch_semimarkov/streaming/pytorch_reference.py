"""Streaming semi-CRF in plain PyTorch: forward, checkpointed backward, Viterbi.

This is the CPU path of :mod:`torch_semimarkov.streaming` and the reference the Triton kernels are
tested against. It follows ``docs/internals.md`` (the factored recurrence of ALGORITHM.md):

* forward state is a ring of the last K values of ``W_s = u_s - S_s + ps_s`` (factored, static
  ``(C, C)`` transition) or of ``alpha`` (direct, ``(K, C, C)`` transition), O(K·C) per sequence;
* the ring is *doubled* and written in descending position order, so the window
  ``W_{t-1}, W_{t-2}, ..., W_{t-K}`` is one contiguous slice whose row ``i`` is duration ``k = i+1``;
* values are kept relative to a running normaliser (a float64 per sequence), shifted every few
  steps, so float32 stays accurate for T = 10^6;
* the backward walks checkpoint intervals in reverse, recomputes alpha over one interval, runs the
  strictly sequential beta recurrence, and then evaluates every marginal and gradient term for the
  whole interval at once with vectorised tensor operations (no autograd graph over T).

All functions take inputs already checked by
:func:`~torch_semimarkov.streaming.validation.validate_streaming_inputs`.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np
import torch

from .constants import NEG_INF

#: Shift the ring to a fresh normaliser every this many positions. Values then never drift more
#: than a few steps' growth away from zero, far inside float32's exact range.
RENORM_EVERY = 8

#: Upper bound on the elements of one vectorised gradient block (memory stays bounded for any K).
_BLOCK_ELEMENTS = 1 << 21


def _compute_checkpoint_interval(T: int, K: int) -> int:
    """Default checkpoint spacing: sqrt(T·K) balances checkpoint memory against the interval buffer."""
    return max(K, int(math.sqrt(T * K)), 1)


def _resolve_interval(T: int, K: int, checkpoint_interval: Optional[int]) -> int:
    interval = checkpoint_interval or _compute_checkpoint_interval(T, K)
    return max(1, min(int(interval), T + 1))


def _lse(x: torch.Tensor, dim) -> torch.Tensor:
    return torch.logsumexp(x, dim=dim)


class _Terms:
    """Per-position additive terms shared by the forward and backward recurrences.

    ``w_add[:, s] = ps[s] - S[s]`` enters every segment *starting* at s; ``a_add[:, t-1] =
    S[t] + pe[t-1]`` every segment *ending* at t (last position t-1). Both have one padding row.
    """

    def __init__(self, cum_scores, proj_start, proj_end):
        B, T1, C = cum_scores.shape
        T = T1 - 1
        zero_row = cum_scores.new_zeros(B, 1, C)
        w_add = -cum_scores[:, :T]
        if proj_start is not None:
            w_add = w_add + proj_start
        a_add = cum_scores[:, 1:]
        if proj_end is not None:
            a_add = a_add + proj_end
        self.w_add = torch.cat([w_add, zero_row], 1).contiguous()  # (B, T+1, C)
        self.a_add = torch.cat([a_add, zero_row], 1).contiguous()  # (B, T+1, C)


# --------------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------------


class _ForwardScan:
    """The forward recurrence of one batch, one position at a time.

    After ``step(p)`` the object holds ``alpha`` (B, C) for position p+1 relative to the float64
    normaliser ``norm`` (B,), and the ring holds W (factored) or alpha (direct) up to position p
    (resp. p+1). ``state()``/``load()`` give the checkpoint at the current position.
    """

    def __init__(self, transition, duration_bias, terms: _Terms, K: int, semiring: str, batch: int):
        self.tr = transition
        self.db = duration_bias
        self.terms = terms
        self.K = K
        self.max = semiring == "max"
        self.direct = transition.dim() == 3
        C = duration_bias.shape[1]
        dtype, device = duration_bias.dtype, duration_bias.device
        self.ring = torch.full((batch, 2 * K, C), NEG_INF, dtype=dtype, device=device)
        self.alpha = torch.zeros(batch, C, dtype=dtype, device=device)
        self.norm = torch.zeros(batch, dtype=torch.float64, device=device)
        if self.direct:
            # alpha_0 = 0 sits in the ring at position 0 (slot 0 and its twin K)
            self.ring[:, 0] = 0.0
            self.ring[:, K] = 0.0
            # w_add reversed in time, padded: the K start positions t-1..t-K are one ascending slice
            T1 = terms.w_add.shape[1]
            pad = terms.w_add.new_zeros(batch, K, C)
            self.w_rev = torch.cat([pad, terms.w_add[:, : T1 - 1]], 1).flip(1).contiguous()
            self.T = T1 - 1
            self.db_plus = None

    # ring slot of position p in the descending doubled ring
    def _slot(self, p: int) -> int:
        return (-p) % self.K

    def step(self, p: int):
        """Advance from position p to p+1. Returns backpointers (bp_k, bp_c) for max, else None."""
        K = self.K
        if self.direct:
            return self._step_direct(p)
        alpha = self.alpha
        scores = alpha.unsqueeze(2) + self.tr  # (B, C', C)
        if self.max:
            u, bp_c = scores.max(dim=1)
        else:
            u = _lse(scores, 1)
        r = self._slot(p)
        w = u + self.terms.w_add[:, p]
        self.ring[:, r] = w
        self.ring[:, r + K] = w
        window = self.ring[:, r : r + K] + self.db  # (B, K, C): row i <-> W_{p-i} + D[i]
        if self.max:
            acc, bp_k = window.max(dim=1)
        else:
            acc = _lse(window, 1)
        self.alpha = acc + self.terms.a_add[:, p]
        if (p + 1) % RENORM_EVERY == 0:
            self._renorm()
        if self.max:
            return bp_k, bp_c
        return None

    def _step_direct(self, p: int):
        K = self.K
        r = self._slot(p)
        window = self.ring[:, r : r + K]  # (B, K, C'): row i <-> alpha_{p-i}
        start = self.T - 1 - p
        seg = self.db + self.w_rev[:, start : start + K]  # (B, K, C): D[k-1] + w_add[p+1-k]
        scores = window.unsqueeze(3) + self.tr + seg.unsqueeze(2)  # (B, K, C', C)
        B, C = scores.shape[0], scores.shape[-1]
        if self.max:
            acc, idx = scores.reshape(B, K * C, C).max(dim=1)
            bp_k, bp_c = idx // C, idx % C
        else:
            acc = _lse(scores, (1, 2))
        self.alpha = acc + self.terms.a_add[:, p]
        r1 = self._slot(p + 1)
        self.ring[:, r1] = self.alpha
        self.ring[:, r1 + K] = self.alpha
        if (p + 1) % RENORM_EVERY == 0:
            self._renorm()
        if self.max:
            return bp_k, bp_c
        return None

    def _renorm(self):
        shift = self.alpha.amax(dim=1)  # (B,)
        self.alpha = self.alpha - shift[:, None]
        self.ring -= shift[:, None, None]
        self.norm += shift.double()

    def state(self, p: int) -> torch.Tensor:
        """Checkpoint at position p: (B, K+1, C) = K ring rows in duration order, then alpha_p."""
        K = self.K
        if self.direct:
            r = self._slot(p)
            rows = self.ring[:, r : r + K]  # alpha_p, alpha_{p-1}, ..., alpha_{p-K+1}
        else:
            r = self._slot(p - 1)
            rows = self.ring[:, r : r + K]  # W_{p-1}, ..., W_{p-K}
        return torch.cat([rows, self.alpha.unsqueeze(1)], 1)

    def load(self, p: int, ckpt: torch.Tensor, norm: torch.Tensor) -> None:
        K = self.K
        rows = ckpt[:, :K]
        r = self._slot(p) if self.direct else self._slot(p - 1)
        # rows[i] belongs at ring slot (r + i) mod K and its twin
        idx = (torch.arange(K, device=rows.device) + r) % K
        self.ring[:, idx] = rows
        self.ring[:, idx + K] = rows
        self.alpha = ckpt[:, K].clone()
        self.norm = norm.clone()

    def final(self) -> torch.Tensor:
        """log Z (or the max score) from the current alpha: (B,) float64."""
        if self.max:
            return self.alpha.amax(dim=1).double() + self.norm
        return _lse(self.alpha, 1).double() + self.norm


def semi_crf_streaming_forward_pytorch(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths: torch.Tensor,
    K: int,
    semiring: str = "log",
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
    checkpoint_interval: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """Streaming forward pass: log partition (or Viterbi score) with ring checkpoints.

    Args:
        cum_scores: (B, T+1, C) cumulative label scores, ``cum_scores[:, 0] == 0``.
        transition: (C, C) ``[c_src, c_dst]``, or (K, C, C) indexed by duration ``k-1``.
        duration_bias: (K, C), row ``k-1`` for duration k.
        lengths: (B,) int64 lengths in [1, T].
        K: maximum segment duration.
        semiring: ``"log"`` (log Z) or ``"max"`` (Viterbi score).
        proj_start, proj_end: optional (B, T, C) boundary scores.
        checkpoint_interval: spacing of the checkpoints (default ``max(K, sqrt(T·K))``).

    Returns:
        ``(partition, ring_checkpoints, checkpoint_interval, log_norm_checkpoints)``:
        partition (B,) in the dtype of cum_scores; ring_checkpoints (B, N, K+1, C) holding, at each
        checkpoint position ``i·interval``, the K ring rows and the alpha row, relative to
        log_norm_checkpoints (B, N) float64.

    Example:
        >>> B, T, K, C = 2, 10, 3, 4
        >>> cum = torch.randn(B, T + 1, C).cumsum(1); cum[:, 0] = 0
        >>> logz, ckpts, interval, norms = semi_crf_streaming_forward_pytorch(
        ...     cum, torch.zeros(C, C), torch.zeros(K, C), torch.tensor([10, 7]), K)
        >>> logz.shape
        torch.Size([2])
    """
    B, T1, C = cum_scores.shape
    lengths = lengths.to(torch.int64)
    t_max = int(lengths.max())
    interval = _resolve_interval(T1 - 1, K, checkpoint_interval)
    terms = _Terms(cum_scores, proj_start, proj_end)
    scan = _ForwardScan(transition, duration_bias, terms, K, semiring, B)
    n_ckpt = t_max // interval + 1
    ring_ckpts = cum_scores.new_empty(B, n_ckpt, K + 1, C)
    norm_ckpts = torch.empty(B, n_ckpt, dtype=torch.float64, device=cum_scores.device)
    out = torch.empty(B, dtype=torch.float64, device=cum_scores.device)
    ends = _positions_to_batches(lengths)
    with torch.no_grad():
        for p in range(t_max + 1):
            if p % interval == 0:
                ring_ckpts[:, p // interval] = scan.state(p)
                norm_ckpts[:, p // interval] = scan.norm
            if p in ends:
                idx = ends[p]
                out[idx] = scan.final()[idx]
            if p < t_max:
                scan.step(p)
    return out.to(cum_scores.dtype), ring_ckpts, interval, norm_ckpts


def _positions_to_batches(lengths: torch.Tensor) -> dict:
    """Map each distinct length L to the batch indices (a tensor) of the sequences ending at L."""
    lens = lengths.tolist()
    groups: dict = {}
    for b, L in enumerate(lens):
        groups.setdefault(L, []).append(b)
    return {L: torch.tensor(idx, device=lengths.device) for L, idx in groups.items()}


# --------------------------------------------------------------------------------------------
# Viterbi
# --------------------------------------------------------------------------------------------


def semi_crf_streaming_viterbi_pytorch(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths: torch.Tensor,
    K: int,
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Best segmentation by the max semiring, with backpointers and traceback.

    Ties break toward the smallest index: the smallest predecessor label, the smallest duration
    (for (K, C, C) transitions the lexicographically smallest (k, c')), the smallest final label.

    Returns:
        ``(scores, labels, seg_starts)``: scores (B,) in the dtype of cum_scores, labels (B, T)
        int64 with -1 past each length, seg_starts (B, T) bool, True where a segment starts.
    """
    B, T1, C = cum_scores.shape
    T = T1 - 1
    lengths = lengths.to(torch.int64)
    t_max = int(lengths.max())
    terms = _Terms(cum_scores, proj_start, proj_end)
    scan = _ForwardScan(transition, duration_bias, terms, K, "max", B)
    # bp_k[:, t-1, c]: best duration of a segment with label c ending at t (stored as k-1);
    # bp_c[:, s, c]: best predecessor label of a segment with label c starting at s
    # (for (K, C, C) transitions, of the segment with label c ending at s+1... see traceback)
    bp_k = torch.zeros(B, t_max, C, dtype=torch.int32)
    bp_c = torch.zeros(B, t_max, C, dtype=torch.int32)
    scores = torch.empty(B, dtype=torch.float64)
    final_label = torch.empty(B, dtype=torch.int64)
    ends = _positions_to_batches(lengths.cpu())
    with torch.no_grad():
        for p in range(t_max + 1):
            if p in ends:
                idx = ends[p]
                best, arg = scan.alpha.cpu().max(dim=1)
                scores[idx] = best.double()[idx] + scan.norm.cpu()[idx]
                final_label[idx] = arg[idx]
            if p < t_max:
                k_idx, c_idx = scan.step(p)
                bp_k[:, p] = k_idx.to("cpu", torch.int32)
                if scan.direct:
                    bp_c[:, p] = c_idx.to("cpu", torch.int32)  # predecessor of segment ending at p+1
                else:
                    bp_c[:, p] = c_idx.to("cpu", torch.int32)  # predecessor of segment starting at p
    labels, starts = traceback(bp_k.numpy(), bp_c.numpy(), final_label.numpy(), lengths.cpu().numpy(), T, scan.direct)
    dev = cum_scores.device
    return scores.to(cum_scores.dtype).to(dev), torch.from_numpy(labels).to(dev), torch.from_numpy(starts).to(dev)


def traceback(bp_k: np.ndarray, bp_c: np.ndarray, final_label: np.ndarray, lengths: np.ndarray, T: int, direct: bool):
    """Follow backpointers from each sequence's end to position 0.

    Args:
        bp_k: (B, T', C) best duration minus one of a segment with label c ending at t (index t-1).
        bp_c: (B, T', C) best predecessor label: for the factored recurrence indexed by the
            segment's start s; for the direct one by its end t (index t-1).
        final_label: (B,) label of the last segment. lengths: (B,). T: output width.
        direct: which indexing ``bp_c`` uses.

    Returns:
        labels (B, T) int64 (-1 past length) and seg_starts (B, T) bool.
    """
    B = bp_k.shape[0]
    labels = np.full((B, T), -1, dtype=np.int64)
    starts = np.zeros((B, T), dtype=bool)
    for b in range(B):
        t = int(lengths[b])
        c = int(final_label[b])
        bk, bc, lab, st = bp_k[b], bp_c[b], labels[b], starts[b]
        while t > 0:
            k = int(bk[t - 1, c]) + 1
            s = t - k
            lab[s:t] = c
            st[s] = True
            c = int(bc[t - 1, c]) if direct else int(bc[s, c])
            t = s
    return labels, starts


# --------------------------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------------------------


def semi_crf_streaming_backward_pytorch(
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
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Streaming backward pass: posterior marginals, which are the gradients of log Z.

    Walks the checkpoint intervals in reverse; in each it recomputes alpha from the checkpoint,
    runs the beta recurrence (ALGORITHM.md §3) backward through it, and evaluates the marginals of
    the whole interval at once.

    Args:
        cum_scores ... proj_end: as for :func:`semi_crf_streaming_forward_pytorch`.
        log_Z: (B,) log partition from the forward pass.
        ring_checkpoints, checkpoint_interval, log_norm_checkpoints: the forward's checkpoints.

    Returns:
        ``(p_start, p_end, grad_transition, grad_duration_bias)``, not scaled by any upstream
        gradient: p_start (B, T, C) = P(a segment with label c starts at s); p_end (B, T, C) =
        P(a segment with label c has its last position at e); grad_transition (B, C, C) (or
        (B, K, C, C)) and grad_duration_bias (B, K, C), the per-sequence gradients of log Z.
        ``dlogZ/dcum_scores[t] = p_end[t-1] - p_start[t]``.
    """
    B, T1, C = cum_scores.shape
    T = T1 - 1
    device, dtype = cum_scores.device, cum_scores.dtype
    lengths = lengths.to(torch.int64)
    t_max = int(lengths.max())
    interval = checkpoint_interval
    direct = transition.dim() == 3
    terms = _Terms(cum_scores, proj_start, proj_end)
    db = duration_bias

    pos = torch.arange(t_max + 1, device=device)
    # masks over positions 0..t_max: 0 where valid, NEG_INF where not
    active = pos[None, :] < lengths[:, None]  # (B, t_max+1): a segment may start at p
    act_mask = torch.where(active, 0.0, NEG_INF).to(dtype)
    end_mask = torch.where((pos[None, :] >= 1) & (pos[None, :] <= lengths[:, None]), 0.0, NEG_INF).to(dtype)
    cont = active.to(dtype)  # beta_p is a real message (p < L); at p = L it is 0

    # x_add[:, t] = S_t + pe_{t-1} for 1 <= t <= L, NEG_INF past the length (X is then NEG_INF)
    span = t_max + K + 1
    x_add = torch.full((B, span, C), NEG_INF, dtype=dtype, device=device)
    n_valid = min(T, span - 1)
    valid_t = torch.arange(1, n_valid + 1, device=device)
    x_add[:, 1 : n_valid + 1] = torch.where(
        (valid_t[None, :, None] <= lengths[:, None, None]), terms.a_add[:, :n_valid], NEG_INF
    )
    # X_t and its float64 frame for every position, as written by the sequential loop
    x_all = torch.full((B, span, C), NEG_INF, dtype=dtype, device=device)
    x_frame = torch.zeros(B, span, dtype=torch.float64, device=device)

    p_start = torch.zeros(B, T, C, dtype=dtype, device=device)
    p_end = torch.zeros(B, T, C, dtype=dtype, device=device)
    g_tr = torch.zeros((B,) + tuple(transition.shape), dtype=torch.float64, device=device)
    g_db = torch.zeros(B, K, C, dtype=torch.float64, device=device)

    scan = _ForwardScan(transition, db, terms, K, "log", B)
    x_ring = torch.full((B, 2 * K, C), NEG_INF, dtype=dtype, device=device)
    beta_next = torch.zeros(B, C, dtype=dtype, device=device)
    frame = torch.zeros(B, dtype=torch.float64, device=device)
    log_z = log_Z.to(torch.float64)

    n_ckpt = ring_checkpoints.shape[1]
    with torch.no_grad():
        for i in range(n_ckpt - 1, -1, -1):
            t0 = i * interval
            t1 = min(t0 + interval, t_max + 1)
            n = t1 - t0
            # ---- recompute alpha (and W) over the interval from the checkpoint
            scan.load(t0, ring_checkpoints[:, i], log_norm_checkpoints[:, i])
            alpha_buf = cum_scores.new_empty(B, n, C)
            norm_buf = torch.empty(B, n, dtype=torch.float64, device=device)
            w_buf = None if direct else cum_scores.new_empty(B, n, C)
            for j in range(n):
                p = t0 + j
                alpha_buf[:, j] = scan.alpha
                norm_buf[:, j] = scan.norm
                if p < t_max:
                    scan.step(p)
                    if not direct:
                        w_buf[:, j] = scan.ring[:, scan._slot(p)]
                        # the ring may have been renormalised after W_p was written
                        if (p + 1) % RENORM_EVERY == 0:
                            w_buf[:, j] += (scan.norm - norm_buf[:, j]).to(dtype)[:, None]
            # ---- beta backward through the interval
            v_buf = None if direct else cum_scores.new_empty(B, n, C)
            beta_buf = cum_scores.new_empty(B, n, C)
            vframe_buf = torch.empty(B, n, dtype=torch.float64, device=device)
            for j in range(n - 1, -1, -1):
                p = t0 + j
                t = p + 1
                q = t % K
                x_t = x_add[:, t] + beta_next * cont[:, t, None] if t <= t_max else x_add[:, t]
                x_ring[:, q] = x_t
                x_ring[:, q + K] = x_t
                x_all[:, t] = x_t
                x_frame[:, t] = frame * cont[:, t] if t <= t_max else 0.0
                window = x_ring[:, q : q + K]  # row i <-> X_{p+1+i}
                if direct:
                    y = window + db + terms.w_add[:, p, None, :]  # (B, K, C)
                    beta = _lse(transition + y.unsqueeze(2), (1, 3))
                else:
                    v = _lse(window + db, 1) + terms.w_add[:, p]
                    v_buf[:, j] = v
                    beta = _lse(transition + v.unsqueeze(1), 2)
                beta_buf[:, j] = beta
                vframe_buf[:, j] = frame
                if p % RENORM_EVERY == 0:
                    shift = beta.amax(dim=1) * cont[:, p]
                    beta = beta - shift[:, None]
                    x_ring -= shift[:, None, None]
                    frame = frame + shift.double()
                beta_next = beta
            # ---- every marginal of the interval at once
            base = norm_buf + vframe_buf - log_z[:, None]  # (B, n) float64
            sl = slice(t0, t1)
            # P_end at positions t0..t1-1 (alpha_t + beta_t; beta_L = 0 via cont)
            e_exp = alpha_buf + beta_buf * cont[:, sl, None] + (norm_buf + vframe_buf * cont[:, sl] - log_z[:, None]).to(dtype)[..., None]
            e_exp = e_exp + end_mask[:, sl, None]
            pe = torch.exp(e_exp)
            lo = max(t0, 1)
            if lo < t1:
                p_end[:, lo - 1 : t1 - 1] = pe[:, lo - t0 :]
            x_win = x_all[:, t0 + 1 : t1 + K]  # (B, n+K-1, C): X_{t0+1} .. X_{t1+K-1}
            f_win = x_frame[:, t0 + 1 : t1 + K]
            if direct:
                _direct_interval_terms(
                    alpha_buf, norm_buf, x_win, f_win, terms.w_add[:, sl], act_mask[:, sl], log_z,
                    transition, db, K, p_start, g_tr, g_db, t0, t1, T,
                )
            else:
                u = w_buf - terms.w_add[:, sl]
                s_exp = u + v_buf + base.to(dtype)[..., None] + act_mask[:, sl, None]
                hi = min(t1, T)
                p_start[:, t0:hi] = torch.exp(s_exp[:, : hi - t0])
                # P_trans summed over the interval
                v_base = v_buf + (base.to(dtype) + act_mask[:, sl])[..., None]
                _accumulate_transition_grad(alpha_buf, v_base, transition, g_tr)
                # P_seg summed over the interval: W_p + D[k-1] + X_{p+k}, blocked over positions
                w_base = w_buf + (norm_buf - log_z[:, None]).to(dtype)[..., None] + act_mask[:, sl, None]
                _accumulate_duration_grad(w_base, x_win, f_win, db, K, g_db)
    return p_start, p_end, g_tr.to(dtype), g_db.to(dtype)


def _accumulate_transition_grad(alpha_buf, v_base, transition, g_tr):
    """g_tr[b, c', c] += sum_p exp(alpha_p[b, c'] + Tr[c', c] + v_base[b, p, c])."""
    B, n, C = alpha_buf.shape
    step = max(1, _BLOCK_ELEMENTS // max(1, B * C * C))
    for a in range(0, n, step):
        b_ = min(n, a + step)
        e = alpha_buf[:, a:b_].unsqueeze(3) + transition + v_base[:, a:b_].unsqueeze(2)
        g_tr += torch.exp(e).sum(1, dtype=torch.float64)


def _accumulate_duration_grad(w_base, x_win, f_win, db, K, g_db):
    """g_db[b, k-1, c] += sum_p exp(w_base[b,p,c] + D[k-1,c] + X_{p+k}[b,c] + frame_{p+k}[b])."""
    B, n, C = w_base.shape
    step = max(1, _BLOCK_ELEMENTS // max(1, B * K * C))
    for a in range(0, n, step):
        b_ = min(n, a + step)
        xs = x_win[:, a : b_ + K - 1].unfold(1, K, 1)  # (B, m, C, K): X_{p+1..p+K}
        fs = f_win[:, a : b_ + K - 1].unfold(1, K, 1)  # (B, m, K)
        e = w_base[:, a:b_].unsqueeze(3) + xs + db.t() + fs.to(w_base.dtype).unsqueeze(2)
        g_db += torch.exp(e).sum(1, dtype=torch.float64).transpose(1, 2)


def _direct_interval_terms(alpha_buf, norm_buf, x_win, f_win, w_add, act_mask, log_z, transition, db, K, p_start, g_tr, g_db, t0, t1, T):
    """P_seg(p, k, c', c) for the (K, C, C) recurrence over one interval, blocked over positions."""
    B, n, C = alpha_buf.shape
    dtype = alpha_buf.dtype
    step = max(1, _BLOCK_ELEMENTS // max(1, B * K * C * C))
    for a in range(0, n, step):
        b_ = min(n, a + step)
        xs = x_win[:, a : b_ + K - 1].unfold(1, K, 1).transpose(2, 3)  # (B, m, K, C)
        fs = f_win[:, a : b_ + K - 1].unfold(1, K, 1)  # (B, m, K)
        base = (norm_buf[:, a:b_, None] + fs - log_z[:, None, None]).to(dtype) + act_mask[:, a:b_, None]
        y = xs + db + w_add[:, a:b_, None, :] + base.unsqueeze(3)  # (B, m, K, C)
        e = alpha_buf[:, a:b_, None, :, None] + transition + y.unsqueeze(3)  # (B, m, K, C', C)
        prob = torch.exp(e)
        g_tr += prob.sum(1, dtype=torch.float64)
        g_db += prob.sum((1, 3), dtype=torch.float64)
        hi = min(t0 + b_, T)
        lo = t0 + a
        if lo < hi:
            p_start[:, lo:hi] = prob.sum((2, 3))[:, : hi - lo]
