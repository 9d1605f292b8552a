"""Dispatch between the Triton, compiled CPU (numba) and PyTorch paths: the ``backend=`` argument."""

import sys

import pytest
import torch

import torch_semimarkov.engines.available as available
import torch_semimarkov.engines.select as backends
from torch_semimarkov.core.validation import validate_streaming_inputs
from torch_semimarkov.engines.interface import ENGINES, NumbaEngine, TorchEngine, TritonEngine
from conftest import CPU_BACKENDS, assert_close, make_inputs
from torch_semimarkov import (
    SemiMarkovCRFHead,
    semi_crf_streaming_forward,
    semi_crf_streaming_marginals,
    semi_crf_streaming_viterbi,
)

ENTRIES = {
    "forward": lambda **kw: semi_crf_streaming_forward(**kw),
    "forward_max": lambda **kw: semi_crf_streaming_forward(**kw, semiring="max"),
    "viterbi": lambda **kw: semi_crf_streaming_viterbi(**kw),
    "marginals": lambda **kw: semi_crf_streaming_marginals(**kw),
}


def small_inputs():
    cum = torch.nn.functional.pad(torch.randn(1, 6, 2).cumsum(1), (0, 0, 1, 0))
    return dict(cum_scores=cum, transition=torch.zeros(2, 2), duration_bias=torch.zeros(3, 2),
                lengths=torch.tensor([6]), K=3)


def test_broken_kernel_module_warns_and_falls_back(monkeypatch):
    monkeypatch.setattr(available, "_TRITON", None)
    # a None entry makes importing the module fail, as a broken install would
    monkeypatch.setitem(sys.modules, "torch_semimarkov.engines.triton", None)
    with pytest.warns(RuntimeWarning, match="could not be loaded"):
        assert available.triton_available() is False
    out = semi_crf_streaming_forward(**small_inputs())
    assert torch.isfinite(out).all()


def test_cpu_tensors_never_take_the_triton_path():
    inp = validate_streaming_inputs(*small_inputs().values())
    assert ENGINES[backends.backend_for(inp, use_triton=True)] is not TritonEngine
    want = NumbaEngine if available.numba_available() else TorchEngine
    assert ENGINES[backends.backend_for(inp, use_triton=True)] is want
    assert ENGINES[backends.backend_for(inp, use_triton=False, backend="torch")] is TorchEngine


@pytest.mark.parametrize("entry", sorted(ENTRIES))
@pytest.mark.parametrize("backend", ["cpu", "gpu", "Numba", "", None, 1, "triton"])
def test_bad_or_unusable_backend_raises_naming_it(entry, backend):
    # "triton" cannot run on CPU tensors: asked for by name it raises instead of falling back
    with pytest.raises(ValueError, match="backend"):
        ENTRIES[entry](**small_inputs(), backend=backend)


def test_backend_triton_contradicting_use_triton_raises():
    with pytest.raises(ValueError, match="use_triton"):
        semi_crf_streaming_forward(**small_inputs(), backend="triton", use_triton=False)


def test_missing_numba_falls_back_under_auto_and_raises_when_named(monkeypatch):
    monkeypatch.setattr(available, "_NUMBA", False)
    inp = small_inputs()
    want = semi_crf_streaming_forward(**inp, backend="torch")
    assert torch.equal(semi_crf_streaming_forward(**inp), want)
    with pytest.raises(ValueError, match=r"backend='numba'.*pip install"):
        semi_crf_streaming_forward(**inp, backend="numba")
    with pytest.raises(ValueError, match="backend"):
        SemiMarkovCRFHead(2, 3, backend="nope")


def test_numba_not_importable_falls_back_to_the_pytorch_path(monkeypatch):
    monkeypatch.setattr(available, "_NUMBA", None)
    monkeypatch.setitem(sys.modules, "torch_semimarkov.engines.numba.engine", None)
    assert available.numba_available() is False  # an ImportError: numba is simply not installed
    assert torch.isfinite(semi_crf_streaming_forward(**small_inputs())).all()


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_every_cpu_backend_gives_the_same_answers(backend):
    inp = make_inputs(3, 40, 5, 4, lengths=[40, 17, 1], proj="both", seed=3)
    ref = {k: (v.clone().requires_grad_(True) if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
           for k, v in inp.items()}
    got = {k: (v.clone().requires_grad_(True) if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
           for k, v in inp.items()}
    z_ref = semi_crf_streaming_forward(**ref, backend="torch")
    z = semi_crf_streaming_forward(**got, backend=backend)
    assert_close(z, z_ref, atol=1e-12, rtol=1e-12)
    z_ref.sum().backward()
    z.sum().backward()
    for name in ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end"):
        assert_close(got[name].grad, ref[name].grad, atol=1e-12, rtol=1e-12, msg=name)
    v_ref = semi_crf_streaming_viterbi(**inp, backend="torch")
    v = semi_crf_streaming_viterbi(**inp, backend=backend)
    assert v.segments == v_ref.segments and torch.equal(v.labels, v_ref.labels)
    m_ref = semi_crf_streaming_marginals(**inp, backend="torch")
    m = semi_crf_streaming_marginals(**inp, backend=backend)
    for name, a, b in zip(m._fields, m, m_ref):
        assert_close(a, b, atol=1e-12, rtol=1e-12, msg=name)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_head_passes_the_backend_through(backend, monkeypatch):
    seen = []
    real = backends.backend_for

    def spy(inp, use_triton=True, b="auto"):
        seen.append(b)
        return real(inp, use_triton, b)

    monkeypatch.setattr(backends, "backend_for", spy)  # every public function asks route(), which asks this
    torch.manual_seed(0)
    head = SemiMarkovCRFHead(3, 4, hidden_dim=5, backend=backend)
    h, lengths = torch.randn(2, 9, 5), torch.tensor([9, 6])
    labels = torch.where(torch.arange(9)[None] < lengths[:, None], torch.randint(0, 3, (2, 9)), -100)
    head.compute_loss(h, lengths, labels).backward()
    head.decode(h, lengths)
    head.marginals(h, lengths)
    assert seen and set(seen) == {backend}


def test_resolve_is_marked_constant_as_the_public_decorator_marks_it():
    """select._resolve sets the attribute torch.compiler.assume_constant_result sets (without its
    import of torch._dynamo): if torch renames it, this fails instead of a silent graph break."""
    import subprocess

    def probe():
        return "x"

    marked = torch.compiler.assume_constant_result(probe)
    flags = {k: v for k, v in vars(marked).items() if k.startswith("_dynamo")}
    assert flags and {k: getattr(backends._resolve, k, None) for k in flags} == flags
    # and importing the package no longer imports dynamo
    code = "import sys, torch_semimarkov; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
