"""Probe (issue 25, GPU_NOTES 106): registers, spills and PTX counts of the memory-ring entropy
recurrences (``entropy._ent_chunks_kernel`` with ``MEM``) for sm_90, on a machine without a GPU:
the interpreter records the launches of one small blocked entropy gradient at the genomics width
(C = 47; K = 6, T = 14 in chunks of 6), each variant's ring size and tile are set to the gene
grammar's (K_PAD = 1024, KB = ``plan.entropy_mem_rows(64)``; the code is the same at every size) and
compiled by ``compile_kernels.py``'s report (Triton, the bundled ``ptxas -v``).

    python benchmarks/probes/mem_entropy_registers.py        # $OUT/mem_entropy_registers.json (OUT default /tmp)
    K_PAD=1024 WARPS=4,8 python benchmarks/probes/mem_entropy_registers.py
    PTX_DIR=/tmp/ptx WARPS=8 python benchmarks/probes/mem_entropy_registers.py   (each variant's PTX too)
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
from torch_semimarkov import semi_crf_streaming_entropy  # noqa: E402
from torch_semimarkov.engines import select  # noqa: E402
from torch_semimarkov.engines.triton import plan as plan_mod  # noqa: E402

B, T, K, C = 1, 14, 6, 47
K_PAD = int(os.environ.get("K_PAD", "1024"))
WARPS = [int(w) for w in os.environ.get("WARPS", "4").split(",")]


def main():
    g = torch.Generator().manual_seed(0)
    cum = torch.nn.functional.pad(torch.randn(B, T, C, generator=g).cumsum(1), (0, 0, 1, 0)).requires_grad_()
    tr, db = 0.1 * torch.randn(C, C, generator=g), 0.1 * torch.randn(K, C, generator=g)
    patches = []
    records = record_launches(lambda obj, name, value: (patches.append((obj, name, getattr(obj, name))),
                                                        setattr(obj, name, value)))
    select.ENGINE_ON_CPU, plan_mod.FORCE_BLOCKED, plan_mod.CHUNK_OVERRIDE = True, True, 6
    semi_crf_streaming_entropy(cum, tr, db, torch.tensor([T]), K, backend="triton").sum().backward()
    for obj, name, value in patches:
        setattr(obj, name, value)
    kb = plan_mod.entropy_mem_rows(64)
    records = [dict(r, num_warps=w, constexprs=dict(r["constexprs"], K_PAD=K_PAD, KB=kb))
               for r in records if r["name"] == "_ent_chunks_kernel" and r["constexprs"].get("MEM") for w in WARPS]
    rows = []
    for r in compile_report(records, os.path.join(ROOT, "src"), save_ptx=os.environ.get("PTX_DIR")):
        c = r.pop("constexprs")
        r["variant"] = {k: c[k] for k in sorted(c) if c[k] not in (None, False)}
        rows.append(r)
        print(json.dumps(r), flush=True)
    dest = os.path.join(os.environ.get("OUT", "/tmp"), "mem_entropy_registers.json")
    json.dump({"target": "sm_90 (ptxas -v, no device)", "shape": [B, T, K, C], "K_PAD": K_PAD, "KB": kb,
               "rows": rows}, open(dest, "w"), indent=1)
    print("saved", dest)


if __name__ == "__main__":
    main()
