"""GPU probe (issue 25): the blocked engine's helper programs (``blocked._blk_help``) against runs
that sum every block themselves, through the public API on random models: interleaved medians of
the forward, forward+backward and Viterbi, the plans (chunks, helpers), and the outputs' largest
differences (the split block sums round differently, so not bitwise).

    python benchmarks/probes/helpers_ab.py $OUT/helpers_ab.json ["B,T,K,C;..."]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_common import plan_flag_cli  # noqa: E402

plan_flag_cli("HELPERS_OVERRIDE", {"no helpers": 0, "helpers (plan)": None},
              [(32, 3000, 960, 47), (1, 100000, 4000, 47), (8, 3000, 960, 47)], viterbi=True)
