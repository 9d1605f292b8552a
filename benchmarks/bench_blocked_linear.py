"""GPU benchmark of the blocked engine's linear-space block sums (``blocked._tile_linear``).

In one run: the float32 engine against the float64 PyTorch path for the log-space sums and three
linear tiles (``precision``), and forward / forward+backward (medians of CUDA-event timings after
warm-up) at the genomics shapes with the log-space sums (``BLOCKED_LINEAR = False``) and the
default (linear where the duration bias allows) (``timings``). Inputs: ``bench_parallel.make_inputs``.

    python benchmarks/bench_blocked_linear.py    # writes $OUT/tile_precision.json (default /tmp)

Committed result: ``results/gpu_h200_blocked_linear_precision.json`` (README's genomics table).
The probes that led to it (A/B, tile sweep, text-patched variants) are in ``benchmarks/probes/``.
"""
import json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_parallel import make_inputs, median_ms
from torch_semimarkov import semi_crf_streaming_forward
from torch_semimarkov.engines.triton import plan as plan_mod
OUT = os.environ.get("OUT", "/tmp")
def grads(cum, tr, db, lengths, K):
    leaves = [x.detach().clone().requires_grad_(True) for x in (cum, tr, db)]
    z = semi_crf_streaming_forward(*leaves, lengths, K)
    z.sum().backward()
    return [z.detach()] + [l.grad for l in leaves]
def rel(a, b):
    return float(((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1e-30)).item())
res = {"precision": [], "timings": []}
for B, T, K, C in [(2, 3000, 300, 40), (2, 6000, 960, 47)]:
    cum, tr, db, lengths = make_inputs(B, T, K, C)
    ref = grads(cum.double().cpu(), tr.double().cpu(), db.double().cpu(), lengths.cpu(), K)
    for lin, tile in [(False, None), (True, (16, 32, 16)), (True, (32, 64, 16)), (True, (64, 32, 16))]:
        plan_mod.BLOCKED_LINEAR = lin; plan_mod.LINEAR_TILE = tile or (32, 64, 16)
        a = grads(cum, tr, db, lengths, K)
        row = {"shape": [B, T, K, C], "linear": lin, "tile": tile, "logZ_rel": rel(a[0].cpu(), ref[0]),
               "grad_rel": [rel(x.cpu(), y) for x, y in zip(a[1:], ref[1:])]}
        print(row, flush=True); res["precision"].append(row)
plan_mod.LINEAR_TILE = (32, 64, 16)
for B, T, K, C in [(32, 3000, 960, 47), (16, 20000, 960, 47), (4, 100000, 960, 47), (1, 100000, 4000, 47)]:
    cum, tr, db, lengths = make_inputs(B, T, K, C)
    leaves = [x.detach().clone().requires_grad_(True) for x in (cum, tr, db)]
    def fb():
        semi_crf_streaming_forward(*leaves, lengths, K).sum().backward()
    for lin in (False, None):
        plan_mod.BLOCKED_LINEAR = lin
        row = {"linear": lin, "shape": [B, T, K, C],
               "forward_ms": median_ms(lambda: semi_crf_streaming_forward(cum, tr, db, lengths, K), min_runs=3, budget_s=1.5),
               "fwd_bwd_ms": median_ms(fb, min_runs=3, budget_s=1.5)}
        print(row, flush=True); res["timings"].append(row)
    json.dump(res, open(OUT + "/tile_precision.json", "w"), indent=1)
