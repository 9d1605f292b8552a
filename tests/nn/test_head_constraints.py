"""Head constraints: per-label minimum and maximum durations, allowed first and last labels.

Each is checked against enumeration: the constrained head's log Z is the log-sum-exp, and its
Viterbi the best, of the unconstrained head's scores over exactly the allowed segmentations.
"""

import itertools
import math

import pytest
import torch

from conftest import CPU_BACKENDS
from torch_semimarkov import SemiMarkovCRFHead

C, K, H = 3, 4, 5


def _segmentations(L, K, C):
    """Every labelled segmentation of 0..L-1 as a list of (start, end, label)."""
    if L == 0:
        yield []
        return
    for k in range(1, min(K, L) + 1):
        for c in range(C):
            for rest in _segmentations(L - k, K, C):
                yield [(0, k, c)] + [(s + k, e + k, d) for s, e, d in rest]


def _pair(backend, **constraints):
    """A constrained head and the same head without constraints (same parameters)."""
    torch.manual_seed(0)
    free = SemiMarkovCRFHead(C, K, hidden_dim=H, backend=backend, boundary_scores=True)
    with torch.no_grad():
        free.transition.normal_()
        free.duration_bias.normal_()
    kw = dict(constraints)
    kw.setdefault("max_duration", K)
    con = SemiMarkovCRFHead(C, hidden_dim=H, backend=backend, boundary_scores=True, **kw)
    con.load_state_dict(free.state_dict(), strict=False)
    return free, con


def _allowed(segs, L, mins, maxs, starts, ends):
    return (all(mins[c] <= e - s <= maxs[c] for s, e, c in segs)
            and (starts is None or starts[segs[0][2]]) and (ends is None or ends[segs[-1][2]]))


CONSTRAINTS = {
    "min": dict(min_duration=[2, 1, 3]),
    "max": dict(max_duration=[2, 4, 1]),
    "min-and-max": dict(min_duration=2, max_duration=[3, 4, 2]),
    "starts": dict(allowed_starts=torch.tensor([True, False, False])),
    "ends": dict(allowed_ends=torch.tensor([False, True, True])),
    "all": dict(min_duration=[1, 2, 1], max_duration=[4, 3, 2], allowed_starts=torch.tensor([False, True, True]),
                allowed_ends=torch.tensor([True, False, True])),
}


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", sorted(CONSTRAINTS))
def test_log_z_and_viterbi_are_those_of_the_allowed_segmentations(name, backend):
    cons = CONSTRAINTS[name]
    free, con = _pair(backend, **cons)
    mins = [1] * C if "min_duration" not in cons else (
        [cons["min_duration"]] * C if isinstance(cons["min_duration"], int) else cons["min_duration"])
    maxs = cons.get("max_duration", [K] * C)
    starts, ends = cons.get("allowed_starts"), cons.get("allowed_ends")
    g = torch.Generator().manual_seed(2)
    h = torch.randn(2, 6, H, generator=g, dtype=torch.float32)
    lengths = torch.tensor([6, 5])
    z = con(h, lengths).partition
    best = con.decode(h, lengths)
    for b, L in enumerate(lengths.tolist()):
        segs_all = [s for s in _segmentations(L, K, C) if _allowed(s, L, mins, maxs, starts, ends)]
        assert segs_all, "the constraints must leave some segmentation"
        hb, lb = h[b : b + 1], lengths[b : b + 1]
        # every allowed segmentation scored in one batched call (was one call per segmentation: 3,051
        # of length 6); the same float32 scores up to rounding (max 3e-6 apart), far inside 1e-5
        n = len(segs_all)
        scores = free.gold_score(hb.expand(n, -1, -1), lb.expand(n), segments=segs_all).detach().double()
        assert math.isclose(z[b].item(), float(torch.logsumexp(scores, 0)), rel_tol=1e-5, abs_tol=1e-5)
        got = [tuple(x) for x in best.segments[b]]
        assert _allowed(got, L, mins, maxs, starts, ends), got
        assert math.isclose(float(best.scores[b]), float(scores.max()), rel_tol=1e-5, abs_tol=1e-5)
    # the constrained loss of an allowed gold segmentation is finite and differentiable
    gold = [segs for segs in _segmentations(6, K, C) if _allowed(segs, 6, mins, maxs, starts, ends)][0]
    gold5 = [segs for segs in _segmentations(5, K, C) if _allowed(segs, 5, mins, maxs, starts, ends)][-1]
    loss = con.compute_loss(h, lengths, segments=[gold, gold5])
    loss.backward()
    assert math.isfinite(loss.item()) and all(torch.isfinite(p.grad).all() for p in con.parameters() if p.grad is not None)


@pytest.mark.parametrize("segments, match", [
    ([(0, 1, 0), (1, 4, 1), (4, 6, 1)], r"segment \[0, 1\) of label 0 \(duration 1\), outside the durations the head allows for label 0: \[2, 4\]"),
    ([(0, 2, 0), (2, 6, 2)], r"label 2 \(duration 4\), outside .* label 2: \[1, 2\]"),
    ([(0, 3, 1), (3, 6, 1)], "starts with label 1, which allowed_starts forbids"),
    ([(0, 3, 0), (3, 6, 0)], "ends with label 0, which allowed_ends forbids"),
])
def test_a_gold_segmentation_that_breaks_a_constraint_is_named(segments, match):
    _, con = _pair("torch", min_duration=[2, 1, 1], max_duration=[4, 4, 2],
                   allowed_starts=torch.tensor([True, False, True]), allowed_ends=torch.tensor([False, True, True]))
    h = torch.randn(1, 6, H)
    with pytest.raises(ValueError, match=match):
        con.compute_loss(h, torch.tensor([6]), segments=[segments])
    # zero_infinity gives it loss 0 instead
    assert float(con.compute_loss(h, torch.tensor([6]), segments=[segments], zero_infinity=True).detach()) == 0.0


def test_labels_split_long_runs_at_the_labels_own_maximum():
    _, con = _pair("torch", max_duration=[2, 4, 3])
    h = torch.randn(1, 7, H)
    # a run of 7 positions of label 0 (maximum 2): segments of 2, 2, 2, 1
    lab = torch.zeros(1, 7, dtype=torch.long)
    want = con.gold_score(h, torch.tensor([7]), segments=[[(0, 2, 0), (2, 4, 0), (4, 6, 0), (6, 7, 0)]])
    assert torch.allclose(con.gold_score(h, torch.tensor([7]), labels=lab), want)
    assert math.isfinite(float(con.compute_loss(h, torch.tensor([7]), lab).detach()))


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(max_duration=[2, 3]), ValueError, "max_duration must be an integer or a sequence of C = 3"),
    (dict(max_duration=4, min_duration=[1, 5, 1]), ValueError, "min_duration of label 1 \\(5\\) exceeds its max_duration \\(4\\)"),
    (dict(max_duration=[2, 0, 1]), ValueError, "max_duration must be >= 1"),
    (dict(max_duration=4, min_duration=1.5), TypeError, "min_duration must be an integer"),
    (dict(max_duration=4, allowed_starts=torch.zeros(3, dtype=torch.bool)), ValueError, "allowed_starts allows no label"),
    (dict(max_duration=4, allowed_ends=torch.ones(2, dtype=torch.bool)), ValueError, r"allowed_ends must have shape \(C,\) = \(3,\)"),
])
def test_bad_constraint_arguments_are_named(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        SemiMarkovCRFHead(C, **kwargs)


def test_constraints_show_in_repr_and_stay_out_of_the_penalty():
    _, con = _pair("torch", min_duration=[1, 2, 1], max_duration=[4, 3, 2], allowed_starts=torch.tensor([1, 0, 1]))
    text = repr(con)
    assert "min_duration=[1, 2, 1]" in text and "max_duration_per_label=[4, 3, 2]" in text
    assert "allowed_starts=[0, 2]" in text
    with torch.no_grad():
        con.duration_bias.fill_(1.0)
        con.transition.zero_()
    # only the allowed durations count: 4 + 2 + 2 of the 12 entries
    assert float(con.parameter_penalty()) == 8.0
