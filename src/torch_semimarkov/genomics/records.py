"""Gene structures and annotated DNA records, and the DNA encodings the models read.

Coordinates are 0-based and half-open everywhere in Python (``Exon(start, end)`` covers
``start .. end-1``); only the GFF3 writer and the GenBank/GFF readers convert from and to the
1-based inclusive coordinates of the file formats. An exon here is a coding exon (a CDS piece): the
annotation of the AUGUSTUS tutorial data excludes the stop codon from the CDS, and so do we.

Example:
    >>> g = Gene("g1", "-", (Exon(10, 20), Exon(30, 41)))
    >>> g.cds_length, g.start, g.end
    (21, 10, 41)
    >>> [e.start for e in g.transcript_order()]
    [30, 10]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, List, NamedTuple, Sequence, Tuple

import numpy as np
import torch

__all__ = [
    "Exon",
    "Gene",
    "GenomicRecord",
    "BASES",
    "encode_dna",
    "one_hot",
    "stop_codon_tracks",
    "signal_violations",
    "SIGNALS",
    "read_fasta",
    "toy_record",
]

BASES = "ACGT"
#: code of a base that is not A, C, G or T (N and IUPAC ambiguity codes)
UNKNOWN = 4
_CODE = np.full(256, UNKNOWN, dtype=np.uint8)
for _i, _b in enumerate(BASES):
    _CODE[ord(_b)] = _i
    _CODE[ord(_b.lower())] = _i
STOP_CODONS = ("TAA", "TAG", "TGA")


class Exon(NamedTuple):
    """A coding exon: positions ``start .. end-1`` (0-based, end exclusive)."""

    start: int
    end: int

    def __len__(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Gene:
    """One transcript's coding exons, in genomic order, on one strand ('+' or '-').

    ``first_phase`` is the number of bases of a codon read before the first exon in transcript
    order: 0 for a complete gene, anything for a predicted gene cut by the sequence's edge.
    ``partial`` marks a gene that lacks its start or its stop (cut by the sequence's edge, or a
    prediction that begins or ends inside the gene structure).
    """

    id: str
    strand: str
    exons: Tuple[Exon, ...]
    first_phase: int = 0
    partial: bool = False

    def __post_init__(self):
        if self.strand not in ("+", "-"):
            raise ValueError(f"gene {self.id}: strand must be '+' or '-', got {self.strand!r}")
        exons = tuple(Exon(int(s), int(e)) for s, e in sorted(self.exons))
        if not exons:
            raise ValueError(f"gene {self.id} has no exons")
        for a, b in zip(exons, exons[1:]):
            if b.start < a.end:
                raise ValueError(f"gene {self.id}: exons {a} and {b} overlap")
        for ex in exons:
            if ex.end <= ex.start:
                raise ValueError(f"gene {self.id}: empty exon {ex}")
        object.__setattr__(self, "exons", exons)

    @property
    def start(self) -> int:
        return self.exons[0].start

    @property
    def end(self) -> int:
        return self.exons[-1].end

    @property
    def cds_length(self) -> int:
        return sum(len(e) for e in self.exons)

    def transcript_order(self) -> Tuple[Exon, ...]:
        """The exons in the order they are read (5' to 3' of the transcript)."""
        return self.exons if self.strand == "+" else self.exons[::-1]

    def entry_phases(self) -> List[int]:
        """For each exon in genomic order: how many bases of a codon were read before it (0, 1, 2)."""
        phases, done = {}, self.first_phase
        for ex in self.transcript_order():
            phases[ex] = done % 3
            done += len(ex)
        return [phases[ex] for ex in self.exons]


@dataclass
class GenomicRecord:
    """A DNA sequence (upper case) and its annotated genes (possibly none, e.g. for FASTA input)."""

    name: str
    sequence: str
    genes: List[Gene] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.sequence)

    def coding_mask(self) -> np.ndarray:
        """(L,) bool: True at annotated coding positions (either strand)."""
        mask = np.zeros(len(self.sequence), dtype=bool)
        for g in self.genes:
            for ex in g.exons:
                mask[ex.start:ex.end] = True
        return mask


def toy_record(rng: np.random.Generator, name: str) -> GenomicRecord:
    """A random 400 bp locus with one + strand gene of two exons, ``[100, 160)`` and ``[240, 300)``,
    and the consensus of its signals (ATG, GT ... AG, TAA): the examples' training data.

    Example:
        >>> r = toy_record(np.random.default_rng(0), "r0")
        >>> len(r), r.sequence[100:103], r.genes[0].cds_length
        (400, 'ATG', 120)
    """
    s = list(rng.choice(list(BASES), 400))
    s[100:103], s[160:162], s[238:240], s[300:303] = "ATG", "GT", "AG", "TAA"
    return GenomicRecord(name, "".join(s), [Gene("g", "+", (Exon(100, 160), Exon(240, 300)))])


def encode_dna(sequence: str) -> np.ndarray:
    """(L,) uint8 codes: A=0, C=1, G=2, T=3, anything else 4.

    Example:
        >>> encode_dna("ACgtN").tolist()
        [0, 1, 2, 3, 4]
    """
    return _CODE[np.frombuffer(sequence.encode("ascii", "replace"), dtype=np.uint8)]


def one_hot(codes: torch.Tensor) -> torch.Tensor:
    """(..., L) codes -> (..., L, 4) float one-hot; unknown bases (code >= 4) are all zero."""
    eye = torch.cat([torch.eye(4), torch.zeros(252, 4)]).to(codes.device)
    return eye[codes.long()]


def stop_codon_tracks(codes: torch.Tensor) -> torch.Tensor:
    """Where a stop codon starts, per strand: (..., L) codes -> (..., L, 2) float.

    Channel 0 is 1 at t when ``seq[t:t+3]`` is TAA, TAG or TGA (a stop read on the + strand, codon
    position 0 at t); channel 1 is 1 at t when ``seq[t-2:t+1]`` is TTA, CTA or TCA (the reverse
    complement of a stop: a stop read on the - strand, whose first base is t).

    Example:
        >>> stop_codon_tracks(torch.as_tensor(encode_dna("TAGTTA")))[..., 0].tolist()
        [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        >>> stop_codon_tracks(torch.as_tensor(encode_dna("TAGTTA")))[..., 1].tolist()
        [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    """
    c = codes.long()
    L = c.shape[-1]
    out = torch.zeros(*c.shape, 2, device=c.device)
    if L < 3:
        return out
    # shape: (..., L-2) -- the trinucleotide starting at each position as a base-5 number
    tri = c[..., :-2] * 25 + c[..., 1:-1] * 5 + c[..., 2:]

    def num(s: str) -> int:
        return int(_CODE[ord(s[0])]) * 25 + int(_CODE[ord(s[1])]) * 5 + int(_CODE[ord(s[2])])

    plus = sum((tri == num(s)).float() for s in STOP_CODONS)
    minus = sum((tri == num(s)).float() for s in ("TTA", "CTA", "TCA"))
    out[..., :-2, 0] = plus
    out[..., 2:, 1] = minus
    return out


#: the signal tracks of :func:`signal_violations`, in channel order
SIGNALS = ("start+", "acceptor+", "donor+", "stop+", "start-", "acceptor-", "donor-", "stop-")
#: per signal: (offset of the pattern's first base from t, accepted patterns)
_SIGNAL_PATTERNS = {
    "start+": (0, ("ATG",)),  # a + exon starting at t begins with ATG
    "acceptor+": (-2, ("AG",)),  # the intron before a + exon starting at t ends with AG
    "donor+": (1, ("GT", "GC")),  # the intron after a + exon ending at t begins with GT (or GC)
    "stop+": (1, STOP_CODONS),  # a + CDS ending at t is followed by a stop codon
    "start-": (-2, ("CAT",)),  # a - exon ending at t ends with CAT (ATG on the - strand)
    "acceptor-": (1, ("CT",)),  # the intron after a - exon ending at t begins with CT (AG)
    "donor-": (-2, ("AC", "GC")),  # the intron before a - exon starting at t ends with AC (GT) or GC
    "stop-": (-3, ("TTA", "CTA", "TCA")),  # a - CDS starting at t is preceded by a stop codon
}


def signal_violations(codes: torch.Tensor) -> torch.Tensor:
    """Where a gene signal is *absent*, per signal of :data:`SIGNALS`: (..., L) codes -> (..., L, 8).

    Channel ``s`` is 1 at position t when the consensus of signal ``s`` for a boundary at t (see
    ``_SIGNAL_PATTERNS``: start codon, splice acceptor / donor, stop codon on either strand) is not
    there; bases outside the sequence and unknown bases match nothing.

    Example:
        >>> v = signal_violations(torch.as_tensor(encode_dna("CCATGCC")))
        >>> v[..., SIGNALS.index("start+")].tolist()
        [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    """
    c = codes.long()
    L = c.shape[-1]
    pad = 4
    padded = torch.nn.functional.pad(c, (pad, pad), value=UNKNOWN)
    out = []
    for name in SIGNALS:
        offset, patterns = _SIGNAL_PATTERNS[name]
        ok = torch.zeros_like(c, dtype=torch.bool)
        for pat in patterns:
            hit = torch.ones_like(ok)
            for k, base in enumerate(pat):
                hit &= padded[..., pad + offset + k: pad + offset + k + L] == int(_CODE[ord(base)])
            ok |= hit
        out.append((~ok).float())
    return torch.stack(out, dim=-1)


def read_fasta(path: str) -> Iterator[GenomicRecord]:
    """Records of a FASTA file (name = the first word of each header), without genes."""
    name, chunks = None, []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith(">"):
                if name is not None:
                    yield GenomicRecord(name, "".join(chunks).upper())
                name, chunks = (line[1:].split() or ["unnamed"])[0], []
            elif line:
                chunks.append(line)
    if name is not None:
        yield GenomicRecord(name, "".join(chunks).upper())


def records_summary(records: Sequence[GenomicRecord]) -> str:
    """One line: number of records, bases, genes and exons."""
    genes = sum(len(r.genes) for r in records)
    exons = sum(len(g.exons) for r in records for g in r.genes)
    return f"{len(records)} records, {sum(len(r) for r in records)} bp, {genes} genes, {exons} exons"
