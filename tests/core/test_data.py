"""Synthetic genomics data, collate, and segmentation metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torch_semimarkov.data import (
    EXON,
    INTERGENIC,
    INTRON,
    GenomicsConfig,
    SyntheticGenomicsDataset,
    collate_segments,
    sample_sequence,
)
from torch_semimarkov.metrics import SegmentationMetrics, boundary_counts, f1_from_counts, segment_counts
from torch_semimarkov.core.segments import labels_to_segments


def test_deterministic_and_prefix_stable():
    a = SyntheticGenomicsDataset(5, 60, 90, seed=3)
    b = SyntheticGenomicsDataset(8, 60, 90, seed=3)
    c = SyntheticGenomicsDataset(5, 60, 90, seed=4)
    for i in range(5):
        assert torch.equal(a[i]["features"], b[i]["features"]) and torch.equal(a[i]["labels"], b[i]["labels"])
    assert not torch.equal(a[0]["labels"], c[0]["labels"]) or not torch.equal(a[0]["features"], c[0]["features"])
    assert 60 <= a[0]["length"] <= 90 and a[0]["features"].shape == (a[0]["length"], 6)


def test_gene_structure_and_durations():
    cfg = GenomicsConfig()
    rng = np.random.default_rng(0)
    durs = {0: [], 1: [], 2: []}
    for _ in range(30):
        _, labels = sample_sequence(rng, 600, cfg)
        segs = labels_to_segments(torch.from_numpy(labels))[0]
        for a, b in zip(segs, segs[1:]):
            assert (a.label, b.label) in {(INTERGENIC, EXON), (EXON, INTRON), (EXON, INTERGENIC), (INTRON, EXON)}
        # inner segments (not cut by the sequence ends) respect the duration range
        for s in segs[1:-1]:
            assert cfg.min_duration <= s.duration <= cfg.max_duration
            durs[s.label].append(s.duration)
    means = {c: float(np.mean(v)) for c, v in durs.items()}
    assert means[EXON] < means[INTRON] < means[INTERGENIC]
    # exons are peaked: small spread relative to their mean
    assert np.std(durs[EXON]) / means[EXON] < 0.5


def test_features_carry_signal():
    rng = np.random.default_rng(1)
    feats, labels = sample_sequence(rng, 5000)
    assert feats.dtype == np.float32
    assert feats[labels == EXON, 0].mean() > feats[labels == INTRON, 0].mean() + 0.4


def test_collate_pads_with_ignore_index_and_fixed_length():
    ds = SyntheticGenomicsDataset(3, 20, 40, seed=0)
    items = [ds[i] for i in range(3)]
    batch = collate_segments(items)
    T = max(it["length"] for it in items)
    assert batch["features"].shape == (3, T, 6) and batch["labels"].shape == (3, T)
    for b, it in enumerate(items):
        L = it["length"]
        assert int(batch["lengths"][b]) == L
        assert bool((batch["labels"][b, L:] == -100).all()) and bool((batch["features"][b, L:] == 0).all())
        assert torch.equal(batch["labels"][b, :L], it["labels"])
    fixed = collate_segments(items, fixed_length=30)
    assert fixed["features"].shape == (3, 30, 6) and fixed["lengths"].tolist() == [30, 30, 30]
    assert bool((fixed["labels"] >= 0).all())
    with pytest.raises(ValueError):
        collate_segments([])


def test_dataset_errors():
    with pytest.raises(ValueError):
        SyntheticGenomicsDataset(0)
    with pytest.raises(ValueError):
        SyntheticGenomicsDataset(2, 10, 5)
    with pytest.raises(IndexError):
        SyntheticGenomicsDataset(2)[2]
    with pytest.raises(ValueError):
        GenomicsConfig(num_features=3)


def test_metrics():
    assert f1_from_counts(0, 0, 0) == (1.0, 1.0, 1.0)
    assert segment_counts([[(0, 2, 0), (2, 5, 1)]], [[(0, 2, 0), (2, 4, 1), (4, 5, 0)]]) == (1, 2, 3)
    # boundaries 2 vs 3 (tolerance 1 matches), 7 vs nothing
    pred = [[(0, 2, 0), (2, 7, 1), (7, 9, 0)]]
    true = [[(0, 3, 0), (3, 9, 1)]]
    assert boundary_counts(pred, true, 0) == (0, 2, 1)
    assert boundary_counts(pred, true, 1) == (1, 2, 1)
    m = SegmentationMetrics(tolerances=(0, 1))
    true_l = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1, -100]])
    pred_l = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 0, 0, 2]])
    m.update(pred_l, true_l, torch.tensor([9]))
    r = m.compute()
    assert r["position_accuracy"] == pytest.approx(6 / 9)
    assert r["boundary_f1@0"] == 0.0 and r["boundary_f1@1"] == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert r["segment_f1"] == 0.0
    m2 = SegmentationMetrics(ignore_labels=[0])
    m2.update(true_l, true_l, torch.tensor([9]))
    assert m2.compute()["segment_f1"] == 1.0
