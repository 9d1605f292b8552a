"""Probe (issue 25): registers a thread and spills of the blocked engine's kernels on an H100 / H200
(sm_90), measured on a machine without a GPU: the interpreter records the launches of one small
call at the genomics width (K = 960, C = 47; T = 12, so the interpreter is quick), then the
kernels are compiled for sm_90 with Triton and the bundled ``ptxas -v`` (no device).

    python benchmarks/probes/blocked_registers.py            # $OUT/blocked_registers.json
    TILES=32x64x16,16x32x32 LINEAR=None,False,3 python benchmarks/probes/blocked_registers.py
    HELPERS=0,2 python benchmarks/probes/blocked_registers.py   # also with 2 helper programs a run
    HELPERS=6 SPLIT=3,2,64 python benchmarks/probes/blocked_registers.py   # 6 as 3 label groups x 2 row parts
    KERNELS=_blk_seg_kernel TILES=16x32x16 LINEAR=None python benchmarks/probes/blocked_registers.py   # marginal tiles

Each tile is forced for the recurrences (``plan.BLOCK_OVERRIDE``) in the log semiring's block sums
(linear with one shift, log space, residue classes: ``LINEAR``) and the max semiring's; spilled
bytes are what made large tiles slow on the H200 (GPU_NOTES 43, 50).
"""
import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "engines", "triton"))

import torch  # noqa: E402

from compile_kernels import compile_report, record_launches  # noqa: E402
from torch_semimarkov.core.validation import validate_streaming_inputs  # noqa: E402
from torch_semimarkov.engines.triton import launch  # noqa: E402
from torch_semimarkov.engines.triton import plan as plan_mod  # noqa: E402

TILES = [tuple(int(x) for x in t.split("x")) for t in os.environ.get("TILES", "32x64x16,16x32x32,16x32x16").split(",")]
# the log semiring's block sums: None (linear, one shift: dense durations), False (log space), 3 (residue classes)
LINEAR = [{"None": None, "False": False, "3": 3}[x] for x in os.environ.get("LINEAR", "None,False,3").split(",")]
# helper programs a run (``plan.HELPERS_OVERRIDE``; > 0 compiles the kernel with its helpers' code)
HELPERS = [int(x) for x in os.environ.get("HELPERS", "0").split(",")]
# their split into label groups and row parts, e.g. SPLIT=3,2,64 (``plan.HELPER_SPLIT_OVERRIDE``)
SPLIT = tuple(int(x) for x in os.environ["SPLIT"].split(",")) if os.environ.get("SPLIT") else None
#: which kernels to compile (``_blk_seg_kernel``: also one forward+backward for the marginal tiles)
KERNELS = os.environ.get("KERNELS", "_blk_chunks_kernel").split(",")
B, T, K, C = 1, 12, 960, 47


def main():
    g = torch.Generator().manual_seed(0)
    cum = torch.nn.functional.pad(torch.randn(B, T, C, generator=g).cumsum(1), (0, 0, 1, 0))
    v = validate_streaming_inputs(cum, 0.1 * torch.randn(C, C, generator=g), 0.1 * torch.randn(K, C, generator=g),
                                  torch.tensor([T]), K, "log", None, None)
    patches = []
    records = record_launches(lambda obj, name, value: (patches.append((obj, name, getattr(obj, name))),
                                                        setattr(obj, name, value)))
    plan_mod.FORCE_BLOCKED = True
    plan_mod.HELP_INLINE = False
    for tile, helpers in [(t, h) for t in TILES for h in HELPERS]:
        plan_mod.HELPERS_OVERRIDE = helpers
        plan_mod.HELPER_SPLIT_OVERRIDE = SPLIT if helpers else None
        plan_mod.BLOCK_OVERRIDE = tile
        for sr, linear in [("log", x) for x in LINEAR] + [("max", None)]:
            plan_mod.BLOCKED_LINEAR = linear
            p = launch.plan_for(v.cum_scores, v.transition, v.K, sr)
            launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, sr, None, None,
                                  plan=p, save_for_backward=False)
    plan_mod.BLOCKED_LINEAR = None
    plan_mod.HELPERS_OVERRIDE = plan_mod.HELP_INLINE = None
    if "_blk_seg_kernel" in KERNELS:  # the marginal tiles: one forward+backward at the default plan
        p = launch.plan_for(v.cum_scores, v.transition, v.K, "log", backward=True)
        log_z, state = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, "log", None,
                                             None, plan=p, save_for_backward=True, beta=True)
        launch.launch_backward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, None, None, plan=p,
                               state=state)
    for obj, name, value in patches:
        setattr(obj, name, value)
    records = [r for r in records if r["name"] in KERNELS]
    rows = []
    for r in compile_report(records, os.path.join(ROOT, "src")):
        c = r["constexprs"]
        rows.append({"tile": [c.get("BT"), c.get("RB"), c.get("CB")], "linear": c.get("LINEAR"),
                     "is_max": c.get("IS_MAX"), "phase": c.get("PHASE"), "reverse": c.get("REVERSE"),
                     "helpers": c.get("HELPERS"),
                     "kernel": r["kernel"], "anchor": c.get("ANCHOR"), "shared_bytes": r.get("shared_bytes"),
                     "num_warps": r["num_warps"], "registers": r["registers"],
                     "spill_store_bytes": r["spill_store_bytes"], "spill_load_bytes": r["spill_load_bytes"]})
        print(rows[-1], flush=True)
    dest = os.path.join(os.environ.get("OUT", "/tmp"), "blocked_registers.json")
    json.dump({"target": "sm_90 (ptxas -v, no device)", "shape": [B, T, K, C], "rows": rows}, open(dest, "w"), indent=1)
    print("saved", dest)


if __name__ == "__main__":
    main()
