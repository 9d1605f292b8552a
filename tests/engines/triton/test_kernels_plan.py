"""The kernel plan (``kernels/plan.py``): one decision per call, reused by every launch."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from torch_semimarkov.engines.triton.plan import make_plan  # noqa: E402


def test_long_sequences_in_small_batches_run_parallel_over_time():
    p = make_plan(1, 1_000_000, 64, 24)
    assert p.time_parallel and p.kind == "reg"
    assert p.chunk >= 4 * 64 and p.n_chunks * p.chunk >= 1_000_000
    # about four programs per multiprocessor of an H100/H200 (132)
    assert 400 <= p.n_chunks <= 600


def test_large_batches_keep_one_program_per_sequence():
    p = make_plan(1024, 1000, 100, 24)
    assert not p.time_parallel and p.n_chunks == 1


def test_short_sequences_keep_one_program_per_sequence():
    assert not make_plan(8, 100, 32, 8).time_parallel  # 100 < 2 chunks of 4·K


def test_forcing_the_engine():
    assert not make_plan(1, 100_000, 64, 24, time_parallel=False).time_parallel
    assert make_plan(512, 10_000, 32, 8, time_parallel=True).time_parallel
    p = make_plan(1, 100_000, 64, 24, duration_transitions=True, time_parallel=True)
    assert p.time_parallel and p.kind == "dur"
    with pytest.raises(ValueError, match="time_parallel=True needs K_PAD <= 1024"):
        make_plan(1, 100_000, 2000, 8, duration_transitions=True, time_parallel=True)


def test_duration_transitions_run_parallel_over_time_under_the_same_rule():
    p = make_plan(1, 1_000_000, 32, 8, duration_transitions=True)
    assert p.time_parallel and p.kind == "dur" and p.packed_backpointers
    assert p.chunk >= 4 * 32 and 400 <= p.n_chunks <= 600
    assert not make_plan(1024, 1000, 100, 24, duration_transitions=True).time_parallel  # the batch fills the GPU
    assert not make_plan(8, 100, 32, 8, duration_transitions=True).time_parallel  # one chunk
    # the state lives in memory: many labels run chunked too (gene grammars, K_PAD x C_PAD = 65536)
    for B, T, K, C in [(1, 100_000, 500, 64), (4, 100_000, 960, 47), (16, 20_000, 960, 47)]:
        p = make_plan(B, T, K, C, duration_transitions=True)
        assert p.time_parallel and p.kind == "dur" and p.packed_backpointers and p.n_chunks >= 2
        assert p.chunk >= 4 * K
    # sequences shorter than two chunks of 4·K keep one program each
    assert not make_plan(32, 3000, 960, 47, duration_transitions=True).time_parallel
    # K_PAD > 1024: the fix-up's offset intervals would not fit in registers
    assert not make_plan(1, 100_000, 2000, 47, duration_transitions=True).time_parallel


def test_rings_too_large_for_registers_run_the_blocked_engine():
    p = make_plan(1, 100_000, 1000, 64)  # 1024 x 64 ring
    assert p.time_parallel and p.kind == "mem" and p.packed_backpointers and p.n_chunks > 1
    p = make_plan(1, 100_000, 1000, 64, time_parallel=False)  # the sequential memory-ring kernel
    assert not p.time_parallel and p.kind == "mem"


def test_chunks_are_long_against_k():
    p = make_plan(4, 100_000, 1000, 8)
    assert p.time_parallel and p.chunk >= 4000 and p.num_warps == 8


@pytest.mark.parametrize("B,T,K,C", [(1024, 1000, 100, 24), (4096, 300, 64, 16), (8, 256, 16, 8),
                                     (1, 100000, 64, 24), (2, 3000, 300, 40), (512, 2000, 960, 47)])
def test_masked_plans_are_plans_the_masked_kernels_take(B, T, K, C):
    # a large batch once got the sequential memory-ring plan (few warps), which the masked kernels
    # refuse: the masked call then raised instead of running on one register-ring chunk
    from torch_semimarkov.engines.triton.launch import _check_masked
    from torch_semimarkov.engines.triton.plan import masked_plan

    for blocked in (False, True):
        plan = masked_plan(B, T, K, C, blocked=blocked)
        if plan is None:
            assert not blocked  # only a ring too large for registers, and only off the blocked engine
            continue
        _check_masked(plan, masks=object())
        assert plan.time_parallel and plan.kind in ("reg", "mem")


def test_no_launcher_chooses_warps_chunks_or_tiles_of_its_own():
    """Every launch decision lives in ``plan.py``: outside it, no kernel launch in the Triton
    engine passes warps as a number, and no module computes chunk lengths, padded label axes
    or walk blocks with its own formula (``next_pow2`` of a size, ``-(-T // ...)`` chunk counts
    from the multiprocessor count)."""
    import pathlib
    import re

    import torch_semimarkov.engines.triton as pkg

    offending = []
    for path in sorted(pathlib.Path(pkg.__file__).parent.glob("*.py")):
        if path.name in ("plan.py", "common.py"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if re.search(r"num_warps=\d", code) or "_sms(" in code or re.search(r"max\(\d+, next_pow2\(", code):
                offending.append(f"{path.name}:{n}: {line.strip()}")
    assert not offending, "\n".join(offending)


def test_the_launch_choices_around_the_recurrences():
    from torch_semimarkov.engines.triton import plan as plan_mod

    assert plan_mod.walk_blocks(5, 20) == (8, 32) and plan_mod.walk_blocks(1000, 5000) == (128, 1024)
    assert plan_mod.label_pad(3) == 4 and plan_mod.label_pad(1) == 2 and plan_mod.label_pad(3, 4) == 4
    # per-position marginals: 2048 programs at most, chunks of at least 32, a workspace of at most
    # twice the marginals
    ch, n = plan_mod.marginal_chunks(4, 100_000, 47, 960 * 47 + 47 * 47)
    assert ch * n >= 100_000 and n * (960 * 47 + 47 * 47) <= 2 * 100_001 * 47
    assert plan_mod.marginal_chunks(1, 10, 3, 1) == (10, 1)
    # (K, C, C) marginals: a (K, C, C) block a chunk; the (B, T, C) bound alone left one chunk a
    # sequence at gene-grammar sizes, the 256 MB budget gives many, and small sizes are unchanged
    K, C = 500, 47
    assert plan_mod.marginal_chunks(1, 20_000, C, K * C * C)[1] == 1
    ch, n = plan_mod.duration_marginal_chunks(1, 20_000, K, C)
    assert ch * n >= 20_000 and n >= 32 and n * K * C * C <= plan_mod.DUR_MARGINAL_WORKSPACE
    for B, T, K, C in [(3, 80, 6, 5), (2, 150, 12, 4), (512, 2000, 20, 8)]:
        assert plan_mod.duration_marginal_chunks(B, T, K, C) == plan_mod.marginal_chunks(B, T, C, K * C * C)
    # the anchors: about two programs per multiprocessor, at most 16 an anchor
    assert plan_mod.anchor_splits(4, 34, None) == 2 and plan_mod.anchor_splits(1, 2, None) == 16
    assert plan_mod.dense_tiles(10, 5, True) == (8, 8, 16) and plan_mod.dense_tiles(10, 5, False) == (8, 8, 16)
    assert plan_mod.dense_tiles(100, 40, False) == (64, 64, 1)


def test_batches_of_several_waves_run_one_chunk_where_that_is_faster(monkeypatch):
    """``plan.one_chunk_is_faster``: 128 gene loci padded to 5,318 positions would take two waves
    of 3,840-position chunks (and their fix-ups) against one wave of one chunk each; a ragged batch
    of 83 loci up to 19 kb keeps its chunks (the padded estimate is not 25% cheaper), and so do
    batches whose chunks fit one wave."""
    from torch_semimarkov.engines.triton import plan as plan_mod

    def chunks(B, T, K=960):
        return make_plan(B, T, K, 59, device="cuda").n_chunks

    assert chunks(128, 5318) == 1 and chunks(100, 8000) == 1
    assert chunks(83, 19079) == 5 and chunks(64, 10000) == 3 and chunks(8, 118212) == 31
    assert chunks(4, 100_000) == 33 and chunks(16, 20000) == 8  # one wave: unchanged
    monkeypatch.setattr(plan_mod, "WAVES_RULE", False)
    assert chunks(128, 5318) == 2 and chunks(100, 8000) == 3


def test_the_fixups_take_the_plans_tolerance(monkeypatch):
    """The blocked engine's log semiring converges at BLOCKED_LOG_TOL (its sums of ~K·C terms round
    differently in two frames, GPU_NOTES 68); its max semiring and the register-ring kernels keep
    FIXUP_TOL. Every chunked launch is given the plan's tolerance."""
    from kernel_cases import inputs, validated

    from torch_semimarkov.engines.triton import launch, parallel
    from torch_semimarkov.engines.triton import plan as plan_mod

    assert plan_mod.BLOCKED_LOG_TOL > plan_mod.FIXUP_TOL
    seen = []
    real = parallel._phases

    def spy(kernel, B, n, args, meta, steps, *rest):
        seen.append((kernel.fn.__name__, args["TOL"]))
        return real(kernel, B, n, args, meta, steps, *rest)

    monkeypatch.setattr(parallel, "_phases", spy)
    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 6)
    v = validated(inputs((1, 13, 3, 3, None, "none", False), seed=4))
    for blocked in (True, False):
        monkeypatch.setattr(plan_mod, "FORCE_BLOCKED", blocked)
        for sr in ("log", "max"):
            p = launch.plan_for(v.cum_scores, v.transition, v.K, sr, time_parallel=True)
            assert p.time_parallel and (p.kind == "mem") == blocked
            assert plan_mod.fixup_tol(p, sr) == (plan_mod.BLOCKED_LOG_TOL if blocked and sr == "log"
                                                 else plan_mod.FIXUP_TOL)
            seen.clear()
            _, state = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, sr,
                                             None, None, plan=p)
            if sr == "log":
                launch.launch_backward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, None, None,
                                       plan=p, state=state)
            assert seen and all(tol == plan_mod.fixup_tol(p, sr) for _, tol in seen), seen
            assert {name for name, _ in seen} >= ({"_blk_chunks_kernel"} if blocked else {"_reg_chunks_kernel"})


def test_anchor_spacing_keeps_chunk_boundaries_anchors(monkeypatch):
    from torch_semimarkov.engines.triton import plan as plan_mod

    p = make_plan(4, 100_000, 960, 47)
    assert p.time_parallel and plan_mod.anchor_spacing(p, 100_000) == p.chunk
    seq = make_plan(4, 100_000, 960, 47, time_parallel=False)
    assert plan_mod.anchor_spacing(seq, 100_000) == plan_mod.ANCHOR_EVERY
    assert plan_mod.anchor_spacing(seq, 100) == 100
    monkeypatch.setattr(plan_mod, "ANCHOR_SPACING", 2048)
    a = plan_mod.anchor_spacing(p, 100_000)
    assert a <= 2048 and p.chunk % a == 0
    # the largest such divisor of the chunk length
    assert not any(p.chunk % d == 0 for d in range(a + 1, 2049))
    monkeypatch.setattr(plan_mod, "ANCHOR_SPACING", 0)
    with pytest.raises(ValueError, match="ANCHOR_SPACING"):
        plan_mod.anchor_spacing(p, 100_000)


def test_viterbi_over_chunks_takes_longer_blocks(monkeypatch):
    """The blocked engine's Viterbi takes blocks of 32 positions where a sequence runs in several
    chunks (H200: (4, 10^5, 960, 47) 40.4 -> 33.8 ms, the same bits) and 16 with one chunk a
    sequence or in the log semiring; an explicit BLOCK_OVERRIDE wins."""
    from torch_semimarkov.engines.triton import plan as plan_mod

    chunked = make_plan(4, 100_000, 960, 47, semiring="max")
    assert chunked.kind == "mem" and chunked.n_chunks > 1 and chunked.bt == 32
    one = make_plan(32, 3000, 960, 47, semiring="max")
    assert one.kind == "mem" and one.n_chunks == 1 and one.bt == 16
    assert make_plan(4, 100_000, 960, 47, semiring="log").bt == 16
    monkeypatch.setattr(plan_mod, "BLOCK_OVERRIDE", (4, 4, 2))
    assert make_plan(4, 100_000, 960, 47, semiring="max").bt == 4


def test_duration_transition_programs_take_8_warps_from_32_padded_labels():
    """GPU_NOTES 102: 8 warps were faster for C = 24 and 47, slower for C = 8; the masked plan's
    one-chunk fall-back follows the same rule."""
    from torch_semimarkov.engines.triton.plan import masked_plan

    for C, warps in ((8, 4), (16, 4), (17, 8), (24, 8), (47, 8)):
        assert make_plan(1, 1_000_000, 64, C, duration_transitions=True).num_warps == warps
        assert masked_plan(2, 40, 8, C, duration_transitions=True).num_warps == warps  # one chunk
    assert make_plan(1, 1_000_000, 64, 47, duration_transitions=True, num_warps=2).num_warps == 2


def test_memory_ring_entropy_chunks_fill_one_wave_where_the_plans_would_take_two(monkeypatch):
    """``plan.entropy_mem_chunk`` (GPU_NOTES 109): the memory-ring entropy recurrences (one program
    per multiprocessor, prefix and suffix side by side) take the chunk count whose speculative and
    fix-up launches are predicted shortest, in waves of 132 programs: 2 chunks of 1,500 at
    (32, 3000, 960), where the blocked plan's 3 of 1,440 would make both launches two waves; every
    chunk at least 1.5·K unless there is one; register-ring plans and a chunk override keep the
    plan's chunks."""
    from torch_semimarkov.engines.triton import plan as plan_mod
    from torch_semimarkov.engines.triton.plan import entropy_chunk, entropy_mem_chunk, masked_plan

    def steps(B, T, K, W, sms=132):
        n = -(-T // W)
        fix = -(-12 * K // 10)
        return -(-2 * B * n // sms) * W + -(-2 * B * (n - 1) // sms) * min(W, fix)

    p = masked_plan(32, 3000, 960, 47, blocked=True)
    assert p.kind == "mem" and p.chunk == 1440
    assert entropy_chunk(32, 3000, 960, p, None) == entropy_mem_chunk(32, 3000, 960, None) == 1500
    assert steps(32, 3000, 960, 1500) < steps(32, 3000, 960, 1440)
    assert entropy_mem_chunk(16, 20000, 960, None) == 5000 and entropy_mem_chunk(1, 100_000, 4000, None) == 6250
    for B, T, K in [(1, 10**6, 960), (4, 100_000, 960), (2, 3000, 960), (1, 500, 960), (64, 5000, 200)]:
        W = entropy_mem_chunk(B, T, K, None)
        assert W >= T or W >= 1.5 * K
        # no other admissible chunk count is predicted shorter
        others = [-(-T // n) for n in range(1, 600) if n == 1 or -(-T // n) >= 1.5 * K]
        assert steps(B, T, K, W) <= min(steps(B, T, K, w) for w in others)
    reg = masked_plan(4, 100_000, 64, 24)
    assert reg.kind == "reg" and entropy_chunk(4, 100_000, 64, reg, None) == reg.chunk
    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 2000)
    p = masked_plan(32, 3000, 960, 47, blocked=True)
    assert entropy_chunk(32, 3000, 960, p, None) == p.chunk
