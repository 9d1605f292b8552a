"""The seed's debugging scripts run end to end at tiny sizes."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # a subprocess, a build or a run of the docs' code


ROOT = Path(__file__).resolve().parents[2]


def run_script(name, *args, timeout=240):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT,
    )


def run_script_here(name, *args, monkeypatch, capsys):
    """``python scripts/NAME ARGS`` in this process (``__main__``, ``sys.argv`` and its exit code as
    the command line has them), for the scripts that change no process-wide state (no logging
    set-up, no global seed, no thread count): the same code and checks as :func:`run_script`
    without a fresh interpreter's ~2 s of start and imports. Returns ``(exit code, stdout)``."""
    path = str(ROOT / "scripts" / name)
    monkeypatch.setattr(sys, "argv", [path, *args])
    try:
        runpy.run_path(path, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, capsys.readouterr().out


def test_train_script_flags_and_drift_warning(tmp_path):
    save = tmp_path / "model.pt"
    r = run_script(
        "train.py", "--epochs", "1", "--num-sequences", "6", "--val-sequences", "3", "--min-length", "30",
        "--max-length", "50", "--max-duration", "12", "--batch-size", "3", "--hidden", "8", "--no-triton",
        "--crf-reg", "0.01", "--fixed-length", "40", "--drift-threshold", "0", "--save", str(save),
    )
    assert r.returncode == 0, r.stderr
    assert "WARNING: Epoch 1: CRF parameters drifting high! trans_max=" in r.stderr
    assert "Consider increasing --crf-reg." in r.stderr
    assert "held-out: segment F1" in r.stderr
    assert save.exists()


def test_train_script_debug_logging():
    env_level = os.environ.get("PYTHONLOGLEVEL")
    os.environ["PYTHONLOGLEVEL"] = "DEBUG"
    try:
        r = run_script("train.py", "--epochs", "1", "--num-sequences", "4", "--val-sequences", "2", "--min-length", "20",
                       "--max-length", "30", "--max-duration", "8", "--batch-size", "4", "--hidden", "8", "--duration", "poisson")
    finally:
        if env_level is None:
            os.environ.pop("PYTHONLOGLEVEL")
        else:
            os.environ["PYTHONLOGLEVEL"] = env_level
    assert r.returncode == 0, r.stderr
    assert "CRF parameter magnitudes trans_max=" in r.stderr
    assert "drifting" not in r.stderr


def test_gradient_check_cpu_fallback(monkeypatch, capsys):
    code, out = run_script_here("gradient_check.py", "--T", "12", "--B", "2", "--K", "4", "--C", "3", "--proj",
                                monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, out
    if "CUDA is not available" in out:
        assert "naive" in out
    for name in ("partition", "grad_transition", "grad_duration_bias", "grad_cum_scores", "grad_proj_start"):
        assert name in out
    assert "PASS" in out and "FAIL" not in out


def test_gradient_check_duration_transitions(monkeypatch, capsys):
    code, out = run_script_here("gradient_check.py", "--T", "10", "--B", "2", "--K", "3", "--C", "2",
                                "--duration-transitions", monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, out


def test_find_determinism(monkeypatch, capsys):
    code, out = run_script_here("find_determinism.py", "--runs", "3", "--T", "20", "--B", "2", "--K", "4", "--C", "3",
                                monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, out
    assert "deterministic" in out and "NOT deterministic" not in out
