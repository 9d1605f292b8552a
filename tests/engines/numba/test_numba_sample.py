"""Exact sampling on the compiled CPU engine (numba): the same uniforms give the same samples as
the PyTorch path (``backend="torch"``), and the samples follow the enumerated distribution."""

import math

import pytest
import torch

from torch_semimarkov import semi_crf_streaming_sample
from torch_semimarkov.oracle import enumerate_segmentations, segmentation_allowed

from test_numba_masks import CASES, IDS, assert_close, make_inputs, make_masks

pytest.importorskip("numba")

F64 = torch.float64


def _detached(kw):
    return {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}


@pytest.mark.parametrize("masked", [False, True], ids=["free", "masked"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_same_generator_gives_the_pytorch_paths_samples(case, masked):
    kw = _detached(make_inputs(61, T=40, K=6, C=3, **case)[0])
    B, T1, C = kw["cum_scores"].shape
    lm, bm = make_masks(62, B, T1 - 1, C) if masked else (None, None)
    out = {b: semi_crf_streaming_sample(**kw, num_samples=64, label_mask=lm, boundary_mask=bm, backend=b,
                                        generator=torch.Generator().manual_seed(7)) for b in ("numba", "torch")}
    assert torch.equal(out["numba"].labels, out["torch"].labels)
    assert torch.equal(out["numba"].segment_starts, out["torch"].segment_starts)
    assert torch.equal(out["numba"].segment_offsets, out["torch"].segment_offsets)
    assert_close(out["numba"].log_prob, out["torch"].log_prob, what="log_prob")
    assert_close(out["numba"].scores, out["torch"].scores, what="scores")
    # different seeds give different samples (the uniforms drive the walk)
    other = semi_crf_streaming_sample(**kw, num_samples=64, label_mask=lm, boundary_mask=bm, backend="numba",
                                      generator=torch.Generator().manual_seed(8))
    assert not torch.equal(other.labels, out["numba"].labels)


def _chi2_sf(x: float, df: int) -> float:
    """P(chi2(df) >= x)."""
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=F64), torch.tensor(x / 2, dtype=F64)))


@pytest.mark.parametrize("case", [dict(direct=True, proj=True), dict(direct=False, proj=True)], ids=["KCC", "CC"])
def test_masked_samples_follow_the_restricted_enumeration(case):
    """Chi-square goodness of fit of 20,000 samples per sequence (bins with expected count < 5
    merged); p > 1e-4 with a fixed seed. Each sample's log-probability is exact."""
    kw = _detached(make_inputs(71, T=5, K=3, C=2, **case)[0])
    B, T1, C = kw["cum_scores"].shape
    lm, bm = make_masks(72, B, T1 - 1, C, free=0.6)
    n = 20000
    out = semi_crf_streaming_sample(**kw, num_samples=n, label_mask=lm, boundary_mask=bm, backend="numba",
                                    generator=torch.Generator().manual_seed(73))
    rows = out.segments
    args = {k: kw[k] for k in ("cum_scores", "transition", "duration_bias", "lengths", "K", "proj_start", "proj_end")}
    for b, (segs, scores) in enumerate(enumerate_segmentations(**args)):
        keep = [i for i, s in enumerate(segs) if segmentation_allowed(s, lm[b], bm[b]) and scores[i] > -math.inf]
        segs, scores = [tuple(segs[i]) for i in keep], scores[keep]
        logp = torch.log_softmax(scores, 0)
        index = {s: i for i, s in enumerate(segs)}
        counts = torch.zeros(len(segs), dtype=F64)
        for s in range(n):
            i = index[tuple(rows[s * B + b])]
            counts[i] += 1
            if s < 50:
                assert abs(float(out.log_prob[s, b]) - float(logp[i])) < 1e-12
        if len(segs) == 1:
            continue
        expected = logp.exp() * n
        big = expected >= 5
        obs, exp = counts[big], expected[big]
        if (~big).any():
            obs = torch.cat([obs, counts[~big].sum().reshape(1)])
            exp = torch.cat([exp, expected[~big].sum().reshape(1)])
        stat = float(((obs - exp) ** 2 / exp).sum())
        assert _chi2_sf(stat, len(exp) - 1) > 1e-4, f"sequence {b}: chi2 = {stat:.1f} on {len(exp) - 1} dof"


def test_impossible_sequences_get_no_samples():
    kw = _detached(make_inputs(81, **CASES[0])[0])
    B, T1, C = kw["cum_scores"].shape
    lm, bm = make_masks(82, B, T1 - 1, C)
    lm[1, 3] = False
    out = semi_crf_streaming_sample(**kw, num_samples=5, label_mask=lm, boundary_mask=bm, backend="numba",
                                    generator=torch.Generator().manual_seed(0))
    assert (out.labels[:, 1] == -1).all() and (out.log_prob[:, 1] == -math.inf).all()
    assert (out.labels[:, 0] >= 0).all() and torch.isfinite(out.log_prob[:, 0]).all()
