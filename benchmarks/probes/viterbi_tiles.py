"""Probe (issue 25, GPU_NOTES 50): the blocked engine's Viterbi (max-semiring block sums, term by term)
against its tile (BT, RB, CB) and warps, at the genomics shapes, on one H200 run. The default tile
(16, 32, 16), 8 warps, is the log-space forward's choice (GPU_NOTES 32); the max semiring keeps only
a running maximum and its duration per (position, label), so it may afford larger tiles.

    python benchmarks/probes/viterbi_tiles.py     # $OUT/viterbi_tiles.json
    TILES=16x32x16,16x32x32 python benchmarks/probes/viterbi_tiles.py   # only these tiles
    GENE=/tmp/gene_inputs.pt ...   # also the gene model of probes/make_gene_inputs.py (its 8 loci)
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ab_common import gene_model  # noqa: E402
from bench_parallel import make_inputs, median_ms  # noqa: E402

from torch_semimarkov import semi_crf_streaming_viterbi  # noqa: E402
from torch_semimarkov.engines.triton import plan as plan_mod  # noqa: E402

out = os.path.join(os.environ.get("OUT", "/tmp"), "viterbi_tiles.json")
res = []
TILES = [((16, 32, 16), 8), ((32, 32, 16), 8), ((32, 64, 16), 8), ((16, 64, 16), 8), ((64, 32, 16), 8),
         ((32, 32, 32), 8), ((16, 32, 16), 4), ((32, 64, 16), 16)]
if os.environ.get("TILES"):  # e.g. TILES=16x32x16,16x32x32:4 (BTxRBxCB[:warps], 8 warps unless said)
    TILES = [(tuple(int(x) for x in t.split(":")[0].split("x")), int(t.split(":")[1]) if ":" in t else 8)
             for t in os.environ["TILES"].split(",")]
CASES = []
for B, T, K, C in [(4, 100000, 960, 47), (16, 20000, 960, 47), (32, 3000, 960, 47)]:
    cum, tr, db, lengths = make_inputs(B, T, K, C)
    CASES.append(([B, T, K, C], (cum, tr, db, lengths, K), {}))
if os.environ.get("GENE"):
    model, kw, K = gene_model(os.environ["GENE"])
    CASES.append(("gene", (*(x.detach() for x in model), K), kw))
for shape, args, kw in CASES:
    ref = None
    for tile, warps in TILES:
        plan_mod.BLOCK_OVERRIDE = tile
        plan_mod.BLOCKED_WARPS = warps
        try:
            r = semi_crf_streaming_viterbi(*args, **kw)
            same = score_diff = labels_equal = None
            if ref is None:
                ref = r
            else:
                same = bool(torch.equal(r.scores, ref.scores)) and bool(torch.equal(r.labels, ref.labels))
                score_diff = float((r.scores.double() - ref.scores.double()).abs().max())
                labels_equal = float((r.labels == ref.labels).double().mean())
            ms = median_ms(lambda: semi_crf_streaming_viterbi(*args, **kw), min_runs=3, budget_s=1.0)
        except Exception as e:  # a tile that does not compile
            ms, same, score_diff, labels_equal = repr(e)[:160], None, None, None
        row = {"shape": shape, "tile": tile, "warps": warps, "viterbi_ms": ms, "equal_to_default": same,
               "score_diff": score_diff, "labels_equal": labels_equal}
        print(row, flush=True)
        res.append(row)
        json.dump(res, open(out, "w"), indent=1)
