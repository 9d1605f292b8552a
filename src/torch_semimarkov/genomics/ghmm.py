"""A generalised-HMM gene finder on the semi-CRF engine, as a sum of named feature components.

:class:`GHMM` fits the generative sensors of :mod:`.sensors` (content, signal and length models)
and the gold parses' transition probabilities on annotated loci, and turns a DNA sequence into the
engine's inputs over :class:`~.labels.GeneGrammar`'s 47 labels. Every model enters as one **named
feature component** (:class:`Component`), laid out like the engine input it enters:

* ``content_intergenic``: intergenic chain / background per base (emission of the N label);
* ``content_intron``: intron chain / background per base (emission of the intron labels, per strand);
* ``content_coding``: 3-periodic coding chain / background per base, in the exon's reading frame:
  its mean over the three frames as an emission, the rest as cumulative per-frame sums in
  ``proj_start`` / ``proj_end`` (as :class:`~.models.GeneStructureHead` scores frames);
* ``inframe_stop``: ``-stop_penalty`` per stop codon in an exon's reading frame (same layout);
* ``donor``, ``acceptor``, ``start``, ``stop``: weight array model / background of the site's
  window at the exon's boundaries (``proj_start`` / ``proj_end``); a continuation piece takes back
  its neighbour's 5' check, as :meth:`~.labels.GeneGrammar.signal_tables` says;
* ``length_exon``: log P(length | exon type), restricted to the label's phases (duration);
* ``length_intron``: log P(intron length) (duration) and the self-move of split introns (transition);
  with ``GHMMConfig(intron_tail=E)`` the lengths are empirical below E and geometric from E on, a long
  intron being one-base tail pieces and an end piece (:class:`~.labels.GeneGrammar`): exact for any K;
* ``length_intergenic``: geometric intergenic length (duration + self-move: exact however split);
* ``transition``: log P(next label | label) of the gold parses (transition);
* ``ends``: log P(first label) and log P(last label) (``proj_start`` at 0, ``proj_end`` at T-1).

:func:`assemble` adds them with one weight each (default 1: the generative GHMM) plus the
unweighted **constraints** (``-inf`` for the grammar's forbidden moves, the duration mask, an
exon 3' end without its donor / stop consensus and a sequence that ends in an intron tail piece; a
finite ``five_prime_penalty`` for a 5' end without its start / acceptor consensus, finite because
a continuation piece must be able to take it back exactly). Every value is a log-likelihood ratio against one per-position background, so
per-position values stay small; :func:`assemble` also subtracts the per-position mean over labels
of the emissions (the same quantity from every label: exact). Later, a discriminatively trained
semi-CRF can learn one weight per component.

Example:
    >>> from torch_semimarkov.genomics.records import toy_record
    >>> rng = np.random.default_rng(0)
    >>> model = GHMM.fit([toy_record(rng, f"r{i}") for i in range(3)], GHMMConfig(order=2, max_duration=120))
    >>> inp = assemble(model.features(toy_record(rng, "r3")))
    >>> tuple(inp.cum_scores.shape), tuple(inp.duration_bias.shape), inp.cum_scores.dtype
    ((1, 401, 47), (120, 47), torch.float64)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from torch_semimarkov.genomics.labels import MIN_EXON, MIN_INTRON, GeneGrammar
from torch_semimarkov.genomics.records import SIGNALS, Gene, GenomicRecord, encode_dna
from torch_semimarkov.genomics.sensors import (SIGNAL_NAMES, ContentSensors, LengthDistribution, SignalSensors,
                                               reverse_complement)

__all__ = [
    "COMPONENTS",
    "Term",
    "Component",
    "GHMMFeatures",
    "SiteWindows",
    "EngineInputs",
    "assemble",
    "GHMMConfig",
    "GHMM",
]

#: the feature components of :meth:`GHMM.features`, in order
COMPONENTS = ("content_intergenic", "content_intron", "content_coding", "inframe_stop", "donor", "acceptor",
              "start", "stop", "length_exon", "length_intron", "length_intergenic", "transition", "ends")
_PARTS = ("emission", "proj_start", "proj_end")
_STOPS = ("TAA", "TAG", "TGA")


# --------------------------------------------------------------------------- components


@dataclass
class Term:
    """A (T, C) array stored compactly: ``value[t, c] = values[t, index[t % P, c]] * scale[c]``,
    0 where ``index`` is -1.

    Attributes:
        values: (T, G) float64 columns (G small: a few per-position tracks).
        index: (P, C) int: the column each label reads at positions ``t = p (mod P)`` (P = 1, or 3
            for reading-frame terms whose column cycles with the position), -1: nothing.
        scale: (C,) float64 per-label factor, or None (1).
    """

    values: np.ndarray
    index: np.ndarray
    scale: Optional[np.ndarray] = None

    def add_to(self, out: np.ndarray, weight: float = 1.0) -> None:
        """``out += weight * dense``, without building the dense (T, C) array first."""
        T, G = self.values.shape
        padded = np.concatenate([self.values, np.zeros((T, 1))], axis=1)
        P = self.index.shape[0]
        for p in range(P):
            idx = np.where(self.index[p] < 0, G, self.index[p])
            block = padded[p::P][:, idx]
            if self.scale is not None:
                block = block * self.scale[None, :]
            out[p::P] += weight * block if weight != 1.0 else block

    def dense(self) -> np.ndarray:
        out = np.zeros((self.values.shape[0], self.index.shape[1]))
        self.add_to(out)
        return out


@dataclass
class Component:
    """One named feature: its terms in each engine input (absent parts are zero).

    Attributes:
        name: e.g. ``"content_coding"``.
        emission, proj_start, proj_end: lists of :class:`Term` ((T, C) each): per-position label
            scores (summed into ``cum_scores``), segment-start and segment-end scores.
        duration: (K, C) or None, row k-1 for duration k.
        transition: (C, C) or None, ``[c_src, c_dst]``.
    """

    name: str
    emission: List[Term] = field(default_factory=list)
    proj_start: List[Term] = field(default_factory=list)
    proj_end: List[Term] = field(default_factory=list)
    duration: Optional[np.ndarray] = None
    transition: Optional[np.ndarray] = None

    def dense(self, part: str, T: int, K: int, C: int) -> np.ndarray:
        """The part as a dense array: (T, C) for emission / proj_start / proj_end, (K, C), (C, C)."""
        if part in _PARTS:
            out = np.zeros((T, C))
            for term in getattr(self, part):
                term.add_to(out)
            return out
        shape = {"duration": (K, C), "transition": (C, C)}[part]
        value = getattr(self, part)
        return np.zeros(shape) if value is None else value.copy()


@dataclass
class SiteWindows:
    """One signal's candidate sites in a sequence and the bases of their windows
    (``GHMMConfig(signal_bases=True)``), for features learned per window position and base.

    Attributes:
        sites: the signal's terms laid out as its component's (the same labels, parts and
            continuation-piece take-backs), but each value is a *site id*: ``i + 1`` for the site
            whose window is ``codes[i]``, 0 where there is none, negative where a continuation
            piece takes the site back (scale -1).
        codes: (N, width) int8, the N sites' windows on the strand each is read on (the signal
            model's offsets ``lo .. hi-1`` from its anchor; ``UNKNOWN`` = 4 for N bases and beyond
            the sequence); the + strand's sites first.
    """

    sites: "Component"
    codes: np.ndarray


@dataclass
class GHMMFeatures:
    """The feature components of one sequence (see the module docstring) and its constraints.

    ``components`` hold finite values; ``constraints`` holds ``-inf`` (forbidden) and the finite
    5' consensus penalty, added unweighted by :func:`assemble`. ``windows``: ``{signal:
    SiteWindows}`` with ``GHMMConfig(signal_bases=True)`` (not scores: :func:`assemble` and the
    GHMM ignore them; :class:`~.feature_crf.FeatureCRF` learns scores for them), else None.
    """

    T: int
    K: int
    C: int
    components: Dict[str, Component]
    constraints: Component
    windows: Optional[Dict[str, SiteWindows]] = None

    def dense(self, name: str) -> Dict[str, np.ndarray]:
        """``{part: dense array}`` of a component (or ``"constraints"``), for inspection and tests."""
        comp = self.constraints if name == "constraints" else self.components[name]
        return {p: comp.dense(p, self.T, self.K, self.C) for p in _PARTS + ("duration", "transition")}


class EngineInputs(NamedTuple):
    """The engine's inputs for one sequence (B = 1), float64, on the CPU.

    ``cum_scores`` (1, T+1, C), ``transition`` (C, C), ``duration_bias`` (K, C), ``proj_start`` /
    ``proj_end`` (1, T, C), ``lengths`` (1,), ``K``.
    """

    cum_scores: torch.Tensor
    transition: torch.Tensor
    duration_bias: torch.Tensor
    proj_start: torch.Tensor
    proj_end: torch.Tensor
    lengths: torch.Tensor
    K: int


def _lse0(x: np.ndarray) -> np.ndarray:
    """log-sum-exp over axis 0; -inf where every entry is -inf."""
    m = x.max(0)
    safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return safe + np.log(np.exp(x - safe[None, :]).sum(0))


def assemble(features: GHMMFeatures, weights: Optional[Mapping[str, float]] = None, constraints: bool = True,
             first_segment: bool = True, center: bool = True) -> EngineInputs:
    """The engine's inputs: ``sum_name weights[name] * component[name]`` (+ the constraints).

    Args:
        features: from :meth:`GHMM.features`.
        weights: ``{component name: weight}``; missing names weigh 1 (the generative GHMM). A name
            that is not a component raises ``KeyError``.
        constraints: add the unweighted constraints (``-inf`` for what the grammar forbids).
        first_segment: cancel the engine's ``logsumexp_{c'} Tr[c', c]`` term of the first segment
            (by subtracting it from ``proj_start[0]``), so that the first segment's only start term
            is the ``ends`` component's log P(first label). This term depends on the assembled
            transition, so the result is linear in the weights only with ``first_segment=False``.
        center: subtract the emissions' per-position mean over labels before the cumulative sum.
            Exact (every segmentation's score shifts by the same amount) and keeps the cumulative
            scores small; ``False`` gives scores equal to the plain sum of the components.

    Returns:
        :class:`EngineInputs`.
    """
    weights = dict(weights or {})
    unknown = set(weights) - set(features.components)
    if unknown:
        raise KeyError(f"no such components: {sorted(unknown)} (components: {list(features.components)})")
    T, K, C = features.T, features.K, features.C
    emis, ps, pe = np.zeros((T, C)), np.zeros((T, C)), np.zeros((T, C))
    dur, tr = np.zeros((K, C)), np.zeros((C, C))
    parts = [(c, float(weights.get(name, 1.0))) for name, c in features.components.items()]
    if constraints:
        parts.append((features.constraints, 1.0))
    for comp, w in parts:
        if w == 0.0:
            continue
        for part, out in (("emission", emis), ("proj_start", ps), ("proj_end", pe)):
            for term in getattr(comp, part):
                term.add_to(out, w)
        if comp.duration is not None:
            dur += w * comp.duration
        if comp.transition is not None:
            tr += w * comp.transition
    if center:
        emis -= emis.mean(1, keepdims=True)
    cum = np.zeros((T + 1, C))
    np.cumsum(emis, axis=0, out=cum[1:])
    if first_segment and T > 0:
        lse = _lse0(tr)
        ps[0] -= np.where(np.isfinite(lse), lse, 0.0)
    t = torch.from_numpy
    return EngineInputs(t(cum)[None], t(tr), t(dur), t(ps)[None], t(pe)[None], torch.tensor([T]), K)


# --------------------------------------------------------------------------- the GHMM


@dataclass
class GHMMConfig:
    """What :meth:`GHMM.fit` estimates and how.

    Args:
        order: order of the coding, intron and intergenic Markov chains.
        smoothing: the chains' interpolation weight (pseudo-counts of the lower order).
        background_order: order of the background chain every ratio subtracts.
        signal_smoothing: the weight array models' pseudo-count weight.
        windows: per signal, a window ``(lo, hi)`` around its anchor overriding the default
            (see :data:`~.sensors.SIGNAL_NAMES`).
        length_kind: ``"empirical"`` (smoothed, per exon type and for introns) or ``"geometric"``.
        length_bandwidth: the empirical lengths' kernel bandwidth (log units).
        length_floor: weight of a uniform floor in the empirical lengths.
        max_duration: K.
        transition_smoothing: pseudo-count of every allowed move in the transition counts.
        stop_penalty: nats per in-frame stop codon inside an exon (finite: it enters as cumulative
            per-frame counts).
        five_prime_penalty: nats for an exon 5' end without its start / acceptor consensus.
        signal_contrast: ``"background"``: a site scores its window under the signal model against
            the background, so the window's bases also keep their content scores (the content
            models are not told about signals); ``"content"``: against the content models the
            window's bases are scored by on either side of the site, which makes the signal
            replace the content there, as a GHMM's signal states do.
        intron_tail: 0 (default): an intron longer than K is several intron segments joined by
            self moves, each scored by the length distribution (truncated at K) plus a split
            score, so a long intron pays per piece. E (``MIN_INTRON`` < E <= K; typically K): the
            intron length model is the empirical one below E and geometric from E on
            (``P(n) = P(n >= E) r (1 - r)^(n - E)``, ``1 / r`` the mean of n - E + 1 over the
            training introns of E bases or more), over :class:`~.labels.GeneGrammar` ``(intron_tail=E)``:
            a long intron scores ``log P(n)`` exactly, however K cuts it.
        signal_order: the signal models' order (:class:`~.sensors.WeightArrayModel`): 1 (default,
            the first-order WAM) or m > 1 (each window base depends on the m before it, interpolated
            down to first order); one for every signal or ``{name: order}`` (missing names: 1).
        intron_order, intergenic_order: the intron / intergenic chains' order; ``None`` (default):
            ``order`` (the coding chain's).
        long_intron_content: ``False`` (default): one intron chain. ``True`` (needs ``intron_tail``
            = E): the intron labels (introns shorter than E) read a chain fitted on the introns
            shorter than E, a long intron's tail and end pieces one fitted on the introns of E bases
            or more (:meth:`~.sensors.ContentSensors.fit` ``long_intron=E``).
        signal_split: ``False`` (default): one component per signal. ``True``: each signal's score
            is two components, ``"<signal>_up"`` (the window's bases before the site's anchor, on
            the strand it is read on: a splice site's exon side for donors, its intron side with the
            branch-point region for acceptors) and ``"<signal>"`` (the rest). With weight 1 each they
            sum to the unsplit score, so the GHMM is the same model; a
            :class:`~.feature_crf.FeatureCRF` over it learns the two weights apart.
        signal_bases: ``False`` (default). ``True``: :meth:`GHMM.features` also lists every
            candidate site of each signal (where its consensus is) with the bases of its window
            (:class:`SiteWindows`), so that a :class:`~.feature_crf.FeatureCRF` can learn a score
            per signal, window position and base (a discriminative position weight matrix added to
            the weight array model's score, as CRAIG's splice-site features). The GHMM itself does
            not change.
    """

    order: int = 5
    smoothing: float = 5.0
    background_order: int = 4
    signal_smoothing: float = 1.0
    windows: Optional[Dict[str, Tuple[int, int]]] = None
    length_kind: str = "empirical"
    length_bandwidth: float = 0.1
    length_floor: float = 1e-3
    max_duration: int = 960
    transition_smoothing: float = 0.5
    stop_penalty: float = 50.0
    five_prime_penalty: float = 1000.0
    signal_contrast: str = "background"
    intron_tail: int = 0
    signal_order: Union[int, Dict[str, int]] = 1
    intron_order: Optional[int] = None
    intergenic_order: Optional[int] = None
    long_intron_content: bool = False
    signal_split: bool = False
    signal_bases: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def _shift(x: np.ndarray, d: int) -> np.ndarray:
    """``y[t] = x[t + d]`` (0 / False outside)."""
    y = np.zeros_like(x)
    T = len(x)
    if d >= 0:
        y[:T - d] = x[d:] if d < T else y[:0]
    else:
        y[-d:] = x[:T + d] if -d < T else y[:0]
    return y


def _stop_tracks(codes: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(T,) float: 1 where a stop codon starts on the + strand (``codes[t:t+3]``), and where one
    starts on the - strand (``codes[t-2:t+1]`` is TTA, CTA or TCA; its first base is t)."""
    T = len(codes)
    plus, minus = np.zeros(T), np.zeros(T)
    if T < 3:
        return plus, minus
    c = codes.astype(np.int64)
    tri = c[:-2] * 25 + c[1:-1] * 5 + c[2:]
    num = lambda s: int(sum(int(encode_dna(b)[0]) * w for b, w in zip(s, (25, 5, 1))))  # noqa: E731
    plus[:-2] = np.isin(tri, [num(s) for s in _STOPS])
    minus[2:] = np.isin(tri, [num(s) for s in ("TTA", "CTA", "TCA")])
    return plus, minus


class GHMM:
    """A generalised HMM gene finder over :class:`~.labels.GeneGrammar`, fitted by counting.

    Attributes:
        config: the :class:`GHMMConfig`.
        grammar: the label set; ``K`` = ``config.max_duration``.
        content, signals: the fitted :class:`~.sensors.ContentSensors` / :class:`~.sensors.SignalSensors`.
        exon_lengths: ``{exon type: LengthDistribution}`` of exon-label segments (exons longer than
            K: their 3' piece); ``intron_length``; ``intergenic_length`` (geometric).
        log_transition: (C, C) log P(b | a) of the gold parses over allowed moves, label changes only
            (plus continuation-piece self moves); 0 elsewhere.
        log_initial, log_final: (C,) log P(first label), log P(last label).
    """

    def __init__(self, config: GHMMConfig, grammar: GeneGrammar, content: ContentSensors, signals: SignalSensors,
                 exon_lengths: Dict[str, LengthDistribution], intron_length: LengthDistribution,
                 intergenic_length: LengthDistribution, log_transition: np.ndarray, log_initial: np.ndarray,
                 log_final: np.ndarray):
        self.config, self.grammar = config, grammar
        self.K = int(config.max_duration)
        self.content, self.signals = content, signals
        self.exon_lengths, self.intron_length, self.intergenic_length = exon_lengths, intron_length, intergenic_length
        self.log_transition, self.log_initial, self.log_final = log_transition, log_initial, log_final
        self._static = self._static_parts()

    @property
    def components(self) -> Tuple[str, ...]:
        """The names of :meth:`features`' components: :data:`COMPONENTS`, then with
        ``config.signal_split`` the signals' ``"<signal>_up"`` parts."""
        split = tuple(f"{s}_up" for s in SIGNAL_NAMES) if self.config.signal_split else ()
        return COMPONENTS + split

    # ------------------------------------------------------------------ fitting

    @classmethod
    def fit(cls, records: Sequence[GenomicRecord], config: Optional[GHMMConfig] = None,
            grammar: Optional[GeneGrammar] = None) -> "GHMM":
        """Estimate every part from annotated records (their genes must follow the grammar)."""
        config = config or GHMMConfig()
        tail = int(config.intron_tail) or None
        if tail is not None and not MIN_INTRON < tail <= int(config.max_duration):
            raise ValueError(f"intron_tail must be in ({MIN_INTRON}, K = {config.max_duration}], got {tail}")
        grammar = grammar or GeneGrammar(intron_tail=tail)
        if grammar.intron_tail != tail:
            raise ValueError(f"the grammar's intron_tail ({grammar.intron_tail}) differs from the config's ({tail})")
        K, C = int(config.max_duration), grammar.num_labels
        if config.long_intron_content and tail is None:
            raise ValueError("long_intron_content needs intron_tail > 0 (the long introns' pieces read its chain)")
        content = ContentSensors.fit(records, config.order, config.smoothing, config.background_order,
                                     intron_order=config.intron_order, intergenic_order=config.intergenic_order,
                                     long_intron=tail if config.long_intron_content else None)
        signals = SignalSensors.fit(records, config.windows, config.signal_smoothing, config.signal_order)
        counts = np.zeros((C, C))
        first, last = np.zeros(C), np.zeros(C)
        exon_durs: Dict[str, List[int]] = {t: [] for t in ("single", "initial", "internal", "terminal")}
        intron_durs: List[int] = []
        inter_durs: List[int] = []
        for rec in records:
            # whole intergenic and intron runs (not yet cut at K); exons longer than K already pieces
            runs = grammar.runs(rec.genes, len(rec), K)
            for (s0, e0, a), (s1, e1, b) in zip(runs, runs[1:]):
                counts[a, b] += 1
            first[runs[0][2]] += 1
            last[runs[-1][2]] += 1
            for s, e, c in runs:
                lab = grammar.labels[c]
                if lab.kind == "exon":
                    exon_durs[lab.exon_type].append(e - s)
                elif lab.kind == "intron":
                    intron_durs.append(e - s)
                elif lab.kind == "intergenic":
                    inter_durs.append(e - s)
        allowed = grammar.allowed_transitions().numpy()
        # self moves of intergenic and intron labels belong to their length models (split runs)
        moves = allowed.copy()
        for c, lab in enumerate(grammar.labels):
            if lab.kind in ("intergenic", "intron"):
                moves[c, c] = False
        # the long-intron pieces (intron tails) are not counted: the gold runs above hold every
        # intron whole as its intron(p) label, and the pieces copy its moves below
        pieces = [c for c, lab in enumerate(grammar.labels) if lab.piece is not None]
        moves[pieces, :] = False
        moves[:, pieces] = False
        a = config.transition_smoothing
        counts = np.where(moves, counts + a, 0.0)
        rows = counts.sum(1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            log_tr = np.where(moves, np.log(counts / np.where(rows > 0, rows, 1.0)), 0.0)
        log_init = np.log((first + a) / (first + a).sum())
        log_final = np.log((last + a) / (last + a).sum())
        for c in pieces:
            # entering an intron is one event whatever its length (the length model splits short
            # from long); an end piece leaves as the intron label does; tail -> tail / end: 0
            lab = grammar.labels[c]
            base = grammar.index[f"{lab.strand}intron({lab.entry})"]
            into = allowed[:, c] & ~np.isin(np.arange(C), pieces)
            log_tr[into, c] = log_tr[into, base]
            if lab.piece == "end":
                log_tr[c, allowed[c]] = log_tr[base, allowed[c]]
            log_init[c], log_final[c] = log_init[base], log_final[base]
        kind, bw, fl = config.length_kind, config.length_bandwidth, config.length_floor
        exon_lengths = {t: LengthDistribution.fit(d or [MIN_EXON], kind, bw, fl) for t, d in exon_durs.items()}
        intron_length = LengthDistribution.fit(intron_durs or [100], kind, bw, fl)
        intergenic_length = LengthDistribution.fit(inter_durs or [1000], "geometric")
        return cls(config, grammar, content, signals, exon_lengths, intron_length, intergenic_length, log_tr,
                   log_init, log_final)

    # ------------------------------------------------------------------ sequence-independent parts

    def _static_parts(self) -> Dict[str, Component]:
        """Length, transition components and the static constraints (no sequence needed)."""
        g, K = self.grammar, self.K
        C = g.num_labels
        labels = g.labels
        mask = g.duration_mask(K).numpy().copy()
        k = np.arange(1, K + 1)
        K3 = 3 * (K // 3)
        # a continuation piece is K3 or K3 - 3 long, as GeneGrammar.runs cuts long exons, so that a
        # long exon has essentially one parse and short exons never use continuation pieces
        for c, lab in enumerate(labels):
            if lab.kind == "cont":
                mask[:, c] &= (k == K3) | (k == K3 - 3)

        # exon lengths: the type's distribution restricted to the label's allowed lengths
        dur_exon = np.zeros((K, C))
        lp_type = {t: d.log_pmf(K) for t, d in self.exon_lengths.items()}
        for c, lab in enumerate(labels):
            if lab.kind != "exon":
                continue
            lp = lp_type[lab.exon_type]
            ok = mask[:, c]
            dur_exon[ok, c] = lp[ok] - np.logaddexp.reduce(lp[ok])

        intron_cols = [c for c, lab in enumerate(labels) if lab.kind == "intron" and lab.piece is None]
        dur_intron = np.zeros((K, C))
        tr_intron = np.zeros((C, C))
        E = g.intron_tail
        if E is None:
            # introns: the whole intron's length distribution; a long intron is several pieces joined by
            # self moves whose score is the largest that never lets a split of an intron of length <= K
            # beat the unsplit intron (by induction also for more than two pieces)
            lpi = self.intron_length.log_pmf(K)
            dur_intron[:, intron_cols] = lpi[:, None]
            tau = self._split_score(lpi)
            for c in intron_cols:
                tr_intron[c, c] = tau
            self.intron_split_score = tau
        else:
            # intron tails: lengths < E empirical (mass P(n < E)), n >= E geometric: n - E one-base
            # tail pieces of log(1 - r) each and an end piece of E bases scoring log P(n >= E) + log r
            dur_intron[:E - 1, intron_cols] = self.intron_length.log_pmf(E - 1)[:, None]
            log_mass, r = self.intron_length.tail(E)
            for c, lab in enumerate(labels):
                if lab.piece == "tail":
                    dur_intron[0, c] = math.log1p(-r) if r < 1 else -np.inf
                elif lab.piece == "end":
                    dur_intron[E - 1, c] = log_mass + math.log(r)
            self.intron_split_score = 0.0

        # intergenic: geometric, exact for any split: D[k] = k log(1-q) + b, self move -b
        q = 1.0 / max(self.intergenic_length.mean, 1.0 + 1e-9)
        b = math.log(q) - math.log1p(-q)
        dur_inter = np.zeros((K, C))
        dur_inter[:, 0] = k * math.log1p(-q) + b
        tr_inter = np.zeros((C, C))
        tr_inter[0, 0] = -b

        allowed = g.allowed_transitions().numpy()
        cons = Component("constraints",
                         duration=np.where(mask, 0.0, -np.inf),
                         transition=np.where(allowed, 0.0, -np.inf))
        return {
            "length_exon": Component("length_exon", duration=dur_exon),
            "length_intron": Component("length_intron", duration=dur_intron, transition=tr_intron),
            "length_intergenic": Component("length_intergenic", duration=dur_inter, transition=tr_inter),
            "transition": Component("transition", transition=self.log_transition.copy()),
            "constraints": cons,
        }

    @staticmethod
    def _split_score(lp: np.ndarray) -> float:
        """``min over k1, k2 >= MIN_INTRON, k1 + k2 <= K of lp[k1+k2] - lp[k1] - lp[k2]`` (lp[k-1]: length k)."""
        K = len(lp)
        best = math.inf
        k2 = np.arange(MIN_INTRON, K + 1)
        # by symmetry k1 <= k2 suffices; blocks of k1 keep the (rows, K) temporaries small
        for a in range(MIN_INTRON, K // 2 + 1, 256):
            k1 = np.arange(a, min(a + 256, K // 2 + 1))[:, None]
            total = k1 + k2[None, :]
            ok = (k2[None, :] >= k1) & (total <= K)
            if ok.any():
                val = lp[np.minimum(total, K) - 1] - lp[k1 - 1] - lp[k2 - 1][None, :]
                best = min(best, float(val[ok].min()))
        return best if math.isfinite(best) else 0.0

    # ------------------------------------------------------------------ features of a sequence

    def features(self, sequence: Union[GenomicRecord, str, np.ndarray]) -> GHMMFeatures:
        """The feature components and constraints of one sequence (a record, a string or codes)."""
        if isinstance(sequence, GenomicRecord):
            sequence = sequence.sequence
        codes = encode_dna(sequence) if isinstance(sequence, str) else np.asarray(sequence)
        g, K = self.grammar, self.K
        C, T = g.num_labels, len(codes)
        labels = g.labels
        cfg = self.config
        content = self.content.scores(codes)
        sig = self.signals.scores(codes, content["background"])
        comps: Dict[str, Component] = {}

        def label_index(fn) -> np.ndarray:
            """(1, C): the column fn(label) reads (-1: none)."""
            return np.array([[fn(lab) for lab in labels]], dtype=np.int64)

        comps["content_intergenic"] = Component("content_intergenic", emission=[
            Term(content["intergenic"][:, None], label_index(lambda lab: 0 if lab.kind == "intergenic" else -1))])
        if "intron_long+" in content:
            # introns shorter than E (intron labels) and long introns' pieces read their own chains
            comps["content_intron"] = Component("content_intron", emission=[
                Term(np.stack([content["intron+"], content["intron-"], content["intron_long+"],
                               content["intron_long-"]], 1),
                     label_index(lambda lab: -1 if lab.kind != "intron" else
                                 (0 if lab.strand == "+" else 1) + (2 if lab.piece is not None else 0)))])
        else:
            comps["content_intron"] = Component("content_intron", emission=[
                Term(np.stack([content["intron+"], content["intron-"]], 1),
                     label_index(lambda lab: -1 if lab.kind != "intron" else (0 if lab.strand == "+" else 1)))])
        comps["content_coding"] = self._frame_component("content_coding", content["coding+"], content["coding-"])

        # in-frame stop codons: -P at the codon's first base as codon position 0, per strand
        P = float(cfg.stop_penalty)
        sp, sm = _stop_tracks(codes)
        qp, qm = np.zeros((T, 3)), np.zeros((T, 3))
        qp[:, 0], qm[:, 0] = -P * sp, -P * sm
        stop = self._frame_component("inframe_stop", qp, qm)
        # a stop codon whose first base is within two bases of an exon's 3' end runs past the exon:
        # not a codon of this exon, so take its penalty back (see GeneGrammar.frame_tables)
        ft = {n: v.numpy() for n, v in g.frame_tables().items()}
        stop.proj_end.append(Term(np.stack([P * sp, P * _shift(sp, -1)], 1),
                                  np.where(ft["stop_end"] >= 0, ft["stop_end"], -1)[None]))
        stop.proj_start.append(Term(np.stack([P * sm, P * _shift(sm, 1)], 1),
                                    np.where(ft["stop_start"] >= 0, ft["stop_start"], -1)[None]))
        comps["inframe_stop"] = stop

        # signals at the grammar's positions (the 8 tracks of records.SIGNALS): a + exon ending at e
        # is followed by its donor / stop at e + 1; a - exon starting at s is preceded by its donor /
        # stop (read on the - strand) at s - 1; 5' signals sit at the exon's first base
        shift = {"start+": 0, "acceptor+": 0, "donor+": 1, "stop+": 1, "start-": 0, "acceptor-": 0,
                 "donor-": -1, "stop-": -1}
        ok = {name: _shift(sig[name + "_ok"], shift[name]) for name in SIGNALS}
        replaced = self._replaced_content(content, T)
        st = {n: v.numpy() for n, v in g.signal_tables().items()}
        windows = {} if cfg.signal_bases else None
        for sname in ("donor", "acceptor", "start", "stop"):
            if windows is not None:
                windows[sname] = self._site_windows(sname, codes, ok, shift, st)
            cols, ups = [], []
            for strand in "+-":
                name = sname + strand
                base = _shift(sig[name], shift[name])
                if cfg.signal_split:
                    up = _shift(sig[name + "_up"], shift[name])
                    base = base - up
                    ups += [np.where(ok[name], up, 0.0)] * 3  # the same for the exon's three phases
                for v in range(3):
                    val = base - _shift(replaced[name][v], shift[name])
                    cols.append(np.where(ok[name], val, 0.0))
            comps[sname] = self._signal_component(sname, np.stack(cols, 1), st)
            if cfg.signal_split:
                comps[sname + "_up"] = self._signal_component(sname, np.stack(ups, 1), st, sname + "_up")
        comps.update({n: self._static[n] for n in ("length_exon", "length_intron", "length_intergenic", "transition")})
        first = np.zeros((T, 1))
        last = np.zeros((T, 1))
        if T:
            first[0, 0] = last[T - 1, 0] = 1.0
        zeros = np.zeros((1, C), dtype=np.int64)
        comps["ends"] = Component("ends", proj_start=[Term(first, zeros, self.log_initial.copy())],
                                  proj_end=[Term(last, zeros, self.log_final.copy())])

        cons = self._static["constraints"]
        constraints = Component("constraints", duration=cons.duration, transition=cons.transition)
        # 3' ends: -inf without the donor / stop consensus (only exon labels check them: the exon
        # label always holds its exon's 3' end)
        three = [n for n in SIGNALS if n.startswith(("donor", "stop"))]
        five = [n for n in SIGNALS if n.startswith(("start", "acceptor"))]
        bad3 = np.stack([np.where(ok[n], 0.0, -np.inf) for n in three], 1)
        # 5' ends: a finite penalty, taken back by a continuation piece (so it cancels exactly)
        miss5 = np.stack([(~ok[n]).astype(float) for n in five], 1)
        P5 = float(cfg.five_prime_penalty)
        col3 = {SIGNALS.index(n): i for i, n in enumerate(three)}
        col5 = {SIGNALS.index(n): i for i, n in enumerate(five)}
        for part, kind, bonus, d in (("proj_start", "ps_kind", "ps_bonus_kind", -1),
                                     ("proj_end", "pe_kind", "pe_bonus_kind", 1)):
            idx3 = np.array([[col3.get(int(v), -1) for v in st[kind]]])
            idx5 = np.array([[col5.get(int(v), -1) for v in st[kind]]])
            idxb = np.array([[col5.get(int(v), -1) for v in st[bonus]]])
            shifted = np.stack([_shift(miss5[:, i], d) for i in range(len(five))], 1)
            getattr(constraints, part).extend([
                Term(bad3, idx3),
                Term(miss5, idx5, np.full(C, -P5)),
                Term(shifted, idxb, np.full(C, P5)),
            ])
        tails = [c for c, lab in enumerate(labels) if lab.piece == "tail"]
        if tails and T:
            # intron tails: the sequence may not end in a tail piece, whose per-base score would
            # leave out the end piece's log P(n >= E) + log r; an intron that runs off the end ends
            # with its end piece (or is an intron label), as every segment at the edge ends there
            last_inf = np.zeros((T, 1))
            last_inf[T - 1, 0] = -np.inf
            constraints.proj_end.append(Term(last_inf, np.array([[0 if c in tails else -1 for c in range(C)]])))
        return GHMMFeatures(T, K, C, comps, constraints, windows)

    def _frame_component(self, name: str, q_plus: np.ndarray, q_minus: np.ndarray) -> Component:
        """Per-base scores by codon position ((T, 3) per strand) of coding segments in their frame.

        The mean over the three codon positions is an emission of the strand's coding labels; the
        rest (zero-sum per position) is summed per frame: ``F_r(t)`` is the score of base t when
        codon position 0 sits at positions = r (mod 3) (+ strand; on the - strand codon positions
        run right to left), ``G = cumsum F`` and a coding segment s..e of frame r gets
        ``G_r[e+1] - G_r[s]`` as ``proj_start`` / ``proj_end`` terms (:meth:`GeneGrammar.frame_tables`).
        """
        g = self.grammar
        T = q_plus.shape[0]
        mp, mm = q_plus.mean(1), q_minus.mean(1)
        rp, rm = q_plus - mp[:, None], q_minus - mm[:, None]
        t = np.arange(T)
        F = np.empty((T, 6))
        for r in range(3):
            F[:, r] = rp[t, (t - r) % 3]
            F[:, 3 + r] = rm[t, (r - t) % 3]
        G = np.zeros((T + 1, 6))
        np.cumsum(F, axis=0, out=G[1:])
        ft = {n: v.numpy() for n, v in g.frame_tables().items()}
        coding = ft["strand"] >= 0
        base = 3 * np.maximum(ft["strand"], 0)
        p = np.arange(3)[:, None]
        idx_s = np.where(coding[None], base[None] + (p + ft["start_off"][None]) % 3, -1)
        idx_e = np.where(coding[None], base[None] + (p + ft["end_off"][None]) % 3, -1)
        emis_idx = np.where(coding, ft["strand"], -1)[None]
        return Component(name, emission=[Term(np.stack([mp, mm], 1), emis_idx)],
                         proj_start=[Term(-G[:T], idx_s)], proj_end=[Term(G[1:], idx_e)])

    def _replaced_content(self, content: Dict[str, np.ndarray], T: int) -> Dict[str, List[np.ndarray]]:
        """Per signal and strand, the content log-likelihood ratio of the signal's window under the
        content models it replaces (``signal_contrast="content"``), per anchor (record
        coordinates) and per reading-frame phase of the exon at the site: ``{"donor+": [3 x (T,)]}``.

        A site's window covers the exon's bases next to the boundary (codon positions given by the
        phase: the exit phase for donor / stop, the entry phase for acceptor / start) and intron
        (donor, acceptor) or intergenic (start, stop) bases on the other side. Subtracting them
        turns the weight array model's ratio against the background into a ratio against the
        content it replaces, as a GHMM's signal states emit their window instead of the content
        states; without it every site would count its window's bases twice.
        """
        out: Dict[str, List[np.ndarray]] = {}
        zero = [np.zeros(T) for _ in range(3)]
        for sname, model in self.signals.models.items():
            for strand in "+-":
                if self.config.signal_contrast == "background":
                    out[sname + strand] = zero
                    continue
                # reading coordinates: the - strand's arrays reversed
                rev = (lambda x: x) if strand == "+" else (lambda x: x[::-1])
                cod = rev(content["coding" + strand])
                other = rev(content["intron" + strand] if sname in ("donor", "acceptor") else content["intergenic"])
                coding_left = sname in ("donor", "stop")
                lo, hi = model.lo, model.hi
                nc = np.zeros(T)
                for o in (range(0, hi) if coding_left else range(lo, 0)):
                    nc += _shift(other, o)
                variants = []
                for v in range(3):
                    acc = nc.copy()
                    for o in (range(lo, 0) if coding_left else range(0, hi)):
                        acc += _shift(cod[:, (v + o) % 3], o)
                    variants.append(rev(acc).copy())
                out[sname + strand] = variants
        return out

    def _signal_component(self, sname: str, vals: np.ndarray, st: Dict[str, np.ndarray],
                          name: Optional[str] = None) -> Component:
        """One signal's scores at exon boundaries, with the continuation pieces' take-back, as the
        component ``name`` (default ``sname``).

        ``vals`` (T, 6): the signal's score at the grammar's positions for the + strand with the
        exon's phase 0, 1, 2 (columns 0-2) and the - strand (3-5); the phase is the exit phase for
        a 3' signal (donor, stop) and the entry phase for a 5' signal (acceptor, start).
        """
        labels = self.grammar.labels
        C = len(labels)
        kinds = {SIGNALS.index(sname + "+"): 0, SIGNALS.index(sname + "-"): 3}
        three = sname in ("donor", "stop")

        def column(c: int, kind: int) -> int:
            if int(kind) not in kinds:
                return -1
            lab = labels[c]
            return kinds[int(kind)] + (lab.exit if three else lab.entry)

        comp = Component(name or sname)
        for part, kind, bonus, d in (("proj_start", "ps_kind", "ps_bonus_kind", -1),
                                     ("proj_end", "pe_kind", "pe_bonus_kind", 1)):
            idx = np.array([[column(c, st[kind][c]) for c in range(C)]])
            idxb = np.array([[column(c, st[bonus][c]) for c in range(C)]])
            if (idx >= 0).any():
                getattr(comp, part).append(Term(vals, idx))
            if (idxb >= 0).any():
                # the check of the piece that starts at e + 1 (+ strand) / ends at s - 1 (- strand)
                shifted = np.stack([_shift(vals[:, i], d) for i in range(vals.shape[1])], 1)
                getattr(comp, part).append(Term(shifted, idxb, np.full(C, -1.0)))
        return comp

    def _site_windows(self, sname: str, codes: np.ndarray, ok: Dict[str, np.ndarray], shift: Dict[str, int],
                      st: Dict[str, np.ndarray]) -> SiteWindows:
        """The candidate sites of one signal (``ok``: where its consensus is, at the grammar's
        positions, i.e. shifted by ``shift`` from the anchors) and their windows' bases."""
        model = self.signals.models[sname]
        T = len(codes)
        rc = reverse_complement(codes)
        ids = np.zeros((T, 6))
        rows = []
        for k, strand in enumerate("+-"):
            name = sname + strand
            pos = np.flatnonzero(ok[name])
            anchors = pos + shift[name]  # record coordinates (ok[name][t] = consensus at t + shift)
            # on the - strand the window is read right to left: anchor T-1-a of the reverse complement
            rows.append(model.site_windows(codes if strand == "+" else rc,
                                           anchors if strand == "+" else T - 1 - anchors))
            first = sum(len(r) for r in rows[:-1]) + 1
            ids[pos, 3 * k:3 * k + 3] = (first + np.arange(len(pos), dtype=np.float64))[:, None]
        codes_out = np.concatenate(rows).astype(np.int8) if rows else np.zeros((0, model.width), np.int8)
        return SiteWindows(self._signal_component(sname, ids, st, sname + "_sites"), codes_out)

    # ------------------------------------------------------------------ decoding

    def decode_segments(self, sequence: Union[GenomicRecord, str, np.ndarray],
                        weights: Optional[Mapping[str, float]] = None) -> Tuple[List[Tuple[int, int, int]], float]:
        """The Viterbi segmentation ``[(start, end, label)]`` of one sequence and its score."""
        from torch_semimarkov import semi_crf_streaming_viterbi

        inp = assemble(self.features(sequence), weights)
        out = semi_crf_streaming_viterbi(inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, inp.K,
                                         proj_start=inp.proj_start, proj_end=inp.proj_end, backend="numba")
        segs = list(zip(out.segment_starts.tolist(), out.segment_ends.tolist(), out.segment_labels.tolist()))
        return segs, float(out.scores[0])

    def predict_genes(self, sequence: Union[GenomicRecord, str, np.ndarray],
                      weights: Optional[Mapping[str, float]] = None) -> List[Gene]:
        """Genes of the Viterbi segmentation (:meth:`GeneGrammar.decode`)."""
        segs, _ = self.decode_segments(sequence, weights)
        return self.grammar.decode(segs)

    def predict(self, records: Sequence[GenomicRecord],
                weights: Optional[Mapping[str, float]] = None) -> Dict[str, List[Gene]]:
        """``{record name: [Gene, ...]}`` for whole records, in their order."""
        return {r.name: self.predict_genes(r, weights) for r in records}
