"""A synthetic, genomics-like segmentation data set that needs no download.

Sequences are sampled from an explicit-duration semi-Markov model with three labels that mimic a
gene annotation:

* ``intergenic`` (0): long, broadly distributed stretches between genes;
* ``exon`` (1): shorter, sharply peaked durations;
* ``intron`` (2): medium, broad durations, always between two exons.

Label moves follow gene structure: intergenic -> exon -> (intron -> exon)* -> intergenic. Durations
are negative-binomial with label-specific mean and shape, truncated to ``[min_duration, max_duration]``.
Each position carries ``num_features`` noisy features: a weak label-dependent mean (introns and
intergenic regions look nearly alike position by position), splice-site-like spikes at exon starts
and ends that fire only some of the time, and pure noise. A per-position classifier therefore
struggles, while a model of durations and label order can recover the segments.

Everything is deterministic given ``seed``: item ``i`` is sampled from its own generator seeded with
``(seed, i)``, so data sets of different sizes share their first items.

Example:
    >>> ds = SyntheticGenomicsDataset(4, min_length=50, max_length=80, seed=0)
    >>> item = ds[0]
    >>> item["features"].shape[1], item["labels"].dtype
    (6, torch.int64)
    >>> batch = collate_segments([ds[0], ds[1]])
    >>> batch["features"].shape[0], batch["lengths"].tolist() == [len(ds[0]["labels"]), len(ds[1]["labels"])]
    (2, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

__all__ = [
    "LABELS",
    "GenomicsConfig",
    "sample_sequence",
    "SyntheticGenomicsDataset",
    "collate_segments",
]

LABELS = ("intergenic", "exon", "intron")
INTERGENIC, EXON, INTRON = 0, 1, 2


@dataclass
class GenomicsConfig:
    """Parameters of the generator.

    Attributes:
        mean_duration: mean segment duration per label (intergenic, exon, intron).
        shape: negative-binomial shape per label (larger = more peaked; 1 = geometric).
        min_duration, max_duration: durations are clipped to this range (max_duration is the K a
            model needs to represent every true segment in one piece).
        exon_to_intron: probability that an exon is followed by an intron (else intergenic).
        label_means: (3, 2) mean of the two "composition" features per label.
        noise: standard deviation of the Gaussian noise on every feature.
        splice_strength: size of the spike at an exon's first / last position.
        splice_rate: probability that a splice spike is present at all.
        num_features: total features per position (>= 5; the rest is pure noise).
    """

    mean_duration: Tuple[float, float, float] = (30.0, 12.0, 20.0)
    shape: Tuple[float, float, float] = (2.0, 10.0, 3.0)
    min_duration: int = 2
    max_duration: int = 48
    exon_to_intron: float = 0.65
    label_means: Tuple[Tuple[float, float], ...] = ((0.0, 0.0), (0.9, 0.4), (0.15, 0.45))
    noise: float = 0.8
    splice_strength: float = 2.0
    splice_rate: float = 0.7
    num_features: int = 6

    def __post_init__(self):
        if self.num_features < 5:
            raise ValueError(f"num_features must be >= 5, got {self.num_features}")
        if not 1 <= self.min_duration <= self.max_duration:
            raise ValueError(f"need 1 <= min_duration <= max_duration, got {self.min_duration}, {self.max_duration}")


def _next_label(rng: np.random.Generator, label: int, cfg: GenomicsConfig) -> int:
    if label == INTERGENIC or label == INTRON:
        return EXON
    return INTRON if rng.random() < cfg.exon_to_intron else INTERGENIC


def _duration(rng: np.random.Generator, label: int, cfg: GenomicsConfig) -> int:
    r = cfg.shape[label]
    mean = cfg.mean_duration[label]
    # numpy's negative_binomial counts failures before r successes: mean r (1-p) / p
    p = r / (r + mean - cfg.min_duration)
    d = cfg.min_duration + int(rng.negative_binomial(r, p))
    return int(min(max(d, cfg.min_duration), cfg.max_duration))


def sample_sequence(rng: np.random.Generator, length: int, cfg: Optional[GenomicsConfig] = None) -> Tuple[np.ndarray, np.ndarray]:
    """One sequence of ``length`` positions.

    Returns:
        ``features`` (length, num_features) float32 and ``labels`` (length,) int64.
    """
    cfg = cfg or GenomicsConfig()
    labels = np.empty(length, dtype=np.int64)
    exon_start = np.zeros(length, dtype=bool)
    exon_end = np.zeros(length, dtype=bool)
    # start anywhere in the cycle, partway through the first segment
    label = int(rng.choice(3, p=[0.5, 0.2, 0.3]))
    t = 0
    first = True
    while t < length:
        d = _duration(rng, label, cfg)
        if first:
            d = int(rng.integers(1, d + 1))
            first = False
        e = min(t + d, length)
        labels[t:e] = label
        if label == EXON:
            exon_start[t] = True
            exon_end[e - 1] = True
        t = e
        label = _next_label(rng, label, cfg)

    D = cfg.num_features
    feats = rng.normal(0.0, cfg.noise, size=(length, D)).astype(np.float32)
    means = np.asarray(cfg.label_means, dtype=np.float32)
    feats[:, 0:2] += means[labels]
    fire_s = exon_start & (rng.random(length) < cfg.splice_rate)
    fire_e = exon_end & (rng.random(length) < cfg.splice_rate)
    feats[:, 2] += cfg.splice_strength * fire_s
    feats[:, 3] += cfg.splice_strength * fire_e
    # a slowly drifting nuisance signal (like local GC content) that carries no label information
    drift = np.cumsum(rng.normal(0.0, 0.1, size=length)).astype(np.float32)
    feats[:, 4] += drift - drift.mean()
    return feats, labels


class SyntheticGenomicsDataset(Dataset):
    """``num_sequences`` sequences with lengths uniform in ``[min_length, max_length]``.

    Each item is a dict with ``features`` (L, F) float32, ``labels`` (L,) int64 and ``length``.
    """

    def __init__(
        self,
        num_sequences: int,
        min_length: int = 200,
        max_length: int = 400,
        seed: int = 0,
        config: Optional[GenomicsConfig] = None,
    ):
        if num_sequences < 1:
            raise ValueError(f"num_sequences must be >= 1, got {num_sequences}")
        if not 1 <= min_length <= max_length:
            raise ValueError(f"need 1 <= min_length <= max_length, got {min_length}, {max_length}")
        self.num_sequences = int(num_sequences)
        self.min_length = int(min_length)
        self.max_length = int(max_length)
        self.seed = int(seed)
        self.config = config or GenomicsConfig()

    @property
    def num_classes(self) -> int:
        return len(LABELS)

    @property
    def num_features(self) -> int:
        return self.config.num_features

    @property
    def max_duration(self) -> int:
        return self.config.max_duration

    def __len__(self) -> int:
        return self.num_sequences

    def __getitem__(self, index: int) -> Dict[str, torch.Tensor]:
        if not 0 <= index < self.num_sequences:
            raise IndexError(f"index {index} out of range for {self.num_sequences} sequences")
        rng = np.random.default_rng((self.seed, int(index)))
        length = int(rng.integers(self.min_length, self.max_length + 1))
        feats, labels = sample_sequence(rng, length, self.config)
        return {
            "features": torch.from_numpy(feats),
            "labels": torch.from_numpy(labels),
            "length": length,
        }


def collate_segments(
    batch: Sequence[Dict[str, torch.Tensor]], ignore_index: int = -100, fixed_length: Optional[int] = None
) -> Dict[str, torch.Tensor]:
    """Pad a list of items to the longest one (or to ``fixed_length``).

    Args:
        batch: items with ``features`` (L, F) and ``labels`` (L,).
        ignore_index: label written past each sequence's length.
        fixed_length: if given, crop or pad every sequence to exactly this length (every length is
            then ``fixed_length``, the padding included: a debugging aid that removes ragged lengths;
            padded positions get label 0 and zero features).

    Returns:
        ``features`` (B, T, F) float32, ``labels`` (B, T) int64 and ``lengths`` (B,) int64.
    """
    if len(batch) == 0:
        raise ValueError("cannot collate an empty batch")
    lengths = [int(item["labels"].shape[0]) for item in batch]
    F = int(batch[0]["features"].shape[1])
    T = fixed_length if fixed_length is not None else max(lengths)
    feats = torch.zeros(len(batch), T, F, dtype=torch.float32)
    labels = torch.full((len(batch), T), ignore_index, dtype=torch.long)
    for b, item in enumerate(batch):
        L = min(lengths[b], T)
        feats[b, :L] = item["features"][:L]
        labels[b, :L] = item["labels"][:L]
        if fixed_length is not None:
            labels[b, L:] = 0
            lengths[b] = T
    return {"features": feats, "labels": labels, "lengths": torch.tensor(lengths, dtype=torch.long)}
