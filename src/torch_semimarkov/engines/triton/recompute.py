"""Recompute every position's forward state from the sequential forward's checkpoints.

One program per (sequence, checkpoint interval) restores its checkpoint and reruns the forward
over its interval, with the forward's own kernel, operations and order: the register-ring forward
and its recompute are one compiled kernel (``CK_MODE``), the memory-ring and (K, C, C) kernels
read the rows before their interval from the checkpoint. So the recomputed values are the
forward's, bit for bit.
"""

from __future__ import annotations

import torch

from torch_semimarkov.engines.triton.common import REBASE
from torch_semimarkov.engines.triton.plan import KernelPlan, checkpoint_sizes


def init_reg_checkpoint(ck32, ck64, C, c_pad, k_pad):
    """Checkpoint 0 of the register-ring kernel: the initial state (empty ring, alpha_hat_0 = 0
    on the C real labels, every frame 0)."""
    from torch_semimarkov.engines.triton.common import MASK

    ck32[:, 0, : k_pad * c_pad] = MASK
    ck32[:, 0, k_pad * c_pad :] = torch.where(torch.arange(c_pad, device=ck32.device) < C, 0.0, MASK)
    ck64[:, 0] = 0.0


def recompute_forward_state(cum_scores, transition, duration_bias, lengths, proj_start, proj_end,
                            plan: KernelPlan, ck32, ck64):
    """Every position's forward state, recomputed from the checkpoints of a sequential forward run
    with the same ``plan``.

    Returns ``(saved, frames)``: ``saved`` (2, B, T+1, C) float32 ``alpha_hat`` and ``U_hat``
    ((1, B, T+1, C), ``alpha_hat`` only, for (K, C, C) transitions), ``frames`` (B, T+1) float64,
    the layout the backward kernels read. Positions past a sequence's length are not written.
    """
    from torch_semimarkov.engines.triton.forward import _fwd_duration_tr_kernel, _fwd_factored_kernel, _fwd_factored_reg_kernel

    B, T1, C = cum_scores.shape
    T = T1 - 1
    dev = cum_scores.device
    K_eff, nck, delta = plan.K, plan.n_checkpoints, plan.interval
    if tuple(ck32.shape) != (B, nck, checkpoint_sizes(plan.kind, C, K_eff)[0]):
        raise ValueError("checkpoints do not match these inputs (same K, plan and interval as the forward?)")
    saved = torch.empty((1 if plan.kind == "dur" else 2, B, T1, C), device=dev, dtype=torch.float32)
    frames = torch.empty((B, T1), device=dev, dtype=torch.float64)
    i32 = torch.empty((1,), device=dev, dtype=torch.int32)
    out = torch.empty((1,), device=dev, dtype=torch.float64)
    common = dict(
        cum_ptr=cum_scores, tr_ptr=transition, db_ptr=duration_bias, len_ptr=lengths,
        ps_ptr=proj_start if proj_start is not None else cum_scores,
        pe_ptr=proj_end if proj_end is not None else cum_scores,
        out_ptr=out, last_ptr=i32, ck_ptr=ck32, ckf_ptr=ck64, C=C, K=K_eff, s_cum_b=T1 * C, s_p_b=T * C,
        HAS_PS=proj_start is not None, HAS_PE=proj_end is not None, num_warps=plan.num_warps, IDX64=plan.idx64,
    )
    grid = (B, nck)
    if plan.kind == "dur":
        _fwd_duration_tr_kernel[grid](
            **common, a_ptr=saved[0], f_ptr=frames, bpk_ptr=i32, bpc_ptr=i32, R=T1, s_a_b=T1 * C, s_f_b=T1,
            s_bp_b=0, DELTA=delta, NCK=nck, C_PAD=plan.c_pad, IS_MAX=False, RESTORE=True,
        )
    elif plan.kind == "reg":
        # the forward's own compiled kernel (CK_MODE): only the runtime range and flags differ
        _fwd_factored_reg_kernel[grid](
            **common, w_ptr=saved[1], a_ptr=saved[0], f_ptr=frames, bp_ptr=i32, s_w_b=T1 * C, s_f_b=T1,
            s_bp_b=T1 * C, DELTA=delta, NCK=nck, RANGE=delta, FLAGS=2, CKS=plan.c_pad,
            CK32S=plan.k_pad * plan.c_pad + plan.c_pad, C_PAD=plan.c_pad, K_PAD=plan.k_pad, IS_MAX=False,
            STORE=True, REBASE=REBASE, CK_MODE=True,
        )
    else:
        _fwd_factored_kernel[grid](
            **common, w_ptr=saved[1], a_ptr=saved[0], f_ptr=frames, bpk_ptr=i32, bpc_ptr=i32, R=T1,
            s_w_b=T1 * C, s_a_b=T1 * C, s_f_b=T1, s_bp_b=0, DELTA=delta, NCK=nck, C_PAD=plan.c_pad,
            K_BLOCK=plan.k_block, IS_MAX=False, STORE_ALPHA=True, RESTORE=True,
        )
    return saved, frames
