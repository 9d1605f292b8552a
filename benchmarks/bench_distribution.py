"""Top-k, sampling, entropy and masks against Viterbi and forward+backward, in one run.

For each size (B, T, K, C) it times, on one device and with the same random model:

* ``viterbi``: the engine's Viterbi (``semi_crf_streaming_viterbi``, backend auto);
* ``fwd_bwd``: the engine's log Z and its gradients;
* ``topk5``: ``semi_crf_streaming_topk(k=5)``;
* ``sample16``: ``semi_crf_streaming_sample(num_samples=16)``;
* ``sample16_torch``: the same on the PyTorch path (``backend="torch"``, float64), what a (K, C, C)
  transition ran before the engine's end-node walk;
* ``entropy_grad``: ``semi_crf_streaming_entropy`` and its gradient;
* ``entropy_grad_torch``: the same on the float64 PyTorch path (``backend="torch"``), what a
  (K, C, C) transition ran before the engine took its gradient;
* ``entropy``: its value alone (under ``torch.no_grad()``: the engine on CUDA);
* ``entropy_torch``: the value on the float64 PyTorch path (``backend="torch"``), what a (K, C, C)
  transition ran before the engine took its value;
* ``masked_fwd_bwd``: log Z of a partially labelled batch (``label_mask`` + ``boundary_mask``) and
  its gradients;
* ``masked_fwd_bwd_torch``: the same on the float64 PyTorch path (``backend="torch"``), what a
  (K, C, C) transition ran before the engine read the masks;
* ``masked_entropy``: the entropy's value of the partially labelled batch.

and reports the ratios the issue sets targets for (top-k / Viterbi <= 5, samples / fwd+bwd <= 2,
entropy+grad / fwd+bwd <= 2, masked / unmasked fwd+bwd <= 1.1). Engine timings are medians of
``--repeat`` runs after a warm-up; the PyTorch-path functions (a Python loop over T) run
``--repeat-slow`` times (default 1) after a warm-up at T = 200.

``--kcc``: a (K, C, C) transition (a transition per duration) instead of (C, C).

Usage: ``python benchmarks/bench_distribution.py [--device cuda] [--sizes 16,10000,100,24 ...] [--kcc] [--out F]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _time(fn, device, repeat):
    times = []
    for _ in range(repeat):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _problem(B, T, K, C, device, seed=0, kcc=False):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, T, C, generator=g) * 0.5
    cum = torch.nn.functional.pad(scores.cumsum(1), (0, 0, 1, 0)).to(device)
    tr = (torch.randn(*((K, C, C) if kcc else (C, C)), generator=g) * 0.5).to(device)
    db = (torch.randn(K, C, generator=g) * 0.5).to(device)
    lengths = torch.full((B,), T, dtype=torch.long).to(device)
    # partial labels: every 50th position's label is known and a boundary at every 500th position
    label_mask = torch.ones(B, T, C, dtype=torch.bool)
    known = torch.randint(0, C, (B, T), generator=g)
    label_mask[:, ::50] = torch.nn.functional.one_hot(known[:, ::50], C).bool()
    boundary_mask = torch.zeros(B, T, dtype=torch.long)
    boundary_mask[:, ::500] = 1
    return cum, tr, db, lengths, label_mask.to(device), boundary_mask.to(device)


def _without_selection_kernel(fn):
    from torch_semimarkov.engines.triton import topk as kbest
    before, kbest.SELECTION_KERNEL = kbest.SELECTION_KERNEL, False
    try:
        return fn()
    finally:
        kbest.SELECTION_KERNEL = before


def run_size(B, T, K, C, device, repeat, repeat_slow, log, only=None, kcc=False):
    from torch_semimarkov import (semi_crf_streaming_entropy, semi_crf_streaming_forward,
                                  semi_crf_streaming_sample, semi_crf_streaming_topk, semi_crf_streaming_viterbi)

    cum, tr, db, lengths, lm, bm = _problem(B, T, K, C, device, kcc=kcc)

    def fwd_bwd(**masks):
        c, t, d = (x.detach().requires_grad_() for x in (cum, tr, db))
        semi_crf_streaming_forward(c, t, d, lengths, K, **masks).sum().backward()

    def entropy_grad(backend="auto"):
        c, t, d = (x.detach().requires_grad_() for x in (cum, tr, db))
        semi_crf_streaming_entropy(c, t, d, lengths, K, backend=backend).sum().backward()

    def entropy(backend="auto", **masks):
        with torch.no_grad():
            semi_crf_streaming_entropy(cum, tr, db, lengths, K, backend=backend, **masks)

    def sample(backend="auto"):
        semi_crf_streaming_sample(cum, tr, db, lengths, K, num_samples=16, backend=backend,
                                  generator=torch.Generator(device=device).manual_seed(0))

    jobs = {
        "viterbi": (lambda: semi_crf_streaming_viterbi(cum, tr, db, lengths, K), repeat),
        "fwd_bwd": (fwd_bwd, repeat),
        # on CUDA: sidetracks over the engine's Viterbi (streaming/kbest.py)
        "topk5": (lambda: semi_crf_streaming_topk(cum, tr, db, lengths, K, k=5),
                  repeat if device.type == "cuda" else repeat_slow),
        # the same with the in-edges selected by PyTorch blocks instead of the Triton kernel
        "topk5_torch_selection": (lambda: _without_selection_kernel(
            lambda: semi_crf_streaming_topk(cum, tr, db, lengths, K, k=5)), repeat if device.type == "cuda" else 0),
        # engine sampling for CUDA tensors (forward + the chunked walk kernel)
        "sample16": (sample, repeat if device.type == "cuda" else repeat_slow),
        "sample16_torch": (lambda: sample("torch"), repeat_slow),
        "entropy_grad": (entropy_grad, repeat if device.type == "cuda" else repeat_slow),
        "entropy_grad_torch": (lambda: entropy_grad("torch"), repeat_slow),
        "entropy": (entropy, repeat if device.type == "cuda" else repeat_slow),
        # the float64 expectation-semiring path (on CUDA: one program per sequence)
        "entropy_torch": (lambda: entropy("torch"), repeat_slow),
        # masks on the engine for CUDA tensors (segment limits read by its kernels)
        "masked_fwd_bwd": (lambda: fwd_bwd(label_mask=lm, boundary_mask=bm),
                           repeat if device.type == "cuda" else repeat_slow),
        "masked_fwd_bwd_torch": (lambda: fwd_bwd(label_mask=lm, boundary_mask=bm, backend="torch"), repeat_slow),
        "masked_entropy": (lambda: entropy(label_mask=lm, boundary_mask=bm),
                           repeat if device.type == "cuda" else repeat_slow),
    }
    out = {}
    for name, (fn, n) in jobs.items():
        if (only and name not in only and name not in ("viterbi", "fwd_bwd")) or n == 0:
            continue
        fn()  # warm-up (compiles kernels on first use)
        out[name] = _time(fn, device, n)
        log(f"  {name:>15}: {out[name]:10.2f} ms")
    for name, base in (("topk5", "viterbi"), ("topk5_torch_selection", "viterbi"), ("sample16", "fwd_bwd"), ("sample16_torch", "sample16"), ("entropy_grad", "fwd_bwd"), ("entropy", "fwd_bwd"),
                       ("entropy_torch", "entropy"), ("entropy_grad_torch", "entropy_grad"), ("masked_fwd_bwd", "fwd_bwd"),
                       ("masked_fwd_bwd_torch", "masked_fwd_bwd"), ("masked_entropy", "entropy")):
        if name in out:
            out[f"ratio_{name}_over_{base}"] = out[name] / out[base]
    log("  ratios: " + ", ".join(f"{k[6:]} {v:.1f}" for k, v in out.items() if k.startswith("ratio_")))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--sizes", nargs="+", default=None, help="B,T,K,C tuples (default: by device)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--repeat-slow", type=int, default=1)
    p.add_argument("--only", default=None,
                   help="comma-separated functions to time besides viterbi and fwd_bwd (default: all)")
    p.add_argument("--kcc", action="store_true", help="a (K, C, C) transition instead of (C, C)")
    p.add_argument("--out", default="bench_distribution.json")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if args.sizes is None:
        args.sizes = ["16,10000,100,24"] if device.type == "cuda" else ["4,1000,32,8"]

    def log(msg):
        print(msg, flush=True)

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    log(f"device {name}, torch {torch.__version__}")
    results = []
    for spec in args.sizes:
        B, T, K, C = (int(x) for x in spec.split(","))
        log(f"B={B} T={T} K={K} C={C}")
        # warm-up of the PyTorch-path functions at a small T
        only = set(args.only.split(",")) if args.only else None
        run_size(min(B, 2), 200, K, C, device, 1, 1, lambda m: None, only, args.kcc)
        results.append(dict(B=B, T=T, K=K, C=C, kcc=args.kcc,
                            **run_size(B, T, K, C, device, args.repeat, args.repeat_slow, log, only, args.kcc)))
    with open(args.out, "w") as f:
        json.dump(dict(device=name, torch=torch.__version__, results=results), f, indent=1)
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
