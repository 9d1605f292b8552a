"""GPU probe: Viterbi with and without the max semiring's tile bounds (``plan.MAX_BOUNDS``,
``blocked._tile_exact``), interleaved in one process on random models at genomics shapes (the
benchmark's ``make_inputs`` and the A/B probes' ``random_model``) and, with ``--gene FILE``
(``probes/make_gene_inputs.py``), on a gene model: medians of 7, and whether scores, labels and
segment starts are bitwise equal. The CPU probe ``max_tile_bounds.py`` counts the tiles the bound
rules out (random models ~97%, the gene model 9-15%).

    python benchmarks/probes/max_bounds_ab.py $OUT/max_bounds_ab.json [--shapes "B,T,K,C;..."] [--gene FILE]
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from ab_common import random_model  # noqa: E402
from bench_parallel import make_inputs  # noqa: E402

from torch_semimarkov import semi_crf_streaming_viterbi  # noqa: E402
from torch_semimarkov.engines.triton import plan as plan_mod  # noqa: E402

SHAPES = "4,100000,960,47;16,20000,960,47;32,3000,960,47;1,100000,4000,47"


def run(name, args, kwargs, res):
    outs, times = {}, {False: [], True: []}
    for on in (False, True):  # warm-up (compiles both variants)
        plan_mod.MAX_BOUNDS = on
        semi_crf_streaming_viterbi(*args, **kwargs)
        outs[on] = semi_crf_streaming_viterbi(*args, **kwargs)
    for _ in range(7):
        for on in (False, True):
            plan_mod.MAX_BOUNDS = on
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            semi_crf_streaming_viterbi(*args, **kwargs)
            torch.cuda.synchronize()
            times[on].append(time.perf_counter() - t0)
    a, b = outs[False], outs[True]
    same = bool(torch.equal(a.scores, b.scores) and torch.equal(a.labels, b.labels))
    med = {("bounds" if k else "no_bounds"): 1e3 * statistics.median(v) for k, v in times.items()}
    res[name] = {"median_ms": med, "times_s": {str(k): v for k, v in times.items()}, "bitwise_equal": same}
    print("viterbi", name, {k: round(v, 2) for k, v in med.items()}, "bitwise equal:", same, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--gene", default=None)
    a = ap.parse_args()
    res = {"device": torch.cuda.get_device_name(), "runs": {}}
    for s in a.shapes.split(";"):
        B, T, K, C = (int(x) for x in s.split(","))
        for model in ("bench", "ab_common"):
            cum, tr, db, lengths = make_inputs(B, T, K, C) if model == "bench" else random_model(B, T, K, C)
            run(f"{model} {s}", (cum.detach(), tr.detach(), db.detach(), lengths, K), {}, res["runs"])
            json.dump(res, open(a.out, "w"), indent=1)
    if a.gene:
        g = torch.load(a.gene)
        inp = [g[k].cuda() for k in ("cum_scores", "transition", "duration_bias", "lengths", "proj_start", "proj_end")]
        run(f"gene {tuple(inp[0].shape)}", tuple(inp[:4]) + (g["K"],), dict(proj_start=inp[4], proj_end=inp[5]),
            res["runs"])
    plan_mod.MAX_BOUNDS = False
    json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
