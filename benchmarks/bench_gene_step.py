"""GPU benchmark: the gene finder's own training step (``examples/gene_finding/train_crf.py``) under
several engine settings in one run (``--modes``: the marginal kernel, and the block sums in log
space or linear space).

The step is one L-BFGS evaluation of the feature CRF: the NLL of the gold labellings of every
training locus up to ``--max-length`` bases, forward and backward, in the batches ``train_crf.py``
makes (sorted by length, at most ``--max-batch`` loci each), over the GHMM with intron tails that
cross-validation chose (order 3, smoothing 2, K = 960, E = 960: 59 labels), fitted on
``genes.gb.train`` (CPU, seconds). Medians of ``--runs`` steps (CUDA-synchronised wall time) after
one warm-up, the modes interleaved; losses, gradients (against the first mode) and, for linear block
sums, how many tiles were recomputed term by term compared.

    python benchmarks/bench_gene_step.py --data examples/gene_finding/data --out $OUT/gene_step.json
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples", "gene_finding"))
from train_crf import batches  # noqa: E402

from torch_semimarkov.engines.triton import parallel  # noqa: E402
from torch_semimarkov.engines.triton import plan as plan_mod  # noqa: E402
from torch_semimarkov.genomics.feature_crf import FeatureCRF, pack  # noqa: E402
from torch_semimarkov.genomics.genbank import load_genbank, tutorial_data  # noqa: E402
from torch_semimarkov.genomics.ghmm import GHMM, GHMMConfig  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=os.path.join(ROOT, "examples", "gene_finding", "data"))
    p.add_argument("--max-length", type=int, default=20000)
    p.add_argument("--max-batch", type=int, default=128)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--modes", default="position,tiled",
                   help="modes compared: BLOCKED_MARGINALS[:BLOCKED_LINEAR], e.g. tiled:False,tiled:None "
                        "(the marginal kernel, then the block sums: None default, False log space, 1 or 3 "
                        "linear with that period); @BTxRBxCB[:warps] forces the recurrences' tiles (and warps), e.g. tiled:3@16x32x16 or tiled:False@16x32x32:4; "
                        "~0 turns off the longer chunks of a differentiated forward (plan.BESIDE_SPLIT), e.g. tiled~0; "
                        "^0 the one-chunk rule for batches of several waves (plan.WAVES_RULE), e.g. tiled^0; "
                        "%0 the in-order repair's helpers (plan.REPAIR_HELPERS), e.g. tiled%0")
    p.add_argument("--profile", action="store_true", help="per-kernel CUDA time and host time of one step (last mode)")
    p.add_argument("--out", default="/tmp/gene_step.json")
    args = p.parse_args()
    t0 = time.perf_counter()
    recs = load_genbank(tutorial_data(args.data)["train"])
    ghmm = GHMM.fit(recs, GHMMConfig(order=3, smoothing=2.0, max_duration=960, intron_tail=960))
    use = [r for r in recs if len(r.sequence) <= args.max_length]
    feats = [ghmm.features(r) for r in use]
    lengths = [f.T for f in feats]
    dev = torch.device("cuda")
    packed = [pack([feats[i] for i in g], [use[i].genes for i in g], device=dev, dtype=torch.float32,
                   grammar=ghmm.grammar) for g in batches(list(range(len(use))), lengths, args.max_batch)]
    crf = FeatureCRF(ghmm).to(dev)
    params = [q for q in crf.parameters() if q.requires_grad]
    loci = float(len(use))
    setup_s = time.perf_counter() - t0
    print(f"{len(use)} loci, {sum(lengths)} bases, {len(packed)} batches, setup {setup_s:.1f} s", flush=True)

    def step():
        for q in params:
            q.grad = None
        total = 0.0
        for b in packed:
            nll = crf.nll(b, torch.float32)
            loss = torch.where(torch.isfinite(nll), nll, torch.zeros_like(nll)).sum().double() / loci
            loss.backward()
            total += float(loss.detach())
        torch.cuda.synchronize()
        return total

    modes = args.modes.split(",")
    times = {m: [] for m in modes}
    result = {}
    recomputed = {}
    settings = {"None": None, "False": False, "True": True, "1": 1, "3": 3}
    default_warps = plan_mod.BLOCKED_WARPS

    def set_mode(m):
        m, _, repair = m.partition("%")
        plan_mod.REPAIR_HELPERS = repair != "0"
        m, _, waves = m.partition("^")
        plan_mod.WAVES_RULE = waves != "0"
        m, _, split = m.partition("~")
        plan_mod.BESIDE_SPLIT = split != "0"
        m, _, tile = m.partition("@")
        tile, _, warps = tile.partition(":")
        marg, _, lin = m.partition(":")
        plan_mod.BLOCKED_MARGINALS = marg
        plan_mod.BLOCKED_LINEAR = settings[lin or "None"]
        plan_mod.BLOCK_OVERRIDE = tuple(int(x) for x in tile.split("x")) if tile else None
        plan_mod.BLOCKED_WARPS = int(warps) if warps else default_warps

    for m in modes:  # warm-up (compiles) and the outputs compared below
        set_mode(m)
        parallel.RECOMPUTED = []
        loss = step()
        counts = [(int(a), int(b)) for a, b in parallel.RECOMPUTED]
        parallel.RECOMPUTED = None
        recomputed[m] = {"tiles_recomputed": sum(a for a, _ in counts), "tiles_per_pass": sum(b for _, b in counts),
                         "launches": len(counts)}
        print(m, "loss", loss, recomputed[m], flush=True)
        result[m] = (loss, [q.grad.detach().double().clone() for q in params])
    for _ in range(args.runs):
        for m in modes:
            set_mode(m)
            t = time.perf_counter()
            step()
            times[m].append(time.perf_counter() - t)
    prof_rows = None
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        t = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
        wall = time.perf_counter() - t
        ev = prof.key_averages()
        cuda = sorted(((e.key[:60], e.self_device_time_total / 1e3, e.count) for e in ev), key=lambda r: -r[1])[:15]
        host = sorted(((e.key[:60], e.self_cpu_time_total / 1e3, e.count) for e in ev), key=lambda r: -r[1])[:15]
        prof_rows = {"wall_ms": wall * 1e3, "cuda_total_ms": sum(e.self_device_time_total for e in ev) / 1e3,
                     "cuda_self_ms": cuda, "host_self_ms": host}
        print(json.dumps(prof_rows, indent=1), flush=True)
    # each mode's gradients against the first mode's, relative to the largest
    rel = {m: max(float((x - y).abs().max() / y.abs().max().clamp(min=1e-30))
                  for x, y in zip(result[m][1], result[modes[0]][1])) for m in modes[1:]}
    rep = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "loci": len(use),
           "bases": int(sum(lengths)), "batches": len(packed), "labels": ghmm.grammar.num_labels if hasattr(ghmm.grammar, "num_labels") else None,
           "K": 960, "setup_s": setup_s, "step_s": {m: times[m] for m in modes},
           "median_s": {m: statistics.median(times[m]) if times[m] else None for m in modes},
           "loss": {m: result[m][0] for m in modes}, "grad_rel_diff": rel, "recomputed": recomputed,
           "profile": prof_rows}
    print(json.dumps(rep, indent=1), flush=True)
    json.dump(rep, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
