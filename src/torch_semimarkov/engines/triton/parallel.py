"""Host side of the time-parallel engine: the spec / fix-up / repair launches of the chunked
forward, beta and traceback kernels, and the prefix sums of the chunk offsets.

``forward.py``, ``beta.py`` and ``traceback.py`` explain the algorithm; this file allocates the
per-chunk state (end states, flags, offsets), launches the three phases in order and turns the
per-chunk offsets into global frames. Everything is deterministic: the chunking depends only on
the plan, and the offsets are summed in a fixed order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from torch_semimarkov.engines.triton import plan as _plan
from torch_semimarkov.engines.triton.beta import beta_transition
from torch_semimarkov.engines.triton.common import MASK, REBASE
from torch_semimarkov.engines.triton.plan import WALK_WARPS, KernelPlan, fixup_tol, label_pad, walk_blocks

#: Polls a blocked-engine run waits for its helpers' sums of a block before it computes them
#: itself from then on (helpers that are not resident, e.g. a GPU shared with other work), and
#: polls a helper waits for its run to reach the next block (``blocked._blk_help``).
RUN_SPIN = 1 << 14
HELPER_SPIN = 1 << 21


@dataclass
class ChunkStats:
    """What the fix-ups did, per (sequence, chunk): ``converged`` (B, n) bool (the chunk's last
    fix-up converged or merged; the first chunk of the forward and the last of the backward never
    need one), ``steps`` (B, n) positions its last fix-up ran (forward and beta), and ``redone``
    (B, n) chunks fixed up again by the repair because their neighbour did not converge."""

    converged: torch.Tensor
    steps: torch.Tensor
    redone: torch.Tensor


def _chunk_state(B, n, n32, n64, nb, dev):
    """End states ([0] spec runs, [1] fix-ups that did not converge) and the per-chunk flags."""
    e32 = torch.empty((2, B, n, n32), device=dev, dtype=torch.float32)
    e64 = torch.empty((2, B, n, n64), device=dev, dtype=torch.float64)
    eb = torch.empty((2, B, n, nb), device=dev, dtype=torch.int32) if nb else torch.empty((1,), device=dev, dtype=torch.int32)
    status = torch.ones((B, n), device=dev, dtype=torch.int32)
    src = torch.ones((B, n), device=dev, dtype=torch.int32)
    delta = torch.zeros((B, n), device=dev, dtype=torch.float64)
    steps = torch.zeros((B, n), device=dev, dtype=torch.int32)
    return e32, e64, eb, status, src, delta, steps


def _phases(kernel, B, n, args, meta, steps, roles=1, reset=None, phase_meta=None, repair_roles=1,
            repair_reset=None):
    """spec (B, n), fix-up (B, n), repair (B,), as a generator that yields after each launch and
    returns which chunks the repair ran again (:func:`_three_phases` runs it through; the blocked
    engine's forward and beta interleave two of them, :func:`blocked_forward_beta`).
    ``roles`` > 1: the spec and fix-up grids take a third axis (the blocked engine's run and its
    helpers), whose progress flags ``reset`` clears before each of them; the repair has none
    unless ``repair_roles`` > 1 (grid (B, 1, repair_roles), ``repair_reset`` before it).
    ``phase_meta``: {phase: meta entries} that phase launches with instead."""
    grid = (B, n) if roles == 1 else (B, n, roles)
    extra = phase_meta or {}

    def launch(g, phase, entries):
        kernel[g](**{**args, **entries, **extra.get(phase, {})}, PHASE=phase)

    if reset is not None:
        reset()
    launch(grid, 1, meta)
    yield
    if n == 1:
        return torch.zeros((B, n), device=steps.device, dtype=torch.bool)
    if reset is not None:
        reset()
    launch(grid, 2, meta)
    yield
    before = steps.clone()
    if repair_reset is not None:
        repair_reset()
    launch((B,) if repair_roles == 1 else (B, 1, repair_roles), 3,
           {**meta, "HELPERS": 0} if "HELPERS" in meta else meta)
    yield
    return steps.ne(before)


def _drain(gen):
    """Run a generator of launches (:func:`_phases`) to its end; its return value."""
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value


def _three_phases(*args, **kwargs):
    """:func:`_phases` launched one after another; returns which chunks the repair ran again."""
    return _drain(_phases(*args, **kwargs))


def forward_offsets(frames: torch.Tensor, delta: torch.Tensor, W: int) -> torch.Tensor:
    """Add each chunk's offset O_j = delta_1 + ... + delta_j (prefix sum in a fixed order) to the
    frames of its positions; position p belongs to chunk min(p // W, n - 1)."""
    offset = torch.cumsum(delta, dim=1)
    idx = (torch.arange(frames.shape[1], device=frames.device) // W).clamp(max=delta.shape[1] - 1)
    return frames + offset[:, idx]


def backward_offsets(frames: torch.Tensor, delta: torch.Tensor, W: int) -> torch.Tensor:
    """The backward's offsets: O_j = delta_j + ... + delta_{n-1} (suffix sum in a fixed order);
    row t >= 1 belongs to chunk (t - 1) // W."""
    offset = torch.flip(torch.cumsum(torch.flip(delta, (1,)), dim=1), (1,))
    t = torch.arange(frames.shape[1], device=frames.device)
    idx = ((t - 1).clamp(min=0) // W).clamp(max=delta.shape[1] - 1)
    return frames + offset[:, idx]


def _start_state(K, C, boundary, dev):
    """The state "the sequence starts (forward) / ends (backward) here" of the (K, C, C) chunk
    kernels: K rows of C values, row ``boundary`` 0 on every label and the others impossible, and
    their frames (0). The first chunk's true start state and every speculative one."""
    from torch_semimarkov.engines.triton.common import MASK

    s32 = torch.full((K, C), MASK, device=dev, dtype=torch.float32)
    s32[boundary] = 0.0
    return s32, torch.zeros((K,), device=dev, dtype=torch.float64)


def _chunk_args(cum_scores, transition, duration_bias, lengths, proj_start, proj_end, plan: KernelPlan, state,
                semiring: str = "log") -> dict:
    """What every launch of the chunk kernels (``chunks.py``) passes: the inputs (an absent
    projection's pointer is ``cum_scores``, never read), the chunks' end states and flags
    (``state``, :func:`_chunk_state`'s, less the label rings), sizes, strides and the fix-ups'
    tolerance."""
    B, T1, C = cum_scores.shape
    e32, e64, status, src, delta, steps = state
    return dict(
        cum_ptr=cum_scores, tr_ptr=transition, db_ptr=duration_bias, len_ptr=lengths,
        ps_ptr=proj_start if proj_start is not None else cum_scores,
        pe_ptr=proj_end if proj_end is not None else cum_scores,
        e32=e32, e64=e64, st_ptr=status, src_ptr=src, dl_ptr=delta, cv_ptr=steps,
        C=C, K=plan.K, W=plan.chunk, NCH=plan.n_chunks, s_cum_b=T1 * C, s_p_b=(T1 - 1) * C, s_w_b=T1 * C, s_f_b=T1,
        TOL=fixup_tol(plan, semiring),
    )


def forward_chunked(cum_scores, transition, duration_bias, lengths, semiring, proj_start, proj_end,
                    plan: KernelPlan, masks=None):
    """Every position's forward state by the chunked fix-up: the register-ring kernel for a
    (C, C) transition, the direct recurrence (state: the last K alpha rows) for a (K, C, C) one.

    Returns ``(saved, frames, bp, stats)``: ``saved`` (2, B, T+1, C) float32 ``alpha_hat`` and
    ``U_hat`` ((1, B, T+1, C), ``alpha_hat`` only, for (K, C, C) transitions), ``frames``
    (B, T+1) float64 (global), ``bp`` (B, T+1, C) int32 packed backpointers k * 65536 + c_prev
    (max semiring, else None) and :class:`ChunkStats`. ``masks``: ``(min_start, max_end, flags)``
    of a constrained call (``limits.py``). The fix-ups converge to
    the plan's tolerance (:func:`~.plan.fixup_tol`).
    """
    from torch_semimarkov.engines.triton.chunks import _dur_chunks_kernel, _reg_chunks_kernel

    if plan.kind == "mem":
        return _blocked_chunks(cum_scores, transition, duration_bias, lengths, semiring, proj_start, proj_end,
                               plan, reverse=False, masks=masks)
    B, T1, C = cum_scores.shape
    dev = cum_scores.device
    is_max = semiring == "max"
    dur = plan.kind == "dur"
    c_pad, k_pad, W, n, K = plan.c_pad, plan.k_pad, plan.chunk, plan.n_chunks, plan.K
    saved = torch.empty((1 if dur else 2, B, T1, C), device=dev, dtype=torch.float32)
    frames = torch.empty((B, T1), device=dev, dtype=torch.float64)
    bp = torch.empty((B, T1, C) if is_max else (1,), device=dev, dtype=torch.int32)
    if dur:
        e32, e64, eb, status, src, delta, steps = _chunk_state(B, n, K * C, K, 0, dev)
    else:
        e32, e64, eb, status, src, delta, steps = _chunk_state(
            B, n, k_pad * c_pad + c_pad, k_pad + 1, k_pad * c_pad if is_max else 0, dev)
    args = dict(_chunk_args(cum_scores, transition, duration_bias, lengths, proj_start, proj_end, plan,
                            (e32, e64, status, src, delta, steps), semiring), f_ptr=frames, bp_ptr=bp)
    meta = dict(C_PAD=c_pad, K_PAD=k_pad, IS_MAX=is_max, HAS_PS=proj_start is not None,
                HAS_PE=proj_end is not None, num_warps=plan.num_warps, IDX64=plan.idx64)
    if masks is not None:
        args.update(lim_ptr=masks[0], fl_ptr=masks[2], HAS_MASK=True)
    if dur:
        i32, i64 = _start_state(K, C, K - 1, dev)
        redone = _three_phases(_dur_chunks_kernel, B, n, dict(args, r_ptr=saved[0], i32=i32, i64=i64, T1=T1), meta,
                               steps)
    else:
        redone = _three_phases(_reg_chunks_kernel, B, n, dict(args, a_ptr=saved[0], r_ptr=saved[1], eb=eb),
                               dict(meta, REBASE=REBASE), steps)
    frames = forward_offsets(frames, delta, W)
    return saved, frames, (bp if is_max else None), ChunkStats(status.bool(), steps, redone)


def beta_chunked(cum_scores, transition, duration_bias, lengths, proj_start, proj_end, plan: KernelPlan,
                 masks=None):
    """Every ``Y_hat_t = pe_{t-1} + beta_hat_t`` row (t = 1..L) and its global frame, by the
    chunked fix-up of the beta recurrence (register ring for a (C, C) transition; the direct
    recurrence, state beta_hat and K-1 Y rows, for a (K, C, C) one).

    Returns ``(x_hat (B, T+1, C) float32, g (B, T+1) float64, stats)``.
    """
    from torch_semimarkov.engines.triton.chunks import _dur_chunks_kernel, _reg_chunks_kernel

    if plan.kind == "mem":
        x_hat, g, _, stats = _blocked_chunks(cum_scores, transition, duration_bias, lengths, "log", proj_start,
                                             proj_end, plan, reverse=True, masks=masks)
        return x_hat[0], g, stats
    B, T1, C = cum_scores.shape
    dev = cum_scores.device
    c_pad, k_pad, W, n, K = plan.c_pad, plan.k_pad, plan.chunk, plan.n_chunks, plan.K
    dur = plan.kind == "dur"
    x_hat = torch.empty((B, T1, C), device=dev, dtype=torch.float32)
    g = torch.empty((B, T1), device=dev, dtype=torch.float64)
    if dur:
        e32, e64, _, status, src, delta, steps = _chunk_state(B, n, K * C, K, 0, dev)
    else:
        e32, e64, _, status, src, delta, steps = _chunk_state(B, n, k_pad * c_pad + 2 * c_pad, k_pad + 1, 0, dev)
    args = dict(_chunk_args(cum_scores, transition, duration_bias, lengths, proj_start, proj_end, plan,
                            (e32, e64, status, src, delta, steps)), r_ptr=x_hat, f_ptr=g)
    meta = dict(C_PAD=c_pad, K_PAD=k_pad, HAS_PS=proj_start is not None, HAS_PE=proj_end is not None,
                num_warps=plan.num_warps, IDX64=plan.idx64)
    if masks is not None:
        args.update(lim_ptr=masks[1], fl_ptr=masks[2], HAS_MASK=True)
    if dur:
        i32, i64 = _start_state(K, C, 0, dev)
        redone = _three_phases(_dur_chunks_kernel, B, n, dict(args, i32=i32, i64=i64, tr_ptr=beta_transition(transition)),
                               dict(meta, REVERSE=True), steps)
    else:
        redone = _three_phases(_reg_chunks_kernel, B, n, args, dict(meta, REBASE=REBASE, REVERSE=True), steps)
    g = backward_offsets(g, delta, W)
    return x_hat, g, ChunkStats(status.bool(), steps, redone)


def dur_entropy_chunked(cum_scores, transition, duration_bias, lengths, proj_start, proj_end, plan: KernelPlan,
                        rows, frames, reverse: bool, masks=None):
    """The prefix entropies (``reverse`` False, weighted by the forward's ``alpha_hat`` rows) or
    suffix entropies (True, by beta's ``Y_hat`` rows) of a (K, C, C) transition, by the chunked
    fix-up of :func:`forward_chunked`'s direct recurrence (``_dur_chunks_kernel`` with ``ENT``):
    every chunk runs from zero entropies, and its fix-up from its neighbour's end until its last K
    rows agree with the stored ones up to one constant.

    Args: validated inputs, the ``"dur"`` plan of the rows, ``rows`` (B, T+1, C) float32 and their
        global ``frames`` (B, T+1) float64 (:func:`forward_chunked` / :func:`beta_chunked`),
        ``masks`` as theirs.

    Returns ``(h (B, T+1, C) float32, frames (B, T+1) float64)``: row t the entropies of the
    prefixes (suffixes) given that a segment of each label ends at t, less their frame; nodes no
    segmentation reaches IMPOSSIBLE.
    """
    from torch_semimarkov.engines.triton.chunks import _dur_chunks_kernel

    B, T1, C = cum_scores.shape
    dev = cum_scores.device
    W, n, K = plan.chunk, plan.n_chunks, plan.K
    h = torch.empty((B, T1, C), device=dev, dtype=torch.float32)
    fh = torch.zeros((B, T1), device=dev, dtype=torch.float64)
    e32, e64, _, status, src, delta, steps = _chunk_state(B, n, K * C, K, 0, dev)
    args = dict(_chunk_args(cum_scores, transition, duration_bias, lengths, proj_start, proj_end, plan,
                            (e32, e64, status, src, delta, steps)), r_ptr=h, f_ptr=fh, ea_ptr=rows, ef_ptr=frames,
                i32=torch.zeros((K, C), device=dev, dtype=torch.float32),
                i64=torch.zeros((K,), device=dev, dtype=torch.float64))
    if reverse:
        args.update(tr_ptr=beta_transition(transition))
    else:
        args.update(bp_ptr=torch.empty((1,), device=dev, dtype=torch.int32), T1=T1)
    if masks is not None:
        args.update(lim_ptr=masks[1] if reverse else masks[0], fl_ptr=masks[2], HAS_MASK=True)
    meta = dict(C_PAD=plan.c_pad, K_PAD=plan.k_pad, HAS_PS=proj_start is not None, HAS_PE=proj_end is not None,
                num_warps=plan.num_warps, IDX64=plan.idx64, ENT=True, REVERSE=reverse)
    _three_phases(_dur_chunks_kernel, B, n, args, meta, steps)
    return h, (backward_offsets(fh, delta, W) if reverse else forward_offsets(fh, delta, W))


#: Probes set this to a list to collect, per linear-space blocked launch, the number of block-sum
#: tiles the kernel recomputed term by term and the number of block-sum tiles one pass over the
#: launch's sequences runs (0-d tensors on the device, read after a synchronisation).
RECOMPUTED: Optional[list] = None

#: Largest spread (nats) of a label's duration bias for the linear-space block sums by default.
LINEAR_SPREAD = 50.0


def dense_durations(duration_bias: torch.Tensor, K: int) -> bool:
    """Whether every label's duration bias is possible at every duration 1..K and spans at most
    ``LINEAR_SPREAD`` nats: then a linear-space block sum holds its largest row's term at no less
    than e^-50 of the shift (no underflow), and the blocked kernel uses it by default (one shift
    per label, ``PERIOD = 1``). The reference of the per-label flags that the blocked engine reads
    from its tables kernel (``tables.duration_tables``); a reduction and a synchronisation."""
    d = duration_bias[:K]
    lo, hi = d.amin(0), d.amax(0)
    return bool(((lo > -1e29) & (hi - lo <= LINEAR_SPREAD)).all())


def _residues(fin: torch.Tensor) -> torch.Tensor:
    """(C,) int64: per label, the residue modulo 3 that all its possible durations share (the
    durations are rows + 1 of ``fin`` (K, C) bool), -1 where they do not share one or none is."""
    k = torch.arange(1, fin.shape[0] + 1, device=fin.device)[:, None] % 3
    has = torch.stack([(fin & (k == r)).any(0) for r in range(3)])  # (3, C)
    one = has.sum(0) == 1
    return torch.where(one, has.int().argmax(0), torch.full_like(one, -1, dtype=torch.int64))


def _duration_range(fin: torch.Tensor):
    """``(kmin, kmax)`` (C,) int64: each label's first and last possible duration (rows + 1 of
    ``fin`` (K, C) bool); an empty range, (K + 1, 0), where none is."""
    K = fin.shape[0]
    k = torch.arange(1, K + 1, device=fin.device)[:, None]
    return torch.where(fin, k, K + 1).amin(0), torch.where(fin, k, 0).amax(0)


def duration_trend(duration_bias: torch.Tensor, K: int) -> torch.Tensor:
    """(C,) float64: per label, the least-squares slope of its possible duration bias in k (0 where
    fewer than two durations are possible): the ``k·mu`` that ``cumulative_scores`` adds, which the
    blocked kernel's residue-class block sums take out of ``ED`` (``blocked._tile_linear``)."""
    d = duration_bias[:K].double()
    fin = d > -1e29
    k = torch.arange(1, d.shape[0] + 1, device=d.device, dtype=torch.float64)[:, None].expand_as(d)
    n = fin.sum(0).clamp(min=1)
    km = torch.where(fin, k, 0.0).sum(0) / n
    dm = torch.where(fin, d, 0.0).sum(0) / n
    var = torch.where(fin, (k - km) ** 2, 0.0).sum(0)
    cov = torch.where(fin, (k - km) * (d - dm), 0.0).sum(0)
    return torch.where(var > 0, cov / var.clamp(min=1e-30), torch.zeros_like(var))


def residue_durations(duration_bias: torch.Tensor, K: int) -> bool:
    """Whether every label's possible durations are, within their range [kmin, kmax], either all
    of it or all of it in one residue modulo 3 (gene grammars: coding labels by reading frame,
    one-base and fixed-length pieces), and its bias, less its trend in k (``duration_trend``),
    spans at most ``LINEAR_SPREAD`` nats. Then the blocked kernel's linear-space block sums with
    one shift per residue class of the rows (``PERIOD = 3``, ``blocked._tile_linear``) hold the
    largest term of each sum at no less than e^-50 of its shift."""
    d = duration_bias[:K].double()
    fin = d > -1e29
    k = torch.arange(1, d.shape[0] + 1, device=d.device)[:, None]
    kmin, kmax = _duration_range(fin)
    inr = (k >= kmin) & (k <= kmax)
    res = _residues(fin)
    want = inr & ((res < 0) | (k % 3 == res.clamp(min=0)))
    flat = d - duration_trend(d, K) * k
    lo = torch.where(fin, flat, float("inf")).amin(0)
    hi = torch.where(fin, flat, float("-inf")).amax(0)
    spread = torch.where(fin.any(0), hi - lo, torch.zeros_like(hi))
    return bool(((fin == want).all(0) & (spread <= LINEAR_SPREAD)).all())


def linear_period(duration_bias: torch.Tensor, K: int, setting=None) -> int:
    """The ``PERIOD`` of the blocked kernel's linear-space block sums, 0 for the term-by-term
    log-space sums. ``setting`` is ``plan.linear``: None (default) 1 for dense durations
    (``dense_durations``), else 0; False 0; True 1 (tests: the underflow recomputation); 1 or 3
    that period. PERIOD 3 (shifts per residue class, exact edge rows, the trend taken out:
    ``blocked._tile_linear``) recomputes no tile on a gene grammar (``residue_durations``), but
    on the H200 the gene finder's training step ran 11% slower with it than with the log-space
    sums and its gradients moved by 2.5e-2 of the largest (GPU_NOTES 51): opt-in only."""
    if setting is False:
        return 0
    if setting is None:
        return 1 if dense_durations(duration_bias, K) else 0
    if setting is True:
        return 1
    if int(setting) not in (1, 3):
        raise ValueError(f"plan.linear must be None, True, False, 1 or 3, got {setting!r}")
    return int(setting)


def linear_duration_tables(duration_bias: torch.Tensor, plan: KernelPlan, pad: Optional[int] = None,
                           trend: bool = False):
    """The duration tables of the blocked kernel's linear-space block sums (``blocked._tile_linear``)
    and marginal tiles (``marginals._blk_seg_kernel``, ``pad`` its BK), in PyTorch: the engine
    makes them with ``tables.duration_tables`` (one kernel, bitwise these) except with the trend
    (PERIOD 3), and tests check that kernel against this:
    ``ED (K + pad, C_PAD) float32 = exp(D[k-1, c] - lam_c·k - MD_c)`` (``pad`` = BT + RB of the
    linear tile by default; zero for impossible entries, past K and on padded labels),
    ``(2, C_PAD) float32``: ``MD_c`` the largest possible
    ``D - lam_c·k`` of each label (0 where none is) and the trend ``lam_c`` (``duration_trend``
    with ``trend``, else 0), and ``(4, C_PAD) int32``: the first and last possible duration of each
    label (an empty range, (K + 1, 0), where none is), the residue modulo 3 its possible durations
    share (-1 where they do not share one) and, in row 3, column 0, a counter of the block-sum tiles
    the kernel recomputed term by term (``RECOMPUTED``)."""
    K, C = plan.K, duration_bias.shape[1]
    dev = duration_bias.device
    F = torch.nn.functional
    d = duration_bias[:K].double()
    fin = d > -1e29
    k = torch.arange(1, K + 1, device=dev)[:, None]
    if trend:
        lam = duration_trend(d, K)
        d = d - lam * k.double()
    else:
        lam = torch.zeros_like(d[0])
    md = torch.where(fin, d, float("-inf")).amax(0).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    if pad is None:
        bt, rb, _ = plan.linear_tile
        pad = bt + rb
    cp = plan.c_pad - C
    # few operations (each a launch, ~10 µs of the host before the first kernel, GPU_NOTES 96):
    # padded columns and rows as zeros by one pad, and the ranges of the padded labels (empty:
    # K + 1, 0, residue -1) from a padded ``fin`` with no possible duration
    ed = F.pad(torch.where(fin, torch.exp(d - md), 0.0).float(), (0, cp, 0, pad))
    finp = F.pad(fin, (0, cp))
    kmin = torch.where(finp, k, K + 1).amin(0)
    kmax = torch.where(finp, k, 0).amax(0)
    has = (finp[:, :, None] & ((k % 3)[:, :, None] == torch.arange(3, device=dev))).any(0)  # (C_PAD, 3)
    res = torch.where(has.sum(1) == 1, has.int().argmax(1), -1)
    kr = torch.stack([kmin, kmax, res, torch.zeros_like(res)]).int()
    mdp = F.pad(torch.stack([md, lam]).float(), (0, cp))
    return ed, mdp, kr


def max_bound_table(duration_bias: torch.Tensor, K: int, bt: int) -> torch.Tensor:
    """The max semiring's tile bounds (``blocked._tile_exact``, ``plan.max_bounds``):
    ``(K + 2·bt + 1, C) float32``, row j the largest float32 duration bias of the durations
    j + 1 .. j + bt that are at most K, per label (2·MASK where there are none or all are
    impossible: a bound is only ever raised)."""
    C = duration_bias.shape[1]
    dev = duration_bias.device
    rows = K + 2 * bt + 1
    d = torch.full((rows + bt, C), 2 * MASK, device=dev, dtype=torch.float32)
    d[:K] = torch.nan_to_num(duration_bias[:K].float(), nan=2 * MASK, neginf=2 * MASK).clamp(min=2 * MASK)
    # sliding maximum over bt durations: row j = max(d[j], ..., d[j + bt - 1])
    return d.unfold(0, bt, 1)[:rows].amax(-1).contiguous()


def _blocked_period(duration_bias, plan: KernelPlan, semiring: str, masks, shared: dict) -> int:
    """The blocked kernel's linear-sum ``PERIOD`` (0: log-space sums), once per ``shared`` dict:
    by default (``plan.linear`` None) from the dense flags of the one tables kernel (whose tables
    it keeps in ``shared`` for PERIOD 1), one small read; else ``linear_period``."""
    if masks is not None or semiring == "max":
        return 0
    if "period" not in shared:
        if plan.linear is None:
            # the default: the tables for PERIOD 1 and each label's dense test from one kernel
            # (``tables.duration_tables``), then one small read (the synchronisation)
            ed, md, kr, dense = _tables_for(duration_bias, plan, 1, duration_bias.shape[1])
            shared["period"] = 1 if all(dense.tolist()) else 0
            if shared["period"]:
                shared["tables"] = ed, md, kr
        else:
            shared["period"] = linear_period(duration_bias, plan.K, plan.linear)
    return shared["period"]


def _blocked_split(plan: KernelPlan, period: int, C: int):
    """``((BT, RB, CB), (helpers, groups, parts, part rows), the same for the in-order repair)`` of
    a blocked launch: the tile (the linear sums' own where ``period`` > 0) and how the helper
    programs split the label tiles and the rows (``blocked._blk_help``; cheap linear sums need
    fewer; the repair's own helpers only where there are several chunks)."""
    K = plan.K
    bt, rb, cb = plan.linear_tile if period > 0 else (plan.bt, plan.rb, plan.cb)
    tiles = -(-C // cb)

    def split(h):
        if period == 1:
            h = _plan.linear_helpers(h, K, tiles)
        g, p = _plan.helper_split(h, tiles, K, rb)
        return g * p, g, p, _plan.helper_part_rows(p, K, rb)

    return (bt, rb, cb), split(plan.helpers), split(plan.repair_helpers if plan.n_chunks > 1 else 0)


def _blocked_tables(duration_bias, plan: KernelPlan, period: int, C: int, shared: dict):
    """The linear sums' duration tables ``(ED, MD, ranges)`` (``tables.duration_tables``; with the
    trend, PERIOD 3, ``linear_duration_tables``), padded for the launch's tile and helpers, once per
    ``shared`` dict."""
    if "tables" not in shared:
        if period == 3:  # the trend taken out: the PyTorch tables
            shared["tables"] = linear_duration_tables(duration_bias, plan, pad=_table_pad(plan, period, C), trend=True)
        else:
            shared["tables"] = _tables_for(duration_bias, plan, period, C)[:3]
    return shared["tables"]


def _table_pad(plan: KernelPlan, period: int, C: int) -> int:
    """Rows of ``ED`` past K of a blocked launch with ``period``'s tile: BT + RB, and one BT more
    where helpers run."""
    (bt, rb, _), (helpers, *_), (rhelp, *_) = _blocked_split(plan, period, C)
    return (2 if helpers or rhelp else 1) * bt + rb


def _tables_for(duration_bias, plan: KernelPlan, period: int, C: int):
    """``(ED, MD, ranges, dense)`` of ``tables.duration_tables`` (one kernel, no trend) padded for
    a blocked launch of linear sums with ``period``'s tile and helpers."""
    from torch_semimarkov.engines.triton.tables import duration_tables

    return duration_tables(duration_bias, plan.K, plan.c_pad, _table_pad(plan, period, C), LINEAR_SPREAD)


def _blocked_chunks(cum_scores, transition, duration_bias, lengths, semiring, proj_start, proj_end,
                    plan: KernelPlan, reverse: bool, masks=None):
    """The forward (``reverse=False``) or beta of the blocked memory-ring kernel (``blocked.py``),
    in the layouts of the register-ring chunk kernels: forward ``(saved (2, B, T+1, C), frames,
    bp, stats)``, beta ``(x_hat (1, B, T+1, C), g, None, stats)``. In the max semiring the
    kernel's argmax durations and source labels are packed here into ``k * 65536 + c_prev``.
    ``masks``: ``(min_start, max_end, flags)`` of a constrained call (``limits.py``)."""
    return _drain(_blocked_steps(cum_scores, transition, duration_bias, lengths, semiring, proj_start, proj_end,
                                 plan, reverse, masks))


def _blocked_steps(cum_scores, transition, duration_bias, lengths, semiring, proj_start, proj_end,
                   plan: KernelPlan, reverse: bool, masks=None, shared: Optional[dict] = None, rows=None):
    """:func:`_blocked_chunks` as a generator that yields after each launch (and returns its
    result). ``shared``: a dict that two calls with the same duration bias and plan fill and read
    in turn (the linear sums' period and duration tables, made once; each call keeps its own
    counter of recomputed tiles); ``rows``: the output rows ((1 or 2, B, T+1, C) float32),
    else allocated here."""
    from torch_semimarkov.engines.triton.blocked import _blk_chunks_kernel

    B, T1, C = cum_scores.shape
    T = T1 - 1
    dev = cum_scores.device
    is_max = semiring == "max"
    W, n, K = plan.chunk, plan.n_chunks, plan.K
    shared = {} if shared is None else shared
    if rows is None:
        rows = torch.empty((1 if reverse else 2, B, T1, C), device=dev, dtype=torch.float32)
    frames = torch.empty((B, T1), device=dev, dtype=torch.float64)
    i32 = torch.empty((1,), device=dev, dtype=torch.int32)
    bk = torch.zeros((B, T1, C), device=dev, dtype=torch.int32) if is_max else i32
    bc = torch.zeros((B, T1, C), device=dev, dtype=torch.int32) if is_max else i32
    e32, e64, _, status, src, delta, steps = _chunk_state(B, n, K * C + plan.c_pad, K + 1, 0, dev)
    period = _blocked_period(duration_bias, plan, semiring, masks, shared)
    linear = period > 0
    (bt, rb, cb), (helpers, groups, parts, part_rows), (rhelp, rgroups, rparts, rpart_rows) = \
        _blocked_split(plan, period, C)
    scratch = torch.empty((B, n, bt, plan.c_pad), device=dev, dtype=torch.float32)
    scratch_k = torch.empty((B, n, bt, plan.c_pad), device=dev, dtype=torch.int32) if is_max else i32
    args = dict(
        cum_ptr=cum_scores, tr_ptr=transition, db_ptr=duration_bias, len_ptr=lengths,
        ps_ptr=proj_start if proj_start is not None else cum_scores,
        pe_ptr=proj_end if proj_end is not None else cum_scores,
        r_ptr=rows[0] if reverse else rows[1], a_ptr=rows[0], f_ptr=frames, bk_ptr=bk, bc_ptr=bc,
        e32=e32, e64=e64, sc_ptr=scratch, sk_ptr=scratch_k, st_ptr=status, src_ptr=src, dl_ptr=delta,
        cv_ptr=steps, C=C, K=K, W=W, NCH=n, s_cum_b=T1 * C, s_p_b=T * C, s_w_b=T1 * C, s_f_b=T1,
        TOL=fixup_tol(plan, semiring),
    )
    if masks is not None:
        # the segment limits of limits.py: min_start for the forward, max_end for beta
        args.update(lim_ptr=masks[1] if reverse else masks[0], fl_ptr=masks[2], HAS_MASK=True)
    elif linear:
        made = "tables" in shared
        ed, md, kr = _blocked_tables(duration_bias, plan, period, C, shared)
        if made:
            kr = kr.clone()  # tables made before this call: a counter of its own
        if RECOMPUTED is not None:
            blocks = (lengths.long() + bt - 1) // bt * ((C + cb - 1) // cb)
            RECOMPUTED.append((kr[3, 0], blocks.sum()))  # a view: the kernel's count once it has run
        # the rare term-by-term recomputation of a tile: at most 8192 terms a (BT, RBX, CB) tile
        args.update(ed_ptr=ed, md_ptr=md, kr_ptr=kr, LINEAR=period, RBX=max(1, min(rb, 8192 // (bt * cb))))
    phase_meta = None  # {phase: launch entries of that phase only}
    if is_max and plan.max_bounds:
        args.update(ed_ptr=max_bound_table(duration_bias, K, bt))
        phase_meta = {ph: {"MAX_BOUND": ph in plan.max_bound_phases} for ph in (1, 2, 3)}
    meta = dict(C_PAD=plan.c_pad, K_PAD=plan.k_pad, CB=cb, RB=rb, BT=bt, REVERSE=reverse,
                IS_MAX=is_max, HAS_PS=proj_start is not None, HAS_PE=proj_end is not None,
                num_warps=plan.num_warps, IDX64=plan.idx64)
    roles, reset, rroles, rreset = 1, None, 1, None
    if helpers or rhelp:
        inline = _plan.HELP_INLINE if _plan.HELP_INLINE is not None else not cum_scores.is_cuda
        nblk = -(-W // bt) + 1
        hp = torch.empty((B, n), device=dev, dtype=torch.int32)
        hf = torch.empty((B, n, max(helpers, rhelp)), device=dev, dtype=torch.int32)
        # the helpers' sums: two blocks' slots, and a third for a run that computes them itself
        hargs = dict(hp_ptr=hp, hf_ptr=hf, hh_ptr=torch.empty((B, n, nblk), device=dev, dtype=torch.float64),
                     hs_ptr=torch.empty((B, n, 3, max(parts, rparts), bt, plan.c_pad), device=dev, dtype=torch.float32),
                     hk_ptr=torch.empty((B, n, 3, max(parts, rparts), bt, plan.c_pad), device=dev,
                                        dtype=torch.int32) if is_max else i32,
                     NBLK=nblk, SPIN=RUN_SPIN if cum_scores.is_cuda else 0,
                     HSPIN=HELPER_SPIN if cum_scores.is_cuda else 0)

        def clear():
            hp.fill_(-1)
            hf.fill_(-1)
        if helpers:
            args.update(hargs, HRS=part_rows)
            meta.update(HELPERS=helpers, HG=groups, HR=parts, INLINE=inline, MB=min(bt, 16))
            if not inline:
                roles, reset = 1 + helpers, clear
        if rhelp:
            phase_meta = phase_meta or {}
            phase_meta[3] = {**phase_meta.get(3, {}), **hargs, "HRS": rpart_rows, "HELPERS": rhelp, "HG": rgroups,
                             "HR": rparts, "INLINE": inline, "MB": min(bt, 16)}
            if not inline:
                rroles, rreset = 1 + rhelp, clear
    redone = yield from _phases(_blk_chunks_kernel, B, n, args, meta, steps, roles, reset, phase_meta, rroles,
                                rreset)
    stats = ChunkStats(status.bool(), steps, redone)
    if reverse:
        return rows, backward_offsets(frames, delta, W), None, stats
    bp = None
    if is_max:
        # bp[t, c] = k * 65536 + (argmax source label of U at t - k)
        # (rows with no allowed segment carry an arbitrary k: clamped, never traced)
        src_row = (torch.arange(T1, device=dev)[None, :, None] - bk.long()).clamp(0, T1 - 1)
        bp = bk * 65536 + torch.gather(bc, 1, src_row).to(torch.int32)
    return rows, forward_offsets(frames, delta, W), bp, stats


_SIDE_STREAMS: dict = {}

#: Which of :func:`blocked_forward_beta`'s two recurrences launches each phase first (the other
#: follows after its own host preparation, ~0.3 ms later): ``"forward"`` (its spec runs ~0.2 ms
#: longer than beta's, so it ends last if launched last; GPU_NOTES 104) or ``"beta"``.
BESIDE_FIRST = "forward"


def _side_stream(dev):
    """One second CUDA stream per device for :func:`blocked_forward_beta` (made once: each call's
    work on it is ordered by the events it waits for)."""
    dev = torch.device(dev)
    key = dev.index if dev.index is not None else torch.cuda.current_device()
    if key not in _SIDE_STREAMS:
        _SIDE_STREAMS[key] = torch.cuda.Stream(device=dev)
    return _SIDE_STREAMS[key]


def blocked_forward_beta(cum_scores, transition, duration_bias, lengths, proj_start, proj_end, plan: KernelPlan):
    """The blocked engine's forward and beta recurrences side by side (``plan.beta_early``): beta's
    launches on a second CUDA stream, the forward's on the current one, phase for phase (the one
    of :data:`BESIDE_FIRST` first, the other at once after it), so that neither waits for the host
    to prepare it after the other's launches (GPU_NOTES 96, 104); the duration tables and the
    linear sums' period (a device synchronisation) are made once, before either, and the rows of
    both go into one (3, B, T+1, C) tensor (alpha_hat, U_hat, Y_hat), so that no copy joins them.
    On the CPU (the interpreter) the launches run in the same interleaved order on one stream; the
    outputs do not depend on it.

    Returns ``(saved (3, B, T+1, C), frames (B, T+1), g (B, T+1))``: the forward's and beta's
    rows and their global frames, owned by the current stream."""
    import contextlib

    B, T1, C = cum_scores.shape
    dev = cum_scores.device
    shared: dict = {}
    period = _blocked_period(duration_bias, plan, "log", None, shared)
    if period > 0:
        _blocked_tables(duration_bias, plan, period, C, shared)
    saved = torch.empty((3, B, T1, C), device=dev, dtype=torch.float32)
    fwd = _blocked_steps(cum_scores, transition, duration_bias, lengths, "log", proj_start, proj_end, plan, False,
                         shared=shared, rows=saved[:2])
    bwd = _blocked_steps(cum_scores, transition, duration_bias, lengths, "log", proj_start, proj_end, plan, True,
                         shared=shared, rows=saved[2:])
    main = side = None
    if cum_scores.is_cuda:
        main = torch.cuda.current_stream(dev)
        side = _side_stream(dev)
        side.wait_stream(main)  # the inputs and the shared tables are ready
        # memory made on the current stream that beta's kernels use: not reused before they end
        for t in (saved, *shared.get("tables", ())):
            t.record_stream(side)
    out = {}
    order = (("beta", bwd, side), ("forward", fwd, None))
    if BESIDE_FIRST == "forward":
        order = order[::-1]
    while len(out) < 2:
        for name, gen, stream in order:
            if name in out:
                continue
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                try:
                    next(gen)
                except StopIteration as stop:
                    out[name] = stop.value
    _, frames, _, _ = out["forward"]
    _, g, _, _ = out["beta"]
    if side is not None:
        main.wait_stream(side)
        g.record_stream(main)
    return saved, frames, g


def _chunk_guesses(alpha_hat, seq, t0, plan: KernelPlan):
    """(R, n) int32: the guessed start node of chunk j of walk r, the best label of sequence
    ``seq[r]`` ending at ``min((j+1)·W, t0[r])`` (for the walk's last chunk, the truth)."""
    n = plan.n_chunks
    ends = torch.minimum((torch.arange(n, device=alpha_hat.device)[None, :] + 1) * plan.chunk, t0[:, None])
    return alpha_hat[seq[:, None], ends].argmax(-1).to(torch.int32)


def traceback_chunked(bp, alpha_hat, lengths, plan: KernelPlan):
    """Labels and segment starts from the chunked max-semiring forward's packed backpointers
    (``traceback.py``); ``lengths`` must be 0 for sequences with no segmentation.

    Returns ``(labels (B, T) int64, starts (B, T) bool, merged (B, n) bool)``.
    """
    B, T1, C = bp.shape
    W = plan.chunk
    guess = _chunk_guesses(alpha_hat, torch.arange(B, device=bp.device), lengths, plan)
    return _chunked_walk(lengths, guess, T1 - 1, C, plan.K, W, plan.idx64, dict(bp_ptr=bp, s_bp_b=T1 * C))


def traceback_from(bp, alpha_hat, seq, t0, c0, plan: KernelPlan):
    """Backpointer walks from given nodes: row r follows sequence ``seq[r]``'s backpointers from
    node ``(t0[r], c0[r])`` ("a segment of label c0 ends at t0") down to position 0, by the
    chunked walk of :func:`traceback_chunked` (each row reads a copy of its sequence's
    backpointers).

    Returns ``(labels (R, T) int64, starts (R, T) bool)``: -1 / False at and past ``t0``."""
    B, T1, C = bp.shape
    W = plan.chunk
    R = seq.shape[0]
    guess = _chunk_guesses(alpha_hat, seq, t0, plan)
    last = torch.clamp((t0 + W - 1) // W - 1, min=0)
    guess[torch.arange(R, device=bp.device), last] = c0.to(torch.int32)
    labels, starts, _ = _chunked_walk(t0.contiguous(), guess, T1 - 1, C, plan.K, W, plan.idx64,
                                      dict(bp_ptr=bp[seq].contiguous(), s_bp_b=T1 * C))
    return labels, starts


def sample_chunked(saved, frames, cum_scores, transition, duration_bias, lengths, uniforms, K: int,
                   chunk: int, proj_start=None):
    """Exact backward sampling of ``rows = uniforms.shape[0]`` walks, a multiple of B (row r
    samples sequence ``r % B``), from the forward's every-position state, by the chunked walk of
    ``traceback.py`` with drawn steps (``_draw``): a step is a function of its node and the uniforms of the node's
    position, so walks merge exactly as the traceback's do. ``lengths`` (B,) must be 0 for
    sequences with no segmentation; ``uniforms`` (rows, T+1, 2) float32 in [0, 1).

    A (K, C, C) ``transition`` walks end nodes (``_draw_kcc``): ``saved`` then holds alpha_hat only
    and ``proj_start`` (B, T, C) or None enters the draws (a (C, C) transition's U_hat holds it).

    Returns ``(labels (rows, T) int64, starts (rows, T) bool, merged (rows, n) bool)``.
    """
    B, T1, C = cum_scores.shape
    kcc = transition.dim() == 3
    rows = uniforms.shape[0]
    row_len = lengths.repeat(rows // B).contiguous()
    n = max(1, -(-(T1 - 1) // chunk))
    # every chunk starts from "the sequence ends here" (label C), the truth for the last one
    guess = torch.full((rows, n), C, device=cum_scores.device, dtype=torch.int32)
    idx64 = rows * T1 * 2 >= 2**31 or T1 * max(C, K) * 4 >= 2**31
    sample = dict(bp_ptr=guess, s_bp_b=0, SAMPLE=True, a_ptr=saved[0], w_ptr=saved[0 if kcc else 1], f_ptr=frames,
                  cum_ptr=cum_scores, tr_ptr=transition, db_ptr=duration_bias, u_ptr=uniforms, NB=B, K=K,
                  C_PAD=label_pad(C, 4), KCC=kcc, ps_ptr=guess if proj_start is None else proj_start,
                  HAS_PS=kcc and proj_start is not None)
    return _chunked_walk(row_len, guess, T1 - 1, C, K, chunk, idx64, sample)


def _chunked_walk(lengths, guess, T, C, K, W, idx64, extra):
    """The three launches of ``_traceback_chunks_kernel`` over ``lengths.shape[0]`` rows."""
    from torch_semimarkov.engines.triton.traceback import _traceback_chunks_kernel

    R, n = guess.shape
    dev = guess.device
    labels = torch.empty((R, T), device=dev, dtype=torch.int64)
    starts = torch.empty((R, T), device=dev, dtype=torch.bool)
    mark = torch.empty((R, T + 1), device=dev, dtype=torch.int32)
    exits = torch.empty((2, R, n, 3), device=dev, dtype=torch.int32)
    status = torch.ones((R, n), device=dev, dtype=torch.int32)
    src = torch.ones((R, n), device=dev, dtype=torch.int32)
    args = dict(guess_ptr=guess, len_ptr=lengths, lab_ptr=labels, st_ptr=starts.view(torch.int8),
                mk_ptr=mark, ex_ptr=exits, stt_ptr=status, src_ptr=src, C=C, T=T, W=W, NCH=n, **extra)
    k_block, fill = walk_blocks(K, W)
    meta = dict(K_BLOCK=k_block, FILL=fill, num_warps=WALK_WARPS, IDX64=idx64)
    _three_phases(_traceback_chunks_kernel, R, n, args, meta, status)
    return labels, starts, status.bool()
