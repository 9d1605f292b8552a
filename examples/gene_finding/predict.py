"""Predict genes with a trained checkpoint: GenBank or FASTA in, GFF3 out.

    python examples/gene_finding/predict.py --checkpoint runs/semicrf.pt --input genes.gb.test --out pred.gff3
    python examples/gene_finding/predict.py --checkpoint runs/semicrf.pt --input contigs.fa --out pred.gff3

Whole sequences are decoded (Viterbi for the CRFs, argmax for the softmax baseline); on CUDA the
semi-CRF uses the Triton kernels. The GFF3 has gene / mRNA / exon / CDS (and start / stop codon)
lines per predicted gene, seqid = the LOCUS (GenBank) or the first word of the header (FASTA); genes
cut by a sequence's edge or without a start or stop codon in the sequence are marked partial
(``partial=true``, ``start_range`` / ``end_range``; see ``torch_semimarkov.genomics.gff``).

Input checks (warnings on stderr, naming the file and the record; the good records are predicted):
an empty file or a file without records (an empty GFF3 is written); an empty record; a record that
is not DNA (more than half of its letters are not A, C, G, T or N, e.g. protein FASTA) or has no
A, C, G or T; a record whose name was already used (the first is kept). Those records are skipped.
Characters that are not IUPAC nucleotide codes are warned about and read as N. The exit status is
1 when the input held records but none could be predicted, 0 otherwise.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shlex
import sys
import time
from collections import Counter
from typing import List, Sequence, Tuple

import torch

from torch_semimarkov.genomics.genbank import load_sequences
from torch_semimarkov.genomics.gff import write_gff3
from torch_semimarkov.genomics.pipeline import load_checkpoint, predict_records
from torch_semimarkov.genomics.records import GenomicRecord

#: a record is not DNA when more than this fraction of its letters are not A, C, G, T or N
MAX_NON_ACGTN = 0.5
#: IUPAC nucleotide codes (read as unknown bases, like N)
IUPAC = frozenset("ACGTNURYSWKMBDHV")


def read_records(path: str) -> Tuple[List[GenomicRecord], List[str]]:
    """The records of a GenBank or FASTA file (``.gz`` too), and warnings for an empty file.

    Raises ``ValueError`` naming the file when it cannot be parsed as either format.
    """
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        empty = not any(line.strip() for line in f)
    if empty:
        return [], [f"{path}: the file is empty: no sequences to predict"]
    try:
        records = load_sequences(path)
    except Exception as err:  # Biopython's parser errors are several types
        raise ValueError(f"{path}: could not be read as FASTA or GenBank: {err}") from err
    if not records:
        return [], [f"{path}: no FASTA or GenBank records found: no sequences to predict"]
    return records, []


def usable_records(records: Sequence[GenomicRecord], path: str) -> Tuple[List[GenomicRecord], List[str]]:
    """The records worth predicting, and one warning (naming ``path`` and the record) per problem."""
    good, warns, seen = [], [], set()
    for i, rec in enumerate(records):
        where = f"{path}: record {i + 1} ({rec.name!r})"
        seq = rec.sequence.upper()
        if rec.name in seen:
            warns.append(f"{where}: the name was already used by an earlier record; skipped")
            continue
        seen.add(rec.name)
        if not seq:
            warns.append(f"{where}: the record is empty (no sequence); skipped")
            continue
        counts = Counter(seq)
        acgt = sum(counts[b] for b in "ACGT")
        other = len(seq) - acgt - counts["N"]
        if other > MAX_NON_ACGTN * len(seq):
            top = "".join(sorted((c for c in counts if c not in "ACGTN"), key=lambda c: -counts[c])[:8])
            warns.append(f"{where}: not DNA: {other} of {len(seq)} letters ({other / len(seq):.0%}) are not "
                         f"A, C, G, T or N (most frequent: {top!r}; a protein sequence?); skipped")
            continue
        if acgt == 0:
            warns.append(f"{where}: no A, C, G or T in {len(seq)} letters; skipped")
            continue
        bad = {c: n for c, n in counts.items() if c not in IUPAC}
        if bad:
            shown = "".join(sorted(bad, key=lambda c: -bad[c])[:8])
            warns.append(f"{where}: {sum(bad.values())} characters that are not nucleotide codes ({shown!r}); "
                         f"they are read as N")
        good.append(rec)
    return good, warns


def _warn(msg: str) -> None:
    print(f"predict.py: warning: {msg}", file=sys.stderr)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="a <model>.pt written by train.py")
    p.add_argument("--input", required=True, help="GenBank (.gb) or FASTA file, optionally .gz")
    p.add_argument("--out", required=True, help="GFF3 output")
    p.add_argument("--device", default="auto")
    p.add_argument("--max-tokens", type=int, default=2_000_000, help="positions per batch")
    args = p.parse_args(argv)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else "cpu" if args.device == "auto" else args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    if not os.path.exists(args.checkpoint):
        p.error(f"--checkpoint {args.checkpoint}: no such file")
    try:
        all_records, warns = read_records(args.input)
    except (OSError, ValueError) as err:
        p.error(str(err))
    records, more = usable_records(all_records, args.input)
    for msg in warns + more:
        _warn(msg)
    t0 = time.perf_counter()
    cmd = " ".join(shlex.quote(a) for a in sys.argv)
    pred, what = {}, f"model from {args.checkpoint}"
    if records:
        model = load_checkpoint(args.checkpoint).to(device)
        pred = predict_records(model, records, device, args.max_tokens)
        what = f"{model.checkpoint['config']} from {args.checkpoint}"
    write_gff3(args.out, pred, lengths={r.name: len(r) for r in records}, header=[f"{what}; made by:", cmd],
               sequences={r.name: r.sequence for r in records})
    n = sum(len(g) for g in pred.values())
    skipped = f" ({len(all_records) - len(records)} skipped)" if len(records) < len(all_records) else ""
    print(f"{len(records)} sequences{skipped}, {n} genes predicted in {time.perf_counter() - t0:.1f}s -> {args.out}")
    if all_records and not records:
        print(f"predict.py: error: {args.input}: none of its {len(all_records)} records could be predicted",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
