"""Gene-prediction accuracy at the nucleotide, exon and gene level, as AUGUSTUS reports it.

* **Nucleotide level**: coding positions (the union of CDS exons of either strand) of the
  annotation against those of the prediction; sensitivity = TP / annotated, specificity = TP /
  predicted.
* **Exon level**: a predicted CDS exon is correct when its start, end and strand equal an annotated
  exon's; distinct exons are counted once (AUGUSTUS's "unique" column).
* **Gene level**: a predicted gene (transcript) is correct when its set of CDS exons (and strand)
  equals an annotated gene's and it is complete (not ``partial``: AUGUSTUS does not count a gene
  cut by the sequence's edge, even with the right CDS); sensitivity = correct / annotated genes,
  specificity = correct / predicted genes (partial ones included).

Example:
    >>> from torch_semimarkov.genomics.records import Exon, Gene, GenomicRecord
    >>> anno = [GenomicRecord("s1", "A" * 100, [Gene("a", "+", (Exon(10, 20), Exon(30, 41)))])]
    >>> pred = {"s1": [Gene("p", "+", (Exon(10, 20), Exon(32, 41)))]}
    >>> m = evaluate_predictions(anno, pred)
    >>> m["exon_sens"], m["exon_spec"], m["gene_sens"], round(m["nuc_sens"], 3)
    (0.5, 0.5, 0.0, 0.905)
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Sequence

import numpy as np

from torch_semimarkov.genomics.records import Gene, GenomicRecord

__all__ = ["evaluate_predictions", "format_table", "f1"]


def f1(sens: float, spec: float) -> float:
    """Harmonic mean of sensitivity and specificity (0 when both are 0)."""
    return 0.0 if sens + spec == 0 else 2 * sens * spec / (sens + spec)


def _ratio(a: int, b: int) -> float:
    return a / b if b else 0.0


def evaluate_predictions(annotation: Sequence[GenomicRecord], predictions: Mapping[str, Sequence[Gene]]) -> Dict[str, float]:
    """Nucleotide, exon and gene sensitivity / specificity / F1 and the counts behind them.

    Args:
        annotation: the annotated records (their genes are the truth).
        predictions: ``{seqid: [Gene, ...]}``; sequences of the annotation without an entry have no
            predicted genes.

    Raises:
        ValueError: a prediction for a sequence that is not in the annotation, or past its end.
    """
    names = {r.name for r in annotation}
    unknown = sorted(set(predictions) - names)
    if unknown:
        raise ValueError(f"predictions for sequences that are not in the annotation: {unknown[:5]}")
    n = {"nuc_tp": 0, "nuc_anno": 0, "nuc_pred": 0, "exon_tp": 0, "exon_anno": 0, "exon_pred": 0,
         "gene_tp": 0, "gene_anno": 0, "gene_pred": 0}
    for rec in annotation:
        pred = list(predictions.get(rec.name, ()))
        L = len(rec)
        anno_mask = rec.coding_mask()
        pred_mask = np.zeros(L, dtype=bool)
        for g in pred:
            if g.end > L:
                raise ValueError(f"{rec.name}: predicted gene {g.id} ends at {g.end}, past the sequence's length {L}")
            for ex in g.exons:
                pred_mask[ex.start:ex.end] = True
        n["nuc_tp"] += int((anno_mask & pred_mask).sum())
        n["nuc_anno"] += int(anno_mask.sum())
        n["nuc_pred"] += int(pred_mask.sum())

        anno_exons = {(g.strand, ex) for g in rec.genes for ex in g.exons}
        pred_exons = {(g.strand, ex) for g in pred for ex in g.exons}
        n["exon_tp"] += len(anno_exons & pred_exons)
        n["exon_anno"] += len(anno_exons)
        n["exon_pred"] += len(pred_exons)

        anno_genes = {(g.strand, g.exons) for g in rec.genes}
        n["gene_tp"] += sum((g.strand, g.exons) in anno_genes and not g.partial for g in pred)
        n["gene_anno"] += len(rec.genes)
        n["gene_pred"] += len(pred)
    out: Dict[str, float] = dict(n)
    for level in ("nuc", "exon", "gene"):
        sens = _ratio(n[f"{level}_tp"], n[f"{level}_anno"])
        spec = _ratio(n[f"{level}_tp"], n[f"{level}_pred"])
        out[f"{level}_sens"], out[f"{level}_spec"], out[f"{level}_f1"] = sens, spec, f1(sens, spec)
    return out


def format_table(rows: Mapping[str, Mapping[str, float]], extra: Iterable[str] = ()) -> str:
    """A Markdown table: one row per model with nucleotide / exon / gene sens / spec (F1).

    ``extra`` names further columns taken from each row as is (e.g. ``"train_minutes"``).
    """
    extra = list(extra)
    head = "| model | nucleotide sens / spec (F1) | exon sens / spec (F1) | gene sens / spec (F1) |"
    head += "".join(f" {e} |" for e in extra)
    lines: List[str] = [head, "|---" * (4 + len(extra)) + "|"]
    for name, m in rows.items():
        cells = [f"{m[f'{lv}_sens']:.3f} / {m[f'{lv}_spec']:.3f} ({m[f'{lv}_f1']:.3f})" for lv in ("nuc", "exon", "gene")]
        cells += [str(m.get(e, "")) for e in extra]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
