"""The head is exactly the semi-CRF of its raw projected scores, and that model is local.

An oracle built here from the head's raw pieces (the projection's output, the boundary layers,
start/end scores, the duration table, the transition), with no centring at all, enumerates every
segmentation (:func:`torch_semimarkov.oracle.brute_force`). The head's log Z, NLL, gradients and
marginals must equal it for every head option; and the score difference between two
segmentations that differ only inside a prefix must not change when positions are appended or
other sequences join the batch.
"""

from __future__ import annotations

import pytest
import torch

from torch_semimarkov import SemiMarkovCRFHead
from torch_semimarkov.oracle import brute_force, enumerate_segmentations

OPTIONS = {
    "plain": {},
    "boundary": {"boundary_scores": True},
    "startend": {"start_end_scores": True},
    "durtrans": {"transition": "duration"},
    "limits": {"min_duration": [1, 2, 1], "max_duration": [3, 3, 2]},
    "allowed": {"allowed_transitions": torch.tensor([[1, 0, 1], [1, 1, 1], [1, 1, 0]]).bool(),
                "allowed_starts": torch.tensor([1, 1, 0]).bool(), "allowed_ends": torch.tensor([0, 1, 1]).bool()},
    "poisson": {"duration": "poisson"},
    "everything": {"boundary_scores": True, "start_end_scores": True, "transition": "duration",
                   "min_duration": [1, 2, 1], "allowed_transitions": torch.tensor([[1, 0, 1], [1, 1, 1], [1, 1, 0]]).bool()},
}
C, K, H = 3, 3, 4


def make_head(options: dict, dtype=torch.float64, seed: int = 0) -> SemiMarkovCRFHead:
    options = dict(options)
    head = SemiMarkovCRFHead(C, options.pop("max_duration", K), hidden_dim=H, cumsum_dtype=dtype, backend="torch",
                             **options).to(dtype)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.7)
        # labels with very different mean scores: what per-sequence centring got wrong
        head.projection.bias.copy_(torch.tensor([2.5, -1.5, 0.5], dtype=dtype))
    return head


def raw_model(head: SemiMarkovCRFHead, h: torch.Tensor, lengths: torch.Tensor):
    """The semi-CRF that the head claims, from its raw pieces: (cum_scores, transition,
    duration_bias, proj_start, proj_end), nothing centred."""
    B, T, _ = h.shape
    x = head.projection(h)
    if head.start_scores is not None:
        for b in range(B):
            x = x.index_put((torch.tensor([b]), torch.tensor([0])), x[b, 0] + head.start_scores)
            L = int(lengths[b])
            x = x.index_put((torch.tensor([b]), torch.tensor([L - 1])), x[b, L - 1] + head.end_scores)
    cum = torch.cat([x.new_zeros(B, 1, C), x.cumsum(1)], dim=1)
    ps = pe = None
    if head.proj_start is not None:
        ps, pe = head.proj_start(h), head.proj_end(h)
    if head.allowed_starts is not None or head.allowed_ends is not None:
        ps = x.new_zeros(B, T, C) if ps is None else ps
        pe = x.new_zeros(B, T, C) if pe is None else pe
        for b in range(B):
            L = int(lengths[b])
            if head.allowed_starts is not None:
                ps = ps.index_put((torch.tensor([b]), torch.tensor([0])),
                                  ps[b, 0].masked_fill(~head.allowed_starts, float("-inf")))
            if head.allowed_ends is not None:
                pe = pe.index_put((torch.tensor([b]), torch.tensor([L - 1])),
                                  pe[b, L - 1].masked_fill(~head.allowed_ends, float("-inf")))
    D = head.duration_table(h.dtype)
    if head.allowed_durations is not None:
        D = D.masked_fill(~head.allowed_durations, float("-inf"))
    return cum, head.effective_transition(), D, ps, pe


@pytest.mark.parametrize("name", list(OPTIONS))
def test_head_equals_the_semi_crf_of_its_raw_scores(name):
    torch.manual_seed(0)
    head = make_head(OPTIONS[name])
    Kh = head.max_duration
    h = torch.randn(2, 6, H, dtype=torch.float64)
    lengths = torch.tensor([6, 4])
    weight = torch.tensor([0.7, -1.3], dtype=torch.float64)

    cum, tr, db, ps, pe = raw_model(head, h, lengths)
    oracle = brute_force(cum, tr, db, lengths, Kh, ps, pe)
    grads_oracle = torch.autograd.grad((oracle.log_Z * weight).sum(), list(head.parameters()), allow_unused=True)
    log_z = head(h, lengths).partition
    grads_head = torch.autograd.grad((log_z * weight).sum(), list(head.parameters()), allow_unused=True)
    torch.testing.assert_close(log_z, oracle.log_Z, atol=1e-9, rtol=1e-9)
    for (pname, _), a, b in zip(head.named_parameters(), grads_head, grads_oracle):
        a = torch.zeros_like(_) if a is None else a
        b = torch.zeros_like(_) if b is None else b
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9, msg=lambda m: f"d log Z / d {pname}: {m}")

    post = head.marginals(h, lengths)
    torch.testing.assert_close(post.position, oracle.position, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(post.start, oracle.start, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(post.end, oracle.end, atol=1e-9, rtol=1e-9)

    # the NLL of allowed segmentations of sequence 1, and its gradient, from the raw model
    cum, tr, db, ps, pe = raw_model(head, h, lengths)  # a fresh graph
    segs, scores = enumerate_segmentations(cum[1:], tr, db, lengths[1:], Kh, None if ps is None else ps[1:],
                                           None if pe is None else pe[1:])[0]
    keep = [i for i in range(len(segs)) if torch.isfinite(scores[i])]
    keep = keep[:: max(1, len(keep) // 40)]
    n = len(keep)
    nll = head.compute_loss(h[1:].expand(n, 6, H), lengths[1:].expand(n),
                            segments=[[tuple(x) for x in segs[i]] for i in keep], reduction="none")
    expected = brute_force(cum[1:], tr, db, lengths[1:], Kh, None if ps is None else ps[1:],
                           None if pe is None else pe[1:]).log_Z[0] - scores[keep]
    torch.testing.assert_close(nll, expected, atol=1e-9, rtol=1e-9)
    w = torch.linspace(-1, 1, n, dtype=torch.float64)
    g_head = torch.autograd.grad((nll * w).sum(), list(head.parameters()), allow_unused=True)
    g_oracle = torch.autograd.grad((expected * w).sum(), list(head.parameters()), allow_unused=True)
    for (pname, p), a, b in zip(head.named_parameters(), g_head, g_oracle):
        a = torch.zeros_like(p) if a is None else a
        b = torch.zeros_like(p) if b is None else b
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9, msg=lambda m: f"d NLL / d {pname}: {m}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_score_differences_inside_a_prefix_ignore_the_rest_of_the_sequence_and_batch(dtype):
    head = make_head(OPTIONS["boundary"], dtype=dtype, seed=3)
    g = torch.Generator().manual_seed(5)
    prefix = torch.randn(1, 12, H, generator=g, dtype=dtype)
    tail = torch.randn(1, 300, H, generator=g, dtype=dtype) * 3 + 2
    a = [(0, 3, 0), (3, 5, 1), (5, 8, 0), (8, 11, 2), (11, 12, 1)]
    b = [(0, 2, 1), (2, 5, 0), (5, 8, 2), (8, 10, 2), (10, 12, 1)]
    # the same segmentation after the prefix (runs of K positions of label 1, then label 0)
    after = [(s, min(s + 3, 312), 1 if s < 200 else 0) for s in range(12, 312, 3)]
    alone = head.gold_score(prefix.expand(2, 12, H), torch.tensor([12, 12]), segments=[a, b])
    longer = torch.cat([prefix, tail], dim=1)
    extended = head.gold_score(longer.expand(2, 312, H), torch.tensor([312, 312]), segments=[a + after, b + after])
    # and in a batch beside an unrelated, strongly scored sequence
    other = torch.randn(1, 312, H, generator=g, dtype=dtype) * 5 - 4
    batch = torch.cat([longer, longer, other])
    in_batch = head.gold_score(batch, torch.tensor([312, 312, 200]),
                               segments=[a + after, b + after, [(s, s + 2, 2) for s in range(0, 200, 2)]])
    tol = dict(atol=1e-9, rtol=1e-9) if dtype == torch.float64 else dict(atol=2e-3, rtol=1e-5)
    diff = alone[0] - alone[1]
    torch.testing.assert_close(extended[0] - extended[1], diff, **tol)
    torch.testing.assert_close(in_batch[0] - in_batch[1], diff, **tol)
    # and the absolute log-probability of a segmentation of a sequence does not depend on its batch
    solo = head.log_prob(longer, torch.tensor([312]), segments=[a + after])
    torch.testing.assert_close(head.log_prob(batch[[0, 2]], torch.tensor([312, 200]),
                                             segments=[a + after, [(s, s + 2, 2) for s in range(0, 200, 2)]])[0],
                               solo[0], **tol)
