"""The value statistics the checks read in one transfer (``core.values.value_stats``)."""

import math

import torch

from torch_semimarkov.core.values import check_value_stats, float_inputs, value_stats


def test_value_stats_are_each_inputs_minimum_and_maximum_then_the_lengths():
    """One float64 vector: (min, max) of each non-empty float input in order, then of ``lengths``;
    NaN propagates to its input's pair; inputs of different dtypes and empty ones are handled."""
    g = torch.Generator().manual_seed(0)
    cum = torch.randn(2, 6, 3, generator=g)
    tr = torch.randn(3, 3, generator=g, dtype=torch.float64)  # another dtype than cum_scores
    tr[0, 1] = -math.inf
    db = torch.randn(4, 3, generator=g)
    pe = torch.empty(2, 0, 3)  # empty: no entry
    lengths = torch.tensor([5, 2])
    for ps in (None, torch.randn(2, 5, 3, generator=g)):
        floats = float_inputs(cum, tr, db, ps, pe)
        got = value_stats(floats, lengths)
        want = [v for t in (cum, tr, db, ps) if t is not None for v in (t.min().item(), t.max().item())] + [2.0, 5.0]
        assert got.dtype == torch.float64 and got.tolist() == want
    # all of one dtype (one stack and one conversion): the same layout
    got = value_stats(float_inputs(cum, tr.float(), db, None, None), lengths)
    assert got.tolist() == [cum.min().item(), cum.max().item(), tr.float().min().item(), tr.float().max().item(),
                            db.min().item(), db.max().item(), 2.0, 5.0]
    # NaN reaches the check, which names the input
    bad = db.clone()
    bad[1, 2] = math.nan
    floats = float_inputs(cum, tr, bad, None, None)
    stats = value_stats(floats, lengths).tolist()
    assert math.isnan(stats[4]) and math.isnan(stats[5]) and not math.isnan(stats[0])
    try:
        check_value_stats(floats, stats, 5)
    except ValueError as exc:
        assert "duration_bias" in str(exc)
    else:
        raise AssertionError("a NaN in duration_bias passed the check")
