"""Which head defaults lead to good models? Same-label transitions and the CRF learning rate.

Trains the demo's semi-CRF (``python -m torch_semimarkov demo``: the CNN encoder + head on the
synthetic genomics-like data, the same data, seed and schedule) under four settings and scores each
on the held-out sequences:

* ``allow_same_label_transitions`` True / False: with True, one run of a label can be cut into
  several segments (``c -> c``), and every cut is a different segmentation of the same labelling;
* the CRF parameters' learning rate: the encoder's (``crf_lr = lr``) or ten times it
  (``head.param_groups(lr)``, the default).

Reported per setting: segment F1 (exact segments), boundary F1, position accuracy, the mean entropy
(nats) of the distribution over segmentations of a held-out sequence (``head.entropy``), the share
of sampled segments (8 samples per held-out sequence) whose neighbour has the same label, the
fitted mean duration per label against the data's, and the training time. Results:
``benchmarks/results/cpu_head_defaults.json``.

Usage:
    python benchmarks/bench_head_defaults.py            # the demo's full configuration
    python benchmarks/bench_head_defaults.py --quick    # the demo's --quick configuration
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from torch_semimarkov.data import SyntheticGenomicsDataset, collate_segments
from torch_semimarkov.demo import DemoConfig, SemiCRFTagger, evaluate, make_encoder, train_model


def run(cfg: DemoConfig, same_label: bool, crf_lr: float):
    torch.manual_seed(cfg.seed)
    train = SyntheticGenomicsDataset(cfg.train_sequences, cfg.min_length, cfg.max_length, seed=cfg.seed)
    val = SyntheticGenomicsDataset(cfg.val_sequences, cfg.min_length, cfg.max_length, seed=cfg.seed + 10_000)
    C, K, F = train.num_classes, train.max_duration, train.num_features
    g = torch.Generator().manual_seed(cfg.seed)
    loader = DataLoader(train, batch_size=cfg.batch_size, shuffle=True, collate_fn=collate_segments, generator=g)
    val_loader = DataLoader(val, batch_size=cfg.batch_size, shuffle=False, collate_fn=collate_segments)
    torch.manual_seed(cfg.seed)
    model = SemiCRFTagger(make_encoder(cfg.encoder, F, cfg.hidden), C, K, allow_same_label_transitions=same_label)
    t0 = time.perf_counter()
    train_model(model, loader, cfg.epochs, cfg.lr, "cpu", "semi-CRF", progress=False, crf_lr=crf_lr)
    seconds = time.perf_counter() - t0
    metrics = evaluate(model, val_loader, "cpu")
    entropies, same, total = [], 0, 0
    with torch.no_grad():
        for batch in val_loader:
            h = model.encoder(batch["features"])
            dist = model.head.distribution(h, batch["lengths"])
            entropies.append(dist.entropy)
            s = dist.sample(8, generator=torch.Generator().manual_seed(0))
            for segs in s.segments:
                total += len(segs)
                same += sum(a.label == b.label for a, b in zip(segs, segs[1:]))
        # the fitted duration distribution's mean per label
        p = torch.softmax(model.head.duration_table(torch.float64), 0)
        k = torch.arange(1, K + 1, dtype=torch.float64)[:, None]
        mean_duration = (p * k).sum(0).tolist()
    true_mean = [float(x) for x in train.config.mean_duration]
    return {
        "allow_same_label_transitions": same_label, "crf_lr": crf_lr, "lr": cfg.lr,
        "segment_f1": metrics["segment_f1"], "boundary_f1@0": metrics["boundary_f1@0"],
        "position_accuracy": metrics["position_accuracy"],
        "mean_entropy_nats": float(torch.cat(entropies).mean()),
        "sampled_same_label_neighbour_share": same / max(total, 1),
        "fitted_mean_duration": mean_duration, "data_mean_duration": true_mean,
        "train_seconds": seconds,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=3, help="data / initialisation seeds per setting (0 .. n-1)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "cpu_head_defaults.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for seed in range(args.seeds):
        cfg = DemoConfig.quick(seed=seed) if args.quick else DemoConfig(seed=seed)
        for same_label, crf_lr in ((True, cfg.lr * 10), (False, cfg.lr * 10), (False, cfg.lr)):
            row = dict(run(cfg, same_label, crf_lr), seed=seed)
            print(json.dumps(row), flush=True)
            rows.append(row)
    # the mean over seeds of each setting
    summary = []
    for same_label, factor in ((True, 10), (False, 10), (False, 1)):
        sel = [r for r in rows if r["allow_same_label_transitions"] == same_label and r["crf_lr"] == r["lr"] * factor]
        keys = ("segment_f1", "boundary_f1@0", "position_accuracy", "mean_entropy_nats",
                "sampled_same_label_neighbour_share", "train_seconds")
        summary.append({"allow_same_label_transitions": same_label, "crf_lr_over_lr": factor, "seeds": len(sel),
                        **{k: sum(r[k] for r in sel) / len(sel) for k in keys}})
        print(json.dumps(summary[-1]), flush=True)
    cfg = DemoConfig.quick() if args.quick else DemoConfig()
    Path(args.out).write_text(json.dumps({"config": cfg.__dict__, "summary": summary, "rows": rows}, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
