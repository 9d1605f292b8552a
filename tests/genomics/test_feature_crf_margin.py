"""Softmax-margin training of the feature CRF (genomics.feature_crf): the exon-boundary cost."""

import pytest
import torch

from torch_semimarkov.api.topk import semi_crf_streaming_topk
from torch_semimarkov.core.gold import gold_score, segments_to_starts
from torch_semimarkov.genomics.feature_crf import FeatureCRF, pack
from torch_semimarkov.genomics.ghmm import GHMM, GHMMConfig

from test_genomics_sensors import training_loci


def _boundaries(segs, coding):
    """The coding runs' (left, start) and (right, last base) boundaries of a segmentation."""
    out, run = set(), None
    for s, e, c in list(segs) + [(None, None, None)]:
        if c is not None and coding[c] and run is not None and run[1] == s:
            run = (run[0], e)
            continue
        if run is not None:
            out |= {("L", run[0]), ("R", run[1] - 1)}
            run = None
        if c is not None and coding[c]:
            run = (s, e)
    return out


def test_boundary_cost_adds_margin_per_wrong_exon_boundary():
    """Added to the engine inputs, the cost raises each of the 15 best segmentations' scores (and the gold's) by
    margin * (FP - TP) over its exon boundaries against the gold's (long exons cut into an exon label
    and continuation pieces included), the constant makes the gold's cost 0, and the softmax-margin
    loss bounds the NLL from above, equal at margin 0."""
    loci = training_loci(10, seed=4)
    recs = training_loci(2, seed=9)
    ghmm = GHMM.fit(loci, GHMMConfig(order=3, max_duration=60))
    crf = FeatureCRF(ghmm)
    batch = pack([ghmm.features(r) for r in recs], [r.genes for r in recs], dtype=torch.float64, grammar=ghmm.grammar)
    labels = ghmm.grammar.labels
    coding = [lab.coding for lab in labels]
    assert any(labels[c].kind == "cont" for segs in batch.segments for _, _, c in segs)  # long exons cut
    margin = 0.7
    cum, tr, db, ps, pe = (x.detach() for x in crf.engine_inputs(batch, torch.float64))
    cost_s, cost_e, constant = crf.boundary_cost(batch, margin, torch.float64)
    top = semi_crf_streaming_topk(cum, tr, db, batch.lengths, crf.K, k=15, proj_start=ps, proj_end=pe)
    checked = wrong = 0
    for b in range(batch.batch):
        gold = _boundaries(batch.segments[b], coding)
        assert float(constant[b]) == pytest.approx(margin * len(gold))
        # the gold with its intergenic runs in one-base pieces, as the feature CRF scores them
        one_base = [(t, t + 1, c) if labels[c].kind == "intergenic" else (s, e, c)
                    for s, e, c in batch.segments[b] for t in (range(s, e) if labels[c].kind == "intergenic" else [s])]
        parses = [one_base] + [top.segments_of(b, r) for r in range(15) if torch.isfinite(top.scores[b, r])]
        for segs in parses:
            segs = [(int(s), int(e), int(c)) for s, e, c in segs]
            lab, st = segments_to_starts([segs], batch.lengths[b:b + 1].cpu(), batch.T, crf.C, crf.K)
            args = (cum[b:b + 1], tr, db, batch.lengths[b:b + 1], lab, st)
            plain = gold_score(*args, proj_start=ps[b:b + 1], proj_end=pe[b:b + 1])
            raised = gold_score(*args, proj_start=ps[b:b + 1] + cost_s[b:b + 1], proj_end=pe[b:b + 1] + cost_e[b:b + 1])
            pred = _boundaries(segs, coding)
            fp, tp = len(pred - gold), len(pred & gold)
            assert torch.isfinite(plain).all()
            assert float(raised - plain) == pytest.approx(margin * (fp - tp), abs=1e-9)
            checked += 1
            wrong += fp > 0
    assert checked > 25 and wrong > 10
    nll0 = crf.nll(batch, torch.float64)
    assert torch.equal(crf.nll(batch, torch.float64, margin=0.0), nll0)
    loss = crf.nll(batch, torch.float64, margin=margin)
    assert bool((loss > nll0 + 1e-6).all())
    loss.sum().backward()
    assert torch.isfinite(crf.weights.grad).all() and crf.weights.grad.abs().max() > 0
    with pytest.raises(ValueError, match="margin"):
        crf.nll(batch, torch.float64, margin=-1.0)
