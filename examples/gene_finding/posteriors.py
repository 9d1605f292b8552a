"""Posteriors and alternative transcripts from the engine, for predict.py and plot_locus.py.

The distribution is P(segmentation | sequence) of a semi-CRF (the GHMM's engine inputs, or a trained
checkpoint's head). What the engine gives and what is computed from it here:

* per-position posteriors of coding (+ / - strand), intron and intergenic: the marginals
  (``semi_crf_streaming_marginals``, one forward-backward pass), summed over the labels of a kind;
* per-exon scores: ``min(P(its first segment starts at its start), P(its last segment ends at its
  end))`` from the same marginals, an upper bound of the exon's posterior probability (as
  ``FeatureCRF.exon_posteriors``); and, from exact samples, the fraction of samples that hold the
  exon (an unbiased estimate of its posterior probability);
* alternative transcripts: the distinct transcripts (strand + exon chain) of exact samples
  (``semi_crf_streaming_sample``: forward filtering, backward sampling) ranked by the fraction of
  samples that hold them, or of the k best parses (``semi_crf_streaming_topk``) ranked by the summed
  probability ``exp(score - log Z)`` of the parses that hold them (a lower bound of the
  transcript's posterior probability).

**One segmentation per labelling.** The GHMM's geometric intergenic length scores every cut of an
intergenic run alike, and a split intron's self move lets a split score as much as the unsplit
intron at its best cut. Viterbi does not care, but a sum over segmentations would count a labelling
once per way of cutting it (2^(n-1) for an intergenic run of n bases). :func:`ghmm_inputs` makes
intergenic runs one-base pieces (the same score for every labelling: exact) and, on a sequence no
longer than K, forbids intron self moves (no intron needs splitting). On a longer sequence introns
may still be split, and a labelling with a long intron is counted once per cut (noted, not fixed).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from torch_semimarkov import semi_crf_streaming_marginals, semi_crf_streaming_sample, semi_crf_streaming_topk
from torch_semimarkov.genomics.gff import Alternative
from torch_semimarkov.genomics.ghmm import GHMM, EngineInputs, assemble
from torch_semimarkov.genomics.labels import GeneGrammar
from torch_semimarkov.genomics.records import Gene

KINDS = ("coding +", "coding -", "intron", "intergenic")


def ghmm_inputs(model: GHMM, sequence, weights=None) -> EngineInputs:
    """The GHMM's engine inputs with one segmentation per labelling (module docstring)."""
    inp = assemble(model.features(sequence), weights)
    db, tr = inp.duration_bias.clone(), inp.transition.clone()
    T = int(inp.lengths[0])
    for c, lab in enumerate(model.grammar.labels):
        if lab.kind == "intergenic":
            db[1:, c] = float("-inf")
        if lab.kind == "intron" and T <= inp.K:
            tr[c, c] = float("-inf")
    return inp._replace(duration_bias=db, transition=tr)


def _engine_kwargs(inp: EngineInputs) -> dict:
    return dict(proj_start=inp.proj_start, proj_end=inp.proj_end)


def marginals(inp: EngineInputs):
    """``MarginalsResult`` of the inputs (the compiled CPU engine where numba is installed)."""
    from torch_semimarkov import numba_available

    backend = "numba" if numba_available() else "torch"
    return semi_crf_streaming_marginals(inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, inp.K,
                                        backend=backend, **_engine_kwargs(inp))


def kind_posteriors(position: torch.Tensor, grammar: GeneGrammar) -> Dict[str, np.ndarray]:
    """``{kind: (T,) posterior}`` for :data:`KINDS` from per-position label marginals (T, C)."""
    labels = grammar.labels
    groups = {"coding +": [c for c, lab in enumerate(labels) if lab.coding and lab.strand == "+"],
              "coding -": [c for c, lab in enumerate(labels) if lab.coding and lab.strand == "-"],
              "intron": [c for c, lab in enumerate(labels) if lab.kind == "intron"],
              "intergenic": [c for c, lab in enumerate(labels) if lab.kind == "intergenic"]}
    pos = position.double()
    return {k: pos[:, g].sum(-1).numpy() for k, g in groups.items()}


def exon_bounds(m, segments: Sequence[Tuple[int, int, int]], grammar: GeneGrammar,
                b: int = 0) -> Dict[Tuple[str, int, int], float]:
    """``{(strand, start, end): min(start marginal, end marginal)}`` per exon of ``segments`` (a
    maximal run of adjacent coding segments): an upper bound of the exon's posterior probability."""
    start, end = m.start[b].double(), m.end[b].double()
    labels = grammar.labels
    scores, run = {}, []
    for seg in list(segments) + [None]:
        coding = seg is not None and labels[seg[2]].coding
        if run and (not coding or seg[0] != run[-1][1]):
            s0, c0, e1, c1 = run[0][0], run[0][2], run[-1][1], run[-1][2]
            scores[(labels[c0].strand, s0, e1)] = float(min(start[s0, c0], end[e1 - 1, c1]))
            run = []
        if coding:
            run.append(seg)
    return scores


def gene_exon_scores(genes: Sequence[Gene], bounds: Dict[Tuple[str, int, int], float]) -> List[List[Optional[float]]]:
    """Per gene, per exon (genomic order), the bound of :func:`exon_bounds` (None if absent)."""
    return [[bounds.get((g.strand, ex.start, ex.end)) for ex in g.exons] for g in genes]


# ------------------------------------------------------------------------------ parses


def sample_parses(inp: EngineInputs, num_samples: int, seed: int = 0) -> Tuple[List[list], List[float]]:
    """``num_samples`` exact samples of one sequence's segmentation, each weighing 1 / num_samples."""
    gen = torch.Generator().manual_seed(seed)
    out = semi_crf_streaming_sample(inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, inp.K,
                                    num_samples=num_samples, generator=gen, **_engine_kwargs(inp))
    return [[tuple(map(int, s)) for s in segs] for segs in out.segments], [1.0 / num_samples] * num_samples


def topk_parses(inp: EngineInputs, k: int, log_z: float) -> Tuple[List[list], List[float]]:
    """The k best segmentations of one sequence, each weighing its probability ``exp(score - log Z)``."""
    out = semi_crf_streaming_topk(inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, inp.K, k=k,
                                  **_engine_kwargs(inp))
    parses, probs = [], []
    for r, segs in enumerate(out.segments):
        score = float(out.scores[0, r])
        if np.isfinite(score):
            parses.append([tuple(map(int, s)) for s in segs])
            probs.append(float(np.exp(score - log_z)))
    return parses, probs


def transcript_key(gene: Gene) -> tuple:
    """A transcript's identity: strand and exon chain."""
    return gene.strand, tuple((e.start, e.end) for e in gene.exons)


def exon_frequencies(gene_lists: Sequence[Sequence[Gene]], weights: Sequence[float]) -> Dict[tuple, float]:
    """``{(strand, start, end): summed weight of the parses holding that exon}``."""
    out: Dict[tuple, float] = defaultdict(float)
    for genes, w in zip(gene_lists, weights):
        for key in {(g.strand, e.start, e.end) for g in genes for e in g.exons}:
            out[key] += w
    return dict(out)


def alternatives(primary: Sequence[Gene], gene_lists: Sequence[Sequence[Gene]], weights: Sequence[float], n: int,
                 how: str, prefix: str = "alt",
                 bounds: Optional[Dict[Tuple[str, int, int], float]] = None) -> Tuple[List[Alternative], Dict[tuple, float]]:
    """Up to ``n`` transcripts of the parses that are not a transcript of ``primary``, by weight.

    A transcript's weight is the summed weight of the parses that hold it (``how`` names it: e.g.
    ``"samples"``). Each is attached to the primary gene on its strand it overlaps most (ties: the
    first), or is a gene of its own (id ``<prefix><n>``) when it overlaps none. Returns the
    alternatives and ``{transcript key: weight}`` of every transcript seen (primary ones included).
    ``bounds`` (``{(strand, start, end): score}``, e.g. :func:`exon_bounds` of every parse) gives
    the alternatives' exon scores.
    """
    weight: Dict[tuple, float] = defaultdict(float)
    example: Dict[tuple, Gene] = {}
    for genes, w in zip(gene_lists, weights):
        for g in genes:
            key = transcript_key(g)
            weight[key] += w  # a transcript appears at most once per parse (exons do not overlap)
            example.setdefault(key, g)
    primary_keys = {transcript_key(g) for g in primary}
    # by weight, then by position: deterministic
    ranked = sorted((k for k in weight if k not in primary_keys), key=lambda k: (-weight[k], k[1], k[0]))[:n]
    out, own = [], 0
    for rank, key in enumerate(ranked, 1):
        g = example[key]
        overlap = [(min(g.end, p.end) - max(g.start, p.start), -i) for i, p in enumerate(primary)
                   if p.strand == g.strand]
        best = max(overlap, default=(0, 0))
        parent = -best[1] if best[0] > 0 else None
        if parent is None:
            own += 1
        gene = Gene(f"{prefix}{own}" if parent is None else f"{primary[parent].id}.alt{rank}", g.strand, g.exons,
                    g.first_phase, g.partial)
        scores = None if bounds is None else tuple(bounds.get((g.strand, e.start, e.end)) for e in g.exons)
        out.append(Alternative(gene, parent, round(weight[key], 6), scores, {"rank": rank, "probability_from": how}))
    return out, dict(weight)
