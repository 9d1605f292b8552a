"""FeatureCRF.decode_mea: maximum expected boundary accuracy decoding of the gene finder."""

import numpy as np
import pytest
import torch

from torch_semimarkov.api.marginals import semi_crf_streaming_marginals
from torch_semimarkov.genomics.feature_crf import FeatureCRF, pack
from torch_semimarkov.genomics.ghmm import GHMM, GHMMConfig
from torch_semimarkov.genomics.records import Exon, Gene, GenomicRecord


@pytest.fixture(scope="module")
def toy():
    rng = np.random.default_rng(0)

    def locus(i):
        s = list(rng.choice(list("ACGT"), 400))
        s[100:103], s[160:162], s[238:240], s[300:303] = "ATG", "GT", "AG", "TAA"
        return GenomicRecord(f"r{i}", "".join(s), [Gene("g", "+", (Exon(100, 160), Exon(240, 300)))])

    records = [locus(i) for i in range(6)]
    ghmm = GHMM.fit(records, GHMMConfig(order=2, max_duration=120))
    crf = FeatureCRF(ghmm)
    batch = pack([ghmm.features(r) for r in records], dtype=torch.float64)
    cum, tr, db, ps, pe = crf.engine_inputs(batch, torch.float64)
    m = semi_crf_streaming_marginals(cum, tr, db, batch.lengths, crf.K, proj_start=ps, proj_end=pe, validate=False)
    return crf, batch, m


def _gain(crf, m, b, segs, kappa):
    coding = [lab.coding for lab in crf.grammar.labels]
    return sum(0.5 * (float(m.start[b, s, c]) + float(m.end[b, e - 1, c])) - kappa
               for s, e, c in segs if coding[c])


def _allowed(crf, segs, T):
    assert segs[0][0] == 0 and segs[-1][1] == T
    assert all(a[1] == b[0] for a, b in zip(segs, segs[1:]))
    assert all(bool(crf.duration_allowed[e - s - 1, c]) for s, e, c in segs)
    assert all(bool(crf.transition_allowed[a[2], b[2]]) for a, b in zip(segs, segs[1:]))


def test_mea_parse_is_allowed_and_beats_viterbi_on_the_gain(toy):
    """The MEA parse is one the model allows, and no allowed parse (Viterbi's included) has a
    larger expected-accuracy gain."""
    crf, batch, m = toy
    kappas = (-1.0, 0.0, 0.25, 0.5, 0.75, 1.5)
    mea = crf.decode_mea(batch, kappas, dtype=torch.float64)
    viterbi = crf.decode(batch, torch.float64)
    for kappa in kappas:
        for b, (segs, vit) in enumerate(zip(mea[kappa], viterbi)):
            _allowed(crf, segs, int(batch.lengths[b]))
            assert _gain(crf, m, b, segs, kappa) >= _gain(crf, m, b, vit, kappa) - 1e-9


def test_mea_threshold_trades_exons_for_certainty(toy):
    """The number of coding segments never grows with the threshold; above 1 (no segment's
    boundary posteriors can average more) none is predicted; at 0.5 the planted last exon, whose
    boundaries the toy model is sure of in most loci, is found there."""
    crf, batch, m = toy
    kappas = (-1.0, 0.0, 0.5, 0.9, 1.5)
    mea = crf.decode_mea(batch, kappas, dtype=torch.float64)
    coding = [lab.coding for lab in crf.grammar.labels]
    counts = [sum(coding[c] for segs in mea[k] for _, _, c in segs) for k in kappas]
    assert counts == sorted(counts, reverse=True) and counts[-1] == 0 and counts[0] > 0
    exons = [[(s, e) for s, e, c in segs if coding[c]] for segs in mea[0.5]]
    sure = [float(m.start[b, 240].max()) > 0.9 and float(m.end[b, 299].max()) > 0.9 for b in range(batch.batch)]
    assert sum(sure) >= 3 and all((240, 300) in ex for ex, ok in zip(exons, sure) if ok)


def test_mea_decode_names_what_it_cannot_take(toy):
    from torch_semimarkov.genomics.feature_crf import mea_decode

    crf, batch, _ = toy
    cum, tr, db, ps, pe = crf.engine_inputs(batch, torch.float64)
    with pytest.raises(ValueError, match="coding has 2 entries"):
        mea_decode(cum, tr, db, batch.lengths, crf.K, [True, False], [0.5])
    with pytest.raises(ValueError, match=r"\(C, C\) transition"):
        mea_decode(cum, tr.expand(crf.K, -1, -1), db, batch.lengths, crf.K, [True] * crf.C, [0.5])
