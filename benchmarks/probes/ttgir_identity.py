"""Show that a refactor of Triton kernels changes no compiled code, without a GPU.

1. ``record``: run pytest (the Triton interpreter) with a plugin that keeps every distinct launch
   of the named kernels: argument types and compile-time constants, the variants the tests run.
2. ``hash``: compile each recorded variant for sm_90 on this CPU down to Triton's GPU IR (TTGIR),
   put it in a canonical form and hash it, keyed by its constants and argument types.
3. ``compare``: the variants of two hash files, before and after the change, must all be equal.

The canonical form drops source locations and the kernel's signature line, lists the constants
sorted by value, names every SSA value by its order of definition (a use takes the latest binding)
and every kernel argument by its Python name, through ``--alias old=new`` where the change renamed
one. Two kernels with the same canonical TTGIR run the same operations on the same values in the
same order: their results are bitwise equal on any GPU this Triton compiles for. A kernel that the
change folded into another (one with a new ``REVERSE`` flag) is matched by ``--reverse NAME``:
NAME's variants count as that kernel's ``REVERSE=True`` ones; any other flags by ``--flag
NAME=FLAG+FLAG2+CONST:1`` (NAME's variants count as those with these flags set and constants at
these values, e.g. a new flag and the defaults of the kernel it joined; several kernels
comma-separated).

    python benchmarks/probes/ttgir_identity.py record before.json _fwd_reg_chunks_kernel,_beta_reg_chunks_kernel
    python benchmarks/probes/ttgir_identity.py hash before.json before_hash.json --reverse _beta_reg_chunks_kernel \\
        --alias w_ptr=r_ptr,x_ptr=r_ptr,g_ptr=f_ptr,ms_ptr=lim_ptr,me_ptr=lim_ptr,s_x_b=s_w_b,s_g_b=s_f_b
    (change the code)
    python benchmarks/probes/ttgir_identity.py record after.json _reg_chunks_kernel
    python benchmarks/probes/ttgir_identity.py hash after.json after_hash.json
    python benchmarks/probes/ttgir_identity.py compare before_hash.json after_hash.json

The variants of one test file only (faster than the whole suite): ``record OUT NAMES -m integration
tests/engines/triton/test_kernels_compile.py`` (the compile check's calls reach every kernel family).
GPU_NOTES 105: the length / transition helpers, the entropy's weighted marginals folded into
``_shared_factored_kernel`` and its anchors into ``_anchor_kernel`` (``--flag
_entropy_marginals_kernel=ENT+SEG,_entropy_anchor_kernel=ENT+NS:1 --alias qend_ptr=pend_ptr``).
"""
import glob
import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# -- the pytest plugin (loaded in every xdist worker with ``-p ttgir_identity``) ----------------------
_records = []


def pytest_configure(config):
    if not os.environ.get("TTGIR_REC_NAMES"):
        return
    sys.path.insert(0, os.path.join(ROOT, "tests", "engines", "triton"))
    from compile_kernels import record_launches

    # every distinct launch from now on (the compile check's recorder; filtered when saved)
    _records.append(record_launches(setattr))


def pytest_unconfigure(config):
    out = os.environ.get("TTGIR_REC_OUT")
    if out and _records:
        names = set(os.environ["TTGIR_REC_NAMES"].split(","))
        keep = [r for r in _records[0] if r["name"] in names]
        json.dump(keep, open(f"{out}.{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.json", "w"))


# -- canonical TTGIR ---------------------------------------------------------------------------------
def canonical(ttgir: str, alias: dict) -> str:
    txt = re.sub(r"\s*loc\((?:[^()]|\([^()]*\))*\)", "", ttgir)
    lines = [ln for ln in txt.split("\n") if not ln.startswith("#loc")]
    txt = re.sub(r"tt\.func public @\w+\(.*", "tt.func", "\n".join(lines))
    consts = {}
    for ln in txt.split("\n"):
        m = re.match(r"\s*(%[\w]+) = arith\.constant (.*)$", ln)
        if m:
            consts[m.group(1)] = m.group(2)
    vals = sorted(set(consts.values()))
    cname = {k: f"%K{vals.index(v)}" for k, v in consts.items()}
    body = [ln for ln in txt.split("\n") if not re.match(r"\s*%[\w]+ = arith\.constant ", ln)]
    txt = "\n".join([f"    %K{i} = arith.constant {v}" for i, v in enumerate(vals)] + body)
    out, pos, bind, n = [], 0, {}, 0
    for m in re.finditer(r"%[\w]+(?:#\d+)?", txt):
        tok = m.group(0)
        out.append(txt[pos:m.start()])
        pos = m.end()
        base, _, res = tok.partition("#")
        suffix = "#" + res if res else ""
        if base in cname:
            out.append(cname[base] + suffix)
        elif re.match(r"(?::\d+)? = |: ", txt[m.end():m.end() + 8]) and not res:
            bind[base] = f"%v{n}"  # a definition: a new name, which later uses take
            n += 1
            out.append(bind[base])
        elif base in bind:
            out.append(bind[base] + suffix)
        else:
            out.append("%" + alias.get(base[1:], base[1:]) + suffix)
    out.append(txt[pos:])
    return "".join(out)


def _ttgir(src, warps):
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    opts = backend.parse_options({"num_warps": warps})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    mod = src.make_ir(target, opts, backend.get_codegen_implementation(opts), backend.get_module_map(), context)
    stages = {}
    backend.add_stages(stages, opts, src.language)
    for name in ("ttir", "ttgir"):
        mod = stages[name](mod, {})
    return str(mod)


def hash_records(path, out, reverse=(), alias=None, flags=None):
    from triton.compiler import ASTSource

    alias = alias or {}
    flags = flags or {}
    res = {}
    for r in json.load(open(path)):
        c = r["constexprs"]
        fn = getattr(importlib.import_module(r["module"]), r["name"])
        sig = {k: ("constexpr" if k in c else t) for k, t in r["signature"].items()}
        text = canonical(_ttgir(ASTSource(fn=fn, signature=sig, constexprs=c), r["num_warps"]), alias)
        rev = r["name"] in reverse or bool(c.get("REVERSE"))
        # a flag that is off is a flag the kernel does not have (a fold adds flags, off by default)
        key = {k: v for k, v in c.items() if v is not None and v is not False and k != "REVERSE"}
        if r["name"] in flags:  # a kernel folded into another as its variants with these flags set
            for f in flags[r["name"]].split("+"):
                name, _, value = f.partition(":")  # FLAG (True) or CONST:INT (a default it now has)
                key[name] = int(value) if value else True
        types = {alias.get(n, n): t for n, t in r["signature"].items() if t != "constexpr"}
        res[json.dumps({"REVERSE": rev, **key, "warps": r["num_warps"], "types": sorted(types.items())},
                       sort_keys=True)] = hashlib.sha1(text.encode()).hexdigest()
    json.dump(res, open(out, "w"), indent=1)
    print(f"{len(res)} variants hashed -> {out}")


def main():
    mode = sys.argv[1]
    if mode == "record":
        out, names, extra = sys.argv[2], sys.argv[3], sys.argv[4:] or ["tests/engines/triton", "tests/api"]
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, TTGIR_REC_NAMES=names, TTGIR_REC_OUT=os.path.join(tmp, "rec"),
                       PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
            rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "ttgir_identity",
                                 *extra], env=env, cwd=ROOT).returncode
            recs = {json.dumps(x, sort_keys=True): x for f in glob.glob(os.path.join(tmp, "rec.*.json"))
                    for x in json.load(open(f))}
        json.dump(list(recs.values()), open(out, "w"))
        print(f"{len(recs)} variants recorded -> {out} (pytest exit {rc})")
    elif mode == "hash":
        args = sys.argv[4:]
        reverse = args[args.index("--reverse") + 1].split(",") if "--reverse" in args else []
        alias = dict(a.split("=") for a in args[args.index("--alias") + 1].split(",")) if "--alias" in args else {}
        flags = dict(a.split("=") for a in args[args.index("--flag") + 1].split(",")) if "--flag" in args else {}
        hash_records(sys.argv[2], sys.argv[3], reverse, alias, flags)
    elif mode == "compare":
        a, b = json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
        common = set(a) & set(b)
        same = sum(a[k] == b[k] for k in common)
        print(f"{len(a)} before, {len(b)} after, {len(common)} in both, {same} identical, "
              f"{len(common) - same} different; only before {len(set(a) - set(b))}, only after {len(set(b) - set(a))}")
        sys.exit(0 if same == len(common) == len(a) == len(b) else 1)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
