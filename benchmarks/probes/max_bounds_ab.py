"""GPU probe: Viterbi with and without the max semiring's tile bounds (``plan.MAX_BOUNDS``,
``blocked._tile_exact``), interleaved in one process on random models at genomics shapes (the
benchmark's ``make_inputs`` and the A/B probes' ``random_model``) and, with ``--gene FILE``
(``probes/make_gene_inputs.py``), on a gene model: medians of 7, and whether scores, labels and
segment starts are bitwise equal. The CPU probe ``max_tile_bounds.py`` counts the tiles the bound
rules out (random models ~97%, the gene model 9-15%).

    python benchmarks/probes/max_bounds_ab.py $OUT/max_bounds_ab.json [--shapes "B,T,K,C;..."] [--gene FILE]
        [--variants "0;1;1:12"] [--gene-variants "0;1:12"]

``--variants``: the bounds off (0) or on (1; GPU_NOTES 88 also timed two other modes, since removed) and,
after a colon, the phases that test them (plan.MAX_BOUND_PHASES; default all three). Each variant's phases are
also timed alone once (``phase_ms``, synchronised launches).
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
from torch_semimarkov.engines.triton import parallel  # noqa: E402
from torch_semimarkov.engines.triton import plan as plan_mod  # noqa: E402

SHAPES = "4,100000,960,47;16,20000,960,47;32,3000,960,47;1,100000,4000,47"


def parse_variants(text):
    """"0;1;1:12" -> [(0, (1, 2, 3)), (1, (1, 2, 3)), (1, (1, 2))]: mode[:phases]."""
    out = []
    for v in text.split(";"):
        mode, _, ph = v.partition(":")
        out.append((int(mode), tuple(int(c) for c in ph) if ph else (1, 2, 3)))
    return out


def name_of(variant):
    mode, phases = variant
    return "off" if mode == 0 else f"mode{mode}" + ("" if phases == (1, 2, 3) else "_p" + "".join(map(str, phases)))


def set_variant(variant):
    plan_mod.MAX_BOUNDS, plan_mod.MAX_BOUND_PHASES = bool(variant[0]), variant[1]


class _TimedKernel:
    """A kernel whose every launch is synchronised and timed into ``got`` ("kernel:phase": ms)."""

    def __init__(self, kernel, got):
        self.kernel, self.got = kernel, got

    def __getitem__(self, grid):
        def launch(**kw):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            self.kernel[grid](**kw)
            torch.cuda.synchronize()
            key = f"{getattr(self.kernel, '__name__', 'kernel')}:{kw['PHASE']}"
            self.got[key] = self.got.get(key, 0.0) + 1e3 * (time.perf_counter() - t0)
        return launch


def phase_times(call):
    """One call with each chunk phase timed alone (synchronised launches through the engine's own
    ``parallel._phases``, which every chunked launch goes through), ms: {"kernel:phase": ms}."""
    real, got = parallel._phases, {}
    parallel._phases = lambda kernel, *a, **kw: real(_TimedKernel(kernel, got), *a, **kw)
    try:
        call()
    finally:
        parallel._phases = real
    return got


def run(name, args, kwargs, res, variants):
    outs, times, phases = {}, {v: [] for v in variants}, {}
    for v in variants:  # warm-up (compiles every variant), then each phase timed once
        set_variant(v)
        semi_crf_streaming_viterbi(*args, **kwargs)
        outs[v] = semi_crf_streaming_viterbi(*args, **kwargs)
        phases[name_of(v)] = phase_times(lambda: semi_crf_streaming_viterbi(*args, **kwargs))
    for _ in range(7):
        for v in variants:
            set_variant(v)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            semi_crf_streaming_viterbi(*args, **kwargs)
            torch.cuda.synchronize()
            times[v].append(time.perf_counter() - t0)
    a = outs[variants[0]]
    same = {name_of(v): bool(torch.equal(a.scores, b.scores) and torch.equal(a.labels, b.labels))
            for v, b in outs.items()}
    med = {name_of(v): 1e3 * statistics.median(t) for v, t in times.items()}
    res[name] = {"median_ms": med, "times_s": {name_of(v): t for v, t in times.items()},
                 "phase_ms": phases, "bitwise_equal": same}
    print("viterbi", name, {k: round(x, 2) for k, x in med.items()}, "equal:", all(same.values()), flush=True)
    print("   phases ms", {k: {p: round(x, 1) for p, x in d.items()} for k, d in phases.items()}, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--gene", default=None)
    ap.add_argument("--variants", default="0;1", help="mode[:phases];... (plan.MAX_BOUNDS, MAX_BOUND_PHASES)")
    ap.add_argument("--gene-variants", default=None, help="the gene model's (default: --variants)")
    a = ap.parse_args()
    res = {"device": torch.cuda.get_device_name(), "runs": {}}
    if a.gene:
        g = torch.load(a.gene)
        inp = [g[k].cuda() for k in ("cum_scores", "transition", "duration_bias", "lengths", "proj_start", "proj_end")]
        run(f"gene {tuple(inp[0].shape)}", tuple(inp[:4]) + (g["K"],), dict(proj_start=inp[4], proj_end=inp[5]),
            res["runs"], parse_variants(a.gene_variants or a.variants))
    for s in a.shapes.split(";"):
        B, T, K, C = (int(x) for x in s.split(","))
        for model in ("bench", "ab_common"):
            cum, tr, db, lengths = make_inputs(B, T, K, C) if model == "bench" else random_model(B, T, K, C)
            run(f"{model} {s}", (cum.detach(), tr.detach(), db.detach(), lengths, K), {}, res["runs"],
                parse_variants(a.variants))
            json.dump(res, open(a.out, "w"), indent=1)
    set_variant((1, (1, 2)))  # the defaults
    json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
