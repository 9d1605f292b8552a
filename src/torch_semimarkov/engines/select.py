"""Which implementation runs a streaming call: the ``backend=`` argument.

* ``"triton"``: the Triton kernels (CUDA tensors, ``pip install torch-semimarkov[cuda]``);
* ``"numba"``: the compiled CPU engine (CPU tensors, ``pip install torch-semimarkov[cpu]``);
* ``"torch"``: the streaming PyTorch path (any device), the reference of the other two;
* ``"auto"`` (default): Triton for CUDA tensors when it loads, the compiled engine for CPU tensors
  when numba imports, the PyTorch path otherwise.

``use_triton=False`` (the older switch) keeps ``"auto"`` off Triton. A backend that is named
explicitly but cannot run here raises ``ValueError`` instead of falling back silently.
"""

from __future__ import annotations

import importlib
import warnings

import torch

from torch_semimarkov.core.validation import StreamingInputs

BACKENDS = ("auto", "triton", "numba", "torch")

_NUMBA = None  # the compiled engine module (engines/numba/engine.py), or False once probed and unusable


def numba_engine():
    """The compiled CPU engine module, imported once; ``False`` when numba is not usable here."""
    global _NUMBA
    if _NUMBA is None:
        try:
            _NUMBA = importlib.import_module("torch_semimarkov.engines.numba.engine")
        except ImportError:
            _NUMBA = False
        except Exception as exc:  # noqa: BLE001 - a broken numba install must not break the PyTorch path
            warnings.warn(
                f"torch_semimarkov: the compiled CPU engine could not be loaded ({type(exc).__name__}: {exc}); "
                "CPU tensors will use the slower PyTorch path",
                RuntimeWarning,
                stacklevel=3,
            )
            _NUMBA = False
    return _NUMBA


def numba_module(name: str):
    """The compiled CPU engine's module ``engines.numba.<name>`` (e.g. ``"sample"``), imported once numba
    imports; ``False`` when it does not."""
    if not numba_engine():
        return False
    return importlib.import_module(f"torch_semimarkov.engines.numba.{name}")


def numba_available() -> bool:
    """True when the compiled CPU engine (numba) can be imported."""
    return bool(numba_engine())


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


_TRITON = None  # the Triton launch module, or False once probed and found unusable


def triton_launchers():
    """Import the Triton launchers once (the ``kernels.launch`` module); ``False`` when Triton
    is not usable here."""
    global _TRITON
    if _TRITON is None:
        try:
            from torch_semimarkov.engines.triton import HAS_TRITON

            _TRITON = False
            if HAS_TRITON:
                from torch_semimarkov.engines.triton import launch

                _TRITON = launch
        except Exception as exc:  # noqa: BLE001 - a broken install must not break the PyTorch path
            warnings.warn(
                f"torch_semimarkov: the Triton kernels could not be loaded ({type(exc).__name__}: {exc}); "
                "CUDA tensors will use the slower PyTorch path",
                RuntimeWarning,
                stacklevel=3,
            )
            _TRITON = False
    return _TRITON


def triton_available() -> bool:
    """True when the Triton kernels can be imported (they still need CUDA tensors to run)."""
    return bool(triton_launchers())



def backend_for(inp: StreamingInputs, use_triton: bool = True, backend: str = "auto") -> str:
    """The backend that runs a call on these inputs: ``"triton"``, ``"numba"`` or ``"torch"`` (the one
    dispatcher of every public function; ValueError for an unusable request)."""
    return _resolve(backend, bool(use_triton), inp.cum_scores.is_cuda)


@torch.compiler.assume_constant_result
def _resolve(backend: str, use_triton: bool, is_cuda: bool) -> str:
    # a compiler takes the answer as a constant (it depends on what is installed, not on data)
    return resolve_backend(backend, use_triton, is_cuda, triton_available)
