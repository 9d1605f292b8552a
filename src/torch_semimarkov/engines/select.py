"""The one dispatcher: which engine runs a call, from the ``backend=`` argument, the device and
(for masks, k-best, samples and the entropy) whether the engine's kernels take the inputs.

* ``"triton"``: the Triton kernels (CUDA tensors, ``pip install torch-semimarkov[cuda]``);
* ``"numba"``: the compiled CPU engine (CPU tensors, ``pip install torch-semimarkov[cpu]``);
* ``"torch"``: the streaming PyTorch path (any device), the reference of the other two;
* ``"auto"`` (default): Triton for CUDA tensors when it loads, the compiled engine for CPU tensors
  when numba imports, the PyTorch path otherwise.

``use_triton=False`` (the older switch) keeps ``"auto"`` off Triton. A backend that is named
explicitly but cannot run here raises ``ValueError`` instead of falling back silently.

:func:`backend_for` answers for log Z, its gradients, Viterbi and the marginals;
:func:`engine_choice`, :func:`cpu_engine` and :func:`engine_masks` for the calls beyond them
(``"must"`` / ``"may"`` / ``"no"`` run on the engine's kernels, the compiled CPU engine or the
float64 PyTorch path of :mod:`torch_semimarkov.engines.torch.dense`).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

from torch_semimarkov.core.masks import segment_limits
from torch_semimarkov.core.validation import StreamingInputs
from torch_semimarkov.engines.available import numba_available, numba_engine, triton_available
from torch_semimarkov.engines.interface import ENGINES, NumbaEngine, TorchEngine, TritonEngine

BACKENDS = ("auto", "triton", "numba", "torch")

def resolve_backend(backend, use_triton: bool, is_cuda: bool, triton_ok) -> str:
    """The backend that runs a call on tensors of this device: ``"triton"``, ``"numba"`` or ``"torch"``.

    Args:
        backend: the user's ``backend=`` argument (one of :data:`BACKENDS`).
        use_triton: the user's ``use_triton=`` argument (False keeps ``"auto"`` off Triton).
        is_cuda: whether the inputs are CUDA tensors.
        triton_ok: a callable telling whether the Triton kernels load (probed only when needed).

    Raises:
        ValueError: ``backend`` is not one of :data:`BACKENDS`, or names a backend that cannot run
            on these tensors here (or contradicts ``use_triton=False``).
    """
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        if is_cuda:
            return "triton" if use_triton and triton_ok() else "torch"
        return "numba" if numba_available() else "torch"
    if backend == "triton":
        if not use_triton:
            raise ValueError("backend='triton' contradicts use_triton=False; pass one of them")
        if not is_cuda:
            raise ValueError("backend='triton' needs CUDA tensors; use backend='numba' or 'torch' (or 'auto') on the CPU")
        if not triton_ok():
            raise ValueError("backend='triton' needs Triton (pip install torch-semimarkov[cuda]); it could not be loaded")
        return "triton"
    if backend == "numba":
        if is_cuda:
            raise ValueError("backend='numba' runs on CPU tensors; use backend='triton' or 'torch' (or 'auto') on CUDA")
        if not numba_available():
            raise ValueError("backend='numba' needs numba (pip install torch-semimarkov[cpu]); it could not be imported")
        return "numba"
    return "torch"


def backend_for(inp: StreamingInputs, use_triton: bool = True, backend: str = "auto") -> str:
    """The backend that runs a call on these inputs: ``"triton"``, ``"numba"`` or ``"torch"`` (the one
    dispatcher of every public function; ValueError for an unusable request)."""
    return _resolve(backend, bool(use_triton), inp.cum_scores.is_cuda)


def _constant_result(fn):
    """``torch.compiler.assume_constant_result`` without its import of ``torch._dynamo`` (about a
    second at ``import torch_semimarkov``, paid by every script and worker process): the decorator
    only sets this attribute, which dynamo reads when it traces a call (checked by
    tests/engines/test_dispatch.py against the public decorator)."""
    fn._dynamo_marked_constant = True
    return fn


@_constant_result
def _resolve(backend: str, use_triton: bool, is_cuda: bool) -> str:
    # a compiler takes the answer as a constant (it depends on what is installed, not on data)
    return resolve_backend(backend, use_triton, is_cuda, triton_available)


# ------------------------------------------------ calls beyond the plain log Z (masks, k-best, samples, entropy)

def engine_choice(inp: StreamingInputs, backend: str = "auto", use_triton: bool = True,
                  any_transition: bool = False) -> str:
    """Whether a call beyond the plain log Z / Viterbi / marginals (masks, k-best, samples,
    entropy) runs on the engine's kernels: ``"must"`` (``backend="triton"``: it raises where they
    cannot take the call), ``"may"`` (``"auto"``: where they can, else the float64 PyTorch path) or
    ``"no"`` (``"torch"``, and ``"numba"``, whose compiled engine runs log Z, its gradients,
    Viterbi and marginals: the rest takes the float64 PyTorch path on the CPU).
    ``any_transition``: the call's kernels take a (K, C, C) transition too (sampling, masks, the
    entropy)."""
    if backend == "triton" and ENGINE_ON_CPU and not inp.cum_scores.is_cuda:
        name = "triton"  # tests: the engine's kernels in Triton's interpreter
    else:
        name = resolve_backend(backend, bool(use_triton), inp.cum_scores.is_cuda, _triton_loads)
    if name != "triton" and backend != "auto":
        return "no"
    if backend == "auto":
        return "may" if use_triton else "no"
    if not engine_takes(inp, any_transition):
        raise ValueError("backend='triton' runs k-best lists on a (C, C) transition only; use backend='auto' "
                         "or 'torch' for a (K, C, C) transition")
    return "must"


def cpu_engine(inp: StreamingInputs, backend: str = "auto"):
    """The compiled CPU engine (:mod:`torch_semimarkov.engines.numba.engine`) when a call beyond the plain log Z runs on
    it, else None: CPU tensors, ``backend="numba"``, or ``"auto"`` with numba importable (and
    :data:`ENGINE_ON_CPU` off: with it, tests send CPU tensors to the Triton kernels)."""
    if inp.cum_scores.is_cuda or backend not in ("auto", "numba") or (backend == "auto" and ENGINE_ON_CPU):
        return None
    return numba_engine() or None


def cpu_limits(inp: StreamingInputs, lm, bm):
    """The masks as the compiled engine's segment limits ``(min_start, max_end, forbidden_start)``
    (None without masks)."""
    if lm is None and bm is None:
        return None
    return segment_limits(lm, bm, inp.batch, inp.T, inp.C, inp.K, inp.cum_scores.device)


def _triton_loads() -> bool:
    from torch_semimarkov.engines.triton import HAS_TRITON
    return bool(HAS_TRITON)


def refuse(engine: str, what: str) -> None:
    """A ``backend="triton"`` call that the engine cannot take raises instead of falling back."""
    if engine == "must":
        raise ValueError(f"backend='triton' cannot run {what} on the engine's kernels (the ring of K·C "
                         "values does not fit the masked kernels); use backend='auto' or 'torch'")


#: Run the engine's kernels (sampling walk, constrained recurrences) on CPU tensors too (tests,
#: under ``TRITON_INTERPRET=1``).
ENGINE_ON_CPU = False


def engine_masks(inp: StreamingInputs, lm, bm, semiring: str = "log", engine: str = "may", blocked: bool = True,
                 any_transition: bool = False):
    """``(plan, (min_start, max_end, flags), proj_start)`` of a constrained call on the engine
    (CUDA tensors, a (C, C) transition; a ring too large for registers runs the blocked engine
    unless ``blocked=False``; with ``any_transition`` (log Z, its gradients, Viterbi, marginals) a
    (K, C, C) one too, on the chunked direct recurrence), or None (the PyTorch path). The limits
    and flags come from one kernel (``engines/triton/limits.py``); forbidden starts are one of
    the flags."""
    if (lm is None and bm is None) or engine == "no" or not engine_takes(inp, any_transition):
        return None
    from torch_semimarkov.engines.triton.limits import engine_limits
    from torch_semimarkov.engines.triton.plan import masked_plan
    plan = masked_plan(inp.batch, inp.T, inp.K, inp.C, semiring=semiring, device=inp.cum_scores.device,
                       blocked=blocked, duration_transitions=inp.duration_transitions)
    if plan is None:
        refuse(engine, "these masks")
        return None
    masks = engine_limits(lm, bm, inp.batch, inp.T, inp.C, inp.K, inp.cum_scores.device)
    return plan, masks, inp.proj_start


def engine_takes(inp: StreamingInputs, any_transition: bool = False) -> bool:
    """The engine's kernels can run this call: Triton, CUDA tensors (or :data:`ENGINE_ON_CPU`)
    and a (C, C) transition (or, with ``any_transition``, a (K, C, C) one too)."""
    from torch_semimarkov.engines.triton import HAS_TRITON
    return (HAS_TRITON and (inp.cum_scores.is_cuda or ENGINE_ON_CPU)
            and (any_transition or not inp.duration_transitions))


def engine_samples(inp: StreamingInputs, lm, bm) -> bool:
    """Sampling runs on the engine (its forward, then the chunked walk of ``engines/triton/traceback.py``;
    either transition shape) without masks; elsewhere on the PyTorch path."""
    return lm is None and bm is None and engine_takes(inp, any_transition=True)


class Route(NamedTuple):
    """Where a log Z / Viterbi / marginals call runs: the engine, its backend name, and the masks in
    that engine's form (None without masks): ``(plan, limits, proj_start)`` of
    :func:`engine_masks` for Triton, else ``(label_mask, boundary_mask)``."""

    engine: type
    name: str
    masks: Optional[Tuple] = None


def route(inp: StreamingInputs, label_mask=None, boundary_mask=None, semiring: str = "log", backend: str = "auto",
          use_triton: bool = True, blocked: bool = True, masked: Optional[bool] = None) -> Route:
    """The one decision of where log Z, its gradients, Viterbi or the marginals run (checked masks).

    Unmasked (``masked`` None and no masks): the engine of :func:`backend_for`, for the operators of
    :mod:`torch_semimarkov.ops`. Masked: the compiled CPU engine on CPU tensors (``"auto"`` /
    ``"numba"``), else the Triton kernels where their masked plan takes the call (either
    transition shape; ``blocked=False`` keeps large rings off the blocked engine), else the float64
    PyTorch model (``backend="triton"`` raises instead of falling back). ``masked=True`` with both
    masks None (a constrained call that constrains nothing) takes the PyTorch model."""
    has_masks = label_mask is not None or boundary_mask is not None
    if not has_masks and not masked:
        name = backend_for(inp, use_triton, backend)
        return Route(ENGINES[name], name)
    choice = engine_choice(inp, backend, use_triton, any_transition=True)
    if has_masks and cpu_engine(inp, backend) is not None:
        return Route(NumbaEngine, "numba", (label_mask, boundary_mask))
    on_kernels = engine_masks(inp, label_mask, boundary_mask, semiring, choice, blocked, any_transition=True)
    if on_kernels is not None:
        return Route(TritonEngine, "triton", on_kernels)
    return Route(TorchEngine, "torch", (label_mask, boundary_mask))
