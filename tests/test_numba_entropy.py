"""The entropy, its gradient, the cross-entropy and the KL divergence on the compiled CPU engine
(numba) against the float64 PyTorch path (``backend="torch"``, to 1e-12) and against enumeration."""

import math

import pytest
import torch

from torch_semimarkov import SemiMarkovCRF, semi_crf_streaming_entropy
from torch_semimarkov.oracle import enumerate_segmentations, segmentation_allowed

from test_numba_masks import assert_close, make_inputs, make_masks

pytest.importorskip("numba")

F64 = torch.float64
CASES = [dict(direct=False, proj=False), dict(direct=False, proj=True)]
IDS = ["CC", "CC-proj"]


@pytest.mark.parametrize("masked", [False, True], ids=["free", "masked"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_entropy_and_gradient_equal_the_pytorch_path(case, masked):
    kw, leaves = make_inputs(91, T=23, K=5, **case)
    B, T1, C = kw["cum_scores"].shape
    lm, bm = make_masks(92, B, T1 - 1, C) if masked else (None, None)
    up = torch.randn(B, generator=torch.Generator().manual_seed(4), dtype=F64)
    out = {}
    for backend in ("numba", "torch"):
        H = semi_crf_streaming_entropy(**kw, label_mask=lm, boundary_mask=bm, backend=backend)
        out[backend] = (H, torch.autograd.grad((H * up).sum(), leaves))
    assert (out["torch"][0] > 0).all()
    assert_close(out["numba"][0], out["torch"][0], what="H")
    for i, (a, b) in enumerate(zip(out["numba"][1], out["torch"][1])):
        assert_close(a, b, what=f"grad {i}")


def test_entropy_equals_enumeration_and_autograd_of_it():
    kw, leaves = make_inputs(93, T=6, K=3, C=2, proj=True)
    B, T1, C = kw["cum_scores"].shape
    lm, bm = make_masks(94, B, T1 - 1, C, free=0.6)
    H = semi_crf_streaming_entropy(**kw, label_mask=lm, boundary_mask=bm, backend="numba")
    args = {k: kw[k] for k in ("cum_scores", "transition", "duration_bias", "lengths", "K", "proj_start", "proj_end")}
    ref = []
    for b, (segs, scores) in enumerate(enumerate_segmentations(**args)):
        keep = [i for i, s in enumerate(segs) if segmentation_allowed(s, lm[b], bm[b]) and scores[i] > -math.inf]
        logp = torch.log_softmax(scores[keep], 0)
        ref.append(-(logp.exp() * logp).sum())
    ref = torch.stack(ref)
    assert_close(H.detach(), ref.detach(), tol=1e-10, what="H")
    up = torch.tensor([0.3, -1.2, 0.7], dtype=F64)
    got = torch.autograd.grad((H * up).sum(), leaves)
    want = torch.autograd.grad((ref * up).sum(), leaves, allow_unused=True)
    for i, (a, b) in enumerate(zip(got, want)):
        assert_close(a, torch.zeros_like(a) if b is None else b, tol=1e-10, what=f"grad {i}")


def test_float32_inputs_and_impossible_sequences():
    kw, leaves = make_inputs(95, dtype=torch.float32)
    B, T1, C = kw["cum_scores"].shape
    lm, bm = make_masks(96, B, T1 - 1, C)
    lm[2, 0] = False
    H = {b: semi_crf_streaming_entropy(**kw, label_mask=lm, boundary_mask=bm, backend=b) for b in ("numba", "torch")}
    assert H["numba"].dtype == torch.float32 and H["numba"][2] == 0
    torch.testing.assert_close(H["numba"], H["torch"], atol=1e-5, rtol=1e-6)
    g = torch.autograd.grad(H["numba"].sum(), leaves[0])[0]
    assert torch.isfinite(g).all() and (g[2] == 0).all() and (g[0] != 0).any()


@pytest.mark.parametrize("masked", [False, True], ids=["free", "p-masked"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_cross_entropy_and_kl_equal_the_pytorch_path(case, masked):
    """H(p, q) and KL(p || q) with gradients into both models' inputs; q has no masks."""
    kw_p, lp = make_inputs(101, T=19, K=4, **case)
    kw_q, lq = make_inputs(102, T=19, K=4, **case)
    B, T1, C = kw_p["cum_scores"].shape
    lm, bm = make_masks(103, B, T1 - 1, C) if masked else (None, None)
    up = torch.randn(B, generator=torch.Generator().manual_seed(5), dtype=F64)
    out = {}
    for backend in ("numba", "torch"):
        p = SemiMarkovCRF(**kw_p, label_mask=lm, boundary_mask=bm, backend=backend)
        q = SemiMarkovCRF(**kw_q, backend=backend)
        ce, kl = p.cross_entropy(q), p.kl(q)
        out[backend] = (ce, kl, torch.autograd.grad((ce * up).sum() + kl.sum(), lp + lq))
    assert (out["torch"][1] > 0).all()
    assert_close(out["numba"][0], out["torch"][0], what="cross-entropy")
    assert_close(out["numba"][1], out["torch"][1], what="KL")
    for i, (a, b) in enumerate(zip(out["numba"][2], out["torch"][2])):
        assert_close(a, b, what=f"grad {i}")


def test_cross_entropy_is_infinite_where_q_forbids_what_p_allows():
    kw_p, lp = make_inputs(111, T=9, K=3)
    kw_q, lq = make_inputs(112, T=9, K=3)
    with torch.no_grad():
        kw_q["transition"][0, 1] = -math.inf
    ce = SemiMarkovCRF(**kw_p, backend="numba").cross_entropy(SemiMarkovCRF(**kw_q, backend="numba"))
    ref = SemiMarkovCRF(**kw_p, backend="torch").cross_entropy(SemiMarkovCRF(**kw_q, backend="torch"))
    assert torch.equal(torch.isinf(ce), torch.isinf(ref)) and torch.isinf(ce).any()
    assert_close(ce[torch.isfinite(ref)], ref[torch.isfinite(ref)], what="finite rows")
    g = torch.autograd.grad(ce[torch.isfinite(ce)].sum(), lp[0])[0]
    assert torch.isfinite(g).all()
