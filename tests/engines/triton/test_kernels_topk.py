"""k-best lists on the engine (``streaming/kbest.py``): sidetracks over the time-parallel Viterbi
forward and chunked backpointer walks from the sidetracks' tails, under the interpreter (CPU) or
compiled (CUDA), with chunks short enough for fix-ups, against the float64 PyTorch k-best path
(itself tested against the sorted enumeration in ``test_distribution.py``) and the enumeration."""

from __future__ import annotations

import math

import pytest
import torch

from kernel_cases import DEVICE, cpu, recording_engine
from test_distribution import _check_topk
from test_kernels_masks import _inputs, _restricted
from torch_semimarkov import semi_crf_streaming_topk, semi_crf_streaming_viterbi
from torch_semimarkov.api import topk as topk_mod
from torch_semimarkov.engines import select

F64 = torch.float64


@pytest.fixture(params=[3, 1000], ids=["chunks", "one-chunk"])
def engine_calls(request, monkeypatch):
    return recording_engine(monkeypatch, request.param, topk_mod, "_topk_on_engine")


@pytest.mark.parametrize("proj,forbid,k", [(False, False, 5), (True, False, 5), (True, True, 7), (False, False, 24)])
def test_engine_topk_equals_the_sorted_enumeration(engine_calls, proj, forbid, k):
    ref, run = _inputs(31, proj=proj, forbid=forbid)
    ref = {kk: (v.detach() if isinstance(v, torch.Tensor) else v) for kk, v in ref.items()}
    run = {kk: (v.detach() if isinstance(v, torch.Tensor) else v) for kk, v in run.items()}
    B, T1, C = ref["cum_scores"].shape
    got = semi_crf_streaming_topk(**run, k=k)
    assert engine_calls == [True], "top-k did not run on the engine"
    every = _restricted(ref, torch.ones(B, T1 - 1, C, dtype=torch.bool), torch.zeros(B, T1 - 1, dtype=torch.long))
    # run holds float32 copies of the inputs: the exact scores of those, to float32 rounding
    _check_topk(got, every, k, tol=1e-5, gap=1e-4)


def test_engine_topk_rank0_is_viterbi_and_matches_the_pytorch_path(engine_calls):
    """T = 40, ragged, projections, a forbidden transition: rank 0 is the engine's Viterbi, and the
    list equals the float64 path's."""
    g = torch.Generator().manual_seed(32)
    B, T, K, C = 3, 40, 5, 3
    cum = torch.nn.functional.pad(torch.randn(B, T, C, generator=g, dtype=F64).cumsum(1), (0, 0, 1, 0))
    tr = torch.randn(C, C, generator=g, dtype=F64)
    tr[2, 0] = -math.inf
    args = dict(cum_scores=cum, transition=tr, duration_bias=torch.randn(K, C, generator=g, dtype=F64),
                lengths=torch.tensor([T, 23, 1]), K=K, proj_start=torch.randn(B, T, C, generator=g, dtype=F64),
                proj_end=torch.randn(B, T, C, generator=g, dtype=F64))
    run = {kk: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for kk, v in args.items()}
    got = semi_crf_streaming_topk(**run, k=6)
    assert engine_calls == [True]
    select.ENGINE_ON_CPU = False  # the fixture's monkeypatch restores it
    want = semi_crf_streaming_topk(**args, k=6)
    select.ENGINE_ON_CPU = True
    torch.testing.assert_close(cpu(got.scores), want.scores, atol=1e-9, rtol=0)
    assert torch.equal(cpu(got.labels), want.labels)
    best = semi_crf_streaming_viterbi(**run)
    assert torch.equal(got.labels[:, 0], best.labels)
    # one position: C = 3 segmentations (one segment, any label), so ranks 3 .. 5 do not exist
    assert torch.isfinite(cpu(got.scores[2, :3])).all() and (cpu(got.scores[2, 3:]) == -math.inf).all()


@pytest.mark.parametrize("K,k,ties,C", [(5, 4, False, 3), (1, 3, False, 3), (9, 6, False, 3), (6, 5, True, 3),
                                        (7, 2, False, 6), (6, 3, True, 5)])
def test_in_edges_kernel_equals_the_pytorch_selection(K, k, ties, C):
    """The kernel's k smallest-deficit in-edges of every node equal the PyTorch blocks', on a
    forward of the engine: deficits, durations and predecessor labels; with integer scores
    (many equal deficits) the same edges (ties by duration, then predecessor rank); C > k + 1:
    the predecessor lists are cut short."""
    from torch_semimarkov.engines.triton import topk as kbest
    from torch_semimarkov.engines.triton import launch, parallel
    from torch_semimarkov.engines.triton.plan import masked_plan
    from torch_semimarkov.core.validation import validate_streaming_inputs

    g = torch.Generator().manual_seed(33 + K)
    B, T = 2, 17
    cum = torch.nn.functional.pad(torch.randn(B, T, C, generator=g, dtype=F64).cumsum(1), (0, 0, 1, 0))
    tr = torch.randn(C, C, generator=g, dtype=F64)
    tr[0, 2] = -math.inf
    db = torch.randn(K, C, generator=g, dtype=F64)
    ps = torch.randn(B, T, C, generator=g, dtype=F64)
    if ties:
        cum = torch.nn.functional.pad(torch.randint(0, 2, (B, T, C), generator=g).to(F64).cumsum(1), (0, 0, 1, 0))
        tr, db, ps = tr.round(), db.round(), ps.round()
    inp = validate_streaming_inputs(cum.to(DEVICE), tr.to(DEVICE), db.to(DEVICE), torch.tensor([T, 11]).to(DEVICE), K,
                                    proj_start=ps.to(DEVICE))
    plan = masked_plan(B, T, K, C, semiring="max", device=inp.cum_scores.device)
    args = launch._prepare(inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, inp.proj_start, None)
    saved, frames, bp, _ = parallel.forward_chunked(*args[:4], "max", args[4], None, plan)
    alpha = kbest._alpha(saved, frames, args[3])
    d1, k1, p1 = (cpu(x) for x in kbest._best_in_edges(inp, alpha, bp, k, use_kernel=True))
    d2, k2, p2 = (cpu(x) for x in kbest._best_in_edges(inp, alpha, bp, k, use_kernel=False))
    L = [T, 11]
    for b in range(B):
        d_a, d_b = d1[b, 1:L[b] + 1], d2[b, 1:L[b] + 1]
        assert torch.equal(torch.isinf(d_a), torch.isinf(d_b))
        fin = torch.isfinite(d_b)
        assert fin.any()
        torch.testing.assert_close(d_a[fin], d_b[fin], atol=1e-9, rtol=0)
        assert torch.equal(k1[b, 1:L[b] + 1][fin], k2[b, 1:L[b] + 1][fin])
        assert torch.equal(p1[b, 1:L[b] + 1][fin], p2[b, 1:L[b] + 1][fin])
