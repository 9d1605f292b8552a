"""A discriminatively trained semi-CRF over the generalised HMM's feature components.

:class:`~.ghmm.GHMM` scores a segmentation as a sum of named components (content, in-frame stops,
splice / start / stop signals, lengths, transitions, sequence ends), each a log-likelihood ratio
estimated by counting. :class:`FeatureCRF` keeps those components as *features* and learns, by the
library's exact negative log-likelihood over whole loci, how much each one counts, plus a few
corrections a generative model cannot fit:

* ``weights`` (one per component, initially 1: the generative GHMM);
* ``offset`` (C,): a per-base score per label (k·offset for a duration-k segment);
* ``duration_delta`` (num_basis, C): smooth corrections of every label's length score (Gaussian
  bumps on log k);
* ``transition_delta`` (C, C): corrections of the allowed moves;
* ``site_bases`` (over a GHMM with ``GHMMConfig(signal_bases=True)``): per signal a (width, 4)
  score per window position and base, added at each candidate site (a discriminative position
  weight matrix beside the weight array model's score, as CRAIG's splice-site features).

All start at the GHMM (weights 1, corrections and site scores 0), and :meth:`FeatureCRF.penalty` (an L2 pull
towards it) keeps them near it unless the data say otherwise. The model is log-linear in its
parameters, so its NLL is convex; so is the softmax-margin loss of :meth:`FeatureCRF.nll`
``(margin=...)``, whose log Z counts every wrong exon boundary of a segmentation
(:meth:`FeatureCRF.boundary_cost`).

Decoding: :meth:`FeatureCRF.decode` (Viterbi, the most probable parse) or
:meth:`FeatureCRF.decode_mea` / :func:`mea_decode` (by posteriors: the parse whose coding
segments' boundary posteriors most exceed a threshold, which trades exon sensitivity for
specificity; the gene finder chooses the threshold by cross-validation). :meth:`FeatureCRF.save`
writes a trained model; :meth:`FeatureCRF.load` reads it over a GHMM refitted with its configuration.

The sequence-dependent components of each locus come from a fitted GHMM's
:meth:`~.ghmm.GHMM.features` (a locus's features may come from sensors fitted without it: honest
scores); the sequence-independent ones (lengths, transitions, first / last label) from the GHMM
passed to :class:`FeatureCRF` (:meth:`FeatureCRF.load_static`). :func:`pack` puts a batch of loci on
a device in the components' compact form (per-position columns and a label index per column),
which :meth:`FeatureCRF.engine_inputs` expands with gathers.

Example:
    >>> import numpy as np
    >>> from torch_semimarkov.genomics.ghmm import GHMM, GHMMConfig
    >>> from torch_semimarkov.genomics.records import toy_record
    >>> rng = np.random.default_rng(0)
    >>> records = [toy_record(rng, f"r{i}") for i in range(4)]
    >>> ghmm = GHMM.fit(records, GHMMConfig(order=2, max_duration=120))
    >>> crf = FeatureCRF(ghmm)
    >>> batch = pack([ghmm.features(r) for r in records], [r.genes for r in records])
    >>> nll = crf.nll(batch, dtype=torch.float64)
    >>> nll.shape, bool(torch.isfinite(nll).all())
    (torch.Size([4]), True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from torch_semimarkov.core.gold import segments_to_starts
from torch_semimarkov.scores import cumulative_scores
from torch_semimarkov.api.marginals import semi_crf_streaming_marginals
from torch_semimarkov.api.partition import semi_crf_streaming_forward
from torch_semimarkov.api.viterbi import semi_crf_streaming_viterbi
from torch_semimarkov.genomics.ghmm import GHMM, GHMMConfig, GHMMFeatures
from torch_semimarkov.genomics.records import UNKNOWN, Gene
from torch_semimarkov.genomics.sensors import SIGNAL_NAMES

__all__ = ["PackedTerm", "PackedSites", "PackedBatch", "pack", "FeatureCRF", "mea_decode", "SEQUENCE_COMPONENTS",
           "STATIC_COMPONENTS"]

#: components whose values depend on the sequence (packed per locus)
SEQUENCE_COMPONENTS = ("content_intergenic", "content_intron", "content_coding", "inframe_stop", "donor",
                       "acceptor", "start", "stop")
#: components that do not (taken from the GHMM of :class:`FeatureCRF`)
STATIC_COMPONENTS = ("length_exon", "length_intron", "length_intergenic", "transition", "ends")
_PARTS = ("emission", "proj_start", "proj_end")


@dataclass
class PackedTerm:
    """A batch of one :class:`~.ghmm.Term`: ``value[b, t, c] = values[b, t, index[t % P, c]] * scale[c]``.

    Attributes:
        values: (B, T, G+1) float, column G all zero (where ``index`` was -1).
        index: (P, C) long into the G+1 columns.
        scale: (C,) float or None.
    """

    values: torch.Tensor
    index: torch.Tensor
    scale: Optional[torch.Tensor]

    def dense(self) -> torch.Tensor:
        """(B, T, C)."""
        B, T, _ = self.values.shape
        P, C = self.index.shape
        t = torch.arange(T, device=self.values.device)
        idx = self.index[t % P]  # (T, C)
        out = self.values.gather(2, idx[None].expand(B, T, C))
        return out if self.scale is None else out * self.scale


@dataclass
class PackedBatch:
    """Loci on a device: their sequence-dependent components, constraints and gold segmentations.

    Attributes:
        lengths: (B,) long. T: the padded length.
        terms: ``{component: {part: [PackedTerm, ...]}}`` for the sequence-dependent components
            (:data:`SEQUENCE_COMPONENTS`, and the signals' ``"<signal>_up"`` parts of a GHMM with
            ``signal_split``).
        constraints: ``{part: [PackedTerm, ...]}`` (added unweighted: -inf for missing 3' consensus,
            the 5' penalty and its take-back).
        labels, starts: (B, T) gold tensors (``segments_to_starts``) or None.
        segments: the gold segmentations ``[(start, end, label)]`` or None.
        sites: with features of a GHMM with ``signal_bases``, ``{signal: PackedSites}``; else None.
    """

    lengths: torch.Tensor
    T: int
    terms: Dict[str, Dict[str, List[PackedTerm]]]
    constraints: Dict[str, List[PackedTerm]]
    labels: Optional[torch.Tensor] = None
    starts: Optional[torch.Tensor] = None
    segments: Optional[List[List[Tuple[int, int, int]]]] = None
    sites: Optional[Dict[str, "PackedSites"]] = None

    @property
    def batch(self) -> int:
        return int(self.lengths.shape[0])


def _pack_terms(per_locus: Sequence[Sequence], T: int, device, dtype) -> List[PackedTerm]:
    """The i-th term of every locus, padded to T (the terms' index and scale must agree)."""
    out = []
    for i, first in enumerate(per_locus[0]):
        G = first.values.shape[1]
        vals = np.zeros((len(per_locus), T, G + 1), dtype=np.float64)
        for b, terms in enumerate(per_locus):
            term = terms[i]
            if term.values.shape[1] != G or not np.array_equal(term.index, first.index):
                raise ValueError("the loci's feature terms differ in layout (were they made by one GHMM class?)")
            vals[b, :term.values.shape[0], :G] = term.values
        index = np.where(first.index < 0, G, first.index)
        scale = None if first.scale is None else torch.as_tensor(first.scale, dtype=dtype, device=device)
        out.append(PackedTerm(torch.as_tensor(vals, dtype=dtype, device=device),
                              torch.as_tensor(index, dtype=torch.long, device=device), scale))
    return out


@dataclass
class PackedSites:
    """One signal's candidate sites in a batch (from :class:`~.ghmm.SiteWindows`).

    Attributes:
        codes: (N, width) long, the sites' window codes (``UNKNOWN`` = 4 for N and beyond the sequence).
        reads: ``{part: (at, index, sign)}``, the entries of the part that read a site: ``at`` (n,)
            long, their flat index into the part's (B, T, C) (an entry may read two sites: a site
            and a neighbouring piece's take-back); ``index`` (n,) long, the site (row of ``codes``);
            ``sign`` (n,) float, +1, or -1 where a continuation piece takes the site back.
    """

    codes: torch.Tensor
    reads: Dict[str, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def _pack_sites(windows: Sequence, T: int, device, dtype) -> PackedSites:
    """One signal's :class:`~.ghmm.SiteWindows` of a batch, every locus's sites numbered after the
    loci before it (the entries that read a site found once here, not at every evaluation)."""
    counts = [len(w.codes) for w in windows]
    offset = torch.tensor(np.concatenate([[0], np.cumsum(counts)[:-1]]), dtype=torch.float64, device=device)
    reads = {}
    for part in _PARTS:
        at, index, sign = [], [], []
        for term in _pack_terms([getattr(w.sites, part) for w in windows], T, device, torch.float64):
            ids = term.dense().flatten()  # (B * T * C) site id + 1 (negative: taken back), 0: none
            flat = ids.nonzero()[:, 0]
            sel = ids[flat]
            b = flat // (ids.numel() // len(windows))
            at.append(flat)
            index.append((sel.abs() - 1 + offset[b]).round().long())
            sign.append(torch.sign(sel).to(dtype))
        empty = torch.zeros(0, dtype=torch.long, device=device)
        reads[part] = (torch.cat(at) if at else empty, torch.cat(index) if index else empty,
                       torch.cat(sign) if sign else empty.to(dtype))
    codes = np.concatenate([w.codes.astype(np.int64) for w in windows])
    return PackedSites(torch.as_tensor(np.minimum(codes, UNKNOWN), dtype=torch.long, device=device), reads)


def pack(features: Sequence[GHMMFeatures], genes: Optional[Sequence[Sequence[Gene]]] = None, device="cpu",
         dtype: torch.dtype = torch.float32, grammar=None) -> PackedBatch:
    """A :class:`PackedBatch` of loci (their features from :meth:`~.ghmm.GHMM.features`; with
    ``genes``, the gold segmentations of :meth:`~.labels.GeneGrammar.encode` too)."""
    if not features:
        raise ValueError("pack needs at least one locus")
    T = max(f.T for f in features)
    K = features[0].K
    lengths = torch.tensor([f.T for f in features], dtype=torch.long, device=device)
    terms = {name: {part: _pack_terms([getattr(f.components[name], part) for f in features], T, device, dtype)
                    for part in _PARTS}
             for name in features[0].components if name not in STATIC_COMPONENTS}
    constraints = {part: _pack_terms([getattr(f.constraints, part) for f in features], T, device, dtype)
                   for part in _PARTS}
    batch = PackedBatch(lengths, T, terms, constraints)
    if features[0].windows is not None:
        batch.sites = {name: _pack_sites([f.windows[name] for f in features], T, device, dtype)
                       for name in features[0].windows}
    if genes is not None:
        from torch_semimarkov.genomics.labels import GeneGrammar
        grammar = grammar or GeneGrammar()
        if grammar.num_labels != features[0].C:
            raise ValueError(f"the grammar has {grammar.num_labels} labels, the features {features[0].C}: pass the "
                             "GHMM's grammar (grammar=ghmm.grammar), e.g. for a GHMM with intron tails")
        segs = [grammar.encode(g, f.T, K) for g, f in zip(genes, features)]
        labels, starts = segments_to_starts(segs, lengths.cpu(), T, features[0].C, K)
        batch.labels, batch.starts, batch.segments = labels.to(device), starts.to(device), segs
    return batch


class FeatureCRF(nn.Module):
    """Learned weights and corrections over a GHMM's feature components (module docstring).

    Args:
        ghmm: the fitted :class:`~.ghmm.GHMM` whose sequence-independent components (lengths,
            transitions, ends) and constraints the model uses (:meth:`load_static`).
        num_basis: Gaussian bumps on log k of the length corrections.
    """

    def __init__(self, ghmm: GHMM, num_basis: int = 8):
        super().__init__()
        self.grammar = ghmm.grammar
        self.config = ghmm.config  # the GHMM's configuration (what :meth:`save` records)
        K, C = ghmm.K, ghmm.grammar.num_labels
        self.K, self.C = K, C
        self.components = list(ghmm.components)
        self.sequence_components = [n for n in self.components if n not in STATIC_COMPONENTS]
        self.weights = nn.Parameter(torch.ones(len(self.components), dtype=torch.float64))
        self.offset = nn.Parameter(torch.zeros(C, dtype=torch.float64))
        self.duration_delta = nn.Parameter(torch.zeros(num_basis, C, dtype=torch.float64))
        self.transition_delta = nn.Parameter(torch.zeros(C, C, dtype=torch.float64))
        self.site_bases = nn.ParameterDict(
            {s: nn.Parameter(torch.zeros(ghmm.signals.models[s].width, 4, dtype=torch.float64))
             for s in (SIGNAL_NAMES if getattr(ghmm.config, "signal_bases", False) else ())})
        logk = torch.log(torch.arange(1, K + 1, dtype=torch.float64))
        centres = torch.linspace(0.0, math.log(K), num_basis, dtype=torch.float64)
        width = float(centres[1] - centres[0]) if num_basis > 1 else 1.0
        self.register_buffer("basis", torch.exp(-0.5 * ((logk[:, None] - centres[None, :]) / width) ** 2))
        self.load_static(ghmm)

    def save(self, path: str) -> None:
        """Write the learned parameters and the GHMM's configuration (``torch.save`` of ``{"state",
        "config"}``, ~100 kB). The GHMM itself is not written: it is refitted from the training
        records in seconds (:meth:`load`)."""
        torch.save({"state": self.state_dict(), "config": self.config.to_dict()}, path)

    @staticmethod
    def saved_config(path: str) -> GHMMConfig:
        """The GHMM configuration a file of :meth:`save` was trained with (fit the GHMM with it)."""
        return GHMMConfig(**torch.load(path, map_location="cpu")["config"])

    @classmethod
    def load(cls, path: str, ghmm: GHMM) -> "FeatureCRF":
        """The model of a :meth:`save` file over ``ghmm``, fitted with :meth:`saved_config` (the
        configuration is checked; the error names the file).

        Example::

            >>> import tempfile, os, numpy as np
            >>> from torch_semimarkov.genomics.records import toy_record
            >>> rng = np.random.default_rng(0)
            >>> train = [toy_record(rng, f"locus{i}") for i in range(6)]
            >>> ghmm = GHMM.fit(train, GHMMConfig(order=2, max_duration=200))
            >>> path = os.path.join(tempfile.mkdtemp(), "crf.pt")
            >>> FeatureCRF(ghmm).save(path)
            >>> again = FeatureCRF.load(path, GHMM.fit(train, FeatureCRF.saved_config(path)))
            >>> float(again.weights.sum()) == len(again.components)
            True
        """
        saved = torch.load(path, map_location="cpu")
        if saved["config"] != ghmm.config.to_dict():
            raise ValueError(f"{path}: saved with GHMM configuration {saved['config']}, "
                             f"not the given GHMM's {ghmm.config.to_dict()}")
        model = cls(ghmm)
        model.load_state_dict(saved["state"])
        return model

    def load_static(self, ghmm: GHMM) -> None:
        """Take the sequence-independent components and constraints of ``ghmm`` (same K, grammar)."""
        if ghmm.K != self.K:
            raise ValueError(f"the GHMM's K ({ghmm.K}) differs from the model's ({self.K})")
        static = ghmm._static
        zeros = lambda *s: torch.zeros(*s, dtype=torch.float64)  # noqa: E731
        dur = torch.stack([torch.as_tensor(static[n].duration) if static[n].duration is not None
                           else zeros(self.K, self.C) for n in STATIC_COMPONENTS[:4]])
        tr = torch.stack([torch.as_tensor(static[n].transition) if static[n].transition is not None
                          else zeros(self.C, self.C) for n in STATIC_COMPONENTS[:4]])
        cons = static["constraints"]
        dev = self.offset.device
        self.register_buffer("static_duration", dur.to(dev), persistent=False)
        self.register_buffer("static_transition", tr.to(dev), persistent=False)
        self.register_buffer("log_initial", torch.as_tensor(ghmm.log_initial).to(dev), persistent=False)
        self.register_buffer("log_final", torch.as_tensor(ghmm.log_final).to(dev), persistent=False)
        allowed = np.isfinite(cons.duration)
        # intergenic runs as one-base pieces: the geometric length scores every cut of a run alike,
        # so with longer pieces a run of n bases would be 2^(n-1) segmentations of one labelling
        # (log Z would count log 2 per intergenic base); one-base pieces make it one, exactly
        # the same labelling scores, and the same Viterbi labelling
        for c, lab in enumerate(self.grammar.labels):
            if lab.kind == "intergenic":
                allowed[1:, c] = False
        self.register_buffer("duration_allowed", torch.as_tensor(allowed).to(dev), persistent=False)
        self.register_buffer("transition_allowed", torch.as_tensor(np.isfinite(cons.transition)).to(dev),
                             persistent=False)

    def _w(self, name: str) -> torch.Tensor:
        return self.weights[self.components.index(name)]

    def penalty(self) -> torch.Tensor:
        """``||weights - 1||^2 + ||offset||^2 + ||duration_delta||^2 + ||transition_delta||^2``
        (the allowed moves only) ``+ ||site_bases||^2``: the pull towards the generative GHMM."""
        tr = torch.where(self.transition_allowed, self.transition_delta, torch.zeros_like(self.transition_delta))
        sites = sum((p ** 2).sum() for p in self.site_bases.values()) if len(self.site_bases) else 0.0
        return ((self.weights - 1) ** 2).sum() + (self.offset ** 2).sum() + (self.duration_delta ** 2).sum() + \
            (tr ** 2).sum() + sites

    def engine_inputs(self, batch: PackedBatch, dtype: torch.dtype = torch.float32):
        """``(cum_scores, transition, duration_bias, proj_start, proj_end)`` of the batch, differentiable
        in the parameters (float32 for the GPU engine by default)."""
        B, T, C = batch.batch, batch.T, self.C
        missing = [n for n in self.sequence_components if n not in batch.terms]
        if missing:
            raise ValueError(f"batch: no {missing} components (packed from the features of a GHMM with another "
                             f"signal_split than this model's)")
        dev = batch.lengths.device
        parts = {p: torch.zeros(B, T, C, dtype=dtype, device=dev) for p in _PARTS}
        w = self.weights.to(dtype)
        for name in self.sequence_components:
            wi = w[self.components.index(name)]
            for p in _PARTS:
                for term in batch.terms[name][p]:
                    parts[p] = parts[p] + wi * term.dense().to(dtype)
        for p in _PARTS:
            for term in batch.constraints[p]:
                parts[p] = parts[p] + term.dense().to(dtype)
        if len(self.site_bases):
            if batch.sites is None or set(batch.sites) != set(self.site_bases):
                raise ValueError("batch: no site windows of " + ", ".join(self.site_bases) + " (the model learns "
                                 "site_bases: pack features of a GHMM with GHMMConfig(signal_bases=True))")
            for name, theta in self.site_bases.items():
                sites = batch.sites[name]
                if sites.codes.shape[1] != theta.shape[0]:
                    raise ValueError(f"batch: {name} windows of {sites.codes.shape[1]} bases, the model's "
                                     f"{theta.shape[0]}")
                # each site's score: sum over its window of the position's score of its base (0 for N),
                # as a product with the one-hot windows (a gather's backward would sum the many repeats
                # of one index serially under CUDA's deterministic algorithms)
                table = F.pad(theta.to(dtype), (0, 1))  # (width, 5)
                score = torch.einsum("nwx,wx->n", F.one_hot(sites.codes, 5).to(dtype), table)  # (N,)
                for p in _PARTS:
                    at, index, sign = sites.reads[p]
                    if len(at):
                        # (accumulate: sort-based, deterministic on CUDA; an entry is read by few sites)
                        flat = parts[p].new_zeros(parts[p].numel()).index_put((at,), (sign * score[index]).to(parts[p].dtype),
                                                                              accumulate=True)
                        parts[p] = parts[p] + flat.view_as(parts[p])
        valid = (torch.arange(T, device=dev)[None, :] < batch.lengths[:, None])[..., None]
        emission = parts["emission"] + self.offset.to(dtype)
        # the same quantity from every label's score: exact, keeps the sums small
        emission = torch.where(valid, emission - emission.mean(-1, keepdim=True), emission.new_zeros(()))
        ws = torch.stack([self._w(n) for n in STATIC_COMPONENTS[:4]])
        duration = torch.einsum("n,nkc->kc", ws, self.static_duration) + self.basis @ self.duration_delta
        transition = torch.einsum("n,nij->ij", ws, self.static_transition) + self.transition_delta
        transition = transition.masked_fill(~self.transition_allowed, float("-inf"))
        duration = duration.masked_fill(~self.duration_allowed, float("-inf"))
        cum, duration = cumulative_scores(emission, batch.lengths, duration.to(dtype))
        transition = transition.to(dtype)
        w_ends = self._w("ends").to(dtype)
        b = torch.arange(B, device=dev)
        first = torch.zeros(B, T, C, dtype=dtype, device=dev)
        first[:, 0] = w_ends * self.log_initial.to(dtype)
        # the engine's first-segment term logsumexp_{c'} Tr[c', c] is cancelled: the first label's
        # score is the ends component's alone, as in the GHMM
        lse = torch.logsumexp(transition, 0)
        first[:, 0] = first[:, 0] - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
        last = torch.zeros(B, T, C, dtype=dtype, device=dev)
        last[b, batch.lengths - 1] = w_ends * self.log_final.to(dtype)
        return cum, transition, duration, parts["proj_start"] + first, parts["proj_end"] + last

    def boundary_cost(self, batch: PackedBatch, margin: float, dtype: torch.dtype = torch.float32):
        """The exon-boundary cost of softmax-margin training as ``(proj_start, proj_end, constant)``
        terms: added to the engine inputs, every segmentation's score grows by
        ``margin * (FP - TP)`` and ``constant`` (B,) is ``margin * (number of gold boundaries)``, so
        that score + constant grows by ``margin * (FP + FN)``: the number of coding-run boundaries
        (exon starts and ends, in genomic order, either strand) it predicts that the gold
        segmentation does not have, plus those of the gold it misses. The gold's cost is 0.

        A coding segment's start counts as a boundary only where no coding segment precedes it (a
        long exon is an exon label and continuation pieces); a label that is always followed by a
        coding segment takes back the next segment's start term at its end (and has no end term),
        one always preceded by one takes back the previous segment's end term at its start (the
        grammar's transitions say which), except at the sequence's edges, where they are
        boundaries.
        """
        if batch.segments is None:
            raise ValueError("the batch has no gold segmentations (pack(..., genes=...))")
        B, T = batch.batch, batch.T
        dev = batch.lengths.device
        gl = torch.zeros(B, T + 1, dtype=dtype)  # a gold coding run starts at t
        gr = torch.zeros(B, T + 1, dtype=dtype)  # a gold coding run ends at t (its last base)
        coding = [lab.coding for lab in self.grammar.labels]
        for b, segs in enumerate(batch.segments):
            prev_end = None  # the end of the coding segment just before, if any
            for s, e, c in segs:
                if not coding[c]:
                    prev_end = None
                    continue
                if prev_end == s:
                    gr[b, s - 1] = 0.0  # the run goes on: its earlier segment does not end it
                else:
                    gl[b, s] = 1.0
                gr[b, e - 1] = 1.0
                prev_end = e
        gl, gr = gl.to(dev), gr.to(dev)
        allowed = self.transition_allowed
        is_coding = torch.tensor(coding, device=dev)
        has_next = allowed.any(1)
        has_prev = allowed.any(0)
        # labels every successor / predecessor of which is coding
        then_coding = is_coding & has_next & (~allowed | is_coding[None, :]).all(1)
        after_coding = is_coding & has_prev & (~allowed | is_coding[:, None]).all(0)
        start = margin * (1 - 2 * gl[:, :T])  # (B, T): a predicted run start at t
        end = margin * (1 - 2 * gr[:, :T])
        next_start = margin * (1 - 2 * gl[:, 1:])  # the start term of a segment beginning at t + 1
        prev_end = margin * (1 - 2 * torch.cat([gr.new_zeros(B, 1), gr[:, :T - 1]], 1))
        t = torch.arange(T, device=dev)[None, :]
        last = t == (batch.lengths[:, None] - 1)
        first = t == 0
        ps = torch.where(is_coding, start[..., None], start.new_zeros(()))
        pe = torch.where(is_coding, end[..., None], end.new_zeros(()))
        # always followed by coding: take back the next start, no end of its own (but at the last base)
        pe = torch.where(then_coding & ~last[..., None], -next_start[..., None], pe)
        ps = torch.where(after_coding & ~first[..., None], -prev_end[..., None], ps)
        valid = (t < batch.lengths[:, None])[..., None]
        zero = ps.new_zeros(())
        constant = margin * (gl.sum(1) + gr.sum(1))
        return torch.where(valid, ps, zero), torch.where(valid, pe, zero), constant

    def nll(self, batch: PackedBatch, dtype: torch.dtype = torch.float32,
                      backend: str = "auto", margin: float = 0.0) -> torch.Tensor:
        """(B,) ``-log P(gold labelling)``: the probability of every segmentation whose labels are
        the gold ones, whatever the cuts inside its runs (an intergenic run longer than K is several
        segments joined by a self move; the geometric intergenic length scores every cut alike, so
        a model trained on one canonical cut would spread its mass over the others). The sum over
        the cuts of each run of label c is a one-label semi-CRF over the run (its duration and
        self-move scores, the run's content and boundary terms), run on the engine for all runs of
        one label at once; the moves between runs and a run of a label that cannot follow itself
        are fixed. ``inf`` for a locus whose gold labelling the model forbids.

        ``margin`` > 0: the softmax-margin loss (Gimpel and Smith, 2010) with the exon-boundary cost
        of :meth:`boundary_cost`: log Z over scores raised by ``margin`` per wrong boundary
        (predicted or missed), an upper bound of the NLL that weighs the segmentations by how far
        their exons are from the gold's, closer to exon accuracy than the plain NLL (0: the NLL)."""
        if batch.segments is None:
            raise ValueError("the batch has no gold segmentations (pack(..., genes=...))")
        if margin < 0:
            raise ValueError(f"margin must be >= 0, got {margin}")
        cum, tr, db, ps, pe = self.engine_inputs(batch, dtype)
        ps_z, pe_z, constant = ps, pe, 0.0
        if margin:
            cost_s, cost_e, constant = self.boundary_cost(batch, margin, dtype)
            ps_z, pe_z = ps + cost_s, pe + cost_e
        log_z = semi_crf_streaming_forward(cum, tr, db, batch.lengths, self.K, proj_start=ps_z, proj_end=pe_z,
                                           backend=backend, validate=False) + constant
        return log_z - self._labelled_log_partition(batch, cum, tr, db, ps, pe, backend)

    def _labelled_log_partition(self, batch, cum, tr, db, ps, pe, backend):
        dev = cum.device
        runs: Dict[int, List[Tuple[int, int, int]]] = {}  # label -> [(b, s, e)]
        entry = []  # (b, previous label or -1, label)
        for b, segs in enumerate(batch.segments):
            prev = -1
            for s, e, c in segs:
                if c == prev and runs[c][-1][0] == b and runs[c][-1][2] == s:
                    runs[c][-1] = (b, runs[c][-1][1], e)
                    continue
                runs.setdefault(c, []).append((b, s, e))
                entry.append((b, prev, c))
                prev = c
        total = cum.new_zeros(batch.batch)
        # the move into each run: the engine's first-segment term for the first, Tr[c', c] after
        eb, ep, ec = (torch.tensor(x, device=dev) for x in zip(*entry))
        lse = torch.logsumexp(tr, 0)
        total = total.index_add(0, eb, torch.where(ep < 0, lse[ec], tr[ep.clamp(min=0), ec]))
        for c, rr in runs.items():
            rb, rs, re_ = (torch.tensor(x, device=dev) for x in zip(*rr))
            n = re_ - rs
            if not bool(torch.isfinite(tr[c, c])):
                # one segment per run: its score
                val = (cum[rb, re_, c] - cum[rb, rs, c] + db[(n - 1).clamp(max=self.K - 1), c]
                       + ps[rb, rs, c] + pe[rb, re_ - 1, c])
                total = total.index_add(0, rb, val)
                continue
            width = int(n.max())
            offs = torch.arange(width + 1, device=dev)
            pos = (rs[:, None] + torch.minimum(offs[None, :], n[:, None])).clamp(max=cum.shape[1] - 1)
            sub_cum = (cum[rb[:, None], pos, c] - cum[rb, rs, c][:, None])[..., None]
            pos_t = (rs[:, None] + offs[None, :width]).clamp(max=ps.shape[1] - 1)
            inside = offs[None, :width] < n[:, None]
            zero = ps.new_zeros(())
            sub_ps = torch.where(inside, ps[rb[:, None], pos_t, c], zero)[..., None]
            sub_pe = torch.where(inside, pe[rb[:, None], pos_t, c], zero)[..., None]
            log_z_run = semi_crf_streaming_forward(sub_cum, tr[c, c].reshape(1, 1), db[:, c:c + 1], n, self.K,
                                                   proj_start=sub_ps, proj_end=sub_pe, backend=backend,
                                                   validate=False)
            # the sub-problem's first piece got its phantom term Tr[c, c]: the entry term replaces it
            total = total.index_add(0, rb, log_z_run - tr[c, c])
        return total

    @torch.no_grad()
    def decode(self, batch: PackedBatch, dtype: torch.dtype = torch.float32,
               backend: str = "auto") -> List[List[Tuple[int, int, int]]]:
        """The Viterbi segmentation of each locus, ``[(start, end, label)]``."""
        cum, tr, db, ps, pe = self.engine_inputs(batch, dtype)
        out = semi_crf_streaming_viterbi(cum, tr, db, batch.lengths, self.K, proj_start=ps, proj_end=pe,
                                         backend=backend, validate=False)
        return _segment_lists(out)

    @torch.no_grad()
    def marginals(self, batch: PackedBatch, dtype: torch.dtype = torch.float32, backend: str = "auto"):
        """The :class:`~torch_semimarkov.MarginalsResult` of the batch (one forward-backward pass),
        for :meth:`decode_mea` and :meth:`exon_posteriors` to share."""
        cum, tr, db, ps, pe = self.engine_inputs(batch, dtype)
        return semi_crf_streaming_marginals(cum, tr, db, batch.lengths, self.K, proj_start=ps, proj_end=pe,
                                            backend=backend, validate=False)

    @torch.no_grad()
    def decode_mea(self, batch: PackedBatch, thresholds: Sequence[float], dtype: torch.dtype = torch.float32,
                   backend: str = "auto", marginals=None) -> Dict[float, List[List[Tuple[int, int, int]]]]:
        """Maximum expected boundary accuracy decoding, for each threshold ``kappa``: the parse that
        maximises the sum over its coding segments of ``(P(start) + P(end)) / 2 - kappa``.

        ``P(start)`` is the posterior probability that a segment of the segment's label starts where
        it starts, ``P(end)`` that one ends where it ends (one forward-backward pass for all
        thresholds). The parse ranges over what the model allows (its forbidden moves, lengths and
        boundaries stay forbidden); non-coding segments add nothing. A coding segment enters the
        parse only when its boundaries' posteriors beat ``kappa``: a higher threshold predicts fewer,
        surer exons (exon specificity up, sensitivity down), the trade-off Viterbi cannot make.
        After Gross et al. (2007) and DeCaprio et al. (2007), who decode gene structures this way.

        ``marginals``: :meth:`marginals` of the batch if already computed.

        Returns:
            ``{kappa: segmentations}``, each as :meth:`decode` returns them.
        """
        cum, tr, db, ps, pe = self.engine_inputs(batch, dtype)
        coding = [lab.coding for lab in self.grammar.labels]
        return mea_decode(cum, tr, db, batch.lengths, self.K, coding, thresholds, proj_start=ps, proj_end=pe,
                          marginals=marginals, backend=backend)

    @torch.no_grad()
    def exon_posteriors(self, batch: PackedBatch, segments: Sequence[Sequence[Tuple[int, int, int]]],
                        dtype: torch.dtype = torch.float32, backend: str = "auto",
                        marginals=None) -> List[Dict[Tuple[int, int], float]]:
        """Per locus, ``{(start, end): score}`` for each exon of ``segments`` (a maximal run of
        adjacent coding segments: an exon and its continuation pieces), the score
        ``min(P(a segment of its first label starts at start), P(one of its last label ends at
        end - 1))`` from one forward-backward pass: an upper bound of the exon's posterior
        probability (the exact one would need a constrained pass per exon). ``marginals``:
        :meth:`marginals` of the batch if already computed."""
        m = marginals if marginals is not None else self.marginals(batch, dtype, backend)
        start, end = m.start.double().cpu(), m.end.double().cpu()
        labels = self.grammar.labels
        out = []
        for b, segs in enumerate(segments):
            scores, run = {}, []
            for seg in list(segs) + [None]:
                coding = seg is not None and labels[seg[2]].coding
                if run and (not coding or seg[0] != run[-1][1]):
                    s0, c0, e1, c1 = run[0][0], run[0][2], run[-1][1], run[-1][2]
                    scores[(s0, e1)] = float(min(start[b, s0, c0], end[b, e1 - 1, c1]))
                    run = []
                if coding:
                    run.append(seg)
            out.append(scores)
        return out


@torch.no_grad()
def mea_decode(cum_scores: torch.Tensor, transition: torch.Tensor, duration_bias: torch.Tensor,
               lengths: torch.Tensor, K: int, coding: Sequence[bool], thresholds: Sequence[float],
               proj_start: Optional[torch.Tensor] = None, proj_end: Optional[torch.Tensor] = None,
               marginals=None, backend: str = "auto") -> Dict[float, List[List[Tuple[int, int, int]]]]:
    """Maximum expected boundary accuracy decoding of a semi-CRF given by its engine inputs
    (:meth:`FeatureCRF.decode_mea` explains the objective).

    Args:
        cum_scores, transition, duration_bias, lengths, K, proj_start, proj_end: the model, as
            :func:`~torch_semimarkov.semi_crf_streaming_marginals` takes it ((B, T+1, C), (C, C),
            (K, C), (B,), int, (B, T, C), (B, T, C)).
        coding: (C,) which labels are coding (their segments earn the gain; the others none).
        thresholds: the kappa values (one Viterbi pass each).
        marginals: the model's :class:`~torch_semimarkov.MarginalsResult` if already computed.

    Returns:
        ``{kappa: [[(start, end, label), ...] per sequence]}``.
    """
    if len(coding) != cum_scores.shape[-1]:
        raise ValueError(f"coding has {len(coding)} entries for {cum_scores.shape[-1]} labels")
    if transition.dim() != 2:
        raise ValueError(f"mea_decode takes a (C, C) transition, got shape {tuple(transition.shape)}")
    m = marginals if marginals is not None else semi_crf_streaming_marginals(
        cum_scores, transition, duration_bias, lengths, K, proj_start=proj_start, proj_end=proj_end,
        backend=backend, validate=False)
    dtype, dev = cum_scores.dtype, cum_scores.device
    is_coding = torch.tensor(list(coding), dtype=torch.bool, device=dev)

    def allowed(x):  # 0 where the model allows, -inf where it forbids
        return torch.where(torch.isfinite(x), torch.zeros_like(x), x)

    tr0, db0 = allowed(transition), allowed(duration_bias)
    ps0 = allowed(proj_start) if proj_start is not None else cum_scores.new_zeros(m.start.shape)
    pe0 = allowed(proj_end) if proj_end is not None else cum_scores.new_zeros(m.end.shape)
    # the engine's first-segment term logsumexp_{c'} Tr[c', c] (the log of the number of allowed
    # predecessors here) is cancelled: a parse's first label costs nothing beyond what is allowed
    lse = torch.logsumexp(tr0, 0)
    ps0 = ps0.clone()
    ps0[:, 0] = ps0[:, 0] - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    zero = torch.zeros_like(cum_scores)
    out = {}
    for kappa in thresholds:
        gain_s = torch.where(is_coding, 0.5 * (m.start.to(dtype) - float(kappa)), zero.new_zeros(()))
        gain_e = torch.where(is_coding, 0.5 * (m.end.to(dtype) - float(kappa)), zero.new_zeros(()))
        best = semi_crf_streaming_viterbi(zero, tr0, db0, lengths, K, proj_start=ps0 + gain_s, proj_end=pe0 + gain_e,
                                          backend=backend, validate=False)
        out[kappa] = _segment_lists(best)
    return out


def _segment_lists(out) -> List[List[Tuple[int, int, int]]]:
    """``[(start, end, label)]`` per sequence of a Viterbi result."""
    offsets = out.segment_offsets.tolist()
    s, e, c = out.segment_starts.tolist(), out.segment_ends.tolist(), out.segment_labels.tolist()
    return [list(zip(s[a:z], e[a:z], c[a:z])) for a, z in zip(offsets[:-1], offsets[1:])]
