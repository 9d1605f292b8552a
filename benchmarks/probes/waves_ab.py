"""GPU probe: A/B of ``plan.WAVES_RULE`` (a batch whose blocked chunks would take several waves of
programs runs one chunk per sequence where ``plan.one_chunk_is_faster``) against the chunks,
through the public API on random models at genomics shapes (interleaved medians). The chunk starts
differ, so the outputs agree to float32 rounding, not bitwise: the largest relative differences
are recorded.

    python benchmarks/probes/waves_ab.py $OUT/waves_ab.json ["B,T,K,C;B,T,K,C"]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_common import plan_flag_cli  # noqa: E402

plan_flag_cli("WAVES_RULE", {"usual": False, "waves": True},
              [(128, 5318, 960, 47), (100, 8000, 960, 47), (64, 10000, 960, 47), (16, 20000, 960, 47)])
