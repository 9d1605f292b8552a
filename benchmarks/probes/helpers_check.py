"""GPU check (issue 25): the blocked engine with and without helper programs on models whose long
segments carry the mass (a new segment costs 20 nats, so most segments are hundreds of positions
long and the helpers' part, the rows older than the previous block, holds nearly all of it): log Z,
the gradients and Viterbi against each other. A random model cannot show a wrong helpers' part:
its mass lies in short segments, which the run sums itself.

    python benchmarks/probes/helpers_check.py $OUT/helpers_check.json
"""
import json
import sys

import torch

from torch_semimarkov import semi_crf_streaming_forward, semi_crf_streaming_viterbi
from torch_semimarkov.engines.triton import plan as plan_mod

rel = lambda x, y: float((x.double() - y.double()).abs().max() / y.double().abs().max().clamp_min(1e-30))  # noqa: E731
res = {"device": torch.cuda.get_device_name(), "shapes": {}}
for B, T, K, C in [(8, 3000, 960, 47), (1, 20000, 4000, 47)]:
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(B, T, C, device="cuda", generator=g) * 0.5
    cum = torch.nn.functional.pad(x.cumsum(1), (0, 0, 1, 0))
    tr = torch.randn(C, C, device="cuda", generator=g) * 0.3 - 20.0
    db = torch.randn(K, C, device="cuda", generator=g) * 0.3
    lengths = torch.full((B,), T, device="cuda")
    out = {}
    for h in (0, None):
        plan_mod.HELPERS_OVERRIDE = h
        leaves = [t.clone().requires_grad_(True) for t in (cum, tr, db)]
        z = semi_crf_streaming_forward(*leaves, lengths, K)
        grads = torch.autograd.grad(z.sum(), leaves)
        v = semi_crf_streaming_viterbi(cum, tr, db, lengths, K)
        out[h] = (z.detach(), grads, v.scores, v.labels)
    a, b = out[0], out[None]
    row = {"log_z": rel(b[0], a[0]), "grads": [rel(p, q) for p, q in zip(b[1], a[1])],
           "viterbi_score": rel(b[2], a[2]), "labels_equal": float((a[3] == b[3]).double().mean()),
           "mean_segment": float(T / max(1.0, float((a[3][:, 1:] != a[3][:, :-1]).sum()) / B + 1))}
    res["shapes"][f"{B},{T},{K},{C}"] = row
    print(B, T, K, C, row, flush=True)
plan_mod.HELPERS_OVERRIDE = None
json.dump(res, open(sys.argv[1], "w"), indent=1)
