"""The Triton kernels on a CUDA GPU against the float64 PyTorch path (skipped without CUDA), with
one program per sequence and parallel over time.

The interpreter tests (``tests/test_kernels_*.py``) run on CUDA too when one is present; the
long-sequence checks live in ``scripts/gpu_check.py``; these are the quick ones at sizes where
the time-parallel engine takes several chunks by itself, and one ring too large for registers
(the blocked engine, ``kernels/blocked.py``).
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
    (4, 3000, 12, 6, "ragged", "both", False),
    (3, 2000, 40, 24, None, "none", False),
    (5, 1500, 1, 5, "ragged", "none", False),
    (4, 1200, 2, 7, None, "start", False),
    (3, 400, 64, 3, "ragged", "none", False),
    (2, 5000, 200, 9, None, "end", False),
    (3, 80, 6, 5, "ragged", "both", True),
    (2, 3000, 300, 40, "ragged", "both", False),  # a 512 x 64 ring: the blocked engine (parallel)
    (2, 3000, 520, 17, "ragged", "both", True),  # a 1024 x 32 (K, C, C) state: two chunks (parallel)
]
IDS = [case_id(B, T, K, C, lens or "", proj if proj != "none" else "", "KCC" if kcc else "")
       for B, T, K, C, lens, proj, kcc in CASES]
ENGINES = [False, True]


def _cuda(inp, dtype=torch.float32):
    return {k: (v.to("cuda", dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else
                (v.to("cuda") if isinstance(v, torch.Tensor) else v)) for k, v in inp.items()}


def _plan(v, semiring, parallel):
    from torch_semimarkov.engines.triton import launch

    try:
        p = launch.plan_for(v.cum_scores, v.transition, v.K, semiring, time_parallel=parallel)
    except ValueError as exc:
        pytest.skip(str(exc))
    if parallel and not p.time_parallel:
        pytest.skip("one chunk")
    return p


def _triton(inp, parallel):
    from torch_semimarkov.engines.triton import launch
    from torch_semimarkov.core.validation import validate_streaming_inputs

    v = validate_streaming_inputs(**inp)
    plan = _plan(v, "log", parallel)
    common = (v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K)
    z, state = launch.launch_forward(*common, "log", v.proj_start, v.proj_end, plan=plan)
    return z, launch.launch_backward(*common, v.proj_start, v.proj_end, plan=plan, state=state)


def _reference(inp):
    from torch_semimarkov.engines.torch import reference as ref
    from torch_semimarkov.core.validation import validate_streaming_inputs

    v = validate_streaming_inputs(**inp)
    common = (v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K)
    z, ring, iv, norms = ref.semi_crf_streaming_forward_pytorch(*common, "log", v.proj_start, v.proj_end)
    return z, ref.semi_crf_streaming_backward_pytorch(*common, z, ring, iv, norms, v.proj_start, v.proj_end)


@pytest.mark.parametrize("parallel", ENGINES, ids=["sequential", "parallel"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_backward_match_float64_reference(case, parallel):
    B, T, K, C, lens, proj, kcc = case
    inp = make_inputs(B, T, K, C, dtype=torch.float64, seed=7, lengths=lens, proj=proj, duration_transitions=kcc)
    z, got = _triton(_cuda(inp, torch.float32), parallel)
    z_ref, expected = _reference(inp)
    assert_close(z.cpu(), z_ref, atol=1e-4, rtol=1e-6, msg="log Z")
    for name, a, e in zip(("p_start", "p_end", "transition", "duration_bias"), got, expected):
        assert_close(a.cpu(), e, atol=2e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("parallel", ENGINES, ids=["sequential", "parallel"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_viterbi_matches_float64_reference(case, parallel):
    from torch_semimarkov.engines.torch import reference as ref
    from torch_semimarkov.engines.triton import launch
    from torch_semimarkov.core.validation import validate_streaming_inputs

    B, T, K, C, lens, proj, kcc = case
    inp = make_inputs(B, T, K, C, dtype=torch.float64, seed=8, lengths=lens, proj=proj, duration_transitions=kcc)
    v = validate_streaming_inputs(**inp, semiring="max")
    s_ref, l_ref, st_ref = ref.semi_crf_streaming_viterbi_pytorch(
        v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, v.proj_start, v.proj_end)
    g = validate_streaming_inputs(**_cuda(inp), semiring="max")
    s, labels, starts = launch.launch_viterbi(g.cum_scores, g.transition, g.duration_bias, g.lengths, g.K,
                                              g.proj_start, g.proj_end, plan=_plan(g, "max", parallel))
    assert_close(s.cpu(), s_ref, atol=1e-4, rtol=1e-6)
    if not (torch.equal(labels.cpu(), l_ref.cpu()) and torch.equal(starts.cpu(), st_ref.cpu())):
        # exact ties (same-label neighbours swapping durations) break differently in float32: the
        # segmentation found must score the best score
        from torch_semimarkov.oracle import segmentation_score
        from torch_semimarkov.core.segments import segments_from_boundaries

        for b, L in enumerate(v.lengths.tolist()):
            segs = segments_from_boundaries(labels[b].cpu().numpy(), starts[b].cpu().numpy(), L)
            row = (lambda t: None if t is None else t[b])  # noqa: E731
            sc = segmentation_score(inp["cum_scores"][b], inp["transition"], inp["duration_bias"], segs,
                                    row(inp["proj_start"]), row(inp["proj_end"]))
            assert abs(sc - float(s_ref[b])) <= 1e-6 * max(1.0, abs(float(s_ref[b]))), f"sequence {b}"


@pytest.mark.parametrize("parallel,K,C", [(False, 32, 12), (True, 32, 12), (True, 300, 40)],
                         ids=["sequential", "parallel", "blocked"])
def test_gradients_bitwise_deterministic(parallel, K, C):
    inp = _cuda(make_inputs(8, 3000, K, C, dtype=torch.float32, seed=9, lengths="ragged", proj="both"))
    z0, g0 = _triton(inp, parallel)
    for _ in range(9):
        z, g = _triton(inp, parallel)
        assert torch.equal(z, z0)
        assert all(torch.equal(a, b) for a, b in zip(g, g0))


@pytest.mark.parametrize("time_parallel", [None, False, True])
def test_public_api_gradients_match_pytorch_path(time_parallel):
    from torch_semimarkov.api.partition import semi_crf_streaming_forward

    inp = _cuda(make_inputs(3, 2570, 9, 5, dtype=torch.float64, seed=10, lengths="ragged", proj="both"))
    res = {}
    for use_triton in (True, False):
        d = {k: (v.detach().clone().requires_grad_(v.is_floating_point()) if isinstance(v, torch.Tensor) else v)
             for k, v in inp.items()}
        z = semi_crf_streaming_forward(**d, use_triton=use_triton, time_parallel=time_parallel)
        (z * torch.tensor([0.5, 1.0, 1.5], device="cuda", dtype=z.dtype)).sum().backward()
        res[use_triton] = [z] + [d[k].grad for k in ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")]
    for a, e in zip(res[True], res[False]):
        assert_close(a.detach().cpu(), e.detach().cpu(), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("kcc", [False, True], ids=["CC", "KCC"])
def test_checkpointed_recompute_is_bitwise_and_interval_independent(kcc):
    """The sequential backward recomputes every position from the forward's checkpoints: the
    recomputed state equals a save-all forward bitwise, so the gradients do not depend on the
    interval."""
    from torch_semimarkov.engines.triton import launch
    from torch_semimarkov.engines.triton.recompute import recompute_forward_state
    from torch_semimarkov.core.validation import validate_streaming_inputs

    inp = _cuda(make_inputs(4, 600, 16, 6, dtype=torch.float32, seed=11, lengths="ragged", proj="both",
                            duration_transitions=kcc))
    v = validate_streaming_inputs(**inp)
    common = (v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K)

    def plan(interval=None):
        return launch.plan_for(v.cum_scores, v.transition, v.K, "log", time_parallel=False, checkpoint_interval=interval)

    _, (saved, frames) = launch.launch_forward(*common, "log", v.proj_start, v.proj_end, plan=plan(), save="all")
    first = None
    for interval in (1, 7, None, 1000):
        p = plan(interval)
        z, state = launch.launch_forward(*common, "log", v.proj_start, v.proj_end, plan=p)
        got, got_f = recompute_forward_state(*common[:4], v.proj_start, v.proj_end, p, *state)
        for b, L in enumerate(v.lengths.tolist()):
            assert torch.equal(got[0, b, :L + 1], saved[0, b, :L + 1])
            assert torch.equal(got_f[b, :L + 1], frames[b, :L + 1])
            if not kcc:
                assert torch.equal(got[1, b, :L], saved[1, b, :L])
        grads = launch.launch_backward(*common, v.proj_start, v.proj_end, plan=p, state=state)
        if first is None:
            first = grads
        assert all(torch.equal(a, b) for a, b in zip(grads, first))


def _head_model(validate, **head):
    from torch_semimarkov import SemiMarkovCRFHead

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = torch.nn.Conv1d(6, 12, 5, padding=2)
            self.head = SemiMarkovCRFHead(num_classes=4, max_duration=12, hidden_dim=12, validate=validate, **head)

        def forward(self, x, lengths, labels):
            return self.head.compute_loss(self.enc(x.transpose(1, 2)).transpose(1, 2), lengths, labels)

    return Model().cuda()


def _gpu_batch(T, lengths, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), T, 6, generator=g)
    labels = torch.randint(0, 4, (len(lengths), T), generator=g)
    for b, L in enumerate(lengths):
        labels[b, L:] = -100
    return x.cuda(), torch.tensor(lengths).cuda(), labels.cuda()


def _assert_compiled_equals_eager(model, compiled):
    """Loss and gradients of ``compiled`` equal eager ``model``'s for new lengths, then new T."""
    for i, (T, lengths) in enumerate([(500, [500, 300]), (500, [123, 500]), (777, [777, 40])]):
        batch = _gpu_batch(T, lengths, seed=i)
        model.zero_grad()
        loss_c = compiled(*batch)
        loss_c.backward()
        grads_c = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        loss_e = model(*batch)
        loss_e.backward()
        assert_close(loss_c.detach(), loss_e.detach(), rtol=1e-4, atol=1e-4)
        for a, b in zip(grads_c, (p.grad for p in model.parameters())):
            assert_close(a, b, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("time_parallel", [False, True])
def test_training_step_never_syncs_without_validation(time_parallel):
    """validate=False: forward and backward of the loss run with CUDA sync debug mode 'error'."""
    model = _head_model(False, boundary_scores=True, time_parallel=time_parallel)
    batch = _gpu_batch(3000, [3000, 1700], seed=0)
    model(*batch).backward()  # warm-up (first launches compile the kernels)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = model(*batch)
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.isfinite(loss)


def test_compiled_training_step_on_cuda_equals_eager(monkeypatch):
    """inductor on CUDA, fullgraph, dynamic T: equal to eager, one graph for new lengths and T."""
    from torch._dynamo.utils import counters

    # the autouse NaN-filling wrapper of torch.empty (conftest) would be traced into the graph, and
    # inductor fails on it; this test checks the compiled model, not uninitialised memory
    monkeypatch.undo()

    torch.manual_seed(0)
    model = _head_model(False, boundary_scores=True)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    _assert_compiled_equals_eager(model, compiled)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


@pytest.mark.parametrize("validate", [True, False], ids=["validate", "novalidate"])
@pytest.mark.parametrize("mode", ["plain", "fullgraph"])
def test_compile_as_users_call_it_on_cuda(mode, validate, monkeypatch):
    """``torch.compile(model)`` and ``torch.compile(model, fullgraph=True, dynamic=True)`` of an
    encoder + head (inductor, CUDA), with and without validation: equal to eager; in fullgraph
    mode one graph for new lengths and T; with validation a bad label still raises."""
    from torch._dynamo.utils import counters

    monkeypatch.undo()  # (see test_compiled_training_step_on_cuda_equals_eager)
    torch.manual_seed(0)
    model = _head_model(validate, boundary_scores=True)
    torch._dynamo.reset()
    counters.clear()
    opts = {} if mode == "plain" else {"fullgraph": True, "dynamic": True}
    compiled = torch.compile(model, **opts)
    _assert_compiled_equals_eager(model, compiled)
    if mode == "fullgraph":
        assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    if validate:
        x, lengths, labels = _gpu_batch(500, [500, 300], seed=9)
        labels[1, 7] = 11  # out of range
        with pytest.raises(ValueError, match="sequence 1 has label 11 at position 7"):
            compiled(x, lengths, labels)


@pytest.mark.parametrize("kcc", [False, True], ids=["CC", "KCC"])
def test_operators_carry_the_triton_state(kcc):
    """torch.ops.torch_semimarkov.forward / backward on CUDA: the flattened Triton state gives the
    gradients of the PyTorch path."""
    from torch_semimarkov import semi_crf_streaming_forward

    inp = _cuda(make_inputs(3, 700, 9, 5, lengths=[700, 400, 3], duration_transitions=kcc, proj="both", seed=11))
    names = ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")
    grads = {}
    for backend in ("triton", "torch"):
        leaves = {k: inp[k].detach().clone().requires_grad_(True) for k in names}
        z = semi_crf_streaming_forward(**dict(inp, **leaves), backend=backend)
        z.sum().backward()
        grads[backend] = [leaves[k].grad for k in names]
    for a, b in zip(grads["triton"], grads["torch"]):
        assert_close(a, b, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("kcc", [False, True], ids=["CC", "KCC"])
def test_topk_samples_entropy_and_masks_on_cuda_equal_the_cpu(kcc):
    """The PyTorch path of streaming/distribution.py on CUDA tensors gives the CPU's results."""
    from torch_semimarkov import (semi_crf_streaming_entropy, semi_crf_streaming_forward, semi_crf_streaming_sample,
                                  semi_crf_streaming_topk)

    cpu = make_inputs(3, 120, 7, 4, lengths=[120, 77, 5], duration_transitions=kcc, proj="both", seed=12)
    cpu = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in cpu.items()}
    gpu = _cuda(cpu, torch.float64)
    lm = torch.ones(3, 120, 4, dtype=torch.bool)
    lm[:, 10:20, 0] = False
    bm = torch.zeros(3, 120, dtype=torch.long)
    bm[:, 30] = 1
    for got, want in ((gpu, cpu),):
        a = semi_crf_streaming_topk(**got, k=4, label_mask=lm.cuda(), boundary_mask=bm.cuda())
        b = semi_crf_streaming_topk(**want, k=4, label_mask=lm, boundary_mask=bm)
        assert torch.equal(a.labels.cpu(), b.labels)
        assert_close(a.scores.cpu(), b.scores, rtol=0, atol=1e-9)
        ha = semi_crf_streaming_entropy(**got)
        hb = semi_crf_streaming_entropy(**want)
        # without a gradient ((C, C) and (K, C, C)): the value from the engine's float32 forward + backward
        assert_close(ha.cpu(), hb, rtol=1e-6, atol=1e-4)
        za = semi_crf_streaming_forward(**got, label_mask=lm.cuda())
        zb = semi_crf_streaming_forward(**want, label_mask=lm)
        # both transition shapes: the masks run on the engine's float32 kernels
        assert_close(za.cpu(), zb, rtol=1e-6, atol=1e-4)
    # gradients of the masked log Z and of the entropy (the beta kernels)
    names = ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")
    for fn, kw in ((semi_crf_streaming_forward, dict(label_mask=lm, boundary_mask=bm)),
                   (semi_crf_streaming_entropy, dict(label_mask=lm))):
        grads = []
        for inp, dev in ((gpu, "cuda"), (cpu, "cpu")):
            leaves = {k: inp[k].detach().clone().requires_grad_(True) for k in names}
            fn(**dict(inp, **leaves), **{k: v.to(dev) for k, v in kw.items()}).sum().backward()
            grads.append([leaves[k].grad.cpu() for k in names])
        # the masked log Z and the entropy with its gradient on the engine's float32 kernels (both shapes)
        for a, b in zip(*grads):
            assert_close(a, b, rtol=1e-4, atol=1e-4)
    s = semi_crf_streaming_sample(**gpu, num_samples=64, generator=torch.Generator(device="cuda").manual_seed(0))
    assert s.labels.is_cuda and s.labels.shape == (64, 3, 120)
    assert ((s.labels >= 0).sum(-1).cpu() == torch.tensor([120, 77, 5])).all()
    assert (s.log_prob <= 1e-9).all()


@pytest.mark.parametrize("kcc", [False, True], ids=["blocked", "KCC"])
def test_masks_on_large_rings_equal_the_float64_path(kcc):
    """Partial labels on a ring too large for registers (512 x 64: the blocked engine reads the
    segment limits) and with a (K, C, C) transition (the chunked direct recurrence reads them in
    its forward, beta, marginals and Viterbi): masked log Z, its gradients, the marginals and the
    constrained Viterbi against the float64 PyTorch path on the CPU."""
    from torch_semimarkov import semi_crf_streaming_forward, semi_crf_streaming_marginals, semi_crf_streaming_viterbi
    from torch_semimarkov.engines.triton.plan import masked_plan

    B, T, K, C = (2, 1500, 60, 6) if kcc else (2, 1500, 300, 40)
    p = masked_plan(B, T, K, C, blocked=True, duration_transitions=kcc, device="cuda")
    assert p.kind == ("dur" if kcc else "mem") and p.time_parallel and (p.n_chunks >= 2 or not kcc)
    cpu = make_inputs(B, T, K, C, lengths=[1500, 1100], proj="both", seed=14 if kcc else 13, duration_transitions=kcc)
    cpu = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in cpu.items()}
    lm = torch.ones(B, T, C, dtype=torch.bool)
    lm[:, 100:400, :2 if kcc else 5] = False
    lm[0, 700:760] = False
    lm[0, 700:760, 3 if kcc else 7] = True
    bm = torch.zeros(B, T, dtype=torch.long)
    bm[:, 900] = 1
    bm[1, 50:80] = -1
    names = ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")
    out = []
    for dev, dtype, backend in (("cuda", torch.float32, "triton"), ("cpu", torch.float64, "torch")):
        inp = _cuda(cpu, dtype) if dev == "cuda" else cpu
        masks = dict(label_mask=lm.to(dev), boundary_mask=bm.to(dev), backend=backend)
        leaves = {k: inp[k].detach().clone().requires_grad_(True) for k in names}
        z = semi_crf_streaming_forward(**dict(inp, **leaves), **masks)
        z.sum().backward()
        v = semi_crf_streaming_viterbi(**inp, **masks)
        m = semi_crf_streaming_marginals(**inp, **masks)
        out.append((z.detach().cpu().double(), [leaves[k].grad.cpu().double() for k in names], v.scores.cpu().double(),
                    v.labels.cpu(), m.start.cpu().double()))
    (za, ga, va, la, ma), (zb, gb, vb, lb, mb) = out
    assert_close(za, zb, rtol=1e-6, atol=1e-3)
    assert_close(va, vb, rtol=1e-6, atol=1e-3)
    assert (la == lb).float().mean() > 0.99
    assert_close(ma, mb, rtol=0, atol=1e-4)
    for a, b in zip(ga, gb):
        assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kcc", [True, False], ids=["KCC", "memring"])
@pytest.mark.parametrize("masked", [False, True], ids=["plain", "masked"])
def test_entropy_gradient_on_the_engine_equals_the_float64_path(masked, kcc):
    """The entropy with its gradient on the engine against the float64 PyTorch path on the CPU:
    a (K, C, C) model (the direct recurrence's prefix and suffix entropies over several chunks,
    anchors, weighted marginals), and a (C, C) model whose 512 x 64 ring is too large for
    registers (the memory-ring entropy recurrences on the blocked engine's rows of three chunks, in
    two chunks of their own; the float64 path takes ~30 s of one CPU thread there)."""
    from torch_semimarkov import semi_crf_streaming_entropy
    from torch_semimarkov.engines.triton.plan import masked_plan

    B, T, K, C = (2, 1500, 60, 6) if kcc else (2, 800, 260, 33)
    p = masked_plan(B, T, K, C, duration_transitions=kcc, blocked=not kcc, device="cuda")
    assert p.kind == ("dur" if kcc else "mem") and p.n_chunks >= 2
    cpu = make_inputs(B, T, K, C, lengths=[T, T * 11 // 15], proj="both", seed=15, duration_transitions=kcc)
    cpu = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in cpu.items()}
    masks = {}
    if masked:
        lm = torch.ones(B, T, C, dtype=torch.bool)
        lm[:, 100:400, :2 if kcc else 5] = False
        bm = torch.zeros(B, T, dtype=torch.long)
        bm[:, T * 3 // 5] = 1
        bm[1, 50:80] = -1
        masks = dict(label_mask=lm, boundary_mask=bm)
    names = ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")
    out = []
    for dev, dtype, backend in (("cuda", torch.float32, "triton"), ("cpu", torch.float64, "torch")):
        inp = _cuda(cpu, dtype) if dev == "cuda" else cpu
        leaves = {k: inp[k].detach().clone().requires_grad_(True) for k in names}
        H = semi_crf_streaming_entropy(**dict(inp, **leaves), **{k: v.to(dev) for k, v in masks.items()},
                                       backend=backend)
        H.sum().backward()
        out.append((H.detach().cpu().double(), [leaves[k].grad.cpu().double() for k in names]))
    (ha, ga), (hb, gb) = out
    assert_close(ha, hb, rtol=1e-5, atol=1e-3)
    for a, b in zip(ga, gb):
        assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_beta_beside_the_forward_is_bitwise_the_usual_backward(monkeypatch):
    """``plan.beta_early`` (the blocked engine where both recurrences fit the GPU at once: here 8
    sequences of 7 chunks): log Z's operator runs the beta recurrence on a second stream beside
    the forward and the backward only the marginals; log Z and every gradient through the public
    API are bitwise those of the usual order, and repeat bitwise. One helper per run either way:
    the plan gives none beside (112 runs) and one in the usual order (56), and other helper counts
    are other sums (equal to rounding only; GPU_NOTES 79). Beside, the 224 programs do not all fit
    the GPU at once, so some runs go on without their helper: the same bits."""
    from torch_semimarkov.api.partition import semi_crf_streaming_forward
    from torch_semimarkov.core.validation import validate_streaming_inputs
    from torch_semimarkov.engines.triton import launch
    from torch_semimarkov.engines.triton import plan as plan_mod

    inp = _cuda(make_inputs(8, 3000, 300, 40, dtype=torch.float32, seed=11, lengths="ragged", proj="both"))
    v = validate_streaming_inputs(**inp)
    assert launch.plan_for(v.cum_scores, v.transition, v.K, "log", backward=True).beta_early
    names = ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")
    res = {}
    monkeypatch.setattr(plan_mod, "HELPERS_OVERRIDE", 1)
    for early in (False, True, True):
        monkeypatch.setattr(plan_mod, "BETA_EARLY_OVERRIDE", early)
        d = {k: (v_.detach().clone().requires_grad_(True) if k in names else v_) for k, v_ in inp.items()}
        z = semi_crf_streaming_forward(**d)
        (z * torch.linspace(0.5, 1.5, 8, device="cuda")).sum().backward()
        out = [z.detach()] + [d[k].grad for k in names]
        if early in res:
            assert all(torch.equal(a, b) for a, b in zip(out, res[early]))
        res[early] = out
    for name, a, b in zip(("log Z",) + names, res[False], res[True]):
        assert torch.equal(a, b), name


def test_longer_chunks_for_beta_beside_a_differentiated_forward(monkeypatch):
    """``plan.BESIDE_SPLIT``: where the blocked forward's chunks fill the GPU (4 sequences of 12,000
    positions: 27 chunks each), a forward that will be differentiated takes chunks twice as long
    (16 each), so that beta runs beside it. log Z and every gradient equal those of the usual
    chunks to float32 rounding (other chunk starts, other fix-ups), against the float64 PyTorch
    path as closely, and repeat bitwise."""
    from torch_semimarkov.api.partition import semi_crf_streaming_forward
    from torch_semimarkov.core.validation import validate_streaming_inputs
    from torch_semimarkov.engines.triton import launch
    from torch_semimarkov.engines.triton import plan as plan_mod

    cpu = make_inputs(4, 12000, 300, 40, dtype=torch.float64, seed=14, lengths="ragged", proj="both")
    inp = _cuda(cpu)
    v = validate_streaming_inputs(**inp)
    split = launch.plan_for(v.cum_scores, v.transition, v.K, "log", backward=True)
    usual = launch.plan_for(v.cum_scores, v.transition, v.K, "log")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert split.beta_early and 2 * 4 * split.n_chunks <= sms < 2 * 4 * usual.n_chunks, (split, usual, sms)
    names = ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")

    def run(d, **kw):
        d = {k: (x.detach().clone().requires_grad_(True) if k in names else x) for k, x in d.items()}
        z = semi_crf_streaming_forward(**d, **kw)
        (z * torch.linspace(0.5, 1.5, 4, dtype=z.dtype, device=z.device)).sum().backward()
        return [z.detach()] + [d[k].grad for k in names]

    res = {}
    for on in (False, True, True):
        monkeypatch.setattr(plan_mod, "BESIDE_SPLIT", on)
        out = run(inp)
        if on in res:
            assert all(torch.equal(a, b) for a, b in zip(out, res[on]))
        res[on] = out
    ref = [x.cpu() for x in run(_cuda(cpu, dtype=torch.float64), backend="torch")]
    for name, a, b, r in zip(("log Z",) + names, res[False], res[True], ref):
        scale = r.abs().max()
        err_split, err_usual = float((b.cpu().double() - r).abs().max() / scale), float((a.cpu().double() - r).abs().max() / scale)
        assert err_split < max(3 * err_usual, 1e-6), (name, err_split, err_usual)
        assert_close(a.cpu().double(), b.cpu().double(), rtol=1e-4, atol=1e-4 * float(scale))


def test_blocked_helpers_on_long_segments_equal_runs_without_them(monkeypatch):
    """The blocked engine's helper programs (4 sequences of 3,000 positions at K = 960, one chunk each,
    leave the GPU mostly idle, so each run takes helpers) on a model whose segments are hundreds of positions long (a new segment
    costs 20 nats): the helpers' part, the rows older than the previous block, holds nearly all the
    mass, so a wrong shift or slot shows (a random model's mass lies in short segments, GPU_NOTES
    78). log Z, the gradients and Viterbi equal the runs without helpers to float32 rounding and
    the float64 PyTorch path as closely; with helpers the outputs repeat bitwise."""
    from torch_semimarkov.api.partition import semi_crf_streaming_forward
    from torch_semimarkov.api.viterbi import semi_crf_streaming_viterbi
    from torch_semimarkov.core.validation import validate_streaming_inputs
    from torch_semimarkov.engines.triton import launch
    from torch_semimarkov.engines.triton import plan as plan_mod

    cpu = make_inputs(4, 3000, 960, 40, dtype=torch.float64, seed=15, lengths="ragged", proj="both")
    cpu["transition"] = cpu["transition"] - 20.0
    inp = _cuda(cpu)
    v = validate_streaming_inputs(**inp)
    assert launch.plan_for(v.cum_scores, v.transition, v.K, "log", backward=True).helpers >= 1
    names = ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")

    def run(d, **kw):
        d = {k: (x.detach().clone().requires_grad_(True) if k in names else x) for k, x in d.items()}
        z = semi_crf_streaming_forward(**d, **kw)
        (z * torch.linspace(0.5, 1.5, 4, dtype=z.dtype, device=z.device)).sum().backward()
        vit = semi_crf_streaming_viterbi(**{k: (x.detach() if k in names else x) for k, x in d.items()}, **kw)
        return [z.detach()] + [d[k].grad for k in names] + [vit.scores, vit.labels]

    res = {}
    for helpers in (0, None, None):
        monkeypatch.setattr(plan_mod, "HELPERS_OVERRIDE", helpers)
        out = run(inp)
        if helpers in res:
            assert all(torch.equal(a, b) for a, b in zip(out, res[helpers]))
        res[helpers] = out
    ref = [x.cpu() for x in run(_cuda(cpu, dtype=torch.float64), backend="torch")]
    for name, a, b, r in zip(("log Z",) + names + ("viterbi score",), res[0], res[None], ref):
        scale = r.abs().max()
        err_h, err_0 = float((b.cpu().double() - r).abs().max() / scale), float((a.cpu().double() - r).abs().max() / scale)
        assert err_h < max(3 * err_0, 1e-6), (name, err_h, err_0)
    assert torch.equal(res[0][-1], res[None][-1]) and torch.equal(res[None][-1].cpu(), ref[-1])
