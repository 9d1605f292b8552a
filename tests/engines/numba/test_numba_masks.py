"""Partial labels on the compiled CPU engine (numba): masked log Z, its gradients, marginals and
constrained Viterbi against the float64 PyTorch path (``backend="torch"``, to 1e-12) and against
brute-force enumeration restricted to the allowed segmentations (T <= 6)."""

import math

import pytest
import torch

from test_distribution import _masks as make_masks  # masks a random reference segmentation satisfies
from torch_semimarkov import semi_crf_streaming_forward, semi_crf_streaming_marginals, semi_crf_streaming_viterbi
from torch_semimarkov.oracle import enumerate_segmentations, segmentation_allowed

pytest.importorskip("numba")

F64 = torch.float64


def assert_close(got, want, tol=1e-12, what=""):
    """Equal to ``tol`` absolute + relative; fails on NaN and names the worst error."""
    assert not torch.isnan(got).any(), f"{what}: NaN"
    torch.testing.assert_close(got, want, atol=tol, rtol=tol, msg=lambda m: f"{what}: {m}")


def make_inputs(seed, B=3, T=13, K=4, C=3, direct=False, proj=False, dtype=F64):
    """Random inputs with ragged lengths (T, T-3, 1) and float leaves that require gradients."""
    g = torch.Generator().manual_seed(seed)
    cum = torch.nn.functional.pad(torch.randn(B, T, C, generator=g, dtype=F64).cumsum(1), (0, 0, 1, 0))
    tr = torch.randn(*((K, C, C) if direct else (C, C)), generator=g, dtype=F64)
    db = torch.randn(K, C, generator=g, dtype=F64)
    ps = torch.randn(B, T, C, generator=g, dtype=F64) if proj else None
    pe = torch.randn(B, T, C, generator=g, dtype=F64) if proj else None
    lengths = torch.tensor([T, max(1, T - 3), 1][:B])
    leaves = [x.to(dtype).requires_grad_() for x in [cum, tr, db] + ([ps, pe] if proj else [])]
    kw = dict(cum_scores=leaves[0], transition=leaves[1], duration_bias=leaves[2], lengths=lengths, K=K,
              proj_start=leaves[3] if proj else None, proj_end=leaves[4] if proj else None)
    return kw, leaves


CASES = [dict(direct=d, proj=p) for d in (False, True) for p in (False, True)]
IDS = ["CC", "CC-proj", "KCC", "KCC-proj"]
MASKS = ["labels", "boundaries", "both"]


def _pick(masks, which):
    lm, bm = masks
    return (lm if which != "boundaries" else None), (bm if which != "labels" else None)


@pytest.mark.parametrize("which", MASKS)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_masked_log_z_and_gradients_equal_the_pytorch_path(case, which):
    kw, leaves = make_inputs(11, **case)
    B, T1, C = kw["cum_scores"].shape
    lm, bm = _pick(make_masks(12, B, T1 - 1, C), which)
    up = torch.randn(B, generator=torch.Generator().manual_seed(3), dtype=F64)
    out = {}
    for backend in ("numba", "torch"):
        z = semi_crf_streaming_forward(**kw, label_mask=lm, boundary_mask=bm, backend=backend)
        out[backend] = (z, torch.autograd.grad((z * up).sum(), leaves))
    assert torch.isfinite(out["torch"][0]).all()
    assert_close(out["numba"][0], out["torch"][0], what="log Z")
    for i, (a, b) in enumerate(zip(out["numba"][1], out["torch"][1])):
        assert_close(a, b, what=f"grad {i}")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_masked_marginals_and_viterbi_equal_the_pytorch_path(case):
    kw, _ = make_inputs(21, T=17, K=5, **case)
    B, T1, C = kw["cum_scores"].shape
    lm, bm = make_masks(22, B, T1 - 1, C)
    m = {b: semi_crf_streaming_marginals(**kw, label_mask=lm, boundary_mask=bm, backend=b) for b in ("numba", "torch")}
    for name in ("log_Z", "start", "end", "position", "boundary"):
        assert_close(getattr(m["numba"], name), getattr(m["torch"], name), what=name)
    v = {b: semi_crf_streaming_viterbi(**kw, label_mask=lm, boundary_mask=bm, backend=b) for b in ("numba", "torch")}
    assert_close(v["numba"].scores, v["torch"].scores, what="best score")
    assert torch.equal(v["numba"].labels, v["torch"].labels)
    assert torch.equal(v["numba"].segment_starts, v["torch"].segment_starts)


def _restricted(kw, lm, bm):
    args = {k: kw[k] for k in ("cum_scores", "transition", "duration_bias", "lengths", "K", "proj_start", "proj_end")}
    out = []
    for b, (segs, scores) in enumerate(enumerate_segmentations(**args)):
        keep = [i for i, s in enumerate(segs) if segmentation_allowed(s, lm[b], bm[b]) and scores[i] > -math.inf]
        out.append(([segs[i] for i in keep], scores[keep].detach()))
    return out


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_masked_results_equal_the_restricted_enumeration(case):
    kw, leaves = make_inputs(31, T=6, K=3, C=2, **case)
    B, T1, C = kw["cum_scores"].shape
    lm, bm = make_masks(32, B, T1 - 1, C)
    enum = _restricted(kw, lm, bm)
    log_z = semi_crf_streaming_forward(**kw, label_mask=lm, boundary_mask=bm, backend="numba")
    ref = torch.stack([torch.logsumexp(s, 0) for _, s in enum])
    assert_close(log_z.detach(), ref, tol=1e-10, what="log Z")
    m = semi_crf_streaming_marginals(**kw, label_mask=lm, boundary_mask=bm, backend="numba")
    best = semi_crf_streaming_viterbi(**kw, label_mask=lm, boundary_mask=bm, backend="numba")
    for b, (segs, scores) in enumerate(enum):
        p = torch.softmax(scores, 0)
        start = torch.zeros(T1 - 1, C, dtype=F64)
        for seg, w in zip(segs, p):
            for s in seg:
                start[s.start, s.label] += w
        assert_close(m.start[b], start, tol=1e-10, what="P_start")
        assert_close(best.scores[b], scores.max(), tol=1e-10, what="best score")
        i = int(scores.argmax())
        assert [(s.start, s.end, s.label) for s in best.segments[b]] == [(s.start, s.end, s.label) for s in segs[i]]


def test_float32_inputs_and_impossible_masks():
    """float32 in: the float64 engine's values cast once; a sequence whose masks allow nothing has
    log Z -inf, zero gradients and no segments, the others are unaffected."""
    kw, leaves = make_inputs(41, dtype=torch.float32)
    B, T1, C = kw["cum_scores"].shape
    lm, bm = make_masks(42, B, T1 - 1, C)
    lm[0, 2] = False  # position 2 of sequence 0 allows no label
    z = {b: semi_crf_streaming_forward(**kw, label_mask=lm, boundary_mask=bm, backend=b) for b in ("numba", "torch")}
    assert z["numba"].dtype == torch.float32
    assert z["numba"][0] == -math.inf and torch.isfinite(z["numba"][1:]).all()
    torch.testing.assert_close(z["numba"], z["torch"], atol=1e-5, rtol=1e-6)
    g = torch.autograd.grad(z["numba"][1:].sum(), leaves[0])[0]
    assert torch.isfinite(g).all() and (g[0] == 0).all() and (g[1] != 0).any()
    v = semi_crf_streaming_viterbi(**kw, label_mask=lm, boundary_mask=bm, backend="numba")
    assert v.scores[0] == -math.inf and (v.labels[0] == -1).all() and len(v.segments[0]) == 0


def test_auto_takes_the_compiled_engine_on_cpu_tensors(monkeypatch):
    """``backend="auto"`` runs masks on the compiled engine, ``"torch"`` never."""
    from torch_semimarkov.engines.numba import engine as numba_engine

    kw, _ = make_inputs(51)
    B, T1, C = kw["cum_scores"].shape
    lm, bm = make_masks(52, B, T1 - 1, C)
    calls = []
    real = numba_engine.semi_crf_streaming_forward_numba
    monkeypatch.setattr(numba_engine, "semi_crf_streaming_forward_numba",
                        lambda *a, **k: calls.append(k.get("masks") is not None) or real(*a, **k))
    semi_crf_streaming_forward(**kw, label_mask=lm, boundary_mask=bm)
    assert calls == [True]
    semi_crf_streaming_forward(**kw, label_mask=lm, boundary_mask=bm, backend="torch")
    assert calls == [True]
