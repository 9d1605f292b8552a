"""The runnable examples in the public API's docstrings run and print what they say."""

import doctest
import importlib

import pytest

pytestmark = pytest.mark.integration  # a subprocess, a build or a run of the docs' code

MODULES = [
    "torch_semimarkov.api.partition",
    "torch_semimarkov.api.viterbi",
    "torch_semimarkov.api.marginals",
    "torch_semimarkov.api.entropy",
    "torch_semimarkov.api.sample",
    "torch_semimarkov.api.topk",
    "torch_semimarkov.core.results",
    "torch_semimarkov.engines.torch.reference",
    "torch_semimarkov.engines.numba.engine",
    "torch_semimarkov.core.segments",
    "torch_semimarkov.core.validation",
    "torch_semimarkov.nn",
    "torch_semimarkov.durations",
    "torch_semimarkov.data",
    "torch_semimarkov.metrics",
    "torch_semimarkov.genomics.records",
    "torch_semimarkov.genomics.labels",
    "torch_semimarkov.genomics.gff",
    "torch_semimarkov.genomics.evaluate",
    "torch_semimarkov.genomics.batches",
    "torch_semimarkov.genomics.models",
    "torch_semimarkov.genomics.pipeline",
    "torch_semimarkov.genomics.sensors",
    "torch_semimarkov.genomics.ghmm",
    "torch_semimarkov.genomics.feature_crf",
    "torch_semimarkov.crf",
    "torch_semimarkov.scores",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    if "numba" in name:
        pytest.importorskip("numba")
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.attempted > 0, f"{name} has no docstring examples"
    assert result.failed == 0, f"{result.failed} of {result.attempted} doctest examples failed in {name}"
