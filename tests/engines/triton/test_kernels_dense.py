"""The Triton kernels of the dense recurrences (kernels/dense.py) against the PyTorch loops of
streaming/distribution.py: alpha, beta and the expectation-semiring messages, with and without
masks, both transition shapes (in Triton's interpreter on a CPU machine)."""

import math

import pytest
import torch

from torch_semimarkov.engines.torch import dense as dense_mod
from torch_semimarkov.core import validation as validation_mod
from torch_semimarkov.engines.triton import HAS_TRITON
from torch_semimarkov.core.validation import validate_streaming_inputs

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="needs Triton")


def _model(B, T, K, C, direct, proj, masked, seed, device, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    cum = torch.nn.functional.pad(torch.randn(B, T, C, generator=g, dtype=torch.float64).cumsum(1), (0, 0, 1, 0))
    cum = cum + shift * torch.arange(T + 1, dtype=torch.float64)[None, :, None]
    tr = torch.randn(*((K, C, C) if direct else (C, C)), generator=g, dtype=torch.float64)
    tr[..., 0, C - 1] = -math.inf
    db = torch.randn(K, C, generator=g, dtype=torch.float64)
    ps = torch.randn(B, T, C, generator=g, dtype=torch.float64) if proj else None
    pe = torch.randn(B, T, C, generator=g, dtype=torch.float64) if proj else None
    lengths = torch.tensor([T, max(1, T // 2), 1][:B])
    inp = validate_streaming_inputs(cum.to(device), tr.to(device), db.to(device), lengths.to(device), K, "log",
                                    None if ps is None else ps.to(device), None if pe is None else pe.to(device))
    lm = bm = None
    if masked:
        lm = torch.rand(B, T, C, generator=g) < 0.8
        bm = torch.zeros(B, T, dtype=torch.long)
        bm[:, T // 3] = 1
        bm[:, 1] = -1
        lm, bm = validation_mod.check_masks(lm, bm, B, T, C, device)
    return dense_mod._Model(inp, lm, bm)


def _same(a, b):
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    assert torch.equal(fa, fb)
    torch.testing.assert_close(a[fa], b[fb], atol=1e-9, rtol=1e-12)


@pytest.mark.parametrize("direct,proj,masked,factored_off", [
    (False, False, False, False), (True, True, False, False), (False, True, True, False), (True, False, True, False),
    (False, True, True, True)])
def test_dense_kernels_equal_the_pytorch_recurrences(direct, proj, masked, factored_off):
    from torch_semimarkov.engines.triton.dense import run_dense

    device = "cuda" if torch.cuda.is_available() else "cpu"
    m = _model(3, 11, 4, 3, direct, proj, masked, 0, device)
    # the PyTorch loops (forced, whatever the device)
    A_ref = _torch_alpha(m)
    B_ref = _torch_beta(m)
    A, Ea = run_dense(m, "alpha", expect=True, factored_off=factored_off)
    Bt, Eb = run_dense(m, "beta", expect=True, factored_off=factored_off)
    assert torch.equal(run_dense(m, "alpha", factored_off=factored_off), A)
    K = m.K
    rows = slice(K, K + m.T + 1)
    _same(A[:, rows], A_ref[:, rows])
    _same(Bt[:, rows], B_ref[:, rows])
    torch.testing.assert_close(Ea[:, rows], dense_mod._expected_prefix(m, A_ref)[:, rows], atol=1e-9, rtol=1e-12)
    torch.testing.assert_close(Eb[:, rows], dense_mod._expected_suffix(m, B_ref)[:, rows], atol=1e-9, rtol=1e-12)


def _torch_alpha(m):
    saved = dense_mod._dense_kernels
    dense_mod._dense_kernels = lambda: None
    try:
        return m.alpha()
    finally:
        dense_mod._dense_kernels = saved


def _torch_beta(m):
    saved = dense_mod._dense_kernels
    dense_mod._dense_kernels = lambda: None
    try:
        return m.beta()
    finally:
        dense_mod._dense_kernels = saved


@pytest.mark.parametrize("direct,factored_off", [(False, False), (True, False), (False, True)])
def test_dense_entropies_do_not_depend_on_the_size_of_the_scores(direct, factored_off):
    """The prefix and suffix entropies (alpha - Ea, beta - Eb) do not change when every label's
    score at a position grows by the same constant (here 1e4: prefix scores of 3e5): the
    expectation kernels normalise their weights, so the rounding of the log-sum-exp does not
    multiply the expected scores."""
    from torch_semimarkov.engines.triton.dense import run_dense

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = None
    got = []
    for shift in (0.0, 1e4):
        m = _model(1, 30, 4, 3, direct, True, False, 3, device, shift=shift)
        A, Ea = run_dense(m, "alpha", expect=True, factored_off=factored_off)
        Bt, Eb = run_dense(m, "beta", expect=True, factored_off=factored_off)
        rows = slice(m.K + 1, m.K + m.T + 1)
        got.append(((A - Ea)[:, rows, :m.C], (Bt - Eb)[:, rows, :m.C]))
    for a, b in zip(*got):
        fa = torch.isfinite(a)
        assert torch.equal(fa, torch.isfinite(b))
        torch.testing.assert_close(a[fa], b[fa], atol=1e-7, rtol=0)
