"""The Triton kernels, run on the CPU by Triton's interpreter, against the float64 oracles.

``TRITON_INTERPRET=1`` must be set before the kernels are decorated, so it is set here before
anything imports Triton; if the kernel modules were already imported in this process they are
reloaded. Sizes are small: the interpreter runs every tile operation in NumPy.
"""

from __future__ import annotations

import math

import importlib
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from conftest import assert_close, case_id, make_inputs  # noqa: E402

from torch_semimarkov.oracle import (  # noqa: E402
    naive_marginals,
    naive_semi_crf,
    naive_semi_crf_viterbi,
    segmentation_score,
)
from torch_semimarkov.streaming import constants  # noqa: E402
from torch_semimarkov.streaming.segments import segments_from_boundaries  # noqa: E402
from torch_semimarkov.streaming.validation import validate_streaming_inputs  # noqa: E402

for _name in ("torch_semimarkov.streaming.triton_forward", "torch_semimarkov.streaming.triton_backward"):
    if _name in sys.modules:
        importlib.reload(sys.modules[_name])
from torch_semimarkov.streaming import triton_backward as tb  # noqa: E402
from torch_semimarkov.streaming import triton_forward as tf  # noqa: E402

# (B, T, K, C, lengths, proj, duration_transitions)
CASES = [
    (2, 7, 3, 3, None, "none", False),
    (3, 9, 4, 5, "ragged", "both", False),
    (2, 6, 8, 3, None, "none", False),  # K > T
    (2, 7, 1, 3, None, "start", False),  # K = 1
    (3, 12, 2, 7, "ragged", "end", False),  # K = 2, C = 7
    (1, 1, 3, 2, None, "none", False),  # T = 1
    (4, 20, 5, 6, [20, 1, 13, 7], "both", False),  # a length-1 sequence in the batch
    (2, 8, 3, 3, "ragged", "both", True),  # (K, C, C)
    (2, 5, 7, 2, None, "none", True),  # (K, C, C), K > T
    (2, 6, 1, 5, None, "none", True),  # (K, C, C), K = 1
]
IDS = [case_id(B, T, K, C, "ragged" if lens else "", proj if proj != "none" else "", "KCC" if kcc else "")
       for B, T, K, C, lens, proj, kcc in CASES]


@pytest.fixture(params=["register-ring", "memory-ring", "memory-ring-kblock2"])
def ring(request, monkeypatch):
    """Run a test with the register-ring kernels (small K·C), with the memory-ring ones (large), and
    with duration tiles of 2 so that every duration loop takes several blocks."""
    monkeypatch.setattr(tf, "FORCE_MEMORY_RING", request.param != "register-ring")
    if request.param == "memory-ring-kblock2":
        monkeypatch.setattr(tf, "K_BLOCK_OVERRIDE", 2)
    return request.param


def _inputs(case, dtype=torch.float32, seed=0, **kw):
    B, T, K, C, lens, proj, kcc = case
    return make_inputs(B, T, K, C, dtype=dtype, seed=seed, lengths=lens, proj=proj,
                       duration_transitions=kcc, **kw)


def _run_forward(inp, semiring="log"):
    v = validate_streaming_inputs(**inp, semiring=semiring)
    return v, tf.launch_streaming_triton_kernel(
        v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, semiring, v.proj_start, v.proj_end)


def _run_backward(inp):
    v, (z, state, interval, frames) = _run_forward(inp)
    out = tb.launch_streaming_triton_backward(
        v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, z, state, interval, frames,
        v.proj_start, v.proj_end)
    return z, out


def _row(t, b):
    return None if t is None else t[b]


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


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("semiring", ["log", "max"])
def test_forward_matches_oracle(case, semiring, ring):
    inp = _inputs(case, seed=1)
    _, (z, state, _, _) = _run_forward(inp, semiring)
    assert z.dtype == torch.float32
    assert_close(z, naive_semi_crf(**inp, semiring=semiring), atol=1e-5, rtol=1e-6, msg=semiring)


def test_forward_float64_inputs_return_float64():
    inp = _inputs(CASES[1], dtype=torch.float64, seed=3)
    _, (z, _, _, _) = _run_forward(inp)
    assert z.dtype == torch.float64
    assert_close(z, naive_semi_crf(**inp), atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_backward_matches_oracle(case, ring):
    inp = _inputs(case, seed=2)
    z, (p_start, p_end, g_tr, g_db) = _run_backward(inp)
    log_z, start, end, _, _ = naive_marginals(**inp)
    ref_tr, ref_db = _oracle_param_grads(inp)
    assert_close(z, log_z, atol=1e-5, rtol=1e-6, msg="log Z")
    assert_close(p_start, start, atol=2e-6, rtol=1e-5, msg="P_start")
    assert_close(p_end, end, atol=2e-6, rtol=1e-5, msg="P_end")
    assert_close(g_tr, ref_tr, atol=1e-5, rtol=1e-5, msg="transition")
    assert_close(g_db, ref_db, atol=1e-5, rtol=1e-5, msg="duration_bias")


def test_backward_matches_streaming_reference(ring):
    ref = pytest.importorskip("torch_semimarkov.streaming.pytorch_reference")
    inp = _inputs(CASES[6], dtype=torch.float64, seed=4)
    v = validate_streaming_inputs(**inp)
    z_ref, ring, interval, norms = ref.semi_crf_streaming_forward_pytorch(
        v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, "log", v.proj_start, v.proj_end)
    expected = ref.semi_crf_streaming_backward_pytorch(
        v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, z_ref, ring, interval, norms,
        v.proj_start, v.proj_end)
    z, got = _run_backward(inp)
    assert_close(z, z_ref, atol=1e-5, rtol=1e-6, msg="log Z")
    for name, a, e in zip(("p_start", "p_end", "transition", "duration_bias"), got, expected):
        assert a.dtype == torch.float64
        assert_close(a, e, atol=2e-6, rtol=1e-5, msg=name)


def test_forbidden_transitions_and_long_sequence_stay_finite(ring):
    """-inf transitions (clamped to NEG_INF) and large scores over many steps: no NaN, right values."""
    inp = make_inputs(2, 150, 6, 4, dtype=torch.float32, seed=5, lengths=[150, 97], scale=4.0)
    tr = inp["transition"].clone()
    tr[0, 1] = float("-inf")
    tr[2, :] = float("-inf")
    inp["transition"] = tr
    z, (p_start, p_end, g_tr, g_db) = _run_backward(inp)
    log_z, start, end, _, _ = naive_marginals(**inp)
    assert_close(z, log_z, atol=1e-4, rtol=1e-6, msg="log Z")
    assert_close(p_start, start, atol=1e-5, rtol=1e-4, msg="P_start")
    assert_close(p_end, end, atol=1e-5, rtol=1e-4, msg="P_end")
    assert float(g_tr[:, 0, 1].abs().max()) == 0.0
    assert float(g_tr[:, 2, :].abs().max()) == 0.0
    assert bool(torch.isfinite(g_db).all())
    assert constants.NEG_INF > -1e30


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_viterbi_matches_oracle(case, ring):
    inp = _inputs(case, seed=3)
    v = validate_streaming_inputs(**inp, semiring="max")
    scores, labels, starts = tf.launch_streaming_triton_viterbi(
        v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, v.proj_start, v.proj_end)
    ref_scores, ref_segments = naive_semi_crf_viterbi(**inp)
    assert_close(scores, ref_scores, atol=1e-5, rtol=1e-6)
    assert labels.dtype == torch.int64 and starts.dtype == torch.bool
    for b, L in enumerate(v.lengths.tolist()):
        segs = segments_from_boundaries(labels[b].numpy(), starts[b].numpy(), L)
        if segs != ref_segments[b]:
            # an exact tie in float64 may be broken differently by float32 rounding
            own = segmentation_score(inp["cum_scores"][b], inp["transition"], inp["duration_bias"], segs,
                                     _row(inp["proj_start"], b), _row(inp["proj_end"], b))
            assert abs(own - float(ref_scores[b])) < 1e-5, f"sequence {b}: {segs} != {ref_segments[b]}"
        assert bool((labels[b, L:] == -1).all()) and not bool(starts[b, L:].any())


def test_viterbi_ties_break_to_smallest_index():
    """All-zero scores: every segmentation ties (log C, the first segment's phantom term); the
    smallest index wins at each choice."""
    B, T, K, C = 1, 5, 3, 3
    S = torch.zeros(B, T + 1, C)
    scores, labels, starts = tf.launch_streaming_triton_viterbi(
        S, torch.zeros(C, C), torch.zeros(K, C), torch.tensor([T]), K)
    assert abs(float(scores[0]) - math.log(C)) < 1e-6
    # final label 0, then duration 1 at every step, source label 0
    assert labels[0].tolist() == [0] * T
    assert starts[0].tolist() == [True] * T


# --- checkpointed backward: the forward saves checkpoints every `interval` positions and the
# backward recomputes every position from them. Ragged lengths put interval ends past some lengths.
CKPT_CASES = [
    (3, 12, 3, 5, [12, 1, 5], "both", False),  # intervals of 2, 3, 7 end past lengths 1 and 5
    (2, 8, 3, 3, [8, 3], "both", True),  # (K, C, C): one kernel whatever the ring fixture says
]
CKPT_IDS = ["B3-T12-K3-C5-ragged-both", "B2-T8-K3-C3-ragged-both-KCC"]
INTERVALS = [1, 2, 3, 7, 50]  # 50 > T: one checkpoint (the initial state) per sequence


def _skip_duplicate(case, ring):
    if case[6] and ring != "register-ring":
        pytest.skip("(K, C, C) transitions use one kernel for every ring setting")


def _save_all_state(v):
    """The forward run in save-all mode: every position's alpha_hat / U_hat and frames."""
    out, (saved, frames, _), _ = tf._forward_impl(
        v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, "log", v.proj_start, v.proj_end,
        None, True, save_all=True)
    return out, saved, frames


@pytest.mark.parametrize("case", CKPT_CASES, ids=CKPT_IDS)
def test_recompute_reproduces_save_all_forward_bitwise(case, ring):
    _skip_duplicate(case, ring)
    inp = _inputs(case, seed=6)
    v = validate_streaming_inputs(**inp)
    args = (v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K)
    z_all, saved, frames = _save_all_state(v)
    T = v.cum_scores.shape[1] - 1
    for interval in INTERVALS:
        z, ck32, delta, ck64 = tf.launch_streaming_triton_kernel(*args, "log", v.proj_start, v.proj_end, interval)
        assert delta == min(interval, T)
        assert ck32.shape[1] == -(-T // delta) and ck64.shape[1] == ck32.shape[1]
        assert torch.equal(z, z_all.to(z.dtype))
        got, got_f = tf.recompute_forward_state(*args, ck32, ck64, delta, v.proj_start, v.proj_end)
        for b, L in enumerate(v.lengths.tolist()):
            assert torch.equal(got[0, b, :L + 1], saved[0, b, :L + 1]), (interval, b, "alpha_hat")
            if saved.shape[0] > 1:  # U_hat exists for positions 0 .. L-1
                assert torch.equal(got[1, b, :L], saved[1, b, :L]), (interval, b, "U_hat")
            assert torch.equal(got_f[b, :L + 1], frames[b, :L + 1]), (interval, b, "frames")


@pytest.mark.parametrize("case", CKPT_CASES, ids=CKPT_IDS)
def test_backward_checkpoint_intervals_match_save_all_and_oracle(case, ring, monkeypatch):
    _skip_duplicate(case, ring)
    inp = _inputs(case, seed=7)
    v = validate_streaming_inputs(**inp)
    args = (v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K)
    log_z, start, end, _, _ = naive_marginals(**inp)
    ref_tr, ref_db = _oracle_param_grads(inp)
    results = []
    for interval in INTERVALS:
        z, ck32, delta, ck64 = tf.launch_streaming_triton_kernel(*args, "log", v.proj_start, v.proj_end, interval)
        results.append(tb.launch_streaming_triton_backward(*args, z, ck32, delta, ck64, v.proj_start, v.proj_end))
    # the backward on the save-all forward's state (no recompute)
    z_all, saved, frames = _save_all_state(v)
    monkeypatch.setattr(tb, "recompute_forward_state", lambda *a, **k: (saved, frames))
    expected = tb.launch_streaming_triton_backward(*args, z_all.float(), saved, 1, frames, v.proj_start, v.proj_end)
    names = ("P_start", "P_end", "transition", "duration_bias")
    for interval, got in zip(INTERVALS, results):
        for name, a, e in zip(names, got, expected):
            assert torch.equal(a, e), (interval, name)
    assert_close(z_all, log_z, atol=1e-5, rtol=1e-6, msg="log Z")
    p_start, p_end, g_tr, g_db = expected
    assert_close(p_start, start, atol=2e-6, rtol=1e-5, msg="P_start")
    assert_close(p_end, end, atol=2e-6, rtol=1e-5, msg="P_end")
    assert_close(g_tr, ref_tr, atol=1e-5, rtol=1e-5, msg="transition")
    assert_close(g_db, ref_db, atol=1e-5, rtol=1e-5, msg="duration_bias")


def test_checkpoint_memory_is_sublinear_in_T():
    """Saved state between forward and backward: O((T / interval)·K·C), not O(T·C)."""
    inp = make_inputs(1, 200, 2, 3, dtype=torch.float32, seed=8)
    v = validate_streaming_inputs(**inp)
    z, ck32, delta, ck64 = tf.launch_streaming_triton_kernel(
        v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, "log")
    assert delta == 20  # max(K, int(sqrt(T·K)))
    saved_bytes = ck32.numel() * 4 + ck64.numel() * 8
    save_all_bytes = 2 * 201 * 3 * 4 + 201 * 8
    assert saved_bytes * 5 < save_all_bytes
    _, none_state, _, _ = tf.launch_streaming_triton_kernel(
        v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, "log", save_for_backward=False)
    assert none_state is None
