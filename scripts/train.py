"""Train an encoder + SemiMarkovCRFHead on the synthetic genomics data, with the debugging switches
of the NaN-hunting guide.

    --no-triton         force the PyTorch streaming path (if a NaN goes away, suspect the kernels)
    --crf-reg L         add L * head.parameter_penalty() (L2 on transition / duration scores)
    --fixed-length N    crop/pad every sequence to exactly N (if a NaN goes away, suspect ragged lengths)

Every epoch logs the CRF parameter magnitudes at DEBUG level (``PYTHONLOGLEVEL=DEBUG``) and warns

    WARNING: Epoch N: CRF parameters drifting high! trans_max=X, dur_max=Y. Consider increasing --crf-reg.

when either exceeds ``--drift-threshold`` (default 20). A non-finite loss stops training with exit
status 1 and says at which step it happened.

Usage:
    python scripts/train.py --epochs 5 --crf-reg 0.01
    PYTHONLOGLEVEL=DEBUG python scripts/train.py --no-triton --fixed-length 200
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import torch
from torch.utils.data import DataLoader

from torch_semimarkov.data import SyntheticGenomicsDataset, collate_segments
from torch_semimarkov.demo import make_encoder
from torch_semimarkov.durations import DURATION_NAMES
from torch_semimarkov.metrics import SegmentationMetrics
from torch_semimarkov.nn import SemiMarkovCRFHead

logger = logging.getLogger("train")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--num-sequences", type=int, default=256)
    p.add_argument("--val-sequences", type=int, default=64)
    p.add_argument("--min-length", type=int, default=200)
    p.add_argument("--max-length", type=int, default=500)
    p.add_argument("--max-duration", type=int, default=64, help="K of the head")
    p.add_argument("--duration", default="learned", choices=DURATION_NAMES)
    p.add_argument("--encoder", default="cnn", choices=("cnn", "lstm"))
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="CPU threads for torch (1 is fastest for the CPU streaming engine)")
    p.add_argument("--no-triton", action="store_true", help="force the PyTorch streaming reference")
    p.add_argument("--crf-reg", type=float, default=0.0, help="weight of the L2 penalty on CRF parameters")
    p.add_argument("--fixed-length", type=int, default=None, help="crop/pad every sequence to this length")
    p.add_argument("--drift-threshold", type=float, default=20.0, help="warn when |CRF parameter| exceeds this")
    p.add_argument("--save", default=None, help="write the trained state_dict here")
    return p.parse_args(argv)


def crf_magnitudes(head: SemiMarkovCRFHead):
    tr = head.transition.detach()
    if head.allowed_transitions is not None:
        tr = tr.masked_fill(~head.allowed_transitions, 0.0)
    return float(tr.abs().max()), float(head.duration_bias.detach().abs().max())


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=os.environ.get("PYTHONLOGLEVEL", "INFO").upper(), format="%(levelname)s: %(message)s")
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else torch.device(args.device)
    if device.type == "cpu" and args.threads:
        torch.set_num_threads(args.threads)

    min_len = args.min_length if args.fixed_length is None else min(args.min_length, args.fixed_length)
    train = SyntheticGenomicsDataset(args.num_sequences, min_len, args.max_length, seed=args.seed)
    val = SyntheticGenomicsDataset(args.val_sequences, min_len, args.max_length, seed=args.seed + 10_000)

    def collate(batch):
        return collate_segments(batch, fixed_length=args.fixed_length)

    g = torch.Generator().manual_seed(args.seed)
    train_loader = DataLoader(train, batch_size=args.batch_size, shuffle=True, collate_fn=collate, generator=g)
    val_loader = DataLoader(val, batch_size=args.batch_size, collate_fn=collate)

    encoder = make_encoder(args.encoder, train.num_features, args.hidden).to(device)
    head = SemiMarkovCRFHead(
        train.num_classes, args.max_duration, hidden_dim=args.hidden, duration=args.duration,
        boundary_scores=True, use_triton=not args.no_triton,
    ).to(device)
    params = list(encoder.parameters()) + list(head.parameters())
    opt = torch.optim.Adam(params, lr=args.lr)
    backend = "PyTorch reference (--no-triton)" if args.no_triton or device.type != "cuda" else "Triton kernels if available"
    logger.info(
        "training on %s with %s: %d sequences, K=%d, crf_reg=%g, fixed_length=%s",
        device, backend, len(train), args.max_duration, args.crf_reg, args.fixed_length,
    )

    for epoch in range(1, args.epochs + 1):
        encoder.train()
        head.train()
        t0, total, n = time.perf_counter(), 0.0, 0
        for step, batch in enumerate(train_loader):
            batch = {k: v.to(device) for k, v in batch.items()}
            opt.zero_grad(set_to_none=True)
            nll = head.compute_loss(encoder(batch["features"]), batch["lengths"], batch["labels"], reduction="token_mean")
            loss = nll + args.crf_reg * head.parameter_penalty() if args.crf_reg > 0 else nll
            if not bool(torch.isfinite(loss)):
                logger.error("non-finite loss %s at epoch %d step %d; rerun with --no-triton / --fixed-length / --crf-reg to isolate", float(loss), epoch, step)
                return 1
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 5.0)
            opt.step()
            total += float(nll.detach())
            n += 1
        trans_max, dur_max = crf_magnitudes(head)
        logger.info("Epoch %d: loss %.4f (%.1fs)", epoch, total / max(n, 1), time.perf_counter() - t0)
        logger.debug("Epoch %d: CRF parameter magnitudes trans_max=%.3f, dur_max=%.3f", epoch, trans_max, dur_max)
        if max(trans_max, dur_max) > args.drift_threshold:
            logger.warning(
                "Epoch %d: CRF parameters drifting high! trans_max=%.2f, dur_max=%.2f. Consider increasing --crf-reg.",
                epoch, trans_max, dur_max,
            )

    metrics = SegmentationMetrics(tolerances=(0, 2))
    encoder.eval()
    with torch.no_grad():
        for batch in val_loader:
            batch = {k: v.to(device) for k, v in batch.items()}
            pred = head.decode(encoder(batch["features"]), batch["lengths"]).labels
            metrics.update(pred, batch["labels"], batch["lengths"])
    r = metrics.compute()
    logger.info(
        "held-out: segment F1 %.3f, boundary F1 exact %.3f / +-2 %.3f, position accuracy %.3f",
        r["segment_f1"], r["boundary_f1@0"], r["boundary_f1@2"], r["position_accuracy"],
    )
    if args.save:
        torch.save({"encoder": encoder.state_dict(), "head": head.state_dict(), "args": vars(args)}, args.save)
        logger.info("saved %s", args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
