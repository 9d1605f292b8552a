"""GPU probe: the host's Python time in one forward+backward / Viterbi at a genomics shape
(cProfile, after warm-up), to find what keeps the GPU waiting before and between the engine's
launches (``host_gaps.py`` measures the gaps themselves).

    python benchmarks/probes/host_profile.py OUT.txt "4,100000,960,47"
"""
import cProfile
import io
import os
import pstats
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_common import public_calls  # noqa: E402


out, shapes = sys.argv[1], sys.argv[2]
text = io.StringIO()
for s in shapes.split(";"):
    fwdbwd, viterbi, _ = public_calls(s)

    for name, fn in (("fwdbwd", fwdbwd), ("viterbi", viterbi)):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        pr = cProfile.Profile()
        pr.enable()
        fn()
        torch.cuda.synchronize()
        pr.disable()
        for key, n in (("cumulative", 45), ("tottime", 25)):
            print(f"==== {s} {name} by {key}", file=text)
            pstats.Stats(pr, stream=text).sort_stats(key).print_stats(n)
with open(out, "w") as f:
    f.write(text.getvalue())
print(text.getvalue()[:200])
