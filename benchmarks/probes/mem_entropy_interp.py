"""The entropy with its gradient on the engine's kernels in Triton's CPU interpreter, against the
float64 path, at a size the tests do not take (B, T, K, C = 1, 240, 40, 6; chunks of 60, so fix-ups
run; duration tiles of 8): the blocked engine with the memory-ring entropy recurrences (``mem``,
forced) or the register ring (``reg``), to compare their errors on the same inputs (GPU_NOTES 106).

    TRITON_INTERPRET=1 python benchmarks/probes/mem_entropy_interp.py mem
    TRITON_INTERPRET=1 python benchmarks/probes/mem_entropy_interp.py reg
"""
import math
import sys

import torch

from torch_semimarkov import semi_crf_streaming_entropy
from torch_semimarkov.api import entropy as entropy_mod
from torch_semimarkov.engines import select
from torch_semimarkov.engines.triton import plan as plan_mod

F64 = torch.float64


def main():
    engine = sys.argv[1] if len(sys.argv) > 1 else "mem"
    plan_mod.FORCE_BLOCKED = engine == "mem"
    plan_mod.BLOCK_OVERRIDE = plan_mod.MARG_OVERRIDE = (8, 8, 8)
    plan_mod.K_BLOCK_OVERRIDE, plan_mod.CHUNK_OVERRIDE = 8, 60
    kinds = []
    real = entropy_mod._entropy_engine

    def recording(*a, **k):
        r = real(*a, **k)
        kinds.append(None if r is None else r[0].kind)
        return r

    entropy_mod._entropy_engine = recording
    B, T, K, C = 1, 240, 40, 6
    g = torch.Generator().manual_seed(27)
    cum = torch.nn.functional.pad((torch.randn(B, T, C, generator=g, dtype=F64) - 3.0).cumsum(1), (0, 0, 1, 0))
    tr = torch.randn(C, C, generator=g, dtype=F64)
    tr[1, 2] = -math.inf
    ref = dict(cum_scores=cum, transition=tr, duration_bias=torch.randn(K, C, generator=g, dtype=F64),
               lengths=torch.tensor([T]), K=K, proj_start=torch.randn(B, T, C, generator=g, dtype=F64),
               proj_end=torch.randn(B, T, C, generator=g, dtype=F64))
    names = ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")
    select.ENGINE_ON_CPU = True
    run = {k: (v.to(torch.float32).requires_grad_() if k in names else v) for k, v in ref.items()}
    H = semi_crf_streaming_entropy(**run)
    H.sum().backward()
    select.ENGINE_ON_CPU = False
    leaves = {k: ref[k].clone().requires_grad_() for k in names}
    H2 = semi_crf_streaming_entropy(**dict(ref, **leaves))
    H2.sum().backward()
    print("engine plan", kinds[0], "H", H.item(), "float64", H2.item())
    for k in names:
        print(f"{k}: largest difference {(run[k].grad.double() - leaves[k].grad).abs().max().item():.2e}, "
              f"largest entry {leaves[k].grad.abs().max().item():.3f}")


if __name__ == "__main__":
    main()
