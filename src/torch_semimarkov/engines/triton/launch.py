"""Launchers of the Triton engine: forward, backward and Viterbi, each from one :class:`KernelPlan`.

Inputs must be validated (``validate_streaming_inputs``) and on a CUDA device (or CPU tensors
under ``TRITON_INTERPRET=1``). Every kernel is launched by keyword.

* :func:`launch_forward`: log Z (or the best score) and, for a backward, what it needs: the
  sequential engine's checkpoints, or the time-parallel engine's every-position rows.
* :func:`launch_backward`: every marginal and per-sequence parameter gradient of log Z.
* :func:`launch_viterbi`: best score, labels and segment starts.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from torch_semimarkov.engines.torch.reference import feasible, public_score, zero_rows
from torch_semimarkov.engines.triton.common import HAS_TRITON, REBASE, next_pow2
from torch_semimarkov.engines.triton.parallel import (beta_chunked, blocked_forward_beta, forward_chunked,
                                                      traceback_chunked)
from torch_semimarkov.engines.triton.plan import (AUX_WARPS, WALK_WARPS, KernelPlan, anchor_spacing, anchor_splits,
                                                  checkpoint_sizes, duration_marginal_chunks, make_plan, marginal_chunks,
                                                  position_chunks, seg_chunks, seg_label_groups, walk_blocks)
from torch_semimarkov.engines.triton.recompute import init_reg_checkpoint, recompute_forward_state


#: Probes set this to count the blocked marginal kernel's tiles (linear, log space, skipped) per
#: (sequence, chunk) into ``LAST_MARG_STATS``.
STATS = False
LAST_MARG_STATS: Optional[torch.Tensor] = None


class ForwardState(NamedTuple):
    """What a forward keeps for its backward: with ``plan.time_parallel`` every position's rows
    ``(saved (2, B, T+1, C) float32, frames (B, T+1) float64)`` (with ``plan.beta_early`` beta's
    rows and frames too: ``saved`` one slab more, ``frames`` (2, B, T+1)), else the checkpoints
    ``(ck32 (B, n, n32) float32, ck64 (B, n, n64) float64)``."""

    first: torch.Tensor
    second: torch.Tensor


def plan_for(cum_scores, transition, K, semiring="log", num_warps=None, time_parallel=None, checkpoint_interval=None,
             backward=False):
    """The :class:`KernelPlan` of a call with these inputs (``backward``: a forward that will be
    differentiated, and its backward, see :func:`~.plan.make_plan`)."""
    B, T1, C = cum_scores.shape
    return make_plan(B, T1 - 1, K, C, duration_transitions=transition.dim() == 3, semiring=semiring,
                     num_warps=num_warps, time_parallel=time_parallel, checkpoint_interval=checkpoint_interval,
                     device=cum_scores.device, backward=backward)


def _prepare(cum_scores, transition, duration_bias, lengths, proj_start, proj_end):
    if not HAS_TRITON:
        raise RuntimeError("Triton is not available")
    c = lambda x: None if x is None else x.contiguous()  # noqa: E731
    lengths = lengths.to(device=cum_scores.device, dtype=torch.int64).contiguous()
    return c(cum_scores), c(transition), c(duration_bias), lengths, c(proj_start), c(proj_end)


def final_scores(alpha_hat, frames, lengths, semiring: str = "log"):
    """(B,) float64 log Z (``"log"``) or best score (``"max"``) from the rows an engine kept for
    every position: ``frames[b, L_b]`` plus the log-sum-exp (max) of ``alpha_hat[b, L_b]``
    ((B, T+1, C) float32 rows, (B, T+1) float64 global frames), in float64 (a float32 partition's
    rounding, 0.06 at log Z ~ 1e6, would bias every marginal)."""
    rows = torch.arange(alpha_hat.shape[0], device=alpha_hat.device)
    last = alpha_hat[rows, lengths].double()
    return frames[rows, lengths] + (last.max(-1).values if semiring == "max" else torch.logsumexp(last, -1))


def _sequential_forward(cum_scores, transition, duration_bias, lengths, semiring, proj_start, proj_end,
                        plan: KernelPlan, save: Optional[str]):
    """One program per sequence. ``save``: None, ``"checkpoints"`` (every ``plan.interval``
    positions) or ``"all"`` (every position, the layout the backward kernels read).

    Returns ``(out (B,) float64, state, (bpk, bpc, last))``."""
    from torch_semimarkov.engines.triton.forward import _fwd_duration_tr_kernel, _fwd_factored_kernel, _fwd_factored_reg_kernel

    B, T1, C = cum_scores.shape
    T = T1 - 1
    dev = cum_scores.device
    is_max = semiring == "max"
    full = save == "all" and not is_max
    ckpt = save == "checkpoints" and not is_max
    K_eff, kind, delta, nck = plan.K, plan.kind, plan.interval, plan.n_checkpoints
    R = T1 if full else 1 << max(0, K_eff.bit_length())  # ring rows: a power of two > K
    frames = torch.empty((B, R), device=dev, dtype=torch.float64)
    out = torch.empty((B,), device=dev, dtype=torch.float64)
    last = torch.empty((B,), device=dev, dtype=torch.int32)
    i32 = torch.empty((1,), device=dev, dtype=torch.int32)
    bpk = torch.empty((B, T1, C), device=dev, dtype=torch.int32) if is_max else i32
    # the register-ring kernel packs (k, c_prev) into one int32 per (t, c): one dependent load per
    # segment in the traceback instead of two
    bpc = torch.empty((B, T1, C), device=dev, dtype=torch.int32) if is_max and not plan.packed_backpointers else bpk
    n32, n64 = checkpoint_sizes(kind, C, K_eff)
    if ckpt:
        ck32 = torch.empty((B, nck, n32), device=dev, dtype=torch.float32)
        ck64 = torch.empty((B, nck, n64), device=dev, dtype=torch.float64)
    else:
        ck32 = torch.empty((1,), device=dev, dtype=torch.float32)
        ck64 = torch.empty((1,), device=dev, dtype=torch.float64)
    # alpha_hat and U_hat share one allocation so that the backward state is a single tensor
    saved = torch.empty((1 if kind == "dur" else 2, B, T1, C), device=dev, dtype=torch.float32) if full else None
    common = dict(
        cum_ptr=cum_scores, tr_ptr=transition, db_ptr=duration_bias, len_ptr=lengths,
        ps_ptr=proj_start if proj_start is not None else cum_scores,
        pe_ptr=proj_end if proj_end is not None else cum_scores,
        out_ptr=out, last_ptr=last, C=C, K=K_eff, s_cum_b=T1 * C, s_p_b=T * C,
        HAS_PS=proj_start is not None, HAS_PE=proj_end is not None, IS_MAX=is_max, C_PAD=plan.c_pad,
        num_warps=plan.num_warps, IDX64=plan.idx64,
    )
    if kind == "dur":
        alpha_hat = saved[0] if full else torch.empty((B, R, C), device=dev, dtype=torch.float32)
        _fwd_duration_tr_kernel[(B,)](
            **common, a_ptr=alpha_hat, f_ptr=frames, bpk_ptr=bpk, bpc_ptr=bpc, ck_ptr=ck32, ckf_ptr=ck64,
            R=R, s_a_b=R * C, s_f_b=R, s_bp_b=T1 * C, DELTA=delta, NCK=nck, CKPT=ckpt,
        )
    elif kind == "reg":
        dummy = torch.empty((1,), device=dev, dtype=torch.float32)
        ck_mode = full or ckpt
        flags = 0
        if full:
            # the save-all forward runs the checkpointing kernel (same compiled code), from an
            # initial-state checkpoint
            ck32 = torch.empty((B, 1, n32), device=dev, dtype=torch.float32)
            ck64 = torch.empty((B, 1, n64), device=dev, dtype=torch.float64)
            flags = 2 | 4
        elif ckpt:
            flags = 1 | 4
        if ck_mode:
            init_reg_checkpoint(ck32, ck64, C, plan.c_pad, plan.k_pad)
        _fwd_factored_reg_kernel[(B,)](
            **common, w_ptr=saved[1] if full else dummy, a_ptr=saved[0] if full else dummy,
            f_ptr=frames if full else torch.empty((1,), device=dev, dtype=torch.float64), bp_ptr=bpk,
            ck_ptr=ck32, ckf_ptr=ck64, s_w_b=T1 * C, s_f_b=T1, s_bp_b=T1 * C,
            DELTA=delta if ckpt else max(T, 1), NCK=ck32.shape[1] if ck_mode else 1, RANGE=max(T, 1), FLAGS=flags,
            CKS=plan.c_pad, CK32S=plan.k_pad * plan.c_pad + plan.c_pad, K_PAD=plan.k_pad, STORE=ck_mode,
            REBASE=REBASE, CK_MODE=ck_mode,
        )
    else:
        w_hat = saved[1] if full else torch.empty((B, R, C), device=dev, dtype=torch.float32)
        alpha_hat = saved[0] if full else torch.empty((1,), device=dev, dtype=torch.float32)
        _fwd_factored_kernel[(B,)](
            **common, w_ptr=w_hat, a_ptr=alpha_hat, f_ptr=frames, bpk_ptr=bpk, bpc_ptr=bpc, ck_ptr=ck32,
            ckf_ptr=ck64, R=R, s_w_b=R * C, s_a_b=T1 * C, s_f_b=R, s_bp_b=T1 * C, DELTA=delta, NCK=nck,
            K_BLOCK=plan.k_block, STORE_ALPHA=full, CKPT=ckpt,
        )
    if full:
        state = ForwardState(saved, frames)
    elif ckpt:
        state = ForwardState(ck32, ck64)
    else:
        state = None
    return out, state, (bpk, bpc, last)


def _check_masked(plan: KernelPlan, masks):
    if masks is not None and not (plan.time_parallel and plan.kind in ("reg", "mem", "dur")):
        raise ValueError("segment masks run on the time-parallel engines only (see masked_plan)")


def launch_forward(cum_scores, transition, duration_bias, lengths, K, semiring="log", proj_start=None,
                   proj_end=None, *, plan: Optional[KernelPlan] = None, save_for_backward: bool = True,
                   save: Optional[str] = None, masks=None, beta: bool = False):
    """log Z (log semiring) or the best score (max semiring) of a batch, on the GPU.

    Args:
        cum_scores ... proj_end: validated inputs (see ``semi_crf_streaming_forward``).
        plan: the call's :class:`KernelPlan` (default: :func:`plan_for` these inputs).
        save_for_backward: keep what :func:`launch_backward` needs (log semiring).
        save: force ``"all"`` (every position) or ``"checkpoints"`` on the sequential engine
            (tests); the time-parallel engine always keeps every position.
        masks: ``(min_start, max_end, flags)`` of a constrained call, from
            :func:`~.limits.engine_limits` (``plan`` from :func:`~.plan.masked_plan`).
        beta: the caller runs :func:`launch_backward` next: where ``plan.beta_early`` (unmasked,
            log semiring), run the beta recurrence now beside the forward and keep it in ``state``.

    Returns:
        ``(partition (B,) float64, state)``: the partition is ``-inf`` for a sequence with no
        allowed segmentation; ``state`` is a :class:`ForwardState` for :func:`launch_backward`, or
        None without ``save_for_backward`` or in the max semiring.
    """
    cum_scores, transition, duration_bias, lengths, proj_start, proj_end = _prepare(
        cum_scores, transition, duration_bias, lengths, proj_start, proj_end)
    plan = plan or plan_for(cum_scores, transition, K, semiring)
    _check_masked(plan, masks)
    if plan.time_parallel:
        early = (beta and save_for_backward and semiring == "log" and plan.beta_early and masks is None
                 and plan.kind == "mem")  # the plan sets beta_early for the blocked engine only
        if early:
            # beta's rows as one more slab of the saved rows, its frames beside the forward's
            saved, frames, g = blocked_forward_beta(cum_scores, transition, duration_bias, lengths, proj_start,
                                                    proj_end, plan)
        else:
            saved, frames, _, _ = forward_chunked(cum_scores, transition, duration_bias, lengths, semiring,
                                                  proj_start, proj_end, plan, masks=masks)
        out = final_scores(saved[0], frames, lengths, semiring)
        state = ForwardState(saved, frames) if (save_for_backward and semiring == "log") else None
        if early:
            state = ForwardState(saved, torch.stack([frames, g]))
        return public_score(out), state
    if save is None:
        save = "checkpoints" if save_for_backward else None
    out, state, _ = _sequential_forward(cum_scores, transition, duration_bias, lengths, semiring, proj_start,
                                        proj_end, plan, save)
    return public_score(out), state


def _blk_tiles(plan: KernelPlan, duration_bias):
    """What both launches of ``marginals._blk_seg_kernel`` share: the tile, its warps and the
    duration tables ``ED`` / ``MD`` (``tables.duration_tables``, one kernel, made once per backward)."""
    from torch_semimarkov.engines.triton.parallel import LINEAR_SPREAD
    from torch_semimarkov.engines.triton.tables import duration_tables

    bs, bk, cb = plan.marg_tile
    ed, md, _, _ = duration_tables(duration_bias, plan.K, plan.c_pad, bk, LINEAR_SPREAD)
    return dict(db_ptr=duration_bias, ed_ptr=ed, md_ptr=md, BS=bs, BK=bk, CB=cb, BE=next_pow2(bs + bk - 1),
                LOG_ONLY=plan.marg == "log", num_warps=plan.marg_warps)


def _blk_scratch(tiles, B, programs, dev):
    """Per-program scratch of ``_blk_seg_kernel``: the tile's end rows (linear, log) and end frames."""
    be, cb = tiles["BE"], tiles["CB"]
    return dict(sc_ptr=torch.empty((B, programs, 2, be, cb), device=dev, dtype=torch.float32),
                sg_ptr=torch.empty((B, programs, be), device=dev, dtype=torch.float64))


def _blk_anchors(rows_in, tiles, cum_scores, w_hat, lz, B, n_anchor):
    """The anchors' log Z (B, NA) float64 of the blocked engine by ``marginals._blk_seg_kernel``
    (``ANCHOR``): each anchor's covering segments summed under the sequence's log Z ``lz`` (B,),
    its starts split over NS programs so that the anchors fill the GPU."""
    from torch_semimarkov.engines.triton.marginals import _blk_seg_kernel

    dev = cum_scores.device
    ns = anchor_splits(B, n_anchor, dev)
    sums = torch.zeros((B, n_anchor, ns), device=dev, dtype=torch.float32)
    keys = ("len_ptr", "f_ptr", "x_ptr", "g_ptr", "C", "K", "A", "NA", "s_cum_b", "s_a_b", "s_f_b", "C_PAD", "IDX64")
    _blk_seg_kernel[(B, n_anchor * ns)](**{k: rows_in[k] for k in keys}, **tiles,
                                        **_blk_scratch(tiles, B, n_anchor * ns, dev), cum_ptr=cum_scores,
                                        anc_ptr=lz, w_ptr=w_hat, pst_ptr=sums, wdb_ptr=sums, st_ptr=sums, CH=1,
                                        NCH=n_anchor * ns, s_p_b=0, ANCHOR=True, NS=ns)
    tot = sums.double().sum(-1)
    return lz[:, None] + torch.log(torch.where(tot > 0, tot, torch.ones_like(tot)))


def _blk_segments(marg, tiles, w_hat, wdb, B, nch, groups):
    """P_start (into ``marg["pst_ptr"]``) and the per-chunk duration marginals (into ``wdb``) of the
    blocked engine by ``marginals._blk_seg_kernel``, each chunk's label tiles over ``groups``
    programs (``plan.seg_label_groups``). With ``STATS`` set, the kernel's tile counts (linear, log
    space, skipped) per (sequence, chunk and label group) are kept in ``LAST_MARG_STATS``."""
    global LAST_MARG_STATS
    from torch_semimarkov.engines.triton.marginals import _blk_seg_kernel

    dev = wdb.device
    programs = nch * groups
    st = torch.zeros((B, programs, 3), device=dev, dtype=torch.int32)
    keys = ("cum_ptr", "len_ptr", "anc_ptr", "f_ptr", "x_ptr", "g_ptr", "pst_ptr", "C", "K", "CH", "NCH",
            "A", "NA", "s_cum_b", "s_a_b", "s_f_b", "s_p_b", "C_PAD", "IDX64")
    _blk_seg_kernel[(B, programs)](**{k: marg[k] for k in keys}, **tiles, **_blk_scratch(tiles, B, programs, dev),
                                   w_ptr=w_hat, wdb_ptr=wdb, st_ptr=st, STATS=STATS, LG=groups)
    if STATS:
        LAST_MARG_STATS = st


def anchor_log_z(plan: KernelPlan, rows_in: dict, B: int, n_anchor: int, dev, **args):
    """log Z from the stored rows at the ``n_anchor`` anchors of each sequence
    (``marginals._anchor_kernel`` with ``rows_in`` and ``args``): ``(anchors (B, n_anchor) float64,
    NS)``. The blocked engine's few anchors of O(K²·C) each split their starts over NS programs
    (:func:`~.plan.anchor_splits`), whose partial log-sums are reduced here in float64, so that they
    fill the GPU; other plans take one program an anchor (NS = 1)."""
    from torch_semimarkov.engines.triton.marginals import _anchor_kernel

    ns = anchor_splits(B, n_anchor, dev) if plan.kind == "mem" and plan.time_parallel else 1
    out = torch.empty((B, n_anchor, ns), device=dev, dtype=torch.float64)
    _anchor_kernel[(B, n_anchor * ns)](**rows_in, **args, out_ptr=out, NS=ns)
    return (torch.logsumexp(out, -1) if ns > 1 else out[..., 0]), ns


def launch_backward(cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end, *, plan: KernelPlan,
                    state: ForwardState, masks=None):
    """Marginals and per-sequence parameter gradients of log Z (unscaled by any upstream gradient),
    from the forward's ``state`` under the same ``plan``.

    Returns:
        ``(p_start (B, T, C), p_end (B, T, C), grad_transition (B, C, C) or (B, K, C, C),
        grad_duration_bias (B, K, C))`` in the dtype of ``cum_scores``. ``p_end`` is indexed by a
        segment's last position; positions at or past a sequence's length, and every value of a
        sequence with no allowed segmentation, are 0.
    """
    from torch_semimarkov.engines.triton.beta import (_beta_duration_tr_kernel, _beta_factored_kernel,
                                                      _beta_factored_reg_kernel, beta_transition)
    from torch_semimarkov.engines.triton.marginals import _shared_factored_kernel

    cum_scores, transition, duration_bias, lengths, proj_start, proj_end = _prepare(
        cum_scores, transition, duration_bias, lengths, proj_start, proj_end)
    B, T1, C = cum_scores.shape
    T = T1 - 1
    dev = cum_scores.device
    dtype = cum_scores.dtype
    K, K_eff = int(K), plan.K
    _check_masked(plan, masks)
    early = None
    if plan.time_parallel:
        saved, frames = state
        if frames.dim() == 3:  # beta ran beside the forward (plan.beta_early): its slab and frames
            early = saved[-1], frames[1]
            saved, frames = saved[:-1], frames[0]
    else:
        # every position's alpha_hat / U_hat and frames, recomputed interval by interval from the
        # checkpoints into a transient buffer (freed when this function returns)
        saved, frames = recompute_forward_state(cum_scores, transition, duration_bias, lengths, proj_start, proj_end,
                                                plan, state.first, state.second)
    alpha_hat = saved[0]
    w_hat = saved[1] if saved.shape[0] > 1 else None
    # log Z in float64 from the saved state
    lz = final_scores(alpha_hat, frames, lengths)
    # an infeasible sequence (no allowed segmentation) has no marginals: its anchors are 0, so that
    # every value is exp(IMPOSSIBLE) = 0, and it is zeroed explicitly at the end
    ok = feasible(lz)
    ps = proj_start if proj_start is not None else cum_scores
    pe = proj_end if proj_end is not None else cum_scores
    dur_tr = plan.kind == "dur"
    inputs = dict(cum_ptr=cum_scores, tr_ptr=transition, db_ptr=duration_bias, len_ptr=lengths, C=C, K=K_eff,
                  s_cum_b=T1 * C)
    if early is not None:
        x_hat, g = early
    elif plan.time_parallel:
        x_hat, g, _ = beta_chunked(cum_scores, transition, duration_bias, lengths, proj_start, proj_end, plan,
                                   masks=masks)
    else:
        x_hat = torch.empty((B, T1, C), device=dev, dtype=torch.float32)
        g = torch.empty((B, T1), device=dev, dtype=torch.float64)
        beta = dict(**inputs, ps_ptr=ps, pe_ptr=pe, x_ptr=x_hat, g_ptr=g, s_p_b=T * C, s_a_b=T1 * C, s_f_b=T1,
                    C_PAD=plan.c_pad, HAS_PS=proj_start is not None, HAS_PE=proj_end is not None,
                    num_warps=plan.num_warps, IDX64=plan.idx64)
        if dur_tr:
            _beta_duration_tr_kernel[(B,)](**dict(beta, tr_ptr=beta_transition(transition)))
        else:
            lzb = torch.empty((B,), device=dev, dtype=torch.float64)
            if plan.kind == "reg":
                _beta_factored_reg_kernel[(B,)](**beta, w_ptr=w_hat, f_ptr=frames, lzb_ptr=lzb, K_PAD=plan.k_pad,
                                                REBASE=REBASE)
            else:
                _beta_factored_kernel[(B,)](**beta, w_ptr=w_hat, f_ptr=frames, lzb_ptr=lzb, K_BLOCK=plan.k_block)
    if dur_tr:
        p_start, p_end, g_tr, _ = dur_marginals(cum_scores, transition, duration_bias, lengths, proj_start, proj_end,
                                                plan, alpha_hat, frames, x_hat, g, ok, masks)
        return finish_marginals(p_start, p_end, g_tr, g_tr.sum(2), ok, K, dtype)
    p_start = torch.zeros((B, T, C), device=dev, dtype=torch.float32)
    p_end = torch.zeros((B, T, C), device=dev, dtype=torch.float32)
    ch, nch = marginal_chunks(B, T, C, K_eff * C + C * C)
    # log Z from the stored rows every A positions (exact there): each marginal is normalised by the
    # value interpolated between its two anchors, so only the drift over A positions of the float32
    # recurrences (and of the time-parallel engine's offsets) remains
    A = anchor_spacing(plan, T)
    # the blocked engine (large K): the anchors, P_start and the duration marginals as (start,
    # duration, label) tiles (``_blk_seg_kernel``), then the per-position kernel for the rest
    tiled = plan.kind == "mem" and plan.time_parallel and masks is None and plan.marg != "position"
    n_anchor = -(-T // A) + 1
    rows_in = dict(len_ptr=lengths, f_ptr=frames, x_ptr=x_hat, g_ptr=g, C=C, K=K_eff, A=A, NA=n_anchor,
                   s_cum_b=T1 * C, s_a_b=T1 * C, s_f_b=T1, C_PAD=plan.c_pad, num_warps=AUX_WARPS, IDX64=plan.idx64)
    if tiled:
        tiles = _blk_tiles(plan, duration_bias)
        anchors = _blk_anchors(rows_in, tiles, cum_scores, w_hat, torch.where(ok, lz, 0.0), B, n_anchor)
    else:
        extra = {} if masks is None else dict(me_ptr=masks[1], HAS_MASK=True)
        anchors, _ = anchor_log_z(plan, rows_in, B, n_anchor, dev, cum_ptr=cum_scores, db_ptr=duration_bias,
                                  w_ptr=w_hat, K_BLOCK=plan.k_block, **extra)
    anchors = torch.where(ok[:, None], anchors, torch.zeros_like(anchors))
    marg = dict(**inputs, pe_ptr=pe, anc_ptr=anchors, a_ptr=alpha_hat, f_ptr=frames, x_ptr=x_hat, g_ptr=g,
                pst_ptr=p_start, pend_ptr=p_end, CH=ch, NCH=nch, A=A, NA=n_anchor, s_a_b=T1 * C, s_f_b=T1,
                s_p_b=T * C, C_PAD=plan.c_pad, HAS_PE=proj_end is not None, num_warps=AUX_WARPS, IDX64=plan.idx64)
    if tiled:
        groups = seg_label_groups(C, tiles["CB"])
        # the tiles' own chunks: more of them where that fills the GPU's last wave (plan.seg_chunks)
        marg["CH"], marg["NCH"] = seg_chunks(B, T, K_eff, C, groups, tiles["BS"], dev)
        nch = marg["NCH"]
        wdb = torch.zeros((B, nch, K_eff, C), device=dev, dtype=torch.float32)
        _blk_segments(marg, tiles, w_hat, wdb, B, nch, groups)
        # the per-position kernel then keeps only a (C, C) workspace a chunk: finer chunks
        marg["CH"], marg["NCH"] = position_chunks(B, T, C)
    else:
        wdb = torch.empty((B, nch, K_eff, C), device=dev, dtype=torch.float32)
    wtr = torch.empty((B, marg["NCH"], C, C), device=dev, dtype=torch.float32)
    _shared_factored_kernel[(B, marg["NCH"])](**marg, w_ptr=w_hat, wtr_ptr=wtr, wdb_ptr=wdb, K_BLOCK=plan.k_block,
                                      ONE_KB=K_eff <= plan.k_block, SEG=not tiled,
                                      **({} if masks is None else dict(me_ptr=masks[1], HAS_MASK=True)))
    # fixed-order reductions over chunks (deterministic), without a float64 copy of the workspace
    return finish_marginals(p_start, p_end, wtr.sum(1).double(), wdb.sum(1).double(), ok, K, dtype)


def dur_marginals(cum_scores, transition, duration_bias, lengths, proj_start, proj_end, plan: KernelPlan,
                  alpha_hat, frames, x_hat, g, ok, masks=None, entropy=None):
    """The last two steps of a (K, C, C) backward (prepared inputs, a ``"dur"`` plan, the forward's
    ``alpha_hat`` and beta's ``Y_hat`` rows with their global frames): log Z at anchors every
    :func:`~.plan.anchor_spacing` positions from the rows themselves
    (``marginals._anchor_duration_tr_kernel``), each marginal normalised by the value interpolated
    between its two anchors, then every marginal (``marginals._shared_duration_tr_kernel``).
    ``ok`` (B,): the sequences with an allowed segmentation (the others' anchors are 0).
    ``entropy``: ``(h, fh, hy, gh)``, the prefix and suffix entropies and their global frames
    (``parallel.dur_entropy_chunked``): the anchors give H too, and the marginals are the
    entropy's weighted ones.

    Returns ``(p_start (B, T, C) float32, p_end (B, T, C) float32, g_tr (B, K', C, C) float64, H)``,
    the sums over each chunk's workspace reduced in a fixed order; H (B, NA) float64 the entropy
    at the anchors with ``entropy``, else None.
    """
    from torch_semimarkov.engines.triton.marginals import _anchor_duration_tr_kernel, _shared_duration_tr_kernel

    B, T1, C = cum_scores.shape
    T = T1 - 1
    dev = cum_scores.device
    K_eff = plan.K
    ps = proj_start if proj_start is not None else cum_scores
    A = anchor_spacing(plan, T)
    n_anchor = -(-T // A) + 1
    common = dict(cum_ptr=cum_scores, tr_ptr=transition, db_ptr=duration_bias, len_ptr=lengths, ps_ptr=ps,
                  a_ptr=alpha_hat, f_ptr=frames, x_ptr=x_hat, g_ptr=g, C=C, K=K_eff, A=A, NA=n_anchor,
                  s_cum_b=T1 * C, s_p_b=T * C, s_a_b=T1 * C, s_f_b=T1, C_PAD=plan.c_pad,
                  HAS_PS=proj_start is not None, IDX64=plan.idx64, num_warps=AUX_WARPS)
    if masks is not None:
        common.update(me_ptr=masks[1], fl_ptr=masks[2], HAS_MASK=True)
    H = None
    anchors = torch.empty((B, n_anchor), device=dev, dtype=torch.float64)
    if entropy is None:
        _anchor_duration_tr_kernel[(B, n_anchor)](**common, out_ptr=anchors)
    else:
        h, fh, hy, gh = entropy
        common.update(h_ptr=h, fh_ptr=fh, hy_ptr=hy, gh_ptr=gh, ENT=True)
        H = torch.empty((B, n_anchor), device=dev, dtype=torch.float64)
        _anchor_duration_tr_kernel[(B, n_anchor)](**common, out_ptr=anchors, hout_ptr=H)
        H = torch.where(ok[:, None], H, torch.zeros_like(H))
        common.update(hanc_ptr=H)
    anchors = torch.where(ok[:, None], anchors, torch.zeros_like(anchors))
    ch, nch = duration_marginal_chunks(B, T, K_eff, C)
    p_start = torch.zeros((B, T, C), device=dev, dtype=torch.float32)
    p_end = torch.zeros((B, T, C), device=dev, dtype=torch.float32)
    # every program stores all K blocks of its chunk's workspace (zeros where it has no segment)
    wtr = torch.empty((B, nch, K_eff, C, C), device=dev, dtype=torch.float32)
    _shared_duration_tr_kernel[(B, nch)](**common, pe_ptr=proj_end if proj_end is not None else cum_scores,
                                         anc_ptr=anchors, pst_ptr=p_start, pend_ptr=p_end, wtr_ptr=wtr, CH=ch,
                                         NCH=nch, HAS_PE=proj_end is not None)
    return p_start, p_end, wtr.sum(1).double(), H


def finish_marginals(p_start, p_end, g_tr, g_db, ok, K: int, dtype):
    """The backward's (or the entropy's weighted) marginals as they leave the engine: 0 for the
    sequences with no allowed segmentation (``ok`` False), the duration axis padded with zeros from
    the plan's K (at most T) to the call's ``K`` (a (K, C, C) transition's too), in ``dtype``."""
    for t in (p_start, p_end, g_tr, g_db):
        zero_rows(t, ok)
    B, K_eff, C = g_db.shape
    if K_eff < K:
        pad = K - K_eff
        g_db = torch.cat([g_db, g_db.new_zeros(B, pad, C)], 1)
        if g_tr.dim() == 4:
            g_tr = torch.cat([g_tr, g_tr.new_zeros(B, pad, C, C)], 1)
    return p_start.to(dtype), p_end.to(dtype), g_tr.to(dtype), g_db.to(dtype)


def launch_viterbi(cum_scores, transition, duration_bias, lengths, K, proj_start=None, proj_end=None, *,
                   plan: Optional[KernelPlan] = None, masks=None):
    """Best segmentation of each sequence: max-semiring forward and an on-GPU traceback.

    Ties break toward the smallest index: the smallest source label in ``u_s``, the smallest
    duration in ``alpha_t`` (for (K, C, C) transitions the lexicographically smallest (k, c')),
    and the smallest final label.

    Returns:
        ``(scores (B,) float64, labels (B, T) int64 with -1 past each length, seg_starts (B, T)
        bool)``; a sequence with no allowed segmentation has score ``-inf``, labels -1, no starts.
    """
    from torch_semimarkov.engines.triton.traceback import _traceback_kernel

    cum_scores, transition, duration_bias, lengths, proj_start, proj_end = _prepare(
        cum_scores, transition, duration_bias, lengths, proj_start, proj_end)
    plan = plan or plan_for(cum_scores, transition, K, "max")
    _check_masked(plan, masks)
    B, T1, C = cum_scores.shape
    T = T1 - 1
    dev = cum_scores.device
    if plan.time_parallel:
        saved, frames, bp, _ = forward_chunked(cum_scores, transition, duration_bias, lengths, "max", proj_start,
                                               proj_end, plan, masks=masks)
        out = final_scores(saved[0], frames, lengths, "max")
        # an infeasible sequence has no segmentation to trace: length 0 writes labels -1, no starts
        traced = torch.where(feasible(out), lengths, torch.zeros_like(lengths))
        labels, starts, _ = traceback_chunked(bp, saved[0], traced, plan)
        return public_score(out), labels, starts
    out, _, (bpk, bpc, last) = _sequential_forward(cum_scores, transition, duration_bias, lengths, "max",
                                                   proj_start, proj_end, plan, None)
    labels = torch.empty((B, T), device=dev, dtype=torch.int64)
    starts = torch.empty((B, T), device=dev, dtype=torch.bool)
    traced = torch.where(feasible(out), lengths, torch.zeros_like(lengths)).contiguous()
    k_block, fill = walk_blocks(plan.K, T)
    _traceback_kernel[(B,)](
        bpk_ptr=bpk, bpc_ptr=bpc, last_ptr=last, len_ptr=traced, lab_ptr=labels, st_ptr=starts.view(torch.int8),
        C=C, T=T, s_bp_b=T1 * C, BP_C_AT_END=plan.kind == "dur", PACKED=plan.packed_backpointers,
        K_BLOCK=k_block, FILL_BLOCK=fill, num_warps=WALK_WARPS, IDX64=plan.idx64,
    )
    return public_score(out), labels, starts
