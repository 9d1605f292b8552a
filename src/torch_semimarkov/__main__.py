"""Command line: ``python -m torch_semimarkov demo [--quick] [--device D] [--epochs N] [--seed S] [--out DIR]``
and ``python -m torch_semimarkov info``."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def _info() -> int:
    import torch

    import torch_semimarkov
    from torch_semimarkov.engines.available import triton_available
    from torch_semimarkov.engines.available import numba_available

    print(f"torch-semimarkov {torch_semimarkov.__version__}")
    print(f"torch {torch.__version__}; CUDA available: {torch.cuda.is_available()}; Triton kernels usable: {triton_available()}")
    if numba_available():
        import numba

        from torch_semimarkov.engines.numba.engine import num_threads

        print(f"compiled CPU engine: numba {numba.__version__}, {num_threads()} threads (the CPU default)")
    else:
        print('compiled CPU engine: not installed (pip install "torch-semimarkov[cpu]"); CPU tensors use the PyTorch path')
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_semimarkov", description="torch-semimarkov command line")
    sub = parser.add_subparsers(dest="command")
    from torch_semimarkov import demo

    demo.build_parser(sub.add_parser("demo", help="train a semi-CRF on synthetic genomics-like data and compare it with a softmax baseline"))
    sub.add_parser("info", help="versions and whether the GPU kernels and the compiled CPU engine are usable")
    args = parser.parse_args(argv)
    if args.command == "demo":
        demo.main(args=args)
        return 0
    if args.command == "info":
        return _info()
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
