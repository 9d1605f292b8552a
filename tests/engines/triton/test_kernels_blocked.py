"""The blocked memory-ring engine (``kernels/blocked.py``): the forward, beta, marginals,
gradients and Viterbi of rings too large for registers, forced at small sizes (tiles of a few
positions, rows and labels; chunks of a few positions, so every case takes several blocks, chunks,
fix-ups and repairs) against the oracles and the sequential kernels."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from conftest import assert_close
from kernel_cases import CASES, DEVICE, IDS, adversarial, cpu, inputs, record_outputs, to_device, validated
from torch_semimarkov.oracle import naive_semi_crf
from torch_semimarkov.engines.triton import launch, parallel
from torch_semimarkov.engines.triton import plan as plan_mod
from test_kernels_traceback import _check as check_viterbi

CC_CASES = [c for c in CASES if not c[-1]]
CC_IDS = [i for c, i in zip(CASES, IDS) if not c[-1]]


@pytest.fixture(params=[(4, 4, 2, 4), (2, 2, 4, None)], ids=["bt4-rb4-cb2-chunk4", "bt2-rb2-cb4-onechunk"])
def blocked(request, monkeypatch):
    """The blocked engine with small tiles: several chunks of 4 (or K) positions, or one chunk;
    marginal tiles of (BT, RB, CB) (starts, durations, labels) too."""
    bt, rb, cb, chunk = request.param
    monkeypatch.setattr(plan_mod, "FORCE_BLOCKED", True)
    monkeypatch.setattr(plan_mod, "BLOCK_OVERRIDE", (bt, rb, cb))
    monkeypatch.setattr(plan_mod, "MARG_OVERRIDE", (bt, rb, cb))
    if chunk is not None:
        monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", chunk)
    else:
        monkeypatch.setattr(plan_mod, "DEFAULT_SMS", 1)
    return request.param


def _small_blocked(monkeypatch, chunk=8):
    """The blocked engine forced at small sizes: (4, 4, 2) block and marginal tiles, chunks of ``chunk``."""
    monkeypatch.setattr(plan_mod, "FORCE_BLOCKED", True)
    monkeypatch.setattr(plan_mod, "BLOCK_OVERRIDE", (4, 4, 2))
    monkeypatch.setattr(plan_mod, "MARG_OVERRIDE", (4, 4, 2))
    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", chunk)


def _plan(v, semiring, backward=False):
    p = launch.plan_for(v.cum_scores, v.transition, v.K, semiring, backward=backward)
    assert p.kind == "mem" and p.time_parallel
    return p


@pytest.mark.parametrize("case", CC_CASES, ids=CC_IDS)
@pytest.mark.parametrize("semiring", ["log", "max"])
def test_blocked_forward_matches_oracle(case, semiring, blocked):
    inp = inputs(case, seed=1)
    v = validated(inp, semiring)
    z, _ = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, semiring,
                                 v.proj_start, v.proj_end, plan=_plan(v, semiring), save_for_backward=False)
    assert_close(cpu(z), naive_semi_crf(**inp, semiring=semiring), atol=1e-5, rtol=1e-6, msg=semiring)


@pytest.mark.parametrize("case", CC_CASES, ids=CC_IDS)
def test_blocked_backward_matches_sequential_kernels(case, blocked):
    """Marginals and gradients from the blocked forward and beta equal those of the sequential
    register-ring kernels (the same marginal kernels read both)."""
    v = validated(inputs(case, seed=2))
    z, got = _forward_backward(v, _plan(v, "log"))
    z2, want = _forward_backward(v, None)
    assert_close(cpu(z), cpu(z2), atol=1e-5, rtol=1e-6)
    _assert_grads_close(got, want)


@pytest.mark.parametrize("spacing", [2, 5])
def test_finer_anchors_keep_the_marginals(spacing, monkeypatch):
    """Anchors between the chunk boundaries (``plan.ANCHOR_SPACING``: chunks of 8 -> anchors every
    2 or 4 positions) normalise the marginals as well: they still match the sequential kernels."""
    _small_blocked(monkeypatch, chunk=8)
    monkeypatch.setattr(plan_mod, "ANCHOR_SPACING", spacing)
    case = next(c for c in CC_CASES if c[1] >= 2 * 8)
    v = validated(inputs(case, seed=4))
    p = _plan(v, "log", backward=True)
    assert plan_mod.anchor_spacing(p, v.cum_scores.shape[1] - 1) == {2: 2, 5: 4}[spacing]
    z, got = _forward_backward(v, p)
    z2, want = _forward_backward(v, None)
    assert_close(cpu(z), cpu(z2), atol=1e-5, rtol=1e-6)
    _assert_grads_close(got, want)


def _forward_backward(v, plan):
    """log Z and the backward's outputs under ``plan`` (None: the sequential register-ring kernels,
    the blocked engine switched off for the call)."""
    forced = plan_mod.FORCE_BLOCKED
    if plan is None:
        plan_mod.FORCE_BLOCKED = False
    try:
        plan = plan or launch.plan_for(v.cum_scores, v.transition, v.K, "log", time_parallel=False)
        z, state = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, "log",
                                         v.proj_start, v.proj_end, plan=plan)
        return z, launch.launch_backward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K,
                                         v.proj_start, v.proj_end, plan=plan, state=state)
    finally:
        plan_mod.FORCE_BLOCKED = forced


def _assert_grads_close(got, want):
    for name, g, w in zip(("p_start", "p_end", "grad_transition", "grad_duration_bias"), got, want):
        assert_close(cpu(g), cpu(w), atol=2e-5, rtol=1e-5, msg=name)


def _spiky_frames(seed, T=400, K=8, C=3, X=1000.0):
    """A model whose frame jumps X nats above the values that matter at the start of every block of
    16 positions: label 1's segments ending there gain X (proj_end) and pay it back on leaving
    (transition), so label 1 sets the frame there and the label-0 path (duration 1, position by
    position) lies X below it, as a gene model's coding labels lie above its intergenic label."""
    g = torch.Generator().manual_seed(seed)
    cum = torch.cat([torch.zeros(1, 1, C), (0.3 * torch.randn(1, T, C, generator=g)).cumsum(1)], 1)
    tr = 0.3 * torch.randn(C, C, generator=g)
    tr[1] -= X
    db = 0.3 * torch.randn(K, C, generator=g)
    db[1:, 0] = -math.inf
    pe = torch.zeros(1, T, C)
    pe[0, 15::16, 1] = X
    pe[0, T - 1, 1] = 0.0
    return dict(cum_scores=cum, transition=tr, duration_bias=db, lengths=torch.tensor([T]), K=K, proj_end=pe)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_frames_far_above_the_sums_cost_no_drift(seed, monkeypatch):
    """Phase B sums each position in the previous position's frame (and the log semiring's block
    frame is the least of the previous block's frames), so a block whose first position's frame lies
    1000 nats above the values that matter rounds them like the sequential kernels do (log Z within
    ~1e-4 of float64 on this model), instead of at ulp(1000) ~ 6e-5 at every position of the block
    (the code before: 3.2e-3 to 3.6e-3 on these seeds). The Viterbi score too."""
    from torch_semimarkov import semi_crf_streaming_forward, semi_crf_streaming_viterbi

    monkeypatch.setattr(plan_mod, "FORCE_BLOCKED", True)
    monkeypatch.setattr(plan_mod, "BLOCK_OVERRIDE", (16, 4, 4))
    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 64)
    inp = _spiky_frames(seed)
    f64 = {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inp.items()}
    v = validated(inp, "log")
    z, _ = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, "log", v.proj_start,
                                 v.proj_end, plan=_plan(v, "log"), save_for_backward=False)
    ref = semi_crf_streaming_forward(**f64, backend="torch")
    assert abs(float(cpu(z)[0]) - float(ref[0])) < 1e-3
    vm = validated(inp, "max")
    scores, _, _ = launch.launch_viterbi(vm.cum_scores, vm.transition, vm.duration_bias, vm.lengths, vm.K,
                                         vm.proj_start, vm.proj_end, plan=_plan(vm, "max"))
    best = semi_crf_streaming_viterbi(**f64, backend="torch").scores
    assert abs(float(cpu(scores)[0]) - float(best[0])) < 1e-3


@pytest.mark.parametrize("case", CC_CASES, ids=CC_IDS)
def test_blocked_viterbi_matches_oracle(case, blocked):
    inp = inputs(case, seed=3)
    v = validated(inp, "max")
    scores, labels, starts = launch.launch_viterbi(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K,
                                                   v.proj_start, v.proj_end, plan=_plan(v, "max"))
    check_viterbi(inp, scores, labels, starts, v.lengths.tolist())


def test_blocked_viterbi_ties_break_to_smallest_index(blocked):
    """All-zero scores: every segmentation ties; the smallest duration and label win."""
    B, T, K, C = 1, 9, 3, 3
    inp = {"cum_scores": torch.zeros(B, T + 1, C), "transition": torch.zeros(C, C), "duration_bias": torch.zeros(K, C),
           "lengths": torch.tensor([T]), "K": K, "proj_start": None, "proj_end": None}
    v = validated(inp, "max")
    _, labels, starts = launch.launch_viterbi(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K,
                                              plan=_plan(v, "max"))
    assert cpu(labels)[0].tolist() == [0] * T
    assert cpu(starts)[0].tolist() == [True] * T


def _viterbi(v, p):
    return [cpu(x) for x in launch.launch_viterbi(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K,
                                                  v.proj_start, v.proj_end, plan=p)]


@pytest.mark.parametrize("model", ["random", "long", "ties", "frame", "cyclic", "helpers"])
def test_max_tile_bounds_change_no_viterbi_output(model, monkeypatch):
    """Viterbi's phase A skips a tile whose bound (largest row plus the largest duration bias it
    meets) no position's running maximum is below (``plan.MAX_BOUNDS``, on by default in the spec
    and fix-up phases, ``MAX_BOUND_PHASES``; here in the repair too): the scores, labels and
    segment starts are bitwise those of summing every tile, on random, tie-heavy (integer scores:
    the smallest duration must still win), forbidden-move (frame, cyclic) models and with helper
    programs (their parts offset by a block, ``_blk_help``). An under-estimated bound (planted)
    changes the long-segment model's result: the skip is live."""
    monkeypatch.setattr(plan_mod, "FORCE_BLOCKED", True)
    monkeypatch.setattr(plan_mod, "BLOCK_OVERRIDE", (4, 4, 2))
    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 12)
    B, T, K, C = 2, 40, 14, 5
    if model in ("random", "helpers"):
        inp = inputs((B, T, K, C, "ragged", "both", False), seed=11)
    elif model == "long":  # long segments preferred: the best durations lie in the older tiles
        inp = inputs((B, T, K, C, "ragged", "none", False), seed=11)
        inp["transition"] = inp["transition"] - 5.0
    elif model == "ties":
        g = torch.Generator().manual_seed(12)
        x = torch.randint(0, 2, (B, T, C), generator=g).float()
        inp = {"cum_scores": torch.nn.functional.pad(x.cumsum(1), (0, 0, 1, 0)), "K": K,
               "transition": torch.randint(-1, 1, (C, C), generator=g).float(),
               "duration_bias": torch.randint(-1, 1, (K, C), generator=g).float(),
               "lengths": torch.tensor([T, T - 7]), "proj_start": None, "proj_end": None}
    else:
        inp = adversarial(model, B, T, K, C, seed=13)
    if model == "helpers":
        monkeypatch.setattr(plan_mod, "HELPERS_OVERRIDE", 2)
    v = validated(inp, "max")
    p = _plan(v, "max")
    assert p.max_bounds and p.max_bound_phases == (1, 2)  # the default: spec and fix-ups, not the repair
    got = _viterbi(v, p)
    monkeypatch.setattr(plan_mod, "MAX_BOUNDS", False)
    want = _viterbi(v, _plan(v, "max"))
    for name, a, b in zip(("scores", "labels", "starts"), want, got):
        assert torch.equal(a, b), name
    # in every phase, the repair's included
    monkeypatch.setattr(plan_mod, "MAX_BOUNDS", True)
    monkeypatch.setattr(plan_mod, "MAX_BOUND_PHASES", (1, 2, 3))
    p = _plan(v, "max")
    assert p.max_bounds and not _plan(v, "log").max_bounds
    got = _viterbi(v, p)
    for name, a, b in zip(("scores", "labels", "starts"), want, got):
        assert torch.equal(a, b), name
    if model == "long":
        real = parallel.max_bound_table
        monkeypatch.setattr(parallel, "max_bound_table", lambda *a: real(*a) - 1e4)
        bad = _viterbi(v, p)
        assert not all(torch.equal(a, b) for a, b in zip(want, bad))


def test_max_bound_table():
    """Row j: the largest duration bias of durations j + 1 .. j + bt that are at most K (float32),
    2·MASK past K and where every such duration is impossible."""
    from torch_semimarkov.engines.triton.common import MASK

    K, C, bt = 7, 3, 3
    db = torch.randn(K, C, dtype=torch.float64)
    db[2:5, 1] = -math.inf
    tab = parallel.max_bound_table(db, K, bt)
    assert tab.shape == (K + 2 * bt + 1, C) and tab.dtype == torch.float32
    for j in range(K + 2 * bt + 1):
        for c in range(C):
            ks = [k for k in range(j + 1, j + bt + 1) if k <= K and db[k - 1, c] > -math.inf]
            want = max(float(db[k - 1, c].float()) for k in ks) if ks else 2 * MASK
            assert float(tab[j, c]) == pytest.approx(want, rel=0, abs=0) or (not ks and tab[j, c] <= 2 * MASK)


@pytest.mark.parametrize("semiring", ["log", "max"])
def test_blocked_with_more_labels_than_a_warp_has_lanes(semiring, monkeypatch):
    """C = 40 (C_PAD = 64: the label step's sums and first argmax span more than one warp's 32
    lanes; the other cases have C <= 7). log Z (or the best score) against the oracle; the
    gradients against the sequential kernels; Viterbi's labels; all-zero scores tie everywhere
    and the smallest label wins."""
    monkeypatch.setattr(plan_mod, "FORCE_BLOCKED", True)
    monkeypatch.setattr(plan_mod, "BLOCK_OVERRIDE", (4, 4, 16))
    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 6)
    case = (2, 13, 3, 40, "ragged", "both", False)
    inp = inputs(case, seed=5)
    v = validated(inp, semiring)
    z, _ = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, semiring,
                                 v.proj_start, v.proj_end, plan=_plan(v, semiring), save_for_backward=False)
    assert_close(cpu(z), naive_semi_crf(**inp, semiring=semiring), atol=1e-5, rtol=1e-6, msg=semiring)
    if semiring == "log":
        z, got = _forward_backward(v, _plan(v, "log"))
        _, want = _forward_backward(v, None)
        _assert_grads_close(got, want)
        return
    scores, labels, starts = launch.launch_viterbi(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K,
                                                   v.proj_start, v.proj_end, plan=_plan(v, "max"))
    check_viterbi(inp, scores, labels, starts, v.lengths.tolist())
    B, T, K, C = 1, 8, 3, 40
    zero = {"cum_scores": torch.zeros(B, T + 1, C), "transition": torch.zeros(C, C),
            "duration_bias": torch.zeros(K, C), "lengths": torch.tensor([T]), "K": K, "proj_start": None,
            "proj_end": None}
    v = validated(zero, "max")
    _, labels, starts = launch.launch_viterbi(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K,
                                              plan=_plan(v, "max"))
    assert cpu(labels)[0].tolist() == [0] * T
    assert cpu(starts)[0].tolist() == [True] * T


@pytest.mark.covering(strength=1)  # the interpreter runs 2 of the 4: each model and each semiring
@pytest.mark.parametrize("kind", ["cyclic", "frame"])
@pytest.mark.parametrize("semiring", ["log", "max"])
def test_blocked_is_exact_on_models_that_never_converge(kind, semiring, monkeypatch):
    """Chunks whose fix-ups never converge hand their true state on (repair)."""
    monkeypatch.setattr(plan_mod, "FORCE_BLOCKED", True)
    monkeypatch.setattr(plan_mod, "BLOCK_OVERRIDE", (4, 4, 2))
    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 12)
    inp = adversarial(kind, 2, 36, 6, 3)  # 3 chunks of 12 (T = 60 ran 5); the repair asserted below
    v = validated(inp, semiring)
    p = _plan(v, semiring)
    assert p.n_chunks == 3
    # the fix-up's stats as the launch computed them (not a second forward_chunked call)
    chunked = record_outputs(monkeypatch, launch, "forward_chunked")
    z, _ = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, semiring, plan=p,
                                 save_for_backward=False)
    assert len(chunked) == 1
    stats = chunked[0][3]
    assert_close(cpu(z), naive_semi_crf(**inp, semiring=semiring), atol=1e-5, rtol=1e-6)
    if semiring == "log":
        assert not bool(stats.converged[:, 1:].all()), "the adversarial model should defeat some fix-ups"


@pytest.mark.parametrize("semiring", ["log", "max", "masks"])
def test_repair_helpers_change_no_output(semiring, monkeypatch):
    """The in-order repair's own helpers (``plan.repair_helpers``: grid (B, 1, 1 + helpers), the
    run's chunks in the run's order, each chunk's own slot; HELP_DONE on a chunk the run passes):
    on a model whose fix-ups never converge (the repair reruns chunks, asserted), log Z and the
    backward's outputs (forward and beta repairs) or the Viterbi outputs are those without them,
    with the helpers' parts computed by the run (inline) or launched (on the interpreter they find
    every chunk finished or passed and stop: the same bits), and beside the spec's and fix-ups'
    helpers. ``masks``: a constrained forward (the gene finder's gold labellings take this path)."""
    monkeypatch.setattr(plan_mod, "FORCE_BLOCKED", True)
    monkeypatch.setattr(plan_mod, "BLOCK_OVERRIDE", (4, 4, 2))
    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 12)
    masked, semiring = semiring == "masks", "log" if semiring == "masks" else semiring
    # (the cyclic model defeats the log semiring's fix-ups, the frame model the max semiring's)
    v = validated(adversarial("cyclic" if semiring == "log" else "frame", 2, 36, 6, 3), semiring)
    masks = None
    if masked:
        from torch_semimarkov.engines.triton.limits import engine_limits

        lm = torch.rand(2, 36, 3, generator=torch.Generator().manual_seed(4)) < 0.8
        lm[..., 0] = True
        masks = engine_limits(lm.to(v.cum_scores.device), None, 2, 36, 3, v.K, v.cum_scores.device)
    monkeypatch.setattr(plan_mod, "REPAIR_HELPERS", False)
    base = _plan(v, semiring, backward=semiring == "log" and not masked)
    assert base.repair_helpers == 0 and base.n_chunks == 3
    runs = (("none", base, True), ("inline", dataclasses.replace(base, repair_helpers=2), True),
            ("launched", dataclasses.replace(base, repair_helpers=2), False),
            ("both", dataclasses.replace(base, helpers=2, repair_helpers=4), False))
    outs = {}
    for name, p, inline in runs:
        monkeypatch.setattr(plan_mod, "HELP_INLINE", inline)
        chunked = record_outputs(monkeypatch, launch, "forward_chunked")
        if masked:
            z, _ = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, "log",
                                         v.proj_start, v.proj_end, plan=p, save_for_backward=False, masks=masks)
            outs[name] = [cpu(z)]
        elif semiring == "log":
            z, grads = _forward_backward(v, p)
            outs[name] = [cpu(z), *[cpu(g) for g in grads]]
        else:
            outs[name] = _viterbi(v, p)
        # a chunk (not the last) whose fix-up did not converge hands the repair its successor
        # (``redone`` compares step counts, which a rerun of a whole chunk leaves as they were)
        assert bool((~chunked[0][3].converged[:, 1:-1]).any()), "the repair should rerun chunks here"
    # the run's own part and the helpers' parts are summed apart, as with the spec's helpers: equal
    # to float32 rounding to the run alone (the labels and starts exactly), and bitwise whichever
    # program computed the parts
    for a, b in zip(outs["inline"], outs["launched"]):
        assert torch.equal(a, b)
    for name in ("inline", "both"):
        if masked:
            assert torch.isfinite(outs[name][0]).all()
            assert_close(outs[name][0], outs["none"][0], atol=1e-5, rtol=1e-6, msg=name)
        elif semiring == "log":
            assert_close(outs[name][0], outs["none"][0], atol=1e-5, rtol=1e-6, msg=name)
            _assert_grads_close(outs[name][1:], outs["none"][1:])
        else:
            assert_close(outs[name][0], outs["none"][0], atol=1e-5, rtol=1e-6, msg=name)
            assert torch.equal(outs[name][1], outs["none"][1]) and torch.equal(outs[name][2], outs["none"][2]), name


def test_blocked_is_deterministic(monkeypatch):
    monkeypatch.setattr(plan_mod, "FORCE_BLOCKED", True)
    monkeypatch.setattr(plan_mod, "BLOCK_OVERRIDE", (4, 4, 2))
    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 8)
    inp = inputs((2, 20, 5, 3, "ragged", "both", False), seed=4)  # 3 chunks of 8 (T = 30 ran 4)
    v = validated(inp)
    p = _plan(v, "log")
    assert p.n_chunks == 3
    outs = []
    for _ in range(2):
        z, state = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, "log",
                                         v.proj_start, v.proj_end, plan=p)
        outs.append((z, *launch.launch_backward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K,
                                                v.proj_start, v.proj_end, plan=p, state=state)))
    for a, b in zip(*outs):
        assert torch.equal(cpu(a), cpu(b))


def _underflow_case():
    """A model whose log Z rests on block sums that underflow in linear space: label 0 may start
    only at positions 0, 5, 10, ... (elsewhere its start costs 200 nats) but never lasts 5
    positions, so every segmentation pays a start penalty, and the sum over a block's old rows
    is about e^-200 of (largest row) x (largest duration factor); label 1 is impossible."""
    inp = inputs((2, 25, 6, 2, None, "start", False), seed=5)
    ps = torch.zeros_like(inp["proj_start"])
    ps[:, torch.arange(ps.shape[1]) % 5 != 0, 0] = -200.0
    d = torch.zeros(6, 2)
    d[4, 0] = float("-inf")
    d[:, 1] = float("-inf")
    return dict(inp, proj_start=ps, duration_bias=d)


def _unit_duration_case():
    """Durations a label may not take: label 1 only one position long (the GHMM's intergenic
    pieces), label 2 at least 4 long: block sums that are truly empty, not underflowed."""
    inp = inputs((3, 30, 6, 4, "ragged", "both", False), seed=6)
    d = inp["duration_bias"].clone()
    d[1:, 1] = float("-inf")
    d[:3, 2] = float("-inf")
    return dict(inp, duration_bias=d)


def _residue_case():
    """A gene grammar's durations (``GeneGrammar.duration_mask``) on a small K: label 0 one
    position long (intergenic pieces), labels 1 and 2 coding (durations of one residue modulo 3
    from 3 on), label 3 an intron (4..K), label 4 a fixed-length piece (exactly K), with a trend
    in k (``cumulative_scores``' k·mu); start scores scaled up so that rows of one duration class
    outweigh the others by far more than float32 holds (the GHMM's signal scores)."""
    inp = inputs((2, 24, 9, 5, "ragged", "start", False), seed=7)
    k = torch.arange(1, 10)[:, None]
    ok = torch.stack([k[:, 0] == 1, (k[:, 0] % 3 == 0) & (k[:, 0] >= 3), (k[:, 0] % 3 == 2) & (k[:, 0] >= 5),
                      k[:, 0] >= 4, k[:, 0] == 9], 1)
    d = torch.where(ok, inp["duration_bias"] + 0.7 * k, torch.tensor(float("-inf")))
    return dict(inp, duration_bias=d, proj_start=inp["proj_start"] * 40.0)


# the interpreter runs 4 of the 7 (each block-sum form on a truly empty sum, on an underflowing one
# and, for the residue classes, on a gene grammar's durations); all 7 run on CUDA
_FULL = pytest.mark.gpu_full


_SEQUENTIAL = {}


def _sequential_reference(name, v):
    """The sequential register-ring kernels' backward outputs of case ``name`` (made from a fixed
    seed, so the same inputs in every test): once per process, shared by the parametrisations of
    one case (the underflow case runs with two block-sum forms)."""
    if name not in _SEQUENTIAL:
        _SEQUENTIAL[name] = _forward_backward(v, None)[1]
    return _SEQUENTIAL[name]


@pytest.mark.parametrize("make, linear, period", [
    pytest.param(_underflow_case, True, 1, id="underflow-linear"),
    pytest.param(_underflow_case, False, 0, id="underflow-log-space", marks=_FULL),
    pytest.param(_underflow_case, 3, 3, id="underflow-residue-classes"),
    pytest.param(_unit_duration_case, True, 1, id="unit-durations-linear", marks=_FULL),
    pytest.param(_unit_duration_case, 3, 3, id="unit-durations-residue-classes", marks=_FULL),
    pytest.param(_unit_duration_case, False, 0, id="unit-durations-log-space"),
    pytest.param(_residue_case, 3, 3, id="residues-residue-classes")])
def test_blocked_block_sums_linear_and_log_space(make, linear, period, monkeypatch):
    """The log-semiring block sums as linear-space products (``_tile_linear``: one shift per
    label, ``PERIOD`` 1, or per residue class of the rows, 3) and term by term (``BLOCKED_LINEAR
    = False``) all give the oracle's log Z and the sequential kernels' gradients, also where the
    linear sums underflow (a tile recomputed in log space: without that recomputation the
    underflow case's log Z is -inf) or are truly empty. On a gene grammar's durations the
    residue classes recompute no tile."""
    monkeypatch.setattr(plan_mod, "FORCE_BLOCKED", True)
    # the gene grammar's 5 labels in two label tiles (one partial): 5.7 -> 3.9 s against tiles of 2
    monkeypatch.setattr(plan_mod, "BLOCK_OVERRIDE", (4, 4, 4) if make is _residue_case else (4, 4, 2))
    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 8)
    monkeypatch.setattr(plan_mod, "BLOCKED_LINEAR", linear)
    inp = make()
    v = validated(inp)
    p = _plan(v, "log")
    assert p.linear == linear and p.n_chunks >= 3
    assert parallel.linear_period(v.duration_bias, v.K, p.linear) == period
    monkeypatch.setattr(parallel, "RECOMPUTED", [])
    z, got = _forward_backward(v, p)
    recomputed = sum(int(n) for n, _ in parallel.RECOMPUTED)
    assert_close(cpu(z), naive_semi_crf(**inp, semiring="log"), atol=1e-4, rtol=1e-6)
    _assert_grads_close(got, _sequential_reference(make.__name__, v))
    if make is _residue_case:
        # per residue class (with exact edge rows) no tile is recomputed; with one shift per label
        # (its largest row often a duration the label may not take) this case recomputes 23 tiles
        # in the forward's passes and 16 in beta's, 22 tiles a pass (probe, interpreter)
        assert recomputed == 0, recomputed


def test_linear_duration_tables():
    """ED = exp(D - MD) per label, zero where D is impossible, past K and on padded labels; the
    finite range of each label's durations."""
    d = torch.tensor([[0.0, float("-inf"), -1.0], [-2.0, float("-inf"), float("-inf")], [-1.0, float("-inf"), 3.0]])
    p = plan_mod.make_plan(1, 100, 3, 3, time_parallel=None)
    p = plan_mod.KernelPlan(**{**p.__dict__, "linear_tile": (4, 2, 2), "c_pad": 4, "K": 3})
    ed, md, kr = parallel.linear_duration_tables(d.clamp(min=-1e30), p)
    assert ed.shape == (3 + 4 + 2, 4)
    assert md.tolist() == [[0.0, 0.0, 3.0, 0.0], [0.0] * 4]
    assert torch.allclose(ed[:3, 0], torch.exp(torch.tensor([0.0, -2.0, -1.0])))
    assert ed[:, 1].abs().sum() == 0 and ed[3:].abs().sum() == 0 and ed[:, 3].abs().sum() == 0
    assert torch.allclose(ed[:3, 2], torch.tensor([float(torch.exp(torch.tensor(-4.0))), 0.0, 1.0]))
    # first and last possible duration, their shared residue modulo 3 (none: labels 0 and 2 take
    # durations of several residues, 1 and 3 none), the recomputation counter
    assert kr.tolist() == [[1, 4, 1, 4], [3, 0, 3, 0], [-1, -1, -1, -1], [0, 0, 0, 0]]
    # with the trend taken out (a duration bias linear in k: ED all ones where possible)
    d = torch.tensor([[0.5, -1.0], [1.0, float("-inf")], [1.5, -3.0]])
    ed, md, _ = parallel.linear_duration_tables(d.clamp(min=-1e30), p, trend=True)
    assert torch.allclose(md[1, :2], torch.tensor([0.5, -1.0])) and torch.allclose(md[0, :2], torch.tensor([0.0, 0.0]))
    assert torch.allclose(ed[:3, :2], torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]]))


def test_linear_block_sums_by_default_only_for_dense_durations():
    """By default the linear-space sums run where every duration is possible and each label's
    bias spans at most 50 nats (no underflow); a duration a label may not take, or a wider
    spread, keeps the log-space sums."""
    d = torch.randn(10, 4)
    assert parallel.dense_durations(d, 10)
    d[3, 2] = -1e30
    assert not parallel.dense_durations(d, 10)
    assert parallel.dense_durations(d, 3)  # only durations 1..K count
    d = torch.zeros(10, 4)
    d[9, 1] = -60.0
    assert not parallel.dense_durations(d, 10)
    assert plan_mod.make_plan(4, 100000, 960, 47).linear is None


def _duration_cases():
    """(name, K, duration bias (K + 2, C)) of every kind the tables meet: dense, sparse, a gene
    grammar's, all impossible, one label wider than 50 nats, a float64 bias."""
    from torch_semimarkov.genomics.labels import GeneGrammar

    g = torch.Generator().manual_seed(3)
    out = []
    for K, C in ((3, 3), (7, 20), (96, 47)):
        d = 3 * torch.randn(K + 2, C, generator=g)
        sparse = torch.where(torch.rand(K + 2, C, generator=g) < 0.3, -1e30, d)
        wide = d.clone()
        wide[0, 1] = wide[1:, 1].max() - 60.0
        out += [("dense", K, d), ("sparse", K, sparse), ("none", K, torch.full_like(d, -1e30)),
                ("wide", K, wide), ("float64", K, sparse.double())]
    ok = GeneGrammar().duration_mask(62)
    out.append(("gene", 60, torch.where(ok, torch.randn(ok.shape, generator=g), torch.tensor(-1e30))))
    return out


@pytest.mark.parametrize("pad", [0, 5, 40])
def test_duration_tables_in_one_kernel_are_the_pytorch_tables(pad):
    """``tables.duration_tables`` (one launch) makes bitwise the tables of
    ``parallel.linear_duration_tables`` (PyTorch, 43 launches) and each label's test of
    ``parallel.dense_durations`` (padded labels pass), on every kind of duration bias."""
    from torch_semimarkov.engines.triton import tables

    for name, K, d in _duration_cases():
        C = d.shape[1]
        p = plan_mod.make_plan(1, 100, K, C, time_parallel=None)
        want = parallel.linear_duration_tables(d.to(DEVICE), p, pad=pad)
        *got, dense = tables.duration_tables(d.to(DEVICE), K, p.c_pad, pad, parallel.LINEAR_SPREAD)
        for label, a, b in zip(("ED", "MD", "ranges"), got, want):
            assert a.shape == b.shape and torch.equal(a, b), (name, label)
        assert dense.shape == (p.c_pad,) and dense[C:].eq(1).all(), name
        for c in range(C):
            assert bool(dense[c]) == parallel.dense_durations(d[:, c:c + 1], K), (name, c)
        assert bool(dense.all()) == parallel.dense_durations(d, K), name
        assert name not in ("sparse", "none", "wide", "gene") or not bool(dense.all())


def test_default_period_and_tables_from_one_kernel(monkeypatch):
    """By default (``plan.linear`` None) the blocked forward takes the linear sums' period and its
    tables from the one kernel's launch (no ``dense_durations`` reductions), the log-space sums
    where a label fails the test; log Z is that of the period forced each way."""
    _small_blocked(monkeypatch)
    from torch_semimarkov.engines.triton import tables

    launches = []
    real = tables.duration_tables
    monkeypatch.setattr(tables, "duration_tables", lambda *a, **k: launches.append(1) or real(*a, **k))
    monkeypatch.setattr(parallel, "dense_durations", lambda *a: pytest.fail("dense_durations called"))
    for sparse in (False, True):
        inp = to_device(inputs((2, 30, 5, 3, "ragged", "none", False), seed=11))
        if sparse:
            inp["duration_bias"] = inp["duration_bias"].clone()
            inp["duration_bias"][2, 1] = float("-inf")
        v = validated(inp)
        args = (v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, "log", None, None)
        zs = {}
        for linear in (None, True, False):
            monkeypatch.setattr(plan_mod, "BLOCKED_LINEAR", linear)
            launches.clear()
            p = _plan(v, "log")
            assert p.linear is linear
            zs[linear] = launch.launch_forward(*args, plan=p)[0]
            assert len(launches) == (1 if linear is not False else 0), (sparse, linear)
        assert torch.equal(zs[None], zs[False] if sparse else zs[True]), sparse


def test_residue_structured_durations_of_gene_grammars():
    """A gene grammar's durations (each label's possible durations all of its range, or all of it in
    one residue modulo 3) are what the residue-class block sums (PERIOD 3, opt-in) are for; other
    gaps in a label's range, or a spread over 50 nats after the trend, are not. By default gene
    grammars keep the log-space sums (GPU_NOTES 51)."""
    from torch_semimarkov.genomics.labels import GeneGrammar

    for grammar in (GeneGrammar(), GeneGrammar(intron_tail=40)):
        ok = grammar.duration_mask(60)
        d = torch.where(ok, torch.randn(ok.shape), torch.tensor(float("-inf")))
        assert not parallel.dense_durations(d, 60) and parallel.residue_durations(d, 60)
        assert parallel.linear_period(d, 60) == 0 and parallel.linear_period(d, 60, True) == 1
        assert parallel.linear_period(d, 60, 3) == 3 and parallel.linear_period(d, 60, False) == 0
        res = parallel._residues(d > -1e29)
        assert [int(res[grammar.index[n]]) for n in ("N", "+initial(1)", "+internal(2,0)", "+intron(0)")] == \
            [-1, 1, 1, -1]
        wide = d.clone()
        wide[59, grammar.index["+intron(1)"]] = -60.0
        assert not parallel.residue_durations(wide, 60)
    # a trend in k (cumulative_scores' k·mu): dense but spanning 100 nats, 0.4 after the trend
    d = 0.5 * torch.arange(1, 201.0)[:, None] + 0.1 * torch.rand(200, 3)
    assert not parallel.dense_durations(d, 200) and parallel.residue_durations(d, 200)
    d = torch.randn(10, 4)
    d[4, 1] = float("-inf")  # a gap in the middle of label 1's range, not a residue class
    assert not parallel.residue_durations(d, 10) and parallel.linear_period(d, 10) == 0
    with pytest.raises(ValueError, match="plan.linear"):
        parallel.linear_period(d, 10, 2)


def test_large_rings_plan_the_blocked_engine():
    """Genomics shapes (a ring too large for registers) run parallel over time; a batch that
    fills the GPU alone runs one chunk per sequence; explicit time_parallel=False keeps the
    sequential memory-ring kernel."""
    p = plan_mod.make_plan(4, 100000, 960, 47)
    assert p.kind == "mem" and p.time_parallel and p.n_chunks == 33 and p.chunk >= 3 * 960 // 2
    # term-by-term block sums: 32 labels a tile in the log semiring, 16 in the max (GPU_NOTES 52)
    assert (p.bt, p.rb, p.cb) == (16, 32, 32) and plan_mod.make_plan(4, 100000, 960, 47, semiring="max").cb == 16
    assert plan_mod.make_plan(4, 100000, 960, 12).cb == 16  # never wider than the padded labels
    p = plan_mod.make_plan(1, 100000, 4000, 47)
    assert p.chunk == 6000 and p.n_chunks == 17
    for B, T in ((512, 30000), (32, 3000)):  # the batch fills the GPU; shorter than 4·K
        p = plan_mod.make_plan(B, T, 960, 47)
        assert p.kind == "mem" and p.time_parallel and p.n_chunks == 1
    p = plan_mod.make_plan(4, 100000, 960, 47, time_parallel=False)
    assert p.kind == "mem" and not p.time_parallel
    p = plan_mod.make_plan(4, 100000, 64, 24)
    assert p.kind == "reg"
    assert plan_mod.masked_plan(4, 100000, 960, 47) is None  # entropy and top-k: the register ring
    assert plan_mod.masked_plan(4, 100000, 960, 47, blocked=True).kind == "mem"


@pytest.mark.parametrize("i", [0, 1])
def test_samples_walk_the_blocked_engines_rows_exactly(i, blocked):
    """Sampling reads the forward's every-position rows: from the blocked engine's rows the kernel
    walk draws exactly the plain float64 walk's steps (same uniforms)."""
    from test_kernels_sample import _case, _kernel_walk, _reference_walk, _state

    v = _case(i, seed=20 + i)
    saved, frames, _ = _state(v)
    assert _plan(v, "log").kind == "mem"
    uniforms = torch.rand((2 * v.batch, v.T + 1, 2), generator=torch.Generator().manual_seed(i))
    labels, starts, _ = _kernel_walk(v, uniforms, 4)
    ref_labels, ref_starts = _reference_walk(v, saved, frames, cpu(v.lengths), uniforms)
    assert torch.equal(cpu(labels), ref_labels) and torch.equal(cpu(starts), ref_starts)


_POSITION = {}


@pytest.mark.parametrize("mode", ["tiled", "log"])
def test_blocked_marginal_tiles_match_the_position_kernel(mode, monkeypatch):
    """The blocked engine's marginal tiles (``_blk_seg_kernel``) against the per-position kernel on
    one forward: scores x 20 make some tiles' bounds too wide for linear space (summed term by term)
    and some negligible (skipped), so every path of the tile runs ("log": every tile term by term)."""
    _small_blocked(monkeypatch)
    monkeypatch.setattr(launch, "STATS", True)
    inp = inputs((1, 24, 8, 5, None, "none", False), seed=6)  # 15 linear, 17 log-space, 1 skipped tile
    inp["cum_scores"] = inp["cum_scores"] * 20
    v = validated(inp)
    p = _plan(v, "log")
    # the forward (which never reads plan.marg) and the per-position kernel's backward of these
    # fixed inputs: once per process, shared by both modes
    if "position" not in _POSITION:
        _, state = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, "log",
                                         plan=dataclasses.replace(p, marg="position"))
        _POSITION["position"] = state, launch.launch_backward(
            v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, None, None,
            plan=dataclasses.replace(p, marg="position"), state=state)
    state, want = _POSITION["position"]
    got = launch.launch_backward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, None, None,
                                 plan=dataclasses.replace(p, marg=mode), state=state)
    n_lin, n_log, n_skip = cpu(launch.LAST_MARG_STATS).sum((0, 1)).tolist()
    assert n_log > 0 and n_skip > 0 and (n_lin > 0) == (mode == "tiled"), (n_lin, n_log, n_skip)
    _assert_grads_close(got, want)


def test_position_kernel_takes_its_own_chunks_beside_the_tiles(monkeypatch):
    """Where the marginal tiles write P_start and the duration marginals, the per-position kernel
    (P_end, the transition marginals) keeps a (C, C) workspace a chunk only and takes its own,
    finer chunks (``plan.position_chunks``): its outputs do not depend on that chunking (to float32
    rounding of the chunk sums), whichever chunking the tiles take."""
    _small_blocked(monkeypatch)
    v = validated(inputs((2, 20, 5, 3, "ragged", "both", False), seed=8))
    p = _plan(v, "log")
    assert p.marg == "tiled"
    outs = {}
    for ch in (20, 3):  # one chunk a sequence, then 7: more than the tiles' chunks
        monkeypatch.setattr(launch, "position_chunks", lambda B, T, C, ch=ch: (ch, -(-T // ch)))
        outs[ch] = _forward_backward(v, p)
    assert torch.equal(cpu(outs[20][0]), cpu(outs[3][0]))
    for name, a, b in zip(("p_start", "p_end", "grad_transition", "grad_duration_bias"), outs[20][1], outs[3][1]):
        if name in ("p_start", "p_end", "grad_duration_bias"):  # not summed over the kernel's chunks
            assert torch.equal(cpu(a), cpu(b)), name
        else:
            assert_close(cpu(a), cpu(b), atol=1e-6, rtol=1e-6, msg=name)
    # the plan: finer chunks than the shared ones where the (K, C) duration block binds those
    assert plan_mod.position_chunks(4, 100_000, 47) == (196, 511)
    assert plan_mod.marginal_chunks(4, 100_000, 47, 960 * 47 + 47 * 47) == (506, 198)
    assert plan_mod.position_chunks(32, 3000, 47)[1] > plan_mod.marginal_chunks(32, 3000, 47, 960 * 47 + 47 * 47)[1]


def test_marginal_tiles_take_their_own_chunks(monkeypatch):
    """The marginal tiles (``_blk_seg_kernel``) take their own chunks (``plan.seg_chunks``): where
    the chunks are whole tiles (the tiles' frames, relative to their first start, do not move) P_start
    (each start summed by one program) and everything else bitwise, the duration marginals (summed
    over the chunks' workspace) to float32 rounding."""
    _small_blocked(monkeypatch)
    v = validated(inputs((2, 20, 5, 3, "ragged", "both", False), seed=9))
    p = _plan(v, "log")
    assert p.marg == "tiled"
    outs, rows = {}, []
    for ch in (20, 4):  # one chunk a sequence, then 5 of one tile each

        def chunks(B, T, K, C, groups, tile_rows, device, ch=ch):
            rows.append(tile_rows)
            return ch, -(-T // ch)
        monkeypatch.setattr(launch, "seg_chunks", chunks)
        outs[ch] = _forward_backward(v, p)
    assert rows == [4, 4]  # the tile's starts (MARG_OVERRIDE's BS)
    assert torch.equal(cpu(outs[20][0]), cpu(outs[4][0]))
    for name, a, b in zip(("p_start", "p_end", "grad_transition", "grad_duration_bias"), outs[20][1], outs[4][1]):
        if name != "grad_duration_bias":
            assert torch.equal(cpu(a), cpu(b)), name
        else:
            assert_close(cpu(a), cpu(b), atol=1e-6, rtol=1e-6, msg=name)


def test_seg_chunks_fill_the_last_wave():
    """``plan.seg_chunks``: the shared chunking unless more chunks of whole tiles finish sooner in
    waves of ``SEG_PROGRAMS_PER_SM`` programs a multiprocessor, within the workspace bound."""
    sms = plan_mod.DEFAULT_SMS
    slots = sms * plan_mod.SEG_PROGRAMS_PER_SM
    for B, T, K, C in [(32, 3000, 960, 47), (8, 3000, 960, 47), (1, 100_000, 4000, 47), (16, 20_000, 960, 47),
                       (4, 100_000, 960, 47), (2, 24, 8, 5), (1, 10, 3, 3)]:
        ch0, n0 = plan_mod.marginal_chunks(B, T, C, K * C + C * C)
        ch, n = plan_mod.seg_chunks(B, T, K, C, 3, 32)
        assert n == -(-T // ch) and n >= n0

        def span(ch):
            return -(-B * -(-T // ch) * 3 // slots) * ch

        assert span(ch) <= span(ch0)  # never slower by the waves' measure
        if n > n0:
            assert span(ch) < span(ch0) and ch % 32 == 0
            assert B * n * K * C <= max(2 * (T + 1) * C * B, plan_mod.SEG_WORKSPACE)
    # (8, 3000): 5 chunks of 600 are 120 programs for 264 slots; 11 of 288 fill one wave
    assert plan_mod.seg_chunks(8, 3000, 960, 47, 3, 32) == (288, 11)
    # (4, 10^5): already about 9 waves: unchanged; and at T = 10^7 (23 waves) no search at all
    assert plan_mod.seg_chunks(4, 100_000, 960, 47, 3, 32) == plan_mod.marginal_chunks(4, 100_000, 47, 960 * 47 + 47 * 47)
    assert plan_mod.seg_chunks(1, 10**7, 960, 47, 3, 32) == plan_mod.marginal_chunks(1, 10**7, 47, 960 * 47 + 47 * 47)


def test_marginal_tiles_split_over_label_groups_bitwise(monkeypatch):
    """``plan.seg_label_groups``: each chunk of the marginal tiles spreads its label tiles over
    programs (one a tile by default; more groups than tiles leaves some programs idle); every
    output is bitwise that of one program a chunk, since each tile's sums stay in one program."""
    _small_blocked(monkeypatch)
    monkeypatch.setattr(launch, "STATS", True)
    v = validated(inputs((2, 20, 5, 5, "ragged", "both", False), seed=9))
    p = _plan(v, "log")
    assert p.marg == "tiled" and plan_mod.seg_label_groups(5, 2) == 3
    outs, stats = {}, {}
    for groups in (1, None, 4):
        monkeypatch.setattr(plan_mod, "SEG_GROUPS_OVERRIDE", groups)
        z, got = _forward_backward(v, p)
        outs[groups] = (z, *got)
        stats[groups] = cpu(launch.LAST_MARG_STATS).sum((0, 1))
    for groups in (None, 4):
        assert torch.equal(stats[1], stats[groups])  # the same tiles ran, each once
        for name, a, b in zip(("log Z", "p_start", "p_end", "grad_transition", "grad_duration_bias"),
                              outs[1], outs[groups]):
            assert torch.equal(cpu(a), cpu(b)), (groups, name)


def test_blocked_marginal_tiles_with_64bit_offsets(monkeypatch):
    """``idx64`` (positions and row offsets in int64, for (T+1)·C near 2^31) gives the marginal
    tiles' and the anchors' outputs bitwise equal to the int32 indexing. With helper programs (run
    inline here), so both forms of a block's sums take 64-bit offsets: the first block's over all
    its rows, the later ones split into the helpers' part and the previous block's rows (a slot
    offset typed int32 in one branch failed to compile on the GPU, GPU_NOTES 79)."""
    _small_blocked(monkeypatch)
    v = validated(inputs((2, 20, 5, 3, "ragged", "both", False), seed=7))
    p = _plan(v, "log")
    assert p.marg == "tiled" and not p.idx64
    outs = [_forward_backward(v, dataclasses.replace(p, idx64=wide, helpers=2)) for wide in (False, True)]
    for a, b in zip((outs[0][0], *outs[0][1]), (outs[1][0], *outs[1][1])):
        assert torch.equal(cpu(a), cpu(b))


def test_blocked_beta_beside_the_forward_gives_the_same_backward(monkeypatch):
    """``plan.beta_early``: a forward asked for its backward (``beta=True``) runs the beta recurrence
    too (on CUDA on a second stream beside it) and keeps its rows in the state; the backward then
    runs only the marginal kernels. log Z, the marginals and the gradients are bitwise those of the
    usual order, through the launchers and through a public function; callers that do not ask
    (sampling) keep the plain state. The plan chooses it where
    both recurrences fit the GPU at once."""
    from torch_semimarkov import semi_crf_streaming_entropy
    from torch_semimarkov.engines import select

    monkeypatch.setattr(plan_mod, "FORCE_BLOCKED", True)
    monkeypatch.setattr(plan_mod, "BLOCK_OVERRIDE", (4, 4, 2))
    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 6)
    inp = to_device(inputs((2, 12, 4, 4, "ragged", "both", False), seed=7))
    v = validated(inp)
    p = _plan(v, "log", backward=True)
    assert p.n_chunks >= 2
    args = (v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, "log", v.proj_start, v.proj_end)
    outs = {}
    for early in (False, True):
        plan = dataclasses.replace(p, beta_early=early)
        z, state = launch.launch_forward(*args, plan=plan, beta=True)
        assert state.second.dim() == (3 if early else 2)
        outs[early] = (z,) + tuple(launch.launch_backward(*args[:5], v.proj_start, v.proj_end, plan=plan, state=state))
    _, plain = launch.launch_forward(*args, plan=plan)  # not asked (the early plan): no beta in the state
    assert plain.second.dim() == 2
    # either recurrence may launch each phase first (parallel.BESIDE_FIRST): the same bits
    from torch_semimarkov.engines.triton import parallel as par
    first = par.BESIDE_FIRST
    monkeypatch.setattr(par, "BESIDE_FIRST", "beta" if first == "forward" else "forward")
    z, state = launch.launch_forward(*args, plan=plan, beta=True)
    swapped = (z,) + tuple(launch.launch_backward(*args[:5], v.proj_start, v.proj_end, plan=plan, state=state))
    monkeypatch.setattr(par, "BESIDE_FIRST", first)
    assert all(torch.equal(a, b) for a, b in zip(swapped, outs[True]))
    # side by side, the linear sums' period (a device synchronisation) and duration tables are made
    # once for both recurrences, and each launch keeps a counter of its own
    from torch_semimarkov.engines.triton import parallel
    calls = {"period": 0, "tables": 0}
    for name, fn in (("period", "linear_period"), ("tables", "_tables_for")):
        def spy(*a, _real=getattr(parallel, fn), _name=name, **kw):
            calls[_name] += 1
            return _real(*a, **kw)
        monkeypatch.setattr(parallel, fn, spy)
    monkeypatch.setattr(plan_mod, "BLOCKED_LINEAR", True)
    monkeypatch.setattr(parallel, "RECOMPUTED", [])
    lin = {}
    for early in (False, True):
        calls.update(period=0, tables=0)
        plan = dataclasses.replace(_plan(v, "log", backward=True), beta_early=early)
        lin[early] = launch.launch_forward(*args, plan=plan, beta=True)[0]
        # (early: two recurrences, not early: the forward alone)
        assert calls == {"period": 1, "tables": 1}, (early, calls)
    counters = [c for c, _ in parallel.RECOMPUTED[-2:]]
    assert counters[0].data_ptr() != counters[1].data_ptr()
    assert torch.equal(lin[False], lin[True])
    monkeypatch.setattr(plan_mod, "BLOCKED_LINEAR", None)
    for name, a, b in zip(("log Z", "p_start", "p_end", "grad_transition", "grad_duration_bias"), outs[False], outs[True]):
        assert torch.equal(a, b), name
    # a public function that runs both on the interpreter's engine (the entropy: a forward, then
    # the marginals), forced each way (log Z's own operator takes this path on CUDA: test_gpu.py)
    monkeypatch.setattr(select, "ENGINE_ON_CPU", True)
    ent = {}
    for early in (False, True):
        monkeypatch.setattr(plan_mod, "BETA_EARLY_OVERRIDE", early)
        ent[early] = semi_crf_streaming_entropy(**inp, backend="triton")
    assert torch.equal(ent[False], ent[True])
    # the plan's choice: one 8-warp program per multiprocessor, both recurrences at once
    monkeypatch.setattr(plan_mod, "BETA_EARLY_OVERRIDE", None)
    assert plan_mod.beta_early(32, 1, 132, "log", True)          # (32, 3000): 64 programs
    assert not plan_mod.beta_early(16, 8, 132, "log", True)      # (16, 20000): the forward fills the GPU
    assert not plan_mod.beta_early(32, 1, 132, "max", True)      # Viterbi has no backward
    assert not plan_mod.beta_early(32, 1, 132, "log", False)     # no CUDA: nothing runs beside
    assert p.beta_early == (DEVICE == "cuda")                    # these 4 runs: beside on a GPU only
    assert not _plan(v, "log").beta_early                        # a plain forward: no backward follows
    # a differentiated forward (``backward=True``) whose chunks fill the GPU takes chunks twice as
    # long (at most 8·K), so that beta's programs fit beside the forward's; nothing else changes
    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", None)
    mk = lambda B, T, **kw: plan_mod.make_plan(B, T, 960, 47, device="cuda", **kw)  # noqa: E731
    usual, split = mk(4, 100000), mk(4, 100000, backward=True)
    assert (usual.chunk, usual.n_chunks, usual.beta_early) == (3031, 33, False)
    assert (split.chunk, split.n_chunks, split.beta_early) == (6250, 16, True)
    assert (mk(16, 20000, backward=True).n_chunks, mk(16, 20000).n_chunks) == (4, 8)
    assert mk(8, 118212, backward=True) == mk(8, 118212)          # 2 x 8 x 16 programs: no room
    # one chunk each: the same chunks, beta beside only before a backward, and a plain forward's
    # runs take the multiprocessors beta's would (3 helpers each, not 1)
    assert mk(32, 3000, backward=True) == dataclasses.replace(mk(32, 3000), beta_early=True, helpers=1)
    assert (mk(32, 3000).beta_early, mk(32, 3000).helpers) == (False, 3)
    assert mk(4, 100000, backward=True, semiring="max") == mk(4, 100000, semiring="max")
    assert plan_mod.make_plan(4, 100000, 960, 47, backward=True) == plan_mod.make_plan(4, 100000, 960, 47)  # no CUDA
    monkeypatch.setattr(plan_mod, "BESIDE_SPLIT", False)
    assert mk(4, 100000, backward=True) == usual


def _long_segments_case(seed):
    """Segments longer than two blocks of 4 carry the model (a duration bias of 0.6·k², K = 9: one
    segment of 9 gains 24 nats over two of 4 and 5): the rows older than the previous block,
    which the helpers sum, hold most of each position's mass and often its best term."""
    inp = inputs((2, 24, 9, 5, "ragged", "both", False), seed=seed)
    k = torch.arange(1, 10, dtype=inp["duration_bias"].dtype)[:, None]
    return dict(inp, duration_bias=inp["duration_bias"] + 0.6 * k * k)


# the interpreter runs 3 of the 4 (each semiring, each block-sum form, the masks); all 4 on CUDA
@pytest.mark.parametrize("kind", ["log-space", pytest.param("linear", marks=_FULL), "viterbi", "masks"])
def test_blocked_helpers_split_the_block_sums_exactly(kind, monkeypatch):
    """Helpers (``blocked._blk_help``: programs that sum the rows older than the previous block
    for the next block while the run steps; on the interpreter the run computes their parts itself,
    as it does on a GPU whose helpers do not come): 2 of them over 3 label tiles (the plan's split:
    the rows in two parts, each helper every tile), and 4 as 2 label groups x 2 row parts (rows
    0-3 and 4-8). log Z
    and the gradients (forward and beta runs, their fix-ups), the best score, labels and starts,
    and the masked log Z equal those without helpers to float32 rounding, and log Z the
    oracle's, with two chunks of 3 blocks a sequence so that every run has blocks with a
    helpers' part, in both slots."""
    monkeypatch.setattr(plan_mod, "FORCE_BLOCKED", True)
    monkeypatch.setattr(plan_mod, "BLOCK_OVERRIDE", (4, 4, 2))
    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 12)
    monkeypatch.setattr(plan_mod, "BLOCKED_LINEAR", kind == "linear")
    inp = _long_segments_case(8)
    semiring = "max" if kind == "viterbi" else "log"
    v = validated(inp, semiring)
    masks = None
    if kind == "masks":
        from torch_semimarkov.engines.triton.limits import engine_limits

        g = torch.Generator().manual_seed(9)
        lm = torch.rand(2, 24, 5, generator=g) < 0.7
        lm[..., 0] = True
        masks = engine_limits(lm.to(v.cum_scores.device), None, 2, 24, 5, v.K, v.cum_scores.device)
    outs = {}
    assert plan_mod.helper_split(2, 3, v.K, 4) == (1, 2)  # the plan's split of 2 helpers here
    # rows of 4 a part (a block's 4 positions reach 5 old rows here; even parts would leave the
    # second empty), so that both parts hold rows the positions use and tie across parts
    for h, split in ((0, None), (2, None), (4, (2, 2, 4))):
        monkeypatch.setattr(plan_mod, "HELPERS_OVERRIDE", h)
        monkeypatch.setattr(plan_mod, "HELPER_SPLIT_OVERRIDE", split)
        p = _plan(v, semiring)
        assert p.helpers == h and p.n_chunks == 2
        if kind == "viterbi":
            outs[h] = [cpu(x) for x in launch.launch_viterbi(v.cum_scores, v.transition, v.duration_bias, v.lengths,
                                                             v.K, v.proj_start, v.proj_end, plan=p)]
        elif kind == "masks":
            z, _ = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, "log",
                                         v.proj_start, v.proj_end, plan=p, save_for_backward=False, masks=masks)
            outs[h] = [cpu(z)]
        else:
            z, grads = _forward_backward(v, p)
            outs[h] = [cpu(z), *grads]
    if kind == "viterbi":
        for h in (2, 4):
            assert_close(outs[h][0], outs[0][0], atol=1e-5, rtol=1e-6)
            assert torch.equal(outs[h][1], outs[0][1]) and torch.equal(outs[h][2], outs[0][2])
            check_viterbi(inp, *outs[h], v.lengths.tolist())
        # all-zero scores tie everywhere: the previous block's rows (shorter durations) win over
        # the helpers' ties, and an earlier row part over a later one (2 x 2 helpers here), so
        # every position starts a segment of label 0
        T = 30
        zero = {"cum_scores": torch.zeros(1, T + 1, 5), "transition": torch.zeros(5, 5),
                "duration_bias": torch.zeros(9, 5), "lengths": torch.tensor([T]), "K": 9, "proj_start": None,
                "proj_end": None}
        v = validated(zero, "max")
        _, labels, starts = launch.launch_viterbi(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K,
                                                  plan=_plan(v, "max"))
        assert cpu(labels)[0].tolist() == [0] * T and cpu(starts)[0].tolist() == [True] * T
        return
    for h in (2, 4):
        assert_close(outs[h][0], outs[0][0], atol=1e-5, rtol=1e-6)
        if kind == "masks":
            assert torch.isfinite(outs[h][0]).all()
            continue
        assert_close(outs[h][0], naive_semi_crf(**inp, semiring="log"), atol=1e-4, rtol=1e-6)
        _assert_grads_close(outs[h][1:], outs[0][1:])


def test_blocked_runs_go_on_alone_when_their_helpers_do_not_come(monkeypatch):
    """Helper programs launched (``HELP_INLINE = False``) give the outputs of a run that computes
    their tiles itself, bitwise. On the interpreter they never deliver in time (programs run one
    after another, the run first): the run waits no polls (``SPIN = 0`` off CUDA), computes the
    tiles in its own slot, and the helpers find it finished and stop. On CUDA they deliver, and
    the same bits show that the split sums do not depend on which program computed them."""
    monkeypatch.setattr(plan_mod, "FORCE_BLOCKED", True)
    monkeypatch.setattr(plan_mod, "BLOCK_OVERRIDE", (4, 4, 2))
    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 12)
    monkeypatch.setattr(plan_mod, "HELPERS_OVERRIDE", 2)
    v = validated(_long_segments_case(10))
    outs = []
    for inline in (True, False):
        monkeypatch.setattr(plan_mod, "HELP_INLINE", inline)
        saved = record_outputs(monkeypatch, launch, "forward_chunked")
        z, _ = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, "log",
                                     v.proj_start, v.proj_end, plan=_plan(v, "log"), save_for_backward=False)
        rows, frames = cpu(saved[0][0]), cpu(saved[0][1])
        # log Z, and every stored row and frame of each sequence (alpha_hat and U_hat before its end,
        # alpha_hat at it; the rest is memory no run writes)
        outs.append([cpu(z)] + [x for b, n in enumerate(v.lengths.tolist())
                                for x in (rows[:, b, :n], rows[0, b, n], frames[b, :n + 1])])
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_helpers_use_the_multiprocessors_the_runs_leave(monkeypatch):
    """Six helpers at most (they split the label tiles and the rows), none where the runs fill the
    GPU or off CUDA; beta's runs beside the forward count, only before a backward; linear-space
    sums take only the helpers they need; the split gives the busiest helper the least work."""
    h = plan_mod.blocked_helpers
    assert h(32, 1, 47, 132, False, True) == 3  # 32 runs: 4 programs each fit 132
    assert h(32, 1, 47, 132, True, True) == 1  # with beta's 32 beside: 2 each
    assert h(1, 17, 47, 132, True, True) == 2  # (1, 10^5, 4000, 47): 34 runs
    assert h(4, 33, 47, 132, False, True) == 0  # (4, 10^5, 960, 47): the runs fill the GPU
    assert h(8, 1, 20, 132, False, True) == 6  # 8 runs: 15 idle multiprocessors each, 6 at most
    assert h(32, 1, 47, 132, False, False) == 0  # the interpreter
    # the plan counts beta's runs only where a backward follows: (1, 10^5, 4000, 47) forward alone
    # takes 6 helpers a run (2 had counted beta's runs: 132 ms on an H200 against 72 ms with 3; GPU_NOTES 80)
    plain = plan_mod.make_plan(1, 100000, 4000, 47, device="cuda")
    trained = plan_mod.make_plan(1, 100000, 4000, 47, device="cuda", backward=True)
    assert (plain.n_chunks, plain.beta_early, plain.helpers) == (17, False, 6)
    assert (trained.n_chunks, trained.beta_early, trained.helpers) == (17, True, 2)
    # the in-order repair runs B programs, so it takes helpers where the spec's B·n runs leave none:
    # (4, 10^5, 960, 47) and the gene model's 8 loci (GPU_NOTES 89); a forward beside its beta counts both
    wide = plan_mod.make_plan(4, 100000, 960, 47, device="cuda")
    gene = plan_mod.make_plan(8, 118213, 960, 47, device="cuda", backward=True)
    assert (wide.helpers, wide.repair_helpers) == (0, 6) and gene.helpers == 0
    assert gene.repair_helpers == h(8, 1, 47, 132, gene.beta_early, True)
    monkeypatch.setattr(plan_mod, "REPAIR_HELPERS", False)
    assert plan_mod.make_plan(4, 100000, 960, 47, device="cuda").repair_helpers == 0
    # linear-space sums (period 1) take only the helpers they need (2,048 tile rows each): two for
    # 3 tiles of 960 rows, six at 4000 rows; a forced count stands
    lh = plan_mod.linear_helpers
    assert (lh(3, 960, 3), lh(6, 960, 3), lh(3, 4000, 3), lh(6, 4000, 3), lh(0, 4000, 3)) == (2, 2, 3, 6, 0)
    # the split: the least work for the busiest helper (label tiles / row parts), then the fewest
    # helpers, then label groups before row parts
    hs = plan_mod.helper_split
    assert hs(3, 3, 960, 64) == (3, 1) and hs(2, 3, 960, 64) == (1, 2) and hs(6, 3, 4000, 64) == (3, 2)
    assert hs(1, 3, 960, 64) == (1, 1) and hs(0, 3, 960, 64) == (0, 1) and hs(4, 3, 4000, 64) == (1, 4)
    assert hs(6, 3, 100, 64) == (3, 2) and hs(6, 1, 100, 64) == (1, 2)  # parts of whole row tiles
    monkeypatch.setattr(plan_mod, "HELPERS_OVERRIDE", 3)
    assert lh(3, 960, 3) == 3
