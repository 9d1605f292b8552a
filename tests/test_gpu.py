"""The Triton kernels on a CUDA GPU against the float64 PyTorch path (skipped without CUDA).

The long-sequence and benchmark checks live in ``scripts/gpu_check.py``; these are the quick ones.
"""

from __future__ import annotations

import pytest
import torch

from conftest import assert_close, case_id, make_inputs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CASES = [
    (4, 300, 12, 6, "ragged", "both", False),
    (3, 200, 40, 24, None, "none", False),
    (5, 150, 1, 5, "ragged", "none", False),
    (4, 120, 2, 7, None, "start", False),
    (3, 40, 64, 3, "ragged", "none", False),
    (2, 500, 200, 9, None, "end", False),
    (3, 80, 6, 5, "ragged", "both", True),
]
IDS = [case_id(B, T, K, C, lens or "", proj if proj != "none" else "", "KCC" if kcc else "")
       for B, T, K, C, lens, proj, kcc in CASES]


def _cuda(inp, dtype=torch.float32):
    return {k: (v.to("cuda", dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else
                (v.to("cuda") if isinstance(v, torch.Tensor) else v)) for k, v in inp.items()}


def _triton(inp):
    from torch_semimarkov.streaming.triton_backward import launch_streaming_triton_backward
    from torch_semimarkov.streaming.triton_forward import launch_streaming_triton_kernel
    from torch_semimarkov.streaming.validation import validate_streaming_inputs

    v = validate_streaming_inputs(**inp)
    common = (v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K)
    z, st, iv, fr = launch_streaming_triton_kernel(*common, "log", v.proj_start, v.proj_end)
    return z, launch_streaming_triton_backward(*common, z, st, iv, fr, v.proj_start, v.proj_end)


def _reference(inp):
    from torch_semimarkov.streaming import pytorch_reference as ref
    from torch_semimarkov.streaming.validation import validate_streaming_inputs

    v = validate_streaming_inputs(**inp)
    common = (v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K)
    z, ring, iv, norms = ref.semi_crf_streaming_forward_pytorch(*common, "log", v.proj_start, v.proj_end)
    return z, ref.semi_crf_streaming_backward_pytorch(*common, z, ring, iv, norms, v.proj_start, v.proj_end)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_backward_match_float64_reference(case):
    B, T, K, C, lens, proj, kcc = case
    inp = make_inputs(B, T, K, C, dtype=torch.float64, seed=7, lengths=lens, proj=proj, duration_transitions=kcc)
    z_ref, expected = _reference(inp)
    z, got = _triton(_cuda(inp, torch.float32))
    assert_close(z.cpu(), z_ref, atol=1e-4, rtol=1e-6, msg="log Z")
    for name, a, e in zip(("p_start", "p_end", "transition", "duration_bias"), got, expected):
        assert_close(a.cpu(), e, atol=2e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_viterbi_matches_float64_reference(case):
    from torch_semimarkov.streaming import pytorch_reference as ref
    from torch_semimarkov.streaming.triton_forward import launch_streaming_triton_viterbi
    from torch_semimarkov.streaming.validation import validate_streaming_inputs

    B, T, K, C, lens, proj, kcc = case
    inp = make_inputs(B, T, K, C, dtype=torch.float64, seed=8, lengths=lens, proj=proj, duration_transitions=kcc)
    v = validate_streaming_inputs(**inp, semiring="max")
    s_ref, l_ref, st_ref = ref.semi_crf_streaming_viterbi_pytorch(
        v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, v.proj_start, v.proj_end)
    g = validate_streaming_inputs(**_cuda(inp), semiring="max")
    s, labels, starts = launch_streaming_triton_viterbi(
        g.cum_scores, g.transition, g.duration_bias, g.lengths, g.K, g.proj_start, g.proj_end)
    assert_close(s.cpu(), s_ref, atol=1e-4, rtol=1e-6)
    assert torch.equal(labels.cpu(), l_ref.cpu())
    assert torch.equal(starts.cpu(), st_ref.cpu())


def test_gradients_bitwise_deterministic():
    inp = _cuda(make_inputs(8, 1000, 32, 12, dtype=torch.float32, seed=9, lengths="ragged", proj="both"))
    z0, g0 = _triton(inp)
    for _ in range(9):
        z, g = _triton(inp)
        assert torch.equal(z, z0)
        assert all(torch.equal(a, b) for a, b in zip(g, g0))


def test_public_api_gradients_match_pytorch_path():
    from torch_semimarkov.streaming.autograd import semi_crf_streaming_forward

    inp = _cuda(make_inputs(3, 257, 9, 5, dtype=torch.float64, seed=10, lengths="ragged", proj="both"))
    res = {}
    for use_triton in (True, False):
        d = {k: (v.detach().clone().requires_grad_(v.is_floating_point()) if isinstance(v, torch.Tensor) else v)
             for k, v in inp.items()}
        z = semi_crf_streaming_forward(**d, use_triton=use_triton)
        (z * torch.tensor([0.5, 1.0, 1.5], device="cuda", dtype=z.dtype)).sum().backward()
        res[use_triton] = [z] + [d[k].grad for k in ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")]
    for a, e in zip(res[True], res[False]):
        assert_close(a.detach().cpu(), e.detach().cpu(), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("kcc", [False, True], ids=["CC", "KCC"])
def test_checkpointed_recompute_is_bitwise_and_interval_independent(kcc):
    """The backward recomputes every position from the forward's checkpoints: the recomputed state
    equals a save-all forward bitwise, so the gradients do not depend on the interval."""
    from torch_semimarkov.streaming import triton_forward as tf
    from torch_semimarkov.streaming.triton_backward import launch_streaming_triton_backward
    from torch_semimarkov.streaming.validation import validate_streaming_inputs

    inp = _cuda(make_inputs(4, 600, 16, 6, dtype=torch.float32, seed=11, lengths="ragged", proj="both",
                            duration_transitions=kcc))
    v = validate_streaming_inputs(**inp)
    common = (v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K)
    _, (saved, frames, _), _ = tf._forward_impl(*common, "log", v.proj_start, v.proj_end, None, True, save_all=True)
    first = None
    for interval in (1, 7, None, 1000):
        z, st, iv, fr = tf.launch_streaming_triton_kernel(*common, "log", v.proj_start, v.proj_end, interval)
        got, got_f = tf.recompute_forward_state(*common, st, fr, iv, v.proj_start, v.proj_end)
        for b, L in enumerate(v.lengths.tolist()):
            assert torch.equal(got[0, b, :L + 1], saved[0, b, :L + 1])
            assert torch.equal(got_f[b, :L + 1], frames[b, :L + 1])
            if not kcc:
                assert torch.equal(got[1, b, :L], saved[1, b, :L])
        grads = launch_streaming_triton_backward(*common, z, st, iv, fr, v.proj_start, v.proj_end)
        if first is None:
            first = grads
        assert all(torch.equal(a, b) for a, b in zip(grads, first))
