"""The DistributedDataParallel example trains with 2 CPU processes (gloo) and keeps ranks in sync."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

pytestmark = pytest.mark.integration  # a subprocess, a build or a run of the docs' code

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed with gloo is not available")
def test_ddp_example_two_processes_gloo():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_ddp.py"), "--world-size", "2", "--backend", "gloo", "--epochs", "2",
         "--num-sequences", "8", "--min-length", "30", "--max-length", "50", "--max-duration", "12", "--batch-size", "2", "--hidden", "8"],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "epoch 2/2: mean loss over 2 ranks" in r.stdout
    assert "parameters in sync across 2 ranks: True" in r.stdout
