"""Intron tails (GeneGrammar(intron_tail=E), GHMMConfig(intron_tail=E)): long introns without a
per-piece cost.

An intron of n >= E bases is n - E one-base tail pieces and one end piece of E bases, scored by a
length model that is empirical below E and geometric from E on; the tests check the grammar
(unique gold parse at a K far below the intron's length, round trip, default grammar unchanged), that
the engine scores an intron exactly ``log P(n)`` of that model whatever K, that the model's
lengths sum to one, and that the GHMM decodes a gene whose intron is several times K.
"""

import math

import numpy as np
import pytest
import torch

from test_genomics_sensors import engine_gold_score, make_locus, training_loci
from torch_semimarkov.genomics.ghmm import COMPONENTS, GHMM, GHMMConfig, assemble
from torch_semimarkov.genomics.labels import MIN_INTRON, GeneGrammar
from torch_semimarkov.genomics.records import Exon, Gene, GenomicRecord
from torch_semimarkov.genomics.sensors import LengthDistribution

pytest.importorskip("numba")


def _genes():
    # + gene: introns 45 (short), 60 (= E: an end piece alone), 700 (many tail pieces); - gene: 250
    plus = Gene("a", "+", (Exon(100, 160), Exon(205, 250), Exon(310, 400), Exon(1100, 1160)))
    minus = Gene("b", "-", (Exon(1300, 1342), Exon(1592, 1700)))
    return [plus, minus], 1800


def test_default_grammar_is_unchanged():
    g = GeneGrammar()
    assert g.num_labels == 47 and g.intron_tail is None
    assert all(lab.piece is None for lab in g.labels)
    t = GeneGrammar(intron_tail=60)
    assert t.names[:47] == g.names and t.num_labels == 59
    with pytest.raises(ValueError):
        GeneGrammar(intron_tail=MIN_INTRON)
    with pytest.raises(ValueError):
        t.duration_mask(50)  # E > K


@pytest.mark.parametrize("K", [60, 90, 960])
def test_tail_grammar_round_trips_long_introns_at_small_k(K):
    g = GeneGrammar(intron_tail=60)
    genes, L = _genes()
    segs = g.encode(genes, L, K)
    g.check(segs, L, K)
    names = [g.names[c] for _, _, c in segs]
    # the 700-base intron: 640 tail pieces then the end piece; the 60-base one: an end piece alone
    assert names.count("+intron(0)[tail]") + names.count("+intron(1)[tail]") + names.count("+intron(2)[tail]") == 640 + 0
    assert sum(n.startswith("+intron") and n.endswith("[end]") for n in names) == 2
    assert sum(n.startswith("-intron") and n.endswith("[tail]") for n in names) == 250 - 60
    # the introns' parse does not depend on K (intergenic runs and exons longer than K are cut at K)
    introns = lambda ss: [s for s in ss if g.labels[s[2]].kind == "intron"]  # noqa: E731
    assert introns(segs) == introns(g.encode(genes, L, 960))
    back = g.decode(segs)
    assert [(x.strand, x.exons) for x in back] == [(x.strand, x.exons) for x in genes]
    assert not any(x.partial for x in back)


def test_tail_grammar_forbids_other_parses_of_an_intron():
    g = GeneGrammar(intron_tail=60)
    ok = g.allowed_transitions()
    mask = g.duration_mask(120)
    i, t, e = g.index["+intron(1)"], g.index["+intron(1)[tail]"], g.index["+intron(1)[end]"]
    assert not ok[i, i] and not ok[e, e] and ok[t, t] and ok[t, e] and not ok[t, i] and not ok[i, t]
    assert not ok[e, t] and not ok[t, g.index["+terminal(1)"]] and ok[e, g.index["+terminal(1)"]]
    # exons enter an intron of their exit phase by any of its three labels
    ex = g.index["+initial(1)"]
    assert ok[ex, i] and ok[ex, t] and ok[ex, e] and not ok[ex, g.index["+intron(2)[tail]"]]
    assert mask[:, t].nonzero().flatten().tolist() == [0] and mask[:, e].nonzero().flatten().tolist() == [59]
    assert mask[:, i].nonzero().flatten().tolist() == list(range(MIN_INTRON - 1, 59))
    with pytest.raises(ValueError):
        g.check([(0, 10, 0), (10, 40, g.index["+initial(0)"]), (40, 140, g.index["+intron(0)"]),
                 (140, 170, g.index["+terminal(0)"]), (170, 180, 0)], 180, 120)


def test_tail_length_model_normalises():
    lengths = [48, 55, 60, 66, 70, 90, 200, 800, 1500, 12000, 60000]
    d = LengthDistribution.fit(lengths, "empirical", 0.1, 1e-3)
    E = 500
    lp = d.log_pmf(E - 1)
    log_mass, r = d.tail(E)
    assert math.exp(log_mass) == pytest.approx(4 / 11)
    assert 1 / r == pytest.approx(np.mean([x - E + 1 for x in lengths if x >= E]))
    # sum over n < E of P(n) plus the geometric tail's mass sums to 1
    assert np.exp(lp).sum() + math.exp(log_mass) == pytest.approx(1.0)


@pytest.fixture(scope="module")
def tail_models():
    loci = training_loci(16, seed=2)
    # a few long introns so that the tail has data
    rng = np.random.default_rng(3)
    loci += [make_locus(rng, f"long{i}", [40, 62, 33], [n, 50], "+-"[i % 2], left=200, right=200)
             for i, n in enumerate((300, 420, 650))]
    return {K: GHMM.fit(loci, GHMMConfig(order=2, max_duration=K, intron_tail=60)) for K in (60, 150)}


def test_a_long_intron_scores_its_tail_model_length_whatever_k(tail_models):
    """The engine's score of a gold parse, length_intron only: the sum over introns of log P(n) of
    the tail model (no per-piece cost), the same at K = 60 and K = 150."""
    rng = np.random.default_rng(7)
    rec = make_locus(rng, "x", [40, 62, 33], [560, 45], "+", left=120, right=120)
    intron_lens = [560, 45]
    scores = {}
    for K, model in tail_models.items():
        d = model.intron_length
        lp_short = d.log_pmf(59)
        log_mass, r = d.tail(60)
        expected = sum(lp_short[n - 1] if n < 60 else log_mass + math.log(r) + (n - 60) * math.log1p(-r)
                       for n in intron_lens)
        segs = model.grammar.encode(rec.genes, len(rec), K)
        feats = model.features(rec)
        only = {n: float(n == "length_intron") for n in COMPONENTS}
        # with the constraints (0 on the gold parse) and first_segment, the first segment's phantom
        # transition term cancels: the score is the length_intron component's alone
        got = engine_gold_score(assemble(feats, only, center=False), segs)
        assert got == pytest.approx(expected, abs=1e-8)
        scores[K] = got
    # K = 60 cuts the 560-base intron into 500 tail pieces and its end piece, as K = 150 does: the
    # same score (the model's other parts, exon lengths included, do depend on K)
    assert scores[60] == pytest.approx(scores[150], abs=1e-10)


def test_tail_pieces_copy_the_intron_moves(tail_models):
    model = tail_models[60]
    g, lt = model.grammar, model.log_transition
    for strand in "+-":
        for p in range(3):
            i, t, e = (g.index[f"{strand}intron({p}){x}"] for x in ("", "[tail]", "[end]"))
            assert lt[t, t] == 0 and lt[t, e] == 0
            into = np.flatnonzero(g.allowed_transitions()[:, i].numpy())
            into = into[into != i]
            assert len(into) and np.array_equal(lt[into, t], lt[into, i]) and np.array_equal(lt[into, e], lt[into, i])
            out = np.flatnonzero(g.allowed_transitions()[e].numpy())
            assert np.array_equal(lt[e, out], lt[i, out])
    assert model.log_initial[t] == model.log_initial[i]


@pytest.mark.parametrize("strand", ["+", "-"])
def test_tail_ghmm_decodes_a_gene_with_an_intron_longer_than_k(tail_models, strand):
    model = tail_models[60]
    rng = np.random.default_rng(11)
    rec = make_locus(rng, "new", [40, 62, 33], [380, 55], strand, left=200, right=200)
    segs, score = model.decode_segments(rec)
    inp = assemble(model.features(rec))
    assert score == pytest.approx(engine_gold_score(inp, segs), abs=1e-6)
    genes = model.grammar.decode(segs)
    assert len(genes) == 1
    assert genes[0].strand == strand and genes[0].exons == rec.genes[0].exons and not genes[0].partial


def test_config_checks_the_tail():
    with pytest.raises(ValueError):
        GHMM.fit(training_loci(2), GHMMConfig(order=1, max_duration=60, intron_tail=61))
    with pytest.raises(ValueError):
        GHMM.fit(training_loci(2), GHMMConfig(order=1, max_duration=60, intron_tail=60), grammar=GeneGrammar())
    assert GHMMConfig().intron_tail == 0 and GHMM.fit(training_loci(2), GHMMConfig(order=1, max_duration=60)).grammar.num_labels == 47
    assert torch.is_tensor(GeneGrammar(intron_tail=60).allowed_transitions())


def test_a_sequence_cut_inside_a_long_intron_ends_with_its_end_piece(tail_models):
    """A tail piece scores only log(1 - r) per base: a sequence may not end in one (it would leave
    out the end piece's log P(n >= E) + log r), so an intron cut by the sequence's end is an end
    piece or an intron label there, as any segment at the edge."""
    model = tail_models[60]
    g = model.grammar
    rng = np.random.default_rng(5)
    full = make_locus(rng, "cut", [40, 62, 33], [400, 55], "+", left=150, right=150)
    cut_at = full.genes[0].exons[0].end + 300
    rec = GenomicRecord("cut", full.sequence[:cut_at], [])
    inp = assemble(model.features(rec))
    tails = [c for c, lab in enumerate(g.labels) if lab.piece == "tail"]
    assert torch.isinf(inp.proj_end[0, -1, tails]).all() and torch.isfinite(inp.proj_end[0, :-1, tails]).all()
    segs, score = model.decode_segments(rec)
    assert g.labels[segs[-1][2]].piece != "tail" and math.isfinite(score)
    # the gold parse up to the first exon, then the intron: ending in tail pieces scores -inf,
    # ending with the end piece does not
    ex = full.genes[0].exons[0]
    head = [s for s in g.encode(full.genes, len(full), 60) if s[1] <= ex.end]
    p = g.labels[head[-1][2]].exit
    bad = head + [(t, t + 1, g.index[f"+intron({p})[tail]"]) for t in range(ex.end, cut_at)]
    good = bad[:-60] + [(cut_at - 60, cut_at, g.index[f"+intron({p})[end]"])]
    assert engine_gold_score(inp, bad) == -math.inf and math.isfinite(engine_gold_score(inp, good))


def test_feature_crf_with_intron_tails(tail_models):
    """The feature CRF takes a GHMM with intron tails: its gold parse (one-base tail pieces) is one
    labelling, its NLL is finite and positive, and pack refuses the default grammar's 47 labels."""
    from torch_semimarkov.genomics.feature_crf import FeatureCRF, pack

    model = tail_models[60]
    rng = np.random.default_rng(2)
    recs = [make_locus(rng, f"c{i}", [40, 62, 33], [n, 50], "+-"[i % 2], left=100, right=100)
            for i, n in enumerate((250, 48))]
    feats = [model.features(r) for r in recs]
    with pytest.raises(ValueError):
        pack(feats, [r.genes for r in recs])
    batch = pack(feats, [r.genes for r in recs], dtype=torch.float64, grammar=model.grammar)
    crf = FeatureCRF(model)
    nll = crf.nll(batch, dtype=torch.float64)
    assert torch.isfinite(nll).all() and (nll > 0).all()
