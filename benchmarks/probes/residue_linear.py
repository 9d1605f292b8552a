"""A/B of the blocked kernel before and after the residue-class block sums (issue 25, GPU_NOTES 51):
random models (the default linear sums with one shift per label, PERIOD 1) must give bitwise the
same log Z and gradients, at the same speed; and a random model with a gene grammar's durations
(PERIOD 3 by default now, log space before). The previous kernel is a copy of blocked.py given by
$OLD_BLOCKED (``git show <commit>:src/torch_semimarkov/engines/triton/blocked.py``), swapped in.

    OLD_BLOCKED=/tmp/old_blocked.py python benchmarks/probes/residue_linear.py   # writes $OUT/residue_linear.json
"""
import importlib.util
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_parallel import make_inputs, median_ms  # noqa: E402

from torch_semimarkov import semi_crf_streaming_forward  # noqa: E402
from torch_semimarkov.engines.triton import blocked, parallel  # noqa: E402
from torch_semimarkov.engines.triton import plan as plan_mod  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
spec = importlib.util.spec_from_file_location("old_blocked", os.environ["OLD_BLOCKED"])
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)
kernels = {"before": old._blk_chunks_kernel, "after": blocked._blk_chunks_kernel}


def gene_durations(db):
    """A gene grammar's duration mask (``GeneGrammar.duration_mask`` with intron tails, K = E) on
    C = 47 labels: 1 one-base label, 36 coding (one residue, from 3 on), 6 introns (30..K-1),
    2 fixed-length (K), 2 one-base tails."""
    K, C = db.shape
    k = torch.arange(1, K + 1, device=db.device)
    cols = [k == 1]
    cols += [(k % 3 == (c % 3)) & (k >= 3) for c in range(36)]
    cols += [(k >= 30) & (k < K)] * 6 + [k == K] * 2 + [k == 1] * 2
    ok = torch.stack(cols, 1)[:, :C]
    return torch.where(ok, db, torch.full_like(db, float("-inf")))


res = []


def run(tag, B, T, K, C, gene=False, backward=True, lins=(None,)):
    cum, tr, db, lengths = make_inputs(B, T, K, C)
    if gene:
        db = gene_durations(db)
    outs = {}
    for name, kern in kernels.items():
        for lin in lins:
            blocked._blk_chunks_kernel = kern
            plan_mod.BLOCKED_LINEAR = lin
            c = cum.clone().requires_grad_(backward)
            z = semi_crf_streaming_forward(c, tr, db, lengths, K)
            g = torch.autograd.grad(z.sum(), c)[0] if backward else None
            parallel.RECOMPUTED = []
            semi_crf_streaming_forward(cum, tr, db, lengths, K)
            torch.cuda.synchronize()
            rec = [(int(a), int(b)) for a, b in parallel.RECOMPUTED]
            parallel.RECOMPUTED = None
            outs[(name, lin)] = (z.detach(), g)
            row = {"tag": tag, "shape": [B, T, K, C], "kernel": name, "linear": str(lin),
                   "period": parallel.linear_period(db, K, lin), "recomputed_fwd": rec,
                   "forward_ms": median_ms(lambda: semi_crf_streaming_forward(cum, tr, db, lengths, K),
                                           min_runs=3, budget_s=1.5)}
            if backward:
                def fb():
                    c = cum.clone().requires_grad_(True)
                    semi_crf_streaming_forward(c, tr, db, lengths, K).sum().backward()
                row["fwd_bwd_ms"] = median_ms(fb, min_runs=3, budget_s=2.0)
            print(row, flush=True)
            res.append(row)
    ref = outs[("before", lins[0])]
    for key, (z, g) in outs.items():
        row = {"tag": tag, "shape": [B, T, K, C], "compare": f"{key[0]}:{key[1]} vs before:{lins[0]}",
               "logz_equal": bool(torch.equal(z, ref[0])),
               "logz_max_rel": float(((z - ref[0]).abs() / ref[0].abs()).max()),
               "grad_equal": None if g is None else bool(torch.equal(g, ref[1])),
               "grad_max_rel": None if g is None else float((g - ref[1]).abs().max() / ref[1].abs().max())}
        print(row, flush=True)
        res.append(row)
    json.dump(res, open(os.path.join(OUT, "residue_linear.json"), "w"), indent=1)


run("random", 32, 3000, 960, 47)
# a gene grammar's durations on a random model: before, log space (the default then) and period 1
# (recomputed on most blocks); after, the default (PERIOD 3), with period 1 and log space again
run("gene-durations", 4, 100000, 960, 47, gene=True, lins=(False, None, 1))
