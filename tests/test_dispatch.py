"""Dispatch between the Triton and PyTorch paths."""

import sys

import pytest
import torch

import torch_semimarkov.streaming.autograd as dispatch
from torch_semimarkov import semi_crf_streaming_forward


def test_broken_kernel_module_warns_and_falls_back(monkeypatch):
    monkeypatch.setattr(dispatch, "_TRITON", None)
    # a None entry makes importing the module fail, as a broken install would
    monkeypatch.setitem(sys.modules, "torch_semimarkov.streaming.kernels", None)
    with pytest.warns(RuntimeWarning, match="could not be loaded"):
        assert dispatch.triton_available() is False
    cum = torch.nn.functional.pad(torch.randn(1, 6, 2).cumsum(1), (0, 0, 1, 0))
    out = semi_crf_streaming_forward(cum, torch.zeros(2, 2), torch.zeros(3, 2), torch.tensor([6]), 3)
    assert torch.isfinite(out).all()


def test_cpu_tensors_never_take_the_triton_path():
    cum = torch.nn.functional.pad(torch.randn(1, 6, 2).cumsum(1), (0, 0, 1, 0))
    inp = dispatch.validate_streaming_inputs(cum, torch.zeros(2, 2), torch.zeros(3, 2), torch.tensor([6]), 3)
    assert dispatch._function_for(inp, use_triton=True) is dispatch.SemiCRFStreaming
