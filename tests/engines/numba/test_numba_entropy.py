"""The entropy, its gradient, the cross-entropy and the KL divergence on the compiled CPU engine
(numba), for (C, C) and (K, C, C) transitions and masks on either model, against the float64
PyTorch path (``backend="torch"``, to 1e-12) and against enumeration."""

import math

import pytest
import torch

from torch_semimarkov import SemiMarkovCRF, semi_crf_streaming_entropy
from torch_semimarkov.oracle import enumerate_segmentations, segmentation_allowed

from test_numba_masks import assert_close, make_inputs, make_masks

pytest.importorskip("numba")

F64 = torch.float64
CASES = [dict(direct=d, proj=p) for d in (False, True) for p in (False, True)]
IDS = ["CC", "CC-proj", "KCC", "KCC-proj"]
DIRECT = pytest.mark.parametrize("direct", [False, True], ids=["CC", "KCC"])


def looser_masks(seed, lm, bm):
    """Masks that allow everything ``(lm, bm)`` allows and more (q's, so that E_p[score_q] stays finite)."""
    g = torch.Generator().manual_seed(seed)
    lm_q = lm | (torch.rand(lm.shape, generator=g) < 0.5)
    bm_q = torch.where(torch.rand(bm.shape, generator=g) < 0.5, bm, torch.zeros_like(bm))
    return lm_q, bm_q


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


@DIRECT
def test_entropy_equals_enumeration_and_autograd_of_it(direct):
    kw, leaves = make_inputs(93, T=6, K=3, C=2, proj=True, direct=direct)
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


@DIRECT
def test_cross_entropy_equals_enumeration_and_autograd_of_it(direct):
    """H(p, q) = -sum_y p(y) log q(y) over p's allowed segmentations, both models with masks (q's looser)."""
    kw_p, lp = make_inputs(97, T=6, K=3, C=2, proj=True, direct=direct)
    kw_q, lq = make_inputs(98, T=6, K=3, C=2, proj=True, direct=direct)
    B, T1, C = kw_p["cum_scores"].shape
    lm, bm = make_masks(99, B, T1 - 1, C, free=0.6)
    lm_q, bm_q = looser_masks(100, lm, bm)
    ce = SemiMarkovCRF(**kw_p, label_mask=lm, boundary_mask=bm, backend="numba").cross_entropy(
        SemiMarkovCRF(**kw_q, label_mask=lm_q, boundary_mask=bm_q, backend="numba"))
    names = ("cum_scores", "transition", "duration_bias", "lengths", "K", "proj_start", "proj_end")
    ref = []
    enum_p = enumerate_segmentations(**{k: kw_p[k] for k in names})
    enum_q = enumerate_segmentations(**{k: kw_q[k] for k in names})
    for b, ((segs, sp), (segs_q, sq)) in enumerate(zip(enum_p, enum_q)):
        assert segs == segs_q
        keep = [i for i, s in enumerate(segs) if segmentation_allowed(s, lm[b], bm[b]) and sp[i] > -math.inf]
        keep_q = [i for i, s in enumerate(segs) if segmentation_allowed(s, lm_q[b], bm_q[b]) and sq[i] > -math.inf]
        assert set(keep) <= set(keep_q)
        log_q = sq - torch.logsumexp(sq[keep_q], 0)
        ref.append(-(torch.softmax(sp[keep], 0) * log_q[keep]).sum())
    ref = torch.stack(ref)
    assert_close(ce.detach(), ref.detach(), tol=1e-10, what="cross-entropy")
    up = torch.tensor([0.3, -1.2, 0.7], dtype=F64)
    got = torch.autograd.grad((ce * up).sum(), lp + lq)
    want = torch.autograd.grad((ref * up).sum(), lp + lq, allow_unused=True)
    for i, (a, b) in enumerate(zip(got, want)):
        assert_close(a, torch.zeros_like(a) if b is None else b, tol=1e-10, what=f"grad {i}")


@DIRECT
def test_results_are_bitwise_identical_for_any_thread_count(direct, monkeypatch):
    """The entropy, the cross-entropy and their gradients, bit for bit on 1 and on every numba thread."""
    import numba

    import torch_semimarkov.engines.numba.engine as engine
    monkeypatch.setattr(engine, "_PARALLEL_MIN_WORK", 0)
    kw, leaves = make_inputs(131, B=5, T=40, K=5, C=4, proj=True, direct=direct)
    kw["lengths"] = lengths = torch.tensor([40, 33, 1, 17, 40])
    kw_q, leaves_q = make_inputs(132, B=5, T=40, K=5, C=4, proj=True, direct=direct)
    kw_q["lengths"] = lengths
    torch_threads, before = torch.get_num_threads(), numba.get_num_threads()
    runs = []
    try:
        for threads in (1, numba.config.NUMBA_NUM_THREADS, 1):
            numba.set_num_threads(threads)
            H = semi_crf_streaming_entropy(**kw, backend="numba")
            ce = SemiMarkovCRF(**kw, backend="numba").cross_entropy(SemiMarkovCRF(**kw_q, backend="numba"))
            runs.append((H, ce) + torch.autograd.grad(H.sum() + ce.sum(), leaves + leaves_q))
    finally:
        numba.set_num_threads(before)
        torch.set_num_threads(torch_threads)
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


@DIRECT
def test_float32_inputs_and_impossible_sequences(direct):
    kw, leaves = make_inputs(95, dtype=torch.float32, direct=direct)
    B, T1, C = kw["cum_scores"].shape
    lm, bm = make_masks(96, B, T1 - 1, C)
    lm[2, 0] = False
    H = {b: semi_crf_streaming_entropy(**kw, label_mask=lm, boundary_mask=bm, backend=b) for b in ("numba", "torch")}
    assert H["numba"].dtype == torch.float32 and H["numba"][2] == 0
    torch.testing.assert_close(H["numba"], H["torch"], atol=1e-5, rtol=1e-6)
    g = torch.autograd.grad(H["numba"].sum(), leaves[0])[0]
    assert torch.isfinite(g).all() and (g[2] == 0).all() and (g[0] != 0).any()


@pytest.mark.parametrize("masked", ["free", "p", "both"], ids=["free", "p-masked", "both-masked"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_cross_entropy_and_kl_equal_the_pytorch_path(case, masked):
    """H(p, q) and KL(p || q) with gradients into both models' inputs; with "both", q's masks
    allow a superset of p's segmentations (finite values)."""
    kw_p, lp = make_inputs(101, T=19, K=4, **case)
    kw_q, lq = make_inputs(102, T=19, K=4, **case)
    B, T1, C = kw_p["cum_scores"].shape
    lm, bm = make_masks(103, B, T1 - 1, C) if masked != "free" else (None, None)
    lm_q, bm_q = looser_masks(104, lm, bm) if masked == "both" else (None, None)
    up = torch.randn(B, generator=torch.Generator().manual_seed(5), dtype=F64)
    out = {}
    for backend in ("numba", "torch"):
        p = SemiMarkovCRF(**kw_p, label_mask=lm, boundary_mask=bm, backend=backend)
        q = SemiMarkovCRF(**kw_q, label_mask=lm_q, boundary_mask=bm_q, backend=backend)
        ce, kl = p.cross_entropy(q), p.kl(q)
        out[backend] = (ce, kl, torch.autograd.grad((ce * up).sum() + kl.sum(), lp + lq))
    assert (out["torch"][1] > 0).all()
    assert_close(out["numba"][0], out["torch"][0], what="cross-entropy")
    assert_close(out["numba"][1], out["torch"][1], what="KL")
    for i, (a, b) in enumerate(zip(out["numba"][2], out["torch"][2])):
        assert_close(a, b, what=f"grad {i}")


@pytest.mark.parametrize("forbid", ["transition", "masks"])
@DIRECT
def test_cross_entropy_is_infinite_where_q_forbids_what_p_allows(direct, forbid):
    """q forbids by a transition or by masks (label / boundary masks of its own, stricter than
    p's in some rows): +inf there, the PyTorch path's values and gradients elsewhere."""
    kw_p, lp = make_inputs(111, B=4, T=9, K=3, direct=direct)
    kw_q, lq = make_inputs(112, B=4, T=9, K=3, direct=direct)
    kw_p["lengths"] = kw_q["lengths"] = torch.tensor([9, 6, 1, 9])
    masks_p = masks_q = (None, None)
    if forbid == "transition":
        with torch.no_grad():
            kw_q["transition"][..., 0, 1] = -math.inf
    else:
        lm, bm = make_masks(113, 4, 9, 3)
        masks_p = (lm, bm)
        lm_q, bm_q = looser_masks(114, lm, bm)
        # row 0: q forbids a label that p allows somewhere; row 3: q forces a start that p does not
        t = int(torch.nonzero(lm[0].sum(1) >= 2)[0])
        lm_q[0, t] &= torch.arange(3) != int(torch.nonzero(lm[0, t])[0])
        bm_q[3, int(torch.nonzero(bm[3] == 0)[0])] = 1
        masks_q = (lm_q, bm_q)

    def cross_entropy(backend, rows=slice(None)):
        """The cross-entropy of the sequences ``rows`` and its inputs that require gradients."""
        per_row = ("cum_scores", "lengths", "proj_start", "proj_end")
        kws = [{k: (v[rows] if k in per_row and v is not None else v) for k, v in kw.items()} for kw in (kw_p, kw_q)]
        leaves = []
        for kw in kws:
            for k, v in kw.items():
                if isinstance(v, torch.Tensor) and v.requires_grad:
                    kw[k] = v.detach().clone().requires_grad_()
                    leaves.append((k in per_row, kw[k]))
        m = [tuple(None if x is None else x[rows] for x in ms) for ms in (masks_p, masks_q)]
        p = SemiMarkovCRF(**kws[0], label_mask=m[0][0], boundary_mask=m[0][1], backend=backend)
        return p.cross_entropy(SemiMarkovCRF(**kws[1], label_mask=m[1][0], boundary_mask=m[1][1],
                                             backend=backend)), leaves

    ce, leaves = cross_entropy("numba")
    ref = cross_entropy("torch")[0]
    ok = torch.isfinite(ref)
    assert torch.equal(torch.isinf(ce), torch.isinf(ref)) and not ok.all() and ok.any()
    assert_close(ce[ok], ref[ok], what="finite rows")
    # the gradients of the finite rows: those of the PyTorch path run on them alone (its backward
    # leaves NaN in a batch with infinite rows); zero on the infinite rows
    got = torch.autograd.grad(ce[ok].sum(), [x for _, x in leaves])
    sub, sub_leaves = cross_entropy("torch", ok)
    want = torch.autograd.grad(sub.sum(), [x for _, x in sub_leaves])
    for i, ((per_row, _), a, b) in enumerate(zip(leaves, got, want)):
        if per_row:
            assert (a[~ok] == 0).all()
            a = a[ok]
        assert_close(a, b, what=f"grad {i}")


@DIRECT
def test_auto_takes_the_compiled_engine_on_cpu_tensors(monkeypatch, direct):
    """backend='auto' on CPU tensors ((C, C) or (K, C, C) transition, q with masks) runs
    numba_entropy (entropy and the cross-entropy), with the results of backend='numba' bit for bit."""
    from torch_semimarkov.engines.numba import entropy as numba_entropy
    calls = []
    real = numba_entropy.expected_score_numba
    monkeypatch.setattr(numba_entropy, "expected_score_numba", lambda *a, **k: calls.append(1) or real(*a, **k))
    kw, leaves = make_inputs(121, T=17, K=4, proj=True, direct=direct)
    kw_q, _ = make_inputs(122, T=17, K=4, proj=True, direct=direct)
    lm, bm = make_masks(123, 3, 17, 3)
    out = {}
    for backend in ("auto", "numba"):
        H = semi_crf_streaming_entropy(**kw, backend=backend)
        ce = SemiMarkovCRF(**kw, backend=backend).cross_entropy(
            SemiMarkovCRF(**kw_q, label_mask=lm, boundary_mask=bm, backend=backend))
        ce = torch.where(torch.isfinite(ce), ce, torch.zeros_like(ce))
        out[backend] = (H, ce, torch.autograd.grad(H.sum() + ce.sum(), leaves))
    assert len(calls) == 4
    assert torch.equal(out["auto"][0], out["numba"][0]) and torch.equal(out["auto"][1], out["numba"][1])
    for i, (a, b) in enumerate(zip(out["auto"][2], out["numba"][2])):
        # (failed once in ~60 runs, not reproduced since: the message says where, for the next look)
        assert torch.equal(a, b), (f"leaf {i}: {int((a != b).sum())} entries differ, largest by "
                                   f"{float((a - b).abs().max()):.3e}, first at {(a != b).nonzero()[:4].tolist()}")


@DIRECT
def test_large_cumulative_scores_cost_no_precision(direct):
    """A constant added to every label's score at a position (1e4 per position: prefixes of 3e6)
    changes no probability: the compiled entropy, the cross-entropy and their gradients stay put
    to 1e-8 (as they were, relative to a per-position reference, the messages would round numbers
    of size 3e6 at every step: 3e-6 on the transition gradient)."""
    kw, leaves = make_inputs(123, B=2, T=300, K=6, C=3, proj=True, direct=direct)
    kw_q, leaves_q = make_inputs(124, B=2, T=300, K=6, C=3, proj=True, direct=direct)
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
