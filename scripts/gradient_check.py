"""Agreement of the streaming kernels with a reference: partition and every gradient.

On a CUDA machine with Triton, the Triton path (``use_triton=True``) is compared with the PyTorch
streaming reference (``use_triton=False``) on the same inputs. Without CUDA there is no kernel to
check: the PyTorch streaming path is compared with the naive O(T·K·C²) autograd oracle
(:func:`torch_semimarkov.oracle.naive_semi_crf`) instead, at a smaller default T.

Thresholds (per metric, from the seed's table):

    forward partition    max relative error   < 1e-4
    grad_transition      max relative error   < 1e-2
    grad_duration_bias   max relative error   < 1e-2
    grad_cum_scores      mean absolute error  < 1e-3   (relative error explodes where the gradient ~ 0)
    grad_proj_start/end  mean absolute error  < 1e-3

Usage:
    python scripts/gradient_check.py                    # T=1000 on CUDA, T=200 on CPU
    python scripts/gradient_check.py --T 100 1000 10000 --K 32 --C 24 --proj
Exit status 1 if any metric is over its threshold.
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Tuple

import torch

from torch_semimarkov import semi_crf_streaming_forward
from torch_semimarkov.engines.available import triton_available

THRESHOLDS = {
    "partition": ("max_rel", 1e-4),
    "grad_transition": ("max_rel", 1e-2),
    "grad_duration_bias": ("max_rel", 1e-2),
    "grad_cum_scores": ("mean_abs", 1e-3),
    "grad_proj_start": ("mean_abs", 1e-3),
    "grad_proj_end": ("mean_abs", 1e-3),
}


def make_inputs(B: int, T: int, K: int, C: int, proj: bool, duration_transitions: bool, device, seed: int):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, T, C, generator=g)
    scores = scores - scores.mean(1, keepdim=True)
    cum = torch.nn.functional.pad(scores.cumsum(1), (0, 0, 1, 0))
    tr_shape = (K, C, C) if duration_transitions else (C, C)
    inputs = {
        "cum_scores": cum,
        "transition": torch.randn(tr_shape, generator=g) * 0.5,
        "duration_bias": torch.randn(K, C, generator=g) * 0.5,
        "proj_start": torch.randn(B, T, C, generator=g) * 0.5 if proj else None,
        "proj_end": torch.randn(B, T, C, generator=g) * 0.5 if proj else None,
    }
    lengths = torch.randint(max(1, T // 2), T + 1, (B,), generator=g)
    lengths[0] = T
    grad_out = torch.rand(B, generator=g) + 0.5
    inputs = {k: (None if v is None else v.to(device)) for k, v in inputs.items()}
    return inputs, lengths.to(device), grad_out.to(device)


def run(fn, inputs, lengths, K, grad_out, dtype) -> Dict[str, torch.Tensor]:
    leaves = {k: v.detach().to(dtype).requires_grad_(True) for k, v in inputs.items() if v is not None}
    log_z = fn(leaves, lengths, K)
    (log_z * grad_out.to(log_z.dtype)).sum().backward()
    out = {"partition": log_z.detach().double()}
    for k, v in leaves.items():
        out[f"grad_{k}"] = v.grad.detach().double()
    return out


def compare(test: Dict[str, torch.Tensor], ref: Dict[str, torch.Tensor]) -> List[Tuple[str, str, float, float, bool]]:
    rows = []
    for name, (metric, threshold) in THRESHOLDS.items():
        if name not in ref:
            continue
        a, b = test[name].cpu(), ref[name].cpu()
        err = (a - b).abs()
        if metric == "max_rel":
            value = float((err / b.abs().clamp_min(1e-6)).max())
        else:
            value = float(err.mean())
        ok = bool(torch.isfinite(a).all()) and value < threshold
        rows.append((name, metric, value, threshold, ok))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, nargs="+", default=None, help="sequence lengths (default 1000 on CUDA, 200 on CPU)")
    parser.add_argument("--B", type=int, default=4)
    parser.add_argument("--K", type=int, default=16)
    parser.add_argument("--C", type=int, default=6)
    parser.add_argument("--proj", action="store_true", help="also pass proj_start / proj_end")
    parser.add_argument("--duration-transitions", action="store_true", help="use a (K, C, C) transition")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    args = parser.parse_args(argv)

    use_cuda = torch.cuda.is_available() if args.device == "auto" else args.device.startswith("cuda")
    if use_cuda and not torch.cuda.is_available():
        print("--device cuda requested but CUDA is not available")
        return 2
    if use_cuda and triton_available():
        device = torch.device("cuda")
        mode = "Triton kernels vs PyTorch streaming reference (float32, same inputs)"
        Ts = args.T or [1000]

        def test_fn(x, lengths, K):
            return semi_crf_streaming_forward(x["cum_scores"], x["transition"], x["duration_bias"], lengths, K,
                                              proj_start=x.get("proj_start"), proj_end=x.get("proj_end"), use_triton=True)

        def ref_fn(x, lengths, K):
            return semi_crf_streaming_forward(x["cum_scores"], x["transition"], x["duration_bias"], lengths, K,
                                              proj_start=x.get("proj_start"), proj_end=x.get("proj_end"), use_triton=False)

        ref_dtype = torch.float32
    else:
        from torch_semimarkov.oracle import naive_semi_crf

        device = torch.device("cpu")
        reason = "CUDA is not available" if not use_cuda else "Triton is not installed"
        print(f"{reason}: there is no GPU kernel to check. Comparing the PyTorch streaming path (float32) "
              "against the naive autograd oracle torch_semimarkov.oracle.naive_semi_crf (float64) instead.")
        mode = "PyTorch streaming (float32) vs naive oracle (float64)"
        Ts = args.T or [200]

        def test_fn(x, lengths, K):
            return semi_crf_streaming_forward(x["cum_scores"], x["transition"], x["duration_bias"], lengths, K,
                                              proj_start=x.get("proj_start"), proj_end=x.get("proj_end"), use_triton=False)

        def ref_fn(x, lengths, K):
            return naive_semi_crf(x["cum_scores"], x["transition"], x["duration_bias"], lengths, K,
                                  proj_start=x.get("proj_start"), proj_end=x.get("proj_end"))

        ref_dtype = torch.float64

    print(f"mode: {mode}")
    all_ok = True
    for T in Ts:
        inputs, lengths, grad_out = make_inputs(args.B, T, args.K, args.C, args.proj, args.duration_transitions, device, args.seed)
        test = run(test_fn, inputs, lengths, args.K, grad_out, torch.float32)
        ref = run(ref_fn, inputs, lengths, args.K, grad_out, ref_dtype)
        print(f"\nB={args.B} T={T} K={args.K} C={args.C} proj={args.proj} duration_transitions={args.duration_transitions}")
        print(f"  {'quantity':<20}{'metric':<10}{'value':>12}{'threshold':>12}  result")
        for name, metric, value, threshold, ok in compare(test, ref):
            all_ok &= ok
            print(f"  {name:<20}{metric:<10}{value:>12.3e}{threshold:>12.0e}  {'PASS' if ok else 'FAIL'}")
    print("\nall metrics within thresholds" if all_ok else "\nSOME METRICS OVER THRESHOLD")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
