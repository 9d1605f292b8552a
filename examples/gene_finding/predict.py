"""Predict genes with a trained checkpoint: GenBank or FASTA in, GFF3 out.

    python examples/gene_finding/predict.py --checkpoint runs/semicrf.pt --input genes.gb.test --out pred.gff3
    python examples/gene_finding/predict.py --checkpoint runs/semicrf.pt --input contigs.fa --out pred.gff3

Whole sequences are decoded (Viterbi for the CRFs, argmax for the softmax baseline); on CUDA the
semi-CRF uses the Triton kernels. The GFF3 has one gene / mRNA / CDS set per predicted gene, seqid =
the LOCUS (GenBank) or the first word of the header (FASTA).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

import torch

from torch_semimarkov.genomics.genbank import load_sequences
from torch_semimarkov.genomics.gff import write_gff3
from torch_semimarkov.genomics.pipeline import load_checkpoint, predict_records


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
    model = load_checkpoint(args.checkpoint).to(device)
    records = load_sequences(args.input)
    t0 = time.perf_counter()
    pred = predict_records(model, records, device, args.max_tokens)
    cmd = " ".join(shlex.quote(a) for a in sys.argv)
    write_gff3(args.out, pred, lengths={r.name: len(r) for r in records},
               header=[f"{model.checkpoint['config']} from {args.checkpoint}; made by:", cmd])
    n = sum(len(g) for g in pred.values())
    print(f"{len(records)} sequences, {n} genes predicted in {time.perf_counter() - t0:.1f}s -> {args.out}")


if __name__ == "__main__":
    main()
