"""Partial labels and constraints on the engine: the time-parallel register-ring kernels read the
masks as per-(position, label) segment limits (``masks_mod.segment_limits``). Under the
interpreter (CPU) or compiled (CUDA), with chunks short enough for fix-ups and repairs, against
the enumeration restricted to the allowed segmentations."""

from __future__ import annotations

import math

import pytest
import torch

from kernel_cases import DEVICE, cpu, recording_engine
from torch_semimarkov import semi_crf_streaming_forward, semi_crf_streaming_marginals, semi_crf_streaming_viterbi
from torch_semimarkov.oracle import enumerate_segmentations, segmentation_allowed
from torch_semimarkov.api import constrained as constrained_mod
from torch_semimarkov.engines.torch import dense as dense_mod
from torch_semimarkov.core import masks as masks_mod
from torch_semimarkov.engines import select
from torch_semimarkov.engines.triton import plan as plan_mod

F64 = torch.float64


@pytest.fixture(params=[3, 1000, "blocked"], ids=["chunks", "one-chunk", "blocked"])
def engine_calls(request, monkeypatch):
    """The register-ring engine with chunks of 3 or one chunk, and the blocked engine (rings too
    large for registers, forced here with small tiles and chunks of 3)."""
    if request.param == "blocked":
        monkeypatch.setattr(plan_mod, "FORCE_BLOCKED", True)
        monkeypatch.setattr(plan_mod, "BLOCK_OVERRIDE", (4, 4, 2))
        return recording_engine(monkeypatch, 3, select, "engine_masks")
    return recording_engine(monkeypatch, request.param, select, "engine_masks")


def _inputs(seed, B=3, T=7, K=3, C=3, proj=False, forbid=False, kcc=False):
    g = torch.Generator().manual_seed(seed)
    cum = torch.nn.functional.pad(torch.randn(B, T, C, generator=g, dtype=F64).cumsum(1), (0, 0, 1, 0))
    tr = torch.randn(C, C, generator=g, dtype=F64)
    db = torch.randn(K, C, generator=g, dtype=F64)
    if kcc:  # a (K, C, C) transition: the (C, C) one plus a term per duration
        tr = tr + torch.randn(K, C, C, generator=g, dtype=F64)
    if forbid:
        tr[..., 0, 1] = -math.inf
        db[1, 0] = -math.inf
    ps = torch.randn(B, T, C, generator=g, dtype=F64) if proj else None
    pe = torch.randn(B, T, C, generator=g, dtype=F64) if proj else None
    lengths = torch.tensor([T, max(1, T - 2), 2][:B])
    ref = dict(cum_scores=cum, transition=tr, duration_bias=db, lengths=lengths, K=K, proj_start=ps, proj_end=pe)
    run = {k: (v.to(DEVICE, torch.float32).requires_grad_() if isinstance(v, torch.Tensor) and v.is_floating_point()
               else (v.to(DEVICE) if isinstance(v, torch.Tensor) else v)) for k, v in ref.items()}
    return ref, run


def _masks(seed, B, T, C):
    """Random masks that a random segmentation satisfies, plus a forbidden start."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.rand(B, T, generator=g) < 0.4
    starts[:, 0] = True
    lab = torch.randint(0, C, (B, T), generator=g)
    seg_id = starts.long().cumsum(1) - 1
    lab = lab.gather(1, seg_id)
    lm = torch.rand(B, T, C, generator=g) < 0.5
    lm.scatter_(2, lab[..., None], True)
    bm = torch.zeros(B, T, dtype=torch.long)
    bm[starts & (torch.rand(B, T, generator=g) < 0.4)] = 1
    bm[~starts & (torch.rand(B, T, generator=g) < 0.3)] = -1
    bm[:, 0] = 0
    return lm, bm


def _restricted(ref, lm, bm):
    args = {k: ref[k] for k in ("cum_scores", "transition", "duration_bias", "lengths", "K", "proj_start", "proj_end")}
    out = []
    for b, (segs, scores) in enumerate(enumerate_segmentations(**args)):
        keep = [i for i, s in enumerate(segs) if segmentation_allowed(s, lm[b], bm[b]) and scores[i].item() > -math.inf]
        out.append(([segs[i] for i in keep], scores[keep]))
    return out


def _params(d):
    return [d[k] for k in ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end") if d[k] is not None]


@pytest.mark.parametrize("proj,forbid,kcc", [(False, False, False), (True, False, False), (True, True, False),
                                             (False, False, True), (True, True, True)])
def test_engine_masked_log_partition_and_gradients(engine_calls, proj, forbid, kcc):
    """log Z of the allowed segmentations and its gradients (through the masked beta and marginal
    kernels) against the restricted enumeration; ``kcc``: a (K, C, C) transition (the chunked
    direct recurrence, whatever the fixture's ring)."""
    ref, run = _inputs(1, proj=proj, forbid=forbid, kcc=kcc)
    B, T1, C = ref["cum_scores"].shape
    lm, bm = _masks(2, B, T1 - 1, C)
    for d in (ref,):
        for t in _params(d):
            t.requires_grad_()
    log_z = semi_crf_streaming_forward(**run, label_mask=lm.to(DEVICE), boundary_mask=bm.to(DEVICE))
    assert engine_calls and all(engine_calls), "the masked call did not go to the engine"
    want = torch.stack([torch.logsumexp(s, 0) if len(s) else torch.tensor(-math.inf, dtype=F64)
                        for _, s in _restricted(ref, lm, bm)])
    ok = torch.isfinite(want)
    assert ok.any()
    assert torch.equal(torch.isfinite(cpu(log_z)), ok)
    torch.testing.assert_close(cpu(log_z).double()[ok], want[ok], atol=1e-4, rtol=1e-5)
    got = torch.autograd.grad(log_z[ok.to(DEVICE)].sum(), _params(run))
    exp = torch.autograd.grad(want[ok].sum(), _params(ref), allow_unused=True)
    for a, b in zip(got, exp):
        b = torch.zeros_like(a, dtype=F64, device="cpu") if b is None else b
        torch.testing.assert_close(cpu(a).double(), b, atol=2e-4, rtol=1e-4)


def _check_viterbi_and_marginals(v, m, ref, lm, bm, best=None):
    """The masked Viterbi (score, segments), the start / end marginals and (``best``) the
    max-semiring score against the enumeration restricted to the allowed segmentations; returns
    how many sequences have one."""
    B, T1, C = ref["cum_scores"].shape
    T = T1 - 1
    seen = 0
    for b, (segs, scores) in enumerate(_restricted(ref, lm, bm)):
        if not segs:
            assert cpu(v.scores)[b] == -math.inf and (cpu(v.labels)[b] == -1).all()
            continue
        seen += 1
        scores = scores.detach()
        i = int(scores.argmax())
        assert abs(float(v.scores[b]) - float(scores[i])) < 1e-4
        if best is not None:
            assert abs(float(best[b]) - float(scores[i])) < 1e-4
        assert v.segments[b] == list(segs[i])
        p = torch.softmax(scores, 0)
        start = torch.zeros(T, C, dtype=F64)
        end = torch.zeros(T, C, dtype=F64)
        for pi, seg in zip(p, segs):
            for s, e, c in seg:
                start[s, c] += pi
                end[e - 1, c] += pi
        torch.testing.assert_close(cpu(m.start[b]).double(), start, atol=1e-5, rtol=0)
        torch.testing.assert_close(cpu(m.end[b]).double(), end, atol=1e-5, rtol=0)
    return seen


@pytest.mark.parametrize("kcc", [False, True], ids=["CC", "KCC"])
def test_engine_masked_viterbi_and_marginals(engine_calls, kcc):
    ref, run = _inputs(5, proj=True, kcc=kcc)
    B, T1, C = ref["cum_scores"].shape
    lm, bm = _masks(6, B, T1 - 1, C)
    with torch.no_grad():
        v = semi_crf_streaming_viterbi(**run, label_mask=lm.to(DEVICE), boundary_mask=bm.to(DEVICE))
        m = semi_crf_streaming_marginals(**run, label_mask=lm.to(DEVICE), boundary_mask=bm.to(DEVICE))
        best = semi_crf_streaming_forward(**run, semiring="max", label_mask=lm.to(DEVICE),
                                          boundary_mask=bm.to(DEVICE))
    assert len(engine_calls) >= 3 and all(engine_calls)
    assert _check_viterbi_and_marginals(v, m, ref, lm, bm, best)


@pytest.mark.parametrize("kcc", [False, True], ids=["CC", "KCC"])
def test_engine_all_true_masks_equal_the_unmasked_engine(engine_calls, kcc):
    ref, run = _inputs(3, proj=True, kcc=kcc)
    B, T1, C = ref["cum_scores"].shape
    lm = torch.ones(B, T1 - 1, C, dtype=torch.bool, device=DEVICE)
    bm = torch.zeros(B, T1 - 1, dtype=torch.long, device=DEVICE)
    masked = semi_crf_streaming_forward(**run, label_mask=lm, boundary_mask=bm)
    plain = semi_crf_streaming_forward(**run)
    torch.testing.assert_close(masked, plain, atol=1e-5, rtol=1e-6)
    for a, b in zip(torch.autograd.grad(masked.sum(), _params(run)), torch.autograd.grad(plain.sum(), _params(run))):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kcc", [False, True], ids=["CC", "KCC"])
def test_engine_mask_that_allows_nothing(engine_calls, kcc):
    ref, run = _inputs(4, kcc=kcc)
    B, T1, C = ref["cum_scores"].shape
    lm = torch.ones(B, T1 - 1, C, dtype=torch.bool)
    lm[0, 2] = False
    log_z = semi_crf_streaming_forward(**run, label_mask=lm.to(DEVICE))
    assert cpu(log_z)[0] == -math.inf and torch.isfinite(cpu(log_z)[1:]).all()
    g = torch.autograd.grad(log_z[1:].sum() + 0 * log_z[0], run["cum_scores"])[0]
    assert torch.isfinite(cpu(g)).all() and (cpu(g)[0] == 0).all()


def _assert_limits_allow_exactly_the_masks(lm, bm, ms, me, K):
    """Every segment of at most K positions passes both limits iff the masks allow it."""
    B, T, C = lm.shape
    for b in range(B):
        for s in range(T):
            for e in range(s + 1, min(T, s + K) + 1):
                for c in range(C):
                    allowed = bool(lm[b, s:e, c].all()) and not bool((bm[b, s + 1:e] == 1).any())
                    assert (e <= int(me[b, s, c])) == allowed
                    assert (int(ms[b, e, c]) <= s) == allowed


@pytest.mark.parametrize("K", [1, 4, 40])
def test_segment_limits_describe_the_allowed_segments(K):
    """Every segment of at most K positions is allowed by the limits iff the masks allow it; the
    limits agree with the PyTorch path's smallest starts wherever those are within K."""
    B, T, C = 3, 75, 3
    lm, bm = _masks(8, B, T, C)
    ms, me, forbidden = masks_mod.segment_limits(lm, bm.to(torch.int8), B, T, C, K, "cpu")
    cum = torch.zeros(B, T + 1, C, dtype=F64)
    inp = constrained_mod._validated(cum, torch.zeros(C, C), torch.zeros(K, C), torch.tensor([T] * B), K, None, None,
                                  lm, bm)
    model = dense_mod._Model(inp[0], inp[1], inp[2])
    ref = model.min_start[:, K + 1:K + 1 + T]
    e = torch.arange(1, T + 1)[None, :, None]
    near = ref > e - K
    assert torch.equal(ms[:, 1:].long()[near], ref[near])
    _assert_limits_allow_exactly_the_masks(lm, bm, ms, me, K)
    assert torch.equal(forbidden, bm == -1)


def _exact_limits(lm, bm, T):
    """min_start / max_end (B, T+1, C) over the whole sequence (no window), by plain loops."""
    B, _, C = lm.shape
    ms = torch.zeros(B, T + 1, C, dtype=torch.long)
    me = torch.full((B, T + 1, C), T, dtype=torch.long)
    for b in range(B):
        for c in range(C):
            last = 0
            for p in range(T):
                if not lm[b, p, c]:
                    last = max(last, p + 1)
                if bm[b, p] == 1:
                    last = max(last, p)
                ms[b, p + 1, c] = last
            first = T
            for p in range(T - 1, -1, -1):
                if not lm[b, p, c]:
                    first = p
                me[b, p, c] = first
                if bm[b, p] == 1:
                    first = min(first, p)
    return ms, me


@pytest.mark.parametrize("K", [1, 4, 40])
def test_engine_limits_kernel(monkeypatch, K):
    """The limits kernel (blocks of 16 positions here): every segment of at most K positions is
    allowed by its limits iff the masks allow it; its limits are never tighter than the exact
    ones; the flags mark every position where the exact limits move, and every forbidden start."""
    from torch_semimarkov.engines.triton import limits
    from torch_semimarkov.engines.triton import plan as plan_mod
    monkeypatch.setattr(plan_mod, "LIMITS_BLOCK", 16)
    B, T, C = 3, 75, 3
    lm, bm = _masks(8, B, T, C)
    ms, me, fl = (cpu(x).long() for x in limits.engine_limits(lm.to(DEVICE), bm.to(DEVICE, torch.int8), B, T, C, K,
                                                              DEVICE))
    ex_ms, ex_me = _exact_limits(lm, bm, T)
    assert (ms <= ex_ms).all() and (me >= ex_me).all()
    _assert_limits_allow_exactly_the_masks(lm, bm, ms, me, K)
    moved_f = (ex_ms[:, 1:] != ex_ms[:, :-1]).any(-1)  # (B, T): index p = step p + 1
    moved_b = (ex_me[:, :-1] != ex_me[:, 1:]).any(-1)  # (B, T): index s
    assert ((fl[:, :T] & limits.FWD_MOVED) != 0)[moved_f].all()
    assert ((fl[:, :T] & limits.BWD_MOVED) != 0)[moved_b].all()
    assert torch.equal((fl[:, :T] & limits.NO_START) != 0, bm == -1)
    assert (fl[:, T] == 0).all() and (ms[:, 0] == 0).all() and (me[:, T] == T).all()
    # no mask given: nothing moves, nothing is forbidden
    ms, me, fl = (cpu(x).long() for x in limits.engine_limits(None, None, B, T, C, K, DEVICE))
    assert (fl == 0).all() and (ms == 0).all() and (me == T).all()


@pytest.mark.parametrize("chunk,kcc", [(7, False), (1000, False), (7, True)], ids=["chunks", "one-chunk", "KCC"])
def test_engine_masks_on_long_sequences_match_the_pytorch_path(monkeypatch, chunk, kcc):
    """T = 40 with sparse and dense constraints, 6 chunks of 7: the ring entries each limit excludes
    are dropped once (where the flags say so) and stay dropped across chunk boundaries (a (K, C, C)
    transition's direct recurrence tests every term against the limits); log Z, its gradients and
    the constrained Viterbi score equal the float64 PyTorch path."""
    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", chunk)
    B, T, K, C = 2, 40, 6, 3
    g = torch.Generator().manual_seed(11)
    cum = torch.nn.functional.pad(torch.randn(B, T, C, generator=g, dtype=F64).cumsum(1), (0, 0, 1, 0))
    tr = torch.randn(C, C, generator=g, dtype=F64)
    db = torch.randn(K, C, generator=g, dtype=F64)
    ps = torch.randn(B, T, C, generator=g, dtype=F64)
    if kcc:
        tr = tr + torch.randn(K, C, C, generator=g, dtype=F64)
        tr[2, 0, 1] = -math.inf
    lengths = torch.tensor([T, T - 9])
    lm = torch.ones(B, T, C, dtype=torch.bool)
    lm[0, ::7] = torch.nn.functional.one_hot(torch.randint(0, C, (T,), generator=g)[::7], C).bool()
    lm[1] = torch.rand(T, C, generator=g) < 0.8
    lm[1, torch.arange(T), torch.randint(0, C, (T,), generator=g)] = True
    bm = torch.zeros(B, T, dtype=torch.long)
    bm[:, 5::13] = 1
    bm[0, 3::11] = -1  # 14: a forbidden start at a chunk boundary
    bm[1, 8] = -1  # the position after one
    bm[:, 0] = 0
    args = dict(cum_scores=cum, transition=tr, duration_bias=db, lengths=lengths, K=K, proj_start=ps,
                label_mask=lm, boundary_mask=bm)
    want = constrained_mod.constrained_log_partition(**{k: (v.requires_grad_() if k in ("cum_scores", "transition",
                                                  "duration_bias", "proj_start") else v) for k, v in args.items()})
    assert torch.isfinite(want).all()
    exp = torch.autograd.grad(want.sum(), [cum, tr, db, ps])
    best = semi_crf_streaming_viterbi(**args).scores
    monkeypatch.setattr(select, "ENGINE_ON_CPU", True)
    run = {k: (v.detach().to(DEVICE, torch.float32).requires_grad_() if isinstance(v, torch.Tensor)
               and v.is_floating_point() else (v.to(DEVICE) if isinstance(v, torch.Tensor) else v))
           for k, v in args.items()}
    on = select.engine_masks(*constrained_mod._validated(
        run["cum_scores"], run["transition"], run["duration_bias"], run["lengths"], K, run["proj_start"], None,
        run["label_mask"], run["boundary_mask"])[:3], any_transition=True)
    assert on is not None and on[0].kind == ("dur" if kcc else "reg") and on[0].n_chunks == (1 if chunk > T else 6)
    got = semi_crf_streaming_forward(**run)
    torch.testing.assert_close(cpu(got).double(), want.detach(), atol=2e-4, rtol=1e-5)
    for a, b in zip(torch.autograd.grad(got.sum(), [run[k] for k in ("cum_scores", "transition", "duration_bias",
                                                                     "proj_start")]), exp):
        torch.testing.assert_close(cpu(a).double(), b, atol=2e-4, rtol=1e-4)
    with torch.no_grad():
        v = semi_crf_streaming_viterbi(**run)
    torch.testing.assert_close(cpu(v.scores).double(), best.double(), atol=2e-4, rtol=1e-5)


def test_engine_masked_best_score_and_its_gradient(engine_calls):
    """semiring="max" with masks: the best allowed score (the engine's masked Viterbi) and its
    gradient, the indicator of the best allowed segmentation's terms."""
    ref, run = _inputs(12, proj=True)
    B, T1, C = ref["cum_scores"].shape
    lm, bm = _masks(13, B, T1 - 1, C)
    for t in _params(ref):
        t.requires_grad_()
    best = semi_crf_streaming_forward(**run, semiring="max", label_mask=lm.to(DEVICE), boundary_mask=bm.to(DEVICE))
    assert engine_calls and all(engine_calls)
    want = torch.stack([s.max() if len(s) else torch.tensor(-math.inf, dtype=F64) for _, s in _restricted(ref, lm, bm)])
    ok = torch.isfinite(want)
    assert ok.any() and torch.equal(torch.isfinite(cpu(best)), ok)
    torch.testing.assert_close(cpu(best).double()[ok], want[ok].detach(), atol=1e-4, rtol=1e-5)
    got = torch.autograd.grad(best[ok.to(DEVICE)].sum(), _params(run))
    exp = torch.autograd.grad(want[ok].sum(), _params(ref), allow_unused=True)
    for a, b in zip(got, exp):
        b = torch.zeros_like(a, dtype=F64, device="cpu") if b is None else b
        torch.testing.assert_close(cpu(a).double(), b, atol=1e-5, rtol=0)
