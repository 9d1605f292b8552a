"""GHMMConfig's sensor options (genomics.sensors / genomics.ghmm): higher-order signal models
(``signal_order``), separate intron / intergenic chain orders (``intron_order``,
``intergenic_order``) and a long-intron content chain (``long_intron_content``). Their defaults
keep the first-order models, one chain order and one intron chain exactly.
"""

import itertools

import numpy as np
import pytest

from torch_semimarkov.genomics.ghmm import GHMM, GHMMConfig, assemble
from torch_semimarkov.genomics.records import Exon, Gene, GenomicRecord, encode_dna
from torch_semimarkov.genomics.sensors import ContentSensors, SignalSensors, WeightArrayModel

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


def _two_intron_locus(rng, name: str, short: int = 50, long: int = 300) -> GenomicRecord:
    """One + gene whose short intron is A/T only and whose long intron is C/G only (GT ... AG)."""
    at = lambda n: "".join(rng.choice(list("AT"), n))  # noqa: E731
    gc = lambda n: "".join(rng.choice(list("CG"), n))  # noqa: E731
    parts = ["CCAAA" * 10, "ATG" + "GCC" * 9, "GT" + at(short - 4) + "AG", "AAG" * 10,
             "GT" + gc(long - 4) + "AG", "GAG" * 9 + "CTG", "TAA", "CCAAA" * 10]
    seq = "".join(parts)
    a = 50
    exons = [(a, a + 30), (a + 30 + short, a + 60 + short), (a + 60 + short + long, a + 90 + short + long)]
    return GenomicRecord(name, seq, [Gene("g", "+", tuple(Exon(s, e) for s, e in exons))])


def test_long_intron_content_chain():
    rng = np.random.default_rng(0)
    loci = [_two_intron_locus(rng, f"r{i}") for i in range(6)]
    one = ContentSensors.fit(loci, order=1, smoothing=1.0)
    two = ContentSensors.fit(loci, order=1, smoothing=1.0, long_intron=200)
    assert one.intron_long is None and two.intron_long is not None
    gc = lambda chain: float(np.exp(chain.tables[0][0, 0, [1, 2]]).sum())  # noqa: E731  P(C) + P(G)
    assert gc(two.intron) < 0.15 and gc(two.intron_long) > 0.95 and gc(two.intron) + 0.5 < gc(one.intron) < 0.95
    # the other chains do not change
    for name in ("coding", "intergenic", "background"):
        for x, y in zip(getattr(one, name).tables, getattr(two, name).tables):
            assert np.array_equal(x, y)
    sc = two.scores(encode_dna(loci[0].sequence))
    assert {"intron_long+", "intron_long-"} <= set(sc) and "intron_long+" not in one.scores(encode_dna("ACGT"))
    # in the GHMM: intron labels read the short-intron chain, the long introns' pieces the long one
    with pytest.raises(ValueError):
        GHMM.fit(loci, GHMMConfig(order=1, max_duration=240, long_intron_content=True))
    model = GHMM.fit(loci, GHMMConfig(order=1, max_duration=240, intron_tail=200, long_intron_content=True))
    feats = model.features(loci[0])
    emis = feats.dense("content_intron")["emission"]
    sc = model.content.scores(encode_dna(loci[0].sequence))
    g = model.grammar
    assert np.allclose(emis[:, g.index["+intron(0)"]], sc["intron+"])
    assert np.allclose(emis[:, g.index["-intron(1)"]], sc["intron-"])
    assert np.allclose(emis[:, g.index["+intron(2)[tail]"]], sc["intron_long+"])
    assert np.allclose(emis[:, g.index["-intron(0)[end]"]], sc["intron_long-"])
    assert not np.allclose(sc["intron+"], sc["intron_long+"])


def test_signal_split_is_the_same_ghmm_with_two_weights_per_signal():
    """``signal_split``: each signal's window score becomes two components, the bases before the
    anchor (``<signal>_up``) and the rest; with weight 1 each the GHMM's inputs are the unsplit
    model's, a weight on one part moves only that part, and a FeatureCRF over the split GHMM has
    17 weights whose starting inputs are the unsplit model's (a batch of the other kind is refused)."""
    import torch

    from torch_semimarkov.genomics.feature_crf import FeatureCRF, pack

    loci = training_loci(10, seed=4)
    rec = training_loci(1, seed=9)[0]
    plain = GHMM.fit(loci, GHMMConfig(order=3, max_duration=60))
    split = GHMM.fit(loci, GHMMConfig(order=3, max_duration=60, signal_split=True))
    assert split.components[-4:] == ("donor_up", "acceptor_up", "start_up", "stop_up")
    assert plain.components == split.components[:-4]
    # the sensors: the parts sum to the whole, on both strands; the upstream part is the window's
    # bases before the anchor (a donor's exon side)
    codes = encode_dna(rec.sequence)
    bg = plain.content.scores(codes)["background"]
    sc = split.signals.scores(codes, bg)
    for name in ("donor+", "donor-", "acceptor+", "stop-"):
        assert np.any(sc[name + "_up"] != 0) and np.any(sc[name] - sc[name + "_up"] != 0)
    wam = split.signals.models["donor"]
    up, rest = wam.window_log_probs(codes, bg, split=True)
    assert np.allclose(up + rest, wam.window_log_probs(codes, bg), atol=1e-12)
    fs, fp = split.features(rec), plain.features(rec)
    assert set(fs.components) == set(split.components) and set(fp.components) == set(plain.components)
    a, b = assemble(fs), assemble(fp)
    for x, y in zip(a[:5], b[:5]):
        assert np.allclose(x.numpy(), y.numpy(), atol=1e-9)
    # a weight on the upstream part moves only where the donors score
    moved = assemble(fs, {"donor_up": 0.0})
    for part in ("proj_start", "proj_end"):  # (finite where the model allows)
        x, y = getattr(moved, part).numpy(), getattr(b, part).numpy()
        assert np.array_equal(np.isfinite(x), np.isfinite(y))
    d = moved.proj_end.numpy() - b.proj_end.numpy()
    assert np.abs(d[np.isfinite(d)]).max() > 1e-3
    assert np.allclose(moved.cum_scores.numpy(), b.cum_scores.numpy(), atol=1e-9)
    # the feature CRF over the split GHMM
    crf_s, crf_p = FeatureCRF(split), FeatureCRF(plain)
    assert crf_s.weights.shape == (17,) and crf_p.weights.shape == (13,)
    bs = pack([fs], [rec.genes], dtype=torch.float64, grammar=split.grammar)
    bp = pack([fp], [rec.genes], dtype=torch.float64, grammar=plain.grammar)
    for x, y in zip(crf_s.engine_inputs(bs, torch.float64), crf_p.engine_inputs(bp, torch.float64)):
        assert torch.allclose(x, y, atol=1e-8)
    with pytest.raises(ValueError, match="donor_up"):
        crf_s.engine_inputs(bp, torch.float64)


def test_signal_bases_lists_each_sites_window_and_the_crf_scores_them():
    """``signal_bases``: the GHMM lists every candidate site of each signal with its window's bases
    (the true donors' windows are the sequence's bases around them, on either strand) and does not
    change; a FeatureCRF over it starts at the GHMM's inputs, adds ``sum_j theta[j, base_j]`` at
    each site exactly where the signal's own terms sit (continuation take-backs included, ids
    numbered across a batch of two loci), and learns ``theta`` by its gradient."""
    import torch

    from torch_semimarkov.genomics.feature_crf import FeatureCRF, pack
    from torch_semimarkov.genomics.ghmm import Term
    from torch_semimarkov.genomics.sensors import reverse_complement

    loci = training_loci(10, seed=4)
    recs = training_loci(2, seed=9)  # one + and one - locus
    assert [g.strand for r in recs for g in r.genes] == ["+", "-"]
    plain = GHMM.fit(loci, GHMMConfig(order=3, max_duration=60))
    sb = GHMM.fit(loci, GHMMConfig(order=3, max_duration=60, signal_bases=True))
    fp, fs = [plain.features(r) for r in recs], [sb.features(r) for r in recs]
    assert fp[0].windows is None and set(fs[0].windows) == {"donor", "acceptor", "start", "stop"}
    for a, b in zip(assemble(fs[0])[:5], assemble(fp[0])[:5]):
        assert torch.equal(a, b)
    # the true donors' windows: (-3, 6) around the intron's first base, read on the gene's strand
    wam = sb.signals.models["donor"]
    for rec, f in zip(recs, fs):
        gene, codes = rec.genes[0], encode_dna(rec.sequence)
        site = f.windows["donor"]
        ids = site.sites.dense("proj_end" if gene.strand == "+" else "proj_start", f.T, f.K, f.C)
        if gene.strand == "+":
            e = gene.exons[0].end  # the intron's first base; the exon's last base e - 1 reads it
            row = ids[e - 1]
            expect = codes[e + wam.lo:e + wam.hi]
        else:
            s = gene.exons[-1].start  # the - strand intron's first base is s - 1; the exon's 5' base s reads it
            row = ids[s]
            r = f.T - 1 - (s - 1)
            expect = reverse_complement(codes)[r + wam.lo:r + wam.hi]
        i = int(row[row > 0][0])
        assert set(row[row != 0].tolist()) == {i}  # one site, whichever label reads it
        assert site.codes[i - 1].tolist() == expect.tolist()
    # the CRF: at theta = 0 the GHMM's inputs; then theta's score exactly where the signal's terms sit
    crf_p, crf_s = FeatureCRF(plain), FeatureCRF(sb)
    assert set(crf_s.site_bases) == {"donor", "acceptor", "start", "stop"} and not len(crf_p.site_bases)
    assert crf_s.site_bases["acceptor"].shape == (sb.signals.models["acceptor"].width, 4)
    bs = pack(fs, [r.genes for r in recs], dtype=torch.float64, grammar=sb.grammar)
    bp = pack(fp, [r.genes for r in recs], dtype=torch.float64, grammar=plain.grammar)
    base = crf_p.engine_inputs(bp, torch.float64)
    for x, y in zip(crf_s.engine_inputs(bs, torch.float64), base):
        assert torch.equal(x, y)
    with pytest.raises(ValueError, match="signal_bases"):
        crf_s.engine_inputs(bp, torch.float64)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in crf_s.site_bases.values():
            p.normal_()
    moved = crf_s.engine_inputs(bs, torch.float64)
    assert torch.equal(moved[0], base[0]) and torch.equal(moved[1], base[1]) and torch.equal(moved[2], base[2])
    for k, part in ((3, "proj_start"), (4, "proj_end")):
        expect = np.zeros((2, bs.T, sb.grammar.num_labels))
        for b, f in enumerate(fs):
            for name, site in f.windows.items():
                theta = np.concatenate([crf_s.site_bases[name].detach().numpy(), np.zeros((site.codes.shape[1], 1))], 1)
                score = np.concatenate([[0.0], theta[np.arange(theta.shape[0]), site.codes.astype(np.int64)].sum(1)])
                for term in getattr(site.sites, part):
                    Term(score[term.values.astype(np.int64)], term.index, term.scale).add_to(expect[b, :f.T])
        got = (moved[k] - base[k]).detach().numpy()
        fin = np.isfinite(got)
        assert np.abs(expect).max() > 1.0 and np.array_equal(fin, np.isfinite(base[k].detach().numpy()))
        assert np.allclose(got[fin], expect[fin], atol=1e-10)
    # the penalty pulls theta to 0; the NLL's gradient in theta matches a finite difference
    assert float(crf_s.penalty().detach()) > float(crf_p.penalty().detach()) + 1.0
    theta = crf_s.site_bases["donor"]
    crf_s.nll(bs, torch.float64).sum().backward()
    g = theta.grad.clone()
    assert torch.isfinite(g).all() and g.abs().max() > 1e-3
    j, x = divmod(int(g.abs().argmax()), 4)
    eps = 1e-5
    with torch.no_grad():
        theta[j, x] += eps
        up = float(crf_s.nll(bs, torch.float64).sum())
        theta[j, x] -= 2 * eps
        down = float(crf_s.nll(bs, torch.float64).sum())
    assert abs((up - down) / (2 * eps) - float(g[j, x])) < 1e-5 * max(1.0, abs(float(g[j, x])))
