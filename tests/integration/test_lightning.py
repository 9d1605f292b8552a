"""The optional Lightning module trains and validates (skipped when Lightning is not installed)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

pl = pytest.importorskip("lightning.pytorch", reason="PyTorch Lightning is not installed (pip install 'torch-semimarkov[lightning]')")

from torch_semimarkov.data import SyntheticGenomicsDataset, collate_segments  # noqa: E402
from torch_semimarkov.demo import CNNEncoder  # noqa: E402
from torch_semimarkov.lightning import SemiCRFLightningModule, lightning_available  # noqa: E402
from torch_semimarkov.nn import SemiMarkovCRFHead  # noqa: E402


def test_lightning_fit_and_validate(tmp_path):
    assert lightning_available()
    torch.manual_seed(0)
    data = SyntheticGenomicsDataset(8, 30, 50, seed=0)
    loader = DataLoader(data, batch_size=4, collate_fn=collate_segments)
    module = SemiCRFLightningModule(CNNEncoder(6, 8), SemiMarkovCRFHead(3, 12, hidden_dim=8, boundary_scores=True), lr=1e-2, crf_reg=0.01)
    trainer = pl.Trainer(
        max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )
    before = module.head.transition.detach().clone()
    trainer.fit(module, loader, loader)
    assert not torch.equal(before, module.head.transition.detach())
    metrics = trainer.callback_metrics
    for key in ("train_loss", "val_loss", "val_segment_f1", "val_boundary_f1@0", "val_boundary_f1@2", "val_position_accuracy"):
        assert key in metrics, key
        assert torch.isfinite(metrics[key])
    out = module(next(iter(loader))["features"], next(iter(loader))["lengths"])
    assert out.labels.shape[0] == 4
