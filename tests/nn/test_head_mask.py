"""The head's ``mask=`` (instead of ``lengths``), ``log_prob`` and ``repr``."""

import pytest
import torch

from torch_semimarkov import SemiMarkovCRFHead


def _head(**kw):
    torch.manual_seed(0)
    return SemiMarkovCRFHead(3, 4, hidden_dim=5, backend="torch", **kw)


def _batch():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(3, 9, 5, generator=g)
    lengths = torch.tensor([9, 4, 6])
    mask = torch.arange(9)[None, :] < lengths[:, None]
    labels = torch.randint(0, 3, (3, 9), generator=g).masked_fill(~mask, -100)
    return h, lengths, mask, labels


def test_mask_gives_what_lengths_give_in_every_method():
    head = _head(boundary_scores=True)
    h, lengths, mask, labels = _batch()
    assert torch.equal(head(h, lengths).partition, head(h, mask=mask).partition)
    assert torch.equal(head.compute_loss(h, lengths, labels, reduction="none"),
                       head.compute_loss(h, labels=labels, mask=mask, reduction="none"))
    assert torch.equal(head.decode(h, lengths).labels, head.decode(h, mask=mask).labels)
    assert torch.equal(head.marginals(h, lengths).position, head.marginals(h, mask=mask).position)
    assert torch.equal(head.gold_score(h, lengths, labels), head.gold_score(h, labels=labels, mask=mask))
    # a 0/1 integer mask (pytorch-crf's ByteTensor habit) works too
    assert torch.equal(head(h, mask=mask.to(torch.uint8)).partition, head(h, lengths).partition)


@pytest.mark.parametrize("row, message", [
    ([0, 1, 1, 1, 0, 0, 0, 0, 0], "starts with False"),
    ([1, 1, 0, 1, 0, 0, 0, 0, 0], "hole: False at position 2 and True again at position 3"),
    ([0] * 9, "all False"),
])
def test_non_prefix_mask_raises_saying_what_is_wrong(row, message):
    head = _head()
    h, _, mask, labels = _batch()
    mask = mask.clone()
    mask[1] = torch.tensor(row, dtype=torch.bool)
    with pytest.raises(ValueError, match="prefix mask") as err:
        head.compute_loss(h, labels=labels, mask=mask)
    assert message in str(err.value) and "sequence 1" in str(err.value)


def test_mask_and_lengths_misuse_raise_pointing_to_the_right_argument():
    head = _head()
    h, lengths, mask, labels = _batch()
    with pytest.raises(ValueError, match="use mask= instead"):
        head.decode(h, mask)  # a bool mask passed as lengths
    with pytest.raises(ValueError, match="use mask= instead"):
        head.decode(h, mask.long())  # a 0/1 (B, T) mask passed as lengths
    with pytest.raises(ValueError, match="not both"):
        head.decode(h, lengths, mask=mask)
    with pytest.raises(TypeError, match="lengths .* or mask"):
        head.decode(h)
    with pytest.raises(ValueError, match=r"mask must have shape \(batch, T\) = \(3, 9\)"):
        head.decode(h, mask=mask[:, :5])
    with pytest.raises(ValueError, match="bool"):
        head.decode(h, mask=mask.float())


def test_log_prob_is_minus_the_per_sequence_nll_and_a_log_probability():
    head = _head(start_end_scores=True)
    h, lengths, mask, labels = _batch()
    lp = head.log_prob(h, labels=labels, mask=mask)
    assert lp.shape == (3,)
    assert bool((lp <= 1e-6).all())
    assert torch.allclose(lp, -head.compute_loss(h, lengths, labels, reduction="none"))
    assert torch.allclose(-lp.mean(), head.compute_loss(h, lengths, labels))
    # exp(log_prob) sums to one over all labelings of a tiny sequence (here: L = 2, K = 4)
    import itertools

    h1, L = h[:1, :2], torch.tensor([2])
    total = 0.0
    for a, b in itertools.product(range(3), repeat=2):
        total += float(head.log_prob(h1, L, labels=torch.tensor([[a, b]])).detach().exp())
    # labels cannot tell a 2-segment [a][a] from one segment [a a]: add the split ones by segments
    for a in range(3):
        total += float(head.log_prob(h1, L, segments=[[(0, 1, a), (1, 2, a)]]).detach().exp())
    assert abs(total - 1.0) < 1e-5


def test_repr_shows_sizes_and_options():
    text = repr(_head(boundary_scores=True, transition="duration"))
    for part in ("num_classes=3", "max_duration=4", "hidden_dim=5", "transition='duration'",
                 "boundary_scores=True", "backend='torch'", "time_parallel=None", "projection"):
        assert part in text, (part, text)
