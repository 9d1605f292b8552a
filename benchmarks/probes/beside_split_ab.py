"""GPU probe: A/B of ``plan.BESIDE_SPLIT`` (a differentiated blocked forward whose chunks fill the GPU
takes chunks twice as long, so that beta runs beside it) against the usual chunks, through the
public API on random models at genomics shapes (interleaved medians). The chunk starts differ, so
the outputs agree to float32 rounding, not bitwise: the largest relative differences are recorded.

    python benchmarks/probes/beside_split_ab.py $OUT/beside_split_ab.json ["B,T,K,C;B,T,K,C"]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_common import plan_flag_cli  # noqa: E402

plan_flag_cli("BESIDE_SPLIT", {"usual": False, "split": True},
              [(4, 100000, 960, 47), (16, 20000, 960, 47), (8, 8000, 960, 47), (2, 50000, 960, 47), (32, 3000, 960, 47)])
