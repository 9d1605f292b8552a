"""Property tests (hypothesis) of the streaming PyTorch engine over B, T, K, C, lengths and options.

Every drawn problem is compared with the naive DP (partition, gradients with a random upstream
gradient, Viterbi, marginals), and the outputs are checked for the invariants every semi-CRF
satisfies (probabilities sum to one, segments tile the sequence, Viterbi <= log Z).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import assert_close, check_best_segments, grads_of, make_inputs, random_upstream, with_grad
from torch_semimarkov.oracle import (
    brute_force,
    naive_marginals,
    naive_semi_crf,
    naive_semi_crf_viterbi,
    segmentation_score,
)
from torch_semimarkov.streaming import (
    semi_crf_streaming_forward,
    semi_crf_streaming_marginals,
    semi_crf_streaming_viterbi,
    segments_to_labels,
)

F64 = torch.float64

PROPERTY_SETTINGS = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@st.composite
def problems(draw, max_T=12, max_K=8, max_C=4):
    B = draw(st.integers(1, 3))
    T = draw(st.integers(1, max_T))
    K = draw(st.integers(1, max_K))
    C = draw(st.integers(1, max_C))
    lengths = draw(st.lists(st.integers(1, T), min_size=B, max_size=B))
    dt = draw(st.booleans())
    proj = draw(st.sampled_from(["none", "start", "end", "both"]))
    seed = draw(st.integers(0, 2**16))
    scale = draw(st.sampled_from([0.1, 1.0, 5.0]))
    interval = draw(st.one_of(st.none(), st.integers(1, 2 * max_T)))
    inp = make_inputs(B, T, K, C, lengths=lengths, duration_transitions=dt, proj=proj, seed=seed, scale=scale)
    return inp, interval


@PROPERTY_SETTINGS
@given(problems())
def test_partition_and_gradients_match_naive(problem):
    inp, interval = problem
    B = inp["cum_scores"].shape[0]
    up = random_upstream(B, seed=B)
    a, b = with_grad(inp), with_grad(inp)
    out = semi_crf_streaming_forward(**a, use_triton=False, checkpoint_interval=interval)
    want = naive_semi_crf(**b)
    assert_close(out, want, atol=1e-8, msg="log Z")
    got_g, want_g = grads_of(out, a, up), grads_of(want, b, up)
    for name in want_g:
        assert_close(got_g[name], want_g[name], atol=1e-8, msg=f"d logZ / d {name}")


@PROPERTY_SETTINGS
@given(problems())
def test_viterbi_is_the_best_segmentation(problem):
    inp, _ = problem
    T = inp["cum_scores"].shape[1] - 1
    res = semi_crf_streaming_viterbi(**inp, use_triton=False)
    want_scores, want_segs = naive_semi_crf_viterbi(**inp)
    assert_close(res.scores, want_scores, atol=1e-8, msg="viterbi score")
    log_z = semi_crf_streaming_forward(**inp, use_triton=False)
    assert bool((res.scores <= log_z + 1e-9).all())
    assert torch.equal(res.labels, segments_to_labels(res.segments, T))
    for b, segs in enumerate(res.segments):
        L = int(inp["lengths"][b])
        assert segs[0].start == 0 and segs[-1].end == L
        assert all(x.end == y.start for x, y in zip(segs, segs[1:]))
        assert all(1 <= s.end - s.start <= inp["K"] for s in segs)
        sc = segmentation_score(
            inp["cum_scores"][b], inp["transition"], inp["duration_bias"], segs,
            None if inp["proj_start"] is None else inp["proj_start"][b],
            None if inp["proj_end"] is None else inp["proj_end"][b],
        )
        assert math.isclose(sc, float(res.scores[b]), rel_tol=1e-9, abs_tol=1e-9)
    check_best_segments(res.segments, want_segs, want_scores, inp)


@PROPERTY_SETTINGS
@given(problems())
def test_marginals_are_consistent_probabilities(problem):
    inp, interval = problem
    m = semi_crf_streaming_marginals(**inp, use_triton=False, checkpoint_interval=interval)
    lz, start, end, position, boundary = naive_marginals(**inp)
    assert_close(m.log_Z, lz, atol=1e-8, msg="log_Z")
    assert_close(m.start, start, atol=1e-8, msg="start")
    assert_close(m.end, end, atol=1e-8, msg="end")
    assert_close(m.position, position, atol=1e-8, msg="position")
    assert_close(m.boundary, boundary, atol=1e-8, msg="boundary")
    for b in range(inp["cum_scores"].shape[0]):
        L = int(inp["lengths"][b])
        one = torch.ones((), dtype=F64)
        assert_close(m.boundary[b, 0], one, atol=1e-9, msg="a segment starts at 0")
        assert_close(m.start[b, 0].sum(), one, atol=1e-9, msg="start at 0 sums to 1")
        assert_close(m.end[b, L - 1].sum(), one, atol=1e-9, msg="a segment ends at L-1")
        assert_close(m.position[b, :L].sum(-1), torch.ones(L, dtype=F64), atol=1e-9, msg="position sums to 1")
        assert_close(m.boundary[b], m.start[b].sum(-1), atol=1e-9, msg="boundary = sum_c start")
        # every segment starts once and ends once
        assert_close(m.start[b].sum(), m.end[b].sum(), atol=1e-9, msg="starts = ends")
        for name in ("start", "end", "position", "boundary"):
            t = getattr(m, name)[b]
            assert bool((t >= -1e-12).all() and (t <= 1 + 1e-9).all()), name


@settings(max_examples=15, deadline=None, derandomize=True)
@given(problems(max_T=5, max_K=6, max_C=3))
def test_small_problems_match_brute_force(problem):
    inp, interval = problem
    bf = brute_force(**inp)
    assert_close(semi_crf_streaming_forward(**inp, use_triton=False, checkpoint_interval=interval), bf.log_Z,
                 atol=1e-8, msg="log Z")
    res = semi_crf_streaming_viterbi(**inp, use_triton=False)
    assert_close(res.scores, bf.max_score, atol=1e-8, msg="viterbi score")
    check_best_segments(res.segments, bf.argmax, bf.max_score, inp, bf.argmax_unique)
    m = semi_crf_streaming_marginals(**inp, use_triton=False, checkpoint_interval=interval)
    for name in ("start", "end", "position", "boundary"):
        assert_close(getattr(m, name), getattr(bf, name), atol=1e-8, msg=name)


@settings(max_examples=10, deadline=None, derandomize=True)
@given(problems(max_T=10, max_K=5, max_C=3))
def test_float32_close_to_float64(problem):
    inp, interval = problem
    f32 = {k: (v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in inp.items()}
    out32 = semi_crf_streaming_forward(**f32, use_triton=False, checkpoint_interval=interval)
    out64 = semi_crf_streaming_forward(**inp, use_triton=False, checkpoint_interval=interval)
    assert out32.dtype == torch.float32
    assert_close(out32, out64, dtype=torch.float32, msg="log Z float32")
    m32 = semi_crf_streaming_marginals(**f32, use_triton=False)
    m64 = semi_crf_streaming_marginals(**inp, use_triton=False)
    for name in ("start", "end", "position"):
        assert_close(getattr(m32, name), getattr(m64, name), dtype=torch.float32, msg=name)


@pytest.mark.parametrize("K", [1, 2, 5])
def test_shifting_cum_scores_by_a_constant_per_label_changes_nothing(K):
    # S[t, c] + a_c: every segment score uses a difference S[e, c] - S[s, c], so log Z is unchanged
    inp = make_inputs(2, 15, K, 3, lengths=[15, 6], proj="both", seed=7)
    shifted = dict(inp, cum_scores=inp["cum_scores"] + torch.tensor([3.0, -7.0, 0.5], dtype=F64))
    assert_close(semi_crf_streaming_forward(**shifted, use_triton=False),
                 semi_crf_streaming_forward(**inp, use_triton=False), atol=1e-9)
