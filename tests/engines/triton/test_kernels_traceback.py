"""Viterbi (``kernels/forward.py`` max semiring and ``kernels/traceback.py``), sequential and
time-parallel, against the oracles."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import assert_close
from kernel_cases import CASES, IDS, adversarial, cpu, inputs, run_viterbi, validated
from torch_semimarkov.oracle import naive_semi_crf_viterbi, segmentation_score
from torch_semimarkov.engines.triton import launch
from torch_semimarkov.core.segments import segments_from_boundaries


def _row(t, b):
    return None if t is None else t[b]


def _check(inp, scores, labels, starts, lengths):
    ref_scores, ref_segments = naive_semi_crf_viterbi(**inp)
    scores, labels, starts = cpu(scores), cpu(labels), cpu(starts)
    assert_close(scores, ref_scores, atol=1e-5, rtol=1e-6)
    assert labels.dtype == torch.int64 and starts.dtype == torch.bool
    for b, L in enumerate(lengths):
        segs = segments_from_boundaries(labels[b].numpy(), starts[b].numpy(), L)
        if segs != ref_segments[b]:
            # an exact tie in float64 may be broken differently by float32 rounding
            own = segmentation_score(inp["cum_scores"][b], inp["transition"], inp["duration_bias"], segs,
                                     _row(inp["proj_start"], b), _row(inp["proj_end"], b))
            assert abs(own - float(ref_scores[b])) < 1e-5, f"sequence {b}: {segs} != {ref_segments[b]}"
        assert bool((labels[b, L:] == -1).all()) and not bool(starts[b, L:].any())


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_viterbi_matches_oracle(case, ring, engine):
    inp = inputs(case, seed=3)
    v = validated(inp, "max")
    scores, labels, starts = run_viterbi(v, engine)
    _check(inp, scores, labels, starts, v.lengths.tolist())


@pytest.mark.parametrize("kcc", [False, True], ids=["CC", "KCC"])
def test_viterbi_ties_break_to_smallest_index(kcc, engine, monkeypatch):
    """All-zero scores: every segmentation ties (log C, the first segment's phantom term); the
    smallest index wins at each choice."""
    B, T, K, C = 1, 9, 3, 3
    tr = torch.zeros(K, C, C) if kcc else torch.zeros(C, C)
    inp = {"cum_scores": torch.zeros(B, T + 1, C), "transition": tr, "duration_bias": torch.zeros(K, C),
           "lengths": torch.tensor([T]), "K": K, "proj_start": None, "proj_end": None}
    scores, labels, starts = run_viterbi(validated(inp, "max"), engine)
    assert abs(float(scores[0]) - math.log(C)) < 1e-6
    # final label 0, then duration 1 at every step, source label 0
    assert cpu(labels)[0].tolist() == [0] * T
    assert cpu(starts)[0].tolist() == [True] * T


@pytest.mark.parametrize("kcc", [False, True], ids=["CC", "KCC"])
@pytest.mark.parametrize("kind", ["cyclic", "frame"])
def test_parallel_viterbi_equals_sequential_on_adversarial_models(kind, kcc, monkeypatch):
    from torch_semimarkov.engines.triton import plan as plan_mod

    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 8)
    # 4 chunks of 8 (T = 64 and 40 ran 8 and 5)
    inp = adversarial(kind, 3, 32, 6 if not kcc else 4, 3, seed=4, kcc=kcc)
    v = validated(inp, "max")
    assert launch.plan_for(v.cum_scores, v.transition, v.K, "max", time_parallel=True).n_chunks == 4
    seq = launch.launch_viterbi(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K,
                                plan=launch.plan_for(v.cum_scores, v.transition, v.K, "max", time_parallel=False))
    par = run_viterbi(v, "parallel")
    assert torch.equal(cpu(seq[1]), cpu(par[1])) and torch.equal(cpu(seq[2]), cpu(par[2]))
    finite = torch.isfinite(cpu(seq[0]))
    assert_close(cpu(par[0])[finite], cpu(seq[0])[finite], atol=1e-5, rtol=1e-6)
    _check(inp, par[0], par[1], par[2], v.lengths.tolist())
