"""Label sets for gene structure: a generalised-HMM grammar for the semi-CRF, codon positions for K = 1.

:class:`GeneGrammar` is the semi-CRF's label set, built the way generalised-HMM gene finders
(GENSCAN, AUGUSTUS) build their state space, on both strands, read left to right along the DNA:

* ``N``: intergenic (one label shared by both strands);
* coding exons by type and reading-frame phase: ``single``, ``initial(j)``, ``internal(i,j)``,
  ``terminal(i)``, where ``i`` (entry phase) is the number of bases of a codon read before the exon
  and ``j`` (exit phase) the number read at its end, so that an exon of length n has
  ``j = (i + n) mod 3``: the duration mask allows only those lengths;
* ``intron(p)``: an intron of phase p (the exit phase of the exon before it in transcript order);
* ``cont[...]``: a continuation piece of an exon longer than K. It has a length that is a multiple
  of 3 (it keeps the phase) and sits on the 5' side of the exon, so that the exon label itself always
  holds the exon's 3' end (donor or stop side). It remembers the exon's 5' interface (intergenic or
  an intron of phase p) so that the grammar stays exact.

Introns and intergenic regions longer than K are several same-label segments (self-transitions).
With ``GeneGrammar(intron_tail=E)`` (E <= K) an intron is instead exactly one of two parses: an
``intron(p)`` segment of 30..E-1 bases, or, for an intron of n >= E bases, n - E one-base
``intron(p)[tail]`` pieces followed by one ``intron(p)[end]`` segment of exactly E bases. A length
model that is geometric from E on (:class:`~.ghmm.GHMMConfig` ``intron_tail``) then scores a long
intron the same however long it is relative to K: the tail pieces carry only a per-base score, so
there is no per-piece cost, and the parse is unique (the CRF's log Z counts each labelling once).
The allowed transitions are the gene grammar: intergenic -> (5') exon -> intron -> exon ... -> (3')
exon -> intergenic on either strand, with the phases matching across every intron; a gene needs
intergenic sequence on both sides (the stop codon, which is not part of the CDS, is in it).

:class:`CodonLabels` is the per-position label set of the baselines (K = 1): coding positions by
codon position (0, 1, 2) and introns by phase on each strand, plus intergenic. Its transitions
track the reading frame position by position.

Example:
    >>> g = GeneGrammar()
    >>> g.num_labels, g.names[0], g.names[g.index["+internal(1,2)"]]
    (47, 'N', '+internal(1,2)')
    >>> from torch_semimarkov.genomics.records import Exon, Gene
    >>> gene = Gene("g", "+", (Exon(100, 160), Exon(200, 290)))
    >>> [(s, e, g.names[c]) for s, e, c in g.encode([gene], 350, max_duration=60)]
    [(0, 50, 'N'), (50, 100, 'N'), (100, 160, '+initial(0)'), (160, 200, '+intron(0)'), (200, 260, '+cont[intron 0]'), (260, 290, '+terminal(0)'), (290, 350, 'N')]
    >>> g.decode(g.encode([gene], 350, max_duration=60))[0].exons
    (Exon(start=100, end=160), Exon(start=200, end=290))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from torch_semimarkov.genomics.records import SIGNALS, Exon, Gene

__all__ = ["LabelInfo", "GeneGrammar", "CodonLabels", "Interface"]

#: an exon's neighbour on one side: ``("N",)`` (intergenic) or ``("I", strand, phase)`` (an intron)
Interface = Tuple


@dataclass(frozen=True)
class LabelInfo:
    """One label of :class:`GeneGrammar`.

    Attributes:
        name: e.g. ``"+internal(1,2)"``.
        kind: ``"intergenic"``, ``"exon"``, ``"intron"`` or ``"cont"`` (continuation piece of a long exon).
        strand: ``"+"``, ``"-"`` or ``None`` (intergenic).
        exon_type: ``"single"``, ``"initial"``, ``"internal"``, ``"terminal"`` (exons), else ``None``.
        entry, exit: reading-frame phase before / after the segment in transcript order (for introns
            both are the intron's phase; 0 for intergenic).
        left, right: the interface on the segment's left / right in genomic order (exons and
            continuation pieces; ``None`` otherwise).
        piece: for the long-intron labels of ``GeneGrammar(intron_tail=E)`` (kind ``"intron"``):
            ``"tail"`` (one-base pieces) or ``"end"`` (the last E bases); ``None`` otherwise.
    """

    name: str
    kind: str
    strand: Optional[str] = None
    exon_type: Optional[str] = None
    entry: int = 0
    exit: int = 0
    left: Optional[Interface] = None
    right: Optional[Interface] = None
    piece: Optional[str] = None

    @property
    def coding(self) -> bool:
        return self.kind in ("exon", "cont")


N_IFACE: Interface = ("N",)
#: the shortest coding segment: 3 bases, the shortest exon of the tutorial data. It also keeps a
#: codon that starts before an exon's last two bases inside the exon (see ``frame_tables``).
MIN_EXON = 3
#: the shortest intron segment: below the shortest intron of the tutorial data (48 bases). A long
#: intron's pieces are longer than K / 2 (see ``GeneGrammar.split_runs``).
MIN_INTRON = 30


def _iface_name(iface: Interface) -> str:
    return "N" if iface[0] == "N" else f"intron {iface[2]}"


class GeneGrammar:
    """The semi-CRF's gene-structure labels, their grammar and their duration constraints.

    Args:
        intron_tail: ``None`` (the 47 labels: an intron longer than K is several ``intron(p)``
            pieces joined by self moves) or E > ``MIN_INTRON``: 12 more labels, per strand and phase
            ``intron(p)[tail]`` (one base) and ``intron(p)[end]`` (exactly E bases), and
            ``intron(p)`` only 30..E-1 bases long, with no self move (see the module docstring).
            Needs E <= K wherever K is given.

    Example:
        >>> g = GeneGrammar(intron_tail=100)
        >>> from torch_semimarkov.genomics.records import Exon, Gene
        >>> segs = g.encode([Gene("g", "+", (Exon(10, 40), Exon(143, 173)))], 180, max_duration=120)
        >>> g.num_labels, [(s, e, g.names[c]) for s, e, c in segs if e - s != 1 or c == 0]
        (59, [(0, 10, 'N'), (10, 40, '+initial(0)'), (43, 143, '+intron(0)[end]'), (143, 173, '+terminal(0)'), (173, 180, 'N')])
        >>> sorted({g.names[c] for s, e, c in segs if e - s == 1})
        ['+intron(0)[tail]']
    """

    def __init__(self, intron_tail: Optional[int] = None):
        if intron_tail is not None and int(intron_tail) <= MIN_INTRON:
            raise ValueError(f"intron_tail must be > MIN_INTRON ({MIN_INTRON}), got {intron_tail}")
        self.intron_tail: Optional[int] = None if intron_tail is None else int(intron_tail)
        labels: List[LabelInfo] = [LabelInfo("N", "intergenic")]
        for strand in ("+", "-"):
            exons = [("single", 0, 0)]
            exons += [("initial", 0, j) for j in range(3)]
            exons += [("internal", i, j) for i in range(3) for j in range(3)]
            exons += [("terminal", i, 0) for i in range(3)]
            for etype, i, j in exons:
                five = N_IFACE if etype in ("single", "initial") else ("I", strand, i)
                three = N_IFACE if etype in ("single", "terminal") else ("I", strand, j)
                left, right = (five, three) if strand == "+" else (three, five)
                name = {
                    "single": "single",
                    "initial": f"initial({j})",
                    "internal": f"internal({i},{j})",
                    "terminal": f"terminal({i})",
                }[etype]
                labels.append(LabelInfo(strand + name, "exon", strand, etype, i, j, left, right))
            for p in range(3):
                labels.append(LabelInfo(f"{strand}intron({p})", "intron", strand, None, p, p))
            for five in (N_IFACE, ("I", strand, 0), ("I", strand, 1), ("I", strand, 2)):
                phase = 0 if five[0] == "N" else five[2]
                left, right = (five, None) if strand == "+" else (None, five)
                labels.append(LabelInfo(f"{strand}cont[{_iface_name(five)}]", "cont", strand, None, phase, phase, left, right))
        if self.intron_tail is not None:
            # appended after the 47 labels, so that those keep their indices
            for strand in ("+", "-"):
                for piece in ("tail", "end"):
                    for p in range(3):
                        labels.append(LabelInfo(f"{strand}intron({p})[{piece}]", "intron", strand, None, p, p,
                                                piece=piece))
        self.labels: Tuple[LabelInfo, ...] = tuple(labels)
        self.names: Tuple[str, ...] = tuple(lab.name for lab in labels)
        self.index: Dict[str, int] = {n: i for i, n in enumerate(self.names)}
        self.num_labels = len(labels)
        self._cont = {(lab.strand, lab.left if lab.strand == "+" else lab.right): c
                      for c, lab in enumerate(labels) if lab.kind == "cont"}
        self._exon = {(lab.strand, lab.exon_type, lab.entry, lab.exit): c
                      for c, lab in enumerate(labels) if lab.kind == "exon"}
        #: (strand, phase, piece) -> label of the intron labels (piece None: ``intron(p)``)
        self._intron = {(lab.strand, lab.entry, lab.piece): c for c, lab in enumerate(labels) if lab.kind == "intron"}

    # ------------------------------------------------------------------ grammar

    def _iface_label(self, iface: Interface) -> int:
        return 0 if iface[0] == "N" else self.index[f"{iface[1]}intron({iface[2]})"]

    def allowed_transitions(self) -> torch.Tensor:
        """(C, C) bool ``[c_src, c_dst]``: the moves of the gene grammar (left to right along the DNA)."""
        C = self.num_labels
        ok = torch.zeros(C, C, dtype=torch.bool)
        tail = self.intron_tail is not None
        for a, la in enumerate(self.labels):
            for b, lb in enumerate(self.labels):
                if la.piece == "tail":
                    # one-base pieces, then the end piece of the same intron
                    ok[a, b] = a == b or b == self._intron[(la.strand, la.entry, "end")]
                elif la.kind in ("intergenic", "intron"):
                    here: Interface = N_IFACE if la.kind == "intergenic" else ("I", la.strand, la.entry)
                    if a == b:
                        # with intron tails an intron label is never split (nor an end piece)
                        ok[a, b] = la.kind == "intergenic" or not tail
                    elif lb.kind == "exon" or (lb.kind == "cont" and lb.strand == "+"):
                        ok[a, b] = lb.left == here
                elif la.kind == "exon":
                    if lb.kind in ("intergenic", "intron"):
                        ok[a, b] = self._enters(la.right, b)
                    elif lb.kind == "cont" and lb.strand == "-" == la.strand:
                        ok[a, b] = lb.right == la.right
                elif la.kind == "cont" and la.strand == "+":
                    ok[a, b] = a == b or (lb.kind == "exon" and lb.strand == "+" and lb.left == la.left)
                elif la.kind == "cont":
                    ok[a, b] = a == b or self._enters(la.right, b)
        return ok

    def _enters(self, iface: Interface, b: int) -> bool:
        """Whether label b may follow a coding segment whose right interface is ``iface``: the
        interface's label, or with intron tails also a long intron's first piece (tail or end)."""
        if b == self._iface_label(iface):
            return True
        lb = self.labels[b]
        return iface[0] == "I" and lb.piece is not None and (lb.strand, lb.entry) == iface[1:]

    def duration_residues(self) -> List[Optional[int]]:
        """Per label, the allowed segment length modulo 3 (``None``: any length)."""
        out: List[Optional[int]] = []
        for lab in self.labels:
            if lab.kind == "exon":
                out.append((lab.exit - lab.entry) % 3)
            elif lab.kind == "cont":
                out.append(0)
            else:
                out.append(None)
        return out

    def duration_mask(self, max_duration: int) -> torch.Tensor:
        """(K, C) bool: True where a segment of duration k (row k-1) is allowed for a label.

        Coding segments need the length their phases imply (mod 3) and at least ``MIN_EXON`` bases;
        intron segments (whole introns or pieces of long ones) at least ``MIN_INTRON``. With intron
        tails (E): ``intron(p)`` 30..E-1, ``[tail]`` pieces 1 and ``[end]`` pieces exactly E bases.
        """
        E = self.intron_tail
        if E is not None and E > max_duration:
            raise ValueError(f"intron_tail ({E}) must be <= K ({max_duration})")
        k = torch.arange(1, max_duration + 1)
        cols = []
        for lab, r in zip(self.labels, self.duration_residues()):
            if r is not None:
                cols.append((k % 3 == r) & (k >= MIN_EXON))
            elif lab.piece == "tail":
                cols.append(k == 1)
            elif lab.piece == "end":
                cols.append(k == E)
            elif lab.kind == "intron":
                cols.append((k >= MIN_INTRON) & (k < E) if E is not None else k >= MIN_INTRON)
            else:
                cols.append(torch.ones(max_duration, dtype=torch.bool))
        return torch.stack(cols, dim=1)

    # ------------------------------------------------------------------ reading frame

    def frame_tables(self) -> Dict[str, torch.Tensor]:
        """Per-label integer tables that place a coding segment's reading frame (see ``GeneStructureHead``).

        With positions s..e (inclusive) and entry/exit phases i/j, the positions at codon position 0
        are ``t = s - i`` (mod 3) on the + strand and ``t = e + i`` (mod 3) on the - strand
        (transcript order runs right to left there); the same residue is ``e + 1 - j`` and
        ``s + j - 1``. Returned, each (C,):

        * ``strand``: 0 (+), 1 (-) or -1 (not coding);
        * ``start_off`` / ``end_off``: the residue is ``(s + start_off) mod 3`` = ``(e + end_off) mod 3``;
        * ``stop_end``: + strand exon labels whose last codon position-0 base lies within 2 bases of the
          exon's end, so that its codon runs past the exon: 0 (the base e, when j = 1), 1 (e - 1, when
          j = 2) or -1; ``stop_start``: the same for - strand exons at their left edge (s or s + 1).
        """
        C = self.num_labels
        t = {name: torch.full((C,), -1, dtype=torch.long) for name in ("strand", "start_off", "end_off", "stop_end", "stop_start")}
        for c, lab in enumerate(self.labels):
            if not lab.coding:
                t["start_off"][c] = t["end_off"][c] = 0
                continue
            i, j = lab.entry, lab.exit
            if lab.strand == "+":
                t["strand"][c], t["start_off"][c], t["end_off"][c] = 0, (-i) % 3, (1 - j) % 3
                if lab.kind == "exon" and j in (1, 2):
                    t["stop_end"][c] = j - 1
            else:
                t["strand"][c], t["start_off"][c], t["end_off"][c] = 1, (j - 1) % 3, i % 3
                if lab.kind == "exon" and j in (1, 2):
                    t["stop_start"][c] = j - 1
        return t

    def emission_groups(self) -> List[int]:
        """Per label, its group for per-position scores: intergenic, then coding and intron per strand."""
        keys = {("intergenic", None): 0}
        out = []
        for lab in self.labels:
            key = ("coding" if lab.coding else lab.kind, lab.strand)
            out.append(keys.setdefault(key, len(keys)))
        return out

    def boundary_groups(self, side: str) -> List[int]:
        """Per label, its group for boundary scores at segment starts (``"start"``) or ends (``"end"``):
        labels whose boundary on that side is the same kind of site (e.g. every + exon that begins
        after an acceptor) share a group; continuation pieces have their own."""
        table = self.signal_tables()["ps_kind" if side == "start" else "pe_kind"]
        keys: Dict[tuple, int] = {}
        out = []
        for c, lab in enumerate(self.labels):
            key = (lab.kind, lab.strand, int(table[c]))
            out.append(keys.setdefault(key, len(keys)))
        return out

    def signal_tables(self) -> Dict[str, torch.Tensor]:
        """Per-label indices into the signal tracks of :func:`~.records.signal_violations` (-1: none).

        The exon label always holds an exon's 3' end, so its 3' signal (donor or stop codon) is
        checked where the segment ends (+ strand, ``pe_kind``) or starts (- strand, ``ps_kind``).
        The 5' signal (start codon or acceptor) is checked on the exon label and on continuation
        pieces; a continuation piece takes back the check of the piece that follows it (+ strand:
        ``pe_bonus_kind``, read at e + 1) or precedes it (- strand: ``ps_bonus_kind``, read at s - 1),
        so that only the exon's true 5' end is checked. Returned, each (C,) long: ``ps_kind``,
        ``pe_kind``, ``ps_bonus_kind``, ``pe_bonus_kind``.
        """
        C = self.num_labels
        t = {n: torch.full((C,), -1, dtype=torch.long) for n in ("ps_kind", "pe_kind", "ps_bonus_kind", "pe_bonus_kind")}
        for c, lab in enumerate(self.labels):
            if not lab.coding or lab.strand not in ("+", "-"):
                continue
            # read along the gene: on + its 5' end is the segment's start (left), on - its end (right)
            if lab.strand == "+":
                five_side, three_side, five_iface, three_iface = "ps", "pe", lab.left, lab.right
            else:
                five_side, three_side, five_iface, three_iface = "pe", "ps", lab.right, lab.left
            five = SIGNALS.index(("start" if five_iface[0] == "N" else "acceptor") + lab.strand)
            t[f"{five_side}_kind"][c] = five
            if lab.kind == "cont":
                t[f"{three_side}_bonus_kind"][c] = five
            else:
                t[f"{three_side}_kind"][c] = SIGNALS.index(("stop" if three_iface[0] == "N" else "donor") + lab.strand)
        return t

    # ------------------------------------------------------------------ genes <-> segments

    def exon_label(self, strand: str, exon_type: str, entry: int, exit: int) -> int:
        key = (strand, exon_type, entry % 3, exit % 3)
        if key not in self._exon:
            raise ValueError(f"no exon label for {key}: a {exon_type} exon must have "
                             "entry phase 0 (single, initial) and exit phase 0 (single, terminal)")
        return self._exon[key]

    def runs(self, genes: Sequence[Gene], length: int, max_duration: int) -> List[Tuple[int, int, int]]:
        """The gold segmentation before long intergenic and intron runs are cut: ``[(start, end, label)]``.

        Coding segments are final (an exon longer than K is already continuation pieces of
        ``3 * (K // 3)`` on its 5' side plus the exon label, holding the 3' end, for the rest);
        intergenic and intron runs are whole. :meth:`split_runs` cuts them to durations <= K.

        Raises:
            ValueError: overlapping or adjacent genes (a gene needs intergenic bases on both sides),
                a CDS whose length is not a multiple of 3, or a gene outside the sequence.
        """
        K = int(max_duration)
        if K < 2 * MIN_INTRON:
            raise ValueError(f"max_duration must be >= {2 * MIN_INTRON} (twice the shortest intron piece), got {K}")
        K3 = 3 * (K // 3)
        segs: List[Tuple[int, int, int]] = []

        def add_run(s: int, e: int, c: int) -> None:
            if e > s:
                segs.append((s, e, c))

        pos = 0
        for gene in sorted(genes, key=lambda g: g.start):
            if gene.start < pos or (segs and gene.start == pos):
                raise ValueError(f"gene {gene.id} overlaps or touches the previous gene: genes need intergenic bases between them")
            if gene.end > length:
                raise ValueError(f"gene {gene.id} ends at {gene.end}, past the sequence's length {length}")
            if gene.cds_length % 3 or gene.first_phase:
                raise ValueError(f"gene {gene.id}: CDS length {gene.cds_length} is not a multiple of 3 or the gene starts mid-codon (an incomplete gene?)")
            add_run(pos, gene.start, 0)
            phases = gene.entry_phases()
            n = len(gene.exons)
            for idx, ex in enumerate(gene.exons):
                rank = idx if gene.strand == "+" else n - 1 - idx
                etype = "single" if n == 1 else "initial" if rank == 0 else "terminal" if rank == n - 1 else "internal"
                i = phases[idx]
                j = (i + len(ex)) % 3
                c = self.exon_label(gene.strand, etype, i, j)
                lab = self.labels[c]
                if len(ex) <= K:
                    segs.append((ex.start, ex.end, c))
                else:
                    m = math.ceil((len(ex) - K) / K3)
                    pieces = [K3] * m
                    if len(ex) - m * K3 < MIN_EXON:
                        # keep the exon label's piece at least MIN_EXON long: one piece 3 shorter
                        pieces[-1] -= 3
                    rest = len(ex) - sum(pieces)
                    cont = self._cont[(gene.strand, lab.left if gene.strand == "+" else lab.right)]
                    a = ex.start
                    if gene.strand == "-":
                        segs.append((a, a + rest, c))
                        a += rest
                    for piece in pieces:
                        segs.append((a, a + piece, cont))
                        a += piece
                    if gene.strand == "+":
                        segs.append((a, ex.end, c))
                if idx + 1 < n:
                    p = j if gene.strand == "+" else i
                    add_run(ex.end, gene.exons[idx + 1].start, self.index[f"{gene.strand}intron({p})"])
            pos = gene.end
        add_run(pos, length, 0)
        return segs

    def split_runs(self, runs: Sequence[Tuple[int, int, int]], max_duration: int) -> List[Tuple[int, int, int]]:
        """Cut intergenic and intron runs longer than K into ``ceil(n / K)`` pieces of nearly equal length.

        Equal pieces (rather than K, K, ..., rest) keep every piece of a long run longer than K / 2,
        so that a minimum intron-piece duration (``MIN_INTRON``) holds for the gold segmentation.
        With intron tails (E) an intron of n >= E bases becomes n - E one-base ``[tail]`` pieces and
        an ``[end]`` piece of E bases, whatever K.
        """
        K = int(max_duration)
        E = self.intron_tail
        out: List[Tuple[int, int, int]] = []
        for s, e, c in runs:
            n = e - s
            lab = self.labels[c]
            if E is not None and lab.kind == "intron" and lab.piece is None and n >= E:
                tail = self._intron[(lab.strand, lab.entry, "tail")]
                out.extend((t, t + 1, tail) for t in range(s, e - E))
                out.append((e - E, e, self._intron[(lab.strand, lab.entry, "end")]))
                continue
            if lab.coding or n <= K:
                out.append((s, e, c))
                continue
            m = math.ceil(n / K)
            bounds = [s + (n * q) // m for q in range(m + 1)]
            out.extend((a, b, c) for a, b in zip(bounds, bounds[1:]))
        return out

    def encode(self, genes: Sequence[Gene], length: int, max_duration: int) -> List[Tuple[int, int, int]]:
        """The gold segmentation ``[(start, end, label), ...]`` (end exclusive) of a sequence with ``genes``.

        :meth:`runs` then :meth:`split_runs`; every segment is checked against the grammar
        (durations and transitions) by :meth:`check`.
        """
        segs = self.split_runs(self.runs(genes, length, max_duration), max_duration)
        self.check(segs, length, max_duration)
        return segs

    def check(self, segments: Sequence[Tuple[int, int, int]], length: int, max_duration: int) -> None:
        """Raise ``ValueError`` unless ``segments`` tile ``[0, length)`` with allowed durations and moves."""
        allowed = self.allowed_transitions()
        residues = self.duration_residues()
        pos, prev = 0, None
        for s, e, c in segments:
            if s != pos or not 1 <= e - s <= max_duration:
                raise ValueError(f"segment {(s, e, self.names[c])} does not continue at {pos} with a duration in [1, {max_duration}]")
            r = residues[c]
            if r is not None and ((e - s) % 3 != r or e - s < MIN_EXON):
                raise ValueError(f"segment {(s, e, self.names[c])} has length {e - s}: a coding segment needs "
                                 f"{r} mod 3 bases (its phases) and at least {MIN_EXON}")
            lab = self.labels[c]
            if lab.kind == "intron" and lab.piece is None and e - s < MIN_INTRON:
                raise ValueError(f"intron segment {(s, e, self.names[c])} is shorter than {MIN_INTRON} bases")
            if self.intron_tail is not None and lab.kind == "intron":
                E = self.intron_tail
                n_ok = {"tail": e - s == 1, "end": e - s == E}.get(lab.piece, e - s < E)
                if not n_ok:
                    raise ValueError(f"intron segment {(s, e, self.names[c])}: with intron tails (E = {E}) an intron "
                                     "label is shorter than E, a tail piece 1 and an end piece E bases long")
            if prev is not None and not bool(allowed[prev, c]):
                raise ValueError(f"the grammar forbids {self.names[prev]} -> {self.names[c]} at position {s}")
            pos, prev = e, c
        if pos != length:
            raise ValueError(f"segments cover [0, {pos}), the sequence has length {length}")

    def decode(self, segments: Sequence[Tuple[int, int, int]], prefix: str = "g") -> List[Gene]:
        """Genes from a segmentation that follows the grammar (e.g. a Viterbi decode).

        Adjacent coding segments (continuation pieces and their exon) merge into one exon; introns
        join exons into a gene; intergenic segments and the sequence's ends close genes. A gene cut by
        the sequence's edge is kept, with the phase of its first exon in ``first_phase``.
        """
        genes: List[Gene] = []
        cur: Optional[dict] = None

        def close():
            nonlocal cur
            if cur is not None and cur["exons"]:
                ex = cur["exons"]
                first = cur["phases"][0] if cur["strand"] == "+" else cur["phases"][-1]
                # complete: the 5'-most exon starts at a start codon and the 3'-most ends before a stop
                ends = {cur["types"][0], cur["types"][-1]}
                complete = ends <= {"single"} or (ends == {"initial", "terminal"} and len(ex) > 1)
                # the stop codon, which follows the CDS, must lie inside the sequence
                complete = complete and (ex[-1][1] + 3 <= length if cur["strand"] == "+" else ex[0][0] >= 3)
                genes.append(Gene(f"{prefix}{len(genes) + 1}", cur["strand"], tuple(Exon(a, b) for a, b in ex), first,
                                  partial=not complete or cur["open"]))
            cur = None

        prev_coding = last_intron = False
        length = int(segments[-1][1]) if len(segments) else 0
        for s, e, c in segments:
            s, e, c = int(s), int(e), int(c)
            lab = self.labels[c]
            if lab.kind == "intergenic":
                close()
                prev_coding = False
                continue
            if cur is not None and cur["strand"] != lab.strand:
                close()
            if cur is None:
                # a gene that begins with an intron was cut by the sequence's (or window's) edge
                cur = {"strand": lab.strand, "exons": [], "phases": [], "types": [], "open": lab.kind == "intron"}
            if lab.kind == "intron":
                prev_coding = False
                last_intron = True
                continue
            last_intron = False
            etype = lab.exon_type if lab.kind == "exon" else None
            if prev_coding and cur["exons"] and cur["exons"][-1][1] == s:
                cur["exons"][-1][1] = e
                if lab.strand == "-":
                    cur["phases"][-1] = lab.entry
                cur["types"][-1] = cur["types"][-1] or etype
            else:
                cur["exons"].append([s, e])
                cur["phases"].append(lab.entry)
                cur["types"].append(etype)
            prev_coding = True
        if cur is not None and last_intron:
            cur["open"] = True
        close()
        return genes


class CodonLabels:
    """Per-position labels for K = 1 models: codon position of coding bases, intron phase, intergenic.

    Labels: ``N`` (0); ``+E0 +E1 +E2`` (1-3, codon position of a + strand coding base);
    ``+I0 +I1 +I2`` (4-6, + strand intron by phase); ``-E0 -E1 -E2`` (7-9); ``-I0 -I1 -I2`` (10-12).

    Example:
        >>> cl = CodonLabels()
        >>> gene = Gene("g", "-", (Exon(2, 6), Exon(8, 10)))
        >>> "".join("N" if v == 0 else str(cl.names[v][1:]) + " " for v in cl.encode([gene], 12)).split()
        ['NNE2', 'E1', 'E0', 'E2', 'I2', 'I2', 'E1', 'E0', 'NN']
        >>> cl.decode(cl.encode([gene], 12))[0].exons
        (Exon(start=2, end=6), Exon(start=8, end=10))
    """

    def __init__(self):
        self.names = ("N", "+E0", "+E1", "+E2", "+I0", "+I1", "+I2", "-E0", "-E1", "-E2", "-I0", "-I1", "-I2")
        self.num_labels = len(self.names)

    @staticmethod
    def exon(strand: str, q: int) -> int:
        return (1 if strand == "+" else 7) + q % 3

    @staticmethod
    def intron(strand: str, p: int) -> int:
        return (4 if strand == "+" else 10) + p % 3

    def allowed_transitions(self) -> torch.Tensor:
        """(13, 13) bool: reading-frame-consistent moves, left to right along the DNA."""
        ok = torch.zeros(13, 13, dtype=torch.bool)
        ok[0, 0] = True
        ok[0, self.exon("+", 0)] = True  # a + gene starts with a whole codon
        ok[0, self.exon("-", 2)] = True  # a - gene's leftmost base ends its last codon
        for q in range(3):
            ok[self.exon("+", q), self.exon("+", q + 1)] = True
            ok[self.exon("+", q), self.intron("+", q + 1)] = True
            ok[self.intron("+", q), self.intron("+", q)] = True
            ok[self.intron("+", q), self.exon("+", q)] = True
            ok[self.exon("-", q), self.exon("-", q - 1)] = True
            ok[self.exon("-", q), self.intron("-", q)] = True
            ok[self.intron("-", q), self.intron("-", q)] = True
            ok[self.intron("-", q), self.exon("-", q - 1)] = True
        ok[self.exon("+", 2), 0] = True
        ok[self.exon("-", 0), 0] = True
        return ok

    def encode(self, genes: Sequence[Gene], length: int) -> np.ndarray:
        """(length,) int64 labels of a sequence with ``genes``."""
        out = np.zeros(length, dtype=np.int64)
        for gene in genes:
            phases = gene.entry_phases()
            for idx, (ex, i) in enumerate(zip(gene.exons, phases)):
                t = np.arange(ex.start, ex.end)
                q = (i + (t - ex.start)) % 3 if gene.strand == "+" else (i + (ex.end - 1 - t)) % 3
                out[ex.start:ex.end] = (1 if gene.strand == "+" else 7) + q
                if idx + 1 < len(gene.exons):
                    p = (i + len(ex)) % 3 if gene.strand == "+" else i
                    out[ex.end:gene.exons[idx + 1].start] = self.intron(gene.strand, p)
        return out

    def decode(self, labels, prefix: str = "g") -> List[Gene]:
        """Genes from per-position labels, grammatical or not (a softmax's argmax need not be).

        A gene is a maximal run of non-intergenic positions of one strand (a change of strand starts
        a new gene); its exons are the maximal runs of coding positions in it; runs without a coding
        position are dropped.
        """
        lab = np.asarray(labels)
        genes: List[Gene] = []
        L = len(lab)
        strand = np.where(lab == 0, 0, np.where(lab <= 6, 1, 2))
        coding = ((lab >= 1) & (lab <= 3)) | ((lab >= 7) & (lab <= 9))
        t = 0
        while t < L:
            if strand[t] == 0:
                t += 1
                continue
            u = t
            while u < L and strand[u] == strand[t]:
                u += 1
            exons, a = [], None
            for x in range(t, u + 1):
                c = x < u and coding[x]
                if c and a is None:
                    a = x
                elif not c and a is not None:
                    exons.append(Exon(a, x))
                    a = None
            if exons:
                sgn = "+" if strand[t] == 1 else "-"
                if sgn == "+":
                    first = int(lab[exons[0].start]) - 1
                else:
                    first = int(lab[exons[-1].end - 1]) - 7
                # complete: bounded by intergenic positions, whole codons from the first base to the last
                complete = (t >= (3 if sgn == "-" else 1) and u <= L - (3 if sgn == "+" else 1)
                            and exons[0].start == t and exons[-1].end == u and first % 3 == 0
                            and sum(len(x) for x in exons) % 3 == 0)
                genes.append(Gene(f"{prefix}{len(genes) + 1}", sgn, tuple(exons), first % 3, partial=not complete))
            t = u
        return genes
