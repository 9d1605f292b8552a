"""k-best lists, exact samples, entropy and partial labels against brute-force enumeration.

Every quantity is checked against :func:`torch_semimarkov.oracle.enumerate_segmentations` (all
labelled segmentations of sequences of T <= 7 positions with their scores): top-k against the
sorted enumeration, samples by a chi-square test against the exact probabilities, entropy and its
gradient against ``-sum p log p`` and autograd of it, masked log Z / decoding / marginals against
the enumeration restricted to the allowed segmentations.
"""

import math

import pytest
import torch

from torch_semimarkov import (
    SemiMarkovCRFHead,
    semi_crf_streaming_entropy,
    semi_crf_streaming_forward,
    semi_crf_streaming_marginals,
    semi_crf_streaming_sample,
    semi_crf_streaming_topk,
    semi_crf_streaming_viterbi,
)
from torch_semimarkov.oracle import enumerate_segmentations, segmentation_allowed

F64 = torch.float64


def _inputs(seed, B=3, T=6, K=3, C=2, direct=False, proj=False, forbid=False):
    g = torch.Generator().manual_seed(seed)
    cum = torch.nn.functional.pad(torch.randn(B, T, C, generator=g, dtype=F64).cumsum(1), (0, 0, 1, 0))
    tr = torch.randn(*((K, C, C) if direct else (C, C)), generator=g, dtype=F64)
    db = torch.randn(K, C, generator=g, dtype=F64)
    if forbid:  # a forbidden move and a forbidden duration
        tr[..., 0, 1] = -math.inf
        db[1, 0] = -math.inf
    ps = torch.randn(B, T, C, generator=g, dtype=F64) if proj else None
    pe = torch.randn(B, T, C, generator=g, dtype=F64) if proj else None
    lengths = torch.tensor([T, max(1, T - 2), 1][:B])
    tensors = [cum, tr, db] + ([ps, pe] if proj else [])
    for t in tensors:
        t.requires_grad_()
    return dict(cum_scores=cum, transition=tr, duration_bias=db, lengths=lengths, K=K, proj_start=ps, proj_end=pe), tensors


def _masks(seed, B, T, C, free=0.4):
    """Random masks that a random reference segmentation satisfies (so most sequences stay feasible)."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.rand(B, T, generator=g) < 0.4
    starts[:, 0] = True
    lab = torch.randint(0, C, (B, T), generator=g)
    for t in range(1, T):
        lab[:, t] = torch.where(starts[:, t], lab[:, t], lab[:, t - 1])
    label_mask = (torch.rand(B, T, C, generator=g) < free) | torch.nn.functional.one_hot(lab, C).bool()
    r = torch.rand(B, T, generator=g)
    boundary_mask = torch.where(r < 0.35, torch.where(starts, 1, -1), 0)
    return label_mask, boundary_mask


def _enumerate(kw, label_mask=None, boundary_mask=None):
    """Per sequence: (allowed segmentations, their scores) by enumeration."""
    out = []
    args = {k: kw[k] for k in ("cum_scores", "transition", "duration_bias", "lengths", "K", "proj_start", "proj_end")}
    for b, (segs, scores) in enumerate(enumerate_segmentations(**args)):
        keep = [i for i, s in enumerate(segs) if segmentation_allowed(
            s, None if label_mask is None else label_mask[b], None if boundary_mask is None else boundary_mask[b])]
        keep = [i for i in keep if scores[i].item() > -math.inf]
        out.append(([segs[i] for i in keep], scores[keep]))
    return out


def _lse(scores):
    return torch.logsumexp(scores, 0) if scores.numel() else scores.new_tensor(-math.inf)


CASES = [dict(direct=d, proj=p, forbid=f) for d in (False, True) for p in (False, True) for f in (False, True)]


def _id(c):
    return "-".join(k for k, v in c.items() if v) or "plain"


# ---------------------------------------------------------------------------------- masks


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_masked_log_partition_and_gradients_equal_the_restricted_enumeration(case):
    kw, params = _inputs(1, **case)
    B, T1, C = kw["cum_scores"].shape
    lm, bm = _masks(2, B, T1 - 1, C)
    log_z = semi_crf_streaming_forward(**kw, label_mask=lm, boundary_mask=bm)
    ref = torch.stack([_lse(s) for _, s in _enumerate(kw, lm, bm)])
    torch.testing.assert_close(log_z, ref, atol=1e-10, rtol=0)
    ok = torch.isfinite(ref)
    assert ok.any()
    got = torch.autograd.grad(log_z[ok].sum(), params)
    want = torch.autograd.grad(ref[ok].sum(), params, allow_unused=True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, torch.zeros_like(a) if b is None else b, atol=1e-10, rtol=0)


def test_masked_best_score_and_its_gradient_equal_the_restricted_enumeration():
    kw, params = _inputs(5, proj=True)
    B, T1, C = kw["cum_scores"].shape
    lm, bm = _masks(6, B, T1 - 1, C)
    best = semi_crf_streaming_forward(**kw, semiring="max", label_mask=lm, boundary_mask=bm)
    ref = torch.stack([s.max() if s.numel() else torch.tensor(-math.inf, dtype=F64) for _, s in _enumerate(kw, lm, bm)])
    ok = torch.isfinite(ref)
    assert ok.any() and torch.equal(torch.isfinite(best), ok)
    torch.testing.assert_close(best[ok], ref[ok], atol=1e-10, rtol=0)
    got = torch.autograd.grad(best[ok].sum(), params)
    want = torch.autograd.grad(ref[ok].sum(), params, allow_unused=True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, torch.zeros_like(a) if b is None else b, atol=1e-10, rtol=0)


def test_no_mask_equals_the_engine_and_all_true_masks_change_nothing():
    kw, params = _inputs(3, proj=True)
    B, T1, C = kw["cum_scores"].shape
    lm = torch.ones(B, T1 - 1, C, dtype=torch.bool)
    bm = torch.zeros(B, T1 - 1, dtype=torch.long)
    masked = semi_crf_streaming_forward(**kw, label_mask=lm, boundary_mask=bm)
    plain = semi_crf_streaming_forward(**kw, backend="torch")
    torch.testing.assert_close(masked, plain, atol=1e-12, rtol=0)
    for a, b in zip(torch.autograd.grad(masked.sum(), params), torch.autograd.grad(plain.sum(), params)):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_a_mask_that_allows_nothing_gives_minus_inf_and_zero_gradients():
    kw, params = _inputs(4)
    B, T1, C = kw["cum_scores"].shape
    lm = torch.ones(B, T1 - 1, C, dtype=torch.bool)
    lm[0, 2] = False  # position 2 of sequence 0 may carry no label
    log_z = semi_crf_streaming_forward(**kw, label_mask=lm)
    assert log_z[0] == -math.inf and torch.isfinite(log_z[1:]).all()
    g = torch.autograd.grad(log_z[1:].sum() + 0 * log_z[0], params[0])[0]
    assert torch.isfinite(g).all() and (g[0] == 0).all()


@pytest.mark.parametrize("direct", [False, True])
def test_masked_viterbi_and_marginals_equal_the_restricted_enumeration(direct):
    kw, _ = _inputs(5, direct=direct, proj=True)
    B, T1, C = kw["cum_scores"].shape
    T = T1 - 1
    lm, bm = _masks(6, B, T, C)
    ref = _enumerate(kw, lm, bm)
    v = semi_crf_streaming_viterbi(**kw, label_mask=lm, boundary_mask=bm)
    m = semi_crf_streaming_marginals(**kw, label_mask=lm, boundary_mask=bm)
    for b, (segs, scores) in enumerate(ref):
        if not segs:
            assert v.scores[b] == -math.inf and (v.labels[b] == -1).all() and v.num_segments[b] == 0
            continue
        scores = scores.detach()
        i = int(scores.argmax())
        assert abs(float(v.scores[b]) - float(scores[i])) < 1e-10
        assert v.segments[b] == list(segs[i])
        p = torch.softmax(scores.detach(), 0)
        start = torch.zeros(T, C, dtype=F64)
        end = torch.zeros(T, C, dtype=F64)
        for pi, seg in zip(p, segs):
            for s, e, c in seg:
                start[s, c] += pi
                end[e - 1, c] += pi
        torch.testing.assert_close(m.start[b], start, atol=1e-10, rtol=0)
        torch.testing.assert_close(m.end[b], end, atol=1e-10, rtol=0)
        # the masks hold: no probability on a forbidden label, a forced start has boundary 1
        assert float(m.position[b][~lm[b]].abs().sum()) < 1e-10
        L = int(kw["lengths"][b])
        forced = (bm[b, :L] == 1).nonzero().reshape(-1)
        torch.testing.assert_close(m.boundary[b, forced], torch.ones(len(forced), dtype=F64))


def test_mask_arguments_are_checked():
    kw, _ = _inputs(7)
    B, T1, C = kw["cum_scores"].shape
    with pytest.raises(ValueError, match="label_mask must have shape"):
        semi_crf_streaming_forward(**kw, label_mask=torch.ones(B, T1, C, dtype=torch.bool))
    with pytest.raises(ValueError, match="label_mask must be a bool"):
        semi_crf_streaming_forward(**kw, label_mask=torch.ones(B, T1 - 1, C))
    with pytest.raises(ValueError, match="boundary_mask values"):
        semi_crf_streaming_forward(**kw, boundary_mask=torch.full((B, T1 - 1), 2))
    with pytest.raises(ValueError, match="boundary_mask must be an integer"):
        semi_crf_streaming_forward(**kw, boundary_mask=torch.zeros(B, T1 - 1, dtype=torch.bool))


# ---------------------------------------------------------------------------------- entropy


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_entropy_and_its_gradient_equal_the_enumeration(case):
    kw, params = _inputs(8, **case)
    H = semi_crf_streaming_entropy(**kw)
    ref = []
    for _, scores in _enumerate(kw):
        logp = torch.log_softmax(scores, 0)
        ref.append(-(logp.exp() * logp).sum())
    ref = torch.stack(ref)
    torch.testing.assert_close(H, ref, atol=1e-10, rtol=0)
    w = torch.tensor([1.0, -2.0, 0.5], dtype=F64)  # distinct weights per sequence
    got = torch.autograd.grad((H * w).sum(), params)
    want = torch.autograd.grad((ref * w).sum(), params)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=0)


def test_entropy_gradient_matches_finite_differences():
    kw, params = _inputs(9, B=1, T=5, proj=True)
    cum = params[0]
    H = semi_crf_streaming_entropy(**kw)
    g = torch.autograd.grad(H.sum(), cum)[0]
    eps = 1e-6
    for (t, c) in [(2, 0), (3, 1), (5, 1)]:
        with torch.no_grad():
            kp = dict(kw, cum_scores=cum.detach().clone())
            kp["cum_scores"][0, t, c] += eps
            km = dict(kw, cum_scores=cum.detach().clone())
            km["cum_scores"][0, t, c] -= eps
            fd = (semi_crf_streaming_entropy(**kp) - semi_crf_streaming_entropy(**km)) / (2 * eps)
        assert abs(float(fd[0]) - float(g[0, t, c])) < 1e-7


def test_masked_entropy_is_the_entropy_of_the_restricted_distribution():
    kw, _ = _inputs(10, direct=True)
    B, T1, C = kw["cum_scores"].shape
    lm, bm = _masks(11, B, T1 - 1, C)
    H = semi_crf_streaming_entropy(**kw, label_mask=lm, boundary_mask=bm)
    for b, (_, scores) in enumerate(_enumerate(kw, lm, bm)):
        if scores.numel() == 0:
            assert H[b] == 0
            continue
        logp = torch.log_softmax(scores.detach(), 0)
        assert abs(float(H[b].detach()) + float((logp.exp() * logp).sum())) < 1e-10


# ---------------------------------------------------------------------------------- top-k


def _check_topk(out, ref, k, tol=1e-10, gap=1e-9):
    """``out`` (a TopKResult, any device) against the enumeration ``ref``: sorted scores within
    ``tol``; distinct segmentations with their own scores; the enumeration's n best as a set
    wherever the n-th and (n+1)-th scores differ by more than ``gap`` (ties may reorder)."""
    out_scores = out.scores.detach().cpu().double()
    for b, (segs, scores) in enumerate(ref):
        scores = scores.detach()
        srt, order = torch.sort(scores, descending=True, stable=True)
        n = min(k, len(segs))
        torch.testing.assert_close(out_scores[b, :n], srt[:n], atol=tol, rtol=0)
        assert (out_scores[b, n:] == -math.inf).all()
        got = [tuple(out.segments_of(b, r)) for r in range(n)]
        assert len(set(got)) == n, "the k best must be distinct segmentations"
        index = {s: i for i, s in enumerate(segs)}
        for r, seg in enumerate(got):
            # each returned segmentation exists and has the returned score (ties may reorder)
            assert abs(float(scores[index[seg]]) - float(out_scores[b, r])) < tol
        # ties aside, the set of the n best is the enumeration's
        if n < len(segs) and float(srt[n - 1]) - float(srt[n]) > gap:
            assert set(got) == {segs[int(i)] for i in order[:n]}
        for r in range(n, k):
            assert (out.labels[b, r] == -1).all() and int(out.num_segments[b, r]) == 0


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_topk_equals_the_sorted_enumeration(case):
    kw, _ = _inputs(12, **case)
    k = 7
    out = semi_crf_streaming_topk(**kw, k=k)
    assert out.scores.shape == (3, k) and out.labels.shape == (3, k, 6)
    _check_topk(out, _enumerate(kw), k)
    # rank 0 is Viterbi
    v = semi_crf_streaming_viterbi(**kw, backend="torch")
    torch.testing.assert_close(out.scores[:, 0], v.scores, atol=1e-10, rtol=0)
    assert torch.equal(out.labels[:, 0], v.labels)


def test_topk_with_masks_and_more_ranks_than_segmentations():
    kw, _ = _inputs(13, T=4)
    B, T1, C = kw["cum_scores"].shape
    lm, bm = _masks(14, B, T1 - 1, C, free=0.5)
    k = 40  # more than some sequences have
    out = semi_crf_streaming_topk(**kw, k=k, label_mask=lm, boundary_mask=bm)
    ref = _enumerate(kw, lm, bm)
    assert min(len(s) for s, _ in ref) < k
    _check_topk(out, ref, k)


def test_topk_layout_and_ties_are_deterministic():
    # all-zero scores: every segmentation of a length ties with others of its segment count
    B, T, K, C = 2, 5, 3, 2
    cum = torch.zeros(B, T + 1, C, dtype=F64)
    args = (cum, torch.zeros(C, C, dtype=F64), torch.zeros(K, C, dtype=F64), torch.tensor([5, 3]), K)
    a = semi_crf_streaming_topk(*args, k=6)
    b = semi_crf_streaming_topk(*args, k=6)
    assert torch.equal(a.labels, b.labels) and torch.equal(a.segment_starts, b.segment_starts)
    o = a.segment_offsets
    assert o.shape == (B * 6 + 1,) and int(o[-1]) == a.segment_starts.numel()
    assert a.segments_of(1, 2) == a.segments[1 * 6 + 2]
    assert repr(a).startswith("TopKResult(batch=2, k=6")
    with pytest.raises(ValueError, match="k must be an int"):
        semi_crf_streaming_topk(*args, k=0)


# ---------------------------------------------------------------------------------- sampling


def _chi2_sf(x: float, df: int) -> float:
    """P(chi2(df) >= x), the regularised upper incomplete gamma function."""
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=F64), torch.tensor(x / 2, dtype=F64)))


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("direct,masked,device", [(False, False, "cpu"), (True, False, "cpu"), (False, True, "cpu"),
                                                  pytest.param(False, False, "cuda", marks=CUDA),
                                                  pytest.param(True, False, "cuda", marks=CUDA)])
def test_samples_follow_the_exact_distribution(direct, masked, device):
    """Chi-square goodness of fit of 20,000 samples per sequence against the enumerated
    probabilities (bins with expected count < 5 merged). Threshold: p > 1e-4, so a correct sampler
    fails with probability 1e-4 per sequence; the seed is fixed, so the outcome is reproducible.
    On CUDA the samples come from the engine (float32 forward, the chunked kernel walk; for a
    (K, C, C) transition, ``direct``, the end-node walk)."""
    kw, _ = _inputs(15, T=5, K=3, C=2, direct=direct, proj=True)
    B, T1, C = kw["cum_scores"].shape
    masks = _masks(16, B, T1 - 1, C, free=0.6) if masked else (None, None)
    n = 20000
    run = kw
    tol = 1e-10
    if device == "cuda":
        run = {k: (v.detach().to("cuda", torch.float32 if v.is_floating_point() else v.dtype)
                   if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        tol = 1e-4
    g = torch.Generator(device=device).manual_seed(17)
    out = semi_crf_streaming_sample(**run, num_samples=n, label_mask=masks[0], boundary_mask=masks[1], generator=g)
    assert out.labels.shape == (n, B, T1 - 1) and out.log_prob.shape == (n, B)
    rows = out.segments
    for b, (segs, scores) in enumerate(_enumerate(kw, *masks)):
        if not segs:
            assert (out.log_prob[:, b] == -math.inf).all()
            continue
        logp = torch.log_softmax(scores.detach(), 0)
        index = {s: i for i, s in enumerate(segs)}
        counts = torch.zeros(len(segs), dtype=F64)
        for s in range(n):
            i = index[tuple(rows[s * B + b])]
            counts[i] += 1
            if s < 50:  # each sample's log-probability is exact
                assert abs(float(out.log_prob[s, b]) - float(logp[i])) < tol
        expected = logp.exp() * n
        big = expected >= 5
        obs = torch.cat([counts[big], counts[~big].sum().reshape(1)])
        exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
        if exp[-1] < 5:  # fold a small remainder into the smallest bin
            obs, exp = obs[:-1], exp[:-1]
            obs[exp.argmin()] += counts[~big].sum()
            exp[exp.argmin()] += expected[~big].sum()
        stat = float(((obs - exp) ** 2 / exp).sum())
        p_value = _chi2_sf(stat, len(exp) - 1)
        assert p_value > 1e-4, f"sequence {b}: chi2 = {stat:.1f} on {len(exp) - 1} dof, p = {p_value:.2e}"


def test_samples_are_reproducible_with_a_seeded_generator():
    kw, _ = _inputs(18, T=7, K=4, C=3)
    a = semi_crf_streaming_sample(**kw, num_samples=8, generator=torch.Generator().manual_seed(3))
    b = semi_crf_streaming_sample(**kw, num_samples=8, generator=torch.Generator().manual_seed(3))
    c = semi_crf_streaming_sample(**kw, num_samples=8, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a.labels, b.labels) and torch.equal(a.log_prob, b.log_prob)
    assert not torch.equal(a.labels, c.labels)
    assert a.segment_offsets.shape == (8 * 3 + 1,)
    lengths = kw["lengths"]
    assert ((a.labels >= 0).sum(-1) == lengths).all()
    with pytest.raises(ValueError, match="num_samples"):
        semi_crf_streaming_sample(**kw, num_samples=0)


# ---------------------------------------------------------------------------------- head


def _head_batch(seed, boundary_scores=True, transition="static"):
    torch.manual_seed(seed)
    head = SemiMarkovCRFHead(num_classes=3, max_duration=3, hidden_dim=4, boundary_scores=boundary_scores,
                             transition=transition, cumsum_dtype=F64)
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.5)
    h = torch.randn(2, 6, 4)
    lengths = torch.tensor([6, 4])
    return head, h, lengths


@pytest.mark.parametrize("transition", ["static", "duration"])
def test_head_partial_label_loss_is_minus_log_probability_of_the_consistent_set(transition):
    head, h, lengths = _head_batch(20, transition=transition)
    B, T, C = 2, 6, 3
    lm, bm = _masks(21, B, T, C)
    loss = head.compute_loss(h, lengths, label_mask=lm, boundary_mask=bm, reduction="none")
    out = head.build(h, lengths)
    kw = dict(cum_scores=out.cum_scores, transition=out.transition, duration_bias=out.duration_bias,
              lengths=out.lengths, K=3, proj_start=out.proj_start, proj_end=out.proj_end)
    full = _enumerate(kw)
    part = _enumerate(kw, lm, bm)
    for b in range(B):
        want = -(float(_lse(part[b][1])) - float(_lse(full[b][1])))
        assert abs(float(loss[b]) - want) < 1e-8
    loss.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in head.parameters() if p.grad is not None)


def test_head_partial_labels_with_full_labels_equal_the_ordinary_loss():
    head, h, lengths = _head_batch(22)
    labels = torch.tensor([[0, 0, 1, 1, 1, 2], [2, 2, 0, 1, -100, -100]])
    starts = torch.tensor([[1, 0, 1, 0, 0, 1], [1, 0, 1, 1, 0, 0]])
    lm = torch.nn.functional.one_hot(labels.clamp(min=0), 3).bool()
    bm = torch.where(starts.bool(), 1, -1)
    partial = head.compute_loss(h, lengths, label_mask=lm, boundary_mask=bm, reduction="none")
    full = head.compute_loss(h, lengths, labels, reduction="none")
    torch.testing.assert_close(partial, full, atol=1e-8, rtol=0)


def test_head_partial_loss_raises_when_the_masks_allow_nothing():
    head, h, lengths = _head_batch(23)
    lm = torch.ones(2, 6, 3, dtype=torch.bool)
    lm[1, 1] = False
    with pytest.raises(ValueError, match="sequence 1 .*allow"):
        head.compute_loss(h, lengths, label_mask=lm)
    loss = head.compute_loss(h, lengths, label_mask=lm, zero_infinity=True, reduction="none")
    assert loss[1] == 0 and torch.isfinite(loss).all()
    with pytest.raises(ValueError, match="labels"):
        head.compute_loss(h, lengths, torch.zeros(2, 6, dtype=torch.long), label_mask=lm)


def test_head_topk_sample_entropy_decode_mirror_the_functions():
    head, h, lengths = _head_batch(24)
    lm, bm = _masks(25, 2, 6, 3, free=0.7)
    out = head.build(h, lengths)
    kw = dict(cum_scores=out.cum_scores, transition=out.transition, duration_bias=out.duration_bias,
              lengths=out.lengths, K=3, proj_start=out.proj_start, proj_end=out.proj_end)
    tk = head.topk(h, lengths, k=4, label_mask=lm, boundary_mask=bm)
    ref = semi_crf_streaming_topk(**kw, k=4, label_mask=lm, boundary_mask=bm)
    assert torch.equal(tk.labels, ref.labels)
    torch.testing.assert_close(tk.scores, ref.scores)
    dec = head.decode(h, lengths, label_mask=lm, boundary_mask=bm)
    assert torch.equal(dec.labels, ref.labels[:, 0])
    H = head.entropy(h, lengths)
    torch.testing.assert_close(H, semi_crf_streaming_entropy(**{k: v.detach() if torch.is_tensor(v) and k != "lengths" else v for k, v in kw.items()}))
    H.sum().backward()
    assert head.transition.grad is not None and torch.isfinite(head.transition.grad).all()
    s = head.sample(h, lengths, num_samples=5, generator=torch.Generator().manual_seed(0), label_mask=lm)
    assert s.labels.shape == (5, 2, 6)
    allowed = lm.expand(5, -1, -1, -1).gather(3, s.labels.clamp(min=0)[..., None]).squeeze(-1) | (s.labels < 0)
    assert allowed.all()
    post = head.marginals(h, lengths, label_mask=lm)
    assert float(post.position[~lm].abs().max()) < 1e-8


@pytest.mark.parametrize("direct", [False, True], ids=["CxC", "KxCxC"])
def test_entropy_does_not_depend_on_the_size_of_the_scores(direct):
    """Adding the same constant to every label's score at a position changes no segmentation's
    probability: the entropy and its gradient stay put. With a constant of 1e4 the scores of a
    prefix reach 3e6, and the expectation recurrences must not let the rounding of their
    normalisers (about 1e-16 of that size) multiply the expected scores at every step."""
    kw, params = _inputs(12, B=2, T=300, K=6, C=3, direct=direct, proj=True)
    H = semi_crf_streaming_entropy(**kw)
    g = torch.autograd.grad(H.sum(), params)
    shift = 1e4 * torch.arange(301, dtype=F64)[None, :, None]
    cum2 = (params[0].detach() + shift).requires_grad_()
    H2 = semi_crf_streaming_entropy(**dict(kw, cum_scores=cum2))
    g2 = torch.autograd.grad(H2.sum(), [cum2] + params[1:])
    torch.testing.assert_close(H2, H, atol=1e-6, rtol=0)
    for a, b in zip(g2, g):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
