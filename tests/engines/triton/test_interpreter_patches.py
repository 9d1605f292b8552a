"""The conftest's speed-ups of Triton's interpreter change no outcome: the int32 overflow
sanitiser it skips is one whose result ``device_assert`` throws away (``options.debug`` off), the
numpy dtypes it remembers are the ones Triton's map gives, and the block types it shares are those
Triton would build."""

import os

import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter only")


@triton.jit
def _overflow_kernel(x_ptr, out_ptr):
    x = tl.load(x_ptr + tl.arange(0, 2))
    tl.store(out_ptr + tl.arange(0, 2), x + 1)  # int32 max + 1 wraps


def _run():
    x = torch.tensor([2**31 - 1, 5], dtype=torch.int32)
    out = torch.zeros_like(x)
    _overflow_kernel[(1,)](x, out)
    return out.tolist()


def test_the_skipped_overflow_check_is_one_the_interpreter_discards(monkeypatch):
    from triton.language import semantic

    cls = semantic.TritonSemantic
    original = getattr(cls.binary_op_sanitize_overflow_impl, "__wrapped__", None)
    if original is None:
        pytest.skip("the conftest patch is off (TSM_INTERPRETER_REPATCH=1 or another Triton)")
    assert _run() == [-(2**31), 6]  # patched: wraps, no error
    monkeypatch.setattr(cls, "binary_op_sanitize_overflow_impl", original)
    assert _run() == [-(2**31), 6]  # Triton's own sanitiser: the same (its assert is discarded)
    calls = []
    monkeypatch.setattr(cls, "binary_op_sanitize_overflow_impl",
                        lambda self, *a: calls.append(self.builder.options.debug) or original(self, *a))
    _run()
    assert calls and not any(calls)  # it ran, with debug off: device_assert returned at once


def test_kernels_launch_from_a_data_stack_chunk_of_their_own(monkeypatch):
    """The conftest's ``_stack_room``: every interpreted launch runs below a frame of 20,000 local
    slots (160 KiB), which CPython cannot fit in a 16 KiB data-stack chunk, so it opens a 256 KiB
    chunk of its own where the kernel's calls stay (no chunk edge under a hot loop: 1.3 s against
    3.0-4.3 s for one blocked-engine launch, depending on the caller's depth); the outputs are the
    launch's own."""
    import sys

    from triton.runtime import interpreter as interp

    if os.environ.get("TSM_STACK_ROOM", "") not in ("", "1") or os.environ.get("TSM_INTERPRETER_REPATCH", "") not in ("", "0"):
        pytest.skip("the conftest's stack room is off")
    rooms = []
    patch = interp._patch_lang

    def spy(fn):
        f = sys._getframe(1)
        while f is not None and f.f_code.co_filename != "<conftest stack room>":
            f = f.f_back
        rooms.append(None if f is None else f.f_code.co_nlocals)
        return patch(fn)

    monkeypatch.setattr(interp, "_patch_lang", spy)
    assert _run() == [-(2**31), 6]
    assert rooms and all(n is not None and n >= 20000 for n in rooms), rooms


def test_remembered_numpy_dtypes_are_the_interpreters_own():
    """The conftest's ``_remember_numpy_dtypes``: every Triton dtype (and a pointer) maps to the
    numpy dtype of Triton's own ``_get_np_dtype``, asked twice (the second answer remembered)."""
    from triton.runtime import interpreter as interp

    original = getattr(interp._get_np_dtype, "__wrapped__", None)
    if original is None:
        pytest.skip("the conftest patch is off (TSM_INTERPRETER_REPATCH=1 or another Triton)")
    kinds = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64, tl.uint64,
             tl.float16, tl.bfloat16, tl.float32, tl.float64, tl.pointer_type(tl.float32)]
    for dt in kinds:
        assert interp._get_np_dtype(dt) == original(dt) == interp._get_np_dtype(dt), dt
    assert _run() == [-(2**31), 6]


def test_shared_block_types_are_the_ones_triton_builds():
    """The conftest's ``_share_block_types``: equal (element type, shape) give one object, whose
    fields are those of a block type built by Triton's own ``__init__``; other shapes and element
    types give other objects; pointer element types (no hash) are built anew each time; tensors of
    a shared type share its shape and numel, equal to Triton's own; a kernel runs as before."""
    from triton.language import core

    build = getattr(core.block_type.__init__, "__wrapped__", None)
    if build is None:
        pytest.skip("the conftest patch is off (TSM_INTERPRETER_REPATCH=1 or another Triton)")
    a, b = core.block_type(tl.float32, [4, 8]), core.block_type(tl.float32, (4, tl.constexpr(8)))
    assert a is b
    fresh = object.__new__(core.block_type)
    build(fresh, tl.float32, [4, 8])
    fields = ("element_ty", "shape", "numel", "name")
    assert all(getattr(a, f) == getattr(fresh, f) for f in fields) and a == fresh
    assert core.block_type(tl.float32, [8, 4]) is not a and core.block_type(tl.float64, [4, 8]) is not a
    assert core.block_type(tl.float64, [4, 8]).element_ty == tl.float64
    p = tl.pointer_type(tl.float32)
    c, d = core.block_type(p, [4]), core.block_type(p, [4])
    assert c == d and c.element_ty == p and c.shape == d.shape
    # tensors of a shared type share its shape and numel, equal to what Triton's __init__ gives
    t1, t2 = core.tensor(None, a), core.tensor(None, a)
    own = object.__new__(core.tensor)
    core.tensor.__init__.__wrapped__(own, None, a)
    for t in (t1, t2):
        assert t.type is a and t.dtype == tl.float32 and t.handle is None
        assert list(t.shape) == list(own.shape) and t.numel == own.numel
    assert t2.shape is t1.shape
    s = core.tensor(None, tl.float32)  # a scalar: built as before
    assert len(s.shape) == 0 and s.dtype == tl.float32
    assert _run() == [-(2**31), 6]
