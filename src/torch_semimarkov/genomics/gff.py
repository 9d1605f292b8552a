"""Gene predictions as GFF3, and reading CDS features back from GFF3 or GTF (e.g. AUGUSTUS output).

GFF3 written by :func:`write_gff3`, per predicted gene (one transcript, plus any alternative
transcripts, see below), in 1-based inclusive coordinates with seqid = the record's (LOCUS /
FASTA) name:

* a ``gene`` line; an ``mRNA`` line (``Parent`` = the gene); per coding exon, 5' to 3' along the
  transcript, an ``exon`` line and a line of the transcript's ``CDS`` feature (one ``ID`` shared by
  all its lines, as the GFF3 specification writes a discontinuous feature; ``Parent`` = the mRNA;
  column 8 = the phase, the bases to skip to reach the next codon start); ``start_codon`` and
  ``stop_codon`` lines (``Parent`` = the mRNA) where the gene has them.
* The CDS excludes the stop codon (as the annotation of the tutorial data does). The stop codon
  follows the CDS, and the gene, the mRNA and the 3'-most exon include it, so every feature lies
  inside its parent. No UTRs are predicted: an exon is its CDS piece (plus the stop codon).
  A start codon split by an intron is one ``start_codon`` feature of several lines.
* Column 6 of the ``exon`` and ``CDS`` lines holds the exon's score from ``exon_scores`` (e.g. its
  posterior probability from the model's marginals), ``.`` where none is given.

**Partial genes.** A gene is open at its 5' end when its CDS does not begin with a whole start codon
and at its 3' end when no stop codon follows it (a gene cut by the sequence's edge). An end is open
when

* 5': the gene's ``first_phase`` is not 0 (the CDS begins inside a codon);
* 3': the CDS length plus ``first_phase`` is not a multiple of 3, or the stop codon would lie
  outside the sequence (``lengths`` or ``sequences`` give the sequence's length);
* with ``sequences``: its codon is missing (the CDS does not begin with ATG; no TAA, TAG or TGA
  follows it), whatever the gene's ``partial`` flag;
* otherwise, for a gene whose ``partial`` flag is set: its 5' end when the gene touches the
  sequence's 5' edge (position 0 on the + strand, the last base on the - strand) and, when none of
  the rules above tells which end is open, both ends.

An open end gets no ``start_codon`` / ``stop_codon`` line, and is marked as NCBI's GFF3 files mark
partial features (attributes adapted from GVF; GenomeTools' ``gt gff3validator`` accepts them, and
readers of NCBI's GFF3 look for them): ``partial=true`` on the gene, the mRNA and the CDS (all its lines),
and on the features that reach the open end ``start_range=.,<start>`` (open at the left, the lower
coordinate: the 5' end of a + strand gene, the 3' end of a - strand gene) or ``end_range=<end>,.``
(open at the right), ``.`` standing for the unknown coordinate beyond the sequence's edge.
:func:`read_cds` reads these marks back as ``Gene.partial``.

**Alternative transcripts** (:class:`Alternative`, e.g. from a model's samples or k best parses)
follow their gene's own transcript as more ``mRNA`` features (``.t2``, ``.t3``, ...; the gene
spans all its transcripts) or form genes of their own; their ``mRNA`` lines carry
``alternative=true`` and ``probability=``, and :func:`read_cds` leaves them out unless asked.

Feature IDs are ``<seqid>.<gene id>`` (the gene id alone when it begins with ``<seqid>.``), ``.t1``
for the mRNA, ``.t1.exon<n>``, ``.t1.cds``, ``.t1.start_codon``, ``.t1.stop_codon``; they must be
unique in the file. Characters that GFF3 reserves are %-escaped (seqid: all but
``[a-zA-Z0-9.:^*$@!+_?|-]``; attribute values: ``;=&,%``, tab, newlines and control characters).

Example:
    >>> import io
    >>> from torch_semimarkov.genomics.records import Exon, Gene
    >>> buf = io.StringIO()
    >>> write_gff3(buf, {"locus1": [Gene("g1", "+", (Exon(0, 5), Exon(9, 13)))]},
    ...            exon_scores={"locus1": [[0.5, 0.25]]})
    >>> [line.split(chr(9))[2:6] for line in buf.getvalue().splitlines()[1:]]     # doctest: +NORMALIZE_WHITESPACE
    [['gene', '1', '16', '.'], ['mRNA', '1', '16', '.'], ['start_codon', '1', '3', '.'],
     ['exon', '1', '5', '0.5'], ['CDS', '1', '5', '0.5'], ['exon', '10', '16', '0.25'],
     ['CDS', '10', '13', '0.25'], ['stop_codon', '14', '16', '.']]
    >>> buf.getvalue().splitlines()[7].split(chr(9))[7:]
    ['1', 'ID=locus1.g1.t1.cds;Parent=locus1.g1.t1']
    >>> _ = buf.seek(0)
    >>> read_cds(buf)["locus1"][0].exons
    (Exon(start=0, end=5), Exon(start=9, end=13))

    A gene cut by the sequence's end (its CDS is not a whole number of codons):

    >>> buf = io.StringIO()
    >>> write_gff3(buf, {"s": [Gene("g1", "+", (Exon(20, 30),), partial=True)]}, lengths={"s": 30})
    >>> buf.getvalue().splitlines()[2].split(chr(9))[3:]
    ['21', '30', '.', '+', '.', 'ID=s.g1;partial=true;end_range=30,.']
"""

from __future__ import annotations

import gzip
import math
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, IO, Iterable, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import unquote

from torch_semimarkov.genomics.records import STOP_CODONS, Exon, Gene

__all__ = ["write_gff3", "read_cds", "Alternative"]

_SEQID_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.:^*$@!+_?|-")
_ATTR_RESERVED = frozenset(";=&,%\t\n\r")
_COMP = str.maketrans("ACGTacgt", "TGCAtgca")


def _pct(ch: str) -> str:
    return "".join(f"%{b:02X}" for b in ch.encode("utf-8"))


def _escape_seqid(text: str) -> str:
    return "".join(ch if ch in _SEQID_SAFE else _pct(ch) for ch in text)


def _escape_value(text: str) -> str:
    return "".join(_pct(ch) if ch in _ATTR_RESERVED or ord(ch) < 32 or ord(ch) == 127 else ch for ch in str(text))


def _attrs(**kv) -> str:
    return ";".join(f"{k}={v}" for k, v in kv.items() if v is not None)


def _score(value) -> str:
    if value is None:
        return "."
    value = float(value)
    return f"{value:.6g}" if math.isfinite(value) else "."


def _rc(seq: str) -> str:
    return seq.translate(_COMP)[::-1]


def _first_bases(gene: Gene, n: int = 3) -> List[Tuple[int, int]]:
    """Genomic pieces ``(a, b)`` of the first ``n`` CDS bases in transcript order (a codon split by an intron)."""
    pieces, left = [], n
    for ex in gene.transcript_order():
        take = min(left, len(ex))
        pieces.append((ex.start, ex.start + take) if gene.strand == "+" else (ex.end - take, ex.end))
        left -= take
        if left == 0:
            break
    return pieces


def _stop_span(gene: Gene) -> Tuple[int, int]:
    return (gene.end, gene.end + 3) if gene.strand == "+" else (gene.start - 3, gene.start)


def _read(seq: str, strand: str, pieces: Sequence[Tuple[int, int]]) -> str:
    """The bases of ``pieces`` (in transcript order) as the transcript reads them."""
    return "".join(seq[a:b] if strand == "+" else _rc(seq[a:b]) for a, b in pieces).upper()


def _open_ends(gene: Gene, length: Optional[int], seq: Optional[str]) -> Tuple[bool, bool]:
    """(5' end open, 3' end open) by the rules of the module docstring."""
    five = gene.first_phase % 3 != 0 or gene.cds_length < 3
    three = (gene.first_phase + gene.cds_length) % 3 != 0
    a, b = _stop_span(gene)
    if a < 0 or (length is not None and b > length):
        three = True
    if seq is not None:
        five = five or _read(seq, gene.strand, _first_bases(gene)) != "ATG"
        three = three or _read(seq, gene.strand, [(a, b)]) not in STOP_CODONS
    if gene.partial and not (five or three):
        at_edge = gene.start == 0 if gene.strand == "+" else (length is not None and gene.end == length)
        five, three = (True, False) if at_edge else (True, True)
    return five, three


@dataclass(frozen=True)
class Alternative:
    """An alternative transcript for :func:`write_gff3` (e.g. from the model's k-best parses or samples).

    Attributes:
        gene: its exons, strand and phase (its ``id`` names the gene when ``parent`` is None).
        parent: index of the predicted gene (in ``predictions[seqid]``) it is an alternative of, or
            None for a transcript that overlaps no predicted gene.
        probability: e.g. its posterior probability (column 6 of the ``mRNA`` line and
            ``probability=``), or None.
        exon_scores: one score per exon (genomic order) for column 6 of its exon and CDS lines, or None.
        attributes: more ``mRNA`` attributes (``{name: value}``, values %-escaped).
    """

    gene: Gene
    parent: Optional[int] = None
    probability: Optional[float] = None
    exon_scores: Optional[Tuple[Optional[float], ...]] = None
    attributes: Optional[Mapping[str, object]] = None


def write_gff3(
    out: Union[str, IO[str]],
    predictions: Mapping[str, Sequence[Gene]],
    source: str = "torch-semimarkov",
    lengths: Optional[Mapping[str, int]] = None,
    header: Sequence[str] = (),
    exon_scores: Optional[Mapping[str, Sequence[Optional[Sequence[Optional[float]]]]]] = None,
    sequences: Optional[Mapping[str, str]] = None,
    alternatives: Optional[Mapping[str, Sequence["Alternative"]]] = None,
) -> None:
    """Write genes per sequence as GFF3 (the layout, IDs and partial marks: see the module docstring).

    Args:
        out: a path or an open text file.
        predictions: ``{seqid: [Gene, ...]}`` in the order to write (seqid = LOCUS / FASTA name).
        source: the GFF source column.
        lengths: optional ``{seqid: length}``: ``##sequence-region`` lines (for lengths >= 1), and
            the sequence's end for the partial marks. A gene past the end raises ``ValueError``.
        header: extra comment lines (without the leading ``#``), e.g. the command that made the file.
        exon_scores: optional ``{seqid: [scores of gene 0, scores of gene 1, ...]}``, parallel to
            ``predictions``; a gene's scores are one number per exon in the order of
            ``gene.exons`` (genomic order), or ``None`` for none. Written to column 6 of the exon's
            ``exon`` and ``CDS`` lines (6 significant digits; ``.`` for ``None``, NaN and inf),
            e.g. the exon's posterior probability. Sequences or genes without scores get ``.``.
        sequences: optional ``{seqid: DNA}``: with it the start and stop codons are checked in the
            sequence for the partial marks (and its length stands in for a missing ``lengths``,
            also in the ``##sequence-region`` line).
        alternatives: optional ``{seqid: [Alternative, ...]}``: more transcripts, written after
            their parent gene's own transcript as further ``mRNA`` features of that gene (IDs
            ``.t2``, ``.t3``, ...; the gene's span grows to hold them), or, with ``parent=None``, as
            a gene of their own (ID from ``Alternative.gene.id``). Their ``mRNA`` lines carry
            ``alternative=true``, the probability in column 6 and as ``probability=``, and
            ``Alternative.attributes``; :func:`read_cds` leaves them out unless asked.

    Raises:
        ValueError: a gene outside its sequence, a feature ID used twice, or ``exon_scores`` whose
            shape does not match ``predictions``, an alternative whose parent is not a gene
            index of its sequence or lies on the other strand.
    """
    if isinstance(out, str):
        with open(out, "w") as f:
            return write_gff3(f, predictions, source, lengths, header, exon_scores, sequences, alternatives)
    src = _escape_value(source) or "."
    out.write("##gff-version 3\n")
    for line in header:
        for part in str(line).splitlines() or [""]:
            out.write(f"# {part}\n")
    seen: Dict[str, str] = {}

    def new_id(fid: str, where: str) -> str:
        if fid in seen:
            raise ValueError(f"GFF3 feature ID {fid!r} of {where} is already used by {seen[fid]}: gene ids must be unique")
        seen[fid] = where
        return _escape_value(fid)

    for seqid, genes in predictions.items():
        genes = list(genes)
        seq = None if sequences is None else sequences.get(seqid)
        length = lengths.get(seqid) if lengths is not None else None
        if length is None and seq is not None:
            length = len(seq)
        scores = None if exon_scores is None else exon_scores.get(seqid)
        if scores is not None and len(scores) != len(genes):
            raise ValueError(f"exon_scores[{seqid!r}] has {len(scores)} entries for {len(genes)} genes")
        sid = _escape_seqid(seqid)
        if length is not None and length >= 1:
            out.write(f"##sequence-region {sid} 1 {int(length)}\n")
        alts = list((alternatives or {}).get(seqid, ()))
        for a in alts:
            if a.parent is not None and not 0 <= a.parent < len(genes):
                raise ValueError(f"alternative {a.gene.id} of {seqid!r}: parent {a.parent} is not a gene index "
                                 f"(the sequence has {len(genes)} genes)")
            if a.parent is not None and a.gene.strand != genes[a.parent].strand:
                raise ValueError(f"alternative {a.gene.id} of {seqid!r} lies on the other strand of its parent gene")
            if a.exon_scores is not None and len(a.exon_scores) != len(a.gene.exons):
                raise ValueError(f"alternative {a.gene.id} of {seqid!r}: {len(a.exon_scores)} exon scores for "
                                 f"{len(a.gene.exons)} exons")
        for gi, gene in enumerate(genes):
            gscores = None if scores is None else scores[gi]
            if gscores is not None and len(gscores) != len(gene.exons):
                raise ValueError(f"exon_scores[{seqid!r}][{gi}] has {len(gscores)} scores for the "
                                 f"{len(gene.exons)} exons of gene {gene.id}")
        for gene in list(genes) + [a.gene for a in alts]:
            if gene.start < 0 or (length is not None and gene.end > length):
                raise ValueError(f"gene {gene.id} ({gene.start + 1}..{gene.end}) lies outside sequence {seqid!r} "
                                 f"of length {length}")
        for gi, gene in enumerate(genes):
            gscores = None if scores is None else scores[gi]
            txs = [(gene, gscores, None)] + [(a.gene, a.exon_scores, a) for a in alts if a.parent == gi]
            _write_gene(out, sid, src, seqid, gene.id, gene.strand, txs, length, seq, new_id)
        for a in alts:  # alternatives that belong to no predicted gene: a gene of their own
            if a.parent is None:
                _write_gene(out, sid, src, seqid, a.gene.id, a.gene.strand, [(a.gene, a.exon_scores, a)], length,
                            seq, new_id)


def _layout(gene: Gene, length, seq) -> dict:
    """A transcript's open ends, stop codon and exon spans (the 3'-most exon extended by the stop)."""
    five, three = _open_ends(gene, length, seq)
    left_open, right_open = (five, three) if gene.strand == "+" else (three, five)
    stop = None if three else _stop_span(gene)
    spans = [[ex.start, ex.end] for ex in gene.exons]
    if stop is not None:
        if gene.strand == "+":
            spans[-1][1] = stop[1]
        else:
            spans[0][0] = stop[0]
    return dict(five=five, three=three, left_open=left_open, right_open=right_open, stop=stop, spans=spans,
                lo=spans[0][0], hi=spans[-1][1])


def _write_gene(out, sid, src, seqid, gene_id, strand, transcripts, length, seq, new_id) -> None:
    """One gene line spanning its transcripts ``[(Gene, exon scores, Alternative or None)]``, then each."""
    where = f"gene {gene_id} of {seqid!r}"
    # GFF3 IDs are unique per file: prefix per-sequence gene ids with the seqid
    gid = gene_id if gene_id.startswith(f"{seqid}.") else f"{seqid}.{gene_id}"
    gid_e = new_id(gid, where)
    lays = [_layout(t, length, seq) for t, _, _ in transcripts]
    lo, hi = min(x["lo"] for x in lays), max(x["hi"] for x in lays)
    attrs = _attrs(ID=gid_e, partial="true" if any(x["five"] or x["three"] for x in lays) else None,
                   start_range=f".,{lo + 1}" if any(x["left_open"] and x["lo"] == lo for x in lays) else None,
                   end_range=f"{hi},." if any(x["right_open"] and x["hi"] == hi for x in lays) else None)
    out.write(f"{sid}\t{src}\tgene\t{lo + 1}\t{hi}\t.\t{strand}\t.\t{attrs}\n")
    for n, ((tx, tscores, alt), lay) in enumerate(zip(transcripts, lays), 1):
        _write_transcript(out, sid, src, tx, tscores, lay, f"{gid}.t{n}", gid_e, alt, where, new_id)


def _write_transcript(out, sid, src, gene, gscores, lay, tid, gid_e, alt, where, new_id) -> None:
    tid_e = new_id(tid, where)
    cds_e, start_e, stop_e = (new_id(f"{tid}.{x}", where) for x in ("cds", "start_codon", "stop_codon"))
    five, three, stop, spans = lay["five"], lay["three"], lay["stop"], lay["spans"]
    partial = "true" if five or three else None
    left_open, right_open, lo, hi = lay["left_open"], lay["right_open"], lay["lo"], lay["hi"]

    def ranges(a: int, b: int) -> dict:
        return {"start_range": f".,{a + 1}" if left_open and a == lo else None,
                "end_range": f"{b},." if right_open and b == hi else None}

    def line(kind, a, b, score=".", phase=".", **attrs):
        out.write(f"{sid}\t{src}\t{kind}\t{a + 1}\t{b}\t{score}\t{gene.strand}\t{phase}\t{_attrs(**attrs)}\n")

    extra = {}
    if alt is not None:
        extra = {"alternative": "true", "probability": _score(alt.probability) if alt.probability is not None else None,
                 **{_escape_value(str(k)): _escape_value(str(v)) for k, v in (alt.attributes or {}).items()}}
    line("mRNA", lo, hi, _score(None if alt is None else alt.probability), ID=tid_e, Parent=gid_e,
         partial=partial, **ranges(lo, hi), **extra)
    if not five:
        done = 0
        for a, b in _first_bases(gene):
            line("start_codon", a, b, phase=(3 - done) % 3, ID=start_e, Parent=tid_e)
            done += b - a
    phases = gene.entry_phases()
    order = range(len(gene.exons)) if gene.strand == "+" else range(len(gene.exons) - 1, -1, -1)
    for n, idx in enumerate(order):
        ex, (a, b) = gene.exons[idx], spans[idx]
        score = _score(None if gscores is None else gscores[idx])
        er = ranges(a, b)
        line("exon", a, b, score, ID=new_id(f"{tid}.exon{n + 1}", where), Parent=tid_e,
             partial="true" if any(er.values()) else None, **er)
        line("CDS", ex.start, ex.end, score, (3 - phases[idx]) % 3, ID=cds_e, Parent=tid_e, partial=partial,
             **ranges(ex.start, ex.end))
    if stop is not None:
        line("stop_codon", stop[0], stop[1], phase=0, ID=stop_e, Parent=tid_e)


_GTF_ATTR = re.compile(r'(\S+)\s+"([^"]*)"')


def _parse_attrs(text: str) -> Dict[str, str]:
    text = text.strip()
    if "=" in text and '"' not in text.split("=")[0]:
        out = {}
        for part in text.split(";"):
            if "=" in part:
                k, v = part.split("=", 1)
                out[unquote(k.strip())] = unquote(v.strip())
        return out
    return {k: v for k, v in _GTF_ATTR.findall(text)}


def read_cds(
    source: Union[str, IO[str], Iterable[str]],
    sources: Optional[Sequence[str]] = None,
    alternatives: bool = False,
) -> Dict[str, List[Gene]]:
    """CDS features of a GFF3 or GTF file, grouped into transcripts: ``{seqid: [Gene, ...]}``.

    A transcript is the ``Parent`` (GFF3) or ``transcript_id`` (GTF) of its CDS lines; its exons are
    the CDS intervals, converted to 0-based half-open coordinates. A transcript is marked
    ``partial`` (cut by the sequence's edge) when its CDS lines carry ``partial=true``,
    ``start_range`` or ``end_range`` (NCBI's marks, written by :func:`write_gff3`), or when the file
    has ``start_codon`` / ``stop_codon`` features (AUGUSTUS's GTF, our GFF3) and the transcript
    lacks either, as AUGUSTUS's own evaluation treats it. GFF3 %-escapes in the seqid and the
    attribute values are decoded.

    Args:
        source: a path (``.gz`` is read compressed), an open file, or lines.
        sources: keep only lines whose source (column 2) is one of these, e.g. ``["AUGUSTUS"]`` for
            AUGUSTUS output that also echoes the input annotation as source ``database``.
        alternatives: also return the transcripts whose ``mRNA`` line says ``alternative=true``
            (written by :func:`write_gff3` from ``alternatives``); by default they are left out, so
            that an evaluation sees the predicted genes only.
    """
    if isinstance(source, str):
        with (gzip.open(source, "rt") if source.endswith(".gz") else open(source)) as f:
            return read_cds(f, sources, alternatives)
    groups: "OrderedDict[tuple, dict]" = OrderedDict()
    codons: Dict[tuple, set] = {}
    alternative: set = set()
    for line in source:
        if not line.strip() or line.startswith("#"):
            continue
        cols = line.rstrip("\n").split("\t")
        if not alternatives and len(cols) >= 9 and cols[2] == "mRNA":
            attrs = _parse_attrs(cols[8])
            if attrs.get("alternative", "").lower() == "true" and "ID" in attrs:
                alternative.add((unquote(cols[0]), attrs["ID"]))
            continue
        if len(cols) < 9 or cols[2] not in ("CDS", "start_codon", "stop_codon"):
            continue
        if sources is not None and cols[1] not in sources:
            continue
        seqid, strand = unquote(cols[0]), cols[6]
        attrs = _parse_attrs(cols[8])
        tid = attrs.get("Parent") or attrs.get("transcript_id") or attrs.get("ID") or f"{seqid}:{cols[3]}"
        key = (seqid, tid)
        if cols[2] != "CDS":
            codons.setdefault(key, set()).add(cols[2])
            continue
        g = groups.setdefault(key, {"strand": strand, "exons": [], "phases": [], "marked": False})
        g["exons"].append(Exon(int(cols[3]) - 1, int(cols[4])))
        g["phases"].append(cols[7])
        g["marked"] = g["marked"] or attrs.get("partial", "").lower() == "true" or "start_range" in attrs or "end_range" in attrs
    out: Dict[str, List[Gene]] = OrderedDict()
    for (seqid, tid), g in groups.items():
        if (seqid, tid) in alternative:
            continue
        exons = sorted(set(g["exons"]))
        first = 0
        order = sorted(zip(g["exons"], g["phases"]))
        head = order[0] if g["strand"] == "+" else order[-1]
        if head[1] in ("0", "1", "2"):
            first = (3 - int(head[1])) % 3
        # with codon features in the file, a transcript without its start or its stop is partial
        partial = g["marked"] or (bool(codons) and codons.get((seqid, tid), set()) != {"start_codon", "stop_codon"})
        out.setdefault(seqid, []).append(Gene(tid, g["strand"], tuple(exons), first, partial))
    return out
