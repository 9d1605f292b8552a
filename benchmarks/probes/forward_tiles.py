"""Probe (issue 25, GPU_NOTES 94): the blocked engine's log-semiring tiles after phase B's sums moved to
the previous position's frame (GPU_NOTES 93: the block length BT no longer changes a random model's
Viterbi bits). Forward and forward+backward through the public API at the genomics shapes for each
linear-sum tile (``plan.LINEAR_TILE``, random models) and, with ``GENE``, the gene model of
``probes/make_gene_inputs.py`` for each term-by-term tile (``plan.BLOCK_OVERRIDE``); medians, one run.

    LINEAR_TILES=32x64x16,64x64x16 TERM_TILES=16x32x32,32x32x32 GENE=/tmp/gene_inputs.pt python forward_tiles.py
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ab_common import gene_model  # noqa: E402
from bench_parallel import make_inputs, median_ms  # noqa: E402

from torch_semimarkov import semi_crf_streaming_forward  # noqa: E402
from torch_semimarkov.engines.triton import plan as plan_mod  # noqa: E402


def tiles(name, default):
    return [tuple(int(x) for x in t.split("x")) for t in os.environ.get(name, default).split(",")]


def timed(args, kw):
    def fwd():
        return semi_crf_streaming_forward(*[a.detach() if torch.is_tensor(a) else a for a in args], **kw)

    def fb():
        cum = args[0].detach().requires_grad_()
        z = semi_crf_streaming_forward(cum, *args[1:], **kw)
        return torch.autograd.grad(z.sum(), cum)[0]

    z, g = fwd(), fb()
    return (median_ms(fwd, min_runs=3, budget_s=1.0), median_ms(fb, min_runs=3, budget_s=2.0), z, g)


out = os.path.join(os.environ.get("OUT", "/tmp"), "forward_tiles.json")
res = []
cases = []
for B, T, K, C in [(4, 100000, 960, 47), (16, 20000, 960, 47), (32, 3000, 960, 47)]:
    cum, tr, db, lengths = make_inputs(B, T, K, C)
    cases.append(([B, T, K, C], "LINEAR_TILE", tiles("LINEAR_TILES", "32x64x16,64x64x16,64x32x16"), (cum, tr, db, lengths, K), {}))
if os.environ.get("GENE"):
    model, kw, K = gene_model(os.environ["GENE"])
    cases.append(("gene", "BLOCK_OVERRIDE", tiles("TERM_TILES", "16x32x32,32x32x32"),
                  (*(x.detach() for x in model), K), kw))
for shape, setting, ts, args, kw in cases:
    default = getattr(plan_mod, setting)
    ref = None
    for t in ts:
        setattr(plan_mod, setting, t)
        try:
            f_ms, fb_ms, z, g = timed(args, kw)
            diff = None
            if ref is None:
                ref = (z, g)
            else:
                diff = {"log_z": float(((z - ref[0]).abs() / ref[0].abs()).max()),
                        "grad_cum": float((g - ref[1]).abs().max() / ref[1].abs().max())}
        except Exception as e:  # a tile that does not compile
            f_ms, fb_ms, diff = repr(e)[:160], None, None
        row = {"shape": shape, setting: t, "fwd_ms": f_ms, "fwdbwd_ms": fb_ms, "diff_to_first": diff}
        print(row, flush=True)
        res.append(row)
        json.dump(res, open(out, "w"), indent=1)
    setattr(plan_mod, setting, default)
