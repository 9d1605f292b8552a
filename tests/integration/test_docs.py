"""The reference documentation builds with warnings as errors and documents the public API."""

import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # a subprocess, a build or a run of the docs' code

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"


def test_docs_build_without_warnings(tmp_path):
    pytest.importorskip("sphinx", reason="sphinx is not installed (pip install -e '.[docs]')")
    pytest.importorskip("myst_parser", reason="myst-parser is not installed (pip install -e '.[docs]')")
    out = tmp_path / "html"
    # a fresh process: Sphinx imports the package from docs/conf.py's path and mocks what is missing
    run = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, f"sphinx-build failed:\n{run.stdout}\n{run.stderr}"
    core = (out / "api" / "core.html").read_text()
    for name in ("semi_crf_streaming_forward", "semi_crf_streaming_viterbi", "semi_crf_streaming_marginals",
                 "SemiMarkovCRFHead", "ViterbiResult", "MarginalsResult", "log_prob"):
        assert name in core, f"the API page does not mention {name}"
    assert "SemiCRFStreaming" in (out / "api" / "streaming.html").read_text()
    assert "GeneStructureHead" in (out / "api" / "genomics.html").read_text()
    assert "SemiCRFLightningModule" in (out / "api" / "training.html").read_text()
    # the markdown pages are part of the site
    assert "Choosing K and C" in (out / "guide.html").read_text()
    assert "Checkpointing" in (out / "internals.html").read_text()
