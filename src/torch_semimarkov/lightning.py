"""PyTorch Lightning integration (optional: ``pip install 'torch-semimarkov[lightning]'``).

:class:`SemiCRFLightningModule` wraps an encoder and a :class:`~torch_semimarkov.nn.SemiMarkovCRFHead`;
batches are the dicts made by :func:`collate_segments` (``features``, ``labels``, ``lengths``).
Training logs the NLL per position; validation decodes with Viterbi and logs segment F1, boundary
F1 (exact and +/- 2) and position accuracy. Lightning handles devices, DDP and mixed precision
(``precision="bf16-mixed"`` runs the encoder in bfloat16; the CRF math stays in float32).

Example (``python``)::

    import lightning.pytorch as pl
    from torch.utils.data import DataLoader
    from torch_semimarkov.data import SyntheticGenomicsDataset, collate_segments
    from torch_semimarkov.demo import CNNEncoder
    from torch_semimarkov.lightning import SemiCRFLightningModule
    from torch_semimarkov.nn import SemiMarkovCRFHead

    module = SemiCRFLightningModule(CNNEncoder(6, 32), SemiMarkovCRFHead(3, 48, hidden_dim=32), lr=3e-3)
    loader = DataLoader(SyntheticGenomicsDataset(64), batch_size=8, collate_fn=collate_segments)
    pl.Trainer(max_epochs=1).fit(module, loader, loader)
"""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn

from torch_semimarkov.data import collate_segments
from torch_semimarkov.metrics import SegmentationMetrics
from torch_semimarkov.nn import SemiMarkovCRFHead

try:
    import lightning.pytorch as pl
except ImportError:  # pragma: no cover - depends on the environment
    try:
        import pytorch_lightning as pl
    except ImportError:
        pl = None

__all__ = ["SemiCRFLightningModule", "collate_segments", "lightning_available"]


def lightning_available() -> bool:
    return pl is not None


if pl is None:

    class SemiCRFLightningModule:  # type: ignore[no-redef]
        """Placeholder that explains how to install Lightning."""

        def __init__(self, *args, **kwargs):
            raise ImportError(
                "SemiCRFLightningModule needs PyTorch Lightning: pip install 'torch-semimarkov[lightning]'"
            )

else:

    class SemiCRFLightningModule(pl.LightningModule):
        """Encoder + semi-CRF head as a LightningModule.

        Args:
            encoder: maps features (B, T, F) to hidden states (B, T, H).
            head: the :class:`SemiMarkovCRFHead` (with ``hidden_dim=H``).
            lr: Adam learning rate.
            crf_reg: weight of ``head.parameter_penalty()`` in the loss.
            tolerance: boundary tolerance reported besides exact boundary F1.
        """

        def __init__(self, encoder: nn.Module, head: SemiMarkovCRFHead, lr: float = 3e-3, crf_reg: float = 0.0, tolerance: int = 2):
            super().__init__()
            self.encoder = encoder
            self.head = head
            self.lr = lr
            self.crf_reg = crf_reg
            self.tolerance = tolerance
            self._val_metrics: Optional[SegmentationMetrics] = None

        def forward(self, features: torch.Tensor, lengths: torch.Tensor):
            """Viterbi decode: the engine's ``ViterbiResult``."""
            return self.head.decode(self.encoder(features), lengths)

        def training_step(self, batch: Dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            hidden = self.encoder(batch["features"])
            loss = self.head.compute_loss(hidden, batch["lengths"], batch["labels"], reduction="token_mean")
            if self.crf_reg > 0:
                loss = loss + self.crf_reg * self.head.parameter_penalty()
            self.log("train_loss", loss, prog_bar=True, batch_size=batch["lengths"].shape[0], sync_dist=True)
            return loss

        def on_validation_epoch_start(self) -> None:
            self._val_metrics = SegmentationMetrics(tolerances=(0, self.tolerance))

        def validation_step(self, batch: Dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            hidden = self.encoder(batch["features"])
            loss = self.head.compute_loss(hidden, batch["lengths"], batch["labels"], reduction="token_mean")
            pred = self.head.decode(hidden, batch["lengths"]).labels
            self._val_metrics.update(pred, batch["labels"], batch["lengths"])
            self.log("val_loss", loss, prog_bar=True, batch_size=batch["lengths"].shape[0], sync_dist=True)
            return loss

        def on_validation_epoch_end(self) -> None:
            r = self._val_metrics.compute()
            for key in ("segment_f1", "boundary_f1@0", f"boundary_f1@{self.tolerance}", "position_accuracy"):
                self.log(f"val_{key}", r[key], sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=self.lr)
