"""Repeat the same forward/backward many times and report any run-to-run difference or NaN.

Every run uses identical inputs; each output (log Z and the gradients of cum_scores, transition,
duration_bias, proj_start, proj_end) is compared bitwise with the first run. On CUDA with Triton the
kernels are exercised for each ``--num-warps`` value; ``--no-triton`` (or a CPU machine) checks the
PyTorch streaming path.

Usage:
    python scripts/find_determinism.py --runs 10 --T 2000 --K 32 --C 24 --num-warps 2 4 8
Exit status 1 if any run differs from the first or produces a NaN.
"""

from __future__ import annotations

import argparse
import sys

import torch

from torch_semimarkov import semi_crf_streaming_forward
from torch_semimarkov.engines.available import triton_available

NAMES = ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")


def one_run(inputs, lengths, K, grad_out, use_triton, num_warps):
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in inputs.items()}
    log_z = semi_crf_streaming_forward(
        leaves["cum_scores"], leaves["transition"], leaves["duration_bias"], lengths, K,
        proj_start=leaves["proj_start"], proj_end=leaves["proj_end"], use_triton=use_triton, num_warps=num_warps,
    )
    (log_z * grad_out).sum().backward()
    out = {"partition": log_z.detach().clone()}
    for k in NAMES:
        out[f"grad_{k}"] = leaves[k].grad.detach().clone()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--B", type=int, default=4)
    parser.add_argument("--T", type=int, default=None, help="default 2000 on CUDA, 200 on CPU")
    parser.add_argument("--K", type=int, default=16)
    parser.add_argument("--C", type=int, default=8)
    parser.add_argument("--num-warps", type=int, nargs="+", default=[4])
    parser.add_argument("--no-triton", action="store_true", help="check the PyTorch streaming path")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else torch.device(args.device)
    use_triton = not args.no_triton and device.type == "cuda" and triton_available()
    backend = "Triton kernels" if use_triton else "PyTorch streaming path"
    if device.type != "cuda":
        print("CUDA is not available: checking the PyTorch streaming path on the CPU")
    T = args.T or (2000 if device.type == "cuda" else 200)
    g = torch.Generator().manual_seed(args.seed)
    B, K, C = args.B, args.K, args.C
    scores = torch.randn(B, T, C, generator=g)
    inputs = {
        "cum_scores": torch.nn.functional.pad((scores - scores.mean(1, keepdim=True)).cumsum(1), (0, 0, 1, 0)),
        "transition": torch.randn(C, C, generator=g) * 0.5,
        "duration_bias": torch.randn(K, C, generator=g) * 0.5,
        "proj_start": torch.randn(B, T, C, generator=g) * 0.5,
        "proj_end": torch.randn(B, T, C, generator=g) * 0.5,
    }
    inputs = {k: v.to(device) for k, v in inputs.items()}
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    lengths[0] = T
    lengths = lengths.to(device)
    grad_out = (torch.rand(B, generator=g) + 0.5).to(device)

    print(f"{backend} on {device}: B={B} T={T} K={K} C={C}, {args.runs} runs per setting")
    all_ok = True
    warps = args.num_warps if use_triton else [args.num_warps[0]]
    for nw in warps:
        first = one_run(inputs, lengths, K, grad_out, use_triton, nw)
        max_diff = {k: 0.0 for k in first}
        n_diff_runs = {k: 0 for k in first}
        nan_runs = 0
        for _ in range(args.runs - 1):
            out = one_run(inputs, lengths, K, grad_out, use_triton, nw)
            if any(bool(torch.isnan(v).any()) for v in out.values()):
                nan_runs += 1
            for k, v in out.items():
                d = float((v.double() - first[k].double()).abs().nan_to_num(float("inf")).max())
                if not torch.equal(v, first[k]):
                    n_diff_runs[k] += 1
                max_diff[k] = max(max_diff[k], d)
        nan_first = [k for k, v in first.items() if bool(torch.isnan(v).any())]
        label = f"num_warps={nw}" if use_triton else "pytorch"
        print(f"\n[{label}]")
        for k in first:
            status = "identical" if n_diff_runs[k] == 0 else f"DIFFERS in {n_diff_runs[k]}/{args.runs - 1} runs"
            print(f"  {k:<22} max |diff| vs run 1: {max_diff[k]:.3e}  {status}")
        if nan_runs or nan_first:
            print(f"  NaN in {nan_runs + bool(nan_first)} runs ({', '.join(nan_first) or 'later runs'})")
        ok = not nan_runs and not nan_first and all(n == 0 for n in n_diff_runs.values())
        all_ok &= ok
        print(f"  => {'deterministic' if ok else 'NOT deterministic'}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
