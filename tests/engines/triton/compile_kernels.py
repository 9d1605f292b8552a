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
import inspect
import json
import os
import re
import subprocess
import sys

_TYPES = {"float32": "fp32", "float64": "fp64", "float16": "fp16", "bfloat16": "bf16", "int32": "i32",
          "int64": "i64", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1"}


def _type(value) -> str:
    """Triton's signature type of a launch argument (tensors: a pointer to their dtype)."""
    dtype = getattr(value, "dtype", None)
    if dtype is not None and hasattr(value, "data_ptr"):
        return "*" + _TYPES[str(dtype).rpartition(".")[2]]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"an argument the compile check cannot type: {value!r}")


def record_launches(setattr_) -> list:
    """Record every distinct launch the Triton interpreter runs from now on (``setattr_``:
    ``monkeypatch.setattr``, so that the recording ends with the test): a list of
    ``{module, name, signature, constexprs, num_warps}`` that :func:`main` compiles."""
    from triton.runtime import interpreter as interp

    seen, records = set(), []
    call = interp.GridExecutor.__call__

    def recording(self, *args, **kwargs):
        spec = inspect.getfullargspec(self.fn)
        kept = {k: v for k, v in kwargs.items() if k in spec.args or k in spec.kwonlyargs}
        bound = inspect.getcallargs(self.fn, *args, **kept)
        consts = {k: bound[k] for k in self.constexprs}
        consts.update({k: None for k, v in bound.items() if v is None})
        sig = {k: ("constexpr" if k in consts else _type(v)) for k, v in bound.items()}
        rec = {"module": self.fn.__module__, "name": self.fn.__name__, "signature": sig,
               "constexprs": consts, "num_warps": int(kwargs.get("num_warps", 4))}
        key = json.dumps(rec, sort_keys=True)
        if key not in seen:
            seen.add(key)
            records.append(rec)
        return call(self, *args, **kwargs)

    setattr_(interp.GridExecutor, "__call__", recording)
    return records


#: PTX instructions :func:`main`'s report counts (static counts, by regular expression).
PTX_COUNTS = {"shfl": r"shfl\.sync", "bar": r"bar\.sync|barrier\.sync", "ld_global": r"ld\.global",
              "ld_shared": r"ld\.shared", "st_shared": r"st\.shared", "cp_async": r"cp\.async\.",
              "ex2": r"ex2\.approx", "cvt": r"\bcvt\."}


def compile_report(records: list, src: str, save_ptx=None, timeout: int = 1200) -> list:
    """Compile ``records`` (from :func:`record_launches`) in a process without the interpreter and
    with ``TSM_COMPILE_REPORT=1``, the package imported from ``src``: one dict a variant (its kernel,
    constexprs, warps, registers, spills and PTX counts; ``save_ptx``: a folder for each variant's
    PTX). Prints the process's tail when it fails. Used by the probes that report registers."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "launches.json")
        json.dump(records, open(path, "w"))
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env.update(TSM_COMPILE_REPORT="1", TRITON_CACHE_DIR=os.path.join(tmp, "cache"),
                   PYTHONPATH=src + os.pathsep + env.get("PYTHONPATH", ""))
        if save_ptx:
            env["TSM_COMPILE_PTX"] = save_ptx
        out = subprocess.run([sys.executable, os.path.abspath(__file__), path], env=env, capture_output=True,
                             text=True, timeout=timeout)
    if out.returncode:
        print(out.stdout[-3000:], out.stderr[-3000:])
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def ptxas_usage(ptx: str, arch: int) -> dict:
    """Registers a thread and spilled bytes of a kernel's PTX, from the bundled ``ptxas -v``."""
    import tempfile

    import triton

    try:  # the ptxas Triton itself runs for this architecture (its PTX version needs it)
        from triton.backends.nvidia.compiler import get_ptxas

        ptxas = get_ptxas(arch).path
    except (ImportError, AttributeError):
        ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        open(src, "w").write(ptx)
        out = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{arch}a" if arch >= 90 else f"--gpu-name=sm_{arch}",
                              src, "-o", os.path.join(tmp, "k.cubin")], capture_output=True, text=True)
    text = out.stdout + out.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return {"registers": int(regs.group(1)) if regs else None,
            "spill_store_bytes": int(spill.group(1)) if spill else None,
            "spill_load_bytes": int(spill.group(2)) if spill else None}


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
    # TSM_COMPILE_REPORT=1 (implies the full compile): registers and spills of each variant (ptxas -v)
    # and its PTX instruction counts (PTX_COUNTS); TSM_COMPILE_PTX=DIR also writes each variant's PTX
    report = os.environ.get("TSM_COMPILE_REPORT", "") not in ("", "0")
    full = report or os.environ.get("TSM_COMPILE_FULL", "") not in ("", "0")
    front = None if full else _front_end(target)
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
                compiled = triton.compile(src, target=target, options=options)
                if report:
                    ptx = compiled.asm["ptx"]
                    usage = ptxas_usage(ptx, int(arch))
                    # static counts of PTX instructions (shuffles and barriers: reductions across lanes / warps)
                    usage.update({k: len(re.findall(pat, ptx)) for k, pat in PTX_COUNTS.items()})
                    # shared memory a program (bytes; with the registers it bounds programs an SM)
                    usage["shared_bytes"] = getattr(compiled.metadata, "shared", None)
                    if os.environ.get("TSM_COMPILE_PTX"):  # a folder: each variant's PTX, numbered
                        name = f"{len(os.listdir(os.environ['TSM_COMPILE_PTX'])):03d}_{rec['name']}_w{options['num_warps']}.ptx"
                        open(os.path.join(os.environ["TSM_COMPILE_PTX"], name), "w").write(ptx)
                    print(json.dumps({"kernel": rec["name"], "constexprs": rec["constexprs"],
                                      "num_warps": options["num_warps"], **usage}), flush=True)
        except Exception as exc:  # report every kernel, not only the first
            failed += 1
            msg = str(exc).strip().splitlines()
            print(f"FAILED {rec['module']}.{rec['name']} {rec['constexprs']}: {msg[-1] if msg else exc!r}")
    stage = "Triton IR" if front is not None else "cubin"
    print(f"compiled {len(records) - failed} of {len(records)} kernel variants for {backend}:{arch} (to {stage})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
