"""GPU probe: A/B of two versions of the blocked kernel module (``engines/triton/blocked.py``) on the
max semiring: the committed one against a saved copy (``OLD.py``, e.g. the version before a change),
swapped in for ``_blk_chunks_kernel``. Viterbi through the public API on random models at genomics
shapes: interleaved medians and whether scores and labels are bitwise equal.

    python benchmarks/probes/argmax_ab.py OLD.py $OUT/argmax_ab.json ["B,T,K,C;B,T,K,C"]
"""
import importlib.util
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_common import random_model  # noqa: E402

from torch_semimarkov import semi_crf_streaming_viterbi  # noqa: E402
from torch_semimarkov.engines.triton import blocked  # noqa: E402

spec = importlib.util.spec_from_file_location("blocked_old", sys.argv[1])
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)
kernels = {"old": old._blk_chunks_kernel, "new": blocked._blk_chunks_kernel}
shapes = [(4, 100000, 960, 47), (16, 20000, 960, 47), (32, 3000, 960, 47), (1, 100000, 4000, 47)]
if len(sys.argv) > 3:
    shapes = [tuple(int(x) for x in s.split(",")) for s in sys.argv[3].split(";")]
res = {"device": torch.cuda.get_device_name(), "shapes": {}}
for (B, T, K, C) in shapes:
    cum, tr, db, lengths = random_model(B, T, K, C)
    args = (cum.detach(), tr.detach(), db.detach(), lengths, K)
    times, outs = {n: [] for n in kernels}, {}
    for n, k in kernels.items():
        blocked._blk_chunks_kernel = k
        semi_crf_streaming_viterbi(*args)
        outs[n] = semi_crf_streaming_viterbi(*args)
    for _ in range(7):
        for n, k in kernels.items():
            blocked._blk_chunks_kernel = k
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            semi_crf_streaming_viterbi(*args)
            torch.cuda.synchronize()
            times[n].append(time.perf_counter() - t0)
    a, b = outs["old"], outs["new"]
    same = bool(torch.equal(a.scores, b.scores) and torch.equal(a.labels, b.labels))
    med = {n: 1e3 * statistics.median(v) for n, v in times.items()}
    res["shapes"][f"{B},{T},{K},{C}"] = {"median_ms": med, "times_s": times, "bitwise_equal": same}
    print("viterbi", (B, T, K, C), med, "bitwise equal:", same, flush=True)
blocked._blk_chunks_kernel = kernels["new"]
json.dump(res, open(sys.argv[2], "w"), indent=1)
