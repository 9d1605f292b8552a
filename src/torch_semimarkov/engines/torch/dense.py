"""The float64 PyTorch model of a semi-CRF with masks (the ``backend="torch"`` path of everything
beyond the plain log Z): forward / backward messages in blocks of positions, the gradients of
log Z from them, the expectation recurrences of the entropy and cross-entropy, and the
backward sampling / k-best walk. On CUDA its block recurrences run the Triton kernels of
:mod:`torch_semimarkov.engines.triton.dense`.
"""

from __future__ import annotations

from typing import Optional
import math

import torch

from torch_semimarkov.core.constants import NEG_INF
from torch_semimarkov.core.masks import segment_limits
from torch_semimarkov.core.validation import StreamingInputs


_NEG = -math.inf


def _finite_or_zero(x: torch.Tensor) -> torch.Tensor:
    """``x`` with every infinite entry (an impossible normaliser) replaced by 0."""
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def _weighted(p: torch.Tensor, val: torch.Tensor) -> torch.Tensor:
    """``p * val`` that is 0 where the weight ``p`` is 0 (where ``val`` may be infinite)."""
    return torch.where(p > 0, p * val, torch.zeros_like(p))


def _expectation(w: torch.Tensor, val: torch.Tensor, dims) -> torch.Tensor:
    """``sum w val / sum w`` over ``dims``. The weights ``exp(x - lse)`` sum to 1 only up to the
    rounding of the log-sum-exp (about 1e-16 of its size, which grows with T); unnormalised, that
    error would multiply the expected score itself (the size of the whole prefix's score) at every
    step and add up along the sequence."""
    tot = w.sum(dims)
    return _weighted(w, val).sum(dims) / torch.where(tot > 0, tot, torch.ones_like(tot))


def _dense_kernels():
    """The Triton module of these recurrences, or None without Triton."""
    from torch_semimarkov.engines.triton import HAS_TRITON
    if not HAS_TRITON:
        return None
    from torch_semimarkov.engines.triton import dense
    return dense


def _forbid64(t: torch.Tensor) -> torch.Tensor:
    """float64 copy with every forbidden entry (<= NEG_INF, the engine's IMPOSSIBLE too) exactly -inf."""
    t = t.detach().to(torch.float64)
    return torch.where(t <= NEG_INF, torch.full_like(t, _NEG), t)


class _Model:
    """The model of one batch in the padded, float64 form every recurrence here uses.

    Position p lives at index ``p + K`` of the time axis (length ``T + 1 + 2K``), so that the K
    positions before 0 and after T can be sliced without bounds checks (they are never allowed).
    """

    def __init__(self, inp: StreamingInputs, label_mask=None, boundary_mask=None):
        S = inp.cum_scores.detach().to(torch.float64)
        B, T1, C = S.shape
        T, K = T1 - 1, inp.K
        dev = S.device
        self.B, self.T, self.C, self.K, self.device = B, T, C, K, dev
        self.lengths = inp.lengths
        self.t_max = int(inp.lengths.max())
        P = T1 + 2 * K
        self.S = torch.cat([S[:, :1].expand(B, K, C), S, S[:, -1:].expand(B, K, C)], 1)
        self.ps = S.new_zeros(B, P, C)  # indexed by a segment's start
        self.pe = S.new_zeros(B, P, C)  # indexed by a segment's end (exclusive): pe[e] = proj_end[e-1]
        if inp.proj_start is not None:
            self.ps[:, K:K + T] = _forbid64(inp.proj_start)
        if inp.proj_end is not None:
            self.pe[:, K + 1:K + 1 + T] = _forbid64(inp.proj_end)
        self.D = _forbid64(inp.duration_bias)  # (K, C)
        tr = _forbid64(inp.transition)
        self.direct = tr.dim() == 3
        self.tr = tr
        trk = tr.expand(K, C, C) if tr.dim() == 2 else tr
        # row C: the first segment's phantom predecessor, logsumexp_{c'} Tr[c', c]
        self.TrK = torch.cat([trk, torch.logsumexp(trk, 1, keepdim=True)], 1)  # (K, C+1, C)
        self.ks = torch.arange(1, K + 1, device=dev)
        pos = torch.arange(P, device=dev) - K
        L = inp.lengths[:, None]
        start_ok = (pos[None, :] >= 0) & (pos[None, :] < L)
        if boundary_mask is not None:
            start_ok[:, K:K + T] &= boundary_mask != -1
        end_ok = (pos[None, :] >= 1) & (pos[None, :] <= L)
        zero = S.new_zeros(())
        self.start_add = torch.where(start_ok, zero, S.new_full((), _NEG))  # (B, P)
        self.end_add = torch.where(end_ok, zero, S.new_full((), _NEG))
        # the smallest start of an allowed segment ending at e with label c (None: no masks)
        self.min_start = None
        if label_mask is not None or boundary_mask is not None:
            m = torch.zeros(B, P, C, dtype=torch.long, device=dev)
            m[:, K + 1:K + 1 + T] = segment_limits(label_mask, boundary_mask, B, T, C, K, dev)[0][:, 1:]
            self.min_start = m

    # ---------------------------------------------------------------- segment scores

    def seg_by_end(self, t: torch.Tensor) -> torch.Tensor:
        """(B, n, K, C): for each end t (n,), the score of the segment ``[t-k, t)`` with label c
        (row k-1), -inf where forbidden."""
        i = t + self.K
        s_idx = i[:, None] - self.ks  # (n, K)
        seg = self.S[:, i, None, :] - self.S[:, s_idx] + self.D + self.ps[:, s_idx] + self.pe[:, i, None, :]
        seg = seg + self.start_add[:, s_idx, None] + self.end_add[:, i, None, None]
        if self.min_start is not None:
            ok = (t[:, None] - self.ks)[None, :, :, None] >= self.min_start[:, i, None, :]
            seg = seg.masked_fill(~ok, _NEG)
        return seg

    def seg_by_start(self, s: torch.Tensor) -> torch.Tensor:
        """(B, n, K, C): for each start s (n,), the score of the segment ``[s, s+k)`` with label c
        (row k-1), -inf where forbidden."""
        i = s + self.K
        e_idx = i[:, None] + self.ks  # (n, K)
        seg = self.S[:, e_idx] - self.S[:, i, None, :] + self.D + self.ps[:, i, None, :] + self.pe[:, e_idx]
        seg = seg + self.start_add[:, i, None, None] + self.end_add[:, e_idx, None]
        if self.min_start is not None:
            seg = seg.masked_fill(s[None, :, None, None] < self.min_start[:, e_idx], _NEG)
        return seg

    def _block(self, per_position: int) -> int:
        """Positions per block so that a block tensor holds about 2^21 values (2^25 on a GPU,
        where each block costs kernel launches rather than arithmetic)."""
        budget = 1 << (25 if self.device.type == "cuda" else 21)
        return max(1, budget // max(1, self.B * per_position))

    def ends(self, reverse: bool = False):
        """(t, segments ending at t (B, K, C)) for t = 1 .. t_max, built in blocks of positions."""
        yield from self._scan(1, self.t_max + 1, self.seg_by_end, reverse)

    def starts(self, reverse: bool = True):
        """(s, segments starting at s (B, K, C)) for s = t_max .. 0 (descending by default)."""
        yield from self._scan(0, self.t_max + 1, self.seg_by_start, reverse)

    def _scan(self, lo, hi, build, reverse):
        n = self._block(self.K * self.C)
        firsts = range(lo, hi, n)
        for a in (reversed(firsts) if reverse else firsts):
            b = min(a + n, hi)
            block = build(torch.arange(a, b, device=self.device))
            for j in (range(b - a - 1, -1, -1) if reverse else range(b - a)):
                yield a + j, block[:, j]

    def walker_edges(self, b: torch.Tensor, t: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """(N, K, C+1): for N walkers (sequence b, end t, label c), the edges of every duration and
        predecessor label into the segment ``[t-k, t)`` with label c."""
        K = self.K
        i = t + K
        s_idx = i[:, None] - self.ks[None, :]  # (N, K)
        bb, cc = b[:, None], c[:, None]
        seg = (self.S[b, i, c][:, None] - self.S[bb, s_idx, cc] + self.D[:, c].t() + self.ps[bb, s_idx, cc]
               + self.pe[b, i, c][:, None] + self.start_add[bb, s_idx] + self.end_add[b, i][:, None])
        if self.min_start is not None:
            ok = (t[:, None] - self.ks[None, :]) >= self.min_start[b, i, c][:, None]
            seg = seg.masked_fill(~ok, _NEG)
        return seg[:, :, None] + self.TrK[:, :, c].permute(2, 0, 1)

    # ---------------------------------------------------------------- recurrences

    @property
    def use_kernels(self) -> bool:
        """CUDA tensors run the recurrences as Triton kernels (engines/triton/dense.py)."""
        return self.device.type == "cuda" and _dense_kernels() is not None

    def alpha(self) -> torch.Tensor:
        """(B, P, C+1) forward messages (log): alpha[:, p+K, c] sums every segmentation of 0..p
        whose last segment has label c; the start label C is 0 at position 0 only."""
        if self.use_kernels:
            return _dense_kernels().run_dense(self, "alpha")
        B, K, C = self.B, self.K, self.C
        A = self.S.new_full((B, self.T + 1 + 2 * K, C + 1), _NEG)
        A[:, K, C] = 0.0
        for t, seg in self.ends():
            prev = A[:, t:t + K].flip(1)  # (B, K, C+1): positions t-1 .. t-K
            A[:, t + K, :C] = torch.logsumexp((prev[..., None] + self.edges(seg)).flatten(1, 2), 1)
        return A

    def beta(self) -> torch.Tensor:
        """(B, P, C+1) backward messages: beta[:, p+K, c] sums every completion of a prefix whose
        last segment ends at p with label c (0 at each sequence's length); column C at 0 is log Z."""
        if self.use_kernels:
            return _dense_kernels().run_dense(self, "beta")
        B, K, C = self.B, self.K, self.C
        Bt = self.S.new_full((B, self.T + 1 + 2 * K, C + 1), _NEG)
        L = self.lengths
        for s, seg in self.starts():
            nxt = Bt[:, s + K + 1:s + 2 * K + 1, :C]  # (B, K, C): ends s+1 .. s+K
            val = torch.logsumexp((self.edges(seg) + nxt[:, :, None, :]).permute(0, 2, 1, 3).flatten(2), 2)
            Bt[:, s + K] = torch.where((L == s)[:, None], torch.zeros_like(val), val)
        return Bt

    def log_z(self, A: torch.Tensor) -> torch.Tensor:
        """(B,) log Z from the forward messages (-inf: no allowed segmentation)."""
        end = A[torch.arange(self.B, device=self.device), self.lengths + self.K, :self.C]
        return torch.logsumexp(end, 1)

    def edge_blocks(self, A, Bt, log_z, *extra):
        """Blocks of edges ending at t0 .. t1-1: yields ``(t0, t1, mu, e, gathered)`` with mu and e
        (B, n, K, C+1, C) (posterior probabilities and scores of the edges) and, for each tensor of
        ``extra`` laid out like A, its rows at the edges' starts (B, n, K, C+1)."""
        K, C = self.K, self.C
        safe = _finite_or_zero(log_z)[:, None, None, None, None]
        n = self._block(K * (C + 1) * C)
        for t0 in range(1, self.t_max + 1, n):
            t1 = min(t0 + n, self.t_max + 1)
            t = torch.arange(t0, t1, device=self.device)
            e = self.edges(self.seg_by_end(t))
            s_idx = (t + K)[:, None] - self.ks  # (n, K)
            x = A[:, s_idx][..., None] + e + Bt[:, t + K, None, None, :C]
            yield t0, t1, torch.exp(x - safe), e, [X[:, s_idx] for X in extra]

    def edges(self, seg: torch.Tensor) -> torch.Tensor:
        """(..., K, C+1, C): a segment score (..., K, C) plus the transition from each predecessor label."""
        return seg[..., None, :] + self.TrK


class _Grads:
    """Accumulates per-edge weights into gradients of the engine's inputs."""

    def __init__(self, model: _Model):
        self.m = model
        B, C, K = model.B, model.C, model.K
        P = model.T + 1 + 2 * K
        z = model.S.new_zeros
        self.gS = z(B, P, C)
        self.gps = z(B, P, C)
        self.gpe = z(B, P, C)
        self.gD = z(K, C)
        self.gTr = z(K, C + 1, C)

    def add(self, G: torch.Tensor, t0: int) -> None:
        """G (B, n, K, C+1, C): weights of the edges ending at t0 .. t0+n-1."""
        self.add_segments(G.sum(3), t0)
        self.gTr += G.sum((0, 1))

    def add_segments(self, g: torch.Tensor, t0: int) -> None:
        """g (B, n, K, C): weights of the segments ending at t0 .. t0+n-1 (summed over predecessors)."""
        B, n, K, C = g.shape[0], g.shape[1], self.m.K, self.m.C
        total = g.sum(2)
        self.gS[:, t0 + K:t0 + K + n] += total
        self.gpe[:, t0 + K:t0 + K + n] += total
        # a segment ending at t with duration k starts at t-k
        idx = ((torch.arange(t0, t0 + n, device=g.device) + K)[:, None] - self.m.ks).reshape(-1)
        flat = g.reshape(B, n * K, C)
        self.gS.index_add_(1, idx, -flat)
        self.gps.index_add_(1, idx, flat)
        self.gD += g.sum((0, 1))

    def result(self, inp: StreamingInputs, scored: Optional[_Model] = None):
        """Gradients (cum_scores, transition, duration_bias, proj_start, proj_end) in the dtypes of
        ``inp``. The first segment's phantom term is differentiated with the transition of
        ``scored`` (default: the model whose edges were accumulated): the weights may come from one
        model and the scores they weigh from another (a cross-entropy)."""
        m, K, T, C = self.m, self.m.K, self.m.T, self.m.C
        g_cum = self.gS[:, K:K + T + 1]
        tr = (scored or m).tr
        trk = tr.expand(K, C, C) if tr.dim() == 2 else tr
        # the phantom row: d logsumexp_{c'} Tr[c', c] / d Tr[c', c] = softmax over c'
        soft = torch.nan_to_num(torch.softmax(trk, 1), nan=0.0)
        g_tr = self.gTr[:, :C] + self.gTr[:, C:] * soft
        if tr.dim() == 2:
            g_tr = g_tr.sum(0)
        dt = inp.cum_scores.dtype
        g_ps = None if inp.proj_start is None else self.gps[:, K:K + T].to(dt)
        g_pe = None if inp.proj_end is None else self.gpe[:, K + 1:K + 1 + T].to(dt)
        return g_cum.to(dt), g_tr.to(inp.transition.dtype), self.gD.to(inp.duration_bias.dtype), g_ps, g_pe


def _edge_gradients(model: _Model, A, Bt, log_z, weight, entropy=None, values: Optional[_Model] = None) -> "_Grads":
    """Gradients of ``sum_b weight[b] * f_b`` with f = log Z (``entropy`` None: every edge weighs
    its posterior probability mu) or f = H (``entropy = (Ea, Eb, E[score])``: an edge weighs
    ``-mu (E[score | edge] - E[score])``), accumulated a block of positions at a time. With
    ``values`` (a second model over the same positions), the scores inside the expectations are
    that model's: f = -E_p[score_q], the cross-entropy's term (p = ``model``, q = ``values``).

    A (C, C) transition takes the factored route: the predecessor label enters only through
    ``U_s(c) = lse_c' alpha_s(c') + Tr[c', c]`` and the successor only through
    ``V_s(c) = lse_k seg + beta_{s+k}(c)``, so the segment terms cost O(K·C) a position and the
    transition terms O(C²), never O(K·C²).
    """
    acc = _Grads(model)
    ok = torch.isfinite(log_z)
    w = torch.where(ok, weight.detach().to(torch.float64), torch.zeros_like(log_z))
    safe = _finite_or_zero(log_z)
    K, C = model.K, model.C
    values = values or model
    if model.direct:
        if entropy is None:
            for t0, _, mu, _, _ in model.edge_blocks(A, Bt, log_z):
                acc.add(mu * w[:, None, None, None, None], t0)
        else:
            Ea, Eb, expected = entropy
            for t0, t1, mu, e, (ea,) in model.edge_blocks(A, Bt, log_z, Ea):
                if values is not model:
                    e = values.edges(values.seg_by_end(torch.arange(t0, t1, device=model.device)))
                # dH/d(edge) = -mu (E[score | edge] - E[score]), E[score | edge] = Ea + edge + Eb
                cond = ea[..., None] + e + Eb[:, t0 + K:t1 + K, None, None, :C]
                g = _weighted(mu, -(cond - expected[:, None, None, None, None]))
                acc.add(g * w[:, None, None, None, None], t0)
        return acc
    tr = model.TrK[0]  # (C+1, C), the last row the phantom one
    tr_val = values.TrK[0]
    rows = model.t_max + 1  # rows K .. K + t_max: positions 0 .. t_max
    U = A.new_full((model.B, A.shape[1], C), _NEG)
    EU = A.new_zeros(model.B, A.shape[1], C)
    V = A.new_full((model.B, A.shape[1], C), _NEG)
    EV = A.new_zeros(model.B, A.shape[1], C)
    n_tr = model._block((C + 1) * C)
    for r0 in range(K, K + rows, n_tr):
        r1 = min(r0 + n_tr, K + rows)
        x = A[:, r0:r1, :, None] + tr  # (B, n, C+1, C)
        U[:, r0:r1] = torch.logsumexp(x, 2)
        if entropy is not None:
            p = torch.exp(x - _finite_or_zero(U[:, r0:r1])[:, :, None, :])
            EU[:, r0:r1] = _expectation(p, entropy[0][:, r0:r1, :, None] + tr_val, 2)
    n_seg = model._block(K * C)
    for s0 in range(0, model.t_max, n_seg):
        s1 = min(s0 + n_seg, model.t_max)
        srange = torch.arange(s0, s1, device=model.device)
        seg = model.seg_by_start(srange)  # (B, n, K, C)
        e_idx = (srange + K)[:, None] + model.ks  # (n, K)
        y = seg + Bt[:, e_idx, :C]
        V[:, s0 + K:s1 + K] = torch.logsumexp(y, 2)
        if entropy is not None:
            q = torch.exp(y - _finite_or_zero(V[:, s0 + K:s1 + K])[:, :, None, :])
            seg_val = seg if values is model else values.seg_by_start(srange)
            EV[:, s0 + K:s1 + K] = _expectation(q, seg_val + entropy[1][:, e_idx, :C], 2)
    wb = w[:, None, None, None]
    for t0 in range(1, model.t_max + 1, n_seg):
        t1 = min(t0 + n_seg, model.t_max + 1)
        t = torch.arange(t0, t1, device=model.device)
        seg = model.seg_by_end(t)  # (B, n, K, C)
        s_idx = (t + K)[:, None] - model.ks
        mu = torch.exp(U[:, s_idx] + seg + Bt[:, t + K, None, :C] - safe[:, None, None, None])
        if entropy is None:
            acc.add_segments(mu * wb, t0)
        else:
            seg_val = seg if values is model else values.seg_by_end(t)
            cond = EU[:, s_idx] + seg_val + entropy[1][:, t + K, None, :C] - entropy[2][:, None, None, None]
            acc.add_segments(_weighted(mu, -cond) * wb, t0)
    for r0 in range(K, K + model.t_max, n_tr):
        r1 = min(r0 + n_tr, K + model.t_max)
        mu = torch.exp(A[:, r0:r1, :, None] + tr + V[:, r0:r1, None, :] - safe[:, None, None, None])
        if entropy is None:
            acc.gTr[0] += (mu * wb).sum((0, 1))
        else:
            cond = (entropy[0][:, r0:r1, :, None] + tr_val + EV[:, r0:r1, None, :]
                    - entropy[2][:, None, None, None])
            acc.gTr[0] += (_weighted(mu, -cond) * wb).sum((0, 1))
    return acc


def _paired(model: _Model, values: Optional[_Model], steps):
    """``(t, seg, seg of values)`` for each ``(t, seg)`` of ``steps(model)``: the segment scores of
    both models at the same positions (the same block sizes, so the two scans stay in step)."""
    if values is None or values is model:
        for t, seg in steps(model):
            yield t, seg, seg
        return
    for (t, seg), (_, val) in zip(steps(model), steps(values)):
        yield t, seg, val


def _expected_prefix(model: _Model, A: torch.Tensor, values: Optional[_Model] = None) -> torch.Tensor:
    """(B, P, C+1): the expected score of the prefix given that its last segment ends at p with
    label c, under the prefix distribution proportional to exp(alpha). With ``values``, the
    expected score under that model's scores (the weights stay ``model``'s)."""
    B, K, C = model.B, model.K, model.C
    Ea = model.S.new_zeros(B, model.T + 1 + 2 * K, C + 1)
    for t, seg, val in _paired(model, values, lambda m: m.ends()):
        e = model.edges(seg)
        x = A[:, t:t + K].flip(1)[..., None] + e  # (B, K, C+1, C)
        w = torch.exp(x - _finite_or_zero(A[:, t + K, None, None, :C]))
        e_val = e if val is seg else values.edges(val)
        Ea[:, t + K, :C] = _expectation(w, Ea[:, t:t + K].flip(1)[..., None] + e_val, (1, 2))
    return Ea


def _expected_suffix(model: _Model, Bt: torch.Tensor, values: Optional[_Model] = None) -> torch.Tensor:
    """(B, P, C+1): the expected score of the completion of a prefix ending at p with label c
    (with ``values``: that model's scores, ``model``'s weights)."""
    B, K, C = model.B, model.K, model.C
    Eb = model.S.new_zeros(B, model.T + 1 + 2 * K, C + 1)
    L = model.lengths
    for s, seg, val in _paired(model, values, lambda m: m.starts()):
        if s == model.t_max:
            continue
        e = model.edges(seg)  # (B, K, C+1, C): ends s+1 .. s+K
        nxt = Bt[:, s + K + 1:s + 2 * K + 1, None, :C]
        # the predecessor label's beta, (B, 1, C+1, 1)
        v = torch.exp(e + nxt - _finite_or_zero(Bt[:, s + K][:, None, :, None]))
        e_val = e if val is seg else values.edges(val)
        tot = _expectation(v, e_val + Eb[:, s + K + 1:s + 2 * K + 1, None, :C], (1, 3))
        Eb[:, s + K] = torch.where((L == s)[:, None], torch.zeros_like(tot), tot)
    return Eb


def _messages_and_expected(model: _Model, direction: str):
    """The messages of one direction and their expected scores, in one kernel on CUDA:
    ``"alpha"``: (alpha, :func:`_expected_prefix`); ``"beta"``: (beta, :func:`_expected_suffix`)."""
    if model.use_kernels:
        return _dense_kernels().run_dense(model, direction, expect=True)
    messages = model.alpha() if direction == "alpha" else model.beta()
    expected = _expected_prefix if direction == "alpha" else _expected_suffix
    return messages, expected(model, messages)


def _expected_score(model: _Model, A: torch.Tensor, Ea: torch.Tensor):
    """(log Z, E[score]) (B,) from the forward messages and the expected prefix scores
    (:func:`_expected_prefix`): the expectation over the last label at each sequence's end."""
    log_z = model.log_z(A)
    idx = torch.arange(model.B, device=model.device)
    end = A[idx, model.lengths + model.K, :model.C]
    p_last = torch.exp(end - _finite_or_zero(log_z)[:, None])
    return log_z, _expectation(p_last, Ea[idx, model.lengths + model.K, :model.C], 1)


def _walk(model: _Model, b, t, c, choose):
    """Trace N walkers back from (sequence b, end t, label c) to position 0.

    ``choose(walkers, their ends, their labels, edges (n, K, C+1)) -> flat index into (K, C+1)``
    picks each walker's previous segment. Returns labels (N, T), start flags (N, T) and each walker's summed edge score (N,).
    Walkers with t = 0 are finished from the start (no segmentation).
    """
    N, T, C = b.shape[0], model.T, model.C
    dev = model.device
    start_label = torch.full((N, T + 1), -1, dtype=torch.long, device=dev)
    flags = torch.zeros(N, T + 1, dtype=torch.bool, device=dev)
    score = model.S.new_zeros(N)
    t, c = t.clone(), c.clone()
    active = (t > 0).nonzero().reshape(-1)
    while active.numel():
        ba, ta, ca = b[active], t[active], c[active]
        e = model.walker_edges(ba, ta, ca)  # (n, K, C+1)
        idx = choose(active, ta, ca, e)
        k = idx // (C + 1) + 1
        prev = idx % (C + 1)
        s = ta - k
        score[active] += e.reshape(e.shape[0], -1).gather(1, idx[:, None]).squeeze(1)
        flags[active, s] = True
        start_label[active, s] = ca
        t[active] = s
        c[active] = prev
        active = active[s > 0]
    # each position takes the label of the last segment start at or before it
    pos = torch.arange(T + 1, device=dev)[None, :]
    last = torch.cummax(torch.where(flags, pos, torch.zeros_like(pos)), 1).values
    labels = start_label.gather(1, last)[:, :T]
    return labels, flags[:, :T], score


def _fill_past_length(labels, lengths):
    T = labels.shape[-1]
    past = torch.arange(T, device=labels.device) >= lengths[..., None]
    return labels.masked_fill(past, -1)


def _inverse_cdf(z: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """(n,) indices drawn from the weights ``exp(z)`` (n, m) by the uniforms u (n,): the first index
    whose running sum of ``exp(z - max z)`` exceeds u times the total (the last index of positive
    weight when rounding leaves none), as the compiled engine's walk draws."""
    m = z.max(1, keepdim=True).values
    p = torch.where(z > _NEG, torch.exp(z - _finite_or_zero(m)), torch.zeros_like(z))
    cs = p.cumsum(1)
    idx = torch.arange(z.shape[1], device=z.device).expand_as(z)
    big = z.shape[1]
    first = torch.where((p > 0) & (cs > (u * cs[:, -1])[:, None]), idx, big).min(1).values
    last = torch.where(p > 0, idx, -1).max(1).values.clamp(min=0)
    return torch.where(first < big, first, last)


class ConstrainedLogZ(torch.autograd.Function):
    """log Z of the segmentations the masks allow, on this model; the backward is its forward-backward
    edge gradients (:func:`_edge_gradients`)."""

    @staticmethod
    def forward(ctx, cum_scores, transition, duration_bias, proj_start, proj_end, inp, label_mask, boundary_mask):
        model = _Model(inp, label_mask, boundary_mask)
        A = model.alpha()
        log_z = model.log_z(A)
        ctx.stash = (model, A, log_z, inp)
        return log_z.to(inp.cum_scores.dtype)

    @staticmethod
    def backward(ctx, grad):
        model, A, log_z, inp = ctx.stash
        Bt = model.beta()
        return _edge_gradients(model, A, Bt, log_z, grad).result(inp) + (None, None, None)


def dense_marginals(inp, label_mask, boundary_mask):
    """(log Z (B,), P_start (B, T, C), P_end (B, T, C)) of the segmentations the masks allow."""
    model = _Model(inp, label_mask, boundary_mask)
    A = model.alpha()
    log_z = model.log_z(A)
    Bt = model.beta()
    acc = _edge_gradients(model, A, Bt, log_z, torch.ones_like(log_z))
    K, T = model.K, model.T
    dt = inp.cum_scores.dtype
    return log_z.to(dt), acc.gps[:, K:K + T].to(dt), acc.gpe[:, K + 1:K + 1 + T].to(dt)


def dense_topk(model: "_Model", k: int):
    """The k best segmentations of the model (ties toward the smaller flat index, as the engines):
    ``(scores (B, k) float64, labels (B, k, T), starts (B, k, T))``; a missing rank has score
    ``-inf`` and labels -1."""
    B, C, Kd, T = model.B, model.C, model.K, model.T
    dev = model.device
    P = T + 1 + 2 * Kd
    # V[:, p+K, c, r]: the r-th best prefix score ending at p with label c; bp its origin,
    # a flat index into (duration, predecessor label, predecessor rank)
    V = model.S.new_full((B, P, C + 1, k), _NEG)
    V[:, Kd, C, 0] = 0.0
    bp = torch.zeros(B, P, C, k, dtype=torch.long, device=dev)
    n_pairs = Kd * (C + 1)
    kp = min(k, n_pairs)
    for t, seg in model.ends():
        e = model.edges(seg).reshape(B, n_pairs, C).transpose(1, 2)  # (B, C, pairs)
        prev = V[:, t:t + Kd].flip(1).reshape(B, n_pairs, k)  # each pair's list, sorted
        # the k best candidates all come from the k pairs (duration, predecessor label) with the
        # best first entries (ties toward the smaller pair): select those, then sort their k·k
        # candidates in (pair, rank) order, so that a stable sort breaks ties by flat index
        heads = prev[:, None, :, 0] + e  # (B, C, pairs)
        pairs = torch.sort(heads, dim=2, descending=True, stable=True).indices[:, :, :kp]
        pairs = torch.sort(pairs, dim=2).values
        lists = prev[:, None].expand(B, C, n_pairs, k).gather(2, pairs[..., None].expand(B, C, kp, k))
        cand = (lists + e.gather(2, pairs)[..., None]).reshape(B, C, kp * k)
        vals, order = torch.sort(cand, dim=2, descending=True, stable=True)
        flat = pairs.gather(2, order // k) * k + order % k  # index into (pair, rank)
        V[:, t + Kd, :C] = vals[:, :, :k]  # kp·k >= k candidates
        bp[:, t + Kd] = flat[:, :, :k]
    idx = torch.arange(B, device=dev)
    final = V[idx, model.lengths + Kd, :C].reshape(B, C * k)  # order (label, rank)
    fvals, forder = torch.sort(final, dim=1, descending=True, stable=True)
    n = min(k, C * k)
    scores = fvals[:, :n]
    c_last = forder[:, :n] // k
    r_last = forder[:, :n] % k
    # trace B*k walkers; a missing rank (score -inf) has no segmentation
    b = idx.repeat_interleave(k)
    ok = torch.isfinite(scores.reshape(-1))
    L = model.lengths[b]
    t0 = torch.where(ok, L, torch.zeros_like(L))
    rank = r_last.reshape(-1).clone()

    def choose(active, ta, ca, e):
        flat = bp[b[active], ta + Kd, ca, rank[active]]
        dur = flat // ((C + 1) * k) + 1
        rem = flat % ((C + 1) * k)
        rank[active] = rem % k
        return (dur - 1) * (C + 1) + rem // k

    labels, flags, _ = _walk(model, b, t0, c_last.reshape(-1), choose)
    labels = _fill_past_length(labels, L).masked_fill(~ok[:, None], -1)
    flags = flags & ok[:, None]
    return scores, labels.reshape(B, k, T), flags.reshape(B, k, T)
