"""The demo runs end to end at a tiny size: both models train, metrics and the figure are written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torch_semimarkov import demo

pytestmark = pytest.mark.integration  # a subprocess, a build or a run of the docs' code

ROOT = Path(__file__).resolve().parents[2]


def test_demo_tiny_in_process(tmp_path, capsys):
    cfg = demo.DemoConfig.quick(train_sequences=8, val_sequences=4, min_length=30, max_length=60, epochs=1, batch_size=4, hidden=8)
    result = demo.run_demo(cfg, device="cpu", out_dir=str(tmp_path), progress=True)
    out = capsys.readouterr().out
    for key in ("segment F1", "boundary F1 (exact)", "boundary F1 (+/-2)", "position accuracy"):
        assert key in out
    for model in ("semi_crf", "softmax"):
        for key in ("segment_f1", "boundary_f1@0", "boundary_f1@2", "position_accuracy"):
            assert 0.0 <= result[model][key] <= 1.0
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["semi_crf"]["position_accuracy"] == result["semi_crf"]["position_accuracy"]
    pytest.importorskip("matplotlib")
    png = tmp_path / "demo_segmentation.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_command_line(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run(
        [sys.executable, "-m", "torch_semimarkov", "demo", "--quick", "--epochs", "1", "--train-sequences", "8",
         "--max-length", "60", "--device", "cpu", "--seed", "1", "--out", str(tmp_path), "--no-progress", "--no-figure"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "held-out results" in r.stdout and "position accuracy" in r.stdout
    assert (tmp_path / "metrics.json").exists()


def test_info_and_help(capsys):
    """``python -m torch_semimarkov info`` and ``demo --help`` through ``__main__.main`` in this
    process (the entry point itself, ``python -m torch_semimarkov``, runs in a fresh interpreter in
    test_demo_command_line; here a second one only cost a torch import): exit status 0, the
    version line and the options."""
    from torch_semimarkov.__main__ import main

    assert main(["info"]) == 0
    assert "torch-semimarkov" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and "--quick" in out and "--out" in out


def test_encoders():
    import torch

    x = torch.randn(2, 17, 6)
    assert demo.CNNEncoder(6, 8)(x).shape == (2, 17, 8)
    assert demo.BiLSTMEncoder(6, 8)(x).shape == (2, 17, 8)
    with pytest.raises(ValueError):
        demo.make_encoder("transformer", 6, 8)
