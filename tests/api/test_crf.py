"""``SemiMarkovCRF``, the distribution object: every member against brute-force enumeration.

The oracle enumerates every labelled segmentation of each sequence
(:func:`torch_semimarkov.oracle.enumerate_segmentations`, differentiable scores) and computes
log Z, probabilities, marginals, the MAP, the k best, the entropy, the cross-entropy and the KL
divergence by explicit sums, with gradients by autograd through those sums.
"""

from __future__ import annotations

import math

import pytest
import torch

from torch_semimarkov import SemiMarkovCRF
from torch_semimarkov.oracle import brute_force, enumerate_segmentations

F64 = torch.float64
B, T, K, C = 2, 5, 3, 3
LENGTHS = torch.tensor([5, 4])


def make(seed: int, direct: bool = False, proj: bool = False, grad: bool = False):
    """(kwargs of a random distribution, the leaf tensors)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: (torch.randn(*shape, generator=g, dtype=F64) * 0.8).requires_grad_(grad)  # noqa: E731
    kw = dict(cum_scores=None, transition=r(K, C, C) if direct else r(C, C), duration_bias=r(K, C))
    scores = r(B, T, C)
    kw["cum_scores"] = torch.cat([scores.new_zeros(B, 1, C), scores.cumsum(1)], 1)
    if proj:
        kw["proj_start"], kw["proj_end"] = r(B, T, C), r(B, T, C)
    leaves = [scores, kw["transition"], kw["duration_bias"]] + ([kw["proj_start"], kw["proj_end"]] if proj else [])
    return kw, leaves


def masks(seed: int):
    g = torch.Generator().manual_seed(seed)
    lm = torch.rand(B, T, C, generator=g) > 0.25
    lm[:, :, 0] = True  # keep at least one segmentation
    bm = torch.zeros(B, T, dtype=torch.long)
    bm[0, 2] = 1
    bm[1, 1] = -1
    return lm, bm


def enumerate_model(kw, lm=None, bm=None):
    """Per sequence: (segmentations, differentiable scores (N,)) with forbidden ones at -inf."""
    out = []
    for b, (segs, scores) in enumerate(enumerate_segmentations(kw["cum_scores"], kw["transition"],
                                                               kw["duration_bias"], LENGTHS, K,
                                                               kw.get("proj_start"), kw.get("proj_end"))):
        if lm is not None:
            ok = []
            for sg in segs:
                allowed = all(bool(lm[b, t, s.label]) for s in sg for t in range(s.start, s.end))
                starts = {s.start for s in sg}
                allowed &= all((bm[b, t] != -1 or t not in starts) and (bm[b, t] != 1 or t in starts)
                               for t in range(int(LENGTHS[b])))
                ok.append(allowed)
            scores = torch.where(torch.tensor(ok), scores, torch.full_like(scores, -math.inf))
        out.append((segs, scores))
    return out


CASES = {"static": {}, "direct": {"direct": True}, "proj": {"proj": True}, "direct-proj": {"direct": True, "proj": True}}


@pytest.mark.parametrize("masked", [False, True], ids=["free", "masked"])
@pytest.mark.parametrize("case", list(CASES))
def test_partition_log_prob_marginals_argmax_topk_against_enumeration(case, masked):
    kw, _ = make(0, **CASES[case])
    lm, bm = masks(1) if masked else (None, None)
    dist = SemiMarkovCRF(**kw, lengths=LENGTHS, label_mask=lm, boundary_mask=bm)
    ref = enumerate_model(kw, lm, bm)
    log_z = torch.stack([torch.logsumexp(s, 0) for _, s in ref])
    torch.testing.assert_close(dist.log_partition, log_z)
    assert dist.partition is not None and torch.equal(dist.partition, dist.log_partition)
    # log_prob of every segmentation of sequence 0 (as segment lists, beside sequence 1's best)
    segs0, scores0 = ref[0]
    best1 = [tuple(s) for s in ref[1][0][int(torch.argmax(ref[1][1]))]]
    for i in range(0, len(segs0), 37):
        lp = dist.log_prob([[tuple(s) for s in segs0[i]], best1])
        torch.testing.assert_close(lp[0], scores0[i] - log_z[0])
    # the MAP and the k best
    for b in range(B):
        segs, scores = ref[b]
        order = torch.sort(scores, descending=True, stable=True).indices
        torch.testing.assert_close(dist.max[b], scores[order[0]])
        top = dist.topk(4)
        torch.testing.assert_close(top.scores[b], scores[order[:4]])
    # marginals: P(position t has label c)
    post = dist.marginals.position
    for b in range(B):
        segs, scores = ref[b]
        p = torch.exp(scores - log_z[b])
        expected = torch.zeros(T, C, dtype=F64)
        for sg, w in zip(segs, p):
            for s in sg:
                expected[s.start:s.end, s.label] += w
        torch.testing.assert_close(post[b], expected)
    # a batch of values: the k-best list comes back as (k, B) and equals its own scores
    torch.testing.assert_close(dist.log_prob(top), (top.scores - log_z[:, None]).T)


@pytest.mark.parametrize("case", list(CASES))
def test_entropy_cross_entropy_and_kl_against_enumeration_with_gradients(case):
    kw_p, leaves_p = make(2, grad=True, **CASES[case])
    kw_q, leaves_q = make(3, grad=True, **CASES[case])
    p = SemiMarkovCRF(**kw_p, lengths=LENGTHS)
    q = SemiMarkovCRF(**kw_q, lengths=LENGTHS)
    ce = p.cross_entropy(q)
    # the oracle: explicit sums over segmentations, differentiable
    ref_p, ref_q = enumerate_model(kw_p), enumerate_model(kw_q)
    expected = []
    for (_, sp), (_, sq) in zip(ref_p, ref_q):
        lp = sp - torch.logsumexp(sp, 0)
        lq = sq - torch.logsumexp(sq, 0)
        expected.append(-(lp.exp() * lq).sum())
    expected = torch.stack(expected)
    torch.testing.assert_close(ce, expected)
    w = torch.tensor([0.6, -1.4], dtype=F64)
    leaves = leaves_p + leaves_q
    got = torch.autograd.grad((ce * w).sum(), leaves, allow_unused=True)
    want = torch.autograd.grad((expected * w).sum(), leaves, allow_unused=True)
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, msg=lambda m: f"gradient {i}: {m}")
    # identities
    torch.testing.assert_close(p.cross_entropy(p), p.entropy)
    torch.testing.assert_close(p.kl(p), torch.zeros(B, dtype=F64), atol=1e-10, rtol=0)
    assert bool((p.kl(q) >= -1e-12).all()) and bool((q.kl(p) >= -1e-12).all())
    entropy = torch.stack([-(torch.exp(s - torch.logsumexp(s, 0)) * (s - torch.logsumexp(s, 0))).sum()
                           for _, s in ref_p])
    torch.testing.assert_close(p.entropy, entropy)


def test_cross_entropy_with_masks_and_mixed_transition_shapes():
    kw_p, _ = make(4)
    kw_q, _ = make(5, direct=True)
    lm, bm = masks(6)
    p = SemiMarkovCRF(**kw_p, lengths=LENGTHS, label_mask=lm, boundary_mask=bm)
    q = SemiMarkovCRF(**kw_q, lengths=LENGTHS)
    ref_p, ref_q = enumerate_model(kw_p, lm, bm), enumerate_model(kw_q)
    for b, ((_, sp), (_, sq)) in enumerate(zip(ref_p, ref_q)):
        pp = torch.exp(sp - torch.logsumexp(sp, 0))
        lq = sq - torch.logsumexp(sq, 0)
        torch.testing.assert_close(p.cross_entropy(q)[b], -(torch.where(pp > 0, pp * lq, 0)).sum())
    # q restricted by masks that p ignores: p puts mass where q is 0, so the cross-entropy is infinite
    q_masked = SemiMarkovCRF(**kw_q, lengths=LENGTHS, label_mask=lm)
    free = SemiMarkovCRF(**kw_p, lengths=LENGTHS)
    assert bool(torch.isinf(free.cross_entropy(q_masked)).all())
    with pytest.raises(ValueError, match="same lengths"):
        free.kl(SemiMarkovCRF(**kw_q, lengths=torch.tensor([5, 3])))


def test_from_scores_is_the_model_of_the_raw_scores():
    g = torch.Generator().manual_seed(7)
    scores = torch.randn(B, T, C, generator=g, dtype=F64) + torch.tensor([3.0, -2.0, 0.0], dtype=F64)
    tr, db = torch.randn(C, C, generator=g, dtype=F64), torch.randn(K, C, generator=g, dtype=F64)
    dist = SemiMarkovCRF.from_scores(scores, tr, db, LENGTHS)
    raw = torch.cat([scores.new_zeros(B, 1, C), scores.cumsum(1)], 1)
    oracle = brute_force(raw, tr, db, LENGTHS, K)
    torch.testing.assert_close(dist.log_partition, oracle.log_Z)
    torch.testing.assert_close(dist.marginals.position, oracle.position)
    mask = torch.arange(T)[None, :] < LENGTHS[:, None]
    torch.testing.assert_close(SemiMarkovCRF.from_scores(scores, tr, db, mask=mask).log_partition, oracle.log_Z)


def test_samples_log_prob_and_labels_forms_agree():
    kw, _ = make(8)
    dist = SemiMarkovCRF(**kw, lengths=LENGTHS)
    s = dist.sample(6, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(dist.log_prob(s), s.log_prob)
    assert dist.log_prob(s).shape == (6, B)
    # labels (S, B, T) give the same values where no two neighbouring segments share a label
    lp = dist.log_prob(s.labels)
    runs_ok = torch.tensor([[len(s.segments[i * B + b]) == len({(x.start) for x in s.segments[i * B + b]})
                             and all(x.label != y.label for x, y in zip(s.segments[i * B + b], s.segments[i * B + b][1:]))
                             and all(x.end - x.start <= K for x in s.segments[i * B + b])
                             for b in range(B)] for i in range(6)])
    torch.testing.assert_close(lp[runs_ok], s.log_prob[runs_ok])
    assert repr(dist).startswith("SemiMarkovCRF(batch=2, T=5, K=3, C=3")


def test_bad_arguments_name_what_is_wrong():
    kw, _ = make(9)
    with pytest.raises(ValueError, match="backend must be one of"):
        SemiMarkovCRF(**kw, lengths=LENGTHS, backend="gpu")
    dist = SemiMarkovCRF(**kw, lengths=LENGTHS)
    with pytest.raises(ValueError, match="labels must have shape"):
        dist.log_prob(torch.zeros(T, B, dtype=torch.long))
    with pytest.raises(TypeError, match="SemiMarkovCRF"):
        dist.kl(kw["cum_scores"])
    bad = dict(kw, cum_scores=kw["cum_scores"].clone())
    bad["cum_scores"][0, 2, 1] = float("nan")
    with pytest.raises(ValueError, match="cum_scores"):
        SemiMarkovCRF(**bad, lengths=LENGTHS)
