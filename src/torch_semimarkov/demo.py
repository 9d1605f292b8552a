"""``python -m torch_semimarkov demo``: train a semi-CRF segmenter on synthetic genomics-like data.

A small encoder (a dilated CNN, or a BiLSTM) reads noisy per-position features; a
:class:`~torch_semimarkov.nn.SemiMarkovCRFHead` on top of it is trained by exact maximum likelihood.
Next to it, the same encoder with a per-position softmax is trained the same way. Both are scored on
held-out sequences (segment F1, boundary F1 exact and within a tolerance, position accuracy), and a
figure shows the true and predicted segmentations and the semi-CRF's boundary posterior along one
sequence. On CUDA the head uses the Triton kernels automatically.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import torch
from torch import nn
from torch.utils.data import DataLoader

from torch_semimarkov.data import LABELS, SyntheticGenomicsDataset, collate_segments
from torch_semimarkov.metrics import SegmentationMetrics
from torch_semimarkov.nn import SemiMarkovCRFHead

__all__ = ["DemoConfig", "CNNEncoder", "BiLSTMEncoder", "run_demo", "build_parser", "main"]

TOLERANCES = (0, 2)


@dataclass
class DemoConfig:
    """Sizes of one demo run (``quick`` shrinks everything to a smoke test)."""

    train_sequences: int = 512
    val_sequences: int = 128
    min_length: int = 150
    max_length: int = 350
    epochs: int = 12
    batch_size: int = 16
    hidden: int = 32
    encoder: str = "cnn"
    lr: float = 3e-3
    crf_lr: float = 3e-2
    seed: int = 0

    @classmethod
    def quick(cls, **overrides) -> "DemoConfig":
        base = dict(train_sequences=192, val_sequences=32, min_length=100, max_length=250, epochs=4, batch_size=16, hidden=32)
        base.update(overrides)
        return cls(**base)


class CNNEncoder(nn.Module):
    """Residual stack of dilated 1-D convolutions: (B, T, F) -> (B, T, H). Receptive field 1 + 2·(k-1)·(1+2+4)/2."""

    def __init__(self, in_dim: int, hidden: int = 32, kernel_size: int = 5, dilations: Sequence[int] = (1, 2, 4)):
        super().__init__()
        self.inp = nn.Linear(in_dim, hidden)
        self.convs = nn.ModuleList(
            nn.Conv1d(hidden, hidden, kernel_size, padding=d * (kernel_size - 1) // 2, dilation=d) for d in dilations
        )
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in dilations)
        self.hidden = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for conv, norm in zip(self.convs, self.norms):
            h = h + torch.nn.functional.gelu(conv(norm(h).transpose(1, 2)).transpose(1, 2))
        return h


class BiLSTMEncoder(nn.Module):
    """One bidirectional LSTM layer: (B, T, F) -> (B, T, H)."""

    def __init__(self, in_dim: int, hidden: int = 32):
        super().__init__()
        self.lstm = nn.LSTM(in_dim, hidden // 2, batch_first=True, bidirectional=True)
        self.hidden = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0]


def make_encoder(kind: str, in_dim: int, hidden: int) -> nn.Module:
    if kind == "cnn":
        return CNNEncoder(in_dim, hidden)
    if kind == "lstm":
        return BiLSTMEncoder(in_dim, hidden)
    raise ValueError(f"encoder must be 'cnn' or 'lstm', got {kind!r}")


class SemiCRFTagger(nn.Module):
    """Encoder + semi-CRF head."""

    def __init__(self, encoder: nn.Module, num_classes: int, max_duration: int, **head_kwargs):
        super().__init__()
        self.encoder = encoder
        self.head = SemiMarkovCRFHead(num_classes, max_duration, hidden_dim=encoder.hidden, boundary_scores=True,
                                      **head_kwargs)

    def loss(self, batch) -> torch.Tensor:
        h = self.encoder(batch["features"])
        return self.head.compute_loss(h, batch["lengths"], batch["labels"], reduction="token_mean")

    @torch.no_grad()
    def predict(self, batch) -> torch.Tensor:
        return self.head.decode(self.encoder(batch["features"]), batch["lengths"]).labels


class SoftmaxTagger(nn.Module):
    """Encoder + per-position softmax (the baseline)."""

    def __init__(self, encoder: nn.Module, num_classes: int):
        super().__init__()
        self.encoder = encoder
        self.out = nn.Linear(encoder.hidden, num_classes)

    def loss(self, batch) -> torch.Tensor:
        logits = self.out(self.encoder(batch["features"]))
        return nn.functional.cross_entropy(logits.transpose(1, 2), batch["labels"], ignore_index=-100)

    @torch.no_grad()
    def predict(self, batch) -> torch.Tensor:
        return self.out(self.encoder(batch["features"])).argmax(-1)


def batch_to(batch: Dict, device) -> Dict:
    """The batch with its tensors on ``device`` (other entries as they are)."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def train_step(model: nn.Module, opt: torch.optim.Optimizer, batch: Dict, device, clip: float = 5.0) -> torch.Tensor:
    """One optimiser step on ``model.loss(batch)`` (the batch moved to ``device``), the gradients
    clipped to norm ``clip``; returns the loss."""
    batch = batch_to(batch, device)
    opt.zero_grad(set_to_none=True)
    loss = model.loss(batch)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return loss


def _progress(total: int, desc: str, enabled: bool):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # the demo still runs without the optional progress bar
        tqdm = None
    if tqdm is None or not enabled:
        return None
    return tqdm(total=total, desc=desc, unit="batch", dynamic_ncols=True, leave=True)


def train_model(model: nn.Module, loader: DataLoader, epochs: int, lr: float, device, desc: str, progress: bool = True, crf_lr: Optional[float] = None):
    """Adam with a cosine schedule; returns the per-epoch mean losses.

    A model with a semi-CRF ``head`` trains the CRF's own parameters (transition, duration scores)
    at ``crf_lr`` (default ``10 * lr``, :meth:`SemiMarkovCRFHead.param_groups`): they are few and
    need to move by several nats, far more than encoder weights.
    """
    head = getattr(model, "head", None)
    if isinstance(head, SemiMarkovCRFHead):
        opt = torch.optim.Adam(head.param_groups(lr, crf_lr, model=model))
    else:
        opt = torch.optim.Adam(model.parameters(), lr=lr)
    steps = max(1, epochs * len(loader))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    bar = _progress(steps, desc, progress)
    history = []
    model.train()
    for epoch in range(epochs):
        total, n = 0.0, 0
        for batch in loader:
            loss = train_step(model, opt, batch, device)
            sched.step()
            total += float(loss.detach())
            n += 1
            if bar is not None:
                bar.update(1)
                bar.set_postfix(epoch=epoch + 1, loss=f"{total / n:.4f}")
        history.append(total / max(n, 1))
        if bar is None and progress:
            print(f"  {desc} epoch {epoch + 1}/{epochs}: loss {history[-1]:.4f}", flush=True)
    if bar is not None:
        bar.close()
    model.eval()
    return history


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device) -> Dict[str, float]:
    metrics = SegmentationMetrics(tolerances=TOLERANCES)
    model.eval()
    for batch in loader:
        batch = batch_to(batch, device)
        metrics.update(model.predict(batch), batch["labels"], batch["lengths"])
    return metrics.compute()


def save_figure(path: str, crf: SemiCRFTagger, baseline: SoftmaxTagger, item: Dict[str, torch.Tensor], device) -> Optional[str]:
    """True vs predicted segmentations and the boundary posterior along one sequence (PNG)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import ListedColormap
    except ImportError:
        print("matplotlib is not installed: skipping the figure (pip install 'torch-semimarkov[demo]')")
        return None
    batch = batch_to(collate_segments([item]), device)
    L = int(batch["lengths"][0])
    with torch.no_grad():
        h = crf.encoder(batch["features"])
        crf_lab = crf.head.decode(h, batch["lengths"]).labels[0, :L].cpu()
        post = crf.head.marginals(h, batch["lengths"])
        boundary = post.boundary[0, :L].cpu()
        base_lab = baseline.predict(batch)[0, :L].cpu()
    true = batch["labels"][0, :L].cpu()
    cmap = ListedColormap(["#d9d9d9", "#1f77b4", "#ff7f0e"])
    fig, axes = plt.subplots(4, 1, figsize=(12, 4.8), sharex=True, gridspec_kw={"height_ratios": [1, 1, 1, 2.2]})
    for ax, lab, name in zip(axes[:3], (true, crf_lab, base_lab), ("true", "semi-CRF", "softmax")):
        ax.imshow(lab[None, :].numpy(), aspect="auto", cmap=cmap, vmin=0, vmax=2, interpolation="nearest", extent=(0, L, 0, 1))
        ax.set_yticks([])
        ax.set_ylabel(name, rotation=0, ha="right", va="center")
    true_b = (true[1:] != true[:-1]).nonzero().flatten() + 1
    ax = axes[3]
    ax.plot(torch.arange(L).numpy(), boundary.numpy(), lw=1.0, color="black", label="P(segment starts at t)")
    for i, t in enumerate(true_b.tolist()):
        ax.axvline(t, color="red", lw=0.6, ls="--", label="true boundary" if i == 0 else None)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlim(0, L)
    ax.set_xlabel("position")
    ax.legend(loc="upper right", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=cmap(i)) for i in range(len(LABELS))]
    axes[0].legend(handles, LABELS, loc="upper right", ncol=3, fontsize=8, bbox_to_anchor=(1.0, 2.2))
    fig.suptitle("semi-CRF vs per-position softmax on a held-out synthetic sequence", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {name}: CUDA is not available on this machine")
    return dev


def run_demo(
    cfg: DemoConfig, device: str = "auto", out_dir: str = "demo_out", progress: bool = True, figure: bool = True,
    threads: Optional[int] = 1,
) -> Dict[str, Dict[str, float]]:
    """Train both models, print their metrics side by side, save the figure and ``metrics.json``.

    Args:
        threads: CPU threads for torch (``None``: leave torch's setting). The encoders here work
            on small tensors, where one thread is fastest; extra intra-op threads only spin, and on
            a busy machine they make each step many times slower. (The compiled CPU engine runs
            its own threads, ``numba.set_num_threads``.)

    Returns:
        ``{"semi_crf": metrics, "softmax": metrics, "info": {...}}``.
    """
    dev = _pick_device(device)
    if threads is not None and dev.type == "cpu":
        torch.set_num_threads(threads)
    torch.manual_seed(cfg.seed)
    train = SyntheticGenomicsDataset(cfg.train_sequences, cfg.min_length, cfg.max_length, seed=cfg.seed)
    val = SyntheticGenomicsDataset(cfg.val_sequences, cfg.min_length, cfg.max_length, seed=cfg.seed + 10_000)
    C, K, F = train.num_classes, train.max_duration, train.num_features
    g = torch.Generator().manual_seed(cfg.seed)
    train_loader = DataLoader(train, batch_size=cfg.batch_size, shuffle=True, collate_fn=collate_segments, generator=g)
    val_loader = DataLoader(val, batch_size=cfg.batch_size, shuffle=False, collate_fn=collate_segments)

    from torch_semimarkov.engines.available import triton_available
    from torch_semimarkov.engines.available import numba_available

    if dev.type == "cuda":
        backend = "Triton kernels" if triton_available() else "PyTorch streaming engine"
    else:
        backend = "compiled CPU engine (numba)" if numba_available() else "PyTorch streaming engine"
    print(
        f"torch-semimarkov demo: {cfg.train_sequences} train / {cfg.val_sequences} held-out synthetic sequences of "
        f"length {cfg.min_length}-{cfg.max_length}, C={C} labels {LABELS}, K={K}; "
        f"{cfg.encoder} encoder (hidden {cfg.hidden}), {cfg.epochs} epochs on {dev} ({backend})",
        flush=True,
    )

    torch.manual_seed(cfg.seed)
    crf = SemiCRFTagger(make_encoder(cfg.encoder, F, cfg.hidden), C, K).to(dev)
    torch.manual_seed(cfg.seed)
    base = SoftmaxTagger(make_encoder(cfg.encoder, F, cfg.hidden), C).to(dev)

    t0 = time.perf_counter()
    train_model(crf, train_loader, cfg.epochs, cfg.lr, dev, "semi-CRF", progress, crf_lr=cfg.crf_lr)
    t_crf = time.perf_counter() - t0
    t0 = time.perf_counter()
    train_model(base, train_loader, cfg.epochs, cfg.lr, dev, "softmax ", progress)
    t_base = time.perf_counter() - t0

    m_crf = evaluate(crf, val_loader, dev)
    m_base = evaluate(base, val_loader, dev)

    rows = [("segment F1", "segment_f1")]
    rows += [("boundary F1 (exact)" if t == 0 else f"boundary F1 (+/-{t})", f"boundary_f1@{t}") for t in TOLERANCES]
    rows += [("position accuracy", "position_accuracy")]
    print(f"\nheld-out results ({cfg.val_sequences} sequences)")
    print(f"  {'metric':<22}{'semi-CRF':>10}{'softmax':>10}")
    for name, key in rows:
        print(f"  {name:<22}{m_crf[key]:>10.3f}{m_base[key]:>10.3f}")
    print(f"  {'training time (s)':<22}{t_crf:>10.1f}{t_base:>10.1f}")

    os.makedirs(out_dir, exist_ok=True)
    info = {"device": str(dev), "backend": backend, "train_seconds_crf": t_crf, "train_seconds_softmax": t_base, **cfg.__dict__}
    result = {"semi_crf": m_crf, "softmax": m_base, "info": info}
    with open(os.path.join(out_dir, "metrics.json"), "w") as f:
        json.dump(result, f, indent=2)
    if figure:
        path = save_figure(os.path.join(out_dir, "demo_segmentation.png"), crf, base, val[0], dev)
        if path:
            print(f"\nfigure: {path}")
    print(f"metrics: {os.path.join(out_dir, 'metrics.json')}")
    return result


def build_parser(parser: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="python -m torch_semimarkov demo", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds (small data, 4 epochs)")
    parser.add_argument("--device", default="auto", help="'auto' (CUDA if available), 'cpu', 'cuda', 'cuda:1', ...")
    parser.add_argument("--epochs", type=int, default=None, help="training epochs (default 12, or 4 with --quick)")
    parser.add_argument("--seed", type=int, default=0, help="seed for data, initialisation and shuffling")
    parser.add_argument("--out", default="demo_out", help="folder for the figure and metrics.json")
    parser.add_argument("--encoder", choices=("cnn", "lstm"), default="cnn", help="the encoder under both heads")
    parser.add_argument("--train-sequences", type=int, default=None, help="number of training sequences")
    parser.add_argument("--max-length", type=int, default=None, help="longest training sequence")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for torch (default 1: fastest for the streaming engine)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--no-figure", action="store_true", help="do not draw the PNG")
    return parser


def main(argv: Optional[Sequence[str]] = None, args: Optional[argparse.Namespace] = None) -> Dict[str, Dict[str, float]]:
    if args is None:
        args = build_parser().parse_args(argv)
    cfg = DemoConfig.quick(seed=args.seed, encoder=args.encoder) if args.quick else DemoConfig(seed=args.seed, encoder=args.encoder)
    if args.epochs is not None:
        cfg.epochs = args.epochs
    if args.train_sequences is not None:
        cfg.train_sequences = args.train_sequences
    if args.max_length is not None:
        cfg.max_length = args.max_length
        cfg.min_length = min(cfg.min_length, args.max_length)
    return run_demo(cfg, device=args.device, out_dir=args.out, progress=not args.no_progress, figure=not args.no_figure, threads=args.threads)
