"""GPU probe: A/B of ``plan.beta_early`` (the beta recurrence on a second stream beside the forward,
the backward only the marginals) against the usual order, through the public API on random models
at genomics shapes (interleaved medians; log Z and gradients must be bitwise equal).

    python benchmarks/probes/beta_early_ab.py $OUT/beta_early_ab.json ["B,T,K,C;B,T,K,C"]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_common import plan_flag_cli  # noqa: E402

plan_flag_cli("BETA_EARLY_OVERRIDE", {"usual": False, "beside": None},
              [(32, 3000, 960, 47), (64, 3000, 960, 47), (8, 8000, 960, 47), (16, 20000, 960, 47)])
