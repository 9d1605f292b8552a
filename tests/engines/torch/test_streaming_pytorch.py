"""The CPU engines (the streaming PyTorch path and the compiled numba engine) against the oracles.

Every test runs once per CPU backend (``CPU_BACKENDS``) through the public API.

Brute-force enumeration (T <= 6) for partition, Viterbi and marginals; the naive edge-block DP
with autograd for partition and every gradient at larger sizes; pytorch-struct one sequence at a
time; gradcheck; special cases (K = 1, K >= T, length 1, ragged, -inf transitions); numerics,
determinism and input validation.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from conftest import (
    CPU_BACKENDS,
    DIFFERENTIABLE,
    assert_close,
    brute_case_id,
    brute_case_inputs,
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
from torch_semimarkov.streaming import (
    NEG_INF,
    SemiCRFStreaming,
    semi_crf_streaming_backward_pytorch,
    semi_crf_streaming_forward,
    semi_crf_streaming_forward_pytorch,
    semi_crf_streaming_marginals,
    semi_crf_streaming_viterbi,
    semi_crf_streaming_viterbi_pytorch,
    segments_to_labels,
)

F64 = torch.float64
F32 = torch.float32
DTYPES = [pytest.param(F64, id="f64"), pytest.param(F32, id="f32")]


#: The backend the public calls of the running test use (set by the ``cpu_backend`` fixture).
BACKEND = "torch"


@pytest.fixture(autouse=True, params=CPU_BACKENDS)
def cpu_backend(request):
    global BACKEND
    BACKEND = request.param
    yield request.param
    BACKEND = "torch"


def fwd(inp, **kw):
    return semi_crf_streaming_forward(**inp, backend=BACKEND, **kw)


def engine_functions():
    """(forward, backward, viterbi) low-level functions of the running test's backend."""
    if BACKEND == "numba":
        from torch_semimarkov.engines.numba import engine as ne

        return (ne.semi_crf_streaming_forward_numba, ne.semi_crf_streaming_backward_numba,
                ne.semi_crf_streaming_viterbi_numba)
    return semi_crf_streaming_forward_pytorch, semi_crf_streaming_backward_pytorch, semi_crf_streaming_viterbi_pytorch


def as_dtype(inp, dtype):
    return {k: (v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in inp.items()}


def seq(inp, b, L=None):
    """The inputs of sequence b alone, cut to its own length L (so T = L)."""
    L = int(inp["lengths"][b]) if L is None else L
    out = dict(inp)
    out["cum_scores"] = inp["cum_scores"][b : b + 1, : L + 1]
    out["lengths"] = torch.tensor([L])
    for key in ("proj_start", "proj_end"):
        if inp[key] is not None:
            out[key] = inp[key][b : b + 1, :L]
    return out


# ---------------------------------------------------------------------------------------------
# Brute-force enumeration (T <= 6)
# ---------------------------------------------------------------------------------------------

BRUTE_CASES = [
    # (B, T, K, C, lengths, duration_transitions, proj)
    (3, 6, 3, 3, [6, 4, 1], False, "both"),
    (3, 6, 3, 3, [6, 5, 2], True, "both"),
    (2, 5, 6, 2, [5, 2], True, "none"),
    (2, 5, 7, 3, [5, 4], False, "none"),
    (1, 1, 1, 3, [1], False, "start"),
    (2, 6, 1, 3, [6, 5], True, "end"),
    (2, 6, 1, 2, [3, 6], False, "both"),
    (2, 4, 2, 4, [4, 3], True, "start"),
    (2, 6, 4, 2, [6, 6], False, "end"),
    (4, 3, 2, 1, [3, 1, 2, 3], False, "both"),
]


@pytest.fixture(scope="module", params=BRUTE_CASES, ids=brute_case_id)
def brute_case(request):
    return brute_case_inputs(request.param)


@pytest.mark.parametrize("dtype", DTYPES)
def test_partition_matches_brute_force(brute_case, dtype):
    inp, bf = brute_case
    out = fwd(as_dtype(inp, dtype))
    assert out.dtype == dtype and out.shape == bf.log_Z.shape
    assert_close(out, bf.log_Z, msg="log Z")


@pytest.mark.parametrize("dtype", DTYPES)
def test_max_score_matches_brute_force(brute_case, dtype):
    inp, bf = brute_case
    assert_close(fwd(as_dtype(inp, dtype), semiring="max"), bf.max_score, msg="max-semiring forward")


@pytest.mark.parametrize("dtype", DTYPES)
def test_viterbi_matches_brute_force(brute_case, dtype):
    inp, bf = brute_case
    res = semi_crf_streaming_viterbi(**as_dtype(inp, dtype), backend=BACKEND)
    assert_close(res.scores, bf.max_score, msg="viterbi score")
    check_best_segments(res.segments, bf.argmax, bf.max_score, inp, bf.argmax_unique)
    T = inp["cum_scores"].shape[1] - 1
    assert res.labels.dtype == torch.long and tuple(res.labels.shape) == (len(bf.argmax), T)
    assert torch.equal(res.labels, segments_to_labels(res.segments, T))


def test_marginals_match_brute_force(brute_case):
    inp, bf = brute_case
    m = semi_crf_streaming_marginals(**inp, backend=BACKEND)
    assert_close(m.log_Z, bf.log_Z, msg="log_Z")
    assert_close(m.start, bf.start, msg="start")
    assert_close(m.end, bf.end, msg="end")
    assert_close(m.position, bf.position, msg="position")
    assert_close(m.boundary, bf.boundary, msg="boundary")


def test_marginals_float32_match_brute_force(brute_case):
    inp, bf = brute_case
    m = semi_crf_streaming_marginals(**as_dtype(inp, F32), backend=BACKEND)
    for name in ("log_Z", "start", "end", "position", "boundary"):
        assert getattr(m, name).dtype == F32, name
        assert_close(getattr(m, name), getattr(bf, name), msg=name)


def test_gradients_match_brute_force(brute_case):
    inp, _ = brute_case
    B = inp["cum_scores"].shape[0]
    up = random_upstream(B, seed=7)
    a, b = with_grad(inp), with_grad(inp)
    got = grads_of(fwd(a), a, up)
    want = grads_of(brute_force(**b).log_Z, b, up)
    assert set(got) == set(want)
    for name in want:
        assert_close(got[name], want[name], msg=f"d logZ / d {name}")


def test_engine_functions_match_brute_force(brute_case):
    """The low-level forward/backward/viterbi contract: unscaled marginals and per-batch grads."""
    inp, bf = brute_case
    B = inp["cum_scores"].shape[0]
    args = (inp["cum_scores"], inp["transition"], inp["duration_bias"], inp["lengths"], inp["K"])
    kw = dict(proj_start=inp["proj_start"], proj_end=inp["proj_end"])
    forward, backward, viterbi = engine_functions()
    partition, ring, interval, norms = forward(*args, **kw)
    assert_close(partition, bf.log_Z, msg="partition")
    p_start, p_end, g_tr, g_db = backward(*args, partition, ring, interval, norms, **kw)
    assert_close(p_start, bf.start, msg="p_start")
    assert_close(p_end, bf.end, msg="p_end")
    # per-sequence gradients of log Z[b] with respect to the shared parameters
    want_tr, want_db = [], []
    for b in range(B):
        tr = inp["transition"].clone().requires_grad_(True)
        db = inp["duration_bias"].clone().requires_grad_(True)
        lz = brute_force(inp["cum_scores"], tr, db, inp["lengths"], inp["K"], **kw).log_Z[b]
        gt, gd = torch.autograd.grad(lz, (tr, db))
        want_tr.append(gt)
        want_db.append(gd)
    assert_close(g_tr, torch.stack(want_tr), msg="grad_transition_per_batch")
    assert_close(g_db, torch.stack(want_db), msg="grad_duration_bias_per_batch")
    scores, labels, starts = viterbi(*args, **kw)
    assert_close(scores, bf.max_score, msg="viterbi scores")
    T = inp["cum_scores"].shape[1] - 1
    for b, segs in enumerate(bf.argmax):
        if not bf.argmax_unique[b]:
            continue
        want_starts = torch.zeros(T, dtype=torch.bool)
        for s in segs:
            want_starts[s.start] = True
        assert torch.equal(labels[b], segments_to_labels([segs], T)[0]), f"labels of sequence {b}"
        assert torch.equal(starts[b].bool() & (labels[b] >= 0), want_starts), f"seg_starts of sequence {b}"


# ---------------------------------------------------------------------------------------------
# Naive edge-block DP with autograd (larger T)
# ---------------------------------------------------------------------------------------------

NAIVE_CASES = [
    # (B, T, K, C, lengths)
    (2, 63, 5, 7, "ragged"),
    (3, 40, 8, 3, [40, 17, 1]),
    (1, 30, 30, 4, None),
    (2, 17, 20, 3, [17, 9]),
    (4, 25, 1, 5, "ragged"),
    (2, 50, 3, 1, [50, 23]),
    (3, 33, 12, 2, [33, 12, 13]),
    (2, 40, 4, 3, [9, 15]),  # every sequence much shorter than T
]


def _naive_id(case):
    B, T, K, C, lengths = case
    if lengths is None:
        kind = "full"
    elif lengths != "ragged" and max(lengths) < T:
        kind = "short"
    else:
        kind = "ragged"
    return case_id(B, T, K, C, kind)


@pytest.mark.parametrize("proj", ["none", "start", "end", "both"])
@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
@pytest.mark.parametrize("case", NAIVE_CASES, ids=_naive_id)
def test_partition_and_gradients_match_naive_dp(case, dt, proj):
    B, T, K, C, lengths = case
    inp = make_inputs(B, T, K, C, lengths=lengths, duration_transitions=dt, proj=proj, seed=T + K + C)
    up = random_upstream(B, seed=T)
    a, b = with_grad(inp), with_grad(inp)
    out = fwd(a)
    want = naive_semi_crf(**b)
    assert_close(out, want, msg="log Z")
    got_g = grads_of(out, a, up)
    want_g = grads_of(want, b, up)
    for name in want_g:
        assert_close(got_g[name], want_g[name], msg=f"d logZ / d {name}")


@pytest.mark.parametrize("interval", [1, 2, 3, 7, 16, 1000])
@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
def test_checkpoint_interval_does_not_change_results(interval, dt):
    inp = make_inputs(3, 45, 6, 3, lengths=[45, 20, 7], duration_transitions=dt, proj="both", seed=21)
    up = random_upstream(3, seed=2)
    a, b = with_grad(inp), with_grad(inp)
    out = fwd(a, checkpoint_interval=interval)
    want = naive_semi_crf(**b)
    assert_close(out, want, msg="log Z")
    got_g, want_g = grads_of(out, a, up), grads_of(want, b, up)
    for name in want_g:
        assert_close(got_g[name], want_g[name], msg=f"d logZ / d {name} (interval {interval})")
    m = semi_crf_streaming_marginals(**inp, backend=BACKEND, checkpoint_interval=interval)
    lz, start, end, position, boundary = naive_marginals(**inp)
    assert_close(m.start, start, msg="start")
    assert_close(m.end, end, msg="end")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
@pytest.mark.parametrize("case", NAIVE_CASES[:4], ids=_naive_id)
def test_viterbi_matches_naive_dp(case, dt, dtype):
    B, T, K, C, lengths = case
    inp = make_inputs(B, T, K, C, lengths=lengths, duration_transitions=dt, proj="both", seed=T * K)
    want_scores, want_segs = naive_semi_crf_viterbi(**inp)
    res = semi_crf_streaming_viterbi(**as_dtype(inp, dtype), backend=BACKEND)
    assert_close(res.scores, want_scores, msg="viterbi score")
    assert_close(fwd(as_dtype(inp, dtype), semiring="max"), want_scores, msg="max-semiring forward")
    assert res.segments == want_segs
    assert torch.equal(res.labels, segments_to_labels(want_segs, T))


@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
@pytest.mark.parametrize("case", NAIVE_CASES[:4], ids=_naive_id)
def test_marginals_match_naive_dp(case, dt):
    B, T, K, C, lengths = case
    inp = make_inputs(B, T, K, C, lengths=lengths, duration_transitions=dt, proj="both", seed=T * C)
    m = semi_crf_streaming_marginals(**inp, backend=BACKEND)
    lz, start, end, position, boundary = naive_marginals(**inp)
    assert_close(m.log_Z, lz, msg="log_Z")
    assert_close(m.start, start, msg="start")
    assert_close(m.end, end, msg="end")
    assert_close(m.position, position, msg="position")
    assert_close(m.boundary, boundary, msg="boundary")


@pytest.mark.parametrize("case", NAIVE_CASES[:3], ids=_naive_id)
def test_float32_matches_float64_oracle(case):
    B, T, K, C, lengths = case
    inp = make_inputs(B, T, K, C, lengths=lengths, proj="both", seed=5)
    up = random_upstream(B, seed=3)
    a = with_grad(inp, dtype=F32)
    b = with_grad(inp)
    out = fwd(a)
    assert out.dtype == F32
    want = naive_semi_crf(**b)
    assert_close(out, want, msg="log Z f32")
    got_g, want_g = grads_of(out, a, up), grads_of(want, b, up)
    for name in want_g:
        assert got_g[name].dtype == F32, name
        assert_close(got_g[name], want_g[name], dtype=F32, atol=2e-4, msg=f"d logZ / d {name} f32")


# ---------------------------------------------------------------------------------------------
# pytorch-struct, one sequence at a time
# ---------------------------------------------------------------------------------------------

TS_CASES = [(2, 14, 4, 3, False), (2, 11, 5, 2, True), (1, 9, 12, 3, False), (2, 20, 6, 4, True)]


@pytest.mark.parametrize("case", TS_CASES, ids=lambda c: case_id(*c[:4], "KCC" if c[4] else "CC"))
def test_matches_torch_struct_per_sequence(case):
    pytest.importorskip("torch_struct")
    B, T, K, C, dt = case
    inp = make_inputs(B, T, K, C, lengths="ragged", duration_transitions=dt, proj="both", seed=31 + T)
    up = random_upstream(B, seed=4)
    a = with_grad(inp)
    out = fwd(a)
    got_g = grads_of(out, a, up)
    res = semi_crf_streaming_viterbi(**inp, backend=BACKEND)
    want_g = {k: torch.zeros_like(v) for k, v in got_g.items()}
    for b in range(B):
        L = int(inp["lengths"][b])
        c = with_grad(inp)
        S = c["cum_scores"][b, : L + 1]
        edges = ts_edges(S, c["transition"], c["duration_bias"], K, c["proj_start"][b, :L], c["proj_end"][b, :L])
        dist = ts_distribution(edges)
        part = dist.partition
        assert_close(out[b], part.detach()[0], msg=f"partition of sequence {b}")
        g = grads_of(part, c, up[b : b + 1])
        for name in want_g:
            want_g[name] += g[name]
        assert_close(res.scores[b], dist.max.detach()[0], msg=f"max of sequence {b}")
        assert res.segments[b] == ts_segments(dist.argmax), f"argmax of sequence {b}"
    for name in want_g:
        assert_close(got_g[name], want_g[name], msg=f"d logZ / d {name}")


# ---------------------------------------------------------------------------------------------
# gradcheck in float64, every combination of requires_grad
# ---------------------------------------------------------------------------------------------

SUBSETS = [s for r in range(1, 6) for s in itertools.combinations(DIFFERENTIABLE, r)]


@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
@pytest.mark.parametrize("names", SUBSETS, ids=lambda s: "+".join(n.replace("_", "") for n in s))
def test_gradcheck_every_requires_grad_combination(names, dt):
    inp = make_inputs(2, 5, 3, 2, lengths=[5, 3], duration_transitions=dt, proj="both", seed=41)
    order = list(names)
    up = random_upstream(2, seed=9)

    def f(*tensors):
        kw = dict(inp)
        kw.update(zip(order, tensors))
        return fwd(kw) * up

    leaves = [inp[n].detach().clone().requires_grad_(True) for n in order]
    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("proj", ["none", "start", "end"])
def test_gradcheck_without_some_projections(proj):
    inp = make_inputs(2, 6, 4, 3, lengths=[6, 2], proj=proj, seed=43)
    names = [n for n in DIFFERENTIABLE if inp[n] is not None]

    def f(*tensors):
        kw = dict(inp)
        kw.update(zip(names, tensors))
        return fwd(kw)

    leaves = [inp[n].detach().clone().requires_grad_(True) for n in names]
    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_gradcheck_long_sequence_with_checkpoints():
    inp = make_inputs(1, 24, 4, 2, duration_transitions=True, proj="both", seed=44)

    def f(cum, tr, db):
        kw = dict(inp, cum_scores=cum, transition=tr, duration_bias=db)
        return fwd(kw, checkpoint_interval=5)

    leaves = [inp[n].detach().clone().requires_grad_(True) for n in ("cum_scores", "transition", "duration_bias")]
    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-7, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# K = 1 against a linear-chain CRF written here
# ---------------------------------------------------------------------------------------------

def linear_chain(inp, semiring="log"):
    """Forward algorithm of a linear-chain CRF with emissions e_t(c) and a phantom start, which
    is marginalised (logsumexp over the transition column) in both semirings."""
    S, Tr, D = inp["cum_scores"].double(), inp["transition"].double(), inp["duration_bias"].double()
    if Tr.dim() == 3:
        Tr = Tr[0]
    B, T1, C = S.shape
    emit = S[:, 1:] - S[:, :-1] + D[0]
    if inp["proj_start"] is not None:
        emit = emit + inp["proj_start"].double()
    if inp["proj_end"] is not None:
        emit = emit + inp["proj_end"].double()
    red = (lambda x, d: torch.logsumexp(x, d)) if semiring == "log" else (lambda x, d: x.max(d).values)
    out = []
    for b in range(B):
        L = int(inp["lengths"][b])
        alpha = torch.logsumexp(Tr, 0) + emit[b, 0]
        for t in range(1, L):
            alpha = red(alpha[:, None] + Tr, 0) + emit[b, t]
        out.append(red(alpha, 0))
    return torch.stack(out)


def linear_chain_viterbi_labels(inp):
    S, Tr, D = inp["cum_scores"].double(), inp["transition"].double(), inp["duration_bias"].double()
    if Tr.dim() == 3:
        Tr = Tr[0]
    B, T1, C = S.shape
    emit = S[:, 1:] - S[:, :-1] + D[0]
    for key in ("proj_start", "proj_end"):
        if inp[key] is not None:
            emit = emit + inp[key].double()
    labels = torch.full((B, T1 - 1), -1, dtype=torch.long)
    for b in range(B):
        L = int(inp["lengths"][b])
        alpha = torch.logsumexp(Tr, 0) + emit[b, 0]
        bps = []
        for t in range(1, L):
            val, bp = (alpha[:, None] + Tr).max(0)
            alpha = val + emit[b, t]
            bps.append(bp)
        c = int(alpha.argmax())
        labels[b, L - 1] = c
        for t in range(L - 1, 0, -1):
            c = int(bps[t - 1][c])
            labels[b, t - 1] = c
    return labels


@pytest.mark.parametrize("dt", [False, True], ids=["CC", "1CC"])
@pytest.mark.parametrize("proj", ["none", "both"])
def test_k1_is_a_linear_chain_crf(proj, dt):
    inp = make_inputs(3, 37, 1, 5, lengths=[37, 20, 1], duration_transitions=dt, proj=proj, seed=51)
    up = random_upstream(3, seed=5)
    a, b = with_grad(inp), with_grad(inp)
    out = fwd(a)
    want = linear_chain(b)
    assert_close(out, want, msg="log Z")
    got_g, want_g = grads_of(out, a, up), grads_of(want, b, up)
    for name in want_g:
        assert_close(got_g[name], want_g[name], msg=f"d logZ / d {name}")
    assert_close(fwd(inp, semiring="max"), linear_chain(inp, "max"), msg="max")
    res = semi_crf_streaming_viterbi(**inp, backend=BACKEND)
    assert torch.equal(res.labels, linear_chain_viterbi_labels(inp))
    for b_, segs in enumerate(res.segments):
        assert all(s.end - s.start == 1 for s in segs)
        assert len(segs) == int(inp["lengths"][b_])


# ---------------------------------------------------------------------------------------------
# Special shapes: length 1, K >= T, ragged batches
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
def test_length_one_closed_form(dt):
    inp = make_inputs(3, 4, 3, 4, lengths=[1, 1, 1], duration_transitions=dt, proj="both", seed=61)
    Tr = inp["transition"] if not dt else inp["transition"][0]
    per_label = (inp["cum_scores"][:, 1] + inp["duration_bias"][0] + inp["proj_start"][:, 0]
                 + inp["proj_end"][:, 0] + torch.logsumexp(Tr, 0))
    assert_close(fwd(inp), torch.logsumexp(per_label, -1), msg="log Z")
    # the single segment's probability is softmax(per_label): Viterbi picks its argmax
    best = per_label
    res = semi_crf_streaming_viterbi(**inp, backend=BACKEND)
    assert_close(res.scores, best.max(-1).values, msg="viterbi")
    assert res.labels[:, 1:].eq(-1).all()
    assert [s[0].label for s in res.segments] == best.argmax(-1).tolist()
    m = semi_crf_streaming_marginals(**inp, backend=BACKEND)
    assert_close(m.position[:, 0], torch.softmax(per_label, -1), msg="position")
    assert float(m.position[:, 1:].abs().sum()) == 0.0


@pytest.mark.parametrize("T,K", [(1, 1), (1, 5), (7, 7), (7, 8), (7, 50), (12, 100)])
def test_k_at_least_t(T, K):
    inp = make_inputs(2, T, K, 3, lengths=[T, max(1, T // 2)], duration_transitions=True, proj="both", seed=T + K)
    up = random_upstream(2, seed=6)
    a, b = with_grad(inp), with_grad(inp)
    out, want = fwd(a), naive_semi_crf(**b)
    assert_close(out, want, msg="log Z")
    got_g, want_g = grads_of(out, a, up), grads_of(want, b, up)
    for name in want_g:
        assert_close(got_g[name], want_g[name], msg=f"d logZ / d {name}")
    # durations beyond T can never be used: their gradient is exactly zero
    assert float(got_g["duration_bias"][T:].abs().sum()) == 0.0
    assert float(got_g["transition"][T:].abs().sum()) == 0.0
    scores, segs = naive_semi_crf_viterbi(**inp)
    assert semi_crf_streaming_viterbi(**inp, backend=BACKEND).segments == segs


@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
def test_ragged_batch_equals_sequences_alone_and_ignores_padding(dt):
    B, T, K, C = 4, 30, 6, 3
    inp = make_inputs(B, T, K, C, lengths=[30, 1, 13, 29], duration_transitions=dt, proj="both", seed=71)
    # garbage past each length must not matter
    for b in range(B):
        L = int(inp["lengths"][b])
        inp["cum_scores"][b, L + 1 :] = 1e3 * torch.rand(T - L, C, dtype=F64)
        inp["proj_start"][b, L:] = 50.0
        inp["proj_end"][b, L:] = -50.0
    up = random_upstream(B, seed=8)
    a = with_grad(inp)
    out = fwd(a)
    g = grads_of(out, a, up)
    res = semi_crf_streaming_viterbi(**inp, backend=BACKEND)
    m = semi_crf_streaming_marginals(**inp, backend=BACKEND)
    g_tr = torch.zeros_like(inp["transition"])
    g_db = torch.zeros_like(inp["duration_bias"])
    for b in range(B):
        L = int(inp["lengths"][b])
        one = with_grad(seq(inp, b))
        z = fwd(one)
        assert_close(out[b], z[0], msg=f"log Z of sequence {b}")
        g1 = grads_of(z, one, up[b : b + 1])
        assert_close(g["cum_scores"][b, : L + 1], g1["cum_scores"][0], msg=f"cum_scores grad of {b}")
        assert float(g["cum_scores"][b, L + 1 :].abs().sum()) == 0.0
        for key in ("proj_start", "proj_end"):
            assert_close(g[key][b, :L], g1[key][0], msg=f"{key} grad of {b}")
            assert float(g[key][b, L:].abs().sum()) == 0.0
        g_tr += g1["transition"]
        g_db += g1["duration_bias"]
        r1 = semi_crf_streaming_viterbi(**seq(inp, b), backend=BACKEND)
        assert res.segments[b] == r1.segments[0]
        assert_close(res.scores[b], r1.scores[0])
        assert bool((res.labels[b, L:] == -1).all())
        for key in ("start", "end", "position"):
            assert float(getattr(m, key)[b, L:].abs().sum()) == 0.0, key
        assert float(m.boundary[b, L:].abs().sum()) == 0.0
    assert_close(g["transition"], g_tr, msg="transition grad = sum over sequences")
    assert_close(g["duration_bias"], g_db, msg="duration_bias grad = sum over sequences")


def test_batch_of_one_and_large_batch_agree():
    inp = make_inputs(9, 20, 4, 3, lengths="ragged", proj="start", seed=72)
    out = fwd(inp)
    for b in range(9):
        one = dict(inp, cum_scores=inp["cum_scores"][b : b + 1], lengths=inp["lengths"][b : b + 1],
                   proj_start=inp["proj_start"][b : b + 1])
        assert_close(fwd(one)[0], out[b], msg=f"sequence {b}")


def test_viterbi_segments_tile_and_score():
    inp = make_inputs(3, 40, 7, 4, lengths=[40, 19, 3], duration_transitions=True, proj="both", seed=73)
    res = semi_crf_streaming_viterbi(**inp, backend=BACKEND)
    for b, segs in enumerate(res.segments):
        L = int(inp["lengths"][b])
        assert segs[0].start == 0 and segs[-1].end == L
        assert all(x.end == y.start for x, y in zip(segs, segs[1:]))
        assert all(1 <= s.end - s.start <= 7 for s in segs)
        sc = segmentation_score(inp["cum_scores"][b], inp["transition"], inp["duration_bias"], segs,
                                inp["proj_start"][b], inp["proj_end"][b])
        assert math.isclose(sc, float(res.scores[b]), rel_tol=1e-10, abs_tol=1e-10)
    assert bool((res.scores <= fwd(inp)).all())


# ---------------------------------------------------------------------------------------------
# Forbidden transitions (-inf), numerics, determinism
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
def test_neg_inf_transitions_give_finite_gradients(dt, dtype):
    inp = make_inputs(3, 25, 4, 4, lengths=[25, 11, 1], duration_transitions=dt, proj="both", seed=81)
    tr = inp["transition"].clone()
    # BIO-like constraints: 0 -> 1 and 2 -> 2 forbidden, label 3 can only be entered from label 1
    tr[..., 0, 1] = -math.inf
    tr[..., 2, 2] = -math.inf
    tr[..., [0, 2, 3], 3] = -math.inf
    db = inp["duration_bias"].clone()
    db[0, 2] = -math.inf  # label 2 never lasts one position
    inp = dict(inp, transition=tr, duration_bias=db)
    up = random_upstream(3, seed=10)
    a = with_grad(inp, dtype=dtype)
    b = with_grad(inp)
    out = fwd(a)
    assert bool(torch.isfinite(out).all())
    got_g = grads_of(out, a, up)
    for name, g in got_g.items():
        assert bool(torch.isfinite(g).all()), f"non-finite gradient for {name}"
    want = naive_semi_crf(**b)
    want_g = grads_of(want, b, up)
    assert_close(out, want, msg="log Z")
    for name in want_g:
        assert_close(got_g[name], want_g[name], msg=f"d logZ / d {name}")
    assert float(got_g["transition"][..., 0, 1].abs().sum()) == 0.0
    res = semi_crf_streaming_viterbi(**as_dtype(inp, dtype), backend=BACKEND)
    for segs in res.segments:
        for x, y in zip(segs, segs[1:]):
            assert (x.label, y.label) not in ((0, 1), (2, 2), (0, 3), (2, 3), (3, 3))
        assert not any(s.label == 2 and s.end - s.start == 1 for s in segs)
    m = semi_crf_streaming_marginals(**as_dtype(inp, dtype), backend=BACKEND)
    for name in ("start", "end", "position", "boundary"):
        assert bool(torch.isfinite(getattr(m, name)).all()), name


def test_neg_inf_brute_force_small():
    inp = make_inputs(2, 5, 3, 3, lengths=[5, 4], proj="both", seed=82)
    tr = inp["transition"].clone()
    tr[1, :] = -math.inf  # nothing follows label 1: it can only end a sequence
    inp = dict(inp, transition=tr)
    bf = brute_force(**inp)
    assert_close(fwd(inp), bf.log_Z)
    m = semi_crf_streaming_marginals(**inp, backend=BACKEND)
    assert_close(m.start, bf.start, msg="start")
    assert_close(m.position, bf.position, msg="position")
    res = semi_crf_streaming_viterbi(**inp, backend=BACKEND)
    check_best_segments(res.segments, bf.argmax, bf.max_score, inp, bf.argmax_unique)


def test_neg_inf_equals_neg_inf_constant():
    inp = make_inputs(2, 15, 4, 3, lengths=[15, 8], seed=83)
    tr = inp["transition"].clone()
    tr[0, 2] = -math.inf
    a = fwd(dict(inp, transition=tr))
    tr2 = tr.clone()
    tr2[0, 2] = NEG_INF
    assert torch.equal(a, fwd(dict(inp, transition=tr2)))


def test_large_scores_stay_finite():
    # long sequence with large per-position scores: no overflow in float32
    inp = make_inputs(2, 400, 10, 3, lengths=[400, 333], proj="both", seed=84, scale=30.0)
    a = with_grad(inp, dtype=F32)
    out = fwd(a)
    assert bool(torch.isfinite(out).all())
    g = grads_of(out, a, random_upstream(2))
    for name, t in g.items():
        assert bool(torch.isfinite(t).all()), name
    assert_close(out, fwd(inp), dtype=F32, rtol=1e-5, msg="f32 vs f64 engine")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
def test_gradients_are_bitwise_deterministic(dt, dtype):
    inp = make_inputs(3, 120, 9, 5, lengths=[120, 77, 5], duration_transitions=dt, proj="both", seed=91)
    up = random_upstream(3, seed=11)
    runs = []
    for _ in range(3):
        a = with_grad(inp, dtype=dtype)
        out = fwd(a)
        runs.append((out.detach(), grads_of(out, a, up)))
    for out, g in runs[1:]:
        assert torch.equal(out, runs[0][0])
        for name in g:
            assert torch.equal(g[name], runs[0][1][name]), f"{name} differs between runs"
    m1 = semi_crf_streaming_marginals(**as_dtype(inp, dtype), backend=BACKEND)
    m2 = semi_crf_streaming_marginals(**as_dtype(inp, dtype), backend=BACKEND)
    for x, y in zip(m1, m2):
        assert torch.equal(x, y)


def test_use_triton_flag_falls_back_on_cpu():
    inp = make_inputs(2, 20, 4, 3, lengths=[20, 9], proj="both", seed=92)
    assert torch.equal(semi_crf_streaming_forward(**inp, use_triton=True, backend=BACKEND), fwd(inp))
    v1 = semi_crf_streaming_viterbi(**inp, use_triton=True, backend=BACKEND)
    v2 = semi_crf_streaming_viterbi(**inp, backend=BACKEND)
    assert v1.segments == v2.segments and torch.equal(v1.scores, v2.scores)


def test_public_names_are_exported():
    import torch_semimarkov

    for name in ("semi_crf_streaming_forward", "semi_crf_streaming_viterbi", "semi_crf_streaming_marginals",
                 "Segment", "NEG_INF", "labels_to_segments", "segments_to_labels"):
        assert hasattr(torch_semimarkov, name), name
    from torch_semimarkov.core.constants import NEG_INF as neg

    assert neg == -1e9


def test_no_autograd_graph_over_t():
    inp = make_inputs(2, 200, 5, 3, lengths=[200, 150], proj="both", seed=93)
    a = with_grad(inp)
    out = fwd(a)
    seen, stack = set(), [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(n for n, _ in node.next_functions)
    assert len(seen) < 30, f"autograd graph has {len(seen)} nodes; the backward must be hand-written"
    # one node: the engine operator with its registered (hand-written) backward
    assert any("torch_semimarkov_forward" in type(n).__name__ for n in seen)


def test_checkpoints_are_small():
    B, T, K, C = 2, 3000, 10, 4
    inp = make_inputs(B, T, K, C, seed=94)
    partition, ring, interval, norms = engine_functions()[0](
        inp["cum_scores"], inp["transition"], inp["duration_bias"], inp["lengths"], K
    )
    saved = ring.numel() + norms.numel()
    # O(sqrt(T/K)·K·C) per sequence, nowhere near T·K·C
    assert saved <= 4 * B * (math.isqrt(T * K) + K) * C + 4 * B * (T // interval + 2) * K * C
    assert saved < B * T * K * C / 8, f"checkpoints hold {saved} values for B·T·K·C = {B * T * K * C}"
    assert_close(partition, fwd(inp))


def test_max_semiring_forward_ignores_requires_grad():
    inp = with_grad(make_inputs(2, 10, 3, 3, seed=95))
    out = fwd(inp, semiring="max")
    assert out.shape == (2,)
    assert_close(out.detach(), naive_semi_crf(**{k: (v.detach() if isinstance(v, torch.Tensor) else v)
                                               for k, v in inp.items()}, semiring="max"))


def test_public_engine_names_are_the_engines():
    # the names of earlier releases still name the engines (now plain classes behind the operators)
    from torch_semimarkov.engines.interface import TorchEngine
    assert SemiCRFStreaming is TorchEngine and SemiCRFStreaming.backend == "PyTorch"


# ---------------------------------------------------------------------------------------------
# Validation: every bad input raises ValueError/TypeError naming the argument
# ---------------------------------------------------------------------------------------------

def _bad_inputs():
    B, T, K, C = 2, 6, 3, 4
    base = make_inputs(B, T, K, C, proj="both", seed=99)

    def mod(**kw):
        return dict(base, **kw)

    def with_nan(name, value=math.nan, idx=(0,)):
        t = base[name].clone()
        t.view(-1)[idx[0]] = value
        return mod(**{name: t})

    cases = [
        ("cum_scores 2-D", mod(cum_scores=base["cum_scores"][0]), "cum_scores"),
        ("cum_scores 4-D", mod(cum_scores=base["cum_scores"][None]), "cum_scores"),
        ("cum_scores float16", mod(cum_scores=base["cum_scores"].half()), "cum_scores"),
        ("cum_scores bfloat16", mod(cum_scores=base["cum_scores"].bfloat16()), "cum_scores"),
        ("cum_scores int64", mod(cum_scores=base["cum_scores"].long()), "cum_scores"),
        ("cum_scores list", mod(cum_scores=base["cum_scores"].tolist()), "cum_scores"),
        ("cum_scores NaN", with_nan("cum_scores", idx=(7,)), "cum_scores"),
        ("cum_scores +inf", with_nan("cum_scores", math.inf, idx=(7,)), "cum_scores"),
        ("cum_scores -inf", with_nan("cum_scores", -math.inf, idx=(7,)), "cum_scores"),
        ("transition C mismatch", mod(transition=torch.zeros(C + 1, C + 1, dtype=F64)), "transition"),
        ("transition not square", mod(transition=torch.zeros(C, C + 1, dtype=F64)), "transition"),
        ("transition K mismatch", mod(transition=torch.zeros(K + 1, C, C, dtype=F64)), "transition"),
        ("transition 1-D", mod(transition=torch.zeros(C, dtype=F64)), "transition"),
        ("transition 4-D", mod(transition=torch.zeros(1, K, C, C, dtype=F64)), "transition"),
        ("transition NaN", with_nan("transition"), "transition"),
        ("transition +inf", with_nan("transition", math.inf), "transition"),
        ("transition int", mod(transition=torch.zeros(C, C, dtype=torch.long)), "transition"),
        ("duration_bias K mismatch", mod(duration_bias=torch.zeros(K + 1, C, dtype=F64)), "duration_bias"),
        ("duration_bias C mismatch", mod(duration_bias=torch.zeros(K, C - 1, dtype=F64)), "duration_bias"),
        ("duration_bias 1-D", mod(duration_bias=torch.zeros(K, dtype=F64)), "duration_bias"),
        ("duration_bias NaN", with_nan("duration_bias"), "duration_bias"),
        ("duration_bias +inf", with_nan("duration_bias", math.inf), "duration_bias"),
        ("lengths zero", mod(lengths=torch.tensor([T, 0])), "lengths"),
        ("lengths negative", mod(lengths=torch.tensor([-1, T])), "lengths"),
        ("lengths > T", mod(lengths=torch.tensor([T + 1, T])), "lengths"),
        ("lengths float", mod(lengths=torch.tensor([6.0, 3.0])), "lengths"),
        ("lengths bool", mod(lengths=torch.tensor([True, True])), "lengths"),
        ("lengths wrong batch", mod(lengths=torch.tensor([T, T, T])), "lengths"),
        ("lengths 2-D", mod(lengths=torch.tensor([[T], [T]])), "lengths"),
        ("K zero", mod(K=0), "K"),
        ("K negative", mod(K=-2), "K"),
        ("K float", mod(K=3.0), "K"),
        ("K None", mod(K=None), "K"),
        ("proj_start shape", mod(proj_start=base["proj_start"][:, :-1]), "proj_start"),
        ("proj_start C mismatch", mod(proj_start=base["proj_start"][..., :-1]), "proj_start"),
        ("proj_start NaN", with_nan("proj_start"), "proj_start"),
        ("proj_start inf", with_nan("proj_start", math.inf), "proj_start"),
        ("proj_start float16", mod(proj_start=base["proj_start"].half()), "proj_start"),
        ("proj_end shape", mod(proj_end=base["proj_end"][:1]), "proj_end"),
        ("proj_end NaN", with_nan("proj_end"), "proj_end"),
        ("proj_end +inf", with_nan("proj_end", math.inf), "proj_end"),
        ("transition on meta device", mod(transition=torch.zeros(C, C, dtype=F64, device="meta")), "device"),
        ("duration_bias on meta device", mod(duration_bias=torch.zeros(K, C, dtype=F64, device="meta")), "device"),
        ("proj_end on meta device", mod(proj_end=torch.zeros(B, T, C, dtype=F64, device="meta")), "device"),
    ]
    if torch.cuda.is_available():
        cases.append(("transition on cuda", mod(transition=base["transition"].cuda()), "device"))
    return cases


BAD = _bad_inputs()


@pytest.mark.parametrize("entry", ["forward", "forward_max", "viterbi", "marginals"])
@pytest.mark.parametrize("what,kwargs,name", BAD, ids=[c[0].replace(" ", "_") for c in BAD])
def test_bad_input_raises_naming_the_argument(what, kwargs, name, entry):
    fn = {
        "forward": lambda **kw: semi_crf_streaming_forward(**kw),
        "forward_max": lambda **kw: semi_crf_streaming_forward(**kw, semiring="max"),
        "viterbi": lambda **kw: semi_crf_streaming_viterbi(**kw),
        "marginals": lambda **kw: semi_crf_streaming_marginals(**kw),
    }[entry]
    with pytest.raises((ValueError, TypeError)) as info:
        fn(**kwargs)
    assert name in str(info.value), f"{what}: message does not name {name!r}: {info.value}"


@pytest.mark.parametrize("semiring", ["sum", "LOG", "", None])
def test_unknown_semiring_raises(semiring):
    inp = make_inputs(1, 4, 2, 2)
    with pytest.raises(ValueError, match="semiring"):
        semi_crf_streaming_forward(**inp, semiring=semiring)


@pytest.mark.parametrize("interval", [0, -3, 2.5])
def test_bad_checkpoint_interval_raises(interval):
    inp = make_inputs(1, 4, 2, 2)
    with pytest.raises((ValueError, TypeError), match="checkpoint_interval"):
        semi_crf_streaming_forward(**inp, checkpoint_interval=interval)


def test_neg_inf_transition_and_duration_bias_are_accepted():
    inp = make_inputs(1, 4, 2, 2)
    tr = inp["transition"].clone()
    tr[0, 1] = -math.inf
    db = inp["duration_bias"].clone()
    db[1, 0] = -math.inf
    assert bool(torch.isfinite(fwd(dict(inp, transition=tr, duration_bias=db))).all())


def test_integer_lengths_of_any_int_dtype_and_lists_are_accepted():
    inp = make_inputs(2, 5, 2, 2, lengths=[5, 3])
    want = fwd(inp)
    for lengths in (torch.tensor([5, 3], dtype=torch.int32), torch.tensor([5, 3], dtype=torch.int16), [5, 3]):
        assert torch.equal(fwd(dict(inp, lengths=lengths)), want)


# ---------------------------------------------------------------------------------------------
# More edge cases: ties, long sequences, layouts, dtypes, impossible sequences, max gradients
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
def test_all_ties_break_toward_the_smallest_index(dt):
    # every segmentation scores log 3 (the first segment's phantom term logsumexp of a zero
    # column): smallest final label, smallest duration, smallest predecessor
    inp = make_inputs(2, 9, 4, 3, lengths=[9, 4], duration_transitions=dt, seed=1)
    inp = {k: (torch.zeros_like(v) if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
           for k, v in inp.items()}
    res = semi_crf_streaming_viterbi(**inp, backend=BACKEND)
    for b, L in enumerate((9, 4)):
        assert res.segments[b] == [(i, i + 1, 0) for i in range(L)]
    assert_close(res.scores, torch.full((2,), math.log(3), dtype=F64), msg="score")


@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
def test_long_sequence_float64_matches_naive_dp(dt):
    # many checkpoint intervals and renormalisations
    inp = make_inputs(2, 260, 6, 3, lengths=[260, 197], duration_transitions=dt, proj="both", seed=101, scale=2.0)
    up = random_upstream(2, seed=12)
    a, b = with_grad(inp), with_grad(inp)
    out, want = fwd(a), naive_semi_crf(**b)
    assert_close(out, want, msg="log Z")
    got_g, want_g = grads_of(out, a, up), grads_of(want, b, up)
    for name in want_g:
        assert_close(got_g[name], want_g[name], atol=1e-8, rtol=1e-8, msg=f"d logZ / d {name}")
    scores, segs = naive_semi_crf_viterbi(**inp)
    res = semi_crf_streaming_viterbi(**inp, backend=BACKEND)
    assert_close(res.scores, scores, msg="viterbi")
    assert res.segments == segs


def test_non_contiguous_inputs():
    inp = make_inputs(3, 20, 5, 4, lengths=[20, 11, 3], proj="both", seed=102)
    want = fwd(inp)
    nc = dict(inp)
    nc["cum_scores"] = inp["cum_scores"].transpose(1, 2).contiguous().transpose(1, 2)
    nc["transition"] = inp["transition"].t().contiguous().t()
    nc["duration_bias"] = inp["duration_bias"].t().contiguous().t()
    nc["proj_start"] = inp["proj_start"].permute(2, 0, 1).contiguous().permute(1, 2, 0)
    nc["proj_end"] = torch.stack([inp["proj_end"], inp["proj_end"]], dim=-1)[..., 0]
    assert not nc["cum_scores"].is_contiguous() and not nc["transition"].is_contiguous()
    assert not nc["proj_start"].is_contiguous() and not nc["proj_end"].is_contiguous()
    assert_close(fwd(nc), want, msg="log Z")
    up = random_upstream(3)
    a, b = with_grad(inp), with_grad(nc)
    ga, gb = grads_of(fwd(a), a, up), grads_of(fwd(b), b, up)
    for name in ga:
        assert_close(gb[name], ga[name], msg=name)
    assert semi_crf_streaming_viterbi(**nc, backend=BACKEND).segments == \
        semi_crf_streaming_viterbi(**inp, backend=BACKEND).segments


def test_expanded_batch_of_one():
    inp = make_inputs(1, 15, 4, 3, proj="both", seed=103)
    many = dict(inp, cum_scores=inp["cum_scores"].expand(4, -1, -1), lengths=torch.tensor([15, 15, 7, 1]),
                proj_start=inp["proj_start"].expand(4, -1, -1), proj_end=inp["proj_end"].expand(4, -1, -1))
    out = fwd(many)
    assert_close(out[0], fwd(inp)[0])
    assert_close(out[:2], out[:1].expand(2))


def test_mixed_parameter_dtypes():
    # float32 scores with float64 parameters: the computation runs in the scores' dtype and every
    # gradient comes back in its input's dtype
    inp = make_inputs(2, 12, 3, 3, lengths=[12, 5], proj="both", seed=104)
    a = with_grad(inp)
    a["cum_scores"] = a["cum_scores"].detach().float().requires_grad_(True)
    out = fwd(a)
    assert out.dtype == F32
    g = grads_of(out, a, random_upstream(2))
    for name, t in g.items():
        assert t.dtype == a[name].dtype, name
    b = with_grad(inp)
    want = grads_of(naive_semi_crf(**b), b, random_upstream(2))
    for name in want:
        assert_close(g[name], want[name], dtype=F32, msg=name)


@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
def test_impossible_sequence_gives_no_nan(dt):
    # only duration 3 is allowed: length 4 has no segmentation, length 6 has
    inp = make_inputs(2, 6, 3, 2, lengths=[4, 6], duration_transitions=dt, proj="both", seed=105)
    db = inp["duration_bias"].clone()
    db[:2] = -math.inf
    inp = dict(inp, duration_bias=db)
    a = with_grad(inp)
    out = fwd(a)
    assert not bool(torch.isnan(out).any())
    assert float(out[0].detach()) <= NEG_INF / 2
    g = grads_of(out, a, random_upstream(2))
    for name, t in g.items():
        assert bool(torch.isfinite(t).all()), name
    # the possible sequence is unaffected by its impossible neighbour
    assert_close(out[1], fwd(seq(inp, 1))[0], msg="log Z of the possible sequence")
    assert_close(out[1], naive_semi_crf(**inp)[1])
    res = semi_crf_streaming_viterbi(**inp, backend=BACKEND)
    assert not bool(torch.isnan(res.scores).any())
    assert res.segments[1] == [(0, 3, res.segments[1][0].label), (3, 6, res.segments[1][1].label)]
    m = semi_crf_streaming_marginals(**inp, backend=BACKEND)
    for name in ("start", "end", "position", "boundary"):
        assert not bool(torch.isnan(getattr(m, name)).any()), name


@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
def test_max_semiring_gradient_is_the_best_path_indicator(dt):
    inp = make_inputs(3, 30, 5, 4, lengths=[30, 17, 2], duration_transitions=dt, proj="both", seed=106)
    up = random_upstream(3, seed=13)
    a, b = with_grad(inp), with_grad(inp)
    out = fwd(a, semiring="max")
    want = naive_semi_crf(**b, semiring="max")
    assert_close(out, want, msg="max score")
    if out.grad_fn is None:
        pytest.skip("the max semiring is not differentiable in this build")
    got_g, want_g = grads_of(out, a, up), grads_of(want, b, up)
    for name in want_g:
        assert_close(got_g[name], want_g[name], msg=f"d max / d {name}")


@pytest.mark.parametrize("proj", ["none", "both"])
@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
def test_agrees_with_flash_semicrf_when_installed(dt, proj):
    # flash-semicrf 0.2.0 (not a test dependency) is called as a black box through its public API
    fs = pytest.importorskip("flash_semicrf.streaming")
    inp = make_inputs(3, 30, 5, 4, lengths="ragged", duration_transitions=dt, proj=proj, seed=107)
    up = random_upstream(3, seed=14)
    a, b = with_grad(inp), with_grad(inp)
    ours = fwd(a)
    theirs = fs.semi_crf_streaming_forward(**b, use_triton=False)
    assert_close(ours, theirs, msg="log Z")
    got_g, want_g = grads_of(ours, a, up), grads_of(theirs, b, up)
    for name in want_g:
        assert_close(got_g[name], want_g[name], msg=f"d logZ / d {name}")
    # flash-semicrf's max semiring maximises the first segment's phantom predecessor
    # (max_{c'} Tr[c', c]) where ours marginalises it (the model's MAP): with every column of the
    # transition constant the two differ by exactly log C
    flat = dict(inp, transition=inp["transition"][..., :1, :].expand_as(inp["transition"]).contiguous())
    C = inp["cum_scores"].shape[-1]
    assert_close(fwd(flat, semiring="max"),
                 fs.semi_crf_streaming_forward(**flat, semiring="max", use_triton=False) + math.log(C),
                 msg="max score")


def test_backward_twice_and_partial_upstream_gradients():
    inp = make_inputs(4, 18, 4, 3, lengths=[18, 9, 1, 12], proj="both", seed=108)
    a = with_grad(inp)
    out = fwd(a)
    up = random_upstream(4, seed=15)
    (out * up).sum().backward(retain_graph=True)
    first = {k: a[k].grad.clone() for k in DIFFERENTIABLE}
    (out * up).sum().backward()
    for k in DIFFERENTIABLE:
        assert_close(a[k].grad, 2 * first[k], msg=f"second backward of {k}")
    # an upstream gradient that is zero for some sequences (and reaches the Function non-contiguous)
    b = with_grad(inp)
    out_b = fwd(b)
    got = grads_of(out_b[::2], b, up[::2])
    c = with_grad(inp)
    mask = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=F64)
    want = grads_of(naive_semi_crf(**c), c, up * mask)
    for k in want:
        assert_close(got[k], want[k], msg=k)


@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
@pytest.mark.parametrize("B,T,K,C,interval", [(2, 150, 32, 16, 151), (2, 20, 3, 33, None)],
                         ids=["B2-T150-K32-C16-one_interval", "B2-T20-K3-C33"])
def test_wide_problems_match_naive_dp(B, T, K, C, interval, dt):
    # large K·C·C over one long interval: the engine splits its gradient accumulation into blocks
    inp = make_inputs(B, T, K, C, lengths=[T, T // 2 + 1], duration_transitions=dt, proj="both", seed=109)
    up = random_upstream(B, seed=16)
    a, b = with_grad(inp), with_grad(inp)
    out, want = fwd(a, checkpoint_interval=interval), naive_semi_crf(**b)
    assert_close(out, want, msg="log Z")
    got_g, want_g = grads_of(out, a, up), grads_of(want, b, up)
    for name in want_g:
        assert_close(got_g[name], want_g[name], msg=f"d logZ / d {name}")


def test_factored_and_direct_recurrences_agree():
    # a (K, C, C) transition with identical slices is the (C, C) one: the direct recurrence must
    # reproduce the factored one, and its gradient summed over durations must equal the (C, C) one
    inp = make_inputs(3, 40, 6, 4, lengths=[40, 27, 3], proj="both", seed=110)
    K = inp["K"]
    kcc = dict(inp, transition=inp["transition"].expand(K, -1, -1).clone())
    up = random_upstream(3, seed=17)
    a, b = with_grad(inp), with_grad(kcc)
    out_a, out_b = fwd(a), fwd(b)
    assert_close(out_b, out_a, msg="log Z")
    ga, gb = grads_of(out_a, a, up), grads_of(out_b, b, up)
    for name in ("cum_scores", "duration_bias", "proj_start", "proj_end"):
        assert_close(gb[name], ga[name], msg=name)
    assert_close(gb["transition"].sum(0), ga["transition"], msg="transition")
    ma = semi_crf_streaming_marginals(**inp, backend=BACKEND)
    mb = semi_crf_streaming_marginals(**kcc, backend=BACKEND)
    for x, y, name in zip(ma, mb, ma._fields):
        assert_close(y, x, msg=name)
    va = semi_crf_streaming_viterbi(**inp, backend=BACKEND)
    vb = semi_crf_streaming_viterbi(**kcc, backend=BACKEND)
    assert_close(vb.scores, va.scores, msg="viterbi")
    assert va.segments == vb.segments
