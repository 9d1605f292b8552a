"""k-best lists on the compiled CPU engine (numba): bitwise equal to the float64 PyTorch path
(``backend="torch"``: scores, labels, segment starts, ties included) and equal to the sorted
enumeration (to 1e-12), with both transition shapes, boundary projections, forbidden entries,
masks, ragged lengths, float32 inputs and more ranks than segmentations."""

import pytest
import torch

from torch_semimarkov import SemiMarkovCRFHead, semi_crf_streaming_topk, semi_crf_streaming_viterbi

from test_distribution import CASES, _check_topk, _enumerate, _id, _inputs, _masks

pytest.importorskip("numba")

F64 = torch.float64


def _assert_same(a, b):
    assert a.scores.dtype == b.scores.dtype
    assert torch.equal(a.scores, b.scores), (a.scores, b.scores)
    assert torch.equal(a.labels, b.labels)
    assert torch.equal(a.segment_starts, b.segment_starts)
    assert torch.equal(a.segment_offsets, b.segment_offsets)


@pytest.fixture
def numba_calls(monkeypatch):
    """Counts the calls of the compiled k-best (so a test knows which path ran)."""
    from torch_semimarkov.engines.numba import kbest as numba_kbest

    calls = []
    real = numba_kbest.topk_numba
    monkeypatch.setattr(numba_kbest, "topk_numba", lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.mark.parametrize("masks", ["none", "labels", "boundaries", "both"])
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_topk_equals_the_pytorch_path_bitwise(case, masks, numba_calls):
    kw, _ = _inputs(41, B=3, T=23, K=5, C=3, **case)
    B, T1, C = kw["cum_scores"].shape
    lm, bm = _masks(42, B, T1 - 1, C)
    lm = lm if masks in ("labels", "both") else None
    bm = bm if masks in ("boundaries", "both") else None
    for k in (1, 5):
        got = semi_crf_streaming_topk(**kw, k=k, label_mask=lm, boundary_mask=bm, backend="numba")
        want = semi_crf_streaming_topk(**kw, k=k, label_mask=lm, boundary_mask=bm, backend="torch")
        assert int(torch.isfinite(want.scores[:, 0]).sum()) >= 2  # (a forbidden entry + masks may leave one impossible)
        _assert_same(got, want)
    assert len(numba_calls) == 2


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_topk_equals_the_sorted_enumeration(case, numba_calls):
    kw, _ = _inputs(43, **case)
    k = 7
    out = semi_crf_streaming_topk(**kw, k=k, backend="numba")
    assert numba_calls
    _check_topk(out, _enumerate(kw), k, tol=1e-12)
    v = semi_crf_streaming_viterbi(**kw, backend="torch")
    assert torch.equal(out.labels[:, 0], v.labels)


def test_topk_with_masks_and_more_ranks_than_segmentations(numba_calls):
    kw, _ = _inputs(44, T=4, direct=True, proj=True)
    B, T1, C = kw["cum_scores"].shape
    lm, bm = _masks(45, B, T1 - 1, C, free=0.5)
    k = 40
    out = semi_crf_streaming_topk(**kw, k=k, label_mask=lm, boundary_mask=bm, backend="numba")
    ref = _enumerate(kw, lm, bm)
    assert min(len(s) for s, _ in ref) < k
    _check_topk(out, ref, k, tol=1e-12)
    _assert_same(out, semi_crf_streaming_topk(**kw, k=k, label_mask=lm, boundary_mask=bm, backend="torch"))


@pytest.mark.parametrize("direct", [False, True], ids=["CC", "KCC"])
def test_exact_ties_break_as_on_the_pytorch_path(direct, numba_calls):
    # all-zero scores: every segmentation with the same number of segments ties
    B, T, K, C = 3, 9, 4, 3
    cum = torch.zeros(B, T + 1, C, dtype=F64)
    tr = torch.zeros((K, C, C) if direct else (C, C), dtype=F64)
    args = (cum, tr, torch.zeros(K, C, dtype=F64), torch.tensor([9, 6, 2]), K)
    for k in (3, 8, 50):
        got = semi_crf_streaming_topk(*args, k=k, backend="numba")
        _assert_same(got, semi_crf_streaming_topk(*args, k=k, backend="torch"))
        assert len(set(tuple(got.segments_of(0, r)) for r in range(k))) == k
    assert len(numba_calls) == 3


def test_float32_inputs_and_auto_on_cpu(numba_calls):
    kw, _ = _inputs(46, B=3, T=30, K=6, C=4, proj=True)
    kw32 = {n: (v.detach().float() if torch.is_tensor(v) and v.is_floating_point() else v) for n, v in kw.items()}
    got = semi_crf_streaming_topk(**kw32, k=4)  # backend="auto": CPU tensors take the compiled path
    assert numba_calls and got.scores.dtype == torch.float32
    _assert_same(got, semi_crf_streaming_topk(**kw32, k=4, backend="torch"))
    n = len(numba_calls)
    semi_crf_streaming_topk(**kw32, k=4, backend="torch")
    assert len(numba_calls) == n


def test_an_impossible_sequence_has_no_ranks(numba_calls):
    kw, _ = _inputs(47, B=2, T=5, K=2, C=2)
    lm = torch.ones(2, 5, 2, dtype=torch.bool)
    bm = torch.zeros(2, 5, dtype=torch.long)
    bm[1, 1:4] = -1  # no segment may start at 1, 2 or 3: with K = 2 nothing reaches the end
    got = semi_crf_streaming_topk(**kw, k=3, label_mask=lm, boundary_mask=bm, backend="numba")
    _assert_same(got, semi_crf_streaming_topk(**kw, k=3, label_mask=lm, boundary_mask=bm, backend="torch"))
    assert torch.isfinite(got.scores[0]).all() and (got.scores[1] == -float("inf")).all()
    assert (got.labels[1] == -1).all()


def test_the_head_topk_runs_compiled_on_cpu(numba_calls):
    torch.manual_seed(0)
    head = SemiMarkovCRFHead(num_classes=3, max_duration=6, hidden_dim=8)
    h, lengths = torch.randn(2, 40, 8), torch.tensor([40, 25])
    got = head.topk(h, lengths, 4)
    assert numba_calls
    ref = SemiMarkovCRFHead(num_classes=3, max_duration=6, hidden_dim=8, backend="torch")
    ref.load_state_dict(head.state_dict())
    _assert_same(got, ref.topk(h, lengths, 4))


@pytest.mark.parametrize("proj", [False, True], ids=["plain", "proj"])
def test_long_sequences_bitwise_with_pruning(proj, numba_calls):
    """(C, C) transition, T = 400, K = 16: the pruned kernel (segment scores from reversed rows,
    S and D alone when there are no projections and every sequence is full) equals the PyTorch
    path bit for bit, with large cumulative scores (a drift of 50 per position)."""
    from torch_semimarkov.api.constrained import _validated
    from torch_semimarkov.engines.torch.dense import _Model

    g = torch.Generator().manual_seed(47)
    B, T, K, C = 2, 400, 16, 4
    cum = torch.nn.functional.pad((torch.randn(B, T, C, generator=g, dtype=F64) + 50.0).cumsum(1), (0, 0, 1, 0))
    kw = dict(cum_scores=cum, transition=torch.randn(C, C, generator=g, dtype=F64),
              duration_bias=torch.randn(K, C, generator=g, dtype=F64), lengths=torch.full((B,), T), K=K)
    if proj:
        kw.update(proj_start=torch.randn(B, T, C, generator=g, dtype=F64),
                  proj_end=torch.randn(B, T, C, generator=g, dtype=F64), lengths=torch.tensor([T, T - 37]))
    inp = _validated(**{n: kw.get(n) for n in ("cum_scores", "transition", "duration_bias", "lengths", "K",
                                                "proj_start", "proj_end")},
                     label_mask=None, boundary_mask=None, validate=True, backend="numba", use_triton=True)[0]
    m = _Model(inp)
    # the plain branch runs when nothing but S and D enters a segment of the sequence (the start
    # additions are -inf before it)
    inside = m.start_add[:, K:K + T].eq(0).all() and m.end_add[:, K + 1:K + T + 1].eq(0).all()
    plain = bool(m.ps.eq(0).all() and m.pe.eq(0).all() and inside and m.start_add[:, :K].eq(-torch.inf).all())
    assert plain == (not proj)
    for k in (1, 5):
        got = semi_crf_streaming_topk(**kw, k=k, backend="numba")
        want = semi_crf_streaming_topk(**kw, k=k, backend="torch")
        _assert_same(got, want)
        assert torch.isfinite(want.scores).all()
    assert len(numba_calls) == 2
