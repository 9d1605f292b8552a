"""Gene predictions as GFF3, and reading CDS features back from GFF3 or GTF (e.g. AUGUSTUS output).

GFF3 written here: per gene a ``gene`` line, an ``mRNA`` line (``Parent`` = the gene) and one
``CDS`` line per coding exon (``Parent`` = the mRNA), 1-based inclusive coordinates, seqid = the
record's (LOCUS) name, and the CDS phase column (bases to skip to reach the next codon start). A
complete gene also gets ``start_codon`` and ``stop_codon`` lines (the stop codon lies outside the
CDS); a partial one (cut by the sequence's edge) does not.

Example:
    >>> import io
    >>> from torch_semimarkov.genomics.records import Exon, Gene
    >>> buf = io.StringIO()
    >>> write_gff3(buf, {"locus1": [Gene("g1", "+", (Exon(0, 5), Exon(9, 13)))]})
    >>> buf.getvalue().strip().splitlines()[-1].split(chr(9))
    ['locus1', 'torch-semimarkov', 'CDS', '10', '13', '.', '+', '1', 'ID=locus1.g1.t1.cds2;Parent=locus1.g1.t1']
    >>> _ = buf.seek(0)
    >>> read_cds(buf)["locus1"][0].exons
    (Exon(start=0, end=5), Exon(start=9, end=13))
"""

from __future__ import annotations

import gzip
import re
from collections import OrderedDict
from typing import Dict, IO, Iterable, List, Mapping, Optional, Sequence, Union

from .records import Exon, Gene

__all__ = ["write_gff3", "read_cds"]


def _attrs(**kv) -> str:
    return ";".join(f"{k}={v}" for k, v in kv.items() if v is not None)


def write_gff3(
    out: Union[str, IO[str]],
    predictions: Mapping[str, Sequence[Gene]],
    source: str = "torch-semimarkov",
    lengths: Optional[Mapping[str, int]] = None,
    header: Sequence[str] = (),
) -> None:
    """Write genes per sequence as GFF3.

    Args:
        out: a path or an open text file.
        predictions: ``{seqid: [Gene, ...]}`` in the order to write (seqid = LOCUS / FASTA name).
        source: the GFF source column.
        lengths: optional ``{seqid: length}`` for ``##sequence-region`` lines.
        header: extra comment lines (without the leading ``#``), e.g. the command that made the file.
    """
    if isinstance(out, str):
        with open(out, "w") as f:
            return write_gff3(f, predictions, source, lengths, header)
    out.write("##gff-version 3\n")
    for line in header:
        out.write(f"# {line}\n")
    for seqid, genes in predictions.items():
        if lengths is not None and seqid in lengths:
            out.write(f"##sequence-region {seqid} 1 {lengths[seqid]}\n")
        for gene in genes:
            # GFF3 IDs are unique per file: prefix per-sequence gene ids with the seqid
            gid = gene.id if gene.id.startswith(seqid) else f"{seqid}.{gene.id}"
            tid = f"{gid}.t1"
            start, end = gene.start + 1, gene.end
            out.write(f"{seqid}\t{source}\tgene\t{start}\t{end}\t.\t{gene.strand}\t.\t{_attrs(ID=gid)}\n")
            out.write(f"{seqid}\t{source}\tmRNA\t{start}\t{end}\t.\t{gene.strand}\t.\t{_attrs(ID=tid, Parent=gid)}\n")
            if not gene.partial:
                five, three = (gene.exons[0], gene.exons[-1]) if gene.strand == "+" else (gene.exons[-1], gene.exons[0])
                if gene.strand == "+":
                    codons = ((five.start, min(five.start + 3, five.end)), (three.end, three.end + 3))
                else:
                    codons = ((max(five.end - 3, five.start), five.end), (three.start - 3, three.start))
                for kind, (a, b) in zip(("start_codon", "stop_codon"), codons):
                    out.write(f"{seqid}\t{source}\t{kind}\t{a + 1}\t{b}\t.\t{gene.strand}\t0\t{_attrs(Parent=tid)}\n")
            phases = gene.entry_phases()
            order = range(len(gene.exons)) if gene.strand == "+" else range(len(gene.exons) - 1, -1, -1)
            for n, idx in enumerate(order):
                ex, entry = gene.exons[idx], phases[idx]
                phase = (3 - entry) % 3
                out.write(
                    f"{seqid}\t{source}\tCDS\t{ex.start + 1}\t{ex.end}\t.\t{gene.strand}\t{phase}\t"
                    f"{_attrs(ID=f'{tid}.cds{n + 1}', Parent=tid)}\n"
                )


_GTF_ATTR = re.compile(r'(\S+)\s+"([^"]*)"')


def _parse_attrs(text: str) -> Dict[str, str]:
    text = text.strip()
    if "=" in text and '"' not in text.split("=")[0]:
        out = {}
        for part in text.split(";"):
            if "=" in part:
                k, v = part.split("=", 1)
                out[k.strip()] = v.strip()
        return out
    return {k: v for k, v in _GTF_ATTR.findall(text)}


def read_cds(
    source: Union[str, IO[str], Iterable[str]],
    sources: Optional[Sequence[str]] = None,
) -> Dict[str, List[Gene]]:
    """CDS features of a GFF3 or GTF file, grouped into transcripts: ``{seqid: [Gene, ...]}``.

    A transcript is the ``Parent`` (GFF3) or ``transcript_id`` (GTF) of its CDS lines; its exons are
    the CDS intervals, converted to 0-based half-open coordinates. When the file has
    ``start_codon`` / ``stop_codon`` features (AUGUSTUS's GTF, our GFF3), a transcript that lacks
    either is marked ``partial`` (cut by the sequence's edge), as AUGUSTUS's own evaluation treats it.

    Args:
        source: a path (``.gz`` is read compressed), an open file, or lines.
        sources: keep only lines whose source (column 2) is one of these, e.g. ``["AUGUSTUS"]`` for
            AUGUSTUS output that also echoes the input annotation as source ``database``.
    """
    if isinstance(source, str):
        with (gzip.open(source, "rt") if source.endswith(".gz") else open(source)) as f:
            return read_cds(f, sources)
    groups: "OrderedDict[tuple, dict]" = OrderedDict()
    codons: Dict[tuple, set] = {}
    for line in source:
        if not line.strip() or line.startswith("#"):
            continue
        cols = line.rstrip("\n").split("\t")
        if len(cols) < 9 or cols[2] not in ("CDS", "start_codon", "stop_codon"):
            continue
        if sources is not None and cols[1] not in sources:
            continue
        seqid, strand = cols[0], cols[6]
        attrs = _parse_attrs(cols[8])
        tid = attrs.get("Parent") or attrs.get("transcript_id") or attrs.get("ID") or f"{seqid}:{cols[3]}"
        key = (seqid, tid)
        if cols[2] != "CDS":
            codons.setdefault(key, set()).add(cols[2])
            continue
        g = groups.setdefault(key, {"strand": strand, "exons": [], "phases": []})
        g["exons"].append(Exon(int(cols[3]) - 1, int(cols[4])))
        g["phases"].append(cols[7])
    out: Dict[str, List[Gene]] = OrderedDict()
    for (seqid, tid), g in groups.items():
        exons = sorted(set(g["exons"]))
        first = 0
        order = sorted(zip(g["exons"], g["phases"]))
        head = order[0] if g["strand"] == "+" else order[-1]
        if head[1] in ("0", "1", "2"):
            first = (3 - int(head[1])) % 3
        # with codon features in the file, a transcript without its start or its stop is partial
        partial = bool(codons) and codons.get((seqid, tid), set()) != {"start_codon", "stop_codon"}
        out.setdefault(seqid, []).append(Gene(tid, g["strand"], tuple(exons), first, partial))
    return out
