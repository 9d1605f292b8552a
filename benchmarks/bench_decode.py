"""Decoding: the full public call against the kernel that finds the labels (GPU).

``semi_crf_streaming_viterbi`` = input checks + the Viterbi operator (kernels and traceback) + the
segment tensors (``segment_starts`` / ``ends`` / ``labels`` / ``offsets``, no Python loop). The
"kernel" column is ``launch_viterbi`` alone on validated inputs (what decoding cannot avoid); the
ratio is the overhead of the public call. The Python list ``.segments`` is timed separately (it is
built only on request). Medians of ``--repeat`` runs after a warm-up, both in the same run.

Usage: ``python benchmarks/bench_decode.py [--out bench_decode.json] [--quick]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

CONFIGS = [(1024, 1000, 100, 24), (64, 1000, 100, 24), (1, 10_000_000, 100, 24)]
QUICK = [(64, 1000, 100, 24), (1, 100_000, 100, 24)]


def _median_ms(fn, repeat):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run(configs, repeat):
    from torch_semimarkov import semi_crf_streaming_viterbi
    from torch_semimarkov.engines.triton import launch
    from torch_semimarkov.core.validation import validate_streaming_inputs

    rows = []
    for B, T, K, C in configs:
        g = torch.Generator(device="cuda").manual_seed(0)
        scores = torch.randn(B, T, C, device="cuda", generator=g)
        cum = torch.nn.functional.pad(torch.cumsum(scores.transpose(1, 2), -1).transpose(1, 2), (0, 0, 1, 0))
        del scores
        tr = torch.randn(C, C, device="cuda", generator=g)
        db = torch.randn(K, C, device="cuda", generator=g) - 1.0
        lengths = torch.full((B,), T, device="cuda", dtype=torch.long)
        v = validate_streaming_inputs(cum, tr, db, lengths, K, "max")
        plan = launch.plan_for(v.cum_scores, v.transition, K, "max")

        def kernel():
            return launch.launch_viterbi(v.cum_scores, v.transition, v.duration_bias, v.lengths, K, None, None,
                                         plan=plan)

        def full():
            return semi_crf_streaming_viterbi(cum, tr, db, lengths, K)

        kernel_ms = _median_ms(kernel, repeat)
        full_ms = _median_ms(full, repeat)
        result = full()
        n_seg = int(result.segment_starts.numel())
        lists_ms = None
        if n_seg <= 2_000_000:
            t0 = time.perf_counter()
            _ = semi_crf_streaming_viterbi(cum, tr, db, lengths, K).segments
            lists_ms = (time.perf_counter() - t0) * 1e3
        row = dict(B=B, T=T, K=K, C=C, kernel_ms=kernel_ms, full_ms=full_ms, ratio=full_ms / kernel_ms,
                   segments=n_seg, time_parallel=plan.time_parallel, python_lists_ms=lists_ms)
        rows.append(row)
        print(f"B={B} T={T} K={K} C={C}: kernel {kernel_ms:.2f} ms, full call {full_ms:.2f} ms "
              f"(x{full_ms / kernel_ms:.2f}), {n_seg} segments, .segments lists {lists_ms} ms", flush=True)
        del cum, v, result
        torch.cuda.empty_cache()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench_decode.json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_decode needs a CUDA GPU", file=sys.stderr)
        return 1
    rows = run(QUICK if args.quick else CONFIGS, args.repeat)
    with open(args.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
