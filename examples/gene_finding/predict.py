"""Predict genes with a trained checkpoint: GenBank or FASTA in, GFF3 out.

    python examples/gene_finding/predict.py --checkpoint runs/semicrf.pt --input genes.gb.test --out pred.gff3
    python examples/gene_finding/predict.py --checkpoint runs/semicrf.pt --input contigs.fa --out pred.gff3

Whole sequences are decoded (Viterbi for the CRFs, argmax for the softmax baseline); on CUDA the
semi-CRF uses the Triton kernels. The GFF3 has gene / mRNA / exon / CDS (and start / stop codon)
lines per predicted gene, seqid = the LOCUS (GenBank) or the first word of the header (FASTA); genes
cut by a sequence's edge or without a start or stop codon in the sequence are marked partial
(``partial=true``, ``start_range`` / ``end_range``; see ``torch_semimarkov.genomics.gff``).

With ``--ghmm TRAIN.gb`` instead of a checkpoint, the generalised HMM (``torch_semimarkov.genomics.ghmm``)
is fitted on the annotated GenBank loci of TRAIN.gb in seconds, with the configuration 5-fold
cross-validation chose on genes.gb.train (``results/ghmm_cv_tail.json``: order-3 chains, smoothing 2,
K = 960 with intron tails from 960 bases, as good in CV as K = 8000 without tails and 5x faster;
``--order``, ``--smoothing``, ``--max-duration``, ``--intron-tail`` change it), and decodes with the compiled
CPU engine's Viterbi; column 6 of its exon and CDS lines is ``min(P(exon start), P(exon end))`` from
the engine's marginals, an upper bound of the exon's posterior probability.

    python examples/gene_finding/predict.py --ghmm genes.gb.train --input genes.gb.test --out pred.gff3 --alternatives 3

``--mea KAPPA`` decodes the GHMM by its posteriors instead (maximum expected boundary accuracy,
:func:`torch_semimarkov.genomics.feature_crf.mea_decode`): the parse whose coding segments' mean
boundary posteriors most exceed KAPPA; 5-fold CV on genes.gb.train chose 0.6 (``mea_cv.py``), which
keeps fewer, surer exons than Viterbi.

``--feature-crf MODEL.pt --ghmm TRAIN.gb`` predicts with a trained feature semi-CRF
(:class:`torch_semimarkov.genomics.feature_crf.FeatureCRF`, written by ``train_crf.py`` as
``feature_crf.pt``): the GHMM is refitted on TRAIN.gb with the configuration saved in MODEL.pt (the
chain and length options above are then not used), the model's learned weights and site scores are
loaded over it, and each sequence is decoded by Viterbi, or by posteriors with ``--mea`` (the gene
finder's selected model: ``results/feature_crf_site_scores.pt`` with ``--mea 0.6``):

    python examples/gene_finding/predict.py --ghmm genes.gb.train \
        --feature-crf examples/gene_finding/results/feature_crf_site_scores.pt --mea 0.6 \
        --input contigs.fa --out pred.gff3

``--alternatives N`` adds up to N alternative transcripts per sequence (GHMM and semi-CRF
checkpoints), from the engine's exact samples of P(segmentation | sequence) (default,
``--samples`` draws; a transcript's probability is the fraction of samples that hold it, an
unbiased estimate of its posterior probability) or from its k best parses
(``--alternatives-from topk``, k = N + 1 at least; a transcript's probability is the summed
probability of the parses among the k that hold it, a lower bound). An alternative is a transcript
(strand and exon chain) that is not a predicted one; it becomes one more ``mRNA`` of the predicted
gene it overlaps most on its strand (IDs ``.t2``, ``.t3``, ...), or a gene of its own; its ``mRNA``
line has ``alternative=true``, ``probability=`` (also column 6), ``rank=`` and
``probability_from=``. ``read_cds`` (and so ``evaluate.py``) leaves alternatives out. Parses that
differ only in where an exon or intron longer than K is cut hold the same transcripts, so the k best
can yield fewer than N alternatives (measured: none from the 4 best on 5 of 6 short test loci at
K = 120, where long exons are continuation pieces). Sampling is
the default because the k-best lists have no compiled CPU engine: on one CPU thread the PyTorch
path took over 10 minutes for k = 3 on one 4.5 kb locus at K = 960, 20 samples 0.25 s.

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

from torch_semimarkov.genomics.genbank import load_genbank, load_sequences
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


def _posteriors():
    """The example's posteriors module (beside this script), imported by path."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("gene_finding_posteriors", os.path.join(here, "posteriors.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def predict_ghmm(args, records, log):
    """GHMM predictions, exon scores and alternatives of the records (see the module docstring)."""
    from torch_semimarkov.genomics.ghmm import GHMM, GHMMConfig

    post = _posteriors()
    t = time.perf_counter()
    train = load_genbank(args.ghmm)
    tail = args.max_duration if args.intron_tail < 0 else args.intron_tail
    cfg = GHMMConfig(order=args.order, smoothing=args.smoothing, max_duration=args.max_duration, intron_tail=tail)
    model = GHMM.fit(train, cfg)
    log(f"GHMM fitted on {len(train)} loci of {args.ghmm} in {time.perf_counter() - t:.1f}s")
    pred, scores, alts = {}, {}, {}
    coding = [lab.coding for lab in model.grammar.labels]
    if args.mea is not None:
        from torch_semimarkov import numba_available
        from torch_semimarkov.genomics.feature_crf import mea_decode

        backend = "numba" if numba_available() else "torch"
    for i, rec in enumerate(records):
        inp = post.ghmm_inputs(model, rec)
        m = post.marginals(inp)
        if args.mea is None:
            segs, _ = model.decode_segments(rec)
        else:
            segs = mea_decode(inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, inp.K, coding,
                              [args.mea], proj_start=inp.proj_start, proj_end=inp.proj_end, marginals=m,
                              backend=backend)[args.mea][0]
        genes = model.grammar.decode(segs)
        bounds = post.exon_bounds(m, segs, model.grammar)
        pred[rec.name], scores[rec.name] = genes, post.gene_exon_scores(genes, bounds)
        if args.alternatives > 0:
            if args.alternatives_from == "sample":
                parses, weights = post.sample_parses(inp, args.samples, args.seed + i)
                how = f"{args.samples} samples"
            else:
                k = max(args.alternatives + 1, args.k)
                parses, weights = post.topk_parses(inp, k, float(m.log_Z[0]))
                how = f"top {k} parses"
            for p_ in parses:
                for key, v in post.exon_bounds(m, p_, model.grammar).items():
                    bounds.setdefault(key, v)
            alts[rec.name], _ = post.alternatives(genes, [model.grammar.decode(p_) for p_ in parses], weights,
                                                  args.alternatives, how, bounds=bounds)
    how = "Viterbi" if args.mea is None else f"posterior (MEA) decoding, threshold {args.mea:g}"
    return pred, scores, alts, f"GHMM {cfg.to_dict()} fitted on {args.ghmm}, {how}"


def predict_feature_crf(args, records, device, log):
    """Predictions and exon scores of a saved feature semi-CRF (``--feature-crf``) over the GHMM
    refitted on ``--ghmm`` with the saved configuration, one sequence at a time."""
    from torch_semimarkov.genomics.feature_crf import FeatureCRF, pack
    from torch_semimarkov.genomics.ghmm import GHMM

    t = time.perf_counter()
    cfg = FeatureCRF.saved_config(args.feature_crf)
    ghmm = GHMM.fit(load_genbank(args.ghmm), cfg)
    model = FeatureCRF.load(args.feature_crf, ghmm).to(device)
    log(f"feature CRF {args.feature_crf}: GHMM fitted on {args.ghmm} in {time.perf_counter() - t:.1f}s")
    dtype = torch.float32 if device.type == "cuda" else torch.float64
    pred, scores = {}, {}
    for rec in records:
        batch = pack([ghmm.features(rec)], device=device, dtype=dtype)
        m = model.marginals(batch, dtype)
        segs = model.decode(batch, dtype) if args.mea is None else \
            model.decode_mea(batch, [args.mea], dtype, marginals=m)[args.mea]
        genes = model.grammar.decode(segs[0])
        bounds = model.exon_posteriors(batch, segs, dtype, marginals=m)[0]
        pred[rec.name] = genes
        scores[rec.name] = [[bounds.get((e.start, e.end)) for e in g.exons] for g in genes]
    how = "Viterbi" if args.mea is None else f"posterior (MEA) decoding, threshold {args.mea:g}"
    return pred, scores, f"feature CRF {args.feature_crf} over a GHMM {cfg.to_dict()} fitted on {args.ghmm}, {how}"


def semicrf_alternatives(args, model, records, pred, device):
    """Alternatives of a semi-CRF checkpoint's predictions (one sequence at a time)."""
    from torch_semimarkov.genomics.records import encode_dna

    post = _posteriors()
    alts = {}
    with torch.no_grad():
        for i, rec in enumerate(records):
            codes = torch.as_tensor(encode_dna(rec.sequence)).long()[None].to(device)
            lengths = torch.tensor([len(rec)], device=device)
            h = model.head_inputs(codes)
            if args.alternatives_from == "sample":
                gen = torch.Generator(device=device).manual_seed(args.seed + i)
                out = model.head.sample(h, lengths, args.samples, generator=gen)
                parses = [[tuple(map(int, s)) for s in segs] for segs in out.segments]
                weights, how = [1.0 / args.samples] * len(parses), f"{args.samples} samples"
            else:
                k = max(args.alternatives + 1, args.k)
                log_z = float(model.head.marginals(h, lengths).log_Z[0])
                out = model.head.topk(h, lengths, k)
                parses, weights = [], []
                for r, segs in enumerate(out.segments):
                    if torch.isfinite(out.scores[0, r]):
                        parses.append([tuple(map(int, s)) for s in segs])
                        weights.append(float(torch.exp(out.scores[0, r].double() - log_z)))
                how = f"top {k} parses"
            alts[rec.name], _ = post.alternatives(pred[rec.name], [model.grammar.decode(p_) for p_ in parses],
                                                  weights, args.alternatives, how)
    return alts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--checkpoint", help="a <model>.pt written by train.py")
    which.add_argument("--ghmm", metavar="TRAIN_GB", help="fit the generalised HMM on these annotated GenBank loci "
                                                         "(e.g. genes.gb.train) and predict with it")
    p.add_argument("--feature-crf", metavar="MODEL_PT", help="with --ghmm: a feature semi-CRF saved by train_crf.py "
                   "(feature_crf.pt), over the GHMM refitted with its saved configuration")
    p.add_argument("--input", required=True, help="GenBank (.gb) or FASTA file, optionally .gz")
    p.add_argument("--out", required=True, help="GFF3 output")
    p.add_argument("--device", default="auto")
    p.add_argument("--max-tokens", type=int, default=2_000_000, help="positions per batch")
    p.add_argument("--order", type=int, default=3, help="GHMM: Markov chain order (CV chose 3)")
    p.add_argument("--smoothing", type=float, default=2.0, help="GHMM: chain smoothing (CV chose 2)")
    p.add_argument("--max-duration", type=int, default=960, help="GHMM: K (CV chose 960 with intron tails)")
    p.add_argument("--intron-tail", type=int, default=-1, metavar="E",
                   help="GHMM: introns of E bases or more get a geometric length tail and may be longer "
                        "than K (-1: E = K, the CV choice; 0: off, introns longer than K are cut)")
    p.add_argument("--mea", type=float, default=None, metavar="KAPPA",
                   help="GHMM: decode by posteriors (maximum expected boundary accuracy) with this threshold instead "
                        "of Viterbi; 5-fold CV on genes.gb.train chose 0.6 (results/ghmm_mea_cv.json)")
    p.add_argument("--alternatives", type=int, default=0, metavar="N",
                   help="up to N alternative transcripts per sequence (GHMM, semi-CRF checkpoints)")
    p.add_argument("--alternatives-from", choices=("sample", "topk"), default="sample",
                   help="exact samples (default) or the k best parses")
    p.add_argument("--samples", type=int, default=100, help="samples per sequence for --alternatives")
    p.add_argument("--k", type=int, default=0, help="parses for --alternatives-from topk (default N + 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the samples (sequence i uses seed + i)")
    args = p.parse_args(argv)
    if args.alternatives < 0 or args.samples < 1:
        p.error("--alternatives must be >= 0 and --samples >= 1")
    if args.mea is not None and args.ghmm is None:
        p.error("--mea decodes the generalised HMM by its posteriors: use it with --ghmm")
    if args.feature_crf is not None and args.ghmm is None:
        p.error("--feature-crf needs --ghmm TRAIN_GB (the loci its GHMM is refitted on)")
    if args.feature_crf is not None and args.alternatives > 0:
        p.error("--alternatives is not available with --feature-crf (use --ghmm alone or a --checkpoint)")
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else "cpu" if args.device == "auto" else args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    for flag, path in (("--checkpoint", args.checkpoint), ("--ghmm", args.ghmm), ("--feature-crf", args.feature_crf)):
        if path is not None and not os.path.exists(path):
            p.error(f"{flag} {path}: no such file")
    try:
        all_records, warns = read_records(args.input)
    except (OSError, ValueError) as err:
        p.error(str(err))
    records, more = usable_records(all_records, args.input)
    for msg in warns + more:
        _warn(msg)
    t0 = time.perf_counter()
    cmd = " ".join(shlex.quote(a) for a in sys.argv)
    pred, scores, alts = {}, None, None
    what = f"model from {args.checkpoint}" if args.checkpoint else f"GHMM fitted on {args.ghmm}"
    if records and args.feature_crf:
        pred, scores, what = predict_feature_crf(args, records, device, print)
    elif records and args.ghmm:
        pred, scores, alts, what = predict_ghmm(args, records, print)
    elif records:
        model = load_checkpoint(args.checkpoint).to(device)
        if args.alternatives > 0 and getattr(model, "kind", None) != "semicrf":
            p.error(f"--alternatives needs a semi-CRF (or --ghmm); {args.checkpoint} is a {model.checkpoint['config'].get('kind')}")
        pred = predict_records(model, records, device, args.max_tokens)
        what = f"{model.checkpoint['config']} from {args.checkpoint}"
        if args.alternatives > 0:
            alts = semicrf_alternatives(args, model, records, pred, device)
    header = [f"{what}; made by:", cmd]
    if args.alternatives > 0:
        header.insert(1, f"alternatives (mRNA alternative=true): up to {args.alternatives} per sequence from "
                         + (f"{args.samples} exact samples (probability: fraction of samples holding the transcript)"
                            if args.alternatives_from == "sample" else
                            "the k best parses (probability: summed probability of those holding the transcript)"))
    write_gff3(args.out, pred, lengths={r.name: len(r) for r in records}, header=header,
               sequences={r.name: r.sequence for r in records}, exon_scores=scores, alternatives=alts)
    n = sum(len(g) for g in pred.values())
    if alts:
        n_alt = sum(len(a) for a in alts.values())
        print(f"{n_alt} alternative transcripts")
    skipped = f" ({len(all_records) - len(records)} skipped)" if len(records) < len(all_records) else ""
    print(f"{len(records)} sequences{skipped}, {n} genes predicted in {time.perf_counter() - t0:.1f}s -> {args.out}")
    if all_records and not records:
        print(f"predict.py: error: {args.input}: none of its {len(all_records)} records could be predicted",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
