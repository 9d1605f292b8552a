"""Generative gene-finding sensors: content, signal and length models estimated from annotated loci.

These are the parts of a generalised HMM (GHMM) gene finder such as GENSCAN or AUGUSTUS, fitted by
counting on training :class:`~.records.GenomicRecord` s (seconds for the 486 tutorial loci), and
scored on any DNA as per-position **log-likelihood ratios against one background model**, so that
per-position values stay small. :mod:`.ghmm` turns them into the semi-CRF engine's inputs over
:class:`~.labels.GeneGrammar`, one named feature component per model.

* **Content sensors** (:class:`MarkovChain`, :class:`ContentSensors`): interpolated Markov chains of
  a given order; coding sequence with one chain per codon position (3-periodic), intron and
  intergenic sequence; a homogeneous background chain of both strands. The minus strand is scored
  by reverse complementing the sequence.
* **Signal sensors** (:class:`WeightArrayModel`, :class:`SignalSensors`): first-order (or, with
  ``order``, higher-order interpolated) position-specific models (weight array models, WAM) of a
  window around splice donors, splice acceptors (with a branch-point region upstream), start codons
  and stop codons, on either strand.
* **Length models** (:class:`LengthDistribution`): smoothed empirical distributions (a kernel
  density estimate on log length) or geometric ones.

Conventions: base codes as :func:`~.records.encode_dna` (A, C, G, T = 0..3, anything else 4); an
unknown base has probability 1/4 under every model, so its log-likelihood ratio is 0. A *reading*
is a sequence of codes on one strand, 5' to 3': the + strand reading is the record's sequence, the
- strand reading its reverse complement, whose position ``u`` is the record's position ``L-1-u``.

Example:
    >>> from torch_semimarkov.genomics.records import encode_dna
    >>> chain = MarkovChain(order=1).fit([(encode_dna("ACACACAC"), None)])
    >>> p = np.exp(chain.tables[1][0])       # (contexts, bases): P(base | previous base)
    >>> bool(np.allclose(p.sum(-1), 1)), bool(p[0, 1] > 0.5)   # after A, mostly C
    (True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from torch_semimarkov.genomics.records import UNKNOWN, GenomicRecord, encode_dna

__all__ = [
    "reverse_complement",
    "Reading",
    "readings",
    "MarkovChain",
    "ContentSensors",
    "WeightArrayModel",
    "SignalSensors",
    "SIGNAL_NAMES",
    "LengthDistribution",
]

_COMPLEMENT = np.array([3, 2, 1, 0, UNKNOWN], dtype=np.uint8)


def reverse_complement(codes: np.ndarray) -> np.ndarray:
    """(L,) codes -> (L,) codes of the reverse complement (unknown bases stay unknown).

    Example:
        >>> reverse_complement(encode_dna("AACGN")).tolist()     # NCGTT
        [4, 1, 2, 3, 3]
    """
    c = np.asarray(codes)
    return _COMPLEMENT[np.minimum(c, UNKNOWN)][::-1].copy()


# --------------------------------------------------------------------------- annotations per strand


@dataclass
class Reading:
    """One strand of an annotated record, 5' to 3', with what each position is on that strand.

    Attributes:
        codes: (L,) uint8 base codes of the reading.
        codon_pos: (L,) int8: codon position (0, 1, 2) of a coding base of a gene on this strand,
            else -1.
        intron: (L,) bool: intron of a gene on this strand.
        intergenic: (L,) bool: outside every gene's span (either strand); UTRs and the stop codon
            after a CDS are intergenic, as in :class:`~.labels.GeneGrammar`.
        genes: the genes on this strand as exon lists in reading coordinates (ascending, which is
            transcript order), ``[[(start, end), ...], ...]``, end exclusive.
    """

    codes: np.ndarray
    codon_pos: np.ndarray
    intron: np.ndarray
    intergenic: np.ndarray
    genes: List[List[Tuple[int, int]]]


def readings(record: GenomicRecord) -> Tuple[Reading, Reading]:
    """The + and - strand :class:`Reading` of an annotated record.

    Example:
        >>> from torch_semimarkov.genomics.records import Exon, Gene
        >>> rec = GenomicRecord("r", "CCATGAAATAGCC", [Gene("g", "-", (Exon(2, 8),))])
        >>> plus, minus = readings(rec)
        >>> minus.genes, minus.codon_pos[5:11].tolist()    # on the - strand the gene reads 5..10
        ([[(5, 11)]], [0, 1, 2, 0, 1, 2])
    """
    codes = encode_dna(record.sequence)
    L = len(codes)
    intergenic = np.ones(L, dtype=bool)
    for g in record.genes:
        intergenic[g.start:g.end] = False
    out = []
    for strand in ("+", "-"):
        cp = np.full(L, -1, dtype=np.int8)
        intron = np.zeros(L, dtype=bool)
        genes = []
        for g in record.genes:
            if g.strand != strand:
                continue
            phases = g.entry_phases()
            exons = []
            for ex, i in zip(g.exons, phases):
                a, b = (ex.start, ex.end) if strand == "+" else (L - ex.end, L - ex.start)
                cp[a:b] = (i + np.arange(b - a)) % 3
                exons.append((a, b))
            exons.sort()
            for (a0, b0), (a1, b1) in zip(exons, exons[1:]):
                intron[b0:a1] = True
            genes.append(exons)
        if strand == "+":
            out.append(Reading(codes, cp, intron, intergenic.copy(), genes))
        else:
            out.append(Reading(reverse_complement(codes), cp, intron, intergenic[::-1].copy(), genes))
    return out[0], out[1]


def _long_intron_mask(reading: Reading, min_length: int) -> np.ndarray:
    """(L,) bool: bases of the reading's introns of ``min_length`` bases or more."""
    out = np.zeros(len(reading.codes), dtype=bool)
    for exons in reading.genes:
        for (a0, b0), (a1, b1) in zip(exons, exons[1:]):
            if a1 - b0 >= min_length:
                out[b0:a1] = True
    return out


# --------------------------------------------------------------------------- Markov chains


def _context_order(codes: np.ndarray, order: int) -> np.ndarray:
    """(L,) int: how many known bases directly precede each position, capped at ``order``."""
    L = len(codes)
    pos = np.arange(L)
    # the last unknown base at or before each position (-1: none)
    last_bad = np.maximum.accumulate(np.where(codes >= UNKNOWN, pos, -1)) if L else pos
    before = np.concatenate([[-1], last_bad[:-1]]) if L else pos
    return np.minimum(order, pos - 1 - before)


def _context_index(codes: np.ndarray, k: int) -> np.ndarray:
    """(L,) int64: the k bases before each position as a base-4 number, oldest base the highest
    digit (so dropping the oldest base is ``index % 4**(k-1)``); meaningless where fewer than k
    known bases precede the position."""
    c = np.minimum(codes, 3).astype(np.int64)
    L = len(c)
    idx = np.zeros(L, dtype=np.int64)
    for i in range(1, k + 1):
        # base t - i is digit i - 1 (weight 4**(i-1)): the nearest base is the lowest digit
        shifted = np.zeros(L, dtype=np.int64)
        shifted[i:] = c[:L - i] if i < L else shifted[i:]
        idx += shifted * 4 ** (i - 1)
    return idx


class MarkovChain:
    """An interpolated Markov chain over A, C, G, T with ``period`` classes (e.g. codon positions).

    ``P_k(x | w)`` for a context ``w`` of k bases interpolates with the chain of order k - 1
    (the context without its oldest base) by a Dirichlet prior of weight ``smoothing``:
    ``P_k(x | w) = (n(w x) + smoothing * P_{k-1}(x | w')) / (n(w) + smoothing)``, down to
    ``P_{-1} = 1/4``; every ``P_k(. | w)`` sums to 1. A position with fewer than ``order`` known
    bases before it (the sequence's start, an unknown base) uses the longest context it has.

    Args:
        order: the context length m (0: base composition only).
        smoothing: weight of the lower-order estimate, in pseudo-counts.
        period: number of classes; each class has its own counts (3 for codon positions).

    Attributes:
        tables: after :meth:`fit`, for k = 0..order, (period, 4**k, 4) float64 log P_k(x | w).
    """

    def __init__(self, order: int = 5, smoothing: float = 5.0, period: int = 1):
        if order < 0 or period < 1 or smoothing <= 0:
            raise ValueError(f"need order >= 0, period >= 1, smoothing > 0; got {order}, {period}, {smoothing}")
        self.order, self.smoothing, self.period = int(order), float(smoothing), int(period)
        self.counts = [np.zeros((self.period, 4 ** k, 4)) for k in range(self.order + 1)]
        self.tables: List[np.ndarray] = []

    def fit(self, data: Iterable[Tuple[np.ndarray, Optional[np.ndarray]]]) -> "MarkovChain":
        """Count ``(codes, classes)`` pairs and build the tables; returns ``self``.

        ``classes``: (L,) int, the class of each position (``-1``: not counted), or ``None`` for
        class 0 everywhere. Contexts may reach outside the counted positions (e.g. an exon's first
        bases are read after intron bases), as they do when a sequence is scored.
        """
        for codes, classes in data:
            codes = np.asarray(codes)
            cls = np.zeros(len(codes), dtype=np.int64) if classes is None else np.asarray(classes, dtype=np.int64)
            avail = _context_order(codes, self.order)
            use = (cls >= 0) & (codes < UNKNOWN)
            x = np.minimum(codes, 3).astype(np.int64)
            for k in range(self.order + 1):
                sel = use & (avail >= k)
                if not sel.any():
                    continue
                flat = (cls[sel] * 4 ** k + _context_index(codes, k)[sel]) * 4 + x[sel]
                self.counts[k] += np.bincount(flat, minlength=self.period * 4 ** k * 4).reshape(self.period, 4 ** k, 4)
        self._build()
        return self

    def _build(self) -> None:
        lam = self.smoothing
        lower = np.full((self.period, 1, 4), 0.25)
        tables = []
        for k in range(self.order + 1):
            n = self.counts[k]
            # the context without its oldest base: index % 4**(k-1) (order 0: the uniform prior)
            back = lower[:, np.arange(4 ** k) % max(1, 4 ** (k - 1))] if k > 0 else lower
            p = (n + lam * back) / (n.sum(-1, keepdims=True) + lam)
            tables.append(np.log(p))
            lower = p
        self.tables = tables

    def log_probs(self, codes: np.ndarray) -> np.ndarray:
        """(L, period) float64: ``log P(x_t | context, class)`` for every class at every position.

        An unknown base gets log(1/4).
        """
        if not self.tables:
            raise RuntimeError("fit the chain first")
        codes = np.asarray(codes)
        L = len(codes)
        avail = _context_order(codes, self.order)
        x = np.minimum(codes, 3).astype(np.int64)
        out = np.empty((L, self.period))
        for k in range(self.order, -1, -1):
            sel = avail == k if k < self.order else avail >= k
            if not sel.any():
                continue
            ctx = _context_index(codes, k)[sel]
            out[sel] = self.tables[k][:, ctx, x[sel]].T
        out[codes >= UNKNOWN] = math.log(0.25)
        return out


# --------------------------------------------------------------------------- content sensors


@dataclass
class ContentSensors:
    """Coding, intron, intergenic and background Markov chains, fitted on both strands.

    Attributes:
        coding: 3-periodic chain (class = codon position of the predicted base).
        intron, intergenic: homogeneous chains of intron / intergenic bases (intergenic: both strands).
        background: homogeneous chain of every base of both strands; the per-position background
            is the mean of its + strand and - strand log-probabilities, one value per position that
            every model's ratio subtracts.
    """

    coding: MarkovChain
    intron: MarkovChain
    intergenic: MarkovChain
    background: MarkovChain
    intron_long: Optional[MarkovChain] = None

    @classmethod
    def fit(cls, records: Sequence[GenomicRecord], order: int = 5, smoothing: float = 5.0,
            background_order: int = 4, intron_order: Optional[int] = None,
            intergenic_order: Optional[int] = None, long_intron: Optional[int] = None) -> "ContentSensors":
        """Fit every chain on annotated records (orders default to ``order``).

        ``long_intron`` = E: two intron chains, ``intron`` on the bases of introns shorter than E
        and ``intron_long`` on those of introns of E bases or more (``None``: one chain of all).
        """
        reads = [r for rec in records for r in readings(rec)]
        io = order if intron_order is None else intron_order
        go = order if intergenic_order is None else intergenic_order
        coding = MarkovChain(order, smoothing, period=3).fit((r.codes, r.codon_pos) for r in reads)
        bg = MarkovChain(background_order, smoothing).fit((r.codes, None) for r in reads)
        inter = MarkovChain(go, smoothing).fit((r.codes, np.where(r.intergenic, 0, -1)) for r in reads)
        if long_intron is None:
            intron = MarkovChain(io, smoothing).fit((r.codes, np.where(r.intron, 0, -1)) for r in reads)
            return cls(coding, intron, inter, bg)
        longs = [_long_intron_mask(r, int(long_intron)) for r in reads]
        intron = MarkovChain(io, smoothing).fit((r.codes, np.where(r.intron & ~m, 0, -1)) for r, m in zip(reads, longs))
        intron_long = MarkovChain(io, smoothing).fit((r.codes, np.where(m, 0, -1)) for r, m in zip(reads, longs))
        return cls(coding, intron, inter, bg, intron_long)

    def scores(self, codes: np.ndarray) -> Dict[str, np.ndarray]:
        """Per-position log-likelihood ratios of a record's codes (record coordinates).

        Returns, float64:

        * ``"background"`` (L,): the background log-probability every ratio below subtracts;
        * ``"coding+"`` / ``"coding-"`` (L, 3): base t as codon position p of a gene on the + / -
          strand (the - strand reads the reverse complement, right to left);
        * ``"intron+"`` / ``"intron-"`` (L,): base t in an intron of a + / - strand gene;
        * ``"intergenic"`` (L,): base t intergenic (read on the + strand);
        * with ``intron_long``: ``"intron_long+"`` / ``"intron_long-"`` (L,): base t in a long intron.
        """
        codes = np.asarray(codes)
        rc = reverse_complement(codes)
        bg = 0.5 * (self.background.log_probs(codes)[:, 0] + self.background.log_probs(rc)[::-1, 0])
        return {
            "background": bg,
            "coding+": self.coding.log_probs(codes) - bg[:, None],
            "coding-": self.coding.log_probs(rc)[::-1] - bg[:, None],
            "intron+": self.intron.log_probs(codes)[:, 0] - bg,
            "intron-": self.intron.log_probs(rc)[::-1, 0] - bg,
            "intergenic": self.intergenic.log_probs(codes)[:, 0] - bg,
            **({} if self.intron_long is None else {
                "intron_long+": self.intron_long.log_probs(codes)[:, 0] - bg,
                "intron_long-": self.intron_long.log_probs(rc)[::-1, 0] - bg}),
        }


# --------------------------------------------------------------------------- signal sensors


class WeightArrayModel:
    """A first-order position-specific model (weight array model) of a window around a site.

    The window covers offsets ``lo .. hi-1`` from the site's *anchor* base (on the strand the site
    is read on). ``P(window) = p_0(x_0) * prod_{i>0} p_i(x_i | x_{i-1})``, with
    ``p_i(x | y) = (n_i(y, x) + smoothing * p_i(x)) / (n_i(y) + smoothing)`` and the position's
    base composition ``p_i(x) = (n_i(x) + 1) / (n + 4)``. The consensus (e.g. GT at offsets 0, 1
    of a donor) is given separately: sites are scored everywhere and :meth:`consensus` says where
    the consensus is.

    With ``order`` m > 1 the model is an inhomogeneous Markov chain of order m (an m-th order WAM,
    as in the splice models of GeneSplicer / AUGUSTUS): position i depends on the
    ``min(m, i)`` bases before it, each order interpolated with the one below as the chains of
    :class:`MarkovChain` are, ``p_i(x | w) = (n_i(w x) + smoothing * p_i(x | w')) / (n_i(w) + smoothing)``
    (``w'``: ``w`` without its oldest base) down to the first-order terms above; a base after an
    unknown one uses the longest known context. ``order=1`` is the first-order model exactly.

    Args:
        lo, hi: the window's offsets from the anchor (``lo <= 0 < hi``).
        consensus_offset: offset of the consensus's first base from the anchor.
        patterns: accepted consensus strings (e.g. ``("GT", "GC")``).
        smoothing: pseudo-count weight of the position's composition in the first-order terms (and
            of the order below in higher-order terms).
        order: how many preceding window bases each position depends on (>= 1).

    Example:
        >>> wam = WeightArrayModel(-2, 4, 0, ("GT",))
        >>> wins = np.stack([encode_dna(s) for s in ["AGGTAA", "CAGTAA", "AGGTGA", "AAGTAA"]])
        >>> _ = wam.fit(wins)
        >>> lp = wam.window_log_probs(encode_dna("CCAGGTAAGTAACC"))   # anchors 4 (AG|GTAA) and 8 (GT|AACC)
        >>> bool(lp[4] > lp[8]), wam.consensus(encode_dna("CCAGGTAAGTAACC")).nonzero()[0].tolist()
        (True, [4, 8])
    """

    def __init__(self, lo: int, hi: int, consensus_offset: int, patterns: Sequence[str], smoothing: float = 1.0,
                 order: int = 1):
        if not lo <= 0 < hi:
            raise ValueError(f"the window must contain its anchor: lo <= 0 < hi, got {lo}, {hi}")
        if int(order) < 1:
            raise ValueError(f"order must be >= 1, got {order}")
        self.lo, self.hi, self.width = int(lo), int(hi), int(hi - lo)
        self.consensus_offset = int(consensus_offset)
        self.patterns = tuple(patterns)
        self.smoothing = float(smoothing)
        self.order = int(order)
        self.num_sites = 0
        self.first = np.zeros(4)  # log p_0(x)
        self.cond = np.zeros((self.width, 4, 4))  # log p_i(x | y) [i, y, x]; row 0 unused
        self.marginal = np.zeros((self.width, 4))  # log p_i(x), for a base after an unknown one
        # order > 1: higher[i][k] (4**k, 4) log p_i(x | k previous bases) for k = 2..min(order, i),
        # context as in _context_index (nearest base the lowest digit)
        self.higher: List[Dict[int, np.ndarray]] = [{} for _ in range(self.width)]

    def fit(self, windows: np.ndarray) -> "WeightArrayModel":
        """Estimate from (N, width) code windows of true sites; windows with unknown bases are skipped."""
        w = np.asarray(windows).reshape(-1, self.width)
        w = w[(w < UNKNOWN).all(1)].astype(np.int64)
        n = len(w)
        self.num_sites = n
        comp = np.stack([np.bincount(w[:, i], minlength=4) for i in range(self.width)]).astype(float)
        p = (comp + 1.0) / (n + 4.0)
        self.marginal = np.log(p)
        self.first = self.marginal[0].copy()
        for i in range(1, self.width):
            pair = np.bincount(w[:, i - 1] * 4 + w[:, i], minlength=16).reshape(4, 4).astype(float)
            cond = (pair + self.smoothing * p[i][None, :]) / (pair.sum(1, keepdims=True) + self.smoothing)
            self.cond[i] = np.log(cond)
            lower = cond
            for k in range(2, min(self.order, i) + 1):
                ctx = np.zeros(n, dtype=np.int64)
                for j in range(1, k + 1):
                    ctx += w[:, i - j] * 4 ** (j - 1)
                cnt = np.bincount(ctx * 4 + w[:, i], minlength=4 ** k * 4).reshape(4 ** k, 4).astype(float)
                back = lower[np.arange(4 ** k) % 4 ** (k - 1)]
                pk = (cnt + self.smoothing * back) / (cnt.sum(1, keepdims=True) + self.smoothing)
                self.higher[i][k] = np.log(pk)
                lower = pk
        return self

    def _window(self, codes: np.ndarray, offset: int) -> np.ndarray:
        """(L,) codes at anchor + offset for every anchor (unknown outside the sequence)."""
        L = len(codes)
        out = np.full(L, UNKNOWN, dtype=np.int64)
        a, b = max(0, -offset), min(L, L - offset)
        if b > a:
            out[a:b] = codes[a + offset:b + offset]
        return out

    def window_log_probs(self, codes: np.ndarray, background: Optional[np.ndarray] = None,
                         split: bool = False):
        """(L,) float64: for a site anchored at each position, ``log P(window)`` (minus the background
        log-probabilities of the window's bases when ``background`` (L,) is given: a log-likelihood
        ratio). Unknown bases and bases outside the sequence contribute 0 to the ratio (and log 1/4
        to the plain log-probability).

        ``split=True``: ``(upstream, rest)``, the terms of the window's bases before the anchor
        (offsets ``lo .. -1``) and those from the anchor on (``0 .. hi-1``), whose sum is the
        unsplit value.

        Example:
            >>> wam = WeightArrayModel(-2, 3, 0, ("GT",)).fit(encode_dna("AAGTAAAGTA").reshape(2, 5))
            >>> up, rest = wam.window_log_probs(encode_dna("CAAGTAC"), split=True)
            >>> bool(np.allclose(up + rest, wam.window_log_probs(encode_dna("CAAGTAC"))))
            True
        """
        codes = np.asarray(codes)
        L = len(codes)
        if background is not None and len(background) != L:
            raise ValueError(f"background has {len(background)} positions, the sequence {L}")
        total = np.zeros(L)
        upstream = np.zeros(L)
        prev = None
        for i in range(self.width):
            off = self.lo + i
            x = self._window(codes, off)
            known = x < UNKNOWN
            xc = np.minimum(x, 3)
            if i == 0:
                term = self.first[xc]
            else:
                # after an unknown base: the position's composition
                term = np.where(prev < UNKNOWN, self.cond[i][np.minimum(prev, 3), xc], self.marginal[i][xc])
                if self.higher[i]:
                    term = self._higher_terms(codes, i, xc, term)
            if background is not None:
                bgw = np.zeros(L)
                a, b = max(0, -off), min(L, L - off)
                if b > a:
                    bgw[a:b] = background[a + off:b + off]
                term = term - bgw
                term = np.where(known, term, 0.0)
            else:
                term = np.where(known, term, math.log(0.25))
            if off < 0:
                upstream += term
            else:
                total += term
            prev = x
        return (upstream, total) if split else upstream + total

    def _higher_terms(self, codes: np.ndarray, i: int, xc: np.ndarray, term: np.ndarray) -> np.ndarray:
        """Replace the first-order terms of window position i where k >= 2 known bases precede it."""
        term = term.copy()
        kmax = max(self.higher[i])
        run = np.zeros(len(codes), dtype=np.int64)  # known bases directly before position i (capped)
        alive = np.ones(len(codes), dtype=bool)
        ctx = np.zeros(len(codes), dtype=np.int64)
        ctxs = {}
        for j in range(1, kmax + 1):
            y = self._window(codes, self.lo + i - j)
            alive &= y < UNKNOWN
            run += alive
            ctx += np.minimum(y, 3) * 4 ** (j - 1)
            ctxs[j] = ctx.copy()
        for k in range(2, kmax + 1):
            sel = run >= k if k == kmax else run == k
            term[sel] = self.higher[i][k][ctxs[k][sel], xc[sel]]
        return term

    def site_windows(self, codes: np.ndarray, anchors: np.ndarray) -> np.ndarray:
        """(N, width) int64: the window's codes (offsets ``lo .. hi-1``) of the sites anchored at
        ``anchors`` (N,), ``UNKNOWN`` beyond the sequence.

        Example:
            >>> wam = WeightArrayModel(-2, 3, 0, ("GT",))
            >>> wam.site_windows(encode_dna("AAGTAC"), np.array([2, 0])).tolist()
            [[0, 0, 2, 3, 0], [4, 4, 0, 0, 2]]
        """
        codes = np.asarray(codes)
        pos = np.asarray(anchors, dtype=np.int64)[:, None] + np.arange(self.lo, self.hi)[None, :]
        inside = (pos >= 0) & (pos < len(codes))
        out = np.full(pos.shape, UNKNOWN, dtype=np.int64)
        out[inside] = codes[pos[inside]]
        return out

    def consensus(self, codes: np.ndarray) -> np.ndarray:
        """(L,) bool: the consensus of a site anchored at each position is there."""
        codes = np.asarray(codes)
        ok = np.zeros(len(codes), dtype=bool)
        for pat in self.patterns:
            hit = np.ones(len(codes), dtype=bool)
            for j, base in enumerate(pat):
                hit &= self._window(codes, self.consensus_offset + j) == int(encode_dna(base)[0])
            ok |= hit
        return ok


#: the signal sensors, in the order :class:`SignalSensors` keeps them
SIGNAL_NAMES = ("donor", "acceptor", "start", "stop")
#: per signal: anchor (on the transcript's strand), default window (lo, hi), consensus offset, patterns
_SIGNAL_SPECS = {
    # anchor: the intron's first base; 3 exon bases and 6 intron bases (GENSCAN's donor window)
    "donor": ((-3, 6), 0, ("GT", "GC")),
    # anchor: the exon's first base; the intron's last 40 bases (branch point region and AG), 3 exon bases
    "acceptor": ((-40, 3), -2, ("AG",)),
    # anchor: the A of ATG; 12 bases upstream (Kozak context) and the first two codons
    "start": ((-12, 6), 0, ("ATG",)),
    # anchor: the stop codon's first base (right after the CDS); the last CDS codon and 3 bases after
    "stop": ((-3, 6), 0, ("TAA", "TAG", "TGA")),
}


def _anchors(genes: List[List[Tuple[int, int]]], name: str) -> List[int]:
    """Anchors of one signal's true sites on a reading (exons in reading coordinates)."""
    out = []
    for exons in genes:
        if name == "start":
            out.append(exons[0][0])
        elif name == "stop":
            out.append(exons[-1][1])
        elif name == "donor":
            out.extend(b for a, b in exons[:-1])
        else:
            out.extend(a for a, b in exons[1:])
    return out


@dataclass
class SignalSensors:
    """Weight array models of donor, acceptor, start and stop sites (both strands).

    Attributes:
        models: ``{name: WeightArrayModel}`` for the names of :data:`SIGNAL_NAMES`.
    """

    models: Dict[str, WeightArrayModel] = field(default_factory=dict)

    @classmethod
    def fit(cls, records: Sequence[GenomicRecord], windows: Optional[Dict[str, Tuple[int, int]]] = None,
            smoothing: float = 1.0, orders: Union[int, Dict[str, int]] = 1) -> "SignalSensors":
        """Fit every signal's model on the true sites of annotated records (both strands).

        ``windows`` overrides a signal's default window ``(lo, hi)`` around its anchor
        (e.g. ``{"acceptor": (-30, 3)}`` for a shorter branch-point region). ``orders``: the
        models' order (:class:`WeightArrayModel`), one for all or ``{name: order}`` (missing: 1).
        """
        windows = dict(windows or {})
        orders = {n: int(orders) for n in SIGNAL_NAMES} if isinstance(orders, int) else dict(orders)
        models = {}
        reads = [r for rec in records for r in readings(rec)]
        for name in SIGNAL_NAMES:
            (lo, hi), coff, pats = _SIGNAL_SPECS[name]
            lo, hi = windows.get(name, (lo, hi))
            wam = WeightArrayModel(lo, hi, coff, pats, smoothing, order=orders.get(name, 1))
            rows = []
            for r in reads:
                anchors = np.asarray(_anchors(r.genes, name), dtype=np.int64)
                if len(anchors) == 0:
                    continue
                pos = anchors[:, None] + np.arange(lo, hi)[None, :]
                inside = (pos >= 0).all(1) & (pos < len(r.codes)).all(1)
                rows.append(r.codes[pos[inside]])
            wam.fit(np.concatenate(rows) if rows else np.zeros((0, hi - lo), dtype=np.int64))
            models[name] = wam
        return cls(models)

    def scores(self, codes: np.ndarray, background: np.ndarray) -> Dict[str, np.ndarray]:
        """Per anchor, on both strands, in record coordinates: ``{f"{name}{strand}": (L,) float64}``
        log-likelihood ratios (window under the model against ``background``, the per-position
        background of :meth:`ContentSensors.scores`), ``{f"{name}{strand}_up": (L,) float64}`` the
        part of that ratio from the window's bases before the anchor (on the strand it is read
        on), and ``{f"{name}{strand}_ok": (L,) bool}`` where the consensus is there. On the - strand
        the anchor is the record position of the anchor base (the reading runs right to left)."""
        codes = np.asarray(codes)
        rc = reverse_complement(codes)
        bg_rc = background[::-1].copy()
        out = {}
        for name, wam in self.models.items():
            up, rest = wam.window_log_probs(codes, background, split=True)
            out[f"{name}+"], out[f"{name}+_up"] = up + rest, up
            out[f"{name}+_ok"] = wam.consensus(codes)
            up, rest = wam.window_log_probs(rc, bg_rc, split=True)
            out[f"{name}-"], out[f"{name}-_up"] = (up + rest)[::-1].copy(), up[::-1].copy()
            out[f"{name}-_ok"] = wam.consensus(rc)[::-1].copy()
        return out


# --------------------------------------------------------------------------- length models


class LengthDistribution:
    """A length distribution ``log P(length = k)`` for k = 1..K.

    * ``"empirical"``: a Gaussian kernel density estimate on log length (bandwidth ``bandwidth``
      in log units), turned into a density over k (Jacobian 1/k), mixed with ``floor`` of a
      uniform over 1..K so that no length is impossible. Mass
      beyond K (lengths longer than K) is kept out: ``sum_k P(k)`` over 1..K is the fraction of
      lengths <= K.
    * ``"geometric"``: ``P(k) = q (1-q)^(k-1)`` with mean ``1/q`` = the lengths' mean.

    Example:
        >>> d = LengthDistribution.fit([60, 62, 65, 70, 300, 2000], kind="empirical", bandwidth=0.1)
        >>> lp = d.log_pmf(1000)
        >>> bool(lp[61] > lp[199]), round(float(np.exp(lp).sum()), 2)     # 5 of 6 lengths are <= 1000
        (True, 0.83)
        >>> g = LengthDistribution.fit([10, 30], kind="geometric")
        >>> round(float(np.exp(g.log_pmf(100000)).sum()), 6), g.mean
        (1.0, 20.0)
    """

    def __init__(self, kind: str, lengths: np.ndarray, bandwidth: float = 0.1, floor: float = 1e-3):
        if kind not in ("empirical", "geometric"):
            raise ValueError(f"kind must be 'empirical' or 'geometric', got {kind!r}")
        self.kind = kind
        self.lengths = np.asarray(lengths, dtype=np.float64)
        if len(self.lengths) == 0 or (self.lengths < 1).any():
            raise ValueError("need at least one length, every length >= 1")
        self.bandwidth, self.floor = float(bandwidth), float(floor)
        self.mean = float(self.lengths.mean())

    @classmethod
    def fit(cls, lengths: Sequence[int], kind: str = "empirical", bandwidth: float = 0.1,
            floor: float = 1e-3) -> "LengthDistribution":
        return cls(kind, np.asarray(lengths), bandwidth, floor)

    def tail(self, start: int) -> Tuple[float, float]:
        """A geometric tail from ``start`` on: ``(log P(length >= start), r)`` with
        ``P(length = n) = P(length >= start) r (1 - r)^(n - start)`` for n >= start.

        Fitted to the lengths: ``P(length >= start)`` is their fraction at or above ``start`` (the
        complement of :meth:`log_pmf` ``(start - 1)``'s mass), ``1 / r`` the mean of
        ``length - start + 1`` over them. Without such lengths: mass ``floor``, mean excess ``start``.

        Example:
            >>> lm, r = LengthDistribution.fit([50, 60, 1000, 3000]).tail(1000)
            >>> round(float(np.exp(lm)), 2), round(1 / r, 1)
            (0.5, 1001.0)
        """
        start = int(start)
        long = self.lengths[self.lengths >= start]
        if len(long) == 0:
            return math.log(max(self.floor, 1e-12)), 1.0 / max(start, 1)
        mean_excess = float((long - start + 1).mean())
        return math.log(len(long) / len(self.lengths)), 1.0 / mean_excess

    def log_pmf(self, K: int) -> np.ndarray:
        """(K,) float64: ``log P(length = k)`` at index k - 1."""
        k = np.arange(1, K + 1, dtype=np.float64)
        if self.kind == "geometric":
            q = 1.0 / max(self.mean, 1.0 + 1e-9)
            return math.log(q) + (k - 1) * math.log1p(-q)
        u = np.log(self.lengths)
        h = self.bandwidth
        # the density of log k, summed over the data in chunks (K x N can be large)
        dens = np.zeros(K)
        for a in range(0, len(u), 2048):
            z = (np.log(k)[:, None] - u[None, a:a + 2048]) / h
            dens += np.exp(-0.5 * z * z).sum(1)
        dens /= k * h * math.sqrt(2 * math.pi) * len(u)
        # normalise to the data's mass at lengths <= K (the kernel leaks mass below 1 and above K),
        # and mix in a uniform floor so that no length is impossible
        inside = float((self.lengths <= K).mean())
        p = dens / max(dens.sum(), 1e-300)
        p = inside * ((1 - self.floor) * p + self.floor / K)
        with np.errstate(divide="ignore"):
            return np.log(p)
