"""Gradients of the compiled CPU engine (numba) are bitwise identical for 1 and 2 engine threads:
log Z (both transition shapes, boundary projections, float32 and float64), the masked log Z of
partial labels and the entropy; so are its k-best lists. Each sequence is computed start to end by one kernel call, so
how the batch is split over threads must not change a bit."""

import numba
import pytest
import torch

from torch_semimarkov import semi_crf_streaming_entropy, semi_crf_streaming_forward, semi_crf_streaming_topk

from test_numba_masks import F64, make_inputs, make_masks

pytest.importorskip("numba")

if numba.config.NUMBA_NUM_THREADS < 2:
    pytest.skip("needs NUMBA_NUM_THREADS >= 2", allow_module_level=True)


def _grads(fn, kw, leaves, B):
    up = torch.randn(B, generator=torch.Generator().manual_seed(7), dtype=F64).to(leaves[0].dtype)
    value = fn(**kw)
    return (value.detach(),) + torch.autograd.grad((value * up).sum(), leaves)


def _across_threads(fn, kw, leaves, monkeypatch, run=None):
    """fn's value and gradients (or ``run()``'s tensors) with 1, 2 and again 1 engine thread;
    asserts the 2-thread run went through the thread pool. Restores numba's and torch's thread
    counts."""
    import torch_semimarkov.engines.numba.engine as engine

    monkeypatch.setattr(engine, "_PARALLEL_MIN_WORK", 0)  # small batches run on several threads too
    pools = []
    real_pool = engine._pool
    monkeypatch.setattr(engine, "_pool", lambda n: pools.append(n) or real_pool(n))
    B = kw["cum_scores"].shape[0]
    # numba.set_num_threads starts numba's threading layer, which also sets the thread count torch reads
    torch_threads = torch.get_num_threads()
    before = numba.get_num_threads()
    runs = []
    try:
        for threads in (1, 2, 1):
            numba.set_num_threads(threads)
            assert engine.num_threads() == threads
            pools.clear()
            runs.append(run() if run is not None else _grads(fn, kw, leaves, B))
            assert bool(pools) == (threads > 1), pools
    finally:
        numba.set_num_threads(before)
        torch.set_num_threads(torch_threads)
    return runs


def _assert_bitwise_equal(runs):
    assert all(torch.isfinite(x).all() for x in runs[0])
    for other in runs[1:]:
        for i, (a, b) in enumerate(zip(runs[0], other)):
            assert a.dtype == b.dtype and torch.equal(a, b), f"output {i} differs across thread counts"


CASES = [dict(direct=d, proj=p) for d in (False, True) for p in (False, True)]
IDS = ["CC", "CC-proj", "KCC", "KCC-proj"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_log_z_gradients_are_bitwise_identical_across_thread_counts(case, dtype, monkeypatch):
    kw, leaves = make_inputs(31, T=40, K=6, C=4, dtype=dtype, **case)
    runs = _across_threads(lambda **a: semi_crf_streaming_forward(**a, backend="numba"), kw, leaves, monkeypatch)
    _assert_bitwise_equal(runs)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_masked_gradients_are_bitwise_identical_across_thread_counts(case, monkeypatch):
    kw, leaves = make_inputs(32, T=40, K=6, C=4, **case)
    B, T1, C = kw["cum_scores"].shape
    lm, bm = make_masks(33, B, T1 - 1, C)
    runs = _across_threads(
        lambda **a: semi_crf_streaming_forward(**a, label_mask=lm, boundary_mask=bm, backend="numba"),
        kw, leaves, monkeypatch)
    _assert_bitwise_equal(runs)


@pytest.mark.parametrize("masked", [False, True], ids=["free", "masked"])
@pytest.mark.parametrize("proj", [False, True], ids=["CC", "CC-proj"])
def test_entropy_gradient_is_bitwise_identical_across_thread_counts(proj, masked, monkeypatch):
    kw, leaves = make_inputs(34, T=40, K=6, C=4, proj=proj)
    B, T1, C = kw["cum_scores"].shape
    lm, bm = make_masks(35, B, T1 - 1, C) if masked else (None, None)
    runs = _across_threads(
        lambda **a: semi_crf_streaming_entropy(**a, label_mask=lm, boundary_mask=bm, backend="numba"),
        kw, leaves, monkeypatch)
    _assert_bitwise_equal(runs)


@pytest.mark.parametrize("direct", [False, True], ids=["CC", "KCC"])
def test_topk_is_bitwise_identical_across_thread_counts(direct, monkeypatch):
    kw, leaves = make_inputs(36, T=40, K=6, C=4, direct=direct, proj=True)
    B, T1, C = kw["cum_scores"].shape
    lm, bm = make_masks(37, B, T1 - 1, C)

    def run():
        out = semi_crf_streaming_topk(**kw, k=6, label_mask=lm, boundary_mask=bm, backend="numba")
        return out.scores, out.labels, out.segment_starts

    runs = _across_threads(None, kw, leaves, monkeypatch, run=run)
    assert torch.isfinite(runs[0][0][:, 0]).all()
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)
