"""benchmarks/bench_ddp.py runs on 2 CPU processes (gloo) at tiny sizes: ranks agree, DDP matches one device."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_ddp.py"
TINY = ["--length", "200", "--batch-size", "2", "--steps", "2", "--warmup", "1", "--max-duration", "8", "--hidden", "8"]

pytestmark = [pytest.mark.integration, pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")]


def run_bench(*args, timeout=240):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.setdefault("OMP_NUM_THREADS", "1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


def test_bench_ddp_gloo_two_ranks(tmp_path):
    out = tmp_path / "ddp.json"
    r = run_bench("--world-size", "2", "--backend", "gloo", *TINY, "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["mode"] == "ddp" and res["ok"] and all(res["checks"].values())
    assert res["config"]["world_size"] == 2 and res["config"]["backend"] == "gloo"
    cor = res["correctness"]
    # after the all-reduce every rank holds bitwise the same gradients (and, after training, parameters)
    assert cor["grad_max_abs_diff_across_ranks"] == 0.0
    assert cor["param_max_abs_diff_across_ranks_after_training"] == 0.0
    assert cor["initial_weights_identical"]
    # the DDP loss (mean over ranks) is the one-device mean over the global batch: the loss is a few
    # hundred nats, so compare relatively (its float32 spacing alone is ~3e-5 in absolute terms)
    assert cor["loss_rel_diff"] < 1e-5
    assert cor["loss_abs_diff"] < 1e-5 * max(1.0, abs(cor["loss_single"]))
    assert cor["grad_max_rel_diff"] < 1e-4
    t = res["timing"]
    for key in ("ddp_step_ms_median", "single_step_ms_median", "ddp_sequences_per_s", "single_sequences_per_s",
                "throughput_ratio", "scaling_efficiency", "target_ratio", "meets_target"):
        assert key in t, key
    assert len(t["ddp_step_ms_per_step_max_over_ranks"]) == 2 and len(t["single_step_ms"]) == 2
    assert t["throughput_ratio"] > 0
    assert abs(t["throughput_ratio"] - t["ddp_sequences_per_s"] / t["single_sequences_per_s"]) < 1e-9
    assert "grads across ranks after all-reduce: max diff 0.000e+00 (identical)" in r.stdout


def test_bench_ddp_lightning_cpu(tmp_path, monkeypatch, capsys):
    """The one-device baseline (``Trainer(devices=1)``, no process group) runs in this process
    through the script's ``main`` (--device cpu: what the subprocess's hidden GPUs gave), the
    two-device run (Lightning re-launches the script per rank) in a subprocess as before."""
    pytest.importorskip("lightning.pytorch", reason="PyTorch Lightning is not installed")
    one, two = tmp_path / "pl1.json", tmp_path / "pl2.json"
    # the script sets these two with setdefault on import: set here so that they are restored after
    for key, default in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
        monkeypatch.setenv(key, os.environ.get(key, default))
    main = runpy.run_path(str(SCRIPT), run_name="bench_ddp")["main"]
    assert main(["--mode", "lightning", "--world-size", "1", "--device", "cpu", *TINY, "--out", str(one)]) == 0, \
        capsys.readouterr().out
    r = run_bench("--mode", "lightning", "--world-size", "2", *TINY, "--baseline", str(one), "--out", str(two))
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(two.read_text())
    assert res["mode"] == "lightning" and res["ok"]
    assert res["config"]["world_size"] == 2 and res["config"]["strategy"] == "ddp"
    assert res["correctness"]["param_max_abs_diff_across_ranks"] == 0.0
    t = res["timing"]
    assert len(t["step_ms_per_step_max_over_ranks"]) == 2 and t["sequences_per_s"] > 0
    assert t["baseline_same_workload"] and t["baseline_world_size"] == 1 and t["throughput_ratio"] > 0
