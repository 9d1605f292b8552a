"""Where the blocked forward's time goes: variants of blocked.py (text-patched copies) swapped in."""
import importlib.util, json, os, sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_parallel import make_inputs, median_ms
from torch_semimarkov import semi_crf_streaming_forward
from torch_semimarkov.engines.triton import blocked, plan as plan_mod
OUT = os.environ.get("OUT", "/tmp")
src = open(blocked.__file__).read()
def variant(name, *subs):
    s = src
    for a, b in subs:
        assert a in s, a
        s = s.replace(a, b)
    path = f"/tmp/blk_{name}.py"
    open(path, "w").write(s)
    spec = importlib.util.spec_from_file_location(f"blk_{name}", path)
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    return m._blk_chunks_kernel
TH = "(acc <= 1e-25)).to(tl.int32)"
LOOP = "        for r0 in range(0, K, orr.shape[0]):\n            v, rho, r, ok = _old_rows(q0, r0, start, L, H, r_b, f_b, in32, in64, cum_b, s_ref, C, K, cols, mcol,\n                                      orr, HAS_IN, REVERSE)\n            fin"
kernels = {
    "default": blocked._blk_chunks_kernel,
    "never_fallback": variant("never", (TH, "(acc <= -1.0)).to(tl.int32)")),
    "always_fallback": variant("always", (TH, "(acc <= 1e30)).to(tl.int32)")),
    "no_phase_a": variant("nophasea", (TH, "(acc <= -1.0)).to(tl.int32)"), (LOOP, LOOP.replace("range(0, K,", "range(0, 0,"))),
}
res = []
cases = [("rand", (16, 20000, 960, 47)), ("rand", (4, 100000, 960, 47))]
for tag, (B, T, K, C) in cases:
    cum, tr, db, lengths = make_inputs(B, T, K, C)
    for rnd in range(2):
        for name, kern in kernels.items():
            for lin in ((True, False) if name == "default" else (True,)):
                blocked._blk_chunks_kernel = kern
                plan_mod.BLOCKED_LINEAR = lin
                z = semi_crf_streaming_forward(cum, tr, db, lengths, K)
                row = {"variant": name, "linear": lin, "shape": [B, T, K, C], "round": rnd,
                       "forward_ms": median_ms(lambda: semi_crf_streaming_forward(cum, tr, db, lengths, K), min_runs=3, budget_s=1.5),
                       "logZ0": float(z[0])}
                print(row, flush=True); res.append(row)
# gene model: fallback share
if os.path.exists("/tmp/gene_inputs.pt"):
    g = torch.load("/tmp/gene_inputs.pt")
    cum, tr, db, lengths, ps, pe = [g[k].cuda() for k in ("cum_scores", "transition", "duration_bias", "lengths", "proj_start", "proj_end")]
    K = g["K"]
    print("gene D finite per label:", (db > -1e29).sum(0).tolist(), flush=True)
    for name in ("default", "never_fallback", "always_fallback"):
        blocked._blk_chunks_kernel = kernels[name]; plan_mod.BLOCKED_LINEAR = True
        z = semi_crf_streaming_forward(cum, tr, db, lengths, K, proj_start=ps, proj_end=pe)
        row = {"variant": name, "shape": "gene", "forward_ms": median_ms(lambda: semi_crf_streaming_forward(cum, tr, db, lengths, K, proj_start=ps, proj_end=pe), min_runs=3, budget_s=1.5), "logZ": z.tolist()}
        print(row, flush=True); res.append(row)
json.dump(res, open(OUT + "/probe_linear.json", "w"), indent=1)
# tiles and warps of the linear kernel (no fallback variant = default kernel)
blocked._blk_chunks_kernel = kernels["default"]
B, T, K, C = 4, 100000, 960, 47
cum, tr, db, lengths = make_inputs(B, T, K, C)
for lin in (True,):
    for tile, warps in [((32, 32, 16), 8), ((16, 64, 16), 8), ((8, 64, 16), 8), ((16, 32, 16), 4), ((32, 64, 16), 8)]:
        if True:
            plan_mod.BLOCKED_LINEAR = lin; plan_mod.BLOCK_OVERRIDE = tile; plan_mod.BLOCKED_WARPS = warps
            try:
                row = {"variant": "tile", "linear": lin, "tile": tile, "warps": warps,
                       "forward_ms": median_ms(lambda: semi_crf_streaming_forward(cum, tr, db, lengths, K), min_runs=3, budget_s=1.0)}
            except Exception as e:
                row = {"variant": "tile", "linear": lin, "tile": tile, "warps": warps, "error": str(e)[:200]}
            print(row, flush=True); res.append(row)
plan_mod.BLOCK_OVERRIDE = None; plan_mod.BLOCKED_WARPS = 8
json.dump(res, open(OUT + "/probe_linear.json", "w"), indent=1)
