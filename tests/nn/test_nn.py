"""SemiMarkovCRFHead: a proper NLL by enumeration, gold/partition consistency for every option,
valid decodes, gradients to every parameter, clear errors on bad input."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from torch_semimarkov.durations import DURATION_NAMES
from torch_semimarkov.core.gold import gold_score, labels_to_starts
from torch_semimarkov.core.constants import NEG_INF

nn_mod = pytest.importorskip("torch_semimarkov.nn", reason="the streaming engine is not importable yet")
SemiMarkovCRFHead = nn_mod.SemiMarkovCRFHead

# ---------------------------------------------------------------- brute force, written independently


def all_segmentations(L: int, K: int, C: int):
    """Every segmentation of 0..L-1 as a list of (start, end, label)."""

    def compositions(n):
        if n == 0:
            yield []
            return
        for k in range(1, min(K, n) + 1):
            for rest in compositions(n - k):
                yield [k] + rest

    for durs in compositions(L):
        for labs in itertools.product(range(C), repeat=len(durs)):
            segs, s = [], 0
            for k, c in zip(durs, labs):
                segs.append((s, s + k, c))
                s += k
            yield segs


def brute_score(segs, S, Tr, D, ps, pe):
    """Score of one segmentation of one sequence, straight from docs/internals.md §1 (float64)."""
    total, prev = 0.0, None
    for s, e, c in segs:
        k = e - s
        tr = Tr if Tr.dim() == 2 else Tr[k - 1]
        total += float(S[e, c] - S[s, c] + D[k - 1, c])
        if ps is not None:
            total += float(ps[s, c] + pe[e - 1, c])
        total += float(torch.logsumexp(tr[:, c], 0)) if prev is None else float(tr[prev, c])
        prev = c
    return total


def randomise(head: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.7)


OPTION_SETS = {
    "plain": {},
    "boundary": {"boundary_scores": True},
    "startend": {"start_end_scores": True},
    "durtrans": {"transition": "duration"},
    "allowed": {"allowed": True},
    "all": {"boundary_scores": True, "start_end_scores": True, "transition": "duration", "allowed": True},
}
DURATIONS = list(DURATION_NAMES) + ["callable"]


def make_head(opts: dict, duration: str, C: int, K: int, H: int, dtype=torch.float64, seed=0):
    kwargs = {k: v for k, v in opts.items() if k != "allowed"}
    if opts.get("allowed"):
        allowed = torch.ones(C, C, dtype=torch.bool)
        allowed[0, 1] = False
        allowed[C - 1, C - 1 if C > 2 else 0] = False
        kwargs["allowed_transitions"] = allowed
    if duration == "callable":
        dur = torch.nn.Linear(1, C)  # learnable callable: (K, 1) -> (K, C)
    else:
        dur = duration
    head = SemiMarkovCRFHead(C, K, hidden_dim=H, duration=dur, cumsum_dtype=dtype, use_triton=False, **kwargs)
    head = head.to(dtype)
    randomise(head, seed)
    return head


@pytest.mark.parametrize("duration", DURATIONS)
@pytest.mark.parametrize("opt_name", list(OPTION_SETS))
def test_nll_is_normalised_by_enumeration(opt_name, duration):
    torch.manual_seed(1)
    C, K, H, T = 3, 3, 4, 5
    head = make_head(OPTION_SETS[opt_name], duration, C, K, H)
    hidden = torch.randn(2, T, H, dtype=torch.float64)
    lengths = torch.tensor([5, 4])
    out = head(hidden, lengths)
    for b in range(2):
        out_d = [t.detach() if isinstance(t, torch.Tensor) else t for t in out]
        L = int(lengths[b])
        _, cum, Tr, D, proj_s, proj_e, _ = out_d
        S = cum[b]
        ps = None if proj_s is None else proj_s[b]
        pe = None if proj_e is None else proj_e[b]
        segs_all = list(all_segmentations(L, K, C))
        bf = torch.tensor([brute_score(sg, S, Tr.clamp(min=NEG_INF), D, ps, pe) for sg in segs_all], dtype=torch.float64)
        # the engine's log Z equals the brute-force log-sum-exp
        assert abs(float(out.partition[b].detach()) - float(torch.logsumexp(bf, 0))) < 1e-8
        if opt_name in ("allowed", "all"):
            allowed = head.allowed_transitions
            keep = [all(bool(allowed[a[2], c[2]]) for a, c in zip(sg, sg[1:])) for sg in segs_all]
        else:
            keep = [True] * len(segs_all)
        idx = [i for i, k in enumerate(keep) if k]
        segs = [segs_all[i] for i in idx]
        n = len(segs)
        hb = hidden[b : b + 1].expand(n, T, H)
        lb = lengths[b : b + 1].expand(n)
        gold = head.gold_score(hb, lb, segments=segs)
        torch.testing.assert_close(gold, bf[idx], atol=1e-8, rtol=1e-8)
        nll = head.compute_loss(hb, lb, segments=segs, reduction="none")
        assert bool((nll >= -1e-9).all())
        assert abs(float(torch.exp(-nll.detach()).sum()) - 1.0) < 1e-8


def test_labels_match_segments_and_long_runs_split():
    torch.manual_seed(0)
    C, K, H, T = 3, 2, 4, 6
    head = make_head({"transition": "duration", "boundary_scores": True}, "learned", C, K, H)
    hidden = torch.randn(1, T, H, dtype=torch.float64)
    lengths = torch.tensor([6])
    labels = torch.tensor([[1, 1, 1, 1, 1, 0]])
    # a run of 5 with K = 2 becomes (0,2), (2,4), (4,5) joined by 1 -> 1 transitions
    segs = [[(0, 2, 1), (2, 4, 1), (4, 5, 1), (5, 6, 0)]]
    g_lab = head.gold_score(hidden, lengths, labels=labels)
    g_seg = head.gold_score(hidden, lengths, segments=segs)
    torch.testing.assert_close(g_lab, g_seg)
    _, starts = labels_to_starts(labels, lengths, C, K)
    assert starts.int().tolist() == [[1, 0, 1, 0, 1, 1]]


def test_float32_nll_nonnegative_and_sums_to_one():
    torch.manual_seed(2)
    C, K, H, T = 2, 3, 5, 5
    head = make_head(OPTION_SETS["all"], "negative_binomial", C, K, H, dtype=torch.float32)
    hidden = torch.randn(1, T, H)
    segs = [s for s in all_segmentations(T, K, C) if all(bool(head.allowed_transitions[a[2], c[2]]) for a, c in zip(s, s[1:]))]
    nll = head.compute_loss(hidden.expand(len(segs), T, H), torch.full((len(segs),), T), segments=segs, reduction="none")
    assert nll.dtype == torch.float32
    assert bool((nll >= -1e-4).all())
    assert abs(float(torch.exp(-nll.detach().double()).sum()) - 1.0) < 1e-4


def test_centring_over_valid_positions_only():
    torch.manual_seed(3)
    head = SemiMarkovCRFHead(3, 4, hidden_dim=6, use_triton=False)
    hidden = torch.randn(2, 9, 6)
    lengths = torch.tensor([9, 5])
    out = head(hidden, lengths)
    # centred per label over the batch's valid positions: the final cumulative values sum to 0
    torch.testing.assert_close(out.cum_scores[0, 9] + out.cum_scores[1, 5], torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.cum_scores[1, 5:], out.cum_scores[1, 5:6].expand(5, 3))
    assert out.cum_scores.dtype == torch.float32
    # padding content must not change the loss of the short sequence
    hidden2 = hidden.clone()
    hidden2[1, 5:] = 100.0
    torch.testing.assert_close(head(hidden2, lengths).partition, out.partition)


def test_decode_returns_valid_tilings_and_matches_best_enumerated():
    torch.manual_seed(4)
    C, K, H, T = 3, 3, 4, 6
    head = make_head(OPTION_SETS["all"], "learned", C, K, H)
    hidden = torch.randn(3, T, H, dtype=torch.float64)
    lengths = torch.tensor([6, 3, 1])
    res = head.decode(hidden, lengths)
    assert res.labels.shape == (3, T)
    for b in range(3):
        L = int(lengths[b])
        segs = res.segments[b]
        assert segs[0][0] == 0 and segs[-1][1] == L
        assert all(a[1] == c[0] for a, c in zip(segs, segs[1:]))
        assert all(1 <= e - s <= K and 0 <= c < C for s, e, c in segs)
        for a, c in zip(segs, segs[1:]):
            assert bool(head.allowed_transitions[a[2], c[2]])
        lab = res.labels[b]
        assert bool((lab[L:] == -1).all())
        for s, e, c in segs:
            assert bool((lab[s:e] == c).all())
        # the Viterbi path is the best allowed segmentation
        gold = head.gold_score(hidden[b : b + 1], lengths[b : b + 1], segments=[[tuple(s) for s in segs]])
        others = [s for s in all_segmentations(L, K, C) if all(bool(head.allowed_transitions[a[2], c[2]]) for a, c in zip(s, s[1:]))]
        n = len(others)
        best = head.gold_score(hidden[b : b + 1].expand(n, T, H), lengths[b : b + 1].expand(n), segments=others).max()
        assert float(gold.detach()) >= float(best.detach()) - 1e-8


def test_marginals_are_probabilities():
    torch.manual_seed(5)
    head = make_head(OPTION_SETS["boundary"], "poisson", 3, 4, 5, dtype=torch.float32)
    hidden = torch.randn(2, 12, 5)
    lengths = torch.tensor([12, 7])
    post = head.marginals(hidden, lengths)
    assert post.position.shape == (2, 12, 3) and post.boundary.shape == (2, 12) and post.position_entropy.shape == (2, 12)
    torch.testing.assert_close(post.position[0].sum(-1), torch.ones(12), atol=1e-4, rtol=0)
    torch.testing.assert_close(post.position[1, :7].sum(-1), torch.ones(7), atol=1e-4, rtol=0)
    assert float(post.boundary[0, 0]) == pytest.approx(1.0, abs=1e-4)
    assert bool((post.position_entropy >= -1e-6).all()) and bool((post.position_entropy <= math.log(3) + 1e-4).all())
    assert bool((post.position_entropy[1, 7:] == 0).all())
    assert head.posterior(hidden, lengths).position.shape == (2, 12, 3)


@pytest.mark.parametrize("duration", ["learned", "negative_binomial", "callable"])
def test_gradients_reach_every_parameter(duration):
    torch.manual_seed(6)
    head = make_head(OPTION_SETS["all"], duration, 3, 4, 5, dtype=torch.float32)
    hidden = torch.randn(2, 10, 5, requires_grad=True)
    lengths = torch.tensor([10, 6])
    labels = torch.tensor([[0, 0, 2, 2, 2, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0] + [-100] * 4])
    loss = head.compute_loss(hidden, lengths, labels) + 0.01 * head.parameter_penalty()
    loss.backward()
    for name, p in head.named_parameters():
        assert p.grad is not None, name
        assert bool(torch.isfinite(p.grad).all()), name
        assert float(p.grad.abs().sum()) > 0, name
    assert hidden.grad is not None and float(hidden.grad.abs().sum()) > 0
    # forbidden transitions receive no gradient
    assert bool((head.transition.grad[..., 0, 1] == 0).all())


def test_parameter_names_and_penalty():
    head = SemiMarkovCRFHead(4, 6, hidden_dim=3)
    names = dict(head.named_parameters())
    assert names["transition"].shape == (4, 4)
    assert names["duration_bias"].shape == (6, 4)
    assert head.duration_bias is names["duration_bias"]
    with torch.no_grad():
        head.transition.fill_(2.0)
        head.duration_bias.fill_(-1.0)
    assert float(head.parameter_penalty().detach()) == pytest.approx(16 * 4 + 24 * 1)
    assert float(head.parameter_penalty(p=1.0).detach()) == pytest.approx(16 * 2 + 24)
    h2 = SemiMarkovCRFHead(4, 6, duration="geometric", transition="duration")
    assert h2.duration_bias.shape == (6, 4) and h2.transition.shape == (6, 4, 4)
    assert "duration_bias" not in dict(h2.named_parameters())


def test_reductions():
    torch.manual_seed(7)
    head = SemiMarkovCRFHead(3, 4, hidden_dim=5, use_triton=False)
    hidden = torch.randn(2, 8, 5)
    lengths = torch.tensor([8, 5])
    labels = torch.tensor([[0, 0, 1, 1, 1, 2, 2, 2], [2, 2, 0, 0, 0, -100, -100, -100]])
    none = head.compute_loss(hidden, lengths, labels, reduction="none")
    assert none.shape == (2,)
    torch.testing.assert_close(head.compute_loss(hidden, lengths, labels, reduction="sum"), none.sum())
    torch.testing.assert_close(head.compute_loss(hidden, lengths, labels), none.mean())
    torch.testing.assert_close(head.compute_loss(hidden, lengths, labels, reduction="token_mean"), none.sum() / 13)
    with pytest.raises(ValueError, match="reduction"):
        head.compute_loss(hidden, lengths, labels, reduction="avg")


def test_mixed_precision_inputs_run_in_float32():
    torch.manual_seed(8)
    head = SemiMarkovCRFHead(3, 4, hidden_dim=5, use_triton=False)
    labels = torch.tensor([[0, 0, 1, 1, 1, 2, 2, 2]])
    hidden = torch.randn(1, 8, 5)
    ref = head.compute_loss(hidden, torch.tensor([8]), labels)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = head(hidden, torch.tensor([8]))
        loss = head.compute_loss(hidden, torch.tensor([8]), labels)
    assert out.cum_scores.dtype == torch.float32 and out.partition.dtype == torch.float32
    assert loss.dtype == torch.float32
    assert abs(float(loss.detach()) - float(ref.detach())) < 0.5
    loss.backward()
    # half-precision hidden states without autocast
    h16 = SemiMarkovCRFHead(3, 4, hidden_dim=None, use_triton=False)
    l16 = h16.compute_loss(torch.randn(1, 8, 3).half(), torch.tensor([8]), labels)
    assert l16.dtype == torch.float32 and bool(torch.isfinite(l16))


# ---------------------------------------------------------------- errors


@pytest.fixture
def small():
    torch.manual_seed(9)
    head = SemiMarkovCRFHead(3, 4, hidden_dim=5, use_triton=False)
    return head, torch.randn(2, 6, 5), torch.tensor([6, 4])


def test_bad_labels_raise(small):
    head, hidden, lengths = small
    ok = torch.tensor([[0, 0, 1, 1, 2, 2], [1, 1, 0, 0, -100, -100]])
    head.compute_loss(hidden, lengths, ok)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\).*label 3 at position 2"):
        head.compute_loss(hidden, lengths, torch.tensor([[0, 0, 3, 1, 2, 2], [1, 1, 0, 0, -100, -100]]))
    with pytest.raises(ValueError, match="label -100 at position 3 < length 4"):
        head.compute_loss(hidden, lengths, torch.tensor([[0, 0, 1, 1, 2, 2], [1, 1, 0, -100, -100, -100]]))
    with pytest.raises(ValueError, match="past a sequence's length must be ignore_index"):
        head.compute_loss(hidden, lengths, torch.tensor([[0, 0, 1, 1, 2, 2], [1, 1, 0, 0, 0, 0]]))
    with pytest.raises(ValueError, match=r"labels must have shape \(batch, T\) = \(2, 6\)"):
        head.compute_loss(hidden, lengths, ok[:, :5])
    with pytest.raises(ValueError, match="integers"):
        head.compute_loss(hidden, lengths, ok.float())
    with pytest.raises(ValueError, match="exactly one of"):
        head.compute_loss(hidden, lengths)


def test_bad_segments_raise(small):
    head, hidden, lengths = small
    with pytest.raises(ValueError, match="tile"):
        head.compute_loss(hidden, lengths, segments=[[(0, 3, 0), (4, 6, 1)], [(0, 4, 0)]])
    with pytest.raises(ValueError, match="duration 6"):
        head.compute_loss(hidden, lengths, segments=[[(0, 6, 0)], [(0, 4, 0)]])
    with pytest.raises(ValueError, match="cover"):
        head.compute_loss(hidden, lengths, segments=[[(0, 3, 0), (3, 6, 1)], [(0, 3, 0)]])


def test_forbidden_gold_transition_raises():
    allowed = torch.ones(3, 3, dtype=torch.bool)
    allowed[0, 1] = False
    head = SemiMarkovCRFHead(3, 4, allowed_transitions=allowed, use_triton=False)
    with pytest.raises(ValueError, match="moves 0 -> 1 at position 2"):
        head.compute_loss(torch.randn(1, 4, 3), torch.tensor([4]), torch.tensor([[0, 0, 1, 1]]))
    with pytest.raises(ValueError, match="all False"):
        SemiMarkovCRFHead(2, 3, allowed_transitions=torch.tensor([[True, False], [True, False]]))


def test_nan_checks(small):
    head, hidden, lengths = small
    bad = hidden.clone()
    bad[0, 2, 1] = float("nan")
    with pytest.raises(ValueError, match="hidden_states contains NaN values after projection layer"):
        head(bad, lengths)
    raw = SemiMarkovCRFHead(3, 4, use_triton=False)
    scores = torch.randn(2, 6, 3)
    scores[0, 1, 0] = float("inf")
    with pytest.raises(ValueError, match=r"hidden_states contains infinite values .*inf at sequence 0, position 1"):
        raw(scores, lengths)


def test_bad_shapes_raise(small):
    head, hidden, lengths = small
    with pytest.raises(ValueError, match=r"hidden_states must have shape \(batch, T, 5\)"):
        head(hidden[..., :4], lengths)
    with pytest.raises(ValueError, match=r"lengths must lie in \[1, T\]"):
        head(hidden, torch.tensor([7, 4]))
    with pytest.raises(ValueError, match=r"lengths must have shape"):
        head(hidden, torch.tensor([6]))
    with pytest.raises(ValueError, match="transition must be"):
        SemiMarkovCRFHead(3, 4, transition="dense")


def test_gold_score_function_docstring_case():
    S = torch.zeros(1, 4, 2)
    S[0, 1:, 1] = torch.tensor([1.0, 2.0, 3.0])
    g = gold_score(S, torch.zeros(2, 2), torch.zeros(3, 2), torch.tensor([3]), torch.tensor([[1, 1, 1]]), torch.tensor([[True, False, False]]))
    assert float(g) == pytest.approx(3.0 + math.log(2.0), abs=1e-6)


@pytest.mark.parametrize("opt_name", ["plain", "all"])
def test_enumeration_k_at_least_t_and_length_one(opt_name):
    torch.manual_seed(10)
    C, K, H, T = 2, 6, 3, 4
    head = make_head(OPTION_SETS[opt_name], "poisson", C, K, H)
    hidden = torch.randn(3, T, H, dtype=torch.float64)
    lengths = torch.tensor([4, 1, 2])
    for b in range(3):
        L = int(lengths[b])
        segs = list(all_segmentations(L, K, C))
        if head.allowed_transitions is not None:
            segs = [s for s in segs if all(bool(head.allowed_transitions[a[2], c[2]]) for a, c in zip(s, s[1:]))]
        n = len(segs)
        nll = head.compute_loss(hidden[b : b + 1].expand(n, T, H), lengths[b : b + 1].expand(n), segments=segs, reduction="none")
        assert bool((nll >= -1e-9).all())
        assert abs(float(torch.exp(-nll.detach()).sum()) - 1.0) < 1e-8


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("opt_name", ["plain", "all", "boundary"])
def test_gpu_head_matches_cpu(opt_name):
    torch.manual_seed(11)
    C, K, H, T = 4, 7, 6, 57
    cpu = make_head(OPTION_SETS[opt_name], "learned", C, K, H, dtype=torch.float32)
    gpu = make_head(OPTION_SETS[opt_name], "learned", C, K, H, dtype=torch.float32)
    gpu.load_state_dict(cpu.state_dict())
    gpu = gpu.cuda()
    gpu.use_triton = True
    hidden = torch.randn(3, T, H)
    lengths = torch.tensor([57, 30, 1])
    labels = torch.randint(0, C, (3, T))
    labels = torch.where(torch.arange(T)[None] < lengths[:, None], labels, -100)
    if cpu.allowed_transitions is not None:
        labels = torch.where(labels == 1, 0, labels)  # avoid the forbidden 0 -> 1 move
    loss_c = cpu.compute_loss(hidden, lengths, labels, reduction="sum")
    loss_g = gpu.compute_loss(hidden.cuda(), lengths.cuda(), labels.cuda(), reduction="sum")
    loss_c.backward()
    loss_g.backward()
    torch.testing.assert_close(loss_g.cpu(), loss_c, atol=1e-3, rtol=1e-4)
    for (name, pc), (_, pg) in zip(cpu.named_parameters(), gpu.named_parameters()):
        torch.testing.assert_close(pg.grad.cpu(), pc.grad, atol=2e-3, rtol=1e-3, msg=name)
    dc, dg = cpu.decode(hidden, lengths), gpu.decode(hidden.cuda(), lengths.cuda())
    torch.testing.assert_close(dg.scores.cpu(), dc.scores, atol=1e-3, rtol=1e-4)
    mc, mg = cpu.marginals(hidden, lengths), gpu.marginals(hidden.cuda(), lengths.cuda())
    torch.testing.assert_close(mg.position.cpu(), mc.position, atol=1e-4, rtol=1e-3)
    torch.testing.assert_close(mg.boundary.cpu(), mc.boundary, atol=1e-4, rtol=1e-3)
    # bf16 autocast on the GPU: CRF math still in float32
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = gpu(hidden.cuda(), lengths.cuda())
    assert out.cum_scores.dtype == torch.float32 and bool(torch.isfinite(out.partition).all())


def test_training_reduces_loss_and_decodes_gold():
    torch.manual_seed(12)
    C, K, T = 3, 6, 40
    labels = torch.tensor([[0] * 5 + [1] * 6 + [2] * 4 + [0] * 5 + [1] * 6 + [2] * 6 + [0] * 3 + [1] * 5])
    hidden = torch.nn.functional.one_hot(labels, C).float() + 0.8 * torch.randn(1, T, C)
    head = SemiMarkovCRFHead(C, K, hidden_dim=C, duration="negative_binomial", use_triton=False)
    opt = torch.optim.Adam(head.parameters(), lr=0.1)
    lengths = torch.tensor([T])
    first = float(head.compute_loss(hidden, lengths, labels).detach())
    for _ in range(60):
        opt.zero_grad()
        loss = head.compute_loss(hidden, lengths, labels)
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.5 * first
    assert float((head.decode(hidden, lengths).labels == labels).float().mean()) > 0.9
