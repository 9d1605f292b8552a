"""The compiled CPU engine (numba) against the oracles and the PyTorch path.

Engine-level functions (``semi_crf_streaming_*_numba``) against brute-force enumeration (T <= 6),
the naive edge-block DP and the streaming PyTorch path in float64 to 1e-12; float32 inputs to
float32 rounding; every checkpoint interval; K = 1, K >= T, length 1, ragged batches; forbidden
transitions and durations, infeasible prefixes and sequences with no allowed segmentation;
bitwise-reproducible gradients for any thread count. Viterbi is checked against the model's own
maximum a posteriori segmentation: the first segment's phantom predecessor is marginalised
(``lse_{c'} Tr[c', c]``), as in log Z.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from conftest import assert_close, brute_case_id, brute_case_inputs, case_id, make_inputs
from torch_semimarkov.oracle import (
    brute_force,
    naive_marginals,
    naive_semi_crf,
    naive_semi_crf_viterbi,
    segmentation_score,
)
from torch_semimarkov.engines.torch.reference import (
    semi_crf_streaming_backward_pytorch,
    semi_crf_streaming_forward_pytorch,
    semi_crf_streaming_viterbi_pytorch,
)
from torch_semimarkov.core.segments import Segment

numba = pytest.importorskip("numba")
from torch_semimarkov.engines.numba.engine import (  # noqa: E402
    semi_crf_streaming_backward_numba,
    semi_crf_streaming_forward_numba,
    semi_crf_streaming_viterbi_numba,
)

F64, F32 = torch.float64, torch.float32
#: Two exact float64 algorithms agree to about the rounding of |log Z| (~1e-14 relative).
EXACT = dict(atol=1e-12, rtol=1e-12)


def positional(inp):
    return (inp["cum_scores"], inp["transition"], inp["duration_bias"], inp["lengths"], inp["K"])


def proj(inp):
    return dict(proj_start=inp["proj_start"], proj_end=inp["proj_end"])


def run_numba(inp, interval=None, grads=True):
    """(log Z, p_start, p_end, g_tr, g_db) of the engine."""
    fwd = semi_crf_streaming_forward_numba(*positional(inp), **proj(inp), checkpoint_interval=interval)
    bwd = semi_crf_streaming_backward_numba(*positional(inp), *fwd, **proj(inp), need_parameter_grads=grads)
    return (fwd[0],) + tuple(bwd)


def run_pytorch(inp, interval=None):
    fwd = semi_crf_streaming_forward_pytorch(*positional(inp), **proj(inp), checkpoint_interval=interval)
    bwd = semi_crf_streaming_backward_pytorch(*positional(inp), *fwd, **proj(inp))
    return (fwd[0],) + tuple(bwd)


NAMES = ("log_Z", "p_start", "p_end", "grad_transition", "grad_duration_bias")


def per_sequence_parameter_grads(inp):
    """(B, ...) gradients of each log Z[b] of the brute-force oracle with respect to Tr and D."""
    B = inp["cum_scores"].shape[0]
    g_tr, g_db = [], []
    for b in range(B):
        tr = inp["transition"].clone().requires_grad_(True)
        db = inp["duration_bias"].clone().requires_grad_(True)
        lz = brute_force(inp["cum_scores"], tr, db, inp["lengths"], inp["K"], **proj(inp)).log_Z[b]
        gt, gd = torch.autograd.grad(lz, (tr, db), allow_unused=True)
        g_tr.append(torch.zeros_like(tr) if gt is None else gt)
        g_db.append(torch.zeros_like(db) if gd is None else gd)
    return torch.stack(g_tr), torch.stack(g_db)


def _compositions(L, K):
    if L == 0:
        yield ()
        return
    for k in range(1, min(K, L) + 1):
        for rest in _compositions(L - k, K):
            yield (k,) + rest


def map_oracle(inp, b):
    """Best score and every best segmentation of sequence b, by enumeration of the model's scores
    (first segment: lse_{c'} Tr[c', c]); -inf and [] when no segmentation is allowed."""
    L, K = int(inp["lengths"][b]), inp["K"]
    C = inp["cum_scores"].shape[2]
    ps = None if inp["proj_start"] is None else inp["proj_start"][b]
    pe = None if inp["proj_end"] is None else inp["proj_end"][b]
    scored = []
    for durations in _compositions(L, K):
        for labels in itertools.product(range(C), repeat=len(durations)):
            segs, s = [], 0
            for k, c in zip(durations, labels):
                segs.append(Segment(s, s + k, c))
                s += k
            sc = segmentation_score(inp["cum_scores"][b], inp["transition"], inp["duration_bias"], segs, ps, pe)
            scored.append((sc, segs))
    best = max(sc for sc, _ in scored)
    if best == -math.inf:  # every segmentation uses a forbidden entry
        return -math.inf, []
    return best, [segs for sc, segs in scored if sc >= best - 1e-9]


def segments_of(labels, starts, L):
    segs, s = [], None
    for t in range(L):
        if starts[t]:
            if s is not None:
                segs.append(Segment(s, t, int(labels[s])))
            s = t
    if s is not None:
        segs.append(Segment(s, L, int(labels[s])))
    return segs


# ---------------------------------------------------------------------------------------------
# Brute-force enumeration
# ---------------------------------------------------------------------------------------------

BRUTE_CASES = [
    # (B, T, K, C, lengths, duration_transitions, proj)
    (3, 6, 3, 3, [6, 4, 1], False, "both"),
    (3, 6, 3, 3, [6, 5, 2], True, "both"),
    (2, 5, 6, 2, [5, 2], True, "none"),
    (2, 5, 7, 3, [5, 4], False, "start"),
    (2, 6, 1, 3, [6, 5], True, "end"),
    (2, 6, 1, 2, [3, 6], False, "both"),
    (2, 4, 2, 4, [4, 3], True, "start"),
    (4, 3, 2, 1, [3, 1, 2, 3], False, "both"),
]


@pytest.fixture(scope="module", params=BRUTE_CASES, ids=brute_case_id)
def brute_case(request):
    return brute_case_inputs(request.param, seed_offset=1)


def test_partition_marginals_and_gradients_match_brute_force(brute_case):
    inp, bf = brute_case
    got = run_numba(inp)
    want_tr, want_db = per_sequence_parameter_grads(inp)
    for name, g, w in zip(NAMES, got, (bf.log_Z, bf.start, bf.end, want_tr, want_db)):
        assert g.dtype == F64, name
        assert_close(g, w, **EXACT, msg=name)


def test_float32_inputs_match_brute_force(brute_case):
    inp, bf = brute_case
    inp32 = {k: (v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in inp.items()}
    logz, p_start, p_end, g_tr, g_db = run_numba(inp32)
    assert logz.dtype == F64 and p_start.dtype == F32 and g_tr.dtype == F32
    assert_close(logz, bf.log_Z, dtype=F32, msg="log Z")
    assert_close(p_start, bf.start, dtype=F32, msg="p_start")
    assert_close(p_end, bf.end, dtype=F32, msg="p_end")


def test_viterbi_is_the_map_segmentation(brute_case):
    inp, _ = brute_case
    scores, labels, starts = semi_crf_streaming_viterbi_numba(*positional(inp), **proj(inp))
    B, T = labels.shape
    assert labels.dtype == torch.long and starts.dtype == torch.bool and scores.dtype == F64
    for b in range(B):
        L = int(inp["lengths"][b])
        best, argmaxes = map_oracle(inp, b)
        assert_close(scores[b], torch.tensor(best, dtype=F64), **EXACT, msg=f"score of sequence {b}")
        segs = segments_of(labels[b], starts[b], L)
        assert segs in argmaxes, f"sequence {b}: {segs} is not a best segmentation {argmaxes}"
        assert bool((labels[b, L:] == -1).all()) and not bool(starts[b, L:].any())
        max_score = semi_crf_streaming_forward_numba(*positional(inp), semiring="max", **proj(inp))[0]
        assert_close(max_score, scores, **EXACT, msg="max-semiring forward")


# ---------------------------------------------------------------------------------------------
# Against the streaming PyTorch path (float64, larger sizes)
# ---------------------------------------------------------------------------------------------

PATH_CASES = [
    # (B, T, K, C, lengths)
    (2, 63, 5, 7, "ragged"),
    (3, 40, 8, 3, [40, 17, 1]),
    (1, 30, 30, 4, None),
    (2, 17, 20, 3, [17, 9]),
    (4, 25, 1, 5, "ragged"),
    (2, 50, 3, 1, [50, 23]),
    (2, 40, 4, 3, [9, 15]),
    (2, 120, 16, 24, [120, 77]),
]


def _path_id(case):
    return case_id(*case[:4], "ragged" if case[4] == "ragged" else "")


@pytest.mark.parametrize("pr", ["none", "both"])
@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
@pytest.mark.parametrize("case", PATH_CASES, ids=_path_id)
def test_matches_pytorch_path_float64(case, dt, pr):
    B, T, K, C, lengths = case
    inp = make_inputs(B, T, K, C, lengths=lengths, duration_transitions=dt, proj=pr, seed=T + K + C, scale=1.5)
    got, want = run_numba(inp), run_pytorch(inp)
    for name, g, w in zip(NAMES, got, want):
        assert g.shape == w.shape, name
        assert_close(g, w, **EXACT, msg=name)


@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
@pytest.mark.parametrize("case", PATH_CASES, ids=_path_id)
def test_viterbi_matches_pytorch_path(case, dt):
    B, T, K, C, lengths = case
    inp = make_inputs(B, T, K, C, lengths=lengths, duration_transitions=dt, proj="both", seed=2 * T + K)
    got = semi_crf_streaming_viterbi_numba(*positional(inp), **proj(inp))
    want = semi_crf_streaming_viterbi_pytorch(*positional(inp), **proj(inp))
    assert_close(got[0], want[0], **EXACT, msg="score")
    assert torch.equal(got[1], want[1]), "labels"
    assert torch.equal(got[2], want[2] & (want[1] >= 0)), "segment starts"


@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
def test_float32_inputs_match_pytorch_path(dt):
    inp = make_inputs(3, 70, 9, 5, lengths="ragged", duration_transitions=dt, proj="both", seed=3, dtype=F32)
    got, want = run_numba(inp), run_pytorch(inp)
    for name, g, w in zip(NAMES, got, want):
        assert g.dtype == w.dtype, name
        # both compute in float64 from the same float32 inputs: they differ by float32 output rounding
        assert_close(g, w, dtype=F32, atol=1e-6, rtol=1e-6, msg=name)


@pytest.mark.parametrize("interval", [1, 2, 3, 7, 16, 1000])
@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
def test_every_checkpoint_interval_gives_the_same_results(interval, dt):
    inp = make_inputs(3, 45, 6, 3, lengths=[45, 20, 7], duration_transitions=dt, proj="both", seed=21)
    ref = run_pytorch(inp)
    for name, g, w in zip(NAMES, run_numba(inp, interval=interval), ref):
        assert_close(g, w, **EXACT, msg=f"{name} (interval {interval})")


def test_marginals_only_skip_the_parameter_gradients():
    inp = make_inputs(2, 30, 4, 3, lengths=[30, 11], proj="both", seed=22)
    full = run_numba(inp)
    light = run_numba(inp, grads=False)
    assert torch.equal(full[1], light[1]) and torch.equal(full[2], light[2])
    assert float(light[3].abs().sum()) == 0.0 and light[3].shape == full[3].shape
    lz, start, end, position, boundary = naive_marginals(**inp)
    assert_close(light[1], start, **EXACT, msg="start")
    assert_close(light[2], end, **EXACT, msg="end")


@pytest.mark.parametrize("T,K", [(1, 1), (1, 5), (7, 7), (7, 8), (7, 50), (12, 100), (37, 1)])
@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
def test_k_one_k_at_least_t_and_length_one(T, K, dt):
    inp = make_inputs(3, T, K, 3, lengths=[T, max(1, T // 2), 1], duration_transitions=dt, proj="both", seed=T + K)
    got = run_numba(inp)
    for name, g, w in zip(NAMES, got, run_pytorch(inp)):
        assert_close(g, w, **EXACT, msg=name)
    assert_close(got[0], naive_semi_crf(**inp), **EXACT, msg="log Z vs naive DP")
    # durations beyond T are never used
    assert float(got[4][:, T:].abs().sum()) == 0.0


@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
def test_ragged_batch_equals_sequences_alone_and_ignores_padding(dt):
    B, T, K, C = 4, 30, 6, 3
    inp = make_inputs(B, T, K, C, lengths=[30, 1, 13, 29], duration_transitions=dt, proj="both", seed=71)
    for b in range(B):
        L = int(inp["lengths"][b])
        inp["cum_scores"][b, L + 1 :] = 1e3 * torch.rand(T - L, C, dtype=F64)
        inp["proj_start"][b, L:] = 50.0
        inp["proj_end"][b, L:] = -50.0
    got = run_numba(inp)
    vit = semi_crf_streaming_viterbi_numba(*positional(inp), **proj(inp))
    for b in range(B):
        L = int(inp["lengths"][b])
        one = dict(inp, cum_scores=inp["cum_scores"][b : b + 1, : L + 1], lengths=torch.tensor([L]),
                   proj_start=inp["proj_start"][b : b + 1, :L], proj_end=inp["proj_end"][b : b + 1, :L])
        alone = run_numba(one)
        assert_close(got[0][b], alone[0][0], **EXACT, msg=f"log Z of {b}")
        for i in (1, 2):
            assert_close(got[i][b, :L], alone[i][0], **EXACT, msg=f"{NAMES[i]} of {b}")
            assert float(got[i][b, L:].abs().sum()) == 0.0
        for i in (3, 4):
            assert_close(got[i][b], alone[i][0], **EXACT, msg=f"{NAMES[i]} of {b}")
        v1 = semi_crf_streaming_viterbi_numba(*positional(one), **proj(one))
        assert torch.equal(vit[1][b, :L], v1[1][0]) and torch.equal(vit[2][b, :L], v1[2][0])
        assert_close(vit[0][b], v1[0][0], **EXACT)


# ---------------------------------------------------------------------------------------------
# Viterbi at larger sizes: the naive edge-block DP
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
@pytest.mark.parametrize("case", PATH_CASES[:5], ids=_path_id)
def test_viterbi_matches_naive_dp(case, dt):
    B, T, K, C, lengths = case
    inp = make_inputs(B, T, K, C, lengths=lengths, duration_transitions=dt, proj="both", seed=T * K)
    want_scores, want_segs = naive_semi_crf_viterbi(**inp)
    scores, labels, starts = semi_crf_streaming_viterbi_numba(*positional(inp), **proj(inp))
    assert_close(scores, want_scores, **EXACT, msg="score")
    for b in range(B):
        assert segments_of(labels[b], starts[b], int(inp["lengths"][b])) == want_segs[b], f"sequence {b}"


@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
def test_viterbi_ties_break_toward_the_smallest_index(dt):
    inp = make_inputs(2, 9, 4, 3, lengths=[9, 4], duration_transitions=dt, seed=1)
    inp = {k: (torch.zeros_like(v) if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
           for k, v in inp.items()}
    scores, labels, starts = semi_crf_streaming_viterbi_numba(*positional(inp), **proj(inp))
    for b, L in enumerate((9, 4)):
        assert segments_of(labels[b], starts[b], L) == [(i, i + 1, 0) for i in range(L)]
    # every segmentation scores log C for its first segment (the marginalised phantom)
    assert_close(scores, torch.full((2,), math.log(3), dtype=F64), **EXACT)


# ---------------------------------------------------------------------------------------------
# Forbidden entries, infeasible prefixes, impossible sequences
# ---------------------------------------------------------------------------------------------

def _forbid_inputs(dt, neg):
    inp = make_inputs(4, 6, 3, 3, lengths=[6, 4, 5, 3], duration_transitions=dt, proj="both", seed=105)
    tr = inp["transition"].clone()
    db = inp["duration_bias"].clone()
    # labels 0 and 1 only take duration 3; nothing may enter label 2, not even the phantom
    # predecessor (its log-sum-exp over forbidden entries is -inf). So lengths 6 and 3 have
    # segmentations, lengths 4 and 5 have none.
    db[:2, :2] = neg
    if dt:
        tr[:, :, 2] = neg
    else:
        tr[:, 2] = neg
    return dict(inp, transition=tr, duration_bias=db)


@pytest.mark.parametrize("neg", [-math.inf, -1e9, -1e12], ids=["-inf", "NEG_INF", "below"])
@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
def test_forbidden_entries_and_impossible_sequences(dt, neg):
    inp = _forbid_inputs(dt, neg)
    bf = brute_force(**inp)
    logz, p_start, p_end, g_tr, g_db = run_numba(inp)
    possible = torch.tensor([True, False, False, True])
    assert bool(torch.isinf(logz[~possible]).all()) and bool((logz[~possible] < 0).all())
    assert_close(logz[possible], bf.log_Z[possible], **EXACT, msg="log Z")
    want_tr, want_db = per_sequence_parameter_grads(inp)
    for name, g, w in ((("p_start", p_start, bf.start), ("p_end", p_end, bf.end),
                        ("grad_transition", g_tr, want_tr), ("grad_duration_bias", g_db, want_db))):
        assert bool(torch.isfinite(g).all()), name
        assert float(g[~possible].abs().sum()) == 0.0, name
        assert_close(g[possible], w[possible], **EXACT, msg=name)
    scores, labels, starts = semi_crf_streaming_viterbi_numba(*positional(inp), **proj(inp))
    assert bool(torch.isinf(scores[~possible]).all())
    assert bool((labels[~possible] == -1).all()) and not bool(starts[~possible].any())
    for b in (0, 3):
        best, argmaxes = map_oracle(inp, b)
        assert_close(scores[b], torch.tensor(best, dtype=F64), **EXACT)
        assert segments_of(labels[b], starts[b], int(inp["lengths"][b])) in argmaxes
    max_score = semi_crf_streaming_forward_numba(*positional(inp), semiring="max", **proj(inp))[0]
    assert torch.equal(torch.isinf(max_score), ~possible)


@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
def test_reading_frame_grammar_keeps_full_precision(dt):
    # only durations divisible by 3: two of every three positions are impossible prefixes
    T, K, C = 300, 12, 4
    inp = make_inputs(3, T, K, C, lengths=[300, 299, 150], duration_transitions=dt, proj="both", seed=7, scale=2.0)
    db = inp["duration_bias"].clone()
    for k in range(1, K + 1):
        if k % 3:
            db[k - 1] = -math.inf
    inp = dict(inp, duration_bias=db)
    logz, p_start, p_end, g_tr, g_db = run_numba(inp)
    assert math.isinf(float(logz[1])) and float(p_start[1].abs().sum()) == 0.0
    want = naive_semi_crf(**inp)
    assert_close(logz[[0, 2]], want[[0, 2]], **EXACT, msg="log Z")
    lz, start, end, position, boundary = naive_marginals(**dict(inp, lengths=torch.tensor([300, 3, 150])))
    assert_close(p_start[[0, 2]], start[[0, 2]], **EXACT, msg="p_start")
    assert_close(p_end[[0, 2]], end[[0, 2]], **EXACT, msg="p_end")
    # a segment may only start at multiples of 3
    starts_at = p_start[0].sum(-1)
    assert float(starts_at[torch.arange(T) % 3 != 0].abs().max()) == 0.0


def test_extreme_scores_use_the_exact_fallback():
    # huge, sparse scores push the linear-domain sums far below TINY: the log-domain fallback must
    # give exactly the oracle's answer
    inp = make_inputs(2, 40, 6, 4, lengths=[40, 33], proj="both", seed=9, scale=300.0)
    tr = inp["transition"] * 400
    tr[0, 1] = -math.inf
    inp = dict(inp, transition=tr, duration_bias=inp["duration_bias"] * 500)
    got = run_numba(inp)
    want = run_pytorch(dict(inp, transition=tr.clamp(min=-1e9)))
    assert_close(got[0], naive_semi_crf(**inp), **EXACT, msg="log Z")
    for name, g, w in zip(NAMES[1:], got[1:], want[1:]):
        assert_close(g, w, atol=1e-10, rtol=1e-10, msg=name)


# ---------------------------------------------------------------------------------------------
# Determinism
# ---------------------------------------------------------------------------------------------

def test_the_engine_leaves_torch_threads_alone():
    # starting numba's threading layer would set OpenMP's thread count, which torch shares
    torch_threads = torch.get_num_threads()
    inp = make_inputs(2, 30, 4, 3, seed=12)
    run_numba(inp)
    assert torch.get_num_threads() == torch_threads


@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
def test_results_are_bitwise_identical_for_any_thread_count(dt, monkeypatch):
    import torch_semimarkov.engines.numba.engine as engine

    # run even this small batch on several threads
    monkeypatch.setattr(engine, "_PARALLEL_MIN_WORK", 0)
    inp = make_inputs(5, 80, 7, 6, lengths="ragged", duration_transitions=dt, proj="both", seed=11)
    # numba.set_num_threads starts numba's OpenMP layer, which also sets the thread count torch reads
    torch_threads = torch.get_num_threads()
    before = numba.get_num_threads()
    try:
        runs = []
        for threads in (1, numba.config.NUMBA_NUM_THREADS, 1):
            numba.set_num_threads(threads)
            assert engine.num_threads() == threads
            runs.append(run_numba(inp) + semi_crf_streaming_viterbi_numba(*positional(inp), **proj(inp)))
    finally:
        numba.set_num_threads(before)
        torch.set_num_threads(torch_threads)
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)
