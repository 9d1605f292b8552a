"""Forward kernels (``kernels/forward.py``), sequential and time-parallel, against the oracles."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_close, make_inputs
from kernel_cases import CASES, IDS, adversarial, cpu, inputs, record_outputs, run_forward, validated
from torch_semimarkov.oracle import naive_semi_crf
from torch_semimarkov.engines.triton import launch, parallel


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("semiring", ["log", "max"])
def test_forward_matches_oracle(case, semiring, ring, engine):
    inp = inputs(case, seed=1)
    z, _, _ = run_forward(validated(inp, semiring), semiring, engine, save_for_backward=False)
    assert z.dtype == torch.float64
    assert_close(cpu(z), naive_semi_crf(**inp, semiring=semiring), atol=1e-5, rtol=1e-6, msg=semiring)


def test_forward_float64_inputs(engine):
    inp = inputs(CASES[1], dtype=torch.float64, seed=3)
    z, _, _ = run_forward(validated(inp), "log", engine, save_for_backward=False)
    assert_close(cpu(z), naive_semi_crf(**inp), atol=1e-5, rtol=1e-6)


def test_forbidden_transitions_and_long_sequence_stay_finite(ring, engine, monkeypatch):
    """-inf transitions and large scores over many steps: no NaN, right values."""
    from torch_semimarkov.engines.triton import plan as plan_mod

    if engine == "parallel":  # 4 chunks of 38 (the engine fixture's chunks of K = 6 made 25)
        monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 38)
    inp = make_inputs(2, 150, 6, 4, dtype=torch.float32, seed=5, lengths=[150, 97], scale=4.0)
    tr = inp["transition"].clone()
    tr[0, 1] = float("-inf")
    tr[2, :] = float("-inf")
    inp["transition"] = tr
    z, _, _ = run_forward(validated(inp), "log", engine, save_for_backward=False)
    assert_close(cpu(z), naive_semi_crf(**inp), atol=1e-4, rtol=1e-6)


@pytest.mark.covering(strength=2)  # the interpreter runs 4 of the 8: every pair of values
@pytest.mark.parametrize("kcc", [False, True], ids=["CC", "KCC"])
@pytest.mark.parametrize("kind", ["cyclic", "frame"])
@pytest.mark.parametrize("semiring", ["log", "max"])
def test_parallel_forward_is_exact_on_models_that_never_converge(kind, semiring, kcc, monkeypatch):
    """Chunks that never converge within their length hand their true state on (repair): the
    result is the sequential kernel's, and every position's state too."""
    from torch_semimarkov.engines.triton import plan as plan_mod

    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 12)
    # 3 chunks of 12 (T = 60 ran 5): the middle chunk's fix-up still fails and repairs (asserted below)
    inp = adversarial(kind, 2, 36, 6 if not kcc else 4, 3, kcc=kcc)
    v = validated(inp, semiring)
    p = launch.plan_for(v.cum_scores, v.transition, v.K, semiring, time_parallel=True)
    assert p.time_parallel and p.n_chunks == 3 and p.kind == ("dur" if kcc else "reg")
    # the chunked forward's every-position state and fix-up stats as the time-parallel launch
    # computed them (a second forward_chunked call of the same inputs ran the same kernels again)
    chunked = record_outputs(monkeypatch, launch, "forward_chunked")
    seq = launch.plan_for(v.cum_scores, v.transition, v.K, semiring, time_parallel=False)
    z_seq, _ = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, semiring, plan=seq,
                                     save_for_backward=False)
    assert chunked == []
    z_par, _ = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, semiring, plan=p,
                                     save_for_backward=False)
    assert len(chunked) == 1
    saved, frames, _, stats = chunked[0]
    assert_close(cpu(z_par), cpu(z_seq), atol=1e-5, rtol=1e-6)
    assert_close(cpu(z_par), naive_semi_crf(**inp, semiring=semiring), atol=1e-5, rtol=1e-6)
    if semiring == "log":
        assert not bool(stats.converged[:, 1:].all()), "the adversarial model should defeat some fix-ups"
        # every position's state equals the save-all sequential forward's (up to float32 rounding)
        _, state = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, "log",
                                         plan=seq, save="all")
        s_saved, s_frames = state
        for b, L in enumerate(v.lengths.tolist()):
            a1 = cpu(saved[0, b, : L + 1]).double() + cpu(frames[b, : L + 1])[:, None]
            a2 = cpu(s_saved[0, b, : L + 1]).double() + cpu(s_frames[b, : L + 1])[:, None]
            real = a2 > -1e20
            assert torch.equal(real, a1 > -1e20)
            assert_close(a1[real], a2[real], atol=1e-4, rtol=1e-6, msg=f"alpha of sequence {b}")


@pytest.mark.parametrize("kcc", [False, True], ids=["CC", "KCC"])
def test_parallel_forward_is_deterministic(kcc, monkeypatch):
    from torch_semimarkov.engines.triton import plan as plan_mod

    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 8)
    inp = make_inputs(3, 50 if not kcc else 30, 4 if not kcc else 3, 3, dtype=torch.float32, seed=9,
                      lengths="ragged", proj="both", duration_transitions=kcc)
    v = validated(inp)
    runs = [run_forward(v, "log", "parallel")[1] for _ in range(2)]
    for a, b in zip(runs[0], runs[1]):  # positions past a length are never written (NaN here)
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("kcc", [False, True], ids=["CC", "KCC"])
def test_fix_up_stats_report_convergence(kcc, monkeypatch):
    from torch_semimarkov.engines.triton import plan as plan_mod

    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 16)
    inp = make_inputs(1, 80, 3, 4, dtype=torch.float32, seed=10, scale=2.0, duration_transitions=kcc)
    v = validated(inp)
    p = launch.plan_for(v.cum_scores, v.transition, v.K, "log", time_parallel=True)
    _, _, _, stats = parallel.forward_chunked(v.cum_scores, v.transition, v.duration_bias, v.lengths, "log", None,
                                              None, p)
    assert stats.converged.shape == (1, 5)
    # sharp random scores converge in about K positions: at least K, well within the chunk
    steps = cpu(stats.steps)[0, 1:]
    assert bool(stats.converged.all()) and int(steps.min()) >= 3 and int(steps.max()) < 16
