"""Training with a time budget and model selection on validation loci, checkpoints, and prediction.

:func:`train_model` runs AdamW over fresh windows every epoch (:func:`~.batches.window_batches`),
with a learning rate that follows a cosine over the time budget rather than over a step count, so
that a run stops on time on any GPU. Every ``eval_every`` seconds (and at the end) it predicts the
validation loci whole, scores them with :func:`~.evaluate.evaluate_predictions`, and keeps the
parameters with the best exon F1 + gene F1.

Example:
    >>> from torch_semimarkov.genomics.records import Exon, Gene, GenomicRecord
    >>> rec = GenomicRecord("s", "ATGAAACCC" * 20, [Gene("g", "+", (Exon(30, 60), Exon(90, 120)))])
    >>> model = build_model("softmax", hidden=8)
    >>> result = train_model(model, [rec], [rec], budget_s=0.5, window=100, batch_size=2, eval_every=100, log=None)
    >>> result["steps"] > 0, sorted(result["best_metrics"])[:2]
    (True, ['exon_anno', 'exon_f1'])
    >>> list(predict_records(model, [rec]))
    ['s']
"""

from __future__ import annotations

import math
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
from torch import nn

from torch_semimarkov.demo import batch_to, train_step
from torch_semimarkov.genomics.batches import locus_batches, prepare_loci, window_batches
from torch_semimarkov.genomics.evaluate import evaluate_predictions
from torch_semimarkov.genomics.models import CodonCRFTagger, SemiCRFGeneFinder, build_model
from torch_semimarkov.genomics.records import Gene, GenomicRecord

__all__ = ["train_model", "predict_records", "save_checkpoint", "load_checkpoint", "build_model"]


@torch.no_grad()
def predict_records(model: nn.Module, records: Sequence[GenomicRecord], device="cpu", max_tokens: int = 1_000_000,
                    max_batch: int = 64) -> Dict[str, List[Gene]]:
    """Predicted genes of whole records: ``{record name: [Gene, ...]}`` in the records' order."""
    model.eval()
    out: Dict[str, List[Gene]] = {}
    for idx, batch in locus_batches(records, max_tokens, max_batch):
        batch = batch_to(batch, device)
        for i, genes in zip(idx, model.predict_genes(batch["codes"], batch["lengths"])):
            out[records[i].name] = genes
    return {r.name: out[r.name] for r in records}


def train_model(
    model: nn.Module,
    train: Sequence[GenomicRecord],
    val: Sequence[GenomicRecord],
    budget_s: float,
    window: int = 3000,
    batch_size: int = 32,
    lr: float = 2e-3,
    crf_lr: float = 2e-2,
    weight_decay: float = 1e-4,
    eval_every: float = 60.0,
    max_steps: Optional[int] = None,
    device="cpu",
    seed: int = 0,
    max_tokens: int = 1_000_000,
    log: Optional[Callable[[str], None]] = print,
    on_best: Optional[Callable[[dict], None]] = None,
    init_from_data: bool = True,
) -> dict:
    """Train ``model`` on windows of ``train`` for ``budget_s`` seconds, selecting on ``val``.

    Args:
        model: from :func:`~.models.build_model`.
        train, val: annotated records (the validation loci are predicted whole).
        budget_s: wall-clock training budget in seconds (evaluations included).
        window, batch_size: training windows of about ``window`` bases, ``batch_size`` per step.
        lr, crf_lr: learning rates of the network and of the CRF's own parameters (transitions,
            durations, stop penalty), which are few and need to move by several nats.
        eval_every: seconds between validation passes.
        max_steps: stop after this many steps even within the budget.
        on_best: called with the result dict whenever the best validation score improves.
        init_from_data: start a CRF's transitions (and the semi-CRF's durations) at the training
            data's gold statistics (``init_from_gold``) before training.

    Returns:
        ``{"best_state", "best_score", "best_metrics", "history", "steps", "epochs", "seconds"}``;
        ``model`` is left holding the best parameters.
    """
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    # the baselines never see the grammar's segments: any K that holds the longest exon will do
    K = model.head.max_duration if isinstance(model, SemiCRFGeneFinder) else max(len(r) for r in train)
    loci = prepare_loci(train, K)
    if init_from_data and isinstance(model, SemiCRFGeneFinder):
        model.head.init_from_gold([model.grammar.split_runs(loc.runs, K) for loc in loci])
    elif init_from_data and isinstance(model, CodonCRFTagger):
        model.init_from_gold([loc.codon_labels for loc in loci])
    model.to(device)
    head = getattr(model, "head", None)
    crf_ids = {id(p) for p in head.crf_parameters()} if head is not None and hasattr(head, "crf_parameters") else set()
    groups = [{"params": [p for p in model.parameters() if id(p) not in crf_ids], "lr": lr, "weight_decay": weight_decay}]
    if crf_ids:
        groups.append({"params": [p for p in model.parameters() if id(p) in crf_ids], "lr": crf_lr, "weight_decay": 0.0})
    opt = torch.optim.AdamW(groups)
    base_lrs = [g["lr"] for g in opt.param_groups]
    result = {"best_state": None, "best_score": -math.inf, "best_metrics": None, "history": [], "steps": 0, "epochs": 0}
    t0 = time.perf_counter()
    last_eval = t0
    warmup = 50

    def evaluate(tag: str) -> None:
        nonlocal last_eval
        te = time.perf_counter()
        metrics = evaluate_predictions(val, predict_records(model, val, device, max_tokens))
        score = metrics["exon_f1"] + metrics["gene_f1"]
        entry = {"step": result["steps"], "epoch": result["epochs"], "seconds": round(te - t0, 1),
                 "eval_seconds": round(time.perf_counter() - te, 1), "loss": round(run_loss, 5),
                 **{k: round(v, 4) for k, v in metrics.items() if k.endswith(("sens", "spec", "f1"))}}
        result["history"].append(entry)
        better = score > result["best_score"]
        if better:
            result["best_score"] = score
            result["best_metrics"] = metrics
            result["best_state"] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        if log:
            log(f"  [{tag}] step {result['steps']} epoch {result['epochs']} {entry['seconds']:.0f}s loss {run_loss:.4f} | "
                f"val nuc F1 {metrics['nuc_f1']:.3f} exon F1 {metrics['exon_f1']:.3f} gene F1 {metrics['gene_f1']:.3f}"
                f"{' *' if better else ''} (eval {entry['eval_seconds']}s)")
        if better and on_best is not None:
            on_best(result)
        model.train()
        last_eval = time.perf_counter()

    run_loss = float("nan")
    model.train()
    done = False
    while not done:
        for batch in window_batches(loci, window, batch_size, rng):
            elapsed = time.perf_counter() - t0
            if elapsed >= budget_s or (max_steps is not None and result["steps"] >= max_steps):
                done = True
                break
            scale = min(1.0, (result["steps"] + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, elapsed / budget_s)))
            for g, base in zip(opt.param_groups, base_lrs):
                g["lr"] = base * max(scale, 0.02)
            loss = train_step(model, opt, batch, device)
            value = float(loss.detach())
            run_loss = value if math.isnan(run_loss) else 0.95 * run_loss + 0.05 * value
            result["steps"] += 1
            if time.perf_counter() - last_eval >= eval_every:
                evaluate(f"{result['steps']}")
        else:
            result["epochs"] += 1
    evaluate("final")
    result["seconds"] = time.perf_counter() - t0
    model.load_state_dict(result["best_state"])
    return result


def save_checkpoint(path: str, model: nn.Module, config: dict, extra: Optional[dict] = None) -> None:
    """``{"config": build_model kwargs, "state_dict": ..., **extra}`` to ``path``."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    torch.save({"config": dict(config), "state_dict": state, **(extra or {})}, path)


def load_checkpoint(path: str, map_location="cpu") -> nn.Module:
    """The model saved by :func:`save_checkpoint`, in eval mode."""
    ckpt = torch.load(path, map_location=map_location, weights_only=False)
    model = build_model(**ckpt["config"])
    model.load_state_dict(ckpt["state_dict"])
    model.eval()
    model.checkpoint = {k: v for k, v in ckpt.items() if k != "state_dict"}
    return model
