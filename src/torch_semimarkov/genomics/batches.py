"""Training windows and padded batches of gene loci.

Loci run up to 10^5 bases; the GPU kernels walk one sequence per program, so training cuts loci into
windows of about ``window`` bases and batches windows of similar length. A window may only begin or
end where no coding segment of the gold segmentation is cut (inside intergenic or intron sequence,
or between two segments), so every window's gold segmentation is still valid under the grammar:
a window that begins inside an intron starts with that intron label. Window boundaries move from
epoch to epoch (a random first cut). Prediction runs on whole loci.

Example:
    >>> from torch_semimarkov.genomics.records import Exon, Gene, GenomicRecord
    >>> rec = GenomicRecord("s", "ACGT" * 100, [Gene("g", "+", (Exon(40, 70), Exon(120, 150)))])
    >>> loci = prepare_loci([rec], max_duration=60)
    >>> wins = cut_windows(loci[0], window=200, rng=np.random.default_rng(0))
    >>> wins[0][0], wins[-1][1]
    (0, 400)
    >>> batch = collate(loci, [(0, a, b) for a, b in wins])
    >>> batch["codes"].shape[0] == len(wins), batch["labels"].shape == batch["codes"].shape
    (True, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from torch_semimarkov.genomics.labels import MIN_INTRON, CodonLabels, GeneGrammar
from torch_semimarkov.genomics.records import GenomicRecord, UNKNOWN, encode_dna

__all__ = ["Locus", "prepare_loci", "cut_windows", "collate", "window_batches", "locus_batches"]

_GRAMMAR = GeneGrammar()


@dataclass
class Locus:
    """One record ready for training: base codes, gold runs (grammar labels) and codon labels."""

    name: str
    codes: np.ndarray  # (L,) uint8
    runs: List[Tuple[int, int, int]]  # GeneGrammar.runs: final coding segments, whole N / intron runs
    codon_labels: np.ndarray  # (L,) int64, CodonLabels
    cuttable: np.ndarray  # (L + 1,) bool: a window may begin or end at this position
    max_duration: int

    def __len__(self) -> int:
        return len(self.codes)


def prepare_loci(records: Sequence[GenomicRecord], max_duration: int, grammar: Optional[GeneGrammar] = None) -> List[Locus]:
    """Encode records for training; the gold segmentations are checked against the grammar here.

    A window may be cut only inside an intergenic or intron run, at least ``MIN_INTRON`` bases from
    both of its ends, so that both pieces are valid segments and no window begins or ends at a
    splice site, start or stop codon whose signal would then be out of sight.
    """
    grammar = grammar or GeneGrammar()
    codon = CodonLabels()
    loci = []
    for rec in records:
        L = len(rec)
        runs = grammar.runs(rec.genes, L, max_duration)
        grammar.check(grammar.split_runs(runs, max_duration), L, max_duration)
        cuttable = np.zeros(L + 1, dtype=bool)
        cuttable[0] = cuttable[L] = True
        for s, e, c in runs:
            if not grammar.labels[c].coding and e - s >= 2 * MIN_INTRON:
                cuttable[s + MIN_INTRON:e - MIN_INTRON + 1] = True
        loci.append(Locus(rec.name, encode_dna(rec.sequence), runs, codon.encode(rec.genes, L), cuttable, int(max_duration)))
    return loci


def cut_windows(locus: Locus, window: int, rng: np.random.Generator, random_start: bool = True) -> List[Tuple[int, int]]:
    """Cut ``[0, L)`` into consecutive windows of at most about ``window`` bases at cuttable positions.

    Each cut is the last cuttable position within ``window`` of the previous one (but past half of
    it); where a long exon leaves none, the first one after. With ``random_start`` the first window
    is shorter by a random amount, so that the cuts move between epochs.
    """
    L = len(locus)
    ok = np.flatnonzero(locus.cuttable)
    out, a = [], 0
    target = int(rng.integers(window // 2, window + 1)) if random_start else window
    while L - a > target:
        lo, hi = a + max(1, target // 2), a + target
        i = np.searchsorted(ok, hi, side="right") - 1
        if i >= 0 and ok[i] >= lo:
            b = int(ok[i])
        else:
            j = np.searchsorted(ok, hi, side="right")
            b = int(ok[j]) if j < len(ok) else L
        out.append((a, b))
        a = b
        target = window
    if a < L:
        out.append((a, L))
    return out


def collate(loci: Sequence[Locus], windows: Sequence[Tuple[int, int, int]]) -> Dict:
    """A padded batch of windows ``(locus index, start, end)``.

    Returns ``codes`` (B, T) long (padding = unknown base), ``lengths`` (B,), ``segments`` (the gold
    segments of each window, in window coordinates) and ``labels`` (B, T) codon labels (-100 past
    each length).
    """
    B = len(windows)
    T = max(b - a for _, a, b in windows)
    codes = torch.full((B, T), UNKNOWN, dtype=torch.long)
    labels = torch.full((B, T), -100, dtype=torch.long)
    lengths = torch.zeros(B, dtype=torch.long)
    segments = []
    for row, (li, a, b) in enumerate(windows):
        loc = loci[li]
        codes[row, : b - a] = torch.from_numpy(loc.codes[a:b].astype(np.int64))
        labels[row, : b - a] = torch.from_numpy(loc.codon_labels[a:b])
        lengths[row] = b - a
        runs = [(max(s, a) - a, min(e, b) - a, c) for s, e, c in loc.runs if e > a and s < b]
        segments.append(_GRAMMAR.split_runs(runs, loc.max_duration))
    return {"codes": codes, "lengths": lengths, "segments": segments, "labels": labels}


def window_batches(loci: Sequence[Locus], window: int, batch_size: int, rng: np.random.Generator) -> Iterator[Dict]:
    """One epoch: fresh windows of every locus, grouped by length into batches, in random order."""
    wins = [(i, a, b) for i, loc in enumerate(loci) for a, b in cut_windows(loc, window, rng)]
    wins.sort(key=lambda w: w[2] - w[1])
    groups = [wins[i:i + batch_size] for i in range(0, len(wins), batch_size)]
    for g in rng.permutation(len(groups)):
        yield collate(loci, groups[g])


def locus_batches(records: Sequence[GenomicRecord], max_tokens: int = 1_000_000, max_batch: int = 64) -> Iterator[Tuple[List[int], Dict]]:
    """Whole records, sorted by length, in padded batches of at most ``max_tokens`` positions.

    Yields ``(record indices, {"codes", "lengths"})``.
    """
    order = sorted(range(len(records)), key=lambda i: len(records[i]))
    group: List[int] = []

    def emit(idx: List[int]):
        T = max(len(records[i]) for i in idx)
        codes = torch.full((len(idx), T), UNKNOWN, dtype=torch.long)
        for row, i in enumerate(idx):
            codes[row, : len(records[i])] = torch.from_numpy(encode_dna(records[i].sequence).astype(np.int64))
        return idx, {"codes": codes, "lengths": torch.tensor([len(records[i]) for i in idx])}

    for i in order:
        if group and (len(group) + 1) * len(records[i]) > max_tokens or len(group) >= max_batch:
            yield emit(group)
            group = []
        group.append(i)
    if group:
        yield emit(group)
