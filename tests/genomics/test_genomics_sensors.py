"""Generative gene-finding sensors (genomics.sensors) and the GHMM built from them (genomics.ghmm).

Synthetic sequences only (no downloaded data): the chains normalise, a signal model prefers its
consensus, the engine's score of a gold segmentation equals a per-segment sum computed directly
from the sensors, assembling is linear in the component weights, and a GHMM fitted on a few
synthetic genes decodes a new one exactly, on both strands.
"""

import math

import numpy as np
import pytest
import torch

from torch_semimarkov.genomics.ghmm import COMPONENTS, GHMM, GHMMConfig, assemble
from torch_semimarkov.genomics.records import Exon, Gene, GenomicRecord, encode_dna
from torch_semimarkov.genomics.sensors import (
    LengthDistribution,
    MarkovChain,
    WeightArrayModel,
    readings,
    reverse_complement,
)
from torch_semimarkov.core.gold import gold_score

pytest.importorskip("numba")

STOPS = ("TAA", "TAG", "TGA")
COMP = {"A": "T", "C": "G", "G": "C", "T": "A"}
#: a strong codon usage (no stop codon): coding sequence is easy to tell from the rest
CODONS = ("GCC", "AAG", "GAG", "CTG", "ATC", "GAC", "TTC", "AGC", "CGC", "GGC")


def rc(s: str) -> str:
    return "".join(COMP[b] for b in reversed(s))


def random_dna(rng, n: int, probs=(0.25, 0.25, 0.25, 0.25)) -> str:
    return "".join(rng.choice(list("ACGT"), n, p=probs))


def no_stop(rng, n: int) -> str:
    """n random bases, with no stop codon in any of the 3 frames (reused on both strands)."""
    while True:
        s = random_dna(rng, n)
        if not any(s[i:i + 3] in STOPS or rc(s[i:i + 3]) in STOPS for i in range(n - 2)):
            return s


def make_locus(rng, name: str, exon_lens, intron_lens, strand: str = "+", left: int = 150, right: int = 150,
               cds: str = None) -> GenomicRecord:
    """A locus with one gene: random intergenic flanks (no stop-free tricks), a CDS of codons from
    ``CODONS`` starting with ATG (after a Kozak-like CAAA), introns GTAAGT ... TTTCAG in AT-rich
    sequence, a TAA stop codon after the CDS. Built on the + strand and reverse complemented for '-'."""
    total = sum(exon_lens)
    assert total % 3 == 0
    if cds is None:
        cds = "ATG" + "".join(rng.choice(CODONS, total // 3 - 1))
    parts, exons, pos = [random_dna(rng, left - 4) + "CAAA"], [], left
    c = 0
    for i, n in enumerate(exon_lens):
        parts.append(cds[c:c + n])
        exons.append((pos, pos + n))
        c += n
        pos += n
        if i < len(intron_lens):
            m = intron_lens[i]
            parts.append("GTAAGT" + random_dna(rng, m - 12, (0.35, 0.15, 0.15, 0.35)) + "TTTCAG")
            pos += m
    parts.append("TAA" + random_dna(rng, right - 3))
    seq = "".join(parts)
    if strand == "-":
        L = len(seq)
        seq = rc(seq)
        exons = [(L - e, L - s) for s, e in exons]
    return GenomicRecord(name, seq, [Gene("g", strand, tuple(Exon(s, e) for s, e in sorted(exons)))])


def training_loci(n: int = 12, seed: int = 1):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(1, 4))
        lens = [int(x) for x in rng.integers(15, 70, size=k)]
        lens[-1] += (-sum(lens)) % 3
        introns = [int(x) for x in rng.integers(40, 110, size=k - 1)]
        out.append(make_locus(rng, f"t{i}", lens, introns, "+-"[i % 2]))
    return out


# --------------------------------------------------------------------------- sensors


def test_reverse_complement_and_readings():
    assert reverse_complement(encode_dna("ACGTN")).tolist() == encode_dna("NACGT").tolist()
    rec = make_locus(np.random.default_rng(0), "r", [30, 33], [50], strand="-")
    plus, minus = readings(rec)
    assert (plus.codon_pos < 0).all() and not plus.intron.any()
    L = len(rec)
    # the - strand reading starts the CDS with ATG at codon position 0, 1, 2
    (a, b), _ = minus.genes[0]
    assert "".join("ACGT"[x] for x in minus.codes[a:a + 3]) == "ATG"
    assert minus.codon_pos[a:a + 6].tolist() == [0, 1, 2, 0, 1, 2]
    assert minus.intron.sum() == 50 and minus.codon_pos[minus.intron].max() == -1
    assert (minus.codes == reverse_complement(encode_dna(rec.sequence))).all() and len(minus.codes) == L


@pytest.mark.parametrize("order,period", [(0, 1), (2, 1), (3, 3)])
def test_markov_chain_probabilities_normalise(order, period):
    rng = np.random.default_rng(order)
    codes = encode_dna(random_dna(rng, 3000, (0.4, 0.1, 0.2, 0.3)))
    classes = np.arange(len(codes)) % period
    chain = MarkovChain(order, smoothing=3.0, period=period).fit([(codes, classes)])
    for k, table in enumerate(chain.tables):
        assert table.shape == (period, 4 ** k, 4)
        assert np.allclose(np.exp(table).sum(-1), 1.0, atol=1e-12)
    lp = chain.log_probs(codes)
    assert lp.shape == (len(codes), period)
    # a long sequence's log-likelihood under its own chain beats the uniform model's
    assert lp[np.arange(len(codes)), classes].sum() > len(codes) * math.log(0.25) + 50


def test_markov_chain_backs_off_at_unknown_bases():
    rng = np.random.default_rng(0)
    codes = encode_dna("AC" * 500 + random_dna(rng, 200))
    chain = MarkovChain(2, smoothing=1.0).fit([(codes, None)])
    lp = chain.log_probs(encode_dna("ACACNCAC"))[:, 0]
    assert lp[4] == pytest.approx(math.log(0.25))  # the unknown base itself
    # after N the context restarts: C at position 5 has no context (order 0), A at 6 has order 1
    assert lp[5] == pytest.approx(chain.tables[0][0, 0, 1])
    assert lp[6] == pytest.approx(chain.tables[1][0, 1, 0])
    assert lp[7] == pytest.approx(chain.tables[2][0, 1 * 4 + 0, 1])  # context "CA": the older C is the high digit
    assert lp[7] > math.log(0.9)  # after ...CA comes C


def test_weight_array_model_prefers_its_consensus():
    rng = np.random.default_rng(0)
    # donor-like sites: 3 exon bases, GTAAGT, random after; anchor = the G of GT (offset 3)
    wins = [random_dna(rng, 3) + "GTAAGT" + random_dna(rng, 3) for _ in range(300)]
    wam = WeightArrayModel(-3, 9, 0, ("GT", "GC")).fit(np.stack([encode_dna(w) for w in wins]))
    seq = "CCCCCCCCCCAAAGTAAGTCCC" + "CCCAGTCCAGTCAGCCCCCC"
    bg = np.full(len(seq), math.log(0.25))
    lp = wam.window_log_probs(encode_dna(seq), bg)
    ok = wam.consensus(encode_dna(seq))
    assert ok.nonzero()[0].tolist() == [13, 17, 26, 31, 35]  # every GT and GC
    assert lp[13] > max(lp[17], lp[26], lp[31], lp[35]) + 5 and lp[13] > 0  # the full consensus AAA|GTAAGT wins
    assert np.allclose(np.exp(wam.cond[1:]).sum(-1), 1.0) and np.isclose(np.exp(wam.first).sum(), 1.0)


def test_length_distributions():
    d = LengthDistribution.fit([60, 61, 62, 64, 70, 200, 5000], "empirical", bandwidth=0.05)
    lp = d.log_pmf(1000)
    assert np.isclose(np.exp(lp).sum(), 6 / 7)  # the 5000 is beyond K
    assert 58 <= int(np.argmax(lp)) + 1 <= 66 and np.isfinite(lp).all()
    g = LengthDistribution.fit([5, 15], "geometric")
    lp = g.log_pmf(2000)
    assert np.isclose(np.exp(lp).sum(), 1.0) and np.isclose((np.exp(lp) * np.arange(1, 2001)).sum(), 10.0)


# --------------------------------------------------------------------------- GHMM features


def naive_score(model: GHMM, rec: GenomicRecord, segs) -> float:
    """The gold segmentation's score, summed segment by segment straight from the sensors: content
    by codon position from the annotation, signals at the true sites, stops in each exon's frame,
    lengths, transitions, first and last label."""
    g, K, cfg = model.grammar, model.K, model.config
    codes = encode_dna(rec.sequence)
    L = len(codes)
    content = model.content.scores(codes)
    sig = model.signals.scores(codes, content["background"])
    plus, minus = readings(rec)
    cp = {"+": plus.codon_pos, "-": minus.codon_pos[::-1]}
    total = 0.0
    for s, e, c in segs:
        lab = g.labels[c]
        k = e - s
        if lab.kind == "intergenic":
            total += content["intergenic"][s:e].sum()
            q = 1.0 / model.intergenic_length.mean
            total += k * math.log1p(-q) + math.log(q) - math.log1p(-q)
        elif lab.kind == "intron":
            total += content["intron" + lab.strand][s:e].sum()
            total += model.intron_length.log_pmf(K)[k - 1]
        else:
            t = np.arange(s, e)
            assert (cp[lab.strand][t] >= 0).all()
            total += content["coding" + lab.strand][t, cp[lab.strand][t]].sum()
            if lab.kind == "exon":
                lp = model.exon_lengths[lab.exon_type].log_pmf(K)
                r = (lab.exit - lab.entry) % 3
                allowed = (np.arange(1, K + 1) % 3 == r) & (np.arange(1, K + 1) >= 3)
                total += lp[k - 1] - np.logaddexp.reduce(lp[allowed])
    for (s0, e0, a), (s1, e1, b) in zip(segs, segs[1:]):
        la = g.labels[a]
        if a == b and la.kind == "intron":
            total += model.intron_split_score
        elif a == b and la.kind == "intergenic":
            q = 1.0 / model.intergenic_length.mean
            total -= math.log(q) - math.log1p(-q)
        else:
            total += model.log_transition[a, b]
    total += model.log_initial[segs[0][2]] + model.log_final[segs[-1][2]]
    for gene in rec.genes:
        ex = gene.exons
        st = gene.strand
        if st == "+":
            sites = [("start", ex[0].start), ("stop", ex[-1].end)]
            sites += [("donor", a.end) for a in ex[:-1]] + [("acceptor", b.start) for b in ex[1:]]
        else:
            sites = [("start", ex[-1].end - 1), ("stop", ex[0].start - 1)]
            sites += [("donor", b.start - 1) for b in ex[1:]] + [("acceptor", a.end - 1) for a in ex[:-1]]
        for name, anchor in sites:
            assert sig[f"{name}{st}_ok"][anchor]
            total += sig[f"{name}{st}"][anchor]
        # stop codons wholly inside an exon, in its reading frame
        for x in ex:
            for t in range(x.start, x.end):
                if st == "+" and cp["+"][t] == 0 and t + 2 < x.end and rec.sequence[t:t + 3] in STOPS:
                    total -= cfg.stop_penalty
                if st == "-" and cp["-"][t] == 0 and t - 2 >= x.start and rc(rec.sequence[t - 2:t + 1]) in STOPS:
                    total -= cfg.stop_penalty
    return float(total)


def engine_gold_score(inp, segs) -> float:
    T = inp.proj_start.shape[1]
    labels = torch.zeros(1, T, dtype=torch.long)
    starts = torch.zeros(1, T, dtype=torch.bool)
    for s, e, c in segs:
        labels[0, s:e] = c
        starts[0, s] = True
    return float(gold_score(inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, labels, starts,
                            inp.proj_start, inp.proj_end)[0])


@pytest.fixture(scope="module")
def small_model():
    return GHMM.fit(training_loci(), GHMMConfig(order=2, max_duration=60))


def _tricky_locus():
    """Both strands, every kind of segment: a + gene with a 150-base exon (continuation pieces at
    K = 60), a 200-base intron (split), exit phases 2, 2, 0, an in-frame stop codon, a stop codon
    that runs past an exon's 3' end (not a codon of the exon), and acceptor consensus AG where
    continuation pieces meet (so that their take-back of the 5' check is not zero); then a - gene
    with a 100-base exon (a continuation piece on its right, the 5' side), the same AG and the
    same stop codon past an exon's 3' end (its left end)."""
    rng = np.random.default_rng(5)
    cds = "ATG" + "".join(rng.choice(CODONS, 99))
    # exon lengths 32, 150, 43, 75: the first exon ends with codon positions 0, 1 at its last two
    # bases; TA there and the intron's GT make a TAG that runs past the exon (no in-frame stop).
    # The long exon (cds 32..181) is cut at cds 92 and 152: AG before each; a TGA in frame at 120
    cds = cds[:30] + "TA" + cds[32:90] + "AG" + cds[92:120] + "TGA" + cds[123:150] + "AG" + cds[152:]
    plus = make_locus(rng, "p", [32, 150, 43, 75], [200, 61, 45], "+", left=130, right=80, cds=cds)
    cds = "ATG" + "".join(rng.choice(CODONS, 50))
    # the - gene's first exon (cds 0..19) ends with TA + the intron's GT, a stop past its 3' end;
    # its 100-base exon (cds 20..119) is cut at cds 80
    cds = cds[:18] + "TA" + cds[20:78] + "AG" + cds[80:]
    minus = make_locus(rng, "m", [20, 100, 33], [50, 90], "-", left=70, right=140, cds=cds)
    shift = len(plus.sequence)
    mg = minus.genes[0]
    genes = [plus.genes[0], Gene("h", "-", tuple(Exon(x.start + shift, x.end + shift) for x in mg.exons))]
    return GenomicRecord("tricky", plus.sequence + minus.sequence, genes)


def test_gold_score_equals_direct_segment_sum(small_model):
    model = small_model
    rec = _tricky_locus()
    segs = model.grammar.encode(rec.genes, len(rec), model.K)
    names = [model.grammar.names[c] for _, _, c in segs]
    assert "+cont[intron 2]" in names and names.count("+intron(2)") >= 4 and names.count("N") >= 3
    assert {"-initial(2)", "-internal(2,0)", "-terminal(0)", "-cont[intron 2]"} <= set(names)
    feats = model.features(rec)
    naive = naive_score(model, rec, segs)
    raw = engine_gold_score(assemble(feats, center=False), segs)
    assert math.isfinite(naive) and raw == pytest.approx(naive, rel=1e-10, abs=1e-7)
    # centring shifts every segmentation by the same amount
    centred = engine_gold_score(assemble(feats), segs)
    other = [(0, len(rec), 0)] if len(rec) <= model.K else model.grammar.encode([], len(rec), model.K)
    shift_gold = centred - raw
    shift_other = engine_gold_score(assemble(feats), other) - engine_gold_score(assemble(feats, center=False), other)
    assert shift_gold == pytest.approx(shift_other, abs=1e-7)
    # the components sum to the weighted total: dropping one removes exactly its part of the score
    no_stop = engine_gold_score(assemble(feats, {"inframe_stop": 0.0}, center=False), segs)
    assert raw - no_stop == pytest.approx(-model.config.stop_penalty, abs=1e-7)


def test_viterbi_score_is_the_engine_score_of_its_segmentation(small_model):
    rec = _tricky_locus()
    segs, score = small_model.decode_segments(rec)
    inp = assemble(small_model.features(rec))
    assert score == pytest.approx(engine_gold_score(inp, segs), abs=1e-6)
    gold = small_model.grammar.encode(rec.genes, len(rec), small_model.K)
    assert score >= engine_gold_score(inp, gold) - 1e-6


def test_assembly_is_linear_in_the_weights(small_model):
    feats = small_model.features(training_loci(1, seed=9)[0])
    rng = np.random.default_rng(0)
    w1 = {n: float(rng.normal()) for n in COMPONENTS}
    w2 = {n: float(rng.normal()) for n in COMPONENTS}
    a, b = 0.7, -1.3
    mix = {n: a * w1[n] + b * w2[n] for n in COMPONENTS}
    kw = dict(constraints=False, first_segment=False)
    A1, A2, Am = assemble(feats, w1, **kw), assemble(feats, w2, **kw), assemble(feats, mix, **kw)
    for i in range(5):
        assert torch.allclose(Am[i], a * A1[i] + b * A2[i], atol=1e-8), Am._fields[i]
    # every component contributes something, and the constraints only add -inf or finite penalties
    for n in COMPONENTS:
        only = assemble(feats, {m: float(m == n) for m in COMPONENTS}, **kw)
        assert any(float(t.abs().max()) > 0 for t in only[:5]), n
    full = assemble(feats)
    assert torch.isfinite(full.cum_scores).all()
    assert torch.isinf(full.transition).any() and torch.isinf(full.duration_bias).any()
    with pytest.raises(KeyError):
        assemble(feats, {"no_such_component": 1.0})


@pytest.mark.parametrize("strand", ["+", "-"])
def test_ghmm_decodes_a_toy_gene(strand):
    model = GHMM.fit(training_loci(16, seed=2), GHMMConfig(order=3, max_duration=120))
    rng = np.random.default_rng(11)
    rec = make_locus(rng, "new", [40, 62, 33], [70, 55], strand, left=200, right=200)
    genes = model.predict_genes(rec)
    assert len(genes) == 1
    assert genes[0].strand == strand and genes[0].exons == rec.genes[0].exons and not genes[0].partial
