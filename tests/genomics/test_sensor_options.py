"""GHMMConfig's sensor options (genomics.sensors / genomics.ghmm): higher-order signal models
(``signal_order``) and separate intron / intergenic chain orders (``intron_order``,
``intergenic_order``). Their defaults keep the first-order models and one chain order exactly.
"""

import itertools

import numpy as np
import pytest

from torch_semimarkov.genomics.ghmm import GHMM, GHMMConfig, assemble
from torch_semimarkov.genomics.records import encode_dna
from torch_semimarkov.genomics.sensors import SignalSensors, WeightArrayModel

from test_genomics_sensors import training_loci


def _xor_windows(n: int = 3000, seed: int = 0) -> np.ndarray:
    """(n, 5) windows whose base 3 is (base 1 + base 2) mod 4: a second-order dependency that a
    first-order model cannot see (base 3 given base 2 alone is uniform)."""
    w = np.random.default_rng(seed).integers(0, 4, (n, 5))
    w[:, 3] = (w[:, 1] + w[:, 2]) % 4
    return w


def test_higher_order_signal_model_sees_a_second_order_dependency():
    w = _xor_windows()
    m1 = WeightArrayModel(-2, 3, 0, ("A",)).fit(w)
    m1b = WeightArrayModel(-2, 3, 0, ("A",), order=1).fit(w)
    m2 = WeightArrayModel(-2, 3, 0, ("A",), order=2).fit(w)
    m3 = WeightArrayModel(-2, 3, 0, ("A",), order=3).fit(w)
    # order 1 is the first-order model exactly
    assert np.array_equal(m1.cond, m1b.cond) and all(not h for h in m1b.higher)
    # orders 2..min(order, i) at window position i, each a distribution over the next base
    assert [sorted(h) for h in m3.higher] == [[], [], [2], [2, 3], [2, 3]]
    for h in m3.higher:
        for table in h.values():
            assert np.allclose(np.exp(table).sum(-1), 1.0)
    # the window probabilities sum to 1 over all 4**5 windows, for every order
    windows = np.array(list(itertools.product(range(4), repeat=5)), dtype=np.uint8)
    for m in (m1, m2, m3):
        total = sum(np.exp(m.window_log_probs(win)[2]) for win in windows)
        assert total == pytest.approx(1.0, abs=1e-9)
    # a window that follows the rule: order 2 knows base 3 (log 4 nats better than order 1);
    # one that breaks it: order 2 finds it far less likely
    good, bad = np.array([0, 1, 2, 3, 0], dtype=np.uint8), np.array([0, 1, 2, 0, 0], dtype=np.uint8)
    gain_good = m2.window_log_probs(good)[2] - m1.window_log_probs(good)[2]
    gain_bad = m2.window_log_probs(bad)[2] - m1.window_log_probs(bad)[2]
    assert gain_good > np.log(4) - 0.05 and gain_bad < -4
    # an unknown base in the context: the longest known context. The window anchored at 2 reads
    # 0, 1, ?, 3, 0: base 3 follows the unknown base (composition), base 4 has one known base
    # before it (first order), so both orders agree; the window anchored at 6 has no unknown base
    seq = np.array([0, 1, 4, 3, 0, 1, 2, 3, 0], dtype=np.uint8)
    lp1, lp2 = m1.window_log_probs(seq), m2.window_log_probs(seq)
    assert np.isfinite(lp2).all() and lp2[2] == pytest.approx(lp1[2], abs=1e-12)
    assert lp2[6] - lp1[6] > np.log(4) - 0.05   # 0, 1, 2, 3, 0 follows the rule
    with pytest.raises(ValueError):
        WeightArrayModel(-2, 3, 0, ("A",), order=0)


def test_signal_order_per_signal_changes_only_that_signal():
    loci = training_loci(10, seed=3)
    base = SignalSensors.fit(loci)
    donor2 = SignalSensors.fit(loci, orders={"donor": 2})
    assert {n: m.order for n, m in donor2.models.items()} == {"donor": 2, "acceptor": 1, "start": 1, "stop": 1}
    codes = encode_dna(loci[0].sequence)
    bg = np.full(len(codes), np.log(0.25))
    a, b = base.scores(codes, bg), donor2.scores(codes, bg)
    assert not np.allclose(a["donor+"], b["donor+"]) and not np.allclose(a["donor-"], b["donor-"])
    for key in a:
        if not key.startswith("donor"):
            assert np.array_equal(a[key], b[key]), key


def test_ghmm_config_sensor_options():
    loci = training_loci(10, seed=4)
    cfg = GHMMConfig(order=3, max_duration=60)
    # the defaults: every signal first order, every chain of order `order` (today's model)
    assert (cfg.signal_order, cfg.intron_order, cfg.intergenic_order) == (1, None, None)
    plain = GHMM.fit(loci, cfg)
    explicit = GHMM.fit(loci, GHMMConfig(order=3, max_duration=60, signal_order=1, intron_order=3,
                                         intergenic_order=3))
    rec = training_loci(1, seed=9)[0]
    for x, y in zip(assemble(plain.features(rec))[:5], assemble(explicit.features(rec))[:5]):
        assert np.array_equal(x.numpy(), y.numpy())
    other = GHMM.fit(loci, GHMMConfig(order=3, max_duration=60, signal_order=2, intron_order=1, intergenic_order=2))
    assert (other.content.coding.order, other.content.intron.order, other.content.intergenic.order) == (3, 1, 2)
    assert all(m.order == 2 for m in other.signals.models.values())
    changed = assemble(other.features(rec))
    assert not np.allclose(changed.cum_scores.numpy(), assemble(plain.features(rec)).cum_scores.numpy())
