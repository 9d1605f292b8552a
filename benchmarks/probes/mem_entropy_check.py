"""The entropy's gradient of a ring too large for registers on the engine (the blocked engine's rows
and the entropy recurrences with their ring in memory, ``entropy._ent_chunks_kernel`` MEM) against
the float64 path (``backend="torch"``: on CUDA the dense float64 kernels, one program per sequence),
on one random model: the plan the engine took, H and every gradient's largest difference relative
to its largest value, and both times (one call each after a warm-up of the engine).

    python benchmarks/probes/mem_entropy_check.py OUT.json [B,T,K,C] [masked]
"""
import json
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
from bench_distribution import _problem  # noqa: E402

from torch_semimarkov import semi_crf_streaming_entropy  # noqa: E402
from torch_semimarkov.engines.triton import entropy as kernels  # noqa: E402


def main():
    out = sys.argv[1]
    B, T, K, C = (int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1,3000,960,47").split(","))
    masked = len(sys.argv) > 3 and sys.argv[3] == "masked"
    dev = torch.device("cuda")
    cum, tr, db, lengths, lm, bm = _problem(B, T, K, C, dev)
    masks = dict(label_mask=lm, boundary_mask=bm) if masked else {}
    kinds = []
    real = kernels.launch_entropy

    def launch(*a, plan, **k):
        kinds.append(plan.kind)
        return real(*a, plan=plan, **k)

    kernels.launch_entropy = launch

    def run(backend):
        leaves = [x.detach().clone().requires_grad_() for x in (cum, tr, db)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        H = semi_crf_streaming_entropy(*leaves, lengths, K, backend=backend, **masks)
        H.sum().backward()
        torch.cuda.synchronize()
        return H.detach().double(), [x.grad.double() for x in leaves], 1e3 * (time.perf_counter() - t0)

    run("auto")
    H1, g1, ms1 = run("auto")
    H2, g2, ms2 = run("torch")
    res = {"B": B, "T": T, "K": K, "C": C, "masked": masked, "engine_plans": kinds, "engine_ms": ms1,
           "float64_path_ms": ms2, "H_engine": H1.tolist(), "H_float64": H2.tolist(),
           "H_rel": float(((H1 - H2).abs() / H2.abs().clamp(min=1)).max())}
    for name, a, b in zip(("cum_scores", "transition", "duration_bias"), g1, g2):
        res[f"grad_{name}_rel"] = float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))
    print(json.dumps(res, indent=1))
    json.dump(res, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
