"""Streaming semi-CRF in plain PyTorch: forward, checkpointed backward, Viterbi.

This is the CPU path of :mod:`torch_semimarkov.streaming` and the reference the Triton kernels are
tested against. It follows ``docs/internals.md`` (its factored recurrence):

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
:func:`~torch_semimarkov.core.validation.validate_streaming_inputs`.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np
import torch

from torch_semimarkov.core.constants import IMPOSSIBLE, IMPOSSIBLE_BELOW

#: Shift the ring to a fresh normaliser every this many positions. Values then never drift more
#: than a few steps' growth away from zero, far inside float32's exact range.
RENORM_EVERY = 8

#: Upper bound on the elements of one vectorised gradient block (memory stays bounded for any K).
_BLOCK_ELEMENTS = 1 << 21


#: The recurrences run in float64 whatever the input dtype: the CPU loop is bound by per-step
#: overhead, not arithmetic, so this costs little, and the forward/backward rounding drift that
#: float32 accumulates over 10^5+ positions (about 1e-4 in the marginals) disappears.
COMPUTE_DTYPE = torch.float64


def _possible_shift(shift: torch.Tensor) -> torch.Tensor:
    """The normaliser shift, 0 where every state is impossible: frames only ever move by real
    values, so an infeasible prefix never costs the later real values any precision."""
    return torch.where(shift > IMPOSSIBLE_BELOW, shift, torch.zeros_like(shift))


def feasible(score: torch.Tensor) -> torch.Tensor:
    """(B,) bool: True where a recurrence's final value (log Z or best score) is a real score."""
    return score > IMPOSSIBLE_BELOW


def public_score(score: torch.Tensor) -> torch.Tensor:
    """``score`` with every impossible value (no allowed segmentation) replaced by ``-inf``."""
    return torch.where(feasible(score), score, torch.full_like(score, -math.inf))


def zero_rows(t: torch.Tensor, keep: torch.Tensor) -> None:
    """Zero, in place, the batch rows of ``t`` where ``keep`` (B,) is False (no host sync)."""
    keep = keep.view((-1,) + (1,) * (t.dim() - 1))
    torch.where(keep, t, torch.zeros((), dtype=t.dtype, device=t.device), out=t)


def _upcast(*tensors):
    return tuple(None if t is None else t.to(COMPUTE_DTYPE) for t in tensors)


def _compute_checkpoint_interval(T: int, K: int) -> int:
    """Default checkpoint spacing: sqrt(T·K) balances checkpoint memory against the interval buffer."""
    return max(K, int(math.sqrt(T * K)), 1)


def _resolve_interval(T: int, K: int, checkpoint_interval: Optional[int]) -> int:
    interval = checkpoint_interval or _compute_checkpoint_interval(T, K)
    return max(1, min(int(interval), T + 1))


class _Terms:
    """Per-position inputs of the recurrences, time-major, padded so every window is one slice.

    The recurrences never hold a cumulative score on its own: S enters only as a segment's content
    ``S[s+k] - S[s]``, formed right where it is used. Two float32 values of similar size subtract
    exactly, so stored values stay O(1) even when |S| grows like sqrt(T), and rounding does not
    accumulate into the forward/backward messages.

    * ``s`` (T+1+K, B, C): S, padded at the end with S_T (finite; only multiplied by masked terms).
    * ``s_rev`` (T+1+K, B, C): S reversed in time and padded at the front, so that
      ``s_rev[T-p : T-p+K]`` is ``S_p, S_{p-1}, ..., S_{p-K+1}``.
    * ``ps``, ``pe`` (T+1, B, C) or None; ``ps_rev`` like ``s_rev``.
    """

    def __init__(self, cum_scores, proj_start, proj_end, K: int):
        B, T1, C = cum_scores.shape
        self.T = T1 - 1
        self.K = K
        cum = cum_scores.transpose(0, 1)  # (T+1, B, C)
        self.s = torch.cat([cum, cum[-1:].expand(K, B, C)], 0).contiguous()
        self.s_rev = torch.cat([cum[:1].expand(K, B, C), cum], 0).flip(0).contiguous()
        self.s_cols = self.s.unbind(0)
        zero_row = cum.new_zeros(1, B, C)
        self.ps = self.pe = self.ps_rev = None
        self.ps_cols = self.pe_cols = None
        if proj_start is not None:
            ps = proj_start.transpose(0, 1)
            self.ps = torch.cat([ps, zero_row], 0).contiguous()
            self.ps_rev = torch.cat([ps.new_zeros(K, B, C), ps, zero_row], 0).flip(0).contiguous()
            self.ps_cols = self.ps.unbind(0)
        if proj_end is not None:
            self.pe = torch.cat([proj_end.transpose(0, 1), zero_row], 0).contiguous()
            self.pe_cols = self.pe.unbind(0)

    def content_back(self, p: int) -> torch.Tensor:
        """(K, B, C): row i = S_{p+1} - S_{p-i}, the content of a segment of duration i+1 ending at p+1."""
        return self.s_cols[p + 1] - self.s_rev[self.T - p : self.T - p + self.K]

    def content_ahead(self, p: int) -> torch.Tensor:
        """(K, B, C): row i = S_{p+1+i} - S_p, the content of a segment of duration i+1 starting at p."""
        return self.s[p + 1 : p + 1 + self.K] - self.s_cols[p]


# --------------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------------


class _ForwardScan:
    """The forward recurrence of one batch, one position at a time.

    After ``step(p)``, ``alpha`` (B, C) is alpha at position p+1 relative to the float64
    normaliser ``norm`` (B,). The ring (2K, B, C) holds ``U_s = u_s + ps_s`` (factored) or alpha
    (direct) in descending position order, twice, so the K most recent rows are the slice
    ``[r, r+K)`` whose row i is duration i+1. ``state``/``load`` give the checkpoint at a position.
    """

    def __init__(self, transition, duration_bias, terms: _Terms, K: int, semiring: str, batch: int):
        self.tr = transition
        self.db = duration_bias[:, None, :]  # (K, 1, C): row i <-> duration i+1
        self.terms = terms
        self.K = K
        self.max = semiring == "max"
        self.direct = transition.dim() == 3
        C = duration_bias.shape[1]
        dtype, device = duration_bias.dtype, duration_bias.device
        self.ring = torch.full((2 * K, batch, C), IMPOSSIBLE, dtype=dtype, device=device)
        self.alpha = torch.zeros(batch, C, dtype=dtype, device=device)
        self.norm = torch.zeros(batch, dtype=torch.float64, device=device)
        if self.direct:
            # alpha_0 = 0 sits at ring slot 0 and its twin K
            self.ring[0] = 0.0
            self.ring[K] = 0.0
            self.tr4 = transition[:, None]  # (K, 1, C', C)

    def _slot(self, p: int) -> int:
        """Ring slot of position p (descending order)."""
        return (-p) % self.K

    def step(self, p: int, out: Optional[torch.Tensor] = None):
        """Advance from position p to p+1, writing alpha_{p+1} into ``out`` if given.

        Returns the backpointers ``(bp_k, bp_c)`` for the max semiring, else None.
        """
        K, terms = self.K, self.terms
        r = self._slot(p)
        bp = None
        content = terms.content_back(p)  # (K, B, C): S_{p+1} - S_{p+1-k}
        if self.direct:
            window = self.ring[r : r + K]  # (K, B, C'): row i <-> alpha_{p-i}
            seg = content + self.db
            if terms.ps is not None:
                seg += terms.ps_rev[terms.T - p : terms.T - p + K]
            scores = window.unsqueeze(3) + self.tr4 + seg.unsqueeze(2)  # (K, B, C', C)
            if self.max and p < K:
                # the first segment (row p, from alpha_0 = 0) keeps the log Z term
                # logsumexp_{c'} Tr[p, c', c]: the phantom predecessor is marginalised, not maximised
                first = torch.logsumexp(scores[p], dim=1)  # (B, C)
                scores = scores.clone()
                scores[p] = IMPOSSIBLE
                scores[p, :, 0] = first
            if self.max:
                Bn, C = scores.shape[1], scores.shape[3]
                acc, idx = scores.transpose(0, 1).reshape(Bn, K * C, C).max(dim=1)
                bp = (idx // C, idx % C)
            else:
                acc = torch.logsumexp(scores, (0, 2))
        else:
            scores = self.alpha.unsqueeze(2) + self.tr  # (B, C', C)
            if self.max and p == 0:
                # u_0 = logsumexp_{c'} Tr[c', c] in both semirings (the phantom predecessor)
                u = torch.logsumexp(scores, 1)
                bp_c = torch.zeros_like(u, dtype=torch.int64)
            elif self.max:
                u, bp_c = scores.max(dim=1)
            else:
                u = torch.logsumexp(scores, 1)
            if terms.ps is not None:
                torch.add(u, terms.ps_cols[p], out=self.ring[r])
            else:
                self.ring[r].copy_(u)
            self.ring[r + K].copy_(self.ring[r])
            window = self.ring[r : r + K] + content
            window += self.db  # row i <-> U_{p-i} + S_{p+1} - S_{p-i} + D[i]
            if self.max:
                acc, bp_k = window.max(dim=0)
                bp = (bp_k, bp_c)
            else:
                acc = torch.logsumexp(window, 0)
        if terms.pe is not None:
            acc = acc + terms.pe_cols[p]
        if out is None:
            self.alpha = acc
        else:
            self.alpha = out.copy_(acc)
        if (p + 1) % RENORM_EVERY == 0:
            self._renorm()
        if self.direct:
            r1 = self._slot(p + 1)
            self.ring[r1].copy_(self.alpha)
            self.ring[r1 + K].copy_(self.alpha)
        return bp

    def _renorm(self):
        shift = _possible_shift(self.alpha.amax(dim=1))  # (B,)
        torch.clamp(self.alpha - shift[:, None], min=IMPOSSIBLE, out=self.alpha)
        torch.clamp(self.ring - shift[:, None], min=IMPOSSIBLE, out=self.ring)
        self.norm += shift.double()

    def state(self, p: int) -> torch.Tensor:
        """Checkpoint at position p: (B, K+1, C) = the K ring rows in duration order, then alpha_p."""
        K = self.K
        r = self._slot(p) if self.direct else self._slot(p - 1)
        # direct: alpha_p, ..., alpha_{p-K+1}; factored: W_{p-1}, ..., W_{p-K}
        rows = self.ring[r : r + K]
        return torch.cat([rows, self.alpha.unsqueeze(0)], 0).transpose(0, 1)

    def load(self, p: int, ckpt: torch.Tensor, norm: torch.Tensor) -> None:
        K = self.K
        rows = ckpt[:, :K].transpose(0, 1)  # (K, B, C)
        r = self._slot(p) if self.direct else self._slot(p - 1)
        # rows[i] belongs at ring slot (r + i) mod K and its twin
        idx = (torch.arange(K, device=rows.device) + r) % K
        self.ring[idx] = rows
        self.ring[idx + K] = rows
        self.alpha = ckpt[:, K].clone()
        self.norm = norm.clone()

    def final(self) -> torch.Tensor:
        """log Z (or the max score) from the current alpha: (B,) float64."""
        if self.max:
            return self.alpha.amax(dim=1).double() + self.norm
        return torch.logsumexp(self.alpha, 1).double() + self.norm


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
        partition (B,) float64 (the backward needs log Z to far better than float32's ~1e-3
        absolute at ``|log Z| ~ 1e4``; cast it for display); ring_checkpoints (B, N, K+1, C) holding, at each
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
    cum_scores, transition, duration_bias, proj_start, proj_end = _upcast(cum_scores, transition, duration_bias, proj_start, proj_end)
    lengths = lengths.to(torch.int64)
    t_max = int(lengths.max())
    interval = _resolve_interval(T1 - 1, K, checkpoint_interval)
    terms = _Terms(cum_scores, proj_start, proj_end, K)
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
    return public_score(out), ring_ckpts, interval, norm_ckpts


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
        int64 with -1 past each length, seg_starts (B, T) bool, True where a segment starts. A
        sequence with no allowed segmentation has score ``-inf``, labels -1 and no starts.
    """
    B, T1, C = cum_scores.shape
    T = T1 - 1
    out_dtype = cum_scores.dtype
    cum_scores, transition, duration_bias, proj_start, proj_end = _upcast(cum_scores, transition, duration_bias, proj_start, proj_end)
    lengths = lengths.to(torch.int64)
    t_max = int(lengths.max())
    terms = _Terms(cum_scores, proj_start, proj_end, K)
    scan = _ForwardScan(transition, duration_bias, terms, K, "max", B)
    # bp_k[t-1, b, c]: best duration minus one of a segment with label c ending at t;
    # bp_c: its best predecessor label, indexed by the segment's start s (factored) or by t-1 (direct)
    device = cum_scores.device
    bp_k = torch.zeros(t_max, B, C, dtype=torch.int32, device=device)
    bp_c = torch.zeros(t_max, B, C, dtype=torch.int32, device=device)
    scores = torch.empty(B, dtype=torch.float64, device=device)
    final_label = torch.empty(B, dtype=torch.int64, device=device)
    ends = _positions_to_batches(lengths)
    with torch.no_grad():
        for p in range(t_max + 1):
            if p in ends:
                idx = ends[p]
                best, arg = scan.alpha.max(dim=1)
                scores[idx] = best.double()[idx] + scan.norm[idx]
                final_label[idx] = arg[idx]
            if p < t_max:
                k_idx, c_idx = scan.step(p)
                bp_k[p] = k_idx
                bp_c[p] = c_idx
    bp_k_np = bp_k.transpose(0, 1).cpu().numpy()
    bp_c_np = bp_c.transpose(0, 1).cpu().numpy()
    # an infeasible sequence has no segmentation: nothing to trace (labels -1, no starts)
    ok = feasible(scores)
    traced = torch.where(ok, lengths, torch.zeros_like(lengths))
    labels, starts = traceback(bp_k_np, bp_c_np, final_label.cpu().numpy(), traced.cpu().numpy(), T, scan.direct)
    return public_score(scores).to(out_dtype), torch.from_numpy(labels).to(device), torch.from_numpy(starts).to(device)


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
    need_parameter_grads: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Streaming backward pass: posterior marginals, which are the gradients of log Z.

    Walks the checkpoint intervals in reverse; in each it recomputes alpha from the checkpoint,
    runs the beta recurrence (docs/internals.md §3) backward through it, and evaluates the marginals of
    the whole interval at once.

    Args:
        cum_scores ... proj_end: as for :func:`semi_crf_streaming_forward_pytorch`.
        log_Z: (B,) log partition from the forward pass.
        ring_checkpoints, checkpoint_interval, log_norm_checkpoints: the forward's checkpoints.
        need_parameter_grads: accepted as the compiled engine's backward accepts it; this path
            always returns the parameter gradients.

    Returns:
        ``(p_start, p_end, grad_transition, grad_duration_bias)``, not scaled by any upstream
        gradient: p_start (B, T, C) = P(a segment with label c starts at s); p_end (B, T, C) =
        P(a segment with label c has its last position at e); grad_transition (B, C, C) (or
        (B, K, C, C)) and grad_duration_bias (B, K, C), the per-sequence gradients of log Z.
        ``dlogZ/dcum_scores[t] = p_end[t-1] - p_start[t]``.
    """
    B, T1, C = cum_scores.shape
    T = T1 - 1
    out_dtype = cum_scores.dtype
    cum_scores, transition, duration_bias, proj_start, proj_end, ring_checkpoints = _upcast(
        cum_scores, transition, duration_bias, proj_start, proj_end, ring_checkpoints
    )
    device, dtype = cum_scores.device, cum_scores.dtype
    lengths = lengths.to(torch.int64)
    t_max = int(lengths.max())
    interval = checkpoint_interval
    direct = transition.dim() == 3
    terms = _Terms(cum_scores, proj_start, proj_end, K)
    db = duration_bias[:, None, :]  # (K, 1, C)
    span = t_max + K + 1  # positions 0 .. t_max+K

    pos = torch.arange(span, device=device)[:, None]
    # (span, B) masks: a segment may start at p (p < L); a segment may end at p (1 <= p <= L)
    starts_ok = pos < lengths[None, :]
    act_mask = torch.where(starts_ok, 0.0, IMPOSSIBLE).to(dtype)
    end_mask = torch.where((pos >= 1) & (pos <= lengths[None, :]), 0.0, IMPOSSIBLE).to(dtype)
    # beta_t is a real message for t < L; at t = L it is 0 (the message is multiplied by cont)
    cont = starts_ok.to(dtype)
    cont_cols = cont.unsqueeze(2).unbind(0)
    # X'_t = pe_{t-1} + beta_t (X of docs/internals.md §3 without S_t, which enters as content);
    # x_add[t] = pe_{t-1} for 1 <= t <= L and IMPOSSIBLE past it, so X'_t is impossible there
    x_add = torch.zeros(span, B, C, dtype=dtype, device=device)
    if terms.pe is not None:
        n_pe = min(T, span - 1)
        x_add[1 : n_pe + 1] = terms.pe[:n_pe]
    x_add.masked_fill_((pos > lengths[None, :]).unsqueeze(2), IMPOSSIBLE)
    x_cols = x_add.unbind(0)

    # beta and v at every position (pre-shift) with their float64 frame
    beta_all = torch.zeros(span, B, C, dtype=dtype, device=device)
    v_all = torch.full((span, B, C), IMPOSSIBLE, dtype=dtype, device=device)
    frame_all = torch.zeros(span, B, dtype=torch.float64, device=device)

    p_start = torch.zeros(B, T, C, dtype=dtype, device=device)
    p_end = torch.zeros(B, T, C, dtype=dtype, device=device)
    p_start_t, p_end_t = p_start.transpose(0, 1), p_end.transpose(0, 1)
    g_tr = torch.zeros((B,) + tuple(transition.shape), dtype=torch.float64, device=device)
    g_db = torch.zeros(B, K, C, dtype=torch.float64, device=device)

    scan = _ForwardScan(transition, duration_bias, terms, K, "log", B)
    beta_next = torch.zeros(B, C, dtype=dtype, device=device)
    frame = torch.zeros(B, dtype=torch.float64, device=device)
    log_z = log_Z.to(device=device, dtype=torch.float64)
    # an infeasible sequence (log Z impossible) has no marginals: normalise it by 0 (every value
    # is then exp(IMPOSSIBLE) = 0) and zero it explicitly at the end
    ok = feasible(log_z)
    log_z = torch.where(ok, log_z, torch.zeros_like(log_z))
    carry = torch.full((K, B, C), IMPOSSIBLE, dtype=dtype, device=device)
    tr4 = transition[:, None] if direct else None  # (K, 1, C', C)

    n_ckpt = ring_checkpoints.shape[1]
    with torch.no_grad():
        for i in range(n_ckpt - 1, -1, -1):
            t0 = i * interval
            t1 = min(t0 + interval, t_max + 1)
            n = t1 - t0
            # ---- recompute alpha over positions t0 .. t1-1 from the checkpoint
            scan.load(t0, ring_checkpoints[:, i], log_norm_checkpoints[:, i])
            alpha_buf = cum_scores.new_empty(n, B, C)
            norm_buf = torch.empty(n, B, dtype=torch.float64, device=device)
            alpha_buf[0] = scan.alpha
            norm_buf[0] = scan.norm
            for j in range(n - 1):
                scan.step(t0 + j, out=alpha_buf[j + 1])
                norm_buf[j + 1] = scan.norm
            # ---- beta backward through the interval; xw[j] holds X at position t0+1+j
            xw = cum_scores.new_empty(n + K, B, C)
            xw[n : n + K] = carry
            for j in range(n - 1, -1, -1):
                p = t0 + j
                t = p + 1
                if t <= t_max:
                    torch.addcmul(x_cols[t], beta_next, cont_cols[t], out=xw[j])
                else:
                    xw[j] = IMPOSSIBLE
                window = xw[j : j + K] + terms.content_ahead(p)
                window += db  # row i <-> X'_{p+1+i} + S_{p+1+i} - S_p + D[i]
                if direct:
                    if terms.ps is not None:
                        window += terms.ps_cols[p]
                    torch.logsumexp(tr4 + window.unsqueeze(2), (0, 3), out=beta_all[p])
                else:
                    v = torch.logsumexp(window, 0, out=v_all[p])
                    if terms.ps is not None:
                        v += terms.ps_cols[p]
                    torch.logsumexp(transition + v.unsqueeze(1), 2, out=beta_all[p])
                frame_all[p] = frame
                beta_next = beta_all[p]
                if p % RENORM_EVERY == 0:
                    shift = _possible_shift(beta_next.amax(dim=1)) * cont[p]
                    beta_next = (beta_next - shift[:, None]).clamp_(min=IMPOSSIBLE)
                    torch.clamp(xw[j : j + K] - shift[:, None], min=IMPOSSIBLE, out=xw[j : j + K])
                    frame = frame + shift.double()
            carry = xw[:K].clone()
            # ---- every marginal of the interval at once
            sl = slice(t0, t1)
            base = (norm_buf + frame_all[sl] - log_z).to(dtype)  # (n, B)
            # P_end at positions t0..t1-1: alpha_t + beta_t (beta_L = 0 through cont)
            e_exp = alpha_buf + beta_all[sl] * cont[sl, :, None] + (norm_buf + frame_all[sl] * cont[sl] - log_z).to(dtype)[..., None]
            pe = torch.exp(e_exp + end_mask[sl, :, None])
            lo = max(t0, 1)
            if lo < t1:
                p_end_t[lo - 1 : t1 - 1] = pe[lo - t0 :]
            # X' and the content S_{p+k} - S_p at positions t0+1 .. t1+K-1, for the segment terms
            xs_sl = slice(t0 + 1, t1 + K)
            x_seg = x_add[xs_sl] + beta_all[xs_sl] * cont[xs_sl, :, None]
            f_seg = (frame_all[xs_sl] * cont[xs_sl]).to(dtype)
            s_seg = terms.s[xs_sl]
            s_here = terms.s[sl]
            ps_here = None if terms.ps is None else terms.ps[sl]
            if direct:
                _direct_interval_terms(
                    alpha_buf, norm_buf, x_seg, f_seg, s_seg, s_here, ps_here, act_mask[sl], log_z,
                    transition, duration_bias, K, p_start_t, g_tr, g_db, t0, T,
                )
            else:
                a_base = (norm_buf - log_z).to(dtype) + act_mask[sl]  # (n, B)
                v_base = v_all[sl] + (base + act_mask[sl])[..., None]
                _factored_interval_terms(
                    alpha_buf, a_base, v_base, x_seg, f_seg, s_seg, s_here, ps_here, transition, duration_bias,
                    K, p_start_t, g_tr, g_db, t0, T,
                )
    for t in (p_start, p_end, g_tr, g_db):
        zero_rows(t, ok)
    return p_start.to(out_dtype), p_end.to(out_dtype), g_tr.to(out_dtype), g_db.to(out_dtype)


def _blocks(n: int, per_row: int):
    """Split range(n) into blocks of at most _BLOCK_ELEMENTS elements (per_row elements a row)."""
    step = max(1, _BLOCK_ELEMENTS // max(1, per_row))
    for a in range(0, n, step):
        yield a, min(n, a + step)


def _windows(x: torch.Tensor, a: int, b: int, K: int) -> torch.Tensor:
    """(b-a, B, C, K) sliding windows: row p of x's rows p+1-a .. p+K-a, as a view."""
    return x[a : b + K - 1].unfold(0, K, 1)


def _content(s_seg, s_here, a, b, K):
    """(m, B, C, K): S_{p+k} - S_p for positions p in [a, b) of the interval, k = 1..K."""
    return _windows(s_seg, a, b, K) - s_here[a:b].unsqueeze(3)


def _factored_interval_terms(alpha_buf, a_base, v_base, x_seg, f_seg, s_seg, s_here, ps_here, transition, duration_bias, K, p_start_t, g_tr, g_db, t0, T):
    """P_start, P_trans and P_seg of one interval for the factored recurrence.

    alpha_buf (n, B, C) with a_base (n, B) = its frame - log Z (+ IMPOSSIBLE where no segment may
    start); v_base (n, B, C) = v + frames - log Z (+ the same mask); x_seg, f_seg, s_seg: X', its
    frame and S at positions t0+1 .. t1+K-1; s_here, ps_here: S and ps at the interval's positions.
    """
    n, B, C = alpha_buf.shape
    db_t = duration_bias.t()  # (C, K)
    for a, b in _blocks(n, B * C * max(C, K)):
        alpha = alpha_buf[a:b]
        u = torch.logsumexp(alpha.unsqueeze(3) + transition, 2)  # (m, B, C): u_p
        hi = min(t0 + b, T)
        if t0 + a < hi:
            p_start_t[t0 + a : hi] = torch.exp(u + v_base[a:b])[: hi - t0 - a]
        # P_trans(p, c', c) = exp(alpha_p(c') + Tr[c', c] + v_p(c) - log Z)
        e = alpha.unsqueeze(3) + transition + v_base[a:b].unsqueeze(2)  # (m, B, C', C)
        g_tr += torch.exp(e).sum(0, dtype=torch.float64)
        # P_seg(p, k, c) = exp(U_p(c) + S_{p+k}(c) - S_p(c) + D[k-1, c] + X'_{p+k}(c) - log Z)
        w = u + a_base[a:b, :, None]
        if ps_here is not None:
            w = w + ps_here[a:b]
        e = _content(s_seg, s_here, a, b, K) + _windows(x_seg, a, b, K)
        e += (w.unsqueeze(3) + db_t) + _windows(f_seg, a, b, K).unsqueeze(2)
        g_db += torch.exp(e).sum(0, dtype=torch.float64).transpose(1, 2)


def _direct_interval_terms(alpha_buf, norm_buf, x_seg, f_seg, s_seg, s_here, ps_here, act_mask, log_z, transition, duration_bias, K, p_start_t, g_tr, g_db, t0, T):
    """P_seg(p, k, c', c), and from it P_start and the shared gradients, for (K, C, C) transitions."""
    n, B, C = alpha_buf.shape
    dtype = alpha_buf.dtype
    a_base = (norm_buf - log_z).to(dtype) + act_mask  # (n, B)
    for a, b in _blocks(n, B * K * C * C):
        y = _content(s_seg, s_here, a, b, K) + _windows(x_seg, a, b, K)  # (m, B, C, K)
        y += _windows(f_seg, a, b, K).unsqueeze(2) + a_base[a:b, :, None, None]
        if ps_here is not None:
            y += ps_here[a:b].unsqueeze(3)
        y = y.permute(0, 1, 3, 2) + duration_bias  # (m, B, K, C)
        e = alpha_buf[a:b, :, None, :, None] + transition + y.unsqueeze(3)  # (m, B, K, C', C)
        prob = torch.exp(e)
        g_tr += prob.sum(0, dtype=torch.float64)
        g_db += prob.sum((0, 3), dtype=torch.float64)
        hi = min(t0 + b, T)
        if t0 + a < hi:
            p_start_t[t0 + a : hi] = prob.sum((2, 3))[: hi - t0 - a]
