"""The oracles against each other, against hand-computed values and against pytorch-struct.

The streaming engine is judged by these oracles, so they are checked first: brute-force
enumeration, the naive edge-block DP and pytorch-struct must agree on partition, best score,
best segmentation, marginals and gradients.
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import (
    DIFFERENTIABLE,
    assert_close,
    case_id,
    check_best_segments,
    grads_of,
    make_inputs,
    random_upstream,
    ts_distribution,
    ts_edges,
    ts_segments,
    with_grad,
)
from torch_semimarkov.oracle import (
    brute_force,
    naive_marginals,
    naive_semi_crf,
    naive_semi_crf_viterbi,
    segmentation_score,
)

BRUTE_CASES = [
    # (B, T, K, C, lengths, duration_transitions, proj)
    (3, 6, 3, 3, [6, 4, 1], False, "both"),
    (2, 5, 6, 2, [5, 2], True, "none"),
    (1, 1, 1, 3, [1], False, "start"),
    (2, 6, 1, 3, [6, 5], True, "end"),
    (2, 4, 2, 4, [4, 3], True, "both"),
]


def _brute_id(case):
    B, T, K, C, _, dt, proj = case
    return case_id(B, T, K, C, "KCC" if dt else "CC", proj)


@pytest.mark.parametrize("case", BRUTE_CASES, ids=_brute_id)
def test_brute_force_agrees_with_naive_dp(case):
    B, T, K, C, lengths, dt, proj = case
    inp = make_inputs(B, T, K, C, lengths=lengths, duration_transitions=dt, proj=proj, seed=3)
    bf = brute_force(**inp)
    assert_close(naive_semi_crf(**inp), bf.log_Z, msg="log Z")
    assert_close(naive_semi_crf(**inp, semiring="max"), bf.max_score, msg="max score")
    scores, segs = naive_semi_crf_viterbi(**inp)
    assert_close(scores, bf.max_score, msg="viterbi score")
    check_best_segments(segs, bf.argmax, bf.max_score, inp, bf.argmax_unique)
    lz, start, end, position, boundary = naive_marginals(**inp)
    assert_close(lz, bf.log_Z, msg="marginals log Z")
    assert_close(start, bf.start, msg="start")
    assert_close(end, bf.end, msg="end")
    assert_close(position, bf.position, msg="position")
    assert_close(boundary, bf.boundary, msg="boundary")


@pytest.mark.parametrize("case", BRUTE_CASES, ids=_brute_id)
def test_brute_force_gradients_agree_with_naive_dp(case):
    B, T, K, C, lengths, dt, proj = case
    inp = make_inputs(B, T, K, C, lengths=lengths, duration_transitions=dt, proj=proj, seed=4)
    up = random_upstream(B)
    a = with_grad(inp)
    b = with_grad(inp)
    ga = grads_of(brute_force(**a).log_Z, a, up)
    gb = grads_of(naive_semi_crf(**b), b, up)
    assert set(ga) == set(gb)
    for name in ga:
        assert_close(ga[name], gb[name], msg=name)


@pytest.mark.parametrize("case", BRUTE_CASES, ids=_brute_id)
def test_brute_force_marginals_are_probabilities(case):
    B, T, K, C, lengths, dt, proj = case
    inp = make_inputs(B, T, K, C, lengths=lengths, duration_transitions=dt, proj=proj, seed=5)
    bf = brute_force(**inp)
    for b, L in enumerate(lengths):
        assert_close(bf.boundary[b, 0], torch.tensor(1.0, dtype=torch.float64), msg="a segment starts at 0")
        assert_close(bf.end[b, L - 1].sum(), torch.tensor(1.0, dtype=torch.float64), msg="one ends at L-1")
        assert_close(bf.position[b, :L].sum(-1), torch.ones(L, dtype=torch.float64), msg="position sums")
        assert float(bf.position[b, L:].abs().sum()) == 0.0
        # number of segments = sum of boundary probabilities = sum of end probabilities
        assert_close(bf.end[b].sum(), bf.boundary[b].sum(), msg="starts = ends")
    # the best segmentation's score is its max-semiring score, and is the max
    for b in range(B):
        sc = segmentation_score(inp["cum_scores"][b], inp["transition"], inp["duration_bias"], bf.argmax[b],
                                None if inp["proj_start"] is None else inp["proj_start"][b],
                                None if inp["proj_end"] is None else inp["proj_end"][b])
        assert math.isclose(sc, float(bf.max_score[b]), rel_tol=1e-12, abs_tol=1e-12)
    assert bool((bf.max_score <= bf.log_Z).all())


def test_brute_force_flags_tied_best_segmentations():
    # C = 1, no projections, (C, C) transition: durations (1, 2) and (2, 1) score the same
    inp = make_inputs(1, 3, 2, 1, seed=2)
    inp["duration_bias"] = torch.tensor([[0.0], [0.4]], dtype=torch.float64)
    bf = brute_force(**inp)
    assert bf.argmax_unique == [False]
    inp = make_inputs(1, 3, 2, 1, seed=2, proj="end")
    assert brute_force(**inp).argmax_unique == [True]


def test_brute_force_counts_segmentations():
    # compositions of L into parts <= K, each part labelled with one of C labels
    inp = make_inputs(1, 6, 6, 3)
    assert brute_force(**inp).num_segmentations == [3 * 4 ** 5]
    inp = make_inputs(1, 5, 2, 2)
    # compositions of 5 into 1s and 2s: 8 (1 with 5 parts, 4 with 4, 3 with 3): 32 + 4*16 + 3*8
    assert brute_force(**inp).num_segmentations == [32 + 64 + 24]


def test_hand_computed_single_label_two_positions():
    # C = 1, T = 2, K = 2: segmentations {[0,2)} and {[0,1),[1,2)}
    S = torch.tensor([[[0.0], [0.7], [1.1]]], dtype=torch.float64)
    Tr = torch.tensor([[0.3]], dtype=torch.float64)
    D = torch.tensor([[0.2], [-0.5]], dtype=torch.float64)
    ps = torch.tensor([[[0.05], [0.11]]], dtype=torch.float64)
    pe = torch.tensor([[[-0.2], [0.4]]], dtype=torch.float64)
    one = 1.1 - 0.5 + 0.05 + 0.4 + 0.3
    two = (0.7 + 0.2 + 0.05 - 0.2 + 0.3) + (0.4 + 0.2 + 0.11 + 0.4 + 0.3)
    expected = math.log(math.exp(one) + math.exp(two))
    bf = brute_force(S, Tr, D, [2], 2, ps, pe)
    assert math.isclose(float(bf.log_Z), expected, rel_tol=1e-14)
    assert math.isclose(float(naive_semi_crf(S, Tr, D, [2], 2, "log", ps, pe)), expected, rel_tol=1e-14)
    assert math.isclose(float(bf.max_score), max(one, two), rel_tol=1e-14)
    p_two = math.exp(two - expected)
    assert math.isclose(float(bf.boundary[0, 1]), p_two, rel_tol=1e-12)


def test_hand_computed_phantom_predecessor():
    # T = 1: log Z = logsumexp_c (S[1,c] + D[0,c] + logsumexp_c' Tr[c', c])
    S = torch.tensor([[[0.0, 0.0], [0.5, -0.3]]], dtype=torch.float64)
    Tr = torch.tensor([[0.1, -0.4], [0.9, 0.2]], dtype=torch.float64)
    D = torch.tensor([[0.3, 0.6]], dtype=torch.float64)
    per_label = [0.5 + 0.3 + math.log(math.exp(0.1) + math.exp(0.9)),
                 -0.3 + 0.6 + math.log(math.exp(-0.4) + math.exp(0.2))]
    expected = math.log(sum(math.exp(x) for x in per_label))
    assert math.isclose(float(brute_force(S, Tr, D, [1], 1).log_Z), expected, rel_tol=1e-14)
    assert math.isclose(float(naive_semi_crf(S, Tr, D, [1], 1)), expected, rel_tol=1e-14)
    # the max semiring keeps the marginalised phantom: the best segmentation is the most probable
    best = max(per_label)
    assert math.isclose(float(naive_semi_crf(S, Tr, D, [1], 1, "max")), best, rel_tol=1e-14)
    assert math.isclose(float(brute_force(S, Tr, D, [1], 1).max_score), best, rel_tol=1e-14)


@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
def test_neg_inf_transition_in_oracles(dt):
    inp = make_inputs(2, 5, 3, 3, lengths=[5, 3], duration_transitions=dt, proj="both", seed=8)
    tr = inp["transition"].clone()
    tr[..., 0, 1] = -math.inf
    tr[..., 2, 2] = -math.inf
    inp["transition"] = tr
    bf = brute_force(**inp)
    assert_close(naive_semi_crf(**inp), bf.log_Z)
    assert bool(torch.isfinite(bf.log_Z).all())
    for segs in bf.argmax:
        for a, b in zip(segs, segs[1:]):
            assert (a.label, b.label) not in ((0, 1), (2, 2))
    a = with_grad(inp)
    g = grads_of(naive_semi_crf(**a), a, random_upstream(2))
    for name, grad in g.items():
        assert bool(torch.isfinite(grad).all()), name


TS_CASES = [(12, 4, 3, False), (9, 9, 2, True), (15, 3, 4, True), (1, 2, 3, False)]


@pytest.mark.parametrize("case", TS_CASES, ids=lambda c: case_id(1, c[0], c[1], c[2], "KCC" if c[3] else "CC"))
def test_torch_struct_agrees_with_naive_dp(case):
    pytest.importorskip("torch_struct")
    T, K, C, dt = case
    inp = make_inputs(1, T, K, C, duration_transitions=dt, proj="both", seed=11)
    a = with_grad(inp)
    edges = ts_edges(a["cum_scores"][0], a["transition"], a["duration_bias"], K, a["proj_start"][0], a["proj_end"][0])
    dist = ts_distribution(edges)
    up = random_upstream(1)
    ga = grads_of(dist.partition, a, up)
    b = with_grad(inp)
    gb = grads_of(naive_semi_crf(**b), b, up)
    assert_close(dist.partition.detach(), naive_semi_crf(**inp), msg="partition")
    for name in gb:
        assert_close(ga[name], gb[name], msg=name)
    assert_close(dist.max.detach(), naive_semi_crf(**inp, semiring="max"), msg="max")
    assert ts_segments(dist.argmax) == naive_semi_crf_viterbi(**inp)[1][0]


def test_torch_struct_first_segment_convention_matches_brute_force():
    pytest.importorskip("torch_struct")
    inp = make_inputs(1, 4, 3, 3, duration_transitions=True, proj="both", seed=12)
    edges = ts_edges(inp["cum_scores"][0], inp["transition"], inp["duration_bias"], 3,
                     inp["proj_start"][0], inp["proj_end"][0])
    dist = ts_distribution(edges)
    bf = brute_force(**inp)
    assert_close(dist.partition.detach(), bf.log_Z)
    assert_close(dist.max.detach(), bf.max_score)
    assert ts_segments(dist.argmax) == bf.argmax[0]
    # its edge marginals (N-1, K+1, c_to, c_from) summed over k and c_from are P_start(n, c_to)
    marg = dist.marginals[0]
    assert_close(marg.sum((1, 3)), bf.start[0], msg="start marginals")


def test_naive_dp_float32_inputs_are_computed_in_float64():
    inp = make_inputs(2, 7, 3, 3, dtype=torch.float32, lengths=[7, 4])
    assert naive_semi_crf(**inp).dtype == torch.float64
    inp64 = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in inp.items()}
    assert_close(naive_semi_crf(**inp), naive_semi_crf(**inp64))
    assert set(DIFFERENTIABLE) <= set(inp)


def test_oracle_docstring_examples_run():
    import doctest

    import torch_semimarkov.oracle as oracle

    result = doctest.testmod(oracle, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
