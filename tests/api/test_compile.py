"""torch.compile, torch.export and host synchronisation.

The engine runs as opaque operators (``torch.ops.torch_semimarkov.*``, ``torch_semimarkov/ops.py``), so a
compiler captures a model with the head in one graph: the loss and its gradients equal eager ones,
changing the lengths or T does not recompile, ``torch.export`` captures decoding, and with
``validate=False`` a training step reads nothing back from the device. These tests use the
``aot_eager`` backend (fake tensors, AOT autograd, no C++ toolchain); the inductor timings are in
``benchmarks/bench_compile.py``.
"""

import sys

import pytest
import torch
from torch._dynamo.utils import counters

from conftest import CPU_BACKENDS, assert_close
from torch_semimarkov import SemiMarkovCRFHead, semi_crf_streaming_forward
from torch_semimarkov import ops
from torch_semimarkov.core.constants import IMPOSSIBLE, NEG_INF
from torch_semimarkov.core.cumsum import cumsum_time
from torch_semimarkov.core.validation import forbid


class _Model(torch.nn.Module):
    def __init__(self, backend="auto", **head):
        super().__init__()
        self.enc = torch.nn.Conv1d(6, 12, 5, padding=2)
        self.head = SemiMarkovCRFHead(num_classes=3, max_duration=5, hidden_dim=12, backend=backend, **head)

    def forward(self, x, lengths, labels):
        h = self.enc(x.transpose(1, 2)).transpose(1, 2)
        return self.head.compute_loss(h, lengths, labels)


def _batch(T, lengths, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), T, 6, generator=g)
    labels = torch.randint(0, 3, (len(lengths), T), generator=g)
    for b, L in enumerate(lengths):
        labels[b, L:] = -100
    return x, torch.tensor(lengths), labels


def _loss_and_grads(model, fn, batch):
    model.zero_grad()
    loss = fn(*batch)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def _assert_compiled_equals_eager(model, compiled, runs):
    """Loss and every gradient of ``compiled`` equal eager ``model``'s on each (T, lengths) run."""
    for i, (T, lengths) in enumerate(runs):
        batch = _batch(T, lengths, seed=i)
        loss_c, grads_c = _loss_and_grads(model, compiled, batch)
        loss_e, grads_e = _loss_and_grads(model, model, batch)
        assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-5)
        for a, b in zip(grads_c, grads_e):
            assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("options", [{}, {"boundary_scores": True, "transition": "duration", "min_duration": 2}],
                         ids=["plain", "boundary-KCC-min"])
def test_compiled_training_loss_equals_eager_without_recompiling(backend, options):
    torch.manual_seed(0)
    model = _Model(backend, validate=False, **options)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
    # new lengths, then new T: one graph for all of them
    _assert_compiled_equals_eager(model, compiled, [(40, [40, 27]), (40, [13, 40]), (53, [53, 9]), (31, [31, 31])])
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_forbid_fills_with_impossible():
    """``forbid`` writes IMPOSSIBLE as a literal (a module-level float would be a symbolic input
    under dynamic compile and make dynamo trace the graph twice): it must stay IMPOSSIBLE."""
    for dtype in (torch.float32, torch.float64):
        t = torch.tensor([float("-inf"), NEG_INF, NEG_INF * 2, NEG_INF / 2, 0.0], dtype=dtype)
        want = torch.tensor([IMPOSSIBLE, IMPOSSIBLE, IMPOSSIBLE, NEG_INF / 2, 0.0], dtype=dtype)
        assert torch.equal(forbid(t), want)


def test_compiled_with_validation_raises_for_an_infinite_loss():
    """validate=True under compile: a gold segmentation the model forbids still raises, with the
    segment and the reason."""
    allowed = torch.ones(3, 3, dtype=torch.bool)
    allowed[0, 1] = False
    model = _Model(allowed_transitions=allowed)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", dynamic=True)
    x, lengths, _ = _batch(12, [12, 8], seed=4)
    labels = torch.tensor([[0] * 6 + [1] * 6, [2] * 8 + [-100] * 4])  # 0 -> 1 at position 6
    with pytest.raises(ValueError, match="moves 0 -> 1 at position 6"):
        model(x, lengths, labels)
    with pytest.raises(ValueError, match=r"sequence 0 has a segment \[6, 11\) label 1 .*transition into it"):
        compiled(x, lengths, labels)


@pytest.mark.parametrize("options", [{"boundary_scores": True}], ids=["boundary"])
def test_compile_as_users_call_it_with_validation(options):
    """``torch.compile(model)`` and ``torch.compile(model, fullgraph=True, dynamic=True)`` of encoder +
    head with the default ``validate=True``: loss and gradients equal eager, one graph for new
    lengths and T, and under both a bad label raises the eager error. The checks run in an opaque
    operator inside the graph (no graph break, so fullgraph=True captures the step). (This test
    also holds what test_compiled_with_validation_still_raises checked with a compile of its own:
    a valid batch gives a finite loss, then label 7 raises, compiled and eager.)"""
    for opts in ({}, {"fullgraph": True, "dynamic": True}):
        torch.manual_seed(0)
        model = _Model(**options)
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(model, backend="aot_eager", **opts)
        _assert_compiled_equals_eager(model, compiled, [(40, [40, 27]), (53, [53, 9])])
        if opts:
            assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
        x, lengths, labels = _batch(20, [20, 11], seed=3)
        assert torch.isfinite(compiled(x, lengths, labels))
        labels[1, 2] = 7  # out of range inside the sequence
        for fn in (compiled, model):
            with pytest.raises(ValueError, match="labels must lie in .* sequence 1 has label 7 at position 2"):
                fn(x, lengths, labels)


def test_compiled_engine_function_fullgraph_and_gradients():
    """The public function itself under fullgraph compile, log and max semirings (no grad)."""
    torch.manual_seed(1)
    B, T, K, C = 2, 30, 4, 3
    cum = torch.nn.functional.pad(torch.randn(B, T, C).cumsum(1), (0, 0, 1, 0)).requires_grad_(True)
    tr, db = torch.randn(C, C, requires_grad=True), torch.randn(K, C, requires_grad=True)
    lengths = torch.tensor([30, 17])

    def f(cum, tr, db, lengths):
        return semi_crf_streaming_forward(cum, tr, db, lengths, K, validate=False).sum()

    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    grads_c = torch.autograd.grad(cf(cum, tr, db, lengths), (cum, tr, db))
    grads_e = torch.autograd.grad(f(cum, tr, db, lengths), (cum, tr, db))
    for a, b in zip(grads_c, grads_e):
        assert_close(a, b, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        best_c = torch.compile(lambda *a: semi_crf_streaming_forward(*a, K, semiring="max"), fullgraph=True,
                               backend="aot_eager")(cum, tr, db, lengths)
        assert_close(best_c, semi_crf_streaming_forward(cum, tr, db, lengths, K, semiring="max"))


class _Decoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = SemiMarkovCRFHead(num_classes=3, max_duration=6, hidden_dim=8, boundary_scores=True)

    def forward(self, h, lengths):
        r = self.head.decode(h, lengths)
        return r.scores, r.labels, r.segment_starts, r.segment_ends, r.segment_labels, r.segment_offsets


def test_export_decode_on_new_shapes():
    torch.manual_seed(2)
    model = _Decoder().eval()
    h, lengths = torch.randn(2, 40, 8), torch.tensor([40, 23])
    B, T = torch.export.Dim("B", min=1), torch.export.Dim("T", min=3)
    ep = torch.export.export(model, (h, lengths), dynamic_shapes=({0: B, 1: T}, {0: B}))
    assert "torch_semimarkov.viterbi" in ep.graph_module.print_readable(print_output=False)
    exported = ep.module()
    for b, t, seed in [(2, 40, 0), (3, 57, 1), (1, 5, 2), (4, 3, 3)]:
        g = torch.Generator().manual_seed(seed)
        h = torch.randn(b, t, 8, generator=g)
        lengths = torch.randint(1, t + 1, (b,), generator=g)
        lengths[0] = t
        for got, want in zip(exported(h, lengths), model(h, lengths)):
            assert torch.equal(got, want)


def test_export_training_loss():
    """The loss (with the engine's backward registered) exports as one graph too."""
    model = _Model(validate=False)
    x, lengths, labels = _batch(30, [30, 12], seed=5)
    ep = torch.export.export(model, (x, lengths, labels))
    assert "torch_semimarkov.forward" in ep.graph_module.print_readable(print_output=False)
    assert_close(ep.module()(x, lengths, labels), model(x, lengths, labels))


_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")


#: the CPU engines' own code (it reads lengths on the host; the Triton engine reads nothing back,
#: which the GPU test checks with torch.cuda.set_sync_debug_mode)
_CPU_ENGINE_FILES = ("torch/reference.py", "numba/engine.py", "numba/direct.py", "numba/factored.py")


@pytest.fixture
def count_reads(monkeypatch):
    """Count the Tensor methods that read a value back to Python (each a sync on a GPU) outside the
    CPU engines."""
    calls = []
    for name in _READS:
        original = getattr(torch.Tensor, name)

        def wrapper(self, *a, _name=name, _original=original, **kw):
            caller = sys._getframe(1).f_code.co_filename
            if not caller.endswith(_CPU_ENGINE_FILES):
                calls.append(_name)
            return _original(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, wrapper)
    return calls


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_training_step_reads_nothing_back_without_validation(backend, count_reads):
    model = _Model(backend, validate=False, boundary_scores=True)
    x, lengths, labels = _batch(25, [25, 14], seed=7)
    count_reads.clear()
    loss = model(x, lengths, labels)
    loss.backward()
    assert count_reads == [], count_reads


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_training_step_reads_with_validation(backend, count_reads):
    """validate=True: ONE read in the whole training step: the engine's input values, the gold
    labels' range and the infinite-loss check are reduced on the device and read together after
    the forward pass; nothing in the backward."""
    model = _Model(backend, boundary_scores=True)
    x, lengths, labels = _batch(25, [25, 14], seed=7)
    count_reads.clear()
    loss = model(x, lengths, labels)
    assert count_reads == ["tolist"], count_reads
    count_reads.clear()
    loss.backward()
    assert count_reads == []


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_operators_pass_opcheck(backend):
    torch.manual_seed(3)
    B, T, K, C = 2, 9, 3, 2
    cum = torch.nn.functional.pad(torch.randn(B, T, C, dtype=torch.float64).cumsum(1), (0, 0, 1, 0))
    tr, db = torch.randn(C, C, dtype=torch.float64), torch.randn(K, C, dtype=torch.float64)
    ps = torch.randn(B, T, C, dtype=torch.float64)
    lengths = torch.tensor([9, 4])
    checks = ("test_schema", "test_faketensor", "test_autograd_registration")
    for semiring, save in (("log", True), ("log", False), ("max", False)):
        torch.library.opcheck(ops.forward_op, (cum, tr, db, lengths, K, semiring, ps, None, backend, True, None, None,
                                               None, save), test_utils=checks)
    torch.library.opcheck(ops.viterbi_op, (cum, tr, db, lengths, K, ps, None, backend, True, None, None),
                          test_utils=checks)
    torch.library.opcheck(cumsum_time, (ps.clone().requires_grad_(True),), test_utils=checks)
    x = ps.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(cumsum_time, (x,))


def test_operator_validates_inside():
    cum = torch.zeros(1, 5, 2)
    cum[0, 2, 1] = float("nan")
    with pytest.raises(ValueError, match="cum_scores contains non-finite"):
        ops.forward_op(cum, torch.zeros(2, 2), torch.zeros(3, 2), torch.tensor([4]), 3, "log", None, None, "torch",
                       True, None, None, None, False)
    with pytest.raises(ValueError, match=r"lengths must lie in \[1, T\]"):
        ops.viterbi_op(torch.zeros(1, 5, 2), torch.zeros(2, 2), torch.zeros(3, 2), torch.tensor([5]), 3, None, None,
                       "torch", True, None, None)


def test_jit_trace_refuses_instead_of_baking_shapes():
    model = _Decoder().eval()
    h, lengths = torch.randn(2, 10, 8), torch.tensor([10, 6])
    with pytest.raises(RuntimeError, match="torch.jit.trace is not supported"):
        torch.jit.trace(model, (h, lengths))
    cum = torch.zeros(1, 6, 2)
    with pytest.raises(RuntimeError, match="torch.export.export"):
        torch.jit.trace(lambda c: semi_crf_streaming_forward(c, torch.zeros(2, 2), torch.zeros(3, 2),
                                                             torch.tensor([5]), 3), (cum,))
