"""A/B of the blocked engine's block sums: linear-space products (BLOCKED_LINEAR=True) against the
term-by-term log-space sums, interleaved, same inputs; accuracy against each other and float64."""
import json, os, sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_parallel import make_inputs, median_ms
from torch_semimarkov import semi_crf_streaming_forward
from torch_semimarkov.engines.triton import plan as plan_mod
OUT = os.environ.get("OUT", "/tmp")
res = {"device": torch.cuda.get_device_name(), "timings": [], "accuracy": []}
def grads(cum, tr, db, lengths, K, ps=None, pe=None):
    leaves = [x.detach().clone().requires_grad_(True) for x in (cum, tr, db)]
    z = semi_crf_streaming_forward(*leaves, lengths, K, proj_start=ps, proj_end=pe)
    z.sum().backward()
    return [z.detach()] + [l.grad for l in leaves]
def rel(a, b):
    return float(((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1e-30)).item())
shapes = [(32, 3000, 960, 47), (16, 20000, 960, 47), (4, 100000, 960, 47), (1, 100000, 4000, 47)]
if len(sys.argv) > 1 and sys.argv[1] == "quick":
    shapes = shapes[:2]
for B, T, K, C in shapes:
    cum, tr, db, lengths = make_inputs(B, T, K, C)
    leaves = [x.detach().clone().requires_grad_(True) for x in (cum, tr, db)]
    def fb():
        semi_crf_streaming_forward(*leaves, lengths, K).sum().backward()
    outs = {}
    for lin in (None, False):
        plan_mod.BLOCKED_LINEAR = lin
        outs[lin] = grads(cum, tr, db, lengths, K)
    res["accuracy"].append({"shape": [B, T, K, C], "logZ_rel": rel(outs[None][0], outs[False][0]),
                            "grad_rel": [rel(a, b) for a, b in zip(outs[None][1:], outs[False][1:])]})
    print(res["accuracy"][-1], flush=True)
    budget = 2 if T * B <= 400000 else 4
    for rnd in range(2):
        for lin in (False, None):
            plan_mod.BLOCKED_LINEAR = lin
            row = {"linear": lin, "round": rnd, "shape": [B, T, K, C],
                   "forward_ms": median_ms(lambda: semi_crf_streaming_forward(cum, tr, db, lengths, K), min_runs=3, budget_s=budget)}
            if K < 4000 or rnd == 0:
                row["fwd_bwd_ms"] = median_ms(fb, min_runs=3, budget_s=budget)
            print(row, flush=True); res["timings"].append(row)
    json.dump(res, open(OUT + "/ab_linear.json", "w"), indent=1)
# float64 check at a small shape
cum, tr, db, lengths = make_inputs(2, 3000, 300, 40)
plan_mod.BLOCKED_LINEAR = None
a = grads(cum, tr, db, lengths, 300)
ref = grads(cum.double().cpu(), tr.double().cpu(), db.double().cpu(), lengths.cpu(), 300)
res["accuracy"].append({"shape": [2, 3000, 300, 40], "vs": "float64 cpu", "logZ_rel": rel(a[0].cpu(), ref[0]),
                        "grad_rel": [rel(x.cpu(), y) for x, y in zip(a[1:], ref[1:])]})
print(res["accuracy"][-1], flush=True)
# gene model
if os.path.exists("/tmp/gene_inputs.pt"):
    g = torch.load("/tmp/gene_inputs.pt")
    inp = [g[k].cuda() for k in ("cum_scores", "transition", "duration_bias", "lengths", "proj_start", "proj_end")]
    cum, tr, db, lengths, ps, pe = inp
    K = g["K"]
    outs = {}
    for lin in (None, False):
        plan_mod.BLOCKED_LINEAR = lin
        outs[lin] = grads(cum, tr, db, lengths, K, ps, pe)
    res["accuracy"].append({"shape": "gene", "logZ_rel": rel(outs[None][0], outs[False][0]),
                            "grad_rel": [rel(a, b) for a, b in zip(outs[None][1:], outs[False][1:])]})
    print(res["accuracy"][-1], flush=True)
    leaves = [x.detach().clone().requires_grad_(True) for x in (cum, tr, db)]
    def fbg():
        semi_crf_streaming_forward(*leaves, lengths, K, proj_start=ps, proj_end=pe).sum().backward()
    for rnd in range(2):
        for lin in (False, None):
            plan_mod.BLOCKED_LINEAR = lin
            row = {"linear": lin, "round": rnd, "shape": "gene " + str(list(cum.shape)),
                   "forward_ms": median_ms(lambda: semi_crf_streaming_forward(cum, tr, db, lengths, K, proj_start=ps, proj_end=pe), min_runs=3, budget_s=2),
                   "fwd_bwd_ms": median_ms(fbg, min_runs=3, budget_s=2)}
            print(row, flush=True); res["timings"].append(row)
json.dump(res, open(OUT + "/ab_linear.json", "w"), indent=1)
