"""Decoding is the model's MAP, impossible inputs give -inf, and the head's input contract.

* Viterbi (CPU path and Triton kernels, both transition shapes) returns a maximiser of the
  probability whose log-partition log Z computes: the first segment keeps the phantom term
  ``logsumexp_{c'} Tr[c', c]``, and the score is that segmentation's score.
* A sequence with no allowed segmentation: log Z = -inf, Viterbi score -inf with labels -1 and no
  segments, marginals 0, gradients 0 and finite; the rest of the batch is unaffected.
* An infeasible prefix (positions that no segmentation reaches) costs the float32 kernels no
  precision.
* The head raises clear errors for forbidden gold segmentations and malformed input, accepts what
  it should (NaN padding, numpy integers), and computes a float64 head in float64.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import CPU_BACKENDS, assert_close, make_inputs, random_upstream
from torch_semimarkov import SemiMarkovCRFHead, labels_to_segments
from torch_semimarkov.oracle import brute_force
from torch_semimarkov.streaming import (
    semi_crf_streaming_forward,
    semi_crf_streaming_marginals,
    semi_crf_streaming_viterbi,
)
from torch_semimarkov.core.segments import Segment
from torch_semimarkov.core.validation import validate_streaming_inputs

F64 = torch.float64
NEG = -math.inf


def _proj(inp, b, key):
    return None if inp[key] is None else inp[key][b]


def _scorer(inp, b):
    """``_seg_score(inp, b, .)`` with the model's tables read once (as Python floats; the same
    float64 additions in the same order as reading them per segment), for the enumerations."""
    S = inp["cum_scores"][b].double()
    Tr = inp["transition"].double()
    Tr = torch.where(Tr <= -1e9, torch.full_like(Tr, NEG), Tr)
    D = inp["duration_bias"].double()
    D = torch.where(D <= -1e9, torch.full_like(D, NEG), D)
    ps, pe = _proj(inp, b, "proj_start"), _proj(inp, b, "proj_end")
    S_, D_ = S.tolist(), D.tolist()
    ps_ = None if ps is None else ps.tolist()
    pe_ = None if pe is None else pe.tolist()
    Ms = [Tr] if Tr.dim() == 2 else list(Tr)
    M_ = [M.tolist() for M in Ms]
    first = [[float(torch.logsumexp(M[:, c], 0)) for c in range(M.shape[1])] for M in Ms]

    def score(segs):
        total, prev = 0.0, None
        for s, e, c in segs:
            k = e - s
            m = 0 if len(Ms) == 1 else k - 1
            total += (S_[e][c] - S_[s][c]) + D_[k - 1][c]
            total += 0.0 if ps_ is None else ps_[s][c]
            total += 0.0 if pe_ is None else pe_[e - 1][c]
            total += first[m][c] if prev is None else M_[m][prev][c]
            prev = c
        return total

    return score


def _seg_score(inp, b, segs):
    """Unnormalised log-probability of one segmentation, written here from the model's definition
    (independent of the library): the first segment's phantom term is logsumexp of the
    transition column; a forbidden entry (-inf or <= -1e9) makes it -inf."""
    return _scorer(inp, b)(segs)


def _all_segmentations(L, K, C):
    if L == 0:
        yield []
        return
    for k in range(1, min(K, L) + 1):
        for c in range(C):
            for rest in _all_segmentations(L - k, K, C):
                yield [Segment(0, k, c)] + [Segment(s + k, e + k, d) for s, e, d in rest]


def _best_by_enumeration(inp, b):
    """(best log-probability score, log Z) of sequence b by enumerating every segmentation."""
    L, K, C = int(inp["lengths"][b]), inp["K"], inp["cum_scores"].shape[-1]
    score = _scorer(inp, b)
    scores = [score(segs) for segs in _all_segmentations(L, K, C)]
    return max(scores), float(torch.logsumexp(torch.tensor(scores, dtype=F64), 0))


def random_problem(seed: int):
    """A random small problem with every option: both transition shapes, projections, ragged
    lengths, -inf entries (transition, duration bias and projections), K = 1 and K > T."""
    rng = np.random.default_rng(seed)
    T = int(rng.integers(1, 7))
    K = int(rng.choice([1, 2, 3, T, T + 2]))
    C = int(rng.integers(1, 4))
    B = int(rng.integers(1, 4))
    lengths = [T] + [int(x) for x in rng.integers(1, T + 1, size=B - 1)]
    inp = make_inputs(B, T, max(K, 1), C, lengths=lengths, duration_transitions=bool(rng.random() < 0.4),
                      proj=str(rng.choice(["none", "start", "end", "both"])), seed=seed,
                      scale=float(rng.choice([0.5, 1.0, 3.0])))
    p_inf = float(rng.choice([0.0, 0.15, 0.35]))
    for key in ("transition", "duration_bias", "proj_start", "proj_end"):
        if inp[key] is None:
            continue
        # a forbidden projection entry: no segment of that label starts / ends there
        t = inp[key].clone()
        t[torch.from_numpy(rng.random(tuple(t.shape)) < p_inf)] = NEG
        inp[key] = t
    return inp


# ---------------------------------------------------------------------------------------------
# 1. Viterbi is the MAP of the model
# ---------------------------------------------------------------------------------------------


def test_the_audits_smallest_case():
    cum = torch.zeros(1, 2, 2, dtype=F64)
    tr = torch.tensor([[0.0, 0.5], [0.0, -5.0]], dtype=F64)  # [c_src, c_dst]
    db = torch.zeros(1, 2, dtype=F64)
    L = torch.tensor([1])
    res = semi_crf_streaming_viterbi(cum, tr, db, L, 1)
    m = semi_crf_streaming_marginals(cum, tr, db, L, 1)
    assert m.position[0, 0, 0] > m.position[0, 0, 1]  # label 0 is the more probable
    assert res.segments == [[Segment(0, 1, 0)]]
    assert math.isclose(float(res.scores[0]), math.log(2.0), rel_tol=1e-14)  # logsumexp of column 0
    # the max semiring's gradient follows the same definition: softmax of the column, not argmax
    trg = tr.clone().requires_grad_(True)
    score = semi_crf_streaming_forward(cum, trg, db, L, 1, semiring="max")
    score.sum().backward()
    assert_close(trg.grad, torch.tensor([[0.5, 0.0], [0.5, 0.0]], dtype=F64))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("chunk", range(10))
def test_viterbi_is_a_maximiser_of_the_probability(chunk, backend):
    """550 random problems (55 per chunk) against brute-force enumeration of P(segmentation)."""
    for i in range(55):
        seed = 1000 + chunk * 55 + i
        inp = random_problem(seed)
        res = semi_crf_streaming_viterbi(**inp, backend=backend)
        score = semi_crf_streaming_forward(**inp, semiring="max", backend=backend)
        for b, L in enumerate(inp["lengths"].tolist()):
            best, log_z = _best_by_enumeration(inp, b)
            if best == NEG:
                assert res.scores[b] == NEG and score[b] == NEG and res.segments[b] == [], f"seed {seed} seq {b}"
                continue
            got = _seg_score(inp, b, res.segments[b])
            assert math.isclose(got, best, rel_tol=1e-9, abs_tol=1e-9), f"seed {seed} seq {b}: {got} < {best}"
            assert math.isclose(float(res.scores[b]), got, rel_tol=1e-9, abs_tol=1e-9), f"seed {seed} seq {b}"
            assert math.isclose(float(score[b]), got, rel_tol=1e-9, abs_tol=1e-9), f"seed {seed} seq {b}"
            # the best segmentation is a probability: exp(score - log Z) <= 1
            assert got <= log_z + 1e-12


def _triton():
    pytest.importorskip("triton")
    from torch_semimarkov.engines.triton import launch

    return launch


def _plan(launch, v, semiring, engine):
    return launch.plan_for(v.cum_scores, v.transition, v.K, semiring, time_parallel=None if engine == "parallel" else False)


@pytest.mark.parametrize("seed", range(40))
def test_triton_viterbi_is_a_maximiser_of_the_probability(seed, engine):
    launch = _triton()
    inp = random_problem(5000 + seed)
    f32 = {k: (x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x) for k, x in inp.items()}
    v32 = validate_streaming_inputs(**f32)
    scores, labels, starts = launch.launch_viterbi(
        v32.cum_scores, v32.transition, v32.duration_bias, v32.lengths, v32.K, v32.proj_start, v32.proj_end,
        plan=_plan(launch, v32, "max", engine))
    for b, L in enumerate(inp["lengths"].tolist()):
        best, _ = _best_by_enumeration(inp, b)
        if best == NEG:
            assert scores[b] == NEG and bool((labels[b] == -1).all()) and not bool(starts[b].any())
            continue
        lab, st = labels[b].numpy(), starts[b].numpy()
        begin = np.flatnonzero(st[:L]).tolist()
        segs = [Segment(s, e, int(lab[s])) for s, e in zip(begin, begin[1:] + [L])]
        got = _seg_score(inp, b, segs)
        assert math.isclose(got, best, rel_tol=1e-5, abs_tol=1e-5), f"seq {b}"
        assert math.isclose(float(scores[b]), got, rel_tol=1e-5, abs_tol=1e-5)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("seed", range(12))
def test_head_decode_score_is_the_gold_score_of_the_decoded_segmentation(seed, backend):
    rng = np.random.default_rng(seed)
    C, K, T, H = int(rng.integers(2, 4)), int(rng.integers(1, 5)), 6, 3
    allowed = torch.from_numpy(rng.random((C, C)) < 0.7)
    allowed[0] = True  # every label can be entered from label 0
    head = SemiMarkovCRFHead(C, K, hidden_dim=H, transition=str(rng.choice(["static", "duration"])),
                             allowed_transitions=allowed, boundary_scores=bool(rng.random() < 0.5),
                             cumsum_dtype=F64, backend=backend).to(F64)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 1.0)
    h = torch.randn(3, T, H, dtype=F64)
    lengths = torch.tensor([T, 4, 1])
    res = head.decode(h, lengths)
    gold = head.gold_score(h, lengths, segments=[[tuple(s) for s in segs] for segs in res.segments])
    assert_close(res.scores, gold.detach())
    out = head.build(h, lengths)
    inp = {"cum_scores": out.cum_scores.detach(), "transition": out.transition.detach(),
           "duration_bias": out.duration_bias.detach(), "lengths": lengths, "K": K,
           "proj_start": None if out.proj_start is None else out.proj_start.detach(),
           "proj_end": None if out.proj_end is None else out.proj_end.detach()}
    assert_close(res.scores, torch.tensor([_best_by_enumeration(inp, b)[0] for b in range(3)], dtype=F64))


# ---------------------------------------------------------------------------------------------
# 2. Impossible sequences
# ---------------------------------------------------------------------------------------------


def _impossible_batch(dt: bool):
    """Four sequences; only durations 2 and 4 are allowed, so odd lengths have no segmentation.
    Sequence 3 (length 6) is possible only through a transition that is allowed."""
    inp = make_inputs(4, 7, 4, 3, lengths=[7, 4, 3, 6], duration_transitions=dt, proj="both", seed=77)
    db = inp["duration_bias"].clone()
    db[0] = NEG
    db[2] = NEG
    inp["duration_bias"] = db
    tr = inp["transition"].clone()
    tr[..., 1, 2] = NEG
    inp["transition"] = tr
    return inp, [True, False, True, False]


def _alone(inp, b):
    """The inputs of sequence b alone (its own batch of one)."""
    out = dict(inp)
    for key in ("cum_scores", "proj_start", "proj_end"):
        if inp[key] is not None:
            out[key] = inp[key][b : b + 1]
    out["lengths"] = inp["lengths"][b : b + 1]
    return out


def _check_impossible(inp, dead, forward, backward, viterbi, rtol=1e-9):
    """forward(inp) -> log Z; backward(inp, upstream) -> dict of grads; viterbi(inp) -> (scores, labels, starts)."""
    B = len(dead)
    dead_t = torch.tensor(dead)
    log_z = forward(inp)
    assert bool(torch.isneginf(log_z[dead_t]).all()), log_z
    assert bool(torch.isfinite(log_z[~dead_t]).all()), log_z
    bf = brute_force(**inp)
    assert_close(log_z[~dead_t].double(), bf.log_Z[~dead_t], atol=rtol, rtol=rtol)
    up = random_upstream(B)
    # the -inf rows get zero upstream gradient, as a loss that masks them would give
    up = torch.where(dead_t, torch.zeros_like(up), up)
    grads = backward(inp, up)
    for name, g in grads.items():
        assert bool(torch.isfinite(g).all()), name
        if name in ("cum_scores", "proj_start", "proj_end"):
            assert float(g[dead_t].abs().sum()) == 0.0, name
    alive = [b for b in range(B) if not dead[b]]
    sub = dict(inp)
    for key in ("cum_scores", "proj_start", "proj_end"):
        if inp[key] is not None:
            sub[key] = inp[key][alive]
    sub["lengths"] = inp["lengths"][alive]
    want = backward(sub, up[alive])
    for name in ("transition", "duration_bias"):
        assert_close(grads[name], want[name], atol=rtol, rtol=rtol, msg=name)
    scores, labels, starts = viterbi(inp)
    assert bool(torch.isneginf(scores[dead_t]).all())
    assert bool((labels[dead_t] == -1).all()) and not bool(starts[dead_t].any())
    assert_close(scores[~dead_t].double(), bf.max_score[~dead_t], atol=rtol, rtol=rtol)


def _cpu_backward(inp, up, semiring="log", backend="torch"):
    leaves = {k: inp[k].detach().clone().requires_grad_(True)
              for k in ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end") if inp[k] is not None}
    kw = dict(inp, **leaves)
    out = semi_crf_streaming_forward(**kw, semiring=semiring, backend=backend)
    torch.where(up > 0, out * up.to(out.dtype), torch.zeros_like(out)).sum().backward()
    return {k: v.grad for k, v in leaves.items()}


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
def test_impossible_sequences_cpu(dt, backend):
    inp, dead = _impossible_batch(dt)
    _check_impossible(
        inp, dead,
        forward=lambda x: semi_crf_streaming_forward(**x, backend=backend),
        backward=lambda x, up: _cpu_backward(x, up, backend=backend),
        viterbi=lambda x: (lambda r: (r.scores, r.labels, _starts(r)))(semi_crf_streaming_viterbi(**x, backend=backend)),
    )
    res = semi_crf_streaming_viterbi(**inp, backend=backend)
    for b in range(4):
        assert (res.segments[b] == []) == dead[b]
    # marginals: zero (never NaN) for the impossible sequences, the oracle's elsewhere
    m = semi_crf_streaming_marginals(**inp, backend=backend)
    bf = brute_force(**inp)
    dead_t = torch.tensor(dead)
    for t in (m.start, m.end, m.position, m.boundary):
        assert not bool(torch.isnan(t).any())
        assert float(t[dead_t].abs().sum()) == 0.0
    assert_close(m.position[~dead_t], bf.position[~dead_t])
    assert bool(torch.isneginf(m.log_Z[dead_t]).all())
    # the max semiring with gradients: -inf and zero, finite gradients for those rows
    g = _cpu_backward(inp, torch.where(dead_t, 0.0, 1.0).double(), semiring="max", backend=backend)
    for name, grad in g.items():
        assert bool(torch.isfinite(grad).all()), name


def _starts(res):
    T = res.labels.shape[1]
    st = torch.zeros(len(res.segments), T, dtype=torch.bool)
    for b, segs in enumerate(res.segments):
        for s, _, _ in segs:
            st[b, s] = True
    return st


def test_forbidden_everywhere_gives_minus_inf_for_every_sequence():
    inp = make_inputs(2, 5, 3, 2, lengths=[5, 2], seed=3)
    inp["transition"] = torch.full_like(inp["transition"], NEG)  # no label can even start
    assert bool(torch.isneginf(semi_crf_streaming_forward(**inp)).all())
    res = semi_crf_streaming_viterbi(**inp)
    assert res.segments == [[], []] and bool(torch.isneginf(res.scores).all())
    m = semi_crf_streaming_marginals(**inp)
    assert float(m.position.abs().sum()) == 0.0 and not bool(torch.isnan(m.position).any())


def test_values_at_or_below_neg_inf_forbid_exactly():
    # -1e9 (the exported NEG_INF) forbids like -inf: log Z is exactly the same
    inp = make_inputs(2, 6, 3, 3, lengths=[6, 3], seed=4)
    a, b = dict(inp), dict(inp)
    tr = inp["transition"].clone()
    tr[0, 1] = NEG
    a["transition"] = tr
    tr2 = tr.clone()
    tr2[0, 1] = -1e9
    b["transition"] = tr2
    assert torch.equal(semi_crf_streaming_forward(**a), semi_crf_streaming_forward(**b))
    assert_close(semi_crf_streaming_forward(**a), brute_force(**a).log_Z)


def _triton_fns(launch, engine):
    """forward, backward (dict of gradients of sum(up * log Z)) and viterbi through the kernels."""

    def val(x):
        x32 = {k: (t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t) for k, t in x.items()}
        return validate_streaming_inputs(**x32)

    def forward(x):
        v = val(x)
        return launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, "log", v.proj_start,
                                     v.proj_end, plan=_plan(launch, v, "log", engine), save_for_backward=False)[0]

    def backward(x, up):
        v = val(x)
        plan = _plan(launch, v, "log", engine)
        z, state = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, "log",
                                         v.proj_start, v.proj_end, plan=plan)
        p_start, p_end, g_tr, g_db = launch.launch_backward(
            v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, v.proj_start, v.proj_end, plan=plan,
            state=state)
        for t in (p_start, p_end, g_tr, g_db):
            assert not bool(torch.isnan(t).any())
        w = up.float()
        grad_cum = torch.zeros_like(v.cum_scores)
        grad_cum[:, 1:] += p_end * w[:, None, None]
        grad_cum[:, :-1] -= p_start * w[:, None, None]
        return {"cum_scores": grad_cum, "proj_start": p_start * w[:, None, None], "proj_end": p_end * w[:, None, None],
                "transition": torch.einsum("b...,b->...", g_tr.double(), up),
                "duration_bias": torch.einsum("bkc,b->kc", g_db.double(), up)}

    def viterbi(x):
        v = val(x)
        return launch.launch_viterbi(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, v.proj_start,
                                     v.proj_end, plan=_plan(launch, v, "max", engine))

    return forward, backward, viterbi


@pytest.mark.parametrize("dt", [False, True], ids=["CC", "KCC"])
def test_impossible_sequences_triton(dt, engine):
    launch = _triton()
    inp, dead = _impossible_batch(dt)
    forward, backward, viterbi = _triton_fns(launch, engine)
    _check_impossible(inp, dead, forward, backward, viterbi, rtol=2e-5)


def _forbidden_projection_problem(seed):
    """Random small problem with both projections, 30 % of their entries -inf."""
    rng = np.random.default_rng(seed)
    T = int(rng.integers(2, 7))
    K = int(rng.choice([1, 2, 3, T]))
    C = int(rng.integers(1, 4))
    inp = make_inputs(3, T, K, C, lengths=[T] + [int(x) for x in rng.integers(1, T + 1, size=2)],
                      duration_transitions=bool(seed % 3 == 0), proj="both", seed=seed)
    for key in ("proj_start", "proj_end"):
        t = inp[key].clone()
        t[torch.from_numpy(rng.random(tuple(t.shape)) < 0.3)] = NEG
        inp[key] = t
    return inp


def _oracle_grads(inp, up):
    leaves = {k: inp[k].detach().clone().requires_grad_(True)
              for k in ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")}
    bf = brute_force(**dict(inp, **leaves))
    ok = torch.isfinite(bf.log_Z)
    torch.where(ok, bf.log_Z * up, torch.zeros_like(up)).sum().backward()
    return bf, {k: v.grad for k, v in leaves.items()}


def _check_forbidden_projections(inp, forward, backward, viterbi, tol):
    dead = torch.isneginf(brute_force(**inp).log_Z)
    up = torch.where(dead, 0.0, random_upstream(3).double())
    bf, want = _oracle_grads(inp, up)
    log_z = forward(inp).double()
    assert torch.equal(torch.isneginf(log_z), dead)
    assert_close(log_z[~dead], bf.log_Z[~dead], atol=tol, rtol=tol)
    got = backward(inp, up)
    for name in ("cum_scores", "proj_start", "proj_end", "transition", "duration_bias"):
        assert_close(got[name].double(), want[name], atol=tol, rtol=tol, msg=name)
    # no probability where a projection forbids
    for name in ("proj_start", "proj_end"):
        assert float(got[name][inp[name] == NEG].abs().sum()) == 0.0, name
    scores = viterbi(inp)[0].double()
    assert torch.equal(torch.isneginf(scores), dead)
    assert_close(scores[~dead], bf.max_score[~dead], atol=tol, rtol=tol)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("seed", range(8))
def test_forbidden_projection_entries_cpu(seed, backend):
    """-inf in proj_start / proj_end forbids a segment to start / end there with that label."""
    _check_forbidden_projections(
        _forbidden_projection_problem(seed),
        forward=lambda x: semi_crf_streaming_forward(**x, backend=backend),
        backward=lambda x, up: _cpu_backward(x, up, backend=backend),
        viterbi=lambda x: (semi_crf_streaming_viterbi(**x, backend=backend).scores,),
        tol=1e-9,
    )


@pytest.mark.parametrize("seed", range(8))
def test_forbidden_projection_entries_triton(seed, engine):
    forward, backward, viterbi = _triton_fns(_triton(), engine)
    _check_forbidden_projections(_forbidden_projection_problem(seed), forward, backward, viterbi, tol=2e-5)


def test_an_infeasible_prefix_costs_the_float32_kernels_no_precision(engine, monkeypatch):
    """Only durations 3 and 6: positions that are not multiples of 3 have no segmentation ending
    there. The normaliser never moves by an impossible value, so float32 stays accurate."""
    launch = _triton()
    # 16 feasible positions, 4 chunks of 12 in the time-parallel engine; the interpreter's cost
    # grows with T and the number of chunks. A normaliser that shifts by the impossible value
    # (possible_shift returning its argument) fails this case as it failed T = 150 (25 chunks):
    # log Z off by far more than rtol 1e-6, on both engines.
    from torch_semimarkov.engines.triton import plan as plan_mod

    if engine == "parallel":
        monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 12)
    B, T, K, C = 2, 48, 6, 2
    inp = make_inputs(B, T, K, C, lengths=[48, 27], proj="both", seed=12)
    db = inp["duration_bias"].clone()
    db[[0, 1, 3, 4]] = NEG
    inp["duration_bias"] = db
    want = semi_crf_streaming_forward(**inp, backend="torch")
    m = semi_crf_streaming_marginals(**inp, backend="torch")
    x32 = {k: (t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t) for k, t in inp.items()}
    v = validate_streaming_inputs(**x32)
    plan = _plan(launch, v, "log", engine)
    assert plan.n_chunks == (4 if engine == "parallel" else 1)
    z, state = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, K, "log", v.proj_start,
                                     v.proj_end, plan=plan)
    assert_close(z.double(), want, atol=0, rtol=1e-6, msg="log Z")
    p_start, p_end, _, _ = launch.launch_backward(v.cum_scores, v.transition, v.duration_bias, v.lengths, K,
                                                  v.proj_start, v.proj_end, plan=plan, state=state)
    assert_close(p_start.double(), m.start, atol=1e-4, rtol=0, msg="P_start")
    assert_close(p_end.double(), m.end, atol=1e-4, rtol=0, msg="P_end")
    # the CPU paths in float32 too
    for backend in CPU_BACKENDS:
        z_cpu = semi_crf_streaming_forward(**x32, backend=backend)
        assert_close(z_cpu.double(), want, atol=0, rtol=1e-6, msg=f"CPU float32 log Z ({backend})")


# ---------------------------------------------------------------------------------------------
# 3. Forbidden gold segmentations and impossible sequences in the head
# ---------------------------------------------------------------------------------------------


def test_gold_with_a_forbidden_duration_raises_naming_sequence_position_and_reason():
    head = SemiMarkovCRFHead(2, 5, duration=lambda k: torch.where(k < 3, NEG, 0.0), use_triton=False)
    h = torch.randn(2, 8, 2)
    labels = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 1, 1]])
    with pytest.raises(ValueError, match=r"sequence 1 has a segment \[4, 6\) of label 0 \(duration 2\).*duration is forbidden"):
        head.compute_loss(h, torch.tensor([8, 8]), labels)
    loss = head.compute_loss(h, torch.tensor([8, 8]), labels, reduction="none", zero_infinity=True)
    loss = loss.detach()
    assert float(loss[1]) == 0.0 and math.isfinite(float(loss[0])) and float(loss[0]) > 0


def test_gold_whose_first_label_cannot_start_raises():
    head = SemiMarkovCRFHead(3, 4, use_triton=False)
    with torch.no_grad():
        head.transition[:, 2] = NEG  # nothing may move into label 2, not even the phantom start
    with pytest.raises(ValueError, match=r"sequence 0 has a segment \[0, 2\) of label 2.*cannot start a sequence"):
        head.compute_loss(torch.randn(1, 4, 3), torch.tensor([4]), torch.tensor([[2, 2, 0, 0]]))


def test_head_names_the_impossible_sequence_or_zeroes_it_on_request():
    # only duration 2: an odd length has no segmentation at all
    head = SemiMarkovCRFHead(2, 2, hidden_dim=3, duration=lambda k: torch.where(k == 2, 0.0, NEG), use_triton=False)
    h = torch.randn(2, 4, 3, requires_grad=True)
    lengths = torch.tensor([4, 3])
    labels = torch.tensor([[0, 0, 1, 1], [0, 0, 1, -100]])
    with pytest.raises(ValueError, match=r"sequence 1 \(length 3\) has no segmentation that the model allows"):
        head.compute_loss(h, lengths, labels)
    loss = head.compute_loss(h, lengths, labels, reduction="none", zero_infinity=True)
    assert float(loss[1].detach()) == 0.0 and math.isfinite(float(loss[0].detach()))
    loss.sum().backward()
    assert bool(torch.isfinite(h.grad).all())
    assert all(bool(torch.isfinite(p.grad).all()) for p in head.parameters() if p.grad is not None)
    out = head(h.detach(), lengths)
    assert math.isfinite(float(out.partition[0].detach())) and float(out.partition[1].detach()) == NEG


# ---------------------------------------------------------------------------------------------
# 4. The head's input contract
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def head3():
    torch.manual_seed(0)
    return SemiMarkovCRFHead(3, 4, hidden_dim=5, use_triton=False)


@pytest.mark.parametrize("method", ["compute_loss", "decode", "marginals"])
def test_empty_batch_names_hidden_states(head3, method):
    h = torch.randn(0, 6, 5)
    args = (h, torch.zeros(0, dtype=torch.long))
    kwargs = {"labels": torch.zeros(0, 6, dtype=torch.long)} if method == "compute_loss" else {}
    with pytest.raises(ValueError, match="hidden_states must hold at least one sequence"):
        getattr(head3, method)(*args, **kwargs)


def test_missing_lengths_is_a_clear_error(head3):
    with pytest.raises(TypeError, match="pass lengths .* or mask"):
        head3.decode(torch.randn(2, 6, 5), None)


def test_plus_inf_in_hidden_states_is_named(head3):
    h = torch.randn(2, 6, 5)
    h[1, 3, 0] = math.inf
    with pytest.raises(ValueError, match=r"hidden_states contains (infinite|NaN) values.*sequence 1, position 3"):
        head3(h, torch.tensor([6, 6]))


@pytest.mark.parametrize("segments,exc,match", [
    ([[(0, 6)], [(0, 4, 1)]], ValueError, r"\(start, end, label\) triple"),
    ([[(0, 3, 1), (3, 6, 0)], 7], TypeError, r"segments\[1\] must be a list"),
    ("nope", TypeError, "segments must be a list"),
    ([[(0, 1.7, 1), (1.7, 6, 0)], [(0, 4, 1)]], TypeError, "end must be an integer"),
    ([[(0, 3.0, 1), (3, 6, 0)], [(0, 4, 1)]], TypeError, "end must be an integer"),
])
def test_malformed_segments_are_named(head3, segments, exc, match):
    with pytest.raises(exc, match=match):
        head3.compute_loss(torch.randn(2, 6, 5), torch.tensor([6, 4]), segments=segments)


def test_segments_accept_numpy_and_tensor_integers(head3):
    h, lengths = torch.randn(2, 6, 5), torch.tensor([6, 4])
    plain = head3.compute_loss(h, lengths, segments=[[(0, 3, 1), (3, 6, 0)], [(0, 4, 2)]])
    np_ints = [[(np.int64(0), np.int64(3), np.int32(1)), (3, 6, 0)], [(torch.tensor(0), torch.tensor(4), 2)]]
    assert torch.equal(plain, head3.compute_loss(h, lengths, segments=np_ints))


@pytest.mark.parametrize("value,exc", [(2.5, TypeError), (0, ValueError), (True, TypeError)])
def test_max_duration_must_be_a_positive_integer(value, exc):
    with pytest.raises(exc, match="max_duration"):
        SemiMarkovCRFHead(3, value)


def test_numpy_integer_k_is_accepted():
    inp = make_inputs(2, 6, 3, 2, lengths=[6, 4], seed=5)
    want = semi_crf_streaming_forward(**inp)
    inp["K"] = np.int64(3)
    assert torch.equal(semi_crf_streaming_forward(**inp), want)
    head = SemiMarkovCRFHead(2, np.int64(3), use_triton=False)
    assert head.max_duration == 3 and isinstance(head.max_duration, int)


def test_integer_cum_scores_are_named_without_talk_of_half_precision():
    inp = make_inputs(1, 4, 2, 2, seed=6)
    inp["cum_scores"] = inp["cum_scores"].long()
    with pytest.raises(ValueError, match="cum_scores must be a float32 or float64 tensor, got dtype torch.int64") as err:
        semi_crf_streaming_forward(**inp)
    assert "half" not in str(err.value)


def test_cum_scores_without_the_zero_row_gets_a_hint():
    scores = torch.randn(1, 5, 2)
    with pytest.raises(ValueError, match=r"must have T\+1 rows with row 0 = 0.*leading zero row"):
        semi_crf_streaming_forward(scores.cumsum(1), torch.zeros(2, 2), torch.zeros(3, 2), torch.tensor([5]), 3)


def test_labels_to_segments_rejects_lengths_past_t():
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, T\] = \[0, 3\]"):
        labels_to_segments(torch.tensor([[0, 1, 1]]), torch.tensor([5]))


def test_nan_and_inf_at_padding_do_not_raise_or_leak(head3):
    h = torch.randn(2, 6, 5, dtype=torch.float32)
    lengths = torch.tensor([6, 3])
    labels = torch.tensor([[0, 0, 1, 1, 2, 2], [1, 1, 0, -100, -100, -100]])
    clean = head3.compute_loss(h, lengths, labels, reduction="none")
    dirty_h = h.clone()
    dirty_h[1, 3] = math.nan
    dirty_h[1, 4] = math.inf
    dirty_h[1, 5] = -math.inf
    dirty_h.requires_grad_(True)
    dirty = head3.compute_loss(dirty_h, lengths, labels, reduction="none")
    assert torch.equal(clean.detach(), dirty.detach())
    dirty.sum().backward()
    assert bool(torch.isfinite(dirty_h.grad).all()) and float(dirty_h.grad[1, 3:].abs().sum()) == 0.0
    assert all(bool(torch.isfinite(p.grad).all()) for p in head3.parameters() if p.grad is not None)
    assert torch.equal(head3.decode(h, lengths).labels, head3.decode(dirty_h.detach(), lengths).labels)
    assert torch.equal(head3.marginals(h, lengths).position, head3.marginals(dirty_h.detach(), lengths).position)


# ---------------------------------------------------------------------------------------------
# 5. A float64 head computes in float64
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("duration", ["uniform", "geometric", "poisson", "negative_binomial", "callable"])
def test_float64_head_duration_tables_and_nll_are_float64(duration):
    K, C = 5, 2
    dur = (lambda k: -0.37 * k + torch.log(k)) if duration == "callable" else duration
    head = SemiMarkovCRFHead(C, K, duration=dur, cumsum_dtype=F64, use_triton=False)
    scores = torch.randn(1, 5, C, dtype=F64)
    lengths = torch.tensor([5])
    out = head.build(scores, lengths)
    k = torch.arange(1, K + 1, dtype=F64)[:, None]
    # what the engine receives: the table plus the exact compensation of the per-label centring
    table = out.duration_bias - k * scores[0].mean(0)
    assert out.duration_bias.dtype == F64
    if duration == "uniform":
        want = torch.full((K, C), -math.log(K), dtype=F64)
    elif duration == "callable":
        want = (-0.37 * k + torch.log(k)).expand(K, C)
    else:
        dist = head.duration_dist
        params = {n: p.detach().double() for n, p in dist.named_parameters()}
        if duration == "geometric":
            lp = torch.nn.functional.logsigmoid(params["logit_p"])
            lq = torch.nn.functional.logsigmoid(-params["logit_p"])
            raw = lp + (k - 1) * lq
        elif duration == "poisson":
            rate = torch.nn.functional.softplus(params["raw_rate"])
            raw = (k - 1) * torch.log(rate) - rate - torch.lgamma(k)
        else:
            r = torch.nn.functional.softplus(params["raw_shape"])
            lp = torch.nn.functional.logsigmoid(params["logit_p"])
            lq = torch.nn.functional.logsigmoid(-params["logit_p"])
            raw = torch.lgamma(k - 1 + r) - torch.lgamma(r) - torch.lgamma(k) + r * lp + (k - 1) * lq
        want = torch.log_softmax(raw, dim=0)
    assert_close(table.detach(), want, atol=1e-14, rtol=1e-14)
    # the NLL of a gold segmentation against float64 enumeration written here
    raw = torch.cat([scores.new_zeros(1, 1, C), scores.cumsum(1)], 1)  # the model of the raw scores
    inp = {"cum_scores": raw, "transition": out.transition.detach(), "duration_bias": want,
           "lengths": lengths, "K": K, "proj_start": None, "proj_end": None}
    segs = [Segment(0, 2, 1), Segment(2, 5, 0)]
    _, log_z = _best_by_enumeration(inp, 0)
    nll = head.compute_loss(scores, lengths, segments=[segs])
    assert abs(float(nll.detach()) - (log_z - _seg_score(inp, 0, segs))) < 1e-12


def test_scores_too_large_for_any_precision_are_named():
    inp = make_inputs(1, 4, 2, 2, seed=7)
    inp["duration_bias"] = inp["duration_bias"] * 1e16
    with pytest.raises(ValueError, match=r"duration_bias holds values of magnitude up to .*rescale"):
        semi_crf_streaming_forward(**inp)
    # forbidden entries are not magnitudes
    inp = make_inputs(1, 4, 2, 2, seed=7)
    inp["duration_bias"][0, 0] = -1e20
    assert torch.isfinite(semi_crf_streaming_forward(**inp)).all()
