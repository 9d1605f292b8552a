"""Shared test helpers: one tolerance helper keyed by dtype, input factories, readable ids.

Import the helpers with ``from conftest import assert_close, make_inputs, case_id``. The tests
mirror the package's layers (``core/``, ``engines/{torch,numba,triton}/``, ``api/``, ``nn/``,
``genomics/``, ``integration/``); every folder is on ``sys.path``, so a test imports another's
helpers (``from test_distribution import _check_topk``, ``from kernel_cases import ...``) wherever
it lives.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Dict, Iterable, Optional, Sequence

import pytest
import torch

for _folder in sorted(p for p in Path(__file__).parent.rglob("*") if p.is_dir() and p.name != "__pycache__"):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))

if not torch.cuda.is_available():
    # Without a GPU the Triton kernels can only run in Triton's interpreter, and the mode is fixed
    # when a kernel is decorated: choose it before any test module imports the kernel modules.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _stack_room(slots: int = 20000):
    """``room(fn, args, kwargs)`` calls ``fn`` from a frame of ``slots`` local variables (none ever
    assigned), so that CPython pushes it at the start of a data-stack chunk of its own, twice its
    size (256 KiB), and ``fn``'s calls stay in the ~96 KiB left (a kernel's calls need a few KiB). CPython 3.11+ keeps
    frames in 16 KiB chunks and frees a chunk when the frame that opened it returns: a call that
    sits on a chunk's edge in a hot loop maps and unmaps memory at every call. The interpreter's
    kernels make millions of small calls, and where the edge fell depended on how deep the test
    that launched them stood: the same kernel launch took 1.3 s or 3.0-4.3 s at different
    depths of the caller (identical calls, counted; ``benchmarks/probes/stack_depth.py``). One
    chunk per launch instead: the interpreted kernel tests took 200 s of CPU instead of 248.
    ``TSM_STACK_ROOM=0`` (or ``TSM_INTERPRETER_REPATCH=1``) launches from the caller's frame."""
    names = "=".join(f"_r{i}" for i in range(slots))
    src = f"def room(fn, args, kwargs):\n    if fn is None:\n        {names} = None\n    return fn(*args, **kwargs)\n"
    scope: dict = {}
    exec(compile(src, "<conftest stack room>", "exec"), scope)
    return scope["room"]


def _skip_nested_interpreter_patching() -> None:
    """Triton's interpreter (3.9) re-patches ``triton.language`` with ``inspect.getmembers`` on every
    call of a ``@triton.jit`` helper from inside a kernel, although the kernel's launch has already
    patched those modules (and restores them when it returns): most of the kernel tests'
    time. Skip that repeat while a launch that patched the same modules runs; anything not yet
    patched is patched as before, and an unpatched builtin would raise, not pass silently.
    ``TSM_INTERPRETER_REPATCH=1`` turns this off (and :func:`_skip_discarded_overflow_checks`,
    :func:`_remember_numpy_dtypes`, :func:`_share_block_types`)."""
    import inspect

    try:
        import triton.language as tl
        from triton.runtime import interpreter as interp
    except ImportError:
        return
    if not all(hasattr(interp, n) for n in ("GridExecutor", "InterpretedFunction", "_patch_lang", "InterpreterError")):
        return
    active: list = []  # per running launch: ids of the language modules patched
    langs: dict = {}

    def langs_of(fn):
        key = id(fn)
        if key not in langs:
            langs[key] = frozenset(id(v) for v in fn.__globals__.values()
                                   if inspect.ismodule(v) and v in (tl, tl.core))
        return langs[key]

    grid_call = interp.GridExecutor.__call__
    # TSM_STACK_ROOM=0: launch from the caller's frame as before (A/B)
    room = _stack_room() if os.environ.get("TSM_STACK_ROOM", "") in ("", "1") else (lambda fn, a, k: fn(*a, **k))

    def launch(self, *args, **kwargs):
        active.append(set(langs_of(self.fn)))
        try:
            return room(grid_call, (self, *args), kwargs)
        finally:
            active.pop()

    def device_call(self, *args, **kwargs):
        need = langs_of(self.fn)
        if not (active and need <= active[-1]):
            interp._patch_lang(self.fn)
            if active:
                active[-1] |= need
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interp.InterpreterError(repr(e)) from e

    interp.GridExecutor.__call__ = launch
    interp.InterpretedFunction.__call__ = device_call


def _skip_discarded_overflow_checks() -> None:
    """Triton's interpreter (3.9) sanitises every int32 ``+``, ``-`` and ``*`` of a kernel for
    overflow: it redoes the operation in int64, compares it with the int32 range and hands the
    result to ``device_assert``, which returns at once unless ``options.debug``, and the
    interpreter's options never set it. So the work is thrown away (about a third of an
    interpreted blocked-kernel test). Skip it under exactly the condition that discards it; with
    ``debug`` on, the check runs as before."""
    try:
        from triton.language import semantic
    except ImportError:
        return
    cls = getattr(semantic, "TritonSemantic", None)
    original = getattr(cls, "binary_op_sanitize_overflow_impl", None)
    if original is None or not callable(getattr(cls, "device_assert", None)):
        return

    def sanitize(self, lhs, rhs, binary_op):
        if not getattr(getattr(self.builder, "options", None), "debug", True):
            return None  # device_assert would discard the check
        return original(self, lhs, rhs, binary_op)

    sanitize.__wrapped__ = original
    cls.binary_op_sanitize_overflow_impl = sanitize


def _remember_numpy_dtypes() -> None:
    """Triton's interpreter (3.9) maps a Triton dtype to its numpy dtype with ``_get_np_dtype``,
    which builds a 20-entry dict on every call: tens of thousands of calls per kernel test, 5% of
    an interpreted blocked-kernel test. The map is fixed, so remember each answer (dtypes that
    cannot be hashed are looked up as before). One blocked and one backward test file's cases:
    20.7-21.3 -> 19.4-19.5 s of CPU."""
    try:
        from triton.runtime import interpreter as interp
    except ImportError:
        return
    original = getattr(interp, "_get_np_dtype", None)
    if original is None:
        return
    known: dict = {}

    def get_np_dtype(tt_dtype):
        try:
            return known[tt_dtype]
        except KeyError:
            known[tt_dtype] = found = original(tt_dtype)
            return found
        except TypeError:  # not hashable
            return original(tt_dtype)

    get_np_dtype.__wrapped__ = original
    interp._get_np_dtype = get_np_dtype


def _share_block_types() -> None:
    """Triton's frontend (3.9) builds a new ``block_type`` for every tensor an interpreted kernel
    makes (170 thousand in one blocked-kernel test), each formatting its name from its shape and
    element type: 14% of the test's time. A block type is a value, never changed after its
    ``__init__`` (Triton assigns its fields nowhere else), so equal ones are shared: the first of
    each (element type, shape) is kept and returned again. Element types that cannot be hashed
    (pointers) and subclasses are built as before. The tensors of a shared type share its shape
    (a tuple of constexprs) and numel too. One blocked and one backward test file's cases:
    19.4-19.5 -> 18.0-18.8 s of CPU with the types shared (five runs; with
    :func:`_remember_numpy_dtypes`), 16.8-17.6 with the shapes too (five runs)."""
    try:
        from triton.language import core
    except ImportError:
        return
    block_type = getattr(core, "block_type", None)
    unwrap = getattr(core, "_unwrap_if_constexpr", None)
    if block_type is None or unwrap is None or "__new__" in vars(block_type):
        return
    build = block_type.__init__
    kept: dict = {}

    def new(cls, *args, **kwargs):
        if cls is not block_type or kwargs or len(args) != 2:
            return object.__new__(cls)
        element_ty, shape = args
        try:
            key = (element_ty, tuple(int(unwrap(n)) for n in shape))
            found = kept.get(key)
        except (TypeError, ValueError):  # an element type without a hash
            key = found = None
        if found is None:
            found = object.__new__(cls)
            build(found, element_ty, shape)
            found._tsm_kept = True
            if key is not None:
                kept[key] = found
        return found

    def init(self, *args, **kwargs):
        if not self.__dict__.get("_tsm_kept"):
            build(self, *args, **kwargs)

    init.__wrapped__ = build
    block_type.__new__ = new
    block_type.__init__ = init

    # a tensor of a shared block type takes the type's shape and numel (a tuple of constexprs and
    # a constexpr, built once per type instead of per tensor; nothing changes them after __init__)
    tensor = getattr(core, "tensor", None)
    if tensor is None:
        return
    make = tensor.__init__

    def tensor_init(self, handle, type):
        fields = getattr(type, "__dict__", {})
        kept_shape = fields.get("_tsm_shape")
        if kept_shape is None:
            make(self, handle, type)
            if fields.get("_tsm_kept"):
                type._tsm_shape = (self.shape, self.numel)
            return
        self.handle = handle
        self.shape, self.numel = kept_shape
        self.type = type
        self.dtype = type.scalar

    tensor_init.__wrapped__ = make
    tensor.__init__ = tensor_init


if os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("TSM_INTERPRETER_REPATCH", "") in ("", "0"):
    _skip_nested_interpreter_patching()
    _skip_discarded_overflow_checks()
    _remember_numpy_dtypes()
    _share_block_types()


def _compile_each_numba_kernel_once() -> None:
    """On a clean clone the numba engine's kernels are not yet in their disk cache (``cache=True``)
    and compiling them is most of the first numba tests' time; pytest-xdist workers that need the
    same kernel at the same time would each compile it. A lock file per cached kernel makes the
    second worker wait and then load what the first one saved (numba checks its disk cache before
    compiling, under the lock). Kernels are compiled exactly as before (same options, same code);
    only who compiles them changes. ``TSM_NUMBA_COMPILE_LOCK=0`` turns this off."""
    import fcntl
    import hashlib
    import tempfile

    try:
        from numba.core.caching import NullCache
        from numba.core.compiler_lock import global_compiler_lock
        from numba.core.dispatcher import Dispatcher
    except ImportError:
        return
    folder = Path(tempfile.gettempdir()) / f"torch-semimarkov-numba-locks-{os.getuid()}"
    folder.mkdir(exist_ok=True)
    held: set = set()  # kernels this process is compiling (numba compiles a kernel's callees inside it)
    compile_ = Dispatcher.compile

    def compile(self, sig):
        if isinstance(getattr(self, "_cache", None), NullCache):
            return compile_(self, sig)
        fn = self.py_func
        key = f"{fn.__module__}.{fn.__qualname__}:{fn.__code__.co_filename}"
        # numba's own (re-entrant) lock first: one thread of this process takes file locks at a time
        with global_compiler_lock:
            if key in held:
                return compile_(self, sig)
            with open(folder / (hashlib.sha1(key.encode()).hexdigest() + ".lock"), "w") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)  # a kernel's callees are below it: no cycle between workers
                held.add(key)
                try:
                    return compile_(self, sig)
                finally:
                    held.discard(key)
                    fcntl.flock(fh, fcntl.LOCK_UN)

    Dispatcher.compile = compile


if os.environ.get("PYTEST_XDIST_WORKER"):
    # one pytest-xdist worker per core: torch's intra-op threads would only oversubscribe them
    torch.set_num_threads(1)
    # and the same for the scripts the integration tests start (they inherit the environment): a
    # script with a thread per core beside the other workers took 2.7x its time alone (the gene
    # finder's smoke: 33.6 s against 12.4 s)
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # not numba's: its thread tests need 2
        os.environ.setdefault(_var, "1")
    if os.environ.get("TSM_NUMBA_COMPILE_LOCK", "") in ("", "1"):
        _compile_each_numba_kernel_once()

from torch_semimarkov.core.segments import Segment

#: Run every combination of the Triton kernel tests' engine fixtures (``ring`` x ``engine`` x
#: ``blocked`` ... x case, see :func:`covering_subset`): always on CUDA, where the kernels run compiled,
#: and in Triton's CPU interpreter only with ``TSM_FULL_INTERPRETER=1``; otherwise the interpreter
#: runs a covering subset and the other combinations, marked ``gpu_full``, are deselected.
FULL_KERNEL_PRODUCT = torch.cuda.is_available() or os.environ.get("TSM_FULL_INTERPRETER", "") not in ("", "0")

#: Fixtures whose parameters choose a kernel path (ring layout, engine, blocked tiles, chunking;
#: ``engine_calls`` / ``grad_engine`` also record whether a call took the engine):
#: the axes of the product that :func:`covering_subset` thins out on the interpreter.
PATH_FIXTURES = ("ring", "engine", "engine_calls", "grad_engine", "blocked")

def _cpu_backends():
    from torch_semimarkov.streaming import numba_available

    return ["torch", "numba"] if numba_available() else ["torch"]


#: The engines that run on CPU tensors (``backend=`` values): the PyTorch path and, when numba is
#: installed, the compiled CPU engine.
CPU_BACKENDS = _cpu_backends()

#: The inputs of the streaming API that log Z is differentiable with respect to.
DIFFERENTIABLE = ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")

#: (atol, rtol) per dtype: float64 compares two exact algorithms, float32 one rounding chain.
TOLERANCES = {
    torch.float64: (1e-9, 1e-9),
    torch.float32: (1e-4, 1e-5),
}


def case_id(B: int, T: int, K: int, C: int, *extra) -> str:
    """A readable parametrisation id such as ``B2-T63-K5-C7``."""
    parts = [f"B{B}", f"T{T}", f"K{K}", f"C{C}"] + [str(e) for e in extra if e not in (None, "")]
    return "-".join(parts)


def brute_case_id(case) -> str:
    """The id of a brute-force case ``(B, T, K, C, lengths, duration_transitions, proj)``."""
    B, T, K, C, _, dt, proj = case
    return case_id(B, T, K, C, "KCC" if dt else "CC", proj)


def brute_case_inputs(case, seed_offset: int = 0):
    """``(inputs, brute_force(**inputs))`` of a brute-force case (T <= 6), seeded by its shape."""
    from torch_semimarkov.oracle import brute_force

    B, T, K, C, lengths, dt, proj = case
    inp = make_inputs(B, T, K, C, lengths=lengths, duration_transitions=dt, proj=proj,
                      seed=B * 100 + T * 10 + K + seed_offset)
    return inp, brute_force(**inp)


def assert_close(actual, expected, dtype: Optional[torch.dtype] = None, atol: Optional[float] = None,
                 rtol: Optional[float] = None, msg: str = "") -> None:
    """Assert |actual - expected| <= atol + rtol * |expected| elementwise, with tolerances by dtype.

    The dtype defaults to the less precise of the two tensors. Fails on any NaN in either tensor
    and reports the max absolute error, the max relative error and where the worst element is.
    """
    actual = torch.as_tensor(actual)
    expected = torch.as_tensor(expected)
    if dtype is None:
        dtypes = [t.dtype for t in (actual, expected) if t.is_floating_point()]
        dtype = torch.float32 if torch.float32 in dtypes else torch.float64
    d_atol, d_rtol = TOLERANCES.get(dtype, TOLERANCES[torch.float32])
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    prefix = f"{msg}: " if msg else ""
    assert tuple(actual.shape) == tuple(expected.shape), (
        f"{prefix}shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    )
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    n_nan_a, n_nan_e = int(torch.isnan(a).sum()), int(torch.isnan(e).sum())
    assert n_nan_a == 0 and n_nan_e == 0, f"{prefix}NaN found: {n_nan_a} in actual, {n_nan_e} in expected"
    if a.numel() == 0:
        return
    assert torch.equal(torch.isinf(a), torch.isinf(e)) and torch.equal(a[torch.isinf(a)], e[torch.isinf(e)]), (
        f"{prefix}infinite entries differ"
    )
    fin = torch.isfinite(e)
    a, e = a[fin], e[fin]
    if a.numel() == 0:
        return
    err = (a - e).abs()
    rel = err / e.abs().clamp_min(1e-300)
    bad = err > atol + rtol * e.abs()
    if bool(bad.any()):
        i = int(torch.argmax(err))
        raise AssertionError(
            f"{prefix}{int(bad.sum())}/{err.numel()} elements differ ({dtype}, atol={atol:g}, rtol={rtol:g}): "
            f"max abs err {float(err.max()):.3e}, max rel err {float(rel.max()):.3e}; "
            f"worst flat index {i}: actual {float(a.reshape(-1)[i]):.10g} expected {float(e.reshape(-1)[i]):.10g}"
        )


def make_inputs(B: int, T: int, K: int, C: int, *, dtype: torch.dtype = torch.float64, seed: int = 0,
                lengths=None, duration_transitions: bool = False, proj: str = "none",
                scale: float = 1.0) -> Dict[str, object]:
    """Random inputs of the streaming API as keyword arguments.

    Values are drawn in float64 and then cast, so that float32 and float64 calls with the same
    seed see the same numbers up to rounding.

    Args:
        lengths: None (all T), "ragged" (random in 1..T with the first sequence of length T) or a
            list of B integers.
        duration_transitions: use a (K, C, C) transition instead of (C, C).
        proj: "none", "start", "end" or "both": which boundary projections to pass.
        scale: standard deviation of the per-position label scores.
    """
    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    scores = torch.randn(B, T, C, generator=g, dtype=f64) * scale
    cum = torch.zeros(B, T + 1, C, dtype=f64)
    cum[:, 1:] = scores.cumsum(1)
    tr_shape = (K, C, C) if duration_transitions else (C, C)
    transition = torch.randn(tr_shape, generator=g, dtype=f64) * 0.5
    duration_bias = torch.randn(K, C, generator=g, dtype=f64) * 0.5
    if lengths is None:
        lens = [T] * B
    elif isinstance(lengths, str):
        assert lengths == "ragged", lengths
        lens = [T] + torch.randint(1, T + 1, (B - 1,), generator=g).tolist()
    else:
        lens = list(lengths)
    assert len(lens) == B and all(1 <= x <= T for x in lens), lens
    ps = torch.randn(B, T, C, generator=g, dtype=f64) * 0.5 if proj in ("start", "both") else None
    pe = torch.randn(B, T, C, generator=g, dtype=f64) * 0.5 if proj in ("end", "both") else None
    assert proj in ("none", "start", "end", "both"), proj
    return {
        "cum_scores": cum.to(dtype),
        "transition": transition.to(dtype),
        "duration_bias": duration_bias.to(dtype),
        "lengths": torch.tensor(lens, dtype=torch.long),
        "K": K,
        "proj_start": None if ps is None else ps.to(dtype),
        "proj_end": None if pe is None else pe.to(dtype),
    }


def with_grad(inputs: Dict[str, object], names: Iterable[str] = DIFFERENTIABLE, dtype=None):
    """A copy of ``inputs`` whose tensors listed in ``names`` are fresh leaves requiring grad."""
    out = dict(inputs)
    names = set(names)
    for key in DIFFERENTIABLE:
        t = out.get(key)
        if t is None:
            continue
        t = t.detach().clone()
        if dtype is not None:
            t = t.to(dtype)
        if key in names:
            t.requires_grad_(True)
        out[key] = t
    return out


def grads_of(value: torch.Tensor, inputs: Dict[str, object], upstream: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Gradients of ``(value * upstream).sum()`` with respect to every input that requires grad."""
    names = [k for k in DIFFERENTIABLE if isinstance(inputs.get(k), torch.Tensor) and inputs[k].requires_grad]
    tensors = [inputs[k] for k in names]
    grads = torch.autograd.grad((value * upstream.to(value.dtype)).sum(), tensors, allow_unused=True)
    return {k: (torch.zeros_like(t) if g is None else g) for k, t, g in zip(names, tensors, grads)}


def random_upstream(B: int, seed: int = 1) -> torch.Tensor:
    """A random upstream gradient (B,) in float64, away from zero and not all equal."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(B, generator=g, dtype=torch.float64) * 1.5 + 0.25


def ts_edges(cum_scores, transition, duration_bias, K, proj_start=None, proj_end=None):
    """pytorch-struct potentials (1, L, K+1, C, C) [n, k, c_to, c_from] of one sequence of length L.

    Duration slot 0 is unused; segments that would run past L get -1e9. At n = 0 the phantom
    predecessor's term logsumexp_{c'} Tr[c', c] sits in column c_from = 0 (the others -1e9), so that
    pytorch-struct's sum over c_from gives it in the log semiring and its max gives it in the max
    semiring (the model's most probable segmentation, as this library defines Viterbi).
    """
    S = cum_scores
    L, C = S.shape[0] - 1, S.shape[1]
    rows = []
    for n in range(L):
        blocks = [S.new_full((C, C), -1e9)]
        for k in range(1, K + 1):
            if n + k > L:
                blocks.append(S.new_full((C, C), -1e9))
                continue
            seg = S[n + k] - S[n] + duration_bias[k - 1]
            if proj_start is not None:
                seg = seg + proj_start[n]
            if proj_end is not None:
                seg = seg + proj_end[n + k - 1]
            M = (transition if transition.dim() == 2 else transition[k - 1]).clamp(min=-1e9)
            if n == 0:
                block = S.new_full((C, C), -1e9)
                block[:, 0] = seg + torch.logsumexp(M, dim=0)
                blocks.append(block)
            else:
                blocks.append(seg[:, None] + M.T)
        rows.append(torch.stack(blocks))
    return torch.stack(rows)[None]


def ts_segments(argmax_parts):
    """Segments from pytorch-struct's one-hot argmax (1, L, K+1, C, C)."""
    idx = argmax_parts[0].nonzero().tolist()
    return [Segment(n, n + k, c_to) for n, k, c_to, _ in sorted(idx)]


def ts_distribution(edges):
    """pytorch-struct's SemiMarkovCRF over the given potentials (its missing-constraints warning muted)."""
    import warnings

    import torch_struct

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch_struct.SemiMarkovCRF(edges)


def check_best_segments(got, want, want_scores, inputs, unique=None) -> None:
    """Each got[b] is the best segmentation: equal to want[b] where it is unique, else as good.

    unique: per-sequence flags (e.g. ``BruteForceResult.argmax_unique``); None means unique
    wherever ties are impossible for random scores, i.e. unless the transition is (C, C) and no
    projection is given (then durations of consecutive same-label segments can be swapped).
    """
    from torch_semimarkov.oracle import segmentation_score

    B = len(want)
    assert len(got) == B
    if unique is None:
        can_tie = inputs["transition"].dim() == 2 and inputs["proj_start"] is None and inputs["proj_end"] is None
        unique = [not can_tie] * B
    for b in range(B):
        if unique[b]:
            assert got[b] == want[b], f"sequence {b}: best segmentation {got[b]} != oracle {want[b]}"
        else:
            sc = segmentation_score(
                inputs["cum_scores"][b], inputs["transition"], inputs["duration_bias"], got[b],
                None if inputs["proj_start"] is None else inputs["proj_start"][b],
                None if inputs["proj_end"] is None else inputs["proj_end"][b],
            )
            assert math.isclose(sc, float(want_scores[b]), rel_tol=1e-9, abs_tol=1e-9), (
                f"sequence {b}: segmentation {got[b]} scores {sc}, best is {float(want_scores[b])}"
            )


def _nan_filled(factory):
    def wrapped(*args, **kwargs):
        t = factory(*args, **kwargs)
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()):
            with torch.no_grad():
                t.fill_(math.nan)
        return t

    return wrapped


@pytest.fixture(params=["register-ring", "memory-ring", "memory-ring-kblock2"])
def ring(request, monkeypatch):
    """Run a Triton test with the register-ring kernels (small K·C), with the memory-ring ones
    (large), and with duration tiles of 2 so that every duration loop takes several blocks."""
    from torch_semimarkov.engines.triton import plan

    monkeypatch.setattr(plan, "FORCE_MEMORY_RING", request.param != "register-ring")
    if request.param == "memory-ring-kblock2":
        monkeypatch.setattr(plan, "K_BLOCK_OVERRIDE", 2)
    return request.param


@pytest.fixture(params=["sequential", "parallel"])
def engine(request, monkeypatch):
    """Run a Triton test through one program per sequence and through the time-parallel engine
    with chunks of 4 positions (or K), so that small cases take several chunks and fix-ups."""
    from torch_semimarkov.engines.triton import plan

    if request.param == "parallel":
        monkeypatch.setattr(plan, "CHUNK_OVERRIDE", 4)
    return request.param


@pytest.fixture(autouse=True)
def nan_filled_empty(monkeypatch):
    """Fill every new ``torch.empty`` float tensor with NaN so that memory never written fails."""
    monkeypatch.setattr(torch, "empty", _nan_filled(torch.empty))
    monkeypatch.setattr(torch, "empty_like", _nan_filled(torch.empty_like))
    monkeypatch.setattr(torch.Tensor, "new_empty", _nan_filled(torch.Tensor.new_empty))
    yield


def lengths_list(lengths: Sequence[int] | torch.Tensor):
    return [int(x) for x in torch.as_tensor(lengths).reshape(-1).tolist()]


# --- the kernel product on the interpreter ---------------------------------------------------


def _kcc(params) -> Optional[bool]:
    """Whether a kernel test's parameters give a (K, C, C) transition (None: not said)."""
    case = params.get("case")
    if isinstance(case, tuple) and len(case) == 7:  # kernel_cases.CASES: (B, T, K, C, lengths, proj, kcc)
        return bool(case[6])
    kcc = params.get("kcc")
    return kcc if isinstance(kcc, bool) else None


def path_applies(params) -> bool:
    """False where the conftest ``ring`` / ``engine`` fixtures give a combination that
    ``kernel_cases.plan_of`` skips on every device: the time-parallel engine with a forced memory
    ring (it runs the register ring only), a (K, C, C) transition with a forced memory ring (one
    kernel whatever the ring), the time-parallel engine on a case of one chunk."""
    ring, engine = params.get("ring"), params.get("engine")
    memory = ring in ("memory-ring", "memory-ring-kblock2")
    if engine == "parallel" and memory:
        return False
    if memory and _kcc(params):
        return False
    case = params.get("case")
    if engine == "parallel" and isinstance(case, tuple) and len(case) == 7:
        T, K = case[1], case[2]
        if T <= max(4, min(K, T)):  # chunks of max(4, K_eff) positions (the engine fixture)
            return False
    return True


def covering_subset(param_list: Sequence[dict]) -> list:
    """Indices of a covering subset of one test function's parametrisations.

    A kernel path is the tuple of the :data:`PATH_FIXTURES` values, the transition shape and the
    semiring; a group is one value of the remaining parameters (a case, a seed, an option). The
    subset keeps, deterministically, at least one applicable parametrisation of every group (the
    path run least so far, ties to the first in collection order) and then one of every
    applicable path not yet kept. So every case and option runs, and every kernel path the
    function can take runs, at least once.
    """
    def path(p):
        return tuple((k, repr(p[k])) for k in PATH_FIXTURES if k in p) + (("kcc", _kcc(p)), ("semiring", p.get("semiring")))

    def group(p):
        return tuple((k, repr(v)) for k, v in p.items() if k not in PATH_FIXTURES)

    groups: Dict[tuple, list] = {}
    for i, p in enumerate(param_list):
        groups.setdefault(group(p), []).append(i)
    used: Dict[tuple, int] = {}
    keep = set()
    for members in groups.values():
        live = [i for i in members if path_applies(param_list[i])] or members[:1]
        pick = min(live, key=lambda i: (used.get(path(param_list[i]), 0), live.index(i)))
        keep.add(pick)
        used[path(param_list[pick])] = used.get(path(param_list[pick]), 0) + 1
    for i, p in enumerate(param_list):
        if path_applies(p) and path(p) not in used:
            keep.add(i)
            used[path(p)] = 1
    return sorted(keep)


def covering_array(param_list: Sequence[dict], strength: int = 2) -> list:
    """Indices of a ``strength``-wise covering subset of one test function's parametrisations
    (all of them taken as option axes): every value of every parameter (``strength=1``), or every
    pair of values of every two parameters (``2``, the default), appears in at least one kept
    parametrisation. Greedy and deterministic: repeatedly the parametrisation that covers the
    most combinations not yet covered, ties to the first in collection order. Values are compared
    by their ``repr``."""
    import itertools

    if strength not in (1, 2):
        raise ValueError(f"covering: strength must be 1 or 2, got {strength!r}")

    def combos(p):
        items = sorted((k, repr(v)) for k, v in p.items())
        return set(itertools.combinations(items, strength))

    sets = [combos(p) for p in param_list]
    todo = set().union(*sets) if sets else set()
    keep = []
    while todo:
        best = max(range(len(sets)), key=lambda i: (len(sets[i] & todo), -i))
        keep.append(best)
        todo -= sets[best]
    return sorted(keep)


def pytest_collection_modifyitems(config, items):
    """Mark the kernel-product parametrisations outside the covering subset ``gpu_full`` and,
    unless :data:`FULL_KERNEL_PRODUCT`, deselect them. The same for a function marked
    ``@pytest.mark.covering(strength=1 | 2)``: outside :func:`covering_array` of its parameters
    (each value, or each pair of values, at least once), its parametrisations run on CUDA or
    with ``TSM_FULL_INTERPRETER=1`` only."""
    functions: Dict[tuple, list] = {}
    arrays: Dict[tuple, list] = {}
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        mark = item.get_closest_marker("covering")
        if mark is not None and params:
            if any(k in params for k in PATH_FIXTURES):
                raise pytest.UsageError(f"{item.nodeid}: the covering mark is for functions without kernel-path fixtures")
            arrays.setdefault((str(item.path), item.originalname), []).append(item)
        elif any(k in params for k in PATH_FIXTURES):
            functions.setdefault((str(item.path), item.originalname), []).append(item)
    # a parametrisation marked gpu_full by hand (pytest.param(..., marks=pytest.mark.gpu_full))
    extra = {id(item) for item in items if any(m.name == "gpu_full" for m in getattr(item, "own_markers", []))}
    for members in arrays.values():
        strength = members[0].get_closest_marker("covering").kwargs.get("strength", 2)
        kept = set(covering_array([m.callspec.params for m in members], strength))
        for i, m in enumerate(members):
            if i not in kept:
                m.add_marker(pytest.mark.gpu_full)
                extra.add(id(m))
    for members in functions.values():
        kept = set(covering_subset([m.callspec.params for m in members]))
        for i, m in enumerate(members):
            if i not in kept:
                m.add_marker(pytest.mark.gpu_full)
                extra.add(id(m))
    if not FULL_KERNEL_PRODUCT and extra:
        config.hook.pytest_deselected(items=[m for m in items if id(m) in extra])
        items[:] = [m for m in items if id(m) not in extra]
    _long_ones_first(items)


def _long_ones_first(items) -> None:
    """The ``integration`` tests (subprocesses, docs builds, the sm_90 compile: 4-30 s each) run
    first, the rest in their order: pytest-xdist's workers then end on short tests, so neither
    waits long for the other at the end (``--dist worksteal`` steals from the end of a queue)."""
    items.sort(key=lambda item: item.get_closest_marker("integration") is None)  # stable


def pytest_report_header(config):
    return ("kernel tests: the full ring x engine x case product" if FULL_KERNEL_PRODUCT else
            "kernel tests: a covering subset in the interpreter (TSM_FULL_INTERPRETER=1 runs the full product)")
