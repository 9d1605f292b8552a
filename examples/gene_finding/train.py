"""Train the semi-CRF gene finder and its two baselines on the AUGUSTUS tutorial's genes.gb.train.

Model selection uses a validation split of genes.gb.train only (``--val-fraction``, fixed seed).
After training, each model's best checkpoint predicts genes.gb.test once (``--test``), written as
GFF3; ``evaluate.py`` turns those files into the result table.

    python examples/gene_finding/train.py --download --out runs/genes            # everything, GPU if present
    python examples/gene_finding/train.py --smoke --download --out /tmp/smoke      # a CPU smoke run (~30 s)

Outputs in ``--out``: ``train.log``, ``metrics.json`` (configuration, validation history, times),
``<model>.pt`` (best checkpoint) and ``test_<model>.gff3`` per model.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
import traceback

import numpy as np
import torch

from torch_semimarkov.genomics.genbank import load_genbank, tutorial_data
from torch_semimarkov.genomics.gff import write_gff3
from torch_semimarkov.genomics.models import MODEL_KINDS, build_model
from torch_semimarkov.genomics.pipeline import predict_records, save_checkpoint, train_model
from torch_semimarkov.genomics.records import records_summary

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=os.path.join(HERE, "data"), help="folder holding (or receiving) the augustus-doc files")
    p.add_argument("--download", action="store_true", help="fetch augustus-doc with apt-get download if the data are missing")
    p.add_argument("--train", help="GenBank training file (default: the tutorial's genes.gb.train)")
    p.add_argument("--test", help="GenBank test file predicted once at the end (default: genes.gb.test; 'none' to skip)")
    p.add_argument("--out", default="gene_finding_out")
    p.add_argument("--models", default=",".join(MODEL_KINDS), help="comma-separated, from " + ", ".join(MODEL_KINDS))
    p.add_argument("--max-duration", type=int, default=960, help="K of the semi-CRF (a multiple of 3)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--window", type=int, default=3000, help="training window length (bases)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--crf-lr", type=float, default=2e-2)
    p.add_argument("--budget", default="semicrf=270,crf=75,softmax=60", help="training seconds per model, e.g. semicrf=270,crf=75")
    p.add_argument("--eval-every", type=float, default=45.0, help="seconds between validation passes")
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--max-tokens", type=int, default=2_000_000, help="positions per prediction batch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--smoke", action="store_true",
                   help="a few short loci, K=60, hidden 16, a few steps: checks the pipeline end to end")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    log_file = open(os.path.join(args.out, "train.log"), "a")

    def log(msg: str) -> None:
        print(msg, flush=True)
        log_file.write(msg + "\n")
        log_file.flush()

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else "cpu" if args.device == "auto" else args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # the streaming engine's small per-position ops run fastest on one thread
    budgets = {k: float(v) for k, v in (item.split("=") for item in args.budget.split(","))}
    if args.train is None or args.test is None:
        paths = tutorial_data(args.data, download=args.download)
        args.train = args.train or paths["train"]
        args.test = args.test or paths["test"]
    records = load_genbank(args.train)
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(records))
    n_val = max(1, int(round(args.val_fraction * len(records))))
    val = [records[i] for i in sorted(order[:n_val])]
    train = [records[i] for i in sorted(order[n_val:])]
    test = load_genbank(args.test) if args.test != "none" else []
    if args.smoke:
        train = sorted(train, key=len)[:6]
        val = sorted(val, key=len)[:2]
        test = sorted(test, key=len)[:2]
        args.max_duration, args.hidden, args.window, args.batch_size = 60, 16, 1000, 4
        args.max_steps = args.max_steps or 3
        budgets = {k: 20.0 for k in MODEL_KINDS}
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    log(f"$ {' '.join(shlex.quote(a) for a in sys.argv)}")
    log(f"device {device} ({gpu}), torch {torch.__version__}")
    log(f"train: {records_summary(train)}; validation: {records_summary(val)}; test: {records_summary(test)}")

    metrics_path = os.path.join(args.out, "metrics.json")
    summary = json.load(open(metrics_path)) if os.path.exists(metrics_path) else {}
    summary["data"] = {"train": args.train, "test": args.test, "val_names": [r.name for r in val],
                       "n_train": len(train), "n_val": len(val), "n_test": len(test)}
    summary["device"] = gpu
    for kind in args.models.split(","):
        config = {"kind": kind, "hidden": args.hidden}
        if kind == "semicrf":
            config["max_duration"] = args.max_duration
        torch.manual_seed(args.seed)
        model = build_model(**config)
        n_params = sum(p.numel() for p in model.parameters())
        log(f"== {kind}: {n_params} parameters, config {config}, budget {budgets[kind]:.0f}s")
        ckpt = os.path.join(args.out, f"{kind}.pt")

        def on_best(res, kind=kind, model=model, config=config, ckpt=ckpt):
            save_checkpoint(ckpt, model, config, {"val_metrics": res["best_metrics"], "step": res["steps"]})

        if device.type == "cuda":
            torch.cuda.synchronize()
        try:
            res = train_model(
                model, train, val, budgets[kind], window=args.window, batch_size=args.batch_size, lr=args.lr,
                crf_lr=args.crf_lr, eval_every=args.eval_every, max_steps=args.max_steps, device=device,
                seed=args.seed, max_tokens=args.max_tokens, log=log, on_best=on_best,
            )
        except Exception:  # one model failing must not cost the others' results
            log(f"  {kind} failed:\n{traceback.format_exc()}")
            continue
        save_checkpoint(ckpt, model, config, {"val_metrics": res["best_metrics"], "steps": res["steps"]})
        entry = {"config": config, "parameters": n_params, "train_seconds": round(res["seconds"], 1),
                 "steps": res["steps"], "epochs": res["epochs"], "val_best": res["best_metrics"],
                 "val_history": res["history"]}
        if test:
            t0 = time.perf_counter()
            pred = predict_records(model, test, device, args.max_tokens)
            entry["test_predict_seconds"] = round(time.perf_counter() - t0, 1)
            gff = os.path.join(args.out, f"test_{kind}.gff3")
            write_gff3(gff, pred, lengths={r.name: len(r) for r in test},
                       header=[f"{kind} model ({config}), best of validation; made by:",
                               " ".join(shlex.quote(a) for a in sys.argv)])
            log(f"  test predictions: {gff} ({sum(len(g) for g in pred.values())} genes, {entry['test_predict_seconds']}s)")
        summary.setdefault("models", {})[kind] = entry
        with open(metrics_path, "w") as f:
            json.dump(summary, f, indent=1)
    log_file.close()
    return summary


if __name__ == "__main__":
    main()
