"""What is installed: the compiled CPU engine (numba) and the Triton kernels, each imported once,
lazily, so that the package imports and runs without either."""

from __future__ import annotations

import importlib
import warnings

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
