"""The entropy's value on the engine (no gradient asked): one forward + backward of the
time-parallel kernels and E[score] from their marginals, under the interpreter (CPU) or compiled
(CUDA), with chunks short enough for fix-ups, against the enumeration and the float64 path."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import make_inputs
from kernel_cases import DEVICE, cpu, recording_engine
from test_kernels_masks import _inputs, _masks, _restricted
from torch_semimarkov import semi_crf_streaming_entropy
from torch_semimarkov.api import constrained
from torch_semimarkov.api import entropy as entropy_mod
from torch_semimarkov.engines import select
from torch_semimarkov.engines.triton import plan as plan_mod
from torch_semimarkov.core.validation import validate_streaming_inputs
from torch_semimarkov.oracle import enumerate_segmentations

F64 = torch.float64


@pytest.fixture(params=[3, 1000], ids=["chunks", "one-chunk"])
def engine_calls(request, monkeypatch):
    return recording_engine(monkeypatch, request.param, entropy_mod, "_entropy_on_engine")


def _entropy(scores):
    if scores.numel() == 0:
        return torch.tensor(0.0, dtype=F64)
    logp = torch.log_softmax(scores.detach(), 0)
    return -(logp.exp() * logp).sum()


@pytest.mark.parametrize("proj,forbid,masked", [(False, False, False), (True, True, False), (True, False, True),
                                                (False, True, True)])
def test_engine_entropy_equals_the_enumeration(engine_calls, proj, forbid, masked):
    ref, run = _inputs(21, proj=proj, forbid=forbid)
    B, T1, C = ref["cum_scores"].shape
    lm, bm = _masks(22, B, T1 - 1, C) if masked else (torch.ones(B, T1 - 1, C, dtype=torch.bool),
                                                       torch.zeros(B, T1 - 1, dtype=torch.long))
    masks = dict(label_mask=lm.to(DEVICE), boundary_mask=bm.to(DEVICE)) if masked else {}
    with torch.no_grad():
        H = semi_crf_streaming_entropy(**run, **masks)
    assert engine_calls == [True], "the entropy did not run on the engine"
    want = torch.stack([_entropy(s) for _, s in _restricted(ref, lm, bm)])
    torch.testing.assert_close(cpu(H).double(), want, atol=2e-4, rtol=1e-5)


def test_engine_entropy_only_without_gradients(engine_calls):
    """With an input that requires a gradient the call takes the differentiable float64 path."""
    ref, run = _inputs(23)
    H = semi_crf_streaming_entropy(**run)
    assert engine_calls == [] and H.requires_grad
    with torch.no_grad():
        H2 = semi_crf_streaming_entropy(**run)
    assert engine_calls == [True]
    torch.testing.assert_close(H2, H.detach(), atol=2e-4, rtol=1e-5)


@pytest.mark.parametrize("chunk", [7, 1000])
def test_engine_entropy_on_long_sequences_matches_the_float64_path(monkeypatch, chunk):
    """T = 45 (7 chunks of 7), ragged, projections, a forbidden transition and partial labels: the
    engine's value equals the float64 expectation-semiring path to float32 accuracy."""
    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", chunk)
    B, T, K, C = 2, 45, 6, 3
    g = torch.Generator().manual_seed(24)
    # per-position scores with a drift, so the cumulative values grow large
    cum = torch.nn.functional.pad((torch.randn(B, T, C, generator=g, dtype=F64) - 3.0).cumsum(1), (0, 0, 1, 0))
    tr = torch.randn(C, C, generator=g, dtype=F64)
    tr[1, 2] = -math.inf
    db = torch.randn(K, C, generator=g, dtype=F64)
    ps = torch.randn(B, T, C, generator=g, dtype=F64)
    pe = torch.randn(B, T, C, generator=g, dtype=F64)
    lengths = torch.tensor([T, T - 13])
    lm = torch.rand(B, T, C, generator=g) < 0.85
    lm[:, torch.arange(T), torch.randint(0, C, (T,), generator=g)] = True
    bm = torch.zeros(B, T, dtype=torch.long)
    bm[:, 9::17] = 1
    args = dict(cum_scores=cum, transition=tr, duration_bias=db, lengths=lengths, K=K, proj_start=ps, proj_end=pe)
    for masks in ({}, dict(label_mask=lm, boundary_mask=bm)):
        want = semi_crf_streaming_entropy(**args, **masks)  # CPU tensors: the float64 path
        monkeypatch.setattr(select, "ENGINE_ON_CPU", True)
        run = {k: (v.to(DEVICE, torch.float32) if isinstance(v, torch.Tensor) and v.is_floating_point()
                   else (v.to(DEVICE) if isinstance(v, torch.Tensor) else v)) for k, v in args.items()}
        run_masks = {"label_mask": None, "boundary_mask": None} | {k: v.to(DEVICE) for k, v in masks.items()}
        got = entropy_mod._entropy_on_engine(*constrained._validated(**run, **run_masks)[:3])
        monkeypatch.setattr(select, "ENGINE_ON_CPU", False)
        assert got is not None and (want > 1).all()
        torch.testing.assert_close(cpu(got), want, atol=1e-3, rtol=1e-5)


@pytest.fixture(params=[3, 1000], ids=["chunks", "one-chunk"])
def grad_engine(request, monkeypatch):
    return recording_engine(monkeypatch, request.param, entropy_mod, "_entropy_engine")


def _float64_entropy_and_grads(monkeypatch, ref, masks):
    """The float64 path's entropy and gradients (CPU tensors, the engine switched off)."""
    names = [k for k in ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end") if ref[k] is not None]
    leaves = {k: ref[k].clone().requires_grad_() for k in names}
    monkeypatch.setattr(select, "ENGINE_ON_CPU", False)
    H = semi_crf_streaming_entropy(**dict(ref, **leaves), **masks)
    H.sum().backward()
    monkeypatch.setattr(select, "ENGINE_ON_CPU", True)
    return H.detach(), {k: leaves[k].grad for k in names}


@pytest.mark.parametrize("proj,forbid,masked,kcc,blocked", [
    (False, False, False, False, False), (True, True, True, False, False), (False, False, False, True, False),
    (True, True, True, True, False), (True, False, False, True, False), (True, True, False, False, True),
    (False, False, True, False, True)])
def test_engine_entropy_gradient_equals_the_float64_path(monkeypatch, grad_engine, proj, forbid, masked, kcc,
                                                         blocked):
    """The entropy WITH its gradient on the engine (kernels/entropy.py: prefix and suffix entropy
    recurrences, weighted marginals; ``kcc``: a (K, C, C) transition, the direct recurrence's
    kernels with ``ENT``; ``blocked``: the blocked engine's rows and the recurrences' ring in
    memory): value and every input's gradient equal the float64 expectation-semiring path, which
    test_distribution.py checks against the enumeration."""
    kinds = _blocked_plans(monkeypatch) if blocked else None
    ref, run = _inputs(25, proj=proj, forbid=forbid, kcc=kcc)
    B, T1, C = ref["cum_scores"].shape
    lm, bm = _masks(26, B, T1 - 1, C)
    masks = dict(label_mask=lm, boundary_mask=bm) if masked else {}
    H = semi_crf_streaming_entropy(**run, **{k: v.to(DEVICE) for k, v in masks.items()})
    H.sum().backward()
    assert grad_engine == [True], "the entropy's gradient did not run on the engine"
    assert not blocked or kinds == ["mem"], kinds
    want, grads = _float64_entropy_and_grads(monkeypatch, ref, masks)
    assert grad_engine == [True, False], "the reference took the engine"
    torch.testing.assert_close(cpu(H).double(), want, atol=2e-4, rtol=1e-5)
    for k, g in grads.items():
        torch.testing.assert_close(cpu(run[k].grad).double(), g, atol=2e-4, rtol=1e-4, msg=k)


def _blocked_plans(monkeypatch):
    """Every (C, C) plan the blocked engine's (as for a ring too large for registers), with small
    tiles; returns the list of the entropy launches' plan kinds."""
    from torch_semimarkov.engines.triton import entropy as kernels_mod

    monkeypatch.setattr(plan_mod, "FORCE_BLOCKED", True)
    monkeypatch.setattr(plan_mod, "BLOCK_OVERRIDE", (4, 4, 2))
    monkeypatch.setattr(plan_mod, "MARG_OVERRIDE", (4, 4, 2))
    kinds = []
    real = kernels_mod.launch_entropy

    def launch(*args, plan, **kwargs):
        kinds.append(plan.kind)
        return real(*args, plan=plan, **kwargs)

    monkeypatch.setattr(kernels_mod, "launch_entropy", launch)
    return kinds


@pytest.mark.parametrize("k_block,kcc,blocked", [(None, False, False), (2, False, False), (None, True, False),
                                                 (None, False, True), (2, False, True)],
                         ids=["one-duration-block", "duration-blocks-of-2", "KCC", "blocked",
                              "blocked-duration-blocks-of-2"])
@pytest.mark.parametrize("chunk", [7, 3, None])
def test_engine_entropy_gradient_with_fix_ups_on_a_longer_sequence(monkeypatch, k_block, kcc, blocked, chunk):
    """T = 30 in chunks of 7 or 3 (fix-ups and the repair run; on the register ring chunks of 3
    are shorter than K, so a chunk's end state holds its predecessor's rows; the blocked engine's
    chunks are at least K long), ragged, projections, a forbidden
    transition and partial labels: the engine's entropy gradient equals the float64 path's.
    With duration tiles of 2 the weighted-marginal and anchor kernels take several duration
    blocks (P_start / Q_start accumulate across them); ``kcc``: a (K, C, C) transition;
    ``blocked``: the blocked engine's rows and the entropy recurrences with their ring in memory
    (``MEM``, the path of rings too large for registers; tiles of 2 durations: several a sum);
    ``chunk`` None: the plans' own chunks, where the memory-ring entropy recurrences take
    ``plan.entropy_mem_chunk``'s (4 chunks of 8 here) and log Z's rows one chunk."""
    if kcc and chunk == 3:
        pytest.skip("the (K, C, C) recurrence's chunks are covered at 7")
    if chunk is None and not blocked:
        pytest.skip("the plans' own chunks matter for the memory-ring entropy only")
    if chunk is None:
        assert plan_mod.entropy_mem_chunk(2, 30, 5, None) == 8
    monkeypatch.setattr(plan_mod, "K_BLOCK_OVERRIDE", k_block)
    kinds = _blocked_plans(monkeypatch) if blocked else None
    recording = recording_engine(monkeypatch, chunk, entropy_mod, "_entropy_engine")
    B, T, K, C = 2, 30, 5, 3
    g = torch.Generator().manual_seed(27)
    cum = torch.nn.functional.pad((torch.randn(B, T, C, generator=g, dtype=F64) - 3.0).cumsum(1), (0, 0, 1, 0))
    tr = torch.randn(C, C, generator=g, dtype=F64)
    if kcc:
        tr = tr + torch.randn(K, C, C, generator=g, dtype=F64)
    tr[..., 1, 2] = -math.inf
    ref = dict(cum_scores=cum, transition=tr, duration_bias=torch.randn(K, C, generator=g, dtype=F64),
               lengths=torch.tensor([T, T - 9]), K=K, proj_start=torch.randn(B, T, C, generator=g, dtype=F64),
               proj_end=torch.randn(B, T, C, generator=g, dtype=F64))
    lm = torch.rand(B, T, C, generator=g) < 0.85
    lm[:, torch.arange(T), torch.randint(0, C, (T,), generator=g)] = True
    bm = torch.zeros(B, T, dtype=torch.long)
    bm[:, 9::17] = 1
    bm[:, 4::11] = -1
    masks = dict(label_mask=lm, boundary_mask=bm)
    run = {k: (v.to(DEVICE, torch.float32).requires_grad_() if isinstance(v, torch.Tensor) and v.is_floating_point()
               else (v.to(DEVICE) if isinstance(v, torch.Tensor) else v)) for k, v in ref.items()}
    H = semi_crf_streaming_entropy(**run, **{k: v.to(DEVICE) for k, v in masks.items()})
    H.sum().backward()
    assert recording == [True]
    if blocked:
        assert kinds == ["mem"], kinds
    want, grads = _float64_entropy_and_grads(monkeypatch, ref, masks)
    assert recording == [True, False] and (want > 5).all()
    torch.testing.assert_close(cpu(H).double(), want, atol=1e-3, rtol=1e-5)
    for k, gr in grads.items():
        torch.testing.assert_close(cpu(run[k].grad).double(), gr, atol=2e-4, rtol=1e-4, msg=k)


def test_entropy_recurrences_take_the_fewest_warps_that_hold_their_ring(monkeypatch):
    """2 warps for a 64 x 32 ring (the log Z kernels take 4), 4 for 128 x 32 (on 2 the entropy
    steps spill registers), 8 for 256 x 32; ENTROPY_WARPS overrides the rule."""
    def warps(K, C):
        return plan_mod.entropy_warps(plan_mod.masked_plan(1, 100_000, K, C))

    assert (warps(64, 24), warps(50, 32), warps(100, 24), warps(200, 24)) == (2, 2, 4, 8)
    assert warps(16, 8) == 2
    monkeypatch.setattr(plan_mod, "ENTROPY_WARPS", 8)
    assert warps(64, 24) == 8


def test_a_gene_grammar_sized_ring_takes_the_blocked_engine_for_the_entropy_gradient(monkeypatch):
    """A (C, C) model whose ring passes the register budget (the gene grammars' 47 labels at K = 960,
    a 1024 x 64 padded ring) takes the engine for its entropy's gradient on the blocked plan ("mem",
    the memory-ring entropy recurrences), masked or not, where it took the float64 path before; a
    small ring keeps the register ring. The routing only: no kernel runs."""
    monkeypatch.setattr(select, "ENGINE_ON_CPU", True)

    def plan_kind(K, C, masked=False):
        cum = torch.zeros(2, 3001, C)
        inp = validate_streaming_inputs(cum, torch.zeros(C, C), torch.zeros(K, C), torch.tensor([3000, 2500]), K,
                                        "log")
        lm = torch.ones(2, 3000, C, dtype=torch.bool) if masked else None
        if masked:
            monkeypatch.setattr("torch_semimarkov.engines.triton.limits.engine_limits", lambda *a: None)
        return entropy_mod._entropy_engine(inp, lm, None)[0].kind

    assert plan_kind(960, 47) == "mem"
    assert plan_kind(960, 47, masked=True) == "mem"
    assert plan_kind(64, 8) == "reg"
    assert plan_mod.entropy_mem_rows(64) == 32 and plan_mod.entropy_mem_rows(8) == 64


# ------------------------------------------------------------- a (K, C, C) transition: the value

KCC_CASES = [
    dict(B=2, T=7, K=3, C=3, proj="both", lengths=None),
    dict(B=3, T=6, K=4, C=2, proj="start", lengths="ragged"),
    dict(B=2, T=5, K=7, C=3, proj="end", lengths=None),  # K > T: every first segment can span it all
    dict(B=2, T=6, K=1, C=3, proj="none", lengths=None),  # K = 1
]


@pytest.mark.parametrize("i", range(len(KCC_CASES)))
def test_engine_entropy_of_a_duration_transition_equals_the_enumeration(engine_calls, i):
    """The phantom predecessor of the first segment depends on its duration: weighted by the
    probability that the first segment is [0, k) of each label (forbidden entries included)."""
    c = dict(KCC_CASES[i])
    ref = make_inputs(c.pop("B"), c.pop("T"), c.pop("K"), c.pop("C"), seed=40 + i, duration_transitions=True, **c)
    ref["transition"][0, 0, 1] = -math.inf
    ref["transition"][-1, 1, 0] = -math.inf
    run = {k: (v.to(DEVICE, torch.float32) if isinstance(v, torch.Tensor) and v.is_floating_point()
               else (v.to(DEVICE) if isinstance(v, torch.Tensor) else v)) for k, v in ref.items()}
    with torch.no_grad():
        H = semi_crf_streaming_entropy(**run)
    assert engine_calls == [True], "the (K, C, C) entropy did not run on the engine"
    args = {k: ref[k] for k in ("cum_scores", "transition", "duration_bias", "lengths", "K", "proj_start", "proj_end")}
    want = torch.stack([_entropy(s[torch.isfinite(s)]) for _, s in enumerate_segmentations(**args)])
    torch.testing.assert_close(cpu(H).double(), want, atol=2e-4, rtol=1e-5)


@pytest.mark.parametrize("chunk", [7, 1000])
def test_engine_entropy_of_a_duration_transition_on_long_sequences(monkeypatch, chunk):
    """T = 45 with fix-ups, ragged, both projections: the engine's value of a (K, C, C) model
    equals the float64 path's, without masks and with them (the restricted distribution's
    entropy: the first segment's limits at positions 1..K and a forbidden start right after a
    chunk boundary). Both references are taken before the engine is let onto CPU tensors, so
    that they are the float64 path's (on a GPU machine the engine cannot take CPU tensors)."""
    B, T, K, C = 2, 45, 6, 3
    ref = make_inputs(B, T, K, C, seed=50, duration_transitions=True, proj="both", lengths=[T, T - 13])
    ref["transition"][2, 1, 2] = -math.inf
    g = torch.Generator().manual_seed(51)
    lm = torch.rand(B, T, C, generator=g) < 0.75
    lm[torch.arange(B)[:, None], torch.arange(T), torch.randint(0, C, (B, T), generator=g)] = True
    lm[0, 2] = False
    lm[0, 2, 0] = True  # a first segment of label 1 or 2 ends by position 2
    bm = torch.zeros(B, T, dtype=torch.long)
    bm[:, 17::9] = 1
    bm[1, 8] = -1
    want = semi_crf_streaming_entropy(**ref)  # CPU tensors: the float64 path
    want_masked = semi_crf_streaming_entropy(**ref, label_mask=lm, boundary_mask=bm)
    assert (want > 1).all() and (want_masked > 1).all()
    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", chunk)
    monkeypatch.setattr(select, "ENGINE_ON_CPU", True)
    run = {k: (v.to(DEVICE, torch.float32) if isinstance(v, torch.Tensor) and v.is_floating_point()
               else (v.to(DEVICE) if isinstance(v, torch.Tensor) else v)) for k, v in ref.items()}
    for masks, expected in (({"label_mask": None, "boundary_mask": None}, want),
                            ({"label_mask": lm.to(DEVICE), "boundary_mask": bm.to(DEVICE)}, want_masked)):
        got = entropy_mod._entropy_on_engine(*constrained._validated(**run, **masks, any_transition=True)[:3])
        assert got is not None
        torch.testing.assert_close(cpu(got), expected, atol=1e-3, rtol=1e-5)


@pytest.mark.parametrize("i", [0, 1, 2])
def test_engine_entropy_of_a_masked_duration_transition_equals_the_enumeration(engine_calls, i):
    """With masks (some forbidding the first segment's label or length): the entropy of the
    restricted distribution of a (K, C, C) model, on the engine, against the enumeration."""
    c = dict(KCC_CASES[i])
    B, T, C = c["B"], c["T"], c["C"]
    ref = make_inputs(c.pop("B"), c.pop("T"), c.pop("K"), c.pop("C"), seed=60 + i, duration_transitions=True, **c)
    lm, bm = _masks(61 + i, B, T, C)
    lm[0, 0, :] = True
    lm[0, 1, 0] = False  # a first segment of label 0 is at most one position long
    run = {k: (v.to(DEVICE, torch.float32) if isinstance(v, torch.Tensor) and v.is_floating_point()
               else (v.to(DEVICE) if isinstance(v, torch.Tensor) else v)) for k, v in ref.items()}
    with torch.no_grad():
        H = semi_crf_streaming_entropy(**run, label_mask=lm.to(DEVICE), boundary_mask=bm.to(DEVICE))
    assert engine_calls == [True], "the masked (K, C, C) entropy did not run on the engine"
    want = torch.stack([_entropy(s[torch.isfinite(s)]) if len(s) else torch.tensor(0.0, dtype=F64)
                        for _, s in _restricted(ref, lm, bm)])
    assert (want > 0).any()
    torch.testing.assert_close(cpu(H).double(), want, atol=2e-4, rtol=1e-5)


@pytest.mark.parametrize("masked", [False, True])
def test_first_segments_from_the_calls_own_forward_equal_a_forward_of_their_own(monkeypatch, masked):
    """The (K, C, C) entropy's first-segment probabilities from the rows the call's chunked forward
    kept equal those from a separate forward over the first K positions (the path of a
    sequential plan), ragged lengths (one sequence shorter than K), masks or not."""
    from torch_semimarkov.engines.triton import launch

    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 3)
    monkeypatch.setattr(select, "ENGINE_ON_CPU", True)
    _, run = _inputs(8, B=3, T=9, K=4, C=3, proj=True, forbid=True, kcc=True)
    run = {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in run.items()}
    lm, bm = _masks(9, 3, 9, 3) if masked else (None, None)
    inp, lmv, bmv, _ = constrained._validated(**run, label_mask=None if lm is None else lm.to(DEVICE),
                                              boundary_mask=None if bm is None else bm.to(DEVICE),
                                              any_transition=True)
    if masked:
        plan, masks, ps = select.engine_masks(inp, lmv, bmv, engine="must", any_transition=True)
    else:
        plan, masks, ps = launch.plan_for(inp.cum_scores, inp.transition, inp.K, backward=True), None, inp.proj_start
    assert plan.time_parallel and plan.n_chunks > 1
    args = (inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, inp.K)
    _, state = launch.launch_forward(*args, "log", ps, inp.proj_end, plan=plan, masks=masks, beta=True)
    p_end = launch.launch_backward(*args, ps, inp.proj_end, plan=plan, state=state, masks=masks)[1]
    own = entropy_mod._first_segments(inp, p_end, masks, (state.first[0], state.second))
    apart = entropy_mod._first_segments(inp, p_end, masks)
    assert own.shape == (3, 4, 3) and (own > 0).any()
    torch.testing.assert_close(cpu(own), cpu(apart), atol=1e-6, rtol=1e-5)
