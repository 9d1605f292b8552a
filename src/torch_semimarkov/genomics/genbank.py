"""Reading annotated gene loci from GenBank files (Biopython), and finding the AUGUSTUS tutorial data.

The AUGUSTUS training tutorial ships a standard split of Drosophila melanogaster gene loci in
Debian's ``augustus-doc`` package (Artistic licence): ``genes.gb.train`` (486 loci) and
``genes.gb.test`` (100 loci) under ``usr/share/doc/augustus/tutorial/results/``. Each record is one
locus with flanking sequence; its CDS features (joins of exons, stop codon excluded) are the
annotation. :func:`tutorial_data` finds these files, or fetches them with
``apt-get download augustus-doc`` + ``dpkg -x`` (no root needed) when asked to.

Example (needs ``pip install "torch-semimarkov[genomics]"`` and the data):
    >>> paths = tutorial_data("data/augustus", download=True)        # doctest: +SKIP
    >>> records = load_genbank(paths["train"])                        # doctest: +SKIP
"""

from __future__ import annotations

import glob
import gzip
import os
import shutil
import subprocess
import tempfile
import warnings
from typing import Dict, List, Optional

from torch_semimarkov.genomics.records import Exon, Gene, GenomicRecord

__all__ = ["load_genbank", "load_sequences", "tutorial_data", "TUTORIAL_SUBDIR", "MISSING_DATA_HELP"]

TUTORIAL_SUBDIR = os.path.join("usr", "share", "doc", "augustus", "tutorial", "results")

MISSING_DATA_HELP = """\
The AUGUSTUS tutorial gene sets (genes.gb.train, genes.gb.test) were not found under {root}.
They ship in Debian/Ubuntu's augustus-doc package. Either let the loader fetch them
(download=True, or --download on the command line), or run, without root:

    mkdir -p {root} && cd {root}
    apt-get download augustus-doc
    dpkg -x augustus-doc_*.deb .

The files are then under {root}/{subdir}/.
"""


def _open(path: str):
    return gzip.open(path, "rt") if path.endswith(".gz") else open(path)


def _require_biopython():
    try:
        from Bio import SeqIO  # noqa: F401
    except ImportError as err:  # the genomics loaders are an optional extra
        raise ImportError(
            "reading GenBank files needs Biopython: pip install 'torch-semimarkov[genomics]' (or pip install biopython)"
        ) from err


def load_genbank(path: str, strict: bool = True) -> List[GenomicRecord]:
    """Annotated records of a GenBank file (``.gb`` or ``.gb.gz``): sequence + CDS gene structures.

    Each CDS feature is one gene (one transcript); its exons are the parts of its location.

    Args:
        path: the GenBank file.
        strict: raise on a CDS with fuzzy ends (``<``/``>``, an incomplete gene) or overlapping genes;
            ``False`` drops such genes with a warning.

    Returns:
        One :class:`GenomicRecord` per LOCUS, named by the LOCUS name.
    """
    _require_biopython()
    from Bio import BiopythonParserWarning, SeqIO
    from Bio.SeqFeature import ExactPosition

    records = []
    with _open(path) as handle, warnings.catch_warnings():
        # the tutorial's LOCUS lines are shorter than GenBank's fixed columns; Biopython warns, then copes
        warnings.simplefilter("ignore", BiopythonParserWarning)
        for rec in SeqIO.parse(handle, "genbank"):
            genes: List[Gene] = []
            for i, feat in enumerate(f for f in rec.features if f.type == "CDS"):
                gid = (feat.qualifiers.get("gene") or feat.qualifiers.get("locus_tag") or [f"{rec.name}.cds{i + 1}"])[0]
                parts = feat.location.parts
                fuzzy = any(not isinstance(p.start, ExactPosition) or not isinstance(p.end, ExactPosition) for p in parts)
                strands = {p.strand for p in parts}
                problem = None
                if fuzzy:
                    problem = "has fuzzy ends (an incomplete gene)"
                elif len(strands) != 1 or strands.pop() not in (1, -1):
                    problem = "mixes strands"
                if problem is None:
                    gene = Gene(str(gid), "+" if parts[0].strand == 1 else "-", tuple(Exon(int(p.start), int(p.end)) for p in parts))
                    if any(gene.start < g.end and g.start < gene.end for g in genes):
                        problem = "overlaps another gene"
                if problem is not None:
                    msg = f"{path}: {rec.name}: CDS {gid} {problem}"
                    if strict:
                        raise ValueError(msg + " (strict=False drops it)")
                    warnings.warn(msg + "; dropped")
                    continue
                genes.append(gene)
            genes.sort(key=lambda g: g.start)
            records.append(GenomicRecord(rec.name, str(rec.seq).upper(), genes))
    return records


def load_sequences(path: str) -> List[GenomicRecord]:
    """Records of a GenBank (annotation kept) or FASTA file, chosen by the file's first character."""
    with _open(path) as f:
        first = f.read(1)
    if first == ">":
        from torch_semimarkov.genomics.records import read_fasta

        if path.endswith(".gz"):
            with tempfile.NamedTemporaryFile("w", suffix=".fa", delete=False) as tmp, _open(path) as src:
                shutil.copyfileobj(src, tmp)
            try:
                return list(read_fasta(tmp.name))
            finally:
                os.unlink(tmp.name)
        return list(read_fasta(path))
    return load_genbank(path)


def _find(root: str, name: str) -> Optional[str]:
    for candidate in (os.path.join(root, TUTORIAL_SUBDIR, name), os.path.join(root, name)):
        for p in (candidate, candidate + ".gz"):
            if os.path.exists(p):
                return p
    return None


def tutorial_data(root: str = "data/augustus", download: bool = False) -> Dict[str, str]:
    """Paths of the tutorial's ``genes.gb.train`` and ``genes.gb.test`` under ``root``.

    Looks in ``root`` and in ``root/usr/share/doc/augustus/tutorial/results`` (where ``dpkg -x``
    puts them). With ``download=True`` a missing data set is fetched with
    ``apt-get download augustus-doc`` and unpacked with ``dpkg -x`` into ``root``.

    Raises:
        FileNotFoundError: the files are missing (and not downloaded); the message says how to get them.
    """
    paths = {split: _find(root, f"genes.gb.{split}") for split in ("train", "test")}
    if None in paths.values() and download:
        fetch_augustus_doc(root)
        paths = {split: _find(root, f"genes.gb.{split}") for split in ("train", "test")}
    if None in paths.values():
        raise FileNotFoundError(MISSING_DATA_HELP.format(root=os.path.abspath(root), subdir=TUTORIAL_SUBDIR))
    return paths


def fetch_augustus_doc(root: str) -> None:
    """``apt-get download augustus-doc`` into a temporary folder and ``dpkg -x`` it into ``root``."""
    for tool in ("apt-get", "dpkg"):
        if shutil.which(tool) is None:
            raise FileNotFoundError(
                f"fetching the AUGUSTUS tutorial data needs {tool} (Debian/Ubuntu); "
                + MISSING_DATA_HELP.format(root=os.path.abspath(root), subdir=TUTORIAL_SUBDIR)
            )
    os.makedirs(root, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["apt-get", "download", "augustus-doc"], cwd=tmp, check=True, capture_output=True)
        debs = glob.glob(os.path.join(tmp, "augustus-doc_*.deb"))
        if not debs:
            raise FileNotFoundError("apt-get download augustus-doc produced no .deb file")
        subprocess.run(["dpkg", "-x", debs[0], root], check=True, capture_output=True)
