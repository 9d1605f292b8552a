"""Beyond the best path: k-best lists, exact samples, entropy and partial labels.

Every function here works on the inputs of :func:`~torch_semimarkov.semi_crf_streaming_forward`
(``cum_scores`` (B, T+1, C), a (C, C) or (K, C, C) ``transition``, ``duration_bias`` (K, C),
``lengths``, ``K``, optional boundary scores) and never forms the (T, K, C, C) edge tensor: each
step builds the (B, K, C+1, C) block of the segments that end (or start) at one position, uses it,
and drops it. The recurrences keep one row of messages per position (O(T·C) memory, the size of
the inputs; O(T·C·k) for a k-best list), never anything of size K·C² per position.

The PyTorch path runs on any device, one position per step (a Python loop over T), in float64;
it is exact and the reference the kernels are tested against. On CUDA tensors with a (C, C)
transition four things run on the engine instead: sampling (its forward, then the chunked walk
of ``kernels/traceback.py``), k-best lists without masks (sidetracks over its Viterbi,
:mod:`.kbest`), the masks of log Z, its gradients, Viterbi and marginals (the
time-parallel kernels read them as per-(position, label) segment limits and per-position flags,
``kernels/limits.py``), and the entropy's value when no gradient is asked for (one forward +
backward, ``E[score]`` from the marginals).

Conventions (identical to the engine and to :mod:`torch_semimarkov.oracle`): a segment
``[s, s+k)`` with label c after one with label c' scores

    S[s+k, c] - S[s, c] + D[k-1, c] + ps[s, c] + pe[s+k-1, c] + Tr[c', c]

and the first segment replaces ``Tr[c', c]`` by ``logsumexp_{c'} Tr[c', c]`` (its predecessor is
marginalised). Here that predecessor is an extra label, index C, that exists only at position 0:
every recurrence runs over C+1 predecessor labels and the "start" label ends each traceback.

Partial labels and constraints (``label_mask``, ``boundary_mask``) become, per sequence, end
position and label, the smallest start a segment may have: a segment ``[s, e)`` with label c is
allowed iff every position of it allows c and no forced boundary lies strictly inside it; and a
segment may not start where ``boundary_mask`` is -1.
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch

from torch_semimarkov.engines.interface import scale_grads
from torch_semimarkov.engines.select import numba_engine, numba_module, resolve_backend
from torch_semimarkov.core.constants import NEG_INF
from torch_semimarkov.core.segments import Segment, SegmentTensorsMixin, segment_tensors
from torch_semimarkov.core.signature import keyword_options
from torch_semimarkov.core.validation import (BOUNDARY_VALUES, StreamingInputs, check_input_values, debug_checks,
                         validate_streaming_inputs)

__all__ = [
    "SegmentationSamples",
    "TopKResult",
    "check_masks",
    "constrained_log_partition",
    "semi_crf_streaming_entropy",
    "semi_crf_streaming_sample",
    "semi_crf_streaming_topk",
]

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


def check_masks(label_mask, boundary_mask, B: int, T: int, C: int, device,
                check_values: bool = True) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Validate ``label_mask`` (B, T, C) bool and ``boundary_mask`` (B, T) in {-1, 0, 1}.

    Returns them on ``device`` (bool and int8), or None where not given. Raises ``ValueError`` (or
    ``TypeError``) naming the argument. ``check_values=False`` leaves the values of
    ``boundary_mask`` to the caller (``check_input_values`` reads them with the other inputs').
    """
    if label_mask is not None:
        if not isinstance(label_mask, torch.Tensor):
            raise TypeError(f"label_mask must be a bool tensor (B, T, C), got {type(label_mask).__name__}")
        if label_mask.dtype != torch.bool:
            raise ValueError(f"label_mask must be a bool tensor (True: the label is allowed there), got {label_mask.dtype}")
        if tuple(label_mask.shape) != (B, T, C):
            raise ValueError(f"label_mask must have shape (batch, T, C) = ({B}, {T}, {C}), got {tuple(label_mask.shape)}")
        label_mask = label_mask.to(device)
    if boundary_mask is not None:
        if not isinstance(boundary_mask, torch.Tensor):
            raise TypeError(f"boundary_mask must be an integer tensor (B, T), got {type(boundary_mask).__name__}")
        if boundary_mask.dtype.is_floating_point or boundary_mask.dtype == torch.bool:
            raise ValueError(
                "boundary_mask must be an integer tensor with values -1 (no segment starts here), 0 (free) or "
                f"1 (a segment starts here), got {boundary_mask.dtype}")
        if tuple(boundary_mask.shape) != (B, T):
            raise ValueError(f"boundary_mask must have shape (batch, T) = ({B}, {T}), got {tuple(boundary_mask.shape)}")
        if check_values and boundary_mask.numel() and bool(((boundary_mask < -1) | (boundary_mask > 1)).any()):
            raise ValueError(BOUNDARY_VALUES)
        boundary_mask = boundary_mask.to(device=device, dtype=torch.int8)
    return label_mask, boundary_mask


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
        """CUDA tensors run the recurrences as Triton kernels (kernels/dense.py)."""
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


def _validated(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, label_mask,
               boundary_mask, validate=True, backend="auto", use_triton=True):
    """``(inputs, label_mask, boundary_mask, engine)``: the checked inputs and masks, and whether
    the call may (``"may"``) or must (``"must"``) run on the engine's kernels, or not (``"no"``)."""
    inp = validate_streaming_inputs(cum_scores, transition, duration_bias, lengths, K, "log", proj_start, proj_end,
                                    check_values=False)
    engine = engine_choice(inp, backend, use_triton)
    lm, bm = check_masks(label_mask, boundary_mask, inp.batch, inp.T, inp.C, inp.cum_scores.device,
                         check_values=False)
    if validate or debug_checks():
        # one device-to-host transfer for the values of the inputs and of the boundary mask
        check_input_values(cum_scores, transition, duration_bias, inp.lengths, proj_start, proj_end, bm)
    return inp, lm, bm, engine


def engine_choice(inp: StreamingInputs, backend: str = "auto", use_triton: bool = True) -> str:
    """Whether a call beyond the plain log Z / Viterbi / marginals (masks, k-best, samples,
    entropy) runs on the engine's kernels: ``"must"`` (``backend="triton"``: it raises where they
    cannot take the call), ``"may"`` (``"auto"``: where they can, else the float64 PyTorch path) or
    ``"no"`` (``"torch"``, and ``"numba"``, whose compiled engine runs log Z, its gradients,
    Viterbi and marginals: the rest takes the float64 PyTorch path on the CPU)."""
    if backend == "triton" and ENGINE_ON_CPU and not inp.cum_scores.is_cuda:
        name = "triton"  # tests: the engine's kernels in Triton's interpreter
    else:
        name = resolve_backend(backend, bool(use_triton), inp.cum_scores.is_cuda, _triton_loads)
    if name != "triton" and backend != "auto":
        return "no"
    if backend == "auto":
        return "may" if use_triton else "no"
    if not _engine_takes(inp):
        raise ValueError("backend='triton' runs masks, k-best lists, samples and the entropy on a (C, C) transition "
                         "only; use backend='auto' or 'torch' for a (K, C, C) transition")
    return "must"


def _cpu_engine(inp: StreamingInputs, backend: str = "auto"):
    """The compiled CPU engine (:mod:`torch_semimarkov.engines.numba.engine`) when a call beyond the plain log Z runs on
    it, else None: CPU tensors, ``backend="numba"``, or ``"auto"`` with numba importable (and
    :data:`ENGINE_ON_CPU` off: with it, tests send CPU tensors to the Triton kernels)."""
    if inp.cum_scores.is_cuda or backend not in ("auto", "numba") or (backend == "auto" and ENGINE_ON_CPU):
        return None
    return numba_engine() or None


def _cpu_limits(inp: StreamingInputs, lm, bm):
    """The masks as the compiled engine's segment limits ``(min_start, max_end, forbidden_start)``
    (None without masks)."""
    if lm is None and bm is None:
        return None
    return segment_limits(lm, bm, inp.batch, inp.T, inp.C, inp.K, inp.cum_scores.device)


def _triton_loads() -> bool:
    from torch_semimarkov.engines.triton import HAS_TRITON
    return bool(HAS_TRITON)


def _refuse(engine: str, what: str) -> None:
    """A ``backend="triton"`` call that the engine cannot take raises instead of falling back."""
    if engine == "must":
        raise ValueError(f"backend='triton' cannot run {what} on the engine's kernels (the ring of K·C "
                         "values does not fit the masked kernels); use backend='auto' or 'torch'")


# ---------------------------------------------------------------------- masks on the engine

#: Run the engine's kernels (sampling walk, constrained recurrences) on CPU tensors too (tests,
#: under ``TRITON_INTERPRET=1``).
ENGINE_ON_CPU = False


def _block_scan(x: torch.Tensor, K: int, fill: int, reverse: bool) -> torch.Tensor:
    """Running max (``reverse``: running min from the right) of ``x`` (B, T, ...) along time,
    exact wherever it differs from ``fill`` within K positions: blocks of K' >= K positions are
    scanned on their own (K' sequential steps, every block and column in parallel) and then take
    the neighbouring block's total. ``torch.cummax`` over the whole axis would run T dependent
    steps per column, slow on the GPU when T is long and B·C small."""
    B, T = x.shape[:2]
    blk = max(int(K), 32)
    n = -(-T // blk)
    pad = n * blk - T
    if reverse:
        x = torch.flip(x, (1,))
    if pad:
        x = torch.cat([x, x.new_full((B, pad) + x.shape[2:], fill)], 1)
    y = x.view((B, n, blk) + x.shape[2:])
    inner = (torch.cummin(y, 2) if reverse else torch.cummax(y, 2)).values
    prev = torch.cat([inner.new_full((B, 1) + inner.shape[3:], fill), inner[:, :-1, -1]], 1)
    out = (torch.minimum if reverse else torch.maximum)(inner, prev[:, :, None])
    out = out.reshape((B, n * blk) + x.shape[2:])[:, :T]
    return torch.flip(out, (1,)) if reverse else out


def segment_limits(label_mask, boundary_mask, B: int, T: int, C: int, K: int, device):
    """The masks as per-(position, label) limits of the allowed segments (the PyTorch path's
    form; the engine's kernels read the same limits from :func:`~.kernels.limits.engine_limits`,
    one kernel with per-position flags): a segment ``[s, e)`` of label c with ``e - s <= K`` is allowed iff
    ``min_start[e, c] <= s`` (equivalently ``e <= max_end[s, c]``) and ``s`` is not a forbidden
    start. (The limits are exact within K positions of their index; farther values only ever
    concern segments longer than K.)

    Returns ``(min_start, max_end)`` (B, T+1, C) int32 and ``forbidden_start`` (B, T) bool or None.
    """
    ms = torch.zeros(B, T + 1, C, dtype=torch.int32, device=device)
    me = torch.full((B, T + 1, C), T, dtype=torch.int32, device=device)
    pos = torch.arange(T, device=device, dtype=torch.int32)
    if label_mask is not None:
        # end e: one past the last forbidden position before e; start s: the first forbidden one at or after s
        ms[:, 1:] = _block_scan(torch.where(label_mask, 0, pos[None, :, None] + 1), K, 0, False)
        me[:, :T] = _block_scan(torch.where(label_mask, T, pos[None, :, None]), K, T, True)
    forbidden = None
    if boundary_mask is not None:
        forced = boundary_mask == 1
        # no segment may straddle a forced start: end e starts at or after the last one before e,
        # start s ends at or before the first one after s
        last = _block_scan(torch.where(forced, pos[None, :], 0), K, 0, False)
        ms[:, 1:] = torch.maximum(ms[:, 1:], last[..., None])
        first = _block_scan(torch.where(forced, pos[None, :], T), K, T, True)
        after = torch.cat([first[:, 1:], torch.full_like(first[:, :1], T)], 1)
        me[:, :T] = torch.minimum(me[:, :T], after[..., None])
        forbidden = boundary_mask == -1
    return ms, me, forbidden


def _engine_masks(inp: StreamingInputs, lm, bm, semiring: str = "log", engine: str = "may", blocked: bool = True):
    """``(plan, (min_start, max_end, flags), proj_start)`` of a constrained call on the engine
    (CUDA tensors, a (C, C) transition; a ring too large for registers runs the blocked engine
    unless ``blocked=False``), or None (the PyTorch path). The limits and flags come from one
    kernel (``kernels/limits.py``); forbidden starts are one of the flags."""
    if (lm is None and bm is None) or engine == "no" or not _engine_takes(inp):
        return None
    from torch_semimarkov.engines.triton.limits import engine_limits
    from torch_semimarkov.engines.triton.plan import masked_plan
    plan = masked_plan(inp.batch, inp.T, inp.K, inp.C, semiring=semiring, device=inp.cum_scores.device,
                       blocked=blocked)
    if plan is None:
        _refuse(engine, "these masks")
        return None
    masks = engine_limits(lm, bm, inp.batch, inp.T, inp.C, inp.K, inp.cum_scores.device)
    return plan, masks, inp.proj_start


class _EngineConstrainedLogZ(torch.autograd.Function):
    """log Z of the allowed segmentations on the engine; the backward is the engine's own."""

    @staticmethod
    def forward(ctx, cum_scores, transition, duration_bias, proj_start, proj_end, inp, engine):
        from torch_semimarkov.engines.triton import launch
        plan, masks, ps = engine
        d = lambda t: None if t is None else t.detach()  # noqa: E731
        args = (d(cum_scores), d(transition), d(duration_bias), inp.lengths, inp.K)
        log_z, state = launch.launch_forward(*args, "log", d(ps), d(proj_end), plan=plan, masks=masks)
        ctx.stash = (args, d(ps), d(proj_end), plan, masks, state, proj_start is not None, proj_end is not None)
        return log_z.to(inp.cum_scores.dtype)

    @staticmethod
    def backward(ctx, grad):
        from torch_semimarkov.engines.triton import launch
        args, ps, pe, plan, masks, state, has_ps, has_pe = ctx.stash
        marg = launch.launch_backward(*args, ps, pe, plan=plan, state=state, masks=masks)
        return _engine_input_grads(ctx, args[0], grad, marg, has_ps, has_pe)


def _engine_input_grads(ctx, cum_scores, grad, marginals, has_ps, has_pe):
    """The gradients of an engine autograd Function whose inputs are ``(cum_scores, transition,
    duration_bias, proj_start, proj_end, inp, engine)``: log Z's gradient map (``scale_grads``)
    applied to the engine's marginals ``(p_start, p_end, g_tr, g_db)`` (or any weighted
    marginals) times ``grad``, whose non-finite entries count as 0."""
    need = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2],
            has_ps and ctx.needs_input_grad[3], has_pe and ctx.needs_input_grad[4])
    grad = torch.where(torch.isfinite(grad), grad, torch.zeros_like(grad))
    return scale_grads(cum_scores, need, grad, *marginals) + (None, None)


def masked_viterbi_on_engine(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, label_mask,
                             boundary_mask, validate=True, backend="auto", use_triton=True):
    """``(scores, labels, starts, lengths)`` of the best allowed segmentations on the engine, or
    None where the engine cannot take the masks (then :func:`semi_crf_streaming_topk` with k = 1)."""
    inp, lm, bm, choice = _validated(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end,
                                     label_mask, boundary_mask, validate, backend, use_triton)
    eng = _cpu_engine(inp, backend)
    if eng is not None:
        d = lambda t: None if t is None else t.detach()  # noqa: E731
        scores, labels, starts = eng.semi_crf_streaming_viterbi_numba(
            d(inp.cum_scores), d(inp.transition), d(inp.duration_bias), inp.lengths, inp.K, d(inp.proj_start),
            d(inp.proj_end), masks=_cpu_limits(inp, lm, bm))
        return scores.to(inp.cum_scores.dtype), labels, starts, inp.lengths
    engine = _engine_masks(inp, lm, bm, "max", choice)
    if engine is None:
        return None
    from torch_semimarkov.engines.triton import launch
    plan, masks, ps = engine
    d = lambda t: None if t is None else t.detach()  # noqa: E731
    with torch.no_grad():
        scores, labels, starts = launch.launch_viterbi(d(inp.cum_scores), d(inp.transition), d(inp.duration_bias),
                                                       inp.lengths, inp.K, d(ps), d(inp.proj_end), plan=plan,
                                                       masks=masks)
    return scores.to(inp.cum_scores.dtype), labels, starts, inp.lengths


class _NumbaConstrainedLogZ(torch.autograd.Function):
    """log Z of the allowed segmentations on the compiled CPU engine (its forward and backward
    with segment limits)."""

    @staticmethod
    def forward(ctx, cum_scores, transition, duration_bias, proj_start, proj_end, inp, limits):
        eng = numba_engine()
        d = lambda t: None if t is None else t.detach()  # noqa: E731
        args = (d(cum_scores), d(transition), d(duration_bias), inp.lengths, inp.K)
        log_z, ring, interval, norms = eng.semi_crf_streaming_forward_numba(*args, "log", d(proj_start),
                                                                            d(proj_end), masks=limits)
        ctx.stash = (args, d(proj_start), d(proj_end), limits, (log_z, ring, interval, norms),
                     proj_start is not None, proj_end is not None)
        return log_z.to(inp.cum_scores.dtype)

    @staticmethod
    def backward(ctx, grad):
        args, ps, pe, limits, state, has_ps, has_pe = ctx.stash
        need_params = bool(ctx.needs_input_grad[1] or ctx.needs_input_grad[2])
        marg = numba_engine().semi_crf_streaming_backward_numba(*args, *state, ps, pe, need_parameter_grads=need_params,
                                                                masks=limits)
        return _engine_input_grads(ctx, args[0], grad, marg, has_ps, has_pe)


# ---------------------------------------------------------------------- constrained log Z


class _ConstrainedLogZ(torch.autograd.Function):
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


@keyword_options("proj_start", "proj_end", "label_mask", "boundary_mask", "validate")
def constrained_log_partition(
    cum_scores, transition, duration_bias, lengths, K, *, proj_start=None, proj_end=None,
    label_mask=None, boundary_mask=None, validate=True, backend="auto", use_triton=True,
) -> torch.Tensor:
    """(B,) log Z of the segmentations that ``label_mask`` and ``boundary_mask`` allow.

    Differentiable with respect to every float input (a hand-written forward-backward pass, not
    autograd over T). ``-inf`` for a sequence the masks leave no segmentation. With no masks it
    equals :func:`~torch_semimarkov.semi_crf_streaming_forward` (which is faster: use that).

    Args: those of :func:`semi_crf_streaming_topk` (without ``k``).
    """
    inp, lm, bm, choice = _validated(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end,
                                     label_mask, boundary_mask, validate, backend, use_triton)
    if _cpu_engine(inp, backend) is not None and (lm is not None or bm is not None):
        return _NumbaConstrainedLogZ.apply(inp.cum_scores, inp.transition, inp.duration_bias, inp.proj_start,
                                           inp.proj_end, inp, _cpu_limits(inp, lm, bm))
    engine = _engine_masks(inp, lm, bm, engine=choice)
    if engine is not None:
        return _EngineConstrainedLogZ.apply(inp.cum_scores, inp.transition, inp.duration_bias, inp.proj_start,
                                            inp.proj_end, inp, engine)
    return _ConstrainedLogZ.apply(inp.cum_scores, inp.transition, inp.duration_bias, inp.proj_start, inp.proj_end,
                                  inp, lm, bm)


def constrained_marginals(inp: StreamingInputs, label_mask, boundary_mask, engine: str = "may",
                          backend: str = "auto"):
    """(log Z (B,), P_start (B, T, C), P_end (B, T, C)) under the masks (validated inputs)."""
    eng = _cpu_engine(inp, backend)
    if eng is not None:
        args = (inp.cum_scores.detach(), inp.transition.detach(), inp.duration_bias.detach(), inp.lengths, inp.K)
        d = lambda t: None if t is None else t.detach()  # noqa: E731
        ps, pe = d(inp.proj_start), d(inp.proj_end)
        limits = _cpu_limits(inp, label_mask, boundary_mask)
        state = eng.semi_crf_streaming_forward_numba(*args, "log", ps, pe, masks=limits)
        p_start, p_end, _, _ = eng.semi_crf_streaming_backward_numba(*args, *state, ps, pe,
                                                                     need_parameter_grads=False, masks=limits)
        return state[0].to(inp.cum_scores.dtype), p_start, p_end
    engine = _engine_masks(inp, label_mask, boundary_mask, engine=engine)
    if engine is not None:
        from torch_semimarkov.engines.triton import launch
        plan, masks, ps = engine
        with torch.no_grad():
            args = (inp.cum_scores.detach(), inp.transition.detach(), inp.duration_bias.detach(), inp.lengths, inp.K)
            pe = None if inp.proj_end is None else inp.proj_end.detach()
            log_z, state = launch.launch_forward(*args, "log", ps, pe, plan=plan, masks=masks)
            p_start, p_end, _, _ = launch.launch_backward(*args, ps, pe, plan=plan, state=state, masks=masks)
        return log_z.to(inp.cum_scores.dtype), p_start, p_end
    model = _Model(inp, label_mask, boundary_mask)
    A = model.alpha()
    log_z = model.log_z(A)
    Bt = model.beta()
    acc = _edge_gradients(model, A, Bt, log_z, torch.ones_like(log_z))
    K, T = model.K, model.T
    dt = inp.cum_scores.dtype
    return log_z.to(dt), acc.gps[:, K:K + T].to(dt), acc.gpe[:, K + 1:K + 1 + T].to(dt)


# ---------------------------------------------------------------------- entropy


def _alpha_and_prefix(model: _Model):
    """(alpha, Ea): the forward messages and :func:`_expected_prefix`, in one kernel on CUDA."""
    if model.use_kernels:
        return _dense_kernels().run_dense(model, "alpha", expect=True)
    A = model.alpha()
    return A, _expected_prefix(model, A)


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


def _beta_and_suffix(model: _Model):
    """(beta, Eb): the backward messages and :func:`_expected_suffix`, in one kernel on CUDA."""
    if model.use_kernels:
        return _dense_kernels().run_dense(model, "beta", expect=True)
    Bt = model.beta()
    return Bt, _expected_suffix(model, Bt)


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


def _expected_score(model: _Model, A: torch.Tensor, Ea: torch.Tensor):
    """(log Z, E[score]) (B,) from the forward messages and the expected prefix scores
    (:func:`_expected_prefix`): the expectation over the last label at each sequence's end."""
    log_z = model.log_z(A)
    idx = torch.arange(model.B, device=model.device)
    end = A[idx, model.lengths + model.K, :model.C]
    p_last = torch.exp(end - _finite_or_zero(log_z)[:, None])
    return log_z, _expectation(p_last, Ea[idx, model.lengths + model.K, :model.C], 1)


class _Entropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cum_scores, transition, duration_bias, proj_start, proj_end, inp, label_mask, boundary_mask):
        model = _Model(inp, label_mask, boundary_mask)
        A, Ea = _alpha_and_prefix(model)
        log_z, expected = _expected_score(model, A, Ea)
        H = torch.where(torch.isfinite(log_z), log_z - expected, torch.zeros_like(log_z))
        ctx.stash = (model, A, Ea, log_z, expected, inp)
        return H.to(inp.cum_scores.dtype)

    @staticmethod
    def backward(ctx, grad):
        model, A, Ea, log_z, expected, inp = ctx.stash
        Bt, Eb = _beta_and_suffix(model)
        return _edge_gradients(model, A, Bt, log_z, grad, (Ea, Eb, expected)).result(inp) + (None, None, None)


def _entropy_on_engine(inp: StreamingInputs, lm, bm, engine: str = "may") -> Optional[torch.Tensor]:
    """(B,) float64 entropy from ONE forward + backward of the engine, or None where the engine
    cannot take the call (then the float64 path of :class:`_Entropy`).

    ``H = log Z - E[score]`` and the score is linear in the parameters, except for the first
    segment's ``logsumexp_{c'} Tr[c', c]``, so ``E[score]`` comes from the engine's marginals:
    per-position label marginals times per-position scores (``S_{p+1} - S_p``, never the
    cumulative values, which would cost float64 digits at long T), expected transition and
    duration counts times their scores, and the projections. The value only: its gradient needs
    the expectation semiring, which the engine's kernels do not run."""
    from torch_semimarkov import ops
    from torch_semimarkov.engines.triton import launch
    if engine == "no" or not _engine_takes(inp):
        return None
    masks = None
    ps, pe = inp.proj_start, inp.proj_end
    if lm is not None or bm is not None:
        on_engine = _engine_masks(inp, lm, bm, engine=engine)
        if on_engine is None:
            return None
        plan, masks, ps = on_engine
    else:
        plan = launch.plan_for(inp.cum_scores, inp.transition, inp.K)
    d = lambda t: None if t is None else t.detach()  # noqa: E731
    args = (inp.cum_scores.detach(), inp.transition.detach(), inp.duration_bias.detach(), inp.lengths, inp.K)
    with torch.no_grad():
        log_z, state = launch.launch_forward(*args, "log", d(ps), d(pe), plan=plan, masks=masks)
        p_start, p_end, g_tr, g_db = (x.double() for x in launch.launch_backward(
            *args, d(ps), d(pe), plan=plan, state=state, masks=masks))
        cum = inp.cum_scores.detach().double()
        x = cum[:, 1:] - cum[:, :-1]
        # P(position p has label c) = P(a c-segment starts at or before p) - P(one ends before p)
        # (a scan along the innermost dimension: along T it is one sequential thread per column)
        label = ops.cumsum_time(p_start - torch.nn.functional.pad(p_end, (0, 0, 1, 0))[:, :-1])
        expected = (label * x).sum((1, 2))
        tr = _forbid64(inp.transition)
        expected = expected + _weighted(g_tr, tr[None]).sum((1, 2))
        expected = expected + _weighted(g_db, _forbid64(inp.duration_bias)[None]).sum((1, 2))
        # the marginals count the first segment's phantom predecessor by softmax_{c'} Tr[c', c];
        # its score is logsumexp_{c'} Tr[c', c]: add the difference (the phantom's entropy)
        soft = torch.softmax(tr, 0)
        phantom = torch.logsumexp(tr, 0) - _weighted(soft, tr).sum(0)
        expected = expected + (p_start[:, 0] * torch.where(torch.isfinite(phantom), phantom, 0.0)).sum(1)
        for p, m in ((ps, p_start), (pe, p_end)):
            if p is not None:
                expected = expected + _weighted(m, _forbid64(p)).sum((1, 2))
        ok = torch.isfinite(log_z)
        return torch.where(ok, log_z.double() - expected, torch.zeros_like(expected))


class _EngineEntropy(torch.autograd.Function):
    """The entropy and its gradient on the engine (``kernels/entropy.py``): the forward runs
    everything (the gradient is a by-product of the same passes) and keeps the weighted
    marginals; the backward scales them."""

    @staticmethod
    def forward(ctx, cum_scores, transition, duration_bias, proj_start, proj_end, inp, engine):
        from torch_semimarkov.engines.triton.entropy import launch_entropy
        plan, masks, ps = engine
        d = lambda t: None if t is None else t.detach()  # noqa: E731
        H, *q = launch_entropy(d(cum_scores), d(transition), d(duration_bias), inp.lengths, inp.K, d(ps),
                               d(proj_end), plan=plan, masks=masks)
        ctx.stash = (d(cum_scores), q, proj_start is not None, proj_end is not None)
        return H.to(inp.cum_scores.dtype)

    @staticmethod
    def backward(ctx, grad):
        cum, q, has_ps, has_pe = ctx.stash
        # dH/dtheta is minus log Z's gradient map applied to the weighted marginals
        return _engine_input_grads(ctx, cum, -grad, q, has_ps, has_pe)


def _entropy_engine(inp: StreamingInputs, lm, bm, engine: str = "may"):
    """``(plan, masks, proj_start)`` of an entropy with its gradient on the engine (the
    time-parallel register-ring plan), or None (the float64 path)."""
    if lm is not None or bm is not None:
        return _engine_masks(inp, lm, bm, engine=engine, blocked=False)
    if engine == "no" or not _engine_takes(inp):
        return None
    from torch_semimarkov.engines.triton.plan import masked_plan
    plan = masked_plan(inp.batch, inp.T, inp.K, inp.C, device=inp.cum_scores.device)
    if plan is None:
        _refuse(engine, "the entropy's gradient")
        return None
    return plan, None, inp.proj_start


class _NumbaEntropy(torch.autograd.Function):
    """The entropy and its gradient on the compiled CPU engine (:mod:`torch_semimarkov.engines.numba.entropy`, a (C, C) or
    (K, C, C) transition): the forward runs both passes when a gradient is needed and keeps the weighted
    marginals; the backward scales them."""

    @staticmethod
    def forward(ctx, cum_scores, transition, duration_bias, proj_start, proj_end, inp, limits):
        d = lambda t: None if t is None else t.detach()  # noqa: E731
        args = (d(cum_scores), d(transition), d(duration_bias), inp.lengths, inp.K, d(proj_start), d(proj_end))
        grads = any(ctx.needs_input_grad[:5])
        out = numba_module("entropy").expected_score_numba(args, masks=limits, grads=grads)
        log_z, expected = out[0], out[1]
        ctx.stash = (args[0], out[3] if grads else None, proj_start is not None, proj_end is not None)
        H = torch.where(torch.isfinite(log_z), log_z - expected, torch.zeros_like(log_z))
        return H.to(inp.cum_scores.dtype)

    @staticmethod
    def backward(ctx, grad):
        cum, weighted, has_ps, has_pe = ctx.stash
        return _engine_input_grads(ctx, cum, -grad, weighted, has_ps, has_pe)


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
    cumulative scores of 1e6 cost no precision). CUDA tensors with a (C, C) transition take the
    engine's float32 kernels. Without a gradient (or under ``torch.no_grad()``: uncertainty for
    active learning, monitoring) one forward + backward, ``E[score]`` from its marginals (about
    the accuracy of the engine's log Z); with one, the entropy engine (``kernels/entropy.py``: prefix and suffix entropy
    recurrences, then weighted marginals). Elsewhere ((K, C, C) transitions on CUDA, rings too
    large for registers, ``backend="torch"``, the CPU without numba) the float64
    expectation-semiring recurrences (dense kernels on CUDA, PyTorch on the CPU).

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
                                     label_mask, boundary_mask, validate, backend, use_triton)
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
    if _cpu_engine(inp, backend) is not None:
        return _NumbaEntropy.apply(*tensors, inp, _cpu_limits(inp, lm, bm))
    return _Entropy.apply(inp.cum_scores, inp.transition, inp.duration_bias, inp.proj_start, inp.proj_end, inp, lm, bm)


# ---------------------------------------------------------------------- cross-entropy


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
        d = lambda t: None if t is None else t.detach()  # noqa: E731
        p_args = (d(p_cum), d(p_tr), d(p_db), inp_p.lengths, inp_p.K, d(p_ps), d(p_pe))
        q_args = (d(q_cum), d(q_tr), d(q_db), inp_q.lengths, inp_q.K, d(q_ps), d(q_pe))
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
    if _cpu_engine(inp_p, backend) is not None:
        return _NumbaNegExpectedScore.apply(inp_p.cum_scores, inp_p.transition, inp_p.duration_bias,
                                            inp_p.proj_start, inp_p.proj_end, inp_q.cum_scores, inp_q.transition,
                                            inp_q.duration_bias, inp_q.proj_start, inp_q.proj_end, inp_p, inp_q,
                                            _cpu_limits(inp_p, *masks_p), _cpu_limits(inp_q, *masks_q))
    return _NegExpectedScore.apply(inp_p.cum_scores, inp_p.transition, inp_p.duration_bias, inp_p.proj_start,
                                   inp_p.proj_end, inp_q.cum_scores, inp_q.transition, inp_q.duration_bias,
                                   inp_q.proj_start, inp_q.proj_end, inp_p, inp_q, tuple(masks_p), tuple(masks_q))


# ---------------------------------------------------------------------- results


class _Segmentations(SegmentTensorsMixin):
    """Segmentations with leading batch dimensions, tensor-first (the layout of ViterbiResult).

    ``labels`` (*lead, T); ``segment_starts`` / ``segment_ends`` (exclusive) / ``segment_labels``
    (N,), concatenated in row-major order of the leading dimensions; ``segment_offsets``
    (prod(lead) + 1,): row r (flattened) owns ``[offsets[r], offsets[r+1])``.
    """

    def _set_segments(self, labels: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor):
        lead = labels.shape[:-1]
        T = labels.shape[-1]
        flat_len = lengths.expand(lead).reshape(-1) if lengths.dim() else lengths
        s, e, c, o = segment_tensors(labels.reshape(-1, T), starts.reshape(-1, T), flat_len)
        self.labels = labels
        self.segment_starts, self.segment_ends, self.segment_labels, self.segment_offsets = s, e, c, o
        self._segments = None


class TopKResult(_Segmentations):
    """The k best segmentations of each sequence, best first.

    Attributes:
        scores: (B, k) the segmentations' scores (unnormalised log-probabilities), descending;
            ``-inf`` for a rank that does not exist (fewer than k allowed segmentations).
        labels: (B, k, T) long, -1 past each length and for missing ranks.
        segment_starts, segment_ends, segment_labels: (N,) long, every segment, ordered by
            sequence, then rank, then position.
        segment_offsets: (B·k + 1,): rank r of sequence b owns ``[offsets[b·k + r], offsets[b·k + r + 1])``.
        segments: Python lists per (b, r) in the same flattened order, built on request.
    """

    def __init__(self, scores, labels, starts, lengths):
        self.scores = scores
        self._set_segments(labels, starts, lengths[:, None])

    def segments_of(self, b: int, r: int) -> List[Segment]:
        """The segments of rank r of sequence b."""
        return self.segments[b * self.scores.shape[1] + r]

    def __repr__(self) -> str:
        B, k, T = self.labels.shape
        return f"TopKResult(batch={B}, k={k}, T={T}, segments={self.segment_starts.numel()}, device={self.labels.device})"


class SegmentationSamples(_Segmentations):
    """Exact samples from P(segmentation | inputs).

    Attributes:
        labels: (S, B, T) long, -1 past each length (and everywhere for a sequence with no
            allowed segmentation).
        log_prob: (S, B) log P(sample) = score - log Z (``-inf`` where no segmentation exists).
        scores: (S, B) the samples' scores.
        segment_starts, segment_ends, segment_labels: (N,) long, ordered by sample, then
            sequence, then position; ``segment_offsets`` (S·B + 1,): sample s of sequence b owns
            ``[offsets[s·B + b], offsets[s·B + b + 1])``.
    """

    def __init__(self, labels, starts, lengths, scores, log_prob):
        self.scores = scores
        self.log_prob = log_prob
        self._set_segments(labels, starts, lengths[None, :])

    def segments_of(self, s: int, b: int) -> List[Segment]:
        """The segments of sample s of sequence b."""
        return self.segments[s * self.labels.shape[1] + b]

    def __repr__(self) -> str:
        S, B, T = self.labels.shape
        return (f"SegmentationSamples(samples={S}, batch={B}, T={T}, segments={self.segment_starts.numel()}, "
                f"device={self.labels.device})")


def _walk(model: _Model, b, t, c, choose):
    """Trace N walkers back from (sequence b, end t, label c) to position 0.

    ``choose(walkers, their ends, their labels, edges (n, K, C+1)) -> flat index into (K, C+1)``
    picks each walker's previous segment. Returns labels (N, T), start flags (N, T) and each walker's summed edge score (N,).
    Walkers with t = 0 are finished from the start (no segmentation).
    """
    N, T, C, K = b.shape[0], model.T, model.C, model.K
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


# ---------------------------------------------------------------------- sampling


def _engine_takes(inp: StreamingInputs) -> bool:
    """The engine's kernels can run this call: Triton, CUDA tensors (or :data:`ENGINE_ON_CPU`)
    and a (C, C) transition."""
    from torch_semimarkov.engines.triton import HAS_TRITON
    return HAS_TRITON and (inp.cum_scores.is_cuda or ENGINE_ON_CPU) and not inp.duration_transitions


def _engine_sampling(inp: StreamingInputs, lm, bm) -> bool:
    """Sampling runs on the engine (its forward, then the chunked walk of ``kernels/traceback.py``)
    without masks; elsewhere on the PyTorch path."""
    return lm is None and bm is None and _engine_takes(inp)


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
    """Engine sampling: one forward keeping every position's ``alpha_hat`` / ``U_hat`` and
    frames, then ``num_samples·B`` walks by the chunked, merging walk (``sample_chunked``)."""
    from torch_semimarkov.engines.triton import launch, parallel
    from torch_semimarkov.engines.triton.plan import _sms

    S, B, T, K = num_samples, inp.batch, inp.T, inp.K
    dev = inp.cum_scores.device
    log_z, state = launch.launch_forward(inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, K,
                                         proj_start=inp.proj_start, proj_end=inp.proj_end, save="all")
    saved, frames = state
    ok = torch.isfinite(log_z)
    traced = torch.where(ok, inp.lengths, torch.zeros_like(inp.lengths))
    uniforms = torch.rand((S * B, T + 1, 2), generator=generator, device=dev, dtype=torch.float32)
    K_eff = min(K, max(T, 1))
    chunk = parallel.sample_chunk_length(S * B, T, K_eff, _sms(dev))
    c = lambda x: x.contiguous()  # noqa: E731
    labels, starts, _ = parallel.sample_chunked(saved, frames, c(inp.cum_scores), c(inp.transition),
                                                c(inp.duration_bias), c(traced), uniforms, K_eff, chunk)
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
    returns the same samples as ``backend="torch"``; on CUDA tensors (a (C, C) transition, no
    masks) the engine's forward and a Triton walk, parallel over samples, sequences and chunks of
    positions, do the same with float32 uniforms.

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
                                     label_mask, boundary_mask, validate, backend, use_triton)
    if choice == "must" and (lm is not None or bm is not None):
        raise ValueError("backend='triton' samples without masks only; use backend='auto' or 'torch' with "
                         "label_mask / boundary_mask")
    with torch.no_grad():
        if choice != "no" and _engine_sampling(inp, lm, bm):
            return _sample_on_engine(inp, num_samples, generator)
        S, B, T = num_samples, inp.batch, inp.T
        dev = inp.cum_scores.device
        uniforms = torch.rand((S * B, T + 1, 2), generator=generator, dtype=torch.float64, device=dev)
        eng = _cpu_engine(inp, backend) and numba_module("sample")
        if eng:
            d = lambda t: None if t is None else t.detach()  # noqa: E731
            labels, starts, log_z = eng.sample_numba(d(inp.cum_scores), d(inp.transition), d(inp.duration_bias),
                                                     inp.lengths, inp.K, d(inp.proj_start), d(inp.proj_end),
                                                     uniforms, masks=_cpu_limits(inp, lm, bm))
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


# ---------------------------------------------------------------------- top-k


def _topk_on_engine(inp: StreamingInputs, k: int) -> Optional["TopKResult"]:
    """The k best segmentations by sidetracks over the engine's Viterbi (:mod:`.kbest`), with
    scores recomputed exactly from the segments; None where the engine cannot run."""
    from torch_semimarkov.engines.triton.topk import topk_on_engine
    out = topk_on_engine(inp, k)
    if out is None:
        return None
    labels, starts = out
    B, T = inp.batch, inp.T
    first = TopKResult(None, labels, starts, inp.lengths)
    score = _segment_scores(inp, B * k, first.segment_starts, first.segment_ends, first.segment_labels,
                            first.segment_offsets, per_row=k).reshape(B, k)
    exist = labels[:, :, 0] >= 0
    score = torch.where(exist, score, torch.full_like(score, _NEG))
    # the search ordered the ranks by float32 deficits: order them by the exact scores (stable)
    order = torch.sort(score, dim=1, descending=True, stable=True).indices
    if not torch.equal(order, torch.arange(k, device=order.device).expand(B, k)):
        labels = labels.gather(1, order[..., None].expand(B, k, T))
        starts = starts.gather(1, order[..., None].expand(B, k, T))
        score = score.gather(1, order)
        return TopKResult(score.to(inp.cum_scores.dtype), labels, starts, inp.lengths)
    first.scores = score.to(inp.cum_scores.dtype)
    return first


@keyword_options("k", "proj_start", "proj_end", "label_mask", "boundary_mask", "validate")
def semi_crf_streaming_topk(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths: torch.Tensor,
    K: int,
    *,
    k: int,
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
    label_mask: Optional[torch.Tensor] = None,
    boundary_mask: Optional[torch.Tensor] = None,
    backend: str = "auto",
    use_triton: bool = True,
    validate: bool = True,
) -> TopKResult:
    """The k highest-scoring distinct segmentations of each sequence, best first.

    A k-best Viterbi: each (position, label) keeps its k best prefixes (scores and backpointers,
    O(T·C·k) memory); the final k are traced back together. Rank 0 is the Viterbi segmentation
    (:func:`~torch_semimarkov.semi_crf_streaming_viterbi`, the same tie-breaking). Ties break
    deterministically: toward the shorter last segment, then the smaller predecessor label, then
    the better-ranked prefix; at the end toward the smaller final label.

    Args:
        cum_scores ... K, proj_start, proj_end: as :func:`~torch_semimarkov.semi_crf_streaming_forward`.
        k: how many segmentations per sequence (>= 1).
        label_mask: optional (B, T, C) bool: position t may only carry the labels marked True.
        boundary_mask: optional (B, T) integer: -1 no segment starts at t, 0 free, 1 a segment
            starts at t (partial annotations, known landmarks).
        backend: ``"auto"`` (default: the engine's kernels where they take the call, i.e. CUDA
            tensors, Triton and a (C, C) transition; on CPU tensors with numba installed the
            compiled CPU engine, :mod:`torch_semimarkov.engines.numba.kbest`, which runs this recurrence with the same
            scores, labels and ties, masks and both transition shapes included; else the float64
            PyTorch path), ``"triton"`` (the kernels; ``ValueError`` where they cannot take it),
            ``"torch"`` (the float64 PyTorch path, the reference) or ``"numba"`` (CPU tensors: the
            compiled CPU engine).
        use_triton: ``False`` keeps ``"auto"`` off the kernels.
        validate: check the input values (one device-to-host transfer).

    Returns:
        :class:`TopKResult`: ``scores`` (B, k), ``labels`` (B, k, T) and the segment tensors. A
        rank that does not exist has score ``-inf``, labels -1 and no segments.

    Example:
        >>> import torch
        >>> from torch_semimarkov import semi_crf_streaming_topk
        >>> cum = torch.nn.functional.pad(torch.randn(1, 10, 2).cumsum(1), (0, 0, 1, 0))
        >>> out = semi_crf_streaming_topk(cum, torch.zeros(2, 2), torch.zeros(3, 2), torch.tensor([10]), 3, k=4)
        >>> out.scores.shape, bool((out.scores[0, :-1] >= out.scores[0, 1:]).all())
        (torch.Size([1, 4]), True)
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    inp, lm, bm, choice = _validated(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end,
                                     label_mask, boundary_mask, validate, backend, use_triton)
    if choice == "must" and (lm is not None or bm is not None):
        raise ValueError("backend='triton' runs k-best lists without masks only; use backend='auto' or 'torch' "
                         "with label_mask / boundary_mask")
    if choice != "no" and lm is None and bm is None and _engine_takes(inp):
        out = _topk_on_engine(inp, k)
        if out is not None:
            return out
        _refuse(choice, "this k-best list")
    with torch.no_grad():
        model = _Model(inp, lm, bm)
        eng = _cpu_engine(inp, backend) and numba_module("kbest")
        if eng:  # CPU tensors: this recurrence, compiled (engines/numba/kbest.py), the same results
            scores, labels, starts = eng.topk_numba(model, k)
            return TopKResult(scores.to(inp.cum_scores.dtype), labels, starts, model.lengths)
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
        scores = scores.to(inp.cum_scores.dtype)
        return TopKResult(scores, labels.reshape(B, k, T), flags.reshape(B, k, T), model.lengths)
