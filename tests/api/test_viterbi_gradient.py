"""The Viterbi score (semiring="max") is differentiable: its gradient is the best path's indicator."""

import pytest
import torch

from torch_semimarkov import semi_crf_streaming_forward
from torch_semimarkov.oracle import naive_semi_crf

CASES = [  # B, T, K, C, duration-dependent transitions, boundaries
    (2, 9, 3, 3, False, False),
    (3, 14, 4, 2, False, True),
    (2, 11, 3, 3, True, True),
    (3, 6, 8, 4, False, True),
    (2, 10, 1, 3, True, False),
]


def _inputs(B, T, K, C, dur, bnd, seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, T, C, generator=g, dtype=torch.float64)
    cum = torch.nn.functional.pad(scores.cumsum(1), (0, 0, 1, 0))
    tr = torch.randn((K, C, C) if dur else (C, C), generator=g, dtype=torch.float64)
    inp = {
        "cum_scores": cum,
        "transition": tr,
        "duration_bias": torch.randn(K, C, generator=g, dtype=torch.float64),
        "proj_start": torch.randn(B, T, C, generator=g, dtype=torch.float64) if bnd else None,
        "proj_end": torch.randn(B, T, C, generator=g, dtype=torch.float64) if bnd else None,
    }
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    return inp, lengths


@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}-T{}-K{}-C{}-{}-{}".format(*c[:4], "KCC" if c[4] else "CC", "bnd" if c[5] else "nobnd"))
def test_viterbi_score_gradient_matches_autograd_of_naive_max(case):
    B, T, K, C, dur, bnd = case
    inp, lengths = _inputs(*case, seed=sum(case[:4]))
    leaves = {k: v.clone().requires_grad_() for k, v in inp.items() if v is not None}
    ref_leaves = {k: v.clone().requires_grad_() for k, v in inp.items() if v is not None}
    upstream = torch.randn(B, dtype=torch.float64)

    ours = semi_crf_streaming_forward(lengths=lengths, K=K, semiring="max", **leaves)
    ref = naive_semi_crf(lengths=lengths, K=K, semiring="max", **ref_leaves)
    torch.testing.assert_close(ours, ref)
    (ours * upstream).sum().backward()
    (ref * upstream).sum().backward()
    for name in leaves:
        torch.testing.assert_close(leaves[name].grad, ref_leaves[name].grad, msg=lambda m, name=name: f"{name}: {m}")


def test_viterbi_gradient_counts_segments_and_skips_inputs_without_grad():
    from torch_semimarkov import semi_crf_streaming_viterbi

    inp, lengths = _inputs(2, 8, 3, 3, False, True, seed=3)
    transition = inp["transition"].clone().requires_grad_()
    duration_bias = inp["duration_bias"].clone().requires_grad_()
    inp.update(transition=transition, duration_bias=duration_bias)
    score = semi_crf_streaming_forward(lengths=lengths, K=3, semiring="max", **inp)
    score.sum().backward()
    best = semi_crf_streaming_viterbi(lengths=lengths, K=3, **inp)
    n_segments = sum(len(segs) for segs in best.segments)
    # one transition (the first one from the phantom predecessor) and one duration per segment
    assert float(transition.grad.sum()) == n_segments
    assert float(duration_bias.grad.sum()) == n_segments
    assert inp["cum_scores"].grad is None
