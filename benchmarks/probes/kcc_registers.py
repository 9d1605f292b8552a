"""Probe (issue 25): registers, spills and the PTX of the (K, C, C) direct recurrence's chunk kernel
(forward and beta) on an H100 / H200 (sm_90), measured on a machine without a GPU: the interpreter
records the launches of one small (K, C, C) forward+backward at the genomics width (C = 47; K = 6,
T = 14 in chunks of 5, so the interpreter is quick), then each ``_dur_chunks_kernel`` variant is
compiled for sm_90 by ``compile_kernels.py``'s report (Triton, the bundled ``ptxas -v`` and its
PTX instruction counts: shuffles, barriers, loads, exponentials; static counts). ``SAVE_PTX=DIR``
keeps each variant's PTX.

    python benchmarks/probes/kcc_registers.py            # $OUT/kcc_registers.json (OUT default /tmp)
    C=24 WARPS=4,8 python benchmarks/probes/kcc_registers.py
    SRC=.gpu/ew/src PYTHONPATH=.gpu/ew/src python benchmarks/probes/kcc_registers.py   # another tree

GPU_NOTES 101 measured beta's direct step at 3.4x the forward's on an H100; this says whether the
two compile alike.
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

B, T, K = 1, 14, 6
C = int(os.environ.get("C", "47"))
WARPS = [int(w) for w in os.environ.get("WARPS", "4").split(",")]
KERNELS = os.environ.get("KERNELS", "_dur_chunks_kernel").split(",")


def main():
    g = torch.Generator().manual_seed(0)
    cum = torch.nn.functional.pad(torch.randn(B, T, C, generator=g).cumsum(1), (0, 0, 1, 0))
    v = validate_streaming_inputs(cum, 0.1 * torch.randn(K, C, C, generator=g), 0.1 * torch.randn(K, C, generator=g),
                                  torch.tensor([T]), K, "log", None, None)
    patches = []
    records = record_launches(lambda obj, name, value: (patches.append((obj, name, getattr(obj, name))),
                                                        setattr(obj, name, value)))
    plan_mod.CHUNK_OVERRIDE = 5
    for sr in ("log", "max"):
        p = launch.plan_for(v.cum_scores, v.transition, v.K, sr)
        z, state = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, sr, None, None,
                                         plan=p)
        if sr == "log":
            launch.launch_backward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, None, None, plan=p,
                                   state=state)
    plan_mod.CHUNK_OVERRIDE = None
    for obj, name, value in patches:
        setattr(obj, name, value)
    # each variant at each of WARPS warps
    records = [dict(r, num_warps=w) for r in records if r["name"] in KERNELS for w in WARPS]
    rows = []
    for r in compile_report(records, os.environ.get("SRC", os.path.join(ROOT, "src")), os.environ.get("SAVE_PTX")):
        c = r.pop("constexprs")
        r["variant"] = {k: c[k] for k in sorted(c) if c[k] not in (None, False)}
        rows.append(r)
        print(json.dumps(r), flush=True)
    dest = os.path.join(os.environ.get("OUT", "/tmp"), "kcc_registers.json")
    json.dump({"target": "sm_90 (ptxas -v, no device)", "shape": [B, T, K, C], "rows": rows}, open(dest, "w"), indent=1)
    print("saved", dest)


if __name__ == "__main__":
    main()
