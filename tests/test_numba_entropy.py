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


def test_auto_takes_the_compiled_engine_on_cpu_tensors(monkeypatch):
    """backend='auto' on CPU tensors with a (C, C) transition runs numba_entropy (entropy and the
    cross-entropy), with the results of backend='numba' bit for bit."""
    from torch_semimarkov.streaming import numba_entropy
    calls = []
    real = numba_entropy.expected_score_numba
    monkeypatch.setattr(numba_entropy, "expected_score_numba", lambda *a, **k: calls.append(1) or real(*a, **k))
    kw, leaves = make_inputs(121, T=17, K=4, proj=True)
    kw_q, _ = make_inputs(122, T=17, K=4, proj=True)
    out = {}
    for backend in ("auto", "numba"):
        H = semi_crf_streaming_entropy(**kw, backend=backend)
        ce = SemiMarkovCRF(**kw, backend=backend).cross_entropy(SemiMarkovCRF(**kw_q, backend=backend))
        out[backend] = (H, ce, torch.autograd.grad(H.sum() + ce.sum(), leaves))
    assert len(calls) == 4
    assert torch.equal(out["auto"][0], out["numba"][0]) and torch.equal(out["auto"][1], out["numba"][1])
    for a, b in zip(out["auto"][2], out["numba"][2]):
        assert torch.equal(a, b)


def test_large_cumulative_scores_cost_no_precision():
    """A constant added to every label's score at a position (1e4 per position: prefixes of 3e6)
    changes no probability: the compiled entropy, the cross-entropy and their gradients stay put
    to 1e-8 (as they were, relative to a per-position reference, the messages would round numbers
    of size 3e6 at every step: 3e-6 on the transition gradient)."""
    kw, leaves = make_inputs(123, B=2, T=300, K=6, C=3, proj=True)
    kw_q, leaves_q = make_inputs(124, B=2, T=300, K=6, C=3, proj=True)
    shift = 1e4 * torch.arange(301, dtype=F64)[None, :, None]

    def run(cum_p, cum_q):
        p_kw, q_kw = dict(kw, cum_scores=cum_p), dict(kw_q, cum_scores=cum_q)
        H = semi_crf_streaming_entropy(**p_kw, backend="numba")
        ce = SemiMarkovCRF(**p_kw, backend="numba").cross_entropy(SemiMarkovCRF(**q_kw, backend="numba"))
        g_h = torch.autograd.grad(H.sum(), [cum_p] + leaves[1:])
        return H, ce, g_h, torch.autograd.grad(ce.sum(), [cum_p, cum_q] + leaves[1:] + leaves_q[1:])

    base = run(leaves[0], leaves_q[0])
    big = run((leaves[0].detach() + shift).requires_grad_(), (leaves_q[0].detach() - 0.7 * shift).requires_grad_())
    assert (base[0] > 0).all() and torch.isfinite(base[1]).all()
    torch.testing.assert_close(big[0], base[0], atol=1e-8, rtol=0)
    torch.testing.assert_close(big[1], base[1], atol=1e-8, rtol=0)
    # the shifted inputs themselves are rounded at 5e-10 (the size of 3e6's last bit): marginals
    # summed over 300 positions (q's transition gradient, up to 360) move by that relative amount
    for a, b in zip(big[2], base[2]):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=0)
    for a, b in zip(big[3], base[3]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
