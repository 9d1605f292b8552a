"""Backward kernels (``kernels/beta.py``, ``kernels/marginals.py``, ``kernels/recompute.py``),
sequential and time-parallel, against the oracles; checkpointed recompute bitwise."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_close, make_inputs
from kernel_cases import CASES, IDS, adversarial, cpu, inputs, record_outputs, run_backward, run_forward, validated
from torch_semimarkov.oracle import naive_marginals, naive_semi_crf
from torch_semimarkov.engines.triton import launch
from torch_semimarkov.engines.triton.recompute import recompute_forward_state


def _oracle_param_grads(inp):
    """Per-sequence d log Z / d transition and d log Z / d duration_bias by autograd (float64)."""
    B = inp["cum_scores"].shape[0]
    g_tr, g_db = [], []
    for b in range(B):
        sub = {k: (v[b:b + 1] if isinstance(v, torch.Tensor) and k not in ("transition", "duration_bias") else v)
               for k, v in inp.items()}
        sub["transition"] = inp["transition"].double().clone().requires_grad_(True)
        sub["duration_bias"] = inp["duration_bias"].double().clone().requires_grad_(True)
        z = naive_semi_crf(**sub)
        a, d = torch.autograd.grad(z.sum(), (sub["transition"], sub["duration_bias"]))
        g_tr.append(a)
        g_db.append(d)
    return torch.stack(g_tr), torch.stack(g_db)


def _check_against_oracle(inp, z, out, tol=1.0):
    p_start, p_end, g_tr, g_db = (cpu(t) for t in out)
    log_z, start, end, _, _ = naive_marginals(**inp)
    ref_tr, ref_db = _oracle_param_grads(inp)
    assert_close(cpu(z), log_z, atol=1e-5 * tol, rtol=1e-6 * tol, msg="log Z")
    assert_close(p_start, start, atol=2e-6 * tol, rtol=1e-5 * tol, msg="P_start")
    assert_close(p_end, end, atol=2e-6 * tol, rtol=1e-5 * tol, msg="P_end")
    assert_close(g_tr, ref_tr, atol=1e-5 * tol, rtol=1e-5 * tol, msg="transition")
    assert_close(g_db, ref_db, atol=1e-5 * tol, rtol=1e-5 * tol, msg="duration_bias")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_backward_matches_oracle(case, ring, engine):
    inp = inputs(case, seed=2)
    z, out = run_backward(validated(inp), engine)
    _check_against_oracle(inp, z, out)


def test_backward_matches_streaming_reference(ring, engine):
    ref = pytest.importorskip("torch_semimarkov.engines.torch.reference")
    inp = inputs(CASES[6], dtype=torch.float64, seed=4)
    v = validated(inp)
    z_ref, ring_ck, interval, norms = ref.semi_crf_streaming_forward_pytorch(
        v.cum_scores.cpu(), v.transition.cpu(), v.duration_bias.cpu(), v.lengths.cpu(), v.K, "log",
        cpu(v.proj_start), cpu(v.proj_end))
    expected = ref.semi_crf_streaming_backward_pytorch(
        v.cum_scores.cpu(), v.transition.cpu(), v.duration_bias.cpu(), v.lengths.cpu(), v.K, z_ref, ring_ck, interval,
        norms, cpu(v.proj_start), cpu(v.proj_end))
    z, got = run_backward(v, engine)
    assert_close(cpu(z), z_ref, atol=1e-5, rtol=1e-6, msg="log Z")
    for name, a, e in zip(("p_start", "p_end", "transition", "duration_bias"), got, expected):
        assert a.dtype == torch.float64
        assert_close(cpu(a), e, atol=2e-6, rtol=1e-5, msg=name)


def test_forbidden_transitions_and_long_sequence_backward(ring, engine, monkeypatch):
    # T = 100, ragged: 4 chunks of 25 in the time-parallel engine (the engine fixture's chunks of
    # K = 6 made 17)
    from torch_semimarkov.engines.triton import plan as plan_mod

    if engine == "parallel":
        monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 25)
    inp = make_inputs(2, 100, 6, 4, dtype=torch.float32, seed=5, lengths=[100, 71], scale=4.0)
    tr = inp["transition"].clone()
    tr[0, 1] = float("-inf")
    tr[2, :] = float("-inf")
    inp["transition"] = tr
    z, (p_start, p_end, g_tr, g_db) = run_backward(validated(inp), engine)
    log_z, start, end, _, _ = naive_marginals(**inp)
    assert_close(cpu(z), log_z, atol=1e-4, rtol=1e-6, msg="log Z")
    assert_close(cpu(p_start), start, atol=1e-5, rtol=1e-4, msg="P_start")
    assert_close(cpu(p_end), end, atol=1e-5, rtol=1e-4, msg="P_end")
    assert float(g_tr[:, 0, 1].abs().max()) == 0.0
    assert float(g_tr[:, 2, :].abs().max()) == 0.0
    assert bool(torch.isfinite(g_db).all())


def test_duration_transition_marginals_over_chunks_match_oracle():
    """The (K, C, C) marginal kernel (durations outside, starts inside) over several chunks of
    starts, one sequence ending inside the first: every marginal against the oracle."""
    from torch_semimarkov.engines.triton import plan as plan_mod

    case = (2, 70, 12, 4, [70, 17], "both", True)
    assert plan_mod.duration_marginal_chunks(2, 70, 12, 4)[1] == 3
    inp = inputs(case, seed=4)
    z, out = run_backward(validated(inp), "sequential")
    _check_against_oracle(inp, z, out)


@pytest.mark.covering(strength=1)  # the interpreter runs 2 of the 4: each model and each transition shape
@pytest.mark.parametrize("kcc", [False, True], ids=["CC", "KCC"])
@pytest.mark.parametrize("kind", ["cyclic", "frame"])
def test_parallel_backward_is_exact_on_models_that_never_converge(kind, kcc, monkeypatch):
    from torch_semimarkov.engines.triton import plan as plan_mod

    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 12)
    inp = adversarial(kind, 2, 36, 6 if not kcc else 4, 3, kcc=kcc)  # 3 chunks of 12 (T = 48 ran 4)
    v = validated(inp)
    p = launch.plan_for(v.cum_scores, v.transition, v.K, "log", time_parallel=True)
    assert p.kind == ("dur" if kcc else "reg") and p.n_chunks == 3
    # the beta fix-up's stats as the backward computed them (not a second beta_chunked call)
    betas = record_outputs(monkeypatch, launch, "beta_chunked")
    z, out = run_backward(v, "parallel")
    assert len(betas) == 1
    _, _, stats = betas[0]
    assert not bool(stats.converged[:, :-1].all()), "the adversarial model should defeat some fix-ups"
    _check_against_oracle(inp, z, out, tol=2.0)


# --- checkpointed backward (sequential engine): the forward saves checkpoints every `interval`
# positions and the backward recomputes every position from them. Ragged lengths put interval ends
# past some lengths.
CKPT_CASES = [
    (3, 12, 3, 5, [12, 1, 5], "both", False),  # intervals of 2, 3, 7 end past lengths 1 and 5
    (2, 8, 3, 3, [8, 3], "both", True),  # (K, C, C): one kernel whatever the ring fixture says
]
CKPT_IDS = ["B3-T12-K3-C5-ragged-both", "B2-T8-K3-C3-ragged-both-KCC"]
INTERVALS = [1, 2, 3, 7, 50]  # 50 > T: one checkpoint (the initial state) per sequence


def _skip_duplicate(case, ring):
    if case[6] and ring != "register-ring":
        pytest.skip("(K, C, C) transitions use one kernel for every ring setting")


def _plan(v, interval=None):
    return launch.plan_for(v.cum_scores, v.transition, v.K, "log", time_parallel=False, checkpoint_interval=interval)


def _save_all(v):
    """The sequential forward run in save-all mode: every position's alpha_hat / U_hat and frames."""
    z, state = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, "log",
                                     v.proj_start, v.proj_end, plan=_plan(v), save="all")
    return z, state


@pytest.mark.parametrize("case", CKPT_CASES, ids=CKPT_IDS)
def test_recompute_reproduces_save_all_forward_bitwise(case, ring):
    _skip_duplicate(case, ring)
    v = validated(inputs(case, seed=6))
    z_all, (saved, frames) = _save_all(v)
    T = v.T
    for interval in INTERVALS:
        plan = _plan(v, interval)
        z, state = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, "log",
                                         v.proj_start, v.proj_end, plan=plan)
        ck32, ck64 = state
        assert plan.interval == min(interval, T)
        assert ck32.shape[1] == -(-T // plan.interval) and ck64.shape[1] == ck32.shape[1]
        assert torch.equal(z, z_all)
        got, got_f = recompute_forward_state(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.proj_start,
                                             v.proj_end, plan, ck32, ck64)
        for b, L in enumerate(v.lengths.tolist()):
            assert torch.equal(got[0, b, :L + 1], saved[0, b, :L + 1]), (interval, b, "alpha_hat")
            if saved.shape[0] > 1:  # U_hat exists for positions 0 .. L-1
                assert torch.equal(got[1, b, :L], saved[1, b, :L]), (interval, b, "U_hat")
            assert torch.equal(got_f[b, :L + 1], frames[b, :L + 1]), (interval, b, "frames")


@pytest.mark.parametrize("case", CKPT_CASES, ids=CKPT_IDS)
def test_backward_checkpoint_intervals_match_save_all_and_oracle(case, ring, monkeypatch):
    _skip_duplicate(case, ring)
    inp = inputs(case, seed=7)
    v = validated(inp)
    args = (v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, v.proj_start, v.proj_end)
    results = []
    for interval in INTERVALS:
        plan = _plan(v, interval)
        _, state = launch.launch_forward(*args[:5], "log", *args[5:], plan=plan)
        results.append(launch.launch_backward(*args, plan=plan, state=state))
    # the backward on the save-all forward's state (no recompute)
    z_all, state = _save_all(v)
    monkeypatch.setattr(launch, "recompute_forward_state", lambda *a, **k: tuple(state))
    expected = launch.launch_backward(*args, plan=_plan(v), state=state)
    names = ("P_start", "P_end", "transition", "duration_bias")
    for interval, got in zip(INTERVALS, results):
        for name, a, e in zip(names, got, expected):
            assert torch.equal(a, e), (interval, name)
    _check_against_oracle(inp, z_all, expected)


def test_checkpoint_memory_is_sublinear_in_T():
    """Saved state between the sequential forward and its backward: O((T / interval)·K·C)."""
    v = validated(make_inputs(1, 200, 2, 3, dtype=torch.float32, seed=8))
    z, state, plan = run_forward(v, "log", "sequential")
    assert plan.interval == 20  # max(K, int(sqrt(T·K)))
    saved_bytes = state.first.numel() * 4 + state.second.numel() * 8
    save_all_bytes = 2 * 201 * 3 * 4 + 201 * 8
    assert saved_bytes * 5 < save_all_bytes
    _, none_state, _ = run_forward(v, "log", "sequential", save_for_backward=False)
    assert none_state is None
