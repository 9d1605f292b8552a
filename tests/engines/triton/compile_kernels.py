"""Compile recorded Triton kernel launches for a CUDA target on a machine without a GPU.

Run as a script (``python compile_kernels.py LAUNCHES.json``) in a process *without*
``TRITON_INTERPRET``: each record names a kernel (module and function), its argument types and
its compile-time constants, as the interpreter saw them in ``test_kernels_compile.py``; the script
compiles it for ``TSM_COMPILE_TARGET`` (default ``cuda:90``, an H100 / H200) and prints one line per
failure: Triton's front end by default (Python AST to Triton IR, where a kernel's type and shape
errors surface), every stage down to the cubin with ``TSM_COMPILE_FULL=1`` (Triton, LLVM and the
bundled ptxas all run on the CPU). The interpreter runs a
kernel's Python; only the compiler checks what the interpreter lets pass (a variable that changes
type in a branch, a block shape that is not a power of 2, ...).
"""

import importlib
import json
import os
import sys


def _front_end(target):
    """``compile(src, options)``: the front end of ``triton.compile`` alone (Python AST -> Triton IR,
    where type and shape errors surface), or None where this Triton's internals differ."""
    try:
        from triton._C.libtriton import ir
        from triton.compiler.compiler import make_backend
    except ImportError:
        return None
    backend = make_backend(target)
    if not all(hasattr(backend, n) for n in ("parse_options", "load_dialects", "get_codegen_implementation",
                                             "get_module_map")):
        return None

    def compile(src, options):
        opts = backend.parse_options(options)
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        return src.make_ir(target, opts, backend.get_codegen_implementation(opts), backend.get_module_map(), context)

    return compile


def main(path: str) -> int:
    import triton
    from triton.backends.compiler import GPUTarget

    backend, _, arch = os.environ.get("TSM_COMPILE_TARGET", "cuda:90").partition(":")
    target = GPUTarget(backend, int(arch), 32)
    # TSM_COMPILE_FULL=1: every stage down to the cubin (LLVM and ptxas too; ~25x the time)
    front = None if os.environ.get("TSM_COMPILE_FULL", "") not in ("", "0") else _front_end(target)
    records = json.load(open(path))
    failed = 0
    for rec in records:
        fn = getattr(importlib.import_module(rec["module"]), rec["name"])
        signature = {k: ("constexpr" if k in rec["constexprs"] else t) for k, t in rec["signature"].items()}
        src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=rec["constexprs"])
        options = {"num_warps": rec.get("num_warps", 4)}
        try:
            if front is not None:
                front(src, options)
            else:
                triton.compile(src, target=target, options=options)
        except Exception as exc:  # report every kernel, not only the first
            failed += 1
            msg = str(exc).strip().splitlines()
            print(f"FAILED {rec['module']}.{rec['name']} {rec['constexprs']}: {msg[-1] if msg else exc!r}")
    stage = "Triton IR" if front is not None else "cubin"
    print(f"compiled {len(records) - failed} of {len(records)} kernel variants for {backend}:{arch} (to {stage})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
